// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/prefill_kernel_table.hpp
/// The prefill task of each head dim for one arch and storage type
/// (`prefill_kernel_table`), and its `extern template` declarations under
/// LLMKIT_ATTENTION_EXTERN_KERNELS (attention/kernels.hpp).

#include <cstddef>
#include <cstdint>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/prefill_job.hpp"
#include "llmkit/attention/detail/prefill_task.hpp"
#include "llmkit/attention/head_dims.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// The prefill kernel of each head dim over storage type T on Arch (see
/// decode_kernel_table: one translation unit can compile them all).
template <class Arch, class T>
struct prefill_kernel_table {
  using task_fn = void (*)(const prefill_job<T>&, std::size_t, std::size_t);
  /// @throws llmkit::error when head_dim is not one of supported_head_dims
  static task_fn select(std::size_t head_dim);
};

template <class Arch, class T>
typename prefill_kernel_table<Arch, T>::task_fn prefill_kernel_table<Arch, T>::select(std::size_t head_dim) {
  return dispatch_head_dim(head_dim, [](auto d) -> task_fn {
    constexpr std::size_t D = decltype(d)::value;
    return &prefill_task<arch_for_head_dim<Arch, D>, D, T>;
  });
}

}  // namespace llmkit::attention::detail

#if defined(LLMKIT_ATTENTION_EXTERN_KERNELS)
// The kernels for the default arch are compiled elsewhere (attention/kernels.hpp).
namespace llmkit::attention::detail {
extern template struct prefill_kernel_table<simd::default_arch, float>;
extern template struct prefill_kernel_table<simd::default_arch, f16>;
extern template struct prefill_kernel_table<simd::default_arch, bf16>;
extern template struct prefill_kernel_table<simd::default_arch, std::int8_t>;
}  // namespace llmkit::attention::detail
#endif

LLMKIT_SIMD_DIAGNOSTICS_END
