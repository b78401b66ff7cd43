// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/batch_ops.hpp
/// Small register-level helpers shared by the simd kernels. Every helper is a
/// template over the arch tag, so translation units compiled with different
/// `-march` flags never share a non-template inline function (ODR hazard).

#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/simd/detail/intrinsics.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd::detail {

/// Largest lane of `v` (NaN lanes must have been handled by the caller),
/// one overload per instruction set (`hmax<Arch>(v, Arch{})`). x86 folds
/// the register in halves (log2(lanes) shuffles and maxes) instead of a
/// chain of lanes - 1 scalar compares: a per-row reduction such as
/// `abs_max` over a 128-float row pays it once per row.
template <class Arch>
inline float hmax(const xsimd::batch<float, Arch>& v, requires_arch<xsimd::generic>) noexcept {
  alignas(64) float lanes[xsimd::batch<float, Arch>::size];
  v.store_aligned(lanes);
  float m = lanes[0];
  for (std::size_t i = 1; i < xsimd::batch<float, Arch>::size; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}

/// Largest lane of `v`, one overload per instruction set as for float.
template <class Arch>
inline std::int32_t hmax(const xsimd::batch<std::int32_t, Arch>& v, requires_arch<xsimd::generic>) noexcept {
  alignas(64) std::int32_t lanes[xsimd::batch<std::int32_t, Arch>::size];
  v.store_aligned(lanes);
  std::int32_t m = lanes[0];
  for (std::size_t i = 1; i < xsimd::batch<std::int32_t, Arch>::size; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}

#if defined(__AVX2__)
template <class Arch>
inline float hmax(const xsimd::batch<float, Arch>& v, requires_arch<xsimd::avx2>) noexcept {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

template <class Arch>
inline std::int32_t hmax(const xsimd::batch<std::int32_t, Arch>& v, requires_arch<xsimd::avx2>) noexcept {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  return _mm_cvtsi128_si32(_mm_max_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}
#endif

#if defined(__AVX512F__)
template <class Arch>
inline float hmax(const xsimd::batch<float, Arch>& v, requires_arch<xsimd::avx512f>) noexcept {
  return _mm512_reduce_max_ps(v);
}

template <class Arch>
inline std::int32_t hmax(const xsimd::batch<std::int32_t, Arch>& v, requires_arch<xsimd::avx512f>) noexcept {
  return _mm512_reduce_max_epi32(v);
}
#endif

/// Generator for xsimd::make_batch_constant: swaps neighbouring lanes (0<->1, 2<->3, ...).
struct swap_pairs_index {
  static constexpr std::uint32_t get(std::size_t i, std::size_t) noexcept {
    return static_cast<std::uint32_t>(i ^ 1u);
  }
};

}  // namespace llmkit::simd::detail

LLMKIT_SIMD_DIAGNOSTICS_END
