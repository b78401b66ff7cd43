// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/dot.hpp  Inner product of two f32 vectors.

#include <cstddef>
#include <functional>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/accumulate.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

/// sum_i a[i] * b[i], accumulated in f32.
/// @pre a.size() == b.size()  ([n] a, [n] b)
template <class Arch = default_arch>
float dot(std::span<const float> a, std::span<const float> b) {
  LLMKIT_CHECK(a.size() == b.size(), "dot: a.size() = ", a.size(), " differs from b.size() = ", b.size());
  const std::size_t n = a.size();
  if constexpr (is_scalar_v<Arch>) {
    float acc = 0.0f;
    for (std::size_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
  } else {
    using batch = xsimd::batch<float, Arch>;
    // Four independent accumulators hide the FMA latency.
    batch accs[4] = {batch(0.0f), batch(0.0f), batch(0.0f), batch(0.0f)};
    std::size_t i = detail::accumulate_batches<Arch>(n, accs, [&](const batch& acc, std::size_t j) {
      return xsimd::fma(batch::load_unaligned(a.data() + j), batch::load_unaligned(b.data() + j), acc);
    });
    float acc = xsimd::hadd(detail::combine_pairwise<Arch>(accs, std::plus<>{}));
    for (; i < n; ++i) acc += a[i] * b[i];
    return acc;
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
