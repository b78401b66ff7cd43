// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/reduce.hpp  Reductions of an f32 vector: sum, max, argmax.
///
/// NaN handling follows NumPy: a NaN anywhere makes `max` return NaN and
/// `argmax` return the index of the first NaN. `sum` propagates NaN and inf as
/// IEEE addition does.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
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
    constexpr std::size_t lanes = batch::size;
    batch acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
    std::size_t i = 0;
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      acc0 += batch::load_unaligned(p + i);
      acc1 += batch::load_unaligned(p + i + lanes);
      acc2 += batch::load_unaligned(p + i + 2 * lanes);
      acc3 += batch::load_unaligned(p + i + 3 * lanes);
    }
    for (; i + lanes <= n; i += lanes) acc0 += batch::load_unaligned(p + i);
    float acc = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
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
    constexpr std::size_t lanes = batch::size;
    batch m0(neg_inf), m1(neg_inf), m2(neg_inf), m3(neg_inf);
    // NaN lanes are tracked apart: the vector max instructions drop them (and
    // xsimd 8.1 compares != as ordered on AVX, so v != v misses NaN).
    auto nan_seen = batch(0.0f) != batch(0.0f);
    std::size_t i = 0;
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      const batch v0 = batch::load_unaligned(p + i), v1 = batch::load_unaligned(p + i + lanes);
      const batch v2 = batch::load_unaligned(p + i + 2 * lanes), v3 = batch::load_unaligned(p + i + 3 * lanes);
      nan_seen = nan_seen | xsimd::isnan(v0) | xsimd::isnan(v1) | xsimd::isnan(v2) | xsimd::isnan(v3);
      m0 = xsimd::max(m0, v0);
      m1 = xsimd::max(m1, v1);
      m2 = xsimd::max(m2, v2);
      m3 = xsimd::max(m3, v3);
    }
    for (; i + lanes <= n; i += lanes) {
      const batch v = batch::load_unaligned(p + i);
      nan_seen = nan_seen | xsimd::isnan(v);
      m0 = xsimd::max(m0, v);
    }
    if (xsimd::any(nan_seen)) return std::numeric_limits<float>::quiet_NaN();
    float m = detail::hmax<Arch>(xsimd::max(xsimd::max(m0, m1), xsimd::max(m2, m3)));
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
