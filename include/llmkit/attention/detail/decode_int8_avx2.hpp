// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_int8_avx2.hpp
/// int8 decode in integers on AVX2: the scores with int16 queries
/// (VPMADDWD + VPADDD, or one 256-bit VPDPWSSD with AVX-VNNI,
/// `scores_int<std::int16_t>`) or, opt-in with VNNI, int8 ones (VPDPBUSD,
/// `scores_int<std::int8_t>`); with VNNI, P.V on int16 probabilities
/// (`quantize_p`, `accumulate_int<std::int16_t>`) or, opt-in, uint8 ones (`quantize_p_u8`,
/// `accumulate_int<std::uint8_t>`), as decode_int8_avx512.hpp does in 512-bit registers.
/// AVX-VNNI is Intel's from Alder Lake and AMD's from Zen 5; an AVX-512
/// build with VL + VNNI uses the EVEX form. Without AVX2 every flag here is
/// false.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/attention/detail/decode_bf16.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// The int8 paths decode_task.hpp and the softmax choose between, all off:
/// what an arch without them has. The int8 kernel classes derive from it
/// and redeclare the flags of the paths they have.
struct int8_paths_off {
  static constexpr bool int16_values = false;  ///< P.V in integers (int8 values, int16 probabilities)
  static constexpr bool u8_values = false;     ///< P.V with 8-bit probabilities (int8_probabilities)
  static constexpr bool int8_queries = false;  ///< Q.K with int8 queries (decode_params::int8_queries)
  static constexpr bool amx_scores = false;    ///< Q.K on AMX tiles
};

