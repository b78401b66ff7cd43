// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/x86_lanes.hpp
/// Widening loads and narrowing stores between narrow integers in memory and
/// int32 lanes of an xsimd register, which xsimd 8.1 does not provide. One
/// overload per instruction set on the xsimd arch tag, called as
/// `load_i8_as_i32<Arch>(p, Arch{})`: the x86 archs use one instruction or
/// two (vpmovsx/zx, vpmov, packs), every other arch the generic overload
/// through a small stack array. An overload exists only where the target has
/// its instructions; xsimd's avx512f does not derive from avx2, so each
/// instruction set has its own.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "llmkit/simd/detail/intrinsics.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd::detail {

/// int32 lanes <- batch::size int8 values at p.
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_i8_as_i32(const std::int8_t* p, requires_arch<xsimd::generic>) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  alignas(64) std::int32_t wide[ibatch::size];
  for (std::size_t j = 0; j < ibatch::size; ++j) wide[j] = p[j];
  return ibatch::load_aligned(wide);
}

/// int32 lanes <- batch::size uint16 values at p (zero-extended).
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_u16_as_i32(const std::uint16_t* p,
                                                        requires_arch<xsimd::generic>) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  alignas(64) std::int32_t wide[ibatch::size];
  for (std::size_t j = 0; j < ibatch::size; ++j) wide[j] = p[j];
  return ibatch::load_aligned(wide);
}

/// batch::size uint16 values at p <- int32 lanes holding values in [0, 65535].
template <class Arch>
inline void store_i32_as_u16(const xsimd::batch<std::int32_t, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::generic>) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  alignas(64) std::int32_t wide[ibatch::size];
  v.store_aligned(wide);
  for (std::size_t j = 0; j < ibatch::size; ++j) p[j] = static_cast<std::uint16_t>(wide[j]);
}

/// batch::size int8 values at p <- int32 lanes holding values in [-128, 127].
template <class Arch>
inline void store_i32_as_i8(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* p,
                            requires_arch<xsimd::generic>) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  alignas(64) std::int32_t wide[ibatch::size];
  v.store_aligned(wide);
  for (std::size_t j = 0; j < ibatch::size; ++j) p[j] = static_cast<std::int8_t>(wide[j]);
}

#if defined(__SSE4_1__)
// 4 lanes: sse4_1 and the archs derived from it (sse4_2, fma3<sse4_2>, fma4).

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_i8_as_i32(const std::int8_t* p, requires_arch<xsimd::sse4_1>) noexcept {
  std::int32_t four;
  std::memcpy(&four, p, 4);
  return xsimd::batch<std::int32_t, Arch>(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
}

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_u16_as_i32(const std::uint16_t* p, requires_arch<xsimd::sse4_1>) noexcept {
  return xsimd::batch<std::int32_t, Arch>(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <class Arch>
inline void store_i32_as_u16(const xsimd::batch<std::int32_t, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::sse4_1>) noexcept {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(v, v));
}

template <class Arch>
inline void store_i32_as_i8(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* p,
                            requires_arch<xsimd::sse4_1>) noexcept {
  const __m128i words = _mm_packs_epi32(v, v);
  const int four = _mm_cvtsi128_si32(_mm_packs_epi16(words, words));
  std::memcpy(p, &four, 4);
}
#endif

#if defined(__AVX2__)
// 8 lanes: avx2 and fma3<avx2>.

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_i8_as_i32(const std::int8_t* p, requires_arch<xsimd::avx2>) noexcept {
  return xsimd::batch<std::int32_t, Arch>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_u16_as_i32(const std::uint16_t* p, requires_arch<xsimd::avx2>) noexcept {
  return xsimd::batch<std::int32_t, Arch>(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <class Arch>
inline void store_i32_as_u16(const xsimd::batch<std::int32_t, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::avx2>) noexcept {
  const __m256i packed = _mm256_packus_epi32(v, v);  // per 128-bit half: 4 values twice
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
}

template <class Arch>
inline void store_i32_as_i8(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* p,
                            requires_arch<xsimd::avx2>) noexcept {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i words = _mm_packs_epi32(lo, hi);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
}
#endif

#if defined(__AVX512F__)
// 16 lanes: avx512f and the archs derived from it (avx512cd, avx512dq, avx512bw).

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_i8_as_i32(const std::int8_t* p, requires_arch<xsimd::avx512f>) noexcept {
  return xsimd::batch<std::int32_t, Arch>(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_u16_as_i32(const std::uint16_t* p,
                                                        requires_arch<xsimd::avx512f>) noexcept {
  return xsimd::batch<std::int32_t, Arch>(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}

template <class Arch>
inline void store_i32_as_u16(const xsimd::batch<std::int32_t, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::avx512f>) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
}

template <class Arch>
inline void store_i32_as_i8(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* p,
                            requires_arch<xsimd::avx512f>) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
}
#endif

}  // namespace llmkit::simd::detail

LLMKIT_SIMD_DIAGNOSTICS_END
