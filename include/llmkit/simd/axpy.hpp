// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/axpy.hpp  y += a * x and x *= a on f32 vectors.

#include <cstddef>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

/// y[i] += a * x[i] (fused multiply-add on SIMD archs).
/// @pre x.size() == y.size()  ([n] x, [n] y)
template <class Arch = default_arch>
void axpy(float a, std::span<const float> x, std::span<float> y) {
  LLMKIT_CHECK(x.size() == y.size(), "axpy: x.size() = ", x.size(), " differs from y.size() = ", y.size());
  const std::size_t n = x.size();
  const float* xp = x.data();
  float* yp = y.data();
  if constexpr (is_scalar_v<Arch>) {
    for (std::size_t i = 0; i < n; ++i) yp[i] += a * xp[i];
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch va(a);
    std::size_t i = 0;
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      const batch y0 = xsimd::fma(va, batch::load_unaligned(xp + i), batch::load_unaligned(yp + i));
      const batch y1 = xsimd::fma(va, batch::load_unaligned(xp + i + lanes), batch::load_unaligned(yp + i + lanes));
      y0.store_unaligned(yp + i);
      y1.store_unaligned(yp + i + lanes);
    }
    for (; i + lanes <= n; i += lanes)
      xsimd::fma(va, batch::load_unaligned(xp + i), batch::load_unaligned(yp + i)).store_unaligned(yp + i);
    for (; i < n; ++i) yp[i] += a * xp[i];
  }
}

/// x[i] *= a.  ([n] x)
template <class Arch = default_arch>
void scale(std::span<float> x, float a) {
  const std::size_t n = x.size();
  float* p = x.data();
  if constexpr (is_scalar_v<Arch>) {
    for (std::size_t i = 0; i < n; ++i) p[i] *= a;
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch va(a);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) (batch::load_unaligned(p + i) * va).store_unaligned(p + i);
    for (; i < n; ++i) p[i] *= a;
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
