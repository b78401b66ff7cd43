// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/x86_lanes.hpp
/// Widening loads and narrowing stores between narrow integers in memory and
/// int32 lanes of an xsimd register, which xsimd 8.1 does not provide. x86
/// archs use one instruction or two (vpmovsx/zx, vpmov, packs); any other
/// arch goes through a small stack array. All templates over the arch tag.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd::detail {

template <class Arch>
inline constexpr bool is_avx512_v = std::is_base_of_v<xsimd::avx512f, Arch>;
template <class Arch>
inline constexpr bool is_avx2_v = std::is_base_of_v<xsimd::avx2, Arch> && !is_avx512_v<Arch>;
template <class Arch>
inline constexpr bool is_sse41_v = std::is_base_of_v<xsimd::sse4_1, Arch>;

/// int32 lanes <- batch::size int8 values at p.
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_i8_as_i32(const std::int8_t* p) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
#if defined(LLMKIT_SIMD_X86)
  if constexpr (is_avx512_v<Arch>) {
    return ibatch(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (is_avx2_v<Arch>) {
    return ibatch(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (is_sse41_v<Arch>) {
    std::int32_t four;
    std::memcpy(&four, p, 4);
    return ibatch(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
  } else
#endif
  {
    alignas(64) std::int32_t wide[ibatch::size];
    for (std::size_t j = 0; j < ibatch::size; ++j) wide[j] = p[j];
    return ibatch::load_aligned(wide);
  }
}

/// int32 lanes <- batch::size uint16 values at p (zero-extended).
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_u16_as_i32(const std::uint16_t* p) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
#if defined(LLMKIT_SIMD_X86)
  if constexpr (is_avx512_v<Arch>) {
    return ibatch(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  } else if constexpr (is_avx2_v<Arch>) {
    return ibatch(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (is_sse41_v<Arch>) {
    return ibatch(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else
#endif
  {
    alignas(64) std::int32_t wide[ibatch::size];
    for (std::size_t j = 0; j < ibatch::size; ++j) wide[j] = p[j];
    return ibatch::load_aligned(wide);
  }
}

/// batch::size uint16 values at p <- int32 lanes holding values in [0, 65535].
template <class Arch>
inline void store_i32_as_u16(const xsimd::batch<std::int32_t, Arch>& v, std::uint16_t* p) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
#if defined(LLMKIT_SIMD_X86)
  if constexpr (is_avx512_v<Arch>) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  } else if constexpr (is_avx2_v<Arch>) {
    const __m256i packed = _mm256_packus_epi32(v, v);  // per 128-bit half: 4 values twice
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
  } else if constexpr (is_sse41_v<Arch>) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(v, v));
  } else
#endif
  {
    alignas(64) std::int32_t wide[ibatch::size];
    v.store_aligned(wide);
    for (std::size_t j = 0; j < ibatch::size; ++j) p[j] = static_cast<std::uint16_t>(wide[j]);
  }
}

/// batch::size int8 values at p <- int32 lanes holding values in [-128, 127].
template <class Arch>
inline void store_i32_as_i8(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* p) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
#if defined(LLMKIT_SIMD_X86)
  if constexpr (is_avx512_v<Arch>) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
  } else if constexpr (is_avx2_v<Arch>) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    const __m128i words = _mm_packs_epi32(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
  } else if constexpr (is_sse41_v<Arch>) {
    const __m128i words = _mm_packs_epi32(v, v);
    const int four = _mm_cvtsi128_si32(_mm_packs_epi16(words, words));
    std::memcpy(p, &four, 4);
  } else
#endif
  {
    alignas(64) std::int32_t wide[ibatch::size];
    v.store_aligned(wide);
    for (std::size_t j = 0; j < ibatch::size; ++j) p[j] = static_cast<std::int8_t>(wide[j]);
  }
}

}  // namespace llmkit::simd::detail

LLMKIT_SIMD_DIAGNOSTICS_END