/// decode_bf16_kernels plus the int8 kernels of AVX2 (every `Arch` but
/// AVX-512's; their flags are false where the arch lacks AVX2).
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_int8_avx2 : decode_bf16_kernels<Arch, D, T, GB>, int8_paths_off {
#if defined(__AVX2__)
  using layout = decode_layout<Arch, D, T, GB>;
  using layout::avx2_int16, layout::avx2_vnni, layout::block, layout::passes, layout::width, layout::R;
  using layout::p8_quads, layout::row_group_bits, layout::p_levels;

  /// int8 queries on AVX2 with VNNI (as `int8_queries_512`): VPDPBUSD on
  /// 32 key bytes offset to unsigned, twice the products of VPDPWSSD.
  static constexpr bool int8_queries_avx2 = avx2_vnni && D % 32 == 0;

  /// scores_int on AVX2 (`avx2_int16`): the same exact int32 dot products.
  /// Q = std::int16_t: 16 key values per step (each key register
  /// sign-extended once for the GB heads), VPMADDWD + VPADDD per head, or
  /// VPDPWSSD (`avx2_vnni`); Q = std::int8_t (`int8_queries_avx2`): 32 per
  /// step, offset to unsigned (one XOR), VPDPBUSD, the offset's share
  /// (`q_offset`) taken off after the fold.
  template <class Q>
  static void scores_int(const Q* const* q, const float* q_scale, const std::int32_t* q_offset, const T* const* k,
                         float* s, const T* const* pf) noexcept
    requires(std::is_same_v<Q, std::int16_t> && avx2_int16) || (std::is_same_v<Q, std::int8_t> && int8_queries_avx2)
  {
    static_assert(width == 8, "scores_int (AVX2): one register of 8 lanes per pass");
    constexpr bool bytes = std::is_same_v<Q, std::int8_t>;
    constexpr std::size_t step = bytes ? 32 : 16;  // key values per register
    const __m256 qs = _mm256_load_ps(q_scale);
    [[maybe_unused]] const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (std::size_t p = 0; p < passes; ++p) {
      __m256i acc[width];
#pragma GCC unroll 8
      for (std::size_t a = 0; a < width; ++a) acc[a] = _mm256_setzero_si256();
      // Not unrolled: GCC 12 unrolls the column steps fully, issues every
      // step's products first and spills them to the stack for the adds.
#pragma GCC unroll 1
      for (std::size_t c = 0; c < D / step; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<D / step, step>(pf, (p * (D / step) + c) * R + r);
        __m256i qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g)
          qv[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[g] + c * step));
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) {
          const T* row = k[p * R + r] + c * step;
          if constexpr (bytes) {
            const __m256i kv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)), flip);
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = vnni_dot<std::uint8_t>(acc[g * R + r], kv, qv[g]);
          } else {
            const __m256i kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) {
              if constexpr (avx2_vnni)
                acc[g * R + r] = vnni_dot<std::int16_t>(acc[g * R + r], kv, qv[g]);
              else
                acc[g * R + r] = _mm256_add_epi32(acc[g * R + r], _mm256_madd_epi16(kv, qv[g]));
            }
          }
        }
      }
      __m256i sums = simd::detail::haddi8(acc);
      if constexpr (bytes) sums = _mm256_sub_epi32(sums, _mm256_load_si256(reinterpret_cast<const __m256i*>(q_offset)));
      _mm256_store_ps(s + p * width, _mm256_mul_ps(_mm256_cvtepi32_ps(sums), qs));
    }
  }

  /// acc + VPDPWSSD(a, b) (A = std::int16_t: int16 pairs) or VPDPBUSD(a, b)
  /// (A = std::uint8_t: a unsigned bytes, b signed) on 256-bit registers
  /// (`avx2_vnni`), in acc's register (as the AVX-512 vnni_dot). Without
  /// AVX-512 VL the instruction must take its VEX encoding (AVX-VNNI; the
  /// assembler's default for these operands is the EVEX one) and registers
  /// 0-15.
  template <class A>
  static __m256i vnni_dot(__m256i acc, __m256i a, __m256i b) noexcept
    requires avx2_vnni
  {
    static_assert(std::is_same_v<A, std::int16_t> || std::is_same_v<A, std::uint8_t>);
    constexpr bool words = sizeof(A) == 2;
#if defined(__GNUC__) && !defined(__clang__)
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
    if constexpr (words) asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    else asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
#else
    if constexpr (words) asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    else asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
#endif
    return acc;
#elif defined(__AVX512VL__) && defined(__AVX512VNNI__)
    return words ? _mm256_dpwssd_epi32(acc, a, b) : _mm256_dpbusd_epi32(acc, a, b);
#else
    return words ? _mm256_dpwssd_avx_epi32(acc, a, b) : _mm256_dpbusd_avx_epi32(acc, a, b);
#endif
  }

  /// The int8 P.V in integers on AVX2 with VNNI (`avx2_vnni`), as on
  /// AVX-512 (`vnni512_values`): the probabilities rounded to int16 per
  /// head and block (`quantize_p`), two value rows interleaved per 256-bit
  /// VPDPWSSD (`accumulate_int<std::int16_t>`). The f32 path (`accumulate`) spends two
  /// conversions per 8 values and an FMA per 8 values and head.
  static constexpr bool avx2_values = avx2_vnni && block % 2 == 0;

  /// round(p * inv) as int32, >= 0: NaN * 0 converts to INT_MIN, which the
  /// max with 0 keeps a 0, as the AVX-512 int16 path's truncation does (the
  /// signed or unsigned packs after it would saturate it).
  static __m256i rounded_levels(__m256 p, __m256 inv) noexcept {
    return _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(p, inv)), _mm256_setzero_si256());
  }

  /// quantize_p on AVX2: p16 (lane layout) = round(p / p_scale[g]).
  static void quantize_p(const __m256* p, std::int16_t* p16, float* p_scale, float levels) noexcept
    requires avx2_values
  {
    const __m256 inv = p_levels(p, levels, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      const __m256i q = rounded_levels(p[ps], inv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p16 + ps * width),
                       _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
  }

  /// int8_probabilities on AVX2 with VNNI (as `vnni512_u8_values`): the
  /// probabilities rounded to uint8 and four value rows interleaved per
  /// 256-bit VPDPBUSD, where `accumulate_int<std::int16_t>` takes two per VPDPWSSD on the
  /// same 255 levels (the int32 sums, hence the results, are equal).
  static constexpr bool avx2_u8_values = avx2_values && block % 4 == 0;

  /// quantize_p_u8 on AVX2: p8 = round(p / p_scale[g]) with p_scale[g] =
  /// max_j p(g, j) / 255, in the lane layout or, where `p8_quads`, by row
  /// quads (`row_group_bits`).
  static void quantize_p_u8(const __m256* p, std::uint8_t* p8, float* p_scale) noexcept
    requires avx2_u8_values
  {
    const __m256 inv = p_levels(p, 255.0f, p_scale);
    if constexpr (p8_quads) {
      static_assert(R == 2 && GB == 4 && passes % 2 == 0, "quantize_p_u8: quads from pass pairs of 2 rows x 4 heads");
      for (std::size_t ps = 0; ps < passes; ps += 2) {
        const __m256i a = rounded_levels(p[ps], inv), b = rounded_levels(p[ps + 1], inv);
        // Per 128-bit half H: head 2H's quad (rows of pass ps, then ps + 1)
        // in lo, head 2H + 1's in hi.
        const __m256i lo = _mm256_unpacklo_epi64(a, b), hi = _mm256_unpackhi_epi64(a, b);
        const __m256i w = _mm256_packus_epi32(lo, hi);  // half H: heads 2H, 2H + 1 (uint16)
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p8 + ps / 2 * GB * 4), _mm256_castsi256_si128(bytes));
      }
    } else {
      for (std::size_t ps = 0; ps < passes; ++ps) {
        const __m256i q = rounded_levels(p[ps], inv);
        const __m256i w = _mm256_packus_epi32(q, q);
        const __m256i bytes = _mm256_packus_epi16(w, w);  // half H: lanes 4H .. 4H + 3 in its first dword
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p8 + ps * width),
                         _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1)));
      }
    }
  }

  /// accumulate_int on AVX2: o[g] = alpha[g] * o[g] + p_scale[g] * sum_j
  /// pq(g, j) * v[j], in passes of 16 columns (GB x 2 int32 accumulators of
  /// 8 columns; each head's probability group broadcast where it is used,
  /// so the 16 registers hold the accumulators, the interleaved rows and
  /// one group). P = std::int16_t (`avx2_values`): two rows per VPDPWSSD;
  /// P = std::uint8_t (`avx2_u8_values`): four rows per VPDPBUSD.
  template <class P>
  static void accumulate_int(float* const* o, const float* alpha, const P* pq, const float* p_scale,
                             const T* const* v, const T* const* pf) noexcept
    requires(std::is_same_v<P, std::int16_t> && avx2_values) || (std::is_same_v<P, std::uint8_t> && avx2_u8_values)
  {
    constexpr std::size_t rows = 4 / sizeof(P);  // value rows per dot product
    for (std::size_t c0 = 0; c0 < D; c0 += 16) {
      __m256i acc[GB][2];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += rows) {
        if (pf != nullptr)  // a 16-byte step of each row: a line in four
#pragma GCC unroll 4
          for (std::size_t r = 0; r < rows; ++r) prefetch_slot<D / 16, 16>(pf, (c0 / 16) * block + j + r);
        __m256i x[2];
        interleave_rows<P>(v + j, c0, x);
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) {
          const __m256i pw = _mm256_set1_epi32(row_group_bits(pq, j, g));
          acc[g][0] = vnni_dot<P>(acc[g][0], pw, x[0]);
          acc[g][1] = vnni_dot<P>(acc[g][1], pw, x[1]);
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        const __m256 lo = _mm256_cvtepi32_ps(acc[g][0]), hi = _mm256_cvtepi32_ps(acc[g][1]);
        // int16 pairs: each 128-bit half holds 4 columns of lo and the next 4 of hi.
        const __m256 cols[2] = {rows == 2 ? _mm256_permute2f128_ps(lo, hi, 0x20) : lo,
                                rows == 2 ? _mm256_permute2f128_ps(lo, hi, 0x31) : hi};
        layout::template add_pass<2>(o[g] + c0, cols, alpha[g], p_scale[g]);
      }
    }
  }

  /// The 16 columns from c0 of value rows v[0 .. 4 / sizeof(P)), interleaved
  /// for accumulate_int. P = std::int16_t: per 128-bit half H, x[0] holds
  /// columns 8H .. 8H + 3 and x[1] 8H + 4 .. 8H + 7, as (row 0, row 1)
  /// int16 pairs; P = std::uint8_t: x[0] holds columns 0 .. 7 and x[1]
  /// 8 .. 15, each as the bytes of rows 0 .. 3 (by 128-bit unpacks).
  template <class P>
  static void interleave_rows(const T* const* v, std::size_t c0, __m256i* x) noexcept {
    if constexpr (sizeof(P) == 2) {
      const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v[0] + c0)));
      const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v[1] + c0)));
      x[0] = _mm256_unpacklo_epi16(a, b);
      x[1] = _mm256_unpackhi_epi16(a, b);
    } else {
      __m128i r[4];
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v[k] + c0));
      const __m128i lo01 = _mm_unpacklo_epi8(r[0], r[1]), hi01 = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i lo23 = _mm_unpacklo_epi8(r[2], r[3]), hi23 = _mm_unpackhi_epi8(r[2], r[3]);
      x[0] = _mm256_set_m128i(_mm_unpackhi_epi16(lo01, lo23), _mm_unpacklo_epi16(lo01, lo23));
      x[1] = _mm256_set_m128i(_mm_unpackhi_epi16(hi01, hi23), _mm_unpacklo_epi16(hi01, hi23));
    }
  }

  /// This arch's int8 paths (int8_paths_off; no AMX here).
  static constexpr bool int16_values = avx2_values;
  static constexpr bool u8_values = avx2_u8_values;
  static constexpr bool int8_queries = int8_queries_avx2;
#endif
};

/// The int8 kernels of an arch, for `decode_int8_kernels`
/// (decode_kernels.hpp; declared only, named in decltype): AVX2's for every
/// arch whose tag has no overload of its own.
template <class Arch, std::size_t D, class T, std::size_t GB>
decode_int8_avx2<Arch, D, T, GB> decode_int8_kernels_of(requires_arch<xsimd::generic>) noexcept;

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
