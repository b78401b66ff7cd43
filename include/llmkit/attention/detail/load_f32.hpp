// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/load_f32.hpp
/// Stored K/V elements (f16, bf16, int8) converted to f32, one overload per
/// instruction set on the xsimd arch tag (xsimd's `requires_arch` pattern:
/// the most derived tag an arch has wins, `xsimd::generic` is the fallback):
/// - `vload_f32<Arch>`: one register of a stored row, the conversion fused
///   into the load (decode's fused loads);
/// - `row_to_f32_converted<Arch>`: a whole row, scaled for int8.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// vload_f32 of a 16-bit or int8 type on archs without a fused conversion:
/// through a small buffer.
template <class Arch, class T>
inline vec<Arch> vload_f32_converted(const T* src, requires_arch<xsimd::generic>) noexcept {
  alignas(64) float tmp[lanes<Arch>];
  for (std::size_t i = 0; i < lanes<Arch>; ++i) {
    if constexpr (std::is_same_v<T, std::int8_t>) tmp[i] = static_cast<float>(src[i]);
    else tmp[i] = to_f32(src[i]);
  }
  return vec<Arch>::load_aligned(tmp);
}

/// row_to_f32_converted's scalar loop: the archs without vector
/// conversions, and the tail of those with them.
template <class T>
inline void row_to_f32_tail(const T* src, float scale, float* dst, std::size_t i, std::size_t n) noexcept {
  for (; i < n; ++i) {
    if constexpr (std::is_same_v<T, std::int8_t>) dst[i] = static_cast<float>(src[i]) * scale;
    else dst[i] = to_f32(src[i]);
  }
}

template <class Arch, class T>
inline void row_to_f32_converted(const T* src, float scale, float* dst, std::size_t n,
                                 requires_arch<xsimd::generic>) noexcept {
  row_to_f32_tail(src, scale, dst, 0, n);
}

#if defined(__AVX2__) && defined(__F16C__)
template <class Arch, class T>
inline vec<Arch> vload_f32_converted(const T* src, requires_arch<xsimd::avx2>) noexcept {
  if constexpr (std::is_same_v<T, f16>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  } else if constexpr (std::is_same_v<T, bf16>) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    static_assert(std::is_same_v<T, std::int8_t>, "vload_f32: unsupported storage type");
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src))));
  }
}

template <class Arch, class T>
inline void row_to_f32_converted(const T* src, float scale, float* dst, std::size_t n,
                                 requires_arch<xsimd::avx2>) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x;
    if constexpr (std::is_same_v<T, f16>) {
      x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    } else if constexpr (std::is_same_v<T, bf16>) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      x = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    } else {
      static_assert(std::is_same_v<T, std::int8_t>, "row_to_f32: unsupported storage type");
      const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
      x = _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(scale));
    }
    _mm256_storeu_ps(dst + i, x);
  }
  row_to_f32_tail(src, scale, dst, i, n);
}
#endif

#if defined(__AVX512F__)
template <class Arch, class T>
inline vec<Arch> vload_f32_converted(const T* src, requires_arch<xsimd::avx512f>) noexcept {
  if constexpr (std::is_same_v<T, f16>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  } else if constexpr (std::is_same_v<T, bf16>) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {
    static_assert(std::is_same_v<T, std::int8_t>, "vload_f32: unsupported storage type");
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  }
}

template <class Arch, class T>
inline void row_to_f32_converted(const T* src, float scale, float* dst, std::size_t n,
                                 requires_arch<xsimd::avx512f>) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x;
    if constexpr (std::is_same_v<T, f16>) {
      x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    } else if constexpr (std::is_same_v<T, bf16>) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
      x = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    } else {
      static_assert(std::is_same_v<T, std::int8_t>, "row_to_f32: unsupported storage type");
      const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      x = _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_set1_ps(scale));
    }
    _mm512_storeu_ps(dst + i, x);
  }
  row_to_f32_tail(src, scale, dst, i, n);
}
#endif

/// lanes<Arch> consecutive stored elements at `src` as one f32 register, the
/// conversion fused into the load (f16: vcvtph2ps; bf16: widen and shift;
/// int8: sign-extend and convert, the per-row scale left to the caller).
/// Decode kernels call this once per register of a K/V row and feed the
/// result to every query head of the GQA group, so no converted copy of the
/// row is ever written.
template <class Arch, class T>
inline vec<Arch> vload_f32(const T* src) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) {
    if constexpr (std::is_same_v<T, float>) return scalar_vec(*src);
    else if constexpr (std::is_same_v<T, std::int8_t>) return scalar_vec(static_cast<float>(*src));
    else return scalar_vec(to_f32(*src));
  } else if constexpr (std::is_same_v<T, float>) {
    return vec<Arch>::load_unaligned(src);
  } else {
    return vload_f32_converted<Arch>(src, Arch{});
  }
}

/// dst[0, n) = src[0, n) converted to f32, times `scale` for int8 (16-bit
/// and int8 storage types).
template <class Arch, class T>
inline void row_to_f32_converted(const T* src, float scale, float* dst, std::size_t n) noexcept {
  row_to_f32_converted<Arch>(src, scale, dst, n, simd::kernel_arch<Arch>{});
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
