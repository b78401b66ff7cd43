// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/kernel_tables.hpp
/// The kernel of each head dim for one arch and storage type: the prefill
/// task (`prefill_kernel_table`) and the decode task of each head batch
/// (`decode_kernel_table`), and their `extern template` declarations under
/// LLMKIT_ATTENTION_EXTERN_KERNELS (attention/kernels.hpp).

#include <cstddef>
#include <cstdint>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_job.hpp"
#include "llmkit/attention/detail/decode_task.hpp"
#include "llmkit/attention/detail/prefill_job.hpp"
#include "llmkit/attention/detail/prefill_task.hpp"
#include "llmkit/attention/head_dims.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// The prefill kernel of each head dim over storage type T on Arch. A class
/// with an out-of-line member so that one translation unit can compile
/// every kernel for a whole program (attention/kernels.hpp).
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

/// The decode kernel of each (head dim, heads per pass) over storage type T
/// on Arch, compiled as prefill_kernel_table is.
template <class Arch, class T>
struct decode_kernel_table {
  using task_fn = void (*)(const decode_job<T>&, std::size_t);
  /// @throws llmkit::error when head_dim is not one of supported_head_dims
  static task_fn select(std::size_t head_dim, std::size_t head_batch);
};

template <class Arch, class T>
typename decode_kernel_table<Arch, T>::task_fn decode_kernel_table<Arch, T>::select(std::size_t head_dim,
                                                                                    std::size_t head_batch) {
  return dispatch_head_dim(head_dim, [head_batch](auto d) -> task_fn {
    constexpr std::size_t D = decltype(d)::value;
    using A = arch_for_head_dim<Arch, D>;
    if (head_batch == 1) return &decode_task<A, D, T, 1>;
    if (head_batch == 2) return &decode_task<A, D, T, 2>;
    return &decode_task<A, D, T, 4>;
  });
}

}  // namespace llmkit::attention::detail

#if defined(LLMKIT_ATTENTION_EXTERN_KERNELS)
// The kernels for the default arch are compiled elsewhere (attention/kernels.hpp).
namespace llmkit::attention::detail {
extern template struct prefill_kernel_table<simd::default_arch, float>;
extern template struct decode_kernel_table<simd::default_arch, float>;
extern template struct prefill_kernel_table<simd::default_arch, f16>;
extern template struct decode_kernel_table<simd::default_arch, f16>;
extern template struct prefill_kernel_table<simd::default_arch, bf16>;
extern template struct decode_kernel_table<simd::default_arch, bf16>;
extern template struct prefill_kernel_table<simd::default_arch, std::int8_t>;
extern template struct decode_kernel_table<simd::default_arch, std::int8_t>;
}  // namespace llmkit::attention::detail
#endif

LLMKIT_SIMD_DIAGNOSTICS_END
