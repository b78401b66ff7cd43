// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/rmsnorm.hpp  Root-mean-square normalisation (Llama's RMSNorm).

#include <cmath>
#include <cstddef>
#include <functional>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/accumulate.hpp"
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
    batch accs[4] = {batch(0.0f), batch(0.0f), batch(0.0f), batch(0.0f)};
    std::size_t i = detail::accumulate_batches<Arch>(n, accs, [xp](const batch& s, std::size_t j) {
      const batch v = batch::load_unaligned(xp + j);
      return xsimd::fma(v, v, s);
    });
    float ss = xsimd::hadd(detail::combine_pairwise<Arch>(accs, std::plus<>{}));
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
