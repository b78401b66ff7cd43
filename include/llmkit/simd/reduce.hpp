// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/reduce.hpp  Reductions of an f32 vector: sum, max, argmax.
///
/// NaN handling follows NumPy: a NaN anywhere makes `max` return NaN and
/// `argmax` return the index of the first NaN. `sum` propagates NaN and inf as
/// IEEE addition does.

#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/accumulate.hpp"
#include "llmkit/simd/detail/batch_ops.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

/// sum_i x[i], accumulated in f32 (four independent vector accumulators on
/// SIMD archs, so the rounding differs from the sequential scalar sum).
/// ([n] x; n == 0 gives 0)
template <class Arch = default_arch>
float sum(std::span<const float> x) {
  const std::size_t n = x.size();
  const float* p = x.data();
  if constexpr (is_scalar_v<Arch>) {
    float acc = 0.0f;
    for (std::size_t i = 0; i < n; ++i) acc += p[i];
    return acc;
  } else {
    using batch = xsimd::batch<float, Arch>;
    batch accs[4] = {batch(0.0f), batch(0.0f), batch(0.0f), batch(0.0f)};
    std::size_t i = detail::accumulate_batches<Arch>(
        n, accs, [p](const batch& acc, std::size_t j) { return acc + batch::load_unaligned(p + j); });
    float acc = xsimd::hadd(detail::combine_pairwise<Arch>(accs, std::plus<>{}));
    for (; i < n; ++i) acc += p[i];
    return acc;
  }
}

/// max_i x[i]; -inf for an empty vector; NaN if any element is NaN.
/// ([n] x)
template <class Arch = default_arch>
float max(std::span<const float> x) {
  const std::size_t n = x.size();
  const float* p = x.data();
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  if constexpr (is_scalar_v<Arch>) {
    float m = neg_inf;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isnan(p[i])) return p[i];
      m = p[i] > m ? p[i] : m;
    }
    return m;
  } else {
    using batch = xsimd::batch<float, Arch>;
    batch accs[4] = {batch(neg_inf), batch(neg_inf), batch(neg_inf), batch(neg_inf)};
    // NaN lanes are tracked apart: the vector max instructions drop them (and
    // xsimd 8.1 compares != as ordered on AVX, so v != v misses NaN).
    auto nan_seen = batch(0.0f) != batch(0.0f);
    std::size_t i = detail::accumulate_batches<Arch>(n, accs, [&](const batch& m, std::size_t j) {
      const batch v = batch::load_unaligned(p + j);
      nan_seen = nan_seen | xsimd::isnan(v);
      return xsimd::max(m, v);
    });
    if (xsimd::any(nan_seen)) return std::numeric_limits<float>::quiet_NaN();
    float m = detail::hmax<Arch>(
        detail::combine_pairwise<Arch>(accs, [](const batch& x, const batch& y) { return xsimd::max(x, y); }), Arch{});
    for (; i < n; ++i) {
      if (std::isnan(p[i])) return p[i];
      m = p[i] > m ? p[i] : m;
    }
    return m;
  }
}

/// Index of the largest element, the first one on ties (so -0.0 and +0.0 tie);
/// the index of the first NaN if there is one (as NumPy's argmax).
/// @pre !x.empty()  ([n] x)
template <class Arch = default_arch>
std::size_t argmax(std::span<const float> x) {
  LLMKIT_CHECK(!x.empty(), "argmax: x is empty (x.size() = 0)");
  const std::size_t n = x.size();
  const float* p = x.data();
  if constexpr (is_scalar_v<Arch>) {
    std::size_t best = 0;
    if (std::isnan(p[0])) return 0;
    for (std::size_t i = 1; i < n; ++i) {
      if (std::isnan(p[i])) return i;
      if (p[i] > p[best]) best = i;
    }
    return best;
  } else {
    // Two passes: the maximum (vectorised), then its first occurrence
    // (vectorised compare); the second pass stops at the first hit.
    const float m = max<Arch>(x);
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    if (std::isnan(m)) {
      for (std::size_t i = 0; i < n; ++i)
        if (std::isnan(p[i])) return i;
    }
    const batch target(m);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      if (xsimd::any(batch::load_unaligned(p + i) == target)) break;
    }
    for (; i < n; ++i)
      if (p[i] == m) return i;
    LLMKIT_ASSERT(false);
    return 0;
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
