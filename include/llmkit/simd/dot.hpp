// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/dot.hpp  Inner product of two f32 vectors.

#include <cstddef>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
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
    constexpr std::size_t lanes = batch::size;
    // Four independent accumulators hide the FMA latency.
    batch acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
    std::size_t i = 0;
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      acc0 = xsimd::fma(batch::load_unaligned(a.data() + i), batch::load_unaligned(b.data() + i), acc0);
      acc1 = xsimd::fma(batch::load_unaligned(a.data() + i + lanes), batch::load_unaligned(b.data() + i + lanes), acc1);
      acc2 = xsimd::fma(batch::load_unaligned(a.data() + i + 2 * lanes),
                        batch::load_unaligned(b.data() + i + 2 * lanes), acc2);
      acc3 = xsimd::fma(batch::load_unaligned(a.data() + i + 3 * lanes),
                        batch::load_unaligned(b.data() + i + 3 * lanes), acc3);
    }
    for (; i + lanes <= n; i += lanes)
      acc0 = xsimd::fma(batch::load_unaligned(a.data() + i), batch::load_unaligned(b.data() + i), acc0);
    float acc = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
    for (; i < n; ++i) acc += a[i] * b[i];
    return acc;
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
