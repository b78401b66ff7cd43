// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/rmsnorm.hpp  Root-mean-square normalisation (Llama's RMSNorm).

#include <cmath>
#include <cstddef>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

/// out[i] = x[i] / sqrt(mean_j(x[j]^2) + eps) * weight[i]; the sum of squares
/// is accumulated in f32. `out` may be the same array as `x`.
/// @pre x.size() == weight.size() == out.size(); eps >= 0 and finite
/// ([n] x, [n] weight, [n] out; n == 0 is a no-op)
template <class Arch = default_arch>
void rmsnorm(std::span<const float> x, std::span<const float> weight, std::span<float> out, float eps) {
  LLMKIT_CHECK(weight.size() == x.size(), "rmsnorm: weight.size() = ", weight.size(), " differs from x.size() = ",
               x.size());
  LLMKIT_CHECK(out.size() == x.size(), "rmsnorm: out.size() = ", out.size(), " differs from x.size() = ", x.size());
  LLMKIT_CHECK(eps >= 0.0f && std::isfinite(eps), "rmsnorm: eps must be finite and >= 0, got ", eps);
  const std::size_t n = x.size();
  if (n == 0) return;
  const float* xp = x.data();
  const float* wp = weight.data();
  float* op = out.data();
  if constexpr (is_scalar_v<Arch>) {
    float ss = 0.0f;
    for (std::size_t i = 0; i < n; ++i) ss += xp[i] * xp[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (std::size_t i = 0; i < n; ++i) op[i] = xp[i] * inv * wp[i];
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    batch s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
    std::size_t i = 0;
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      const batch v0 = batch::load_unaligned(xp + i), v1 = batch::load_unaligned(xp + i + lanes);
      const batch v2 = batch::load_unaligned(xp + i + 2 * lanes), v3 = batch::load_unaligned(xp + i + 3 * lanes);
      s0 = xsimd::fma(v0, v0, s0);
      s1 = xsimd::fma(v1, v1, s1);
      s2 = xsimd::fma(v2, v2, s2);
      s3 = xsimd::fma(v3, v3, s3);
    }
    for (; i + lanes <= n; i += lanes) {
      const batch v = batch::load_unaligned(xp + i);
      s0 = xsimd::fma(v, v, s0);
    }
    float ss = xsimd::hadd((s0 + s1) + (s2 + s3));
    for (; i < n; ++i) ss += xp[i] * xp[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    const batch vinv(inv);
    i = 0;
    for (; i + lanes <= n; i += lanes)
      (batch::load_unaligned(xp + i) * vinv * batch::load_unaligned(wp + i)).store_unaligned(op + i);
    for (; i < n; ++i) op[i] = xp[i] * inv * wp[i];
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
