// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_int8_avx512.hpp
/// int8 decode in integers with AVX-512 VNNI: the scores with int16
/// queries (VPDPWSSD, `scores_int<std::int16_t>`) or, opt-in, int8 ones
/// (VPDPBUSD, `scores_int<std::int8_t>`); on AMX the same scores by tiles
/// (`scores_amx`); P.V on int16 probabilities, two value rows per VPDPWSSD
/// (`quantize_p`, `accumulate_int<std::int16_t>`), or, opt-in, on uint8 ones, four rows
/// per VPDPBUSD (`quantize_p_u8`, `accumulate_int<std::uint8_t>`). Without AVX-512 VNNI
/// every flag here is false. decode_int8_avx2.hpp has the same kernels in
/// 256-bit registers.

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/attention/detail/amx.hpp"
#include "llmkit/attention/detail/decode_bf16.hpp"
#include "llmkit/attention/detail/decode_int8_avx2.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// decode_bf16_kernels plus the int8 kernels of AVX-512 (the `Arch` of an
/// AVX-512 build; `decode_int8_kernels_of` picks this or decode_int8_avx2).
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_int8_avx512 : decode_bf16_kernels<Arch, D, T, GB>, int8_paths_off {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  using layout = decode_layout<Arch, D, T, GB>;
  using layout::vnni_int16, layout::block, layout::passes, layout::width, layout::R, layout::row_bytes;
  using layout::p_levels, layout::in_column_order;

  /// int8 queries (`decode_params::int8_queries`) against int8 keys: the
  /// same integer dot products in half the multiply-adds. VPDPBUSD
  /// multiplies unsigned by signed bytes, so each key register is offset to
  /// unsigned (k + 128: one XOR, shared by the GB heads) and the offset's
  /// share, 128 * sum_d q[g][d], is taken off each head's sums (`q_offset`).
  static constexpr bool int8_queries_512 = vnni_int16 && D % 64 == 0;

  /// s (lane layout) = q_scale(g) * (q[g] . k[j]) in int32, for g < GB,
  /// j < block (int8 rows unscaled, like scores()). Q = std::int16_t: each
  /// key register sign-extended to int16 (32 values per step, VPDPWSSD);
  /// Q = std::int8_t (int8_queries): offset to unsigned (64 values per
  /// step, VPDPBUSD). The int32 sums are exact either way, so int16 queries
  /// holding int8 values give the same scores as the int8 path.
  /// @param q [GB] pointers to [D] query rows
  /// @param q_scale [16] lane a: the scale of head a / R
  /// @param q_offset [16] lane a: 128 * sum_d q[a / R][d] (Q = int8 only)
  /// @param k [block] pointers to [D] int8 rows
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile, or null
  template <class Q>
  static void scores_int(const Q* const* q, const float* q_scale, const std::int32_t* q_offset, const T* const* k,
                         float* s, const T* const* pf) noexcept
    requires(std::is_same_v<Q, std::int16_t> && vnni_int16) || (std::is_same_v<Q, std::int8_t> && int8_queries_512)
  {
    constexpr bool bytes = std::is_same_v<Q, std::int8_t>;
    constexpr std::size_t step = bytes ? 64 : 32;  // key values per register
    const __m512 qs = _mm512_load_ps(q_scale);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (std::size_t p = 0; p < passes; ++p) {
      __m512i acc[width];
#pragma GCC unroll 16
      for (std::size_t a = 0; a < width; ++a) acc[a] = _mm512_setzero_si512();
      for (std::size_t c = 0; c < D / step; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<D / step, step>(pf, (p * (D / step) + c) * R + r);
        __m512i qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) qv[g] = in_register(_mm512_loadu_si512(q[g] + c * step));
#pragma GCC unroll 16
        for (std::size_t r = 0; r < R; ++r) {
          const T* row = k[p * R + r] + c * step;
          if constexpr (bytes) {
            const __m512i kv = _mm512_xor_si512(_mm512_loadu_si512(row), flip);
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = _mm512_dpbusd_epi32(acc[g * R + r], kv, qv[g]);
          } else {
            const __m512i kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = _mm512_dpwssd_epi32(acc[g * R + r], kv, qv[g]);
          }
        }
      }
      __m512i sums = simd::detail::haddi16(acc);
      if constexpr (bytes) sums = _mm512_sub_epi32(sums, _mm512_load_si512(q_offset));
      _mm512_store_ps(s + p * width, _mm512_mul_ps(_mm512_cvtepi32_ps(sums), qs));
    }
  }

#if LLMKIT_ATTENTION_AMX_INT8
  /// int8 keys on AMX: scores_int<int16_t>'s integer dot products, 16 rows x GB
  /// heads per tile instruction. The int16 queries are split into bytes
  /// (q = 256 hi + lo, hi signed, lo unsigned: TDPBSSD and TDPBUSD) so the
  /// int32 sums, and hence the scores, equal scores_int<int16_t>'s bit for bit.
  static constexpr bool amx_scores = vnni_int16 && D % 64 == 0;
  static constexpr std::size_t amx_chunks = D / 64;  ///< 64-byte K chunks (one A tile each)
  /// Bytes of one batch's query tiles (amx_pack_q): [amx_chunks][hi, lo][16][GB * 4].
  static constexpr std::size_t amx_q_bytes = amx_chunks * 2 * 16 * GB * 4;

  /// The tiles of scores_amx: tmm0 a 64-byte chunk of the 16 K rows (A),
  /// tmm1 / tmm2 the high / low query bytes (B, [16 groups of 4 dims][GB
  /// heads x 4]), tmm3 / tmm4 their int32 sums ([16 rows][GB]).
  static tile_config amx_config() noexcept {
    tile_config c;
    c.rows[0] = 16;
    c.bytes_per_row[0] = 64;
    for (int t = 1; t <= 4; ++t) {
      c.rows[t] = 16;
      c.bytes_per_row[t] = GB * 4;
    }
    return c;
  }

  /// Packs the GB int16 query rows of a batch as B tiles: chunk c, half x
  /// (0 high bytes, 1 low bytes), row r, column g * 4 + i holds byte x of
  /// q[g][64 c + 4 r + i].
  /// @param q [GB] pointers to [D] int16 query rows
  /// @param dst [amx_q_bytes]
  static void amx_pack_q(const std::int16_t* const* q, std::int8_t* dst) noexcept
    requires amx_scores
  {
    for (std::size_t c = 0; c < amx_chunks; ++c)
      for (std::size_t r = 0; r < 16; ++r)
        for (std::size_t g = 0; g < GB; ++g)
          for (std::size_t i = 0; i < 4; ++i) {
            const std::int16_t x = q[g][c * 64 + r * 4 + i];
            const std::size_t at = ((c * 2) * 16 + r) * GB * 4 + g * 4 + i;
            dst[at] = static_cast<std::int8_t>(x >> 8);                                    // signed high byte
            dst[at + 16 * GB * 4] = static_cast<std::int8_t>(static_cast<std::uint8_t>(x));  // unsigned low byte
          }
  }

  /// Copies a block's rows for scores_amx, with vector loads: a tile load
  /// straight from rows still on their way from DRAM stalls the core.
  /// @param k [block] pointers to [D] int8 rows
  /// @param stage [block * D] the rows, contiguous
  static void amx_stage(const T* const* k, std::int8_t* stage) noexcept
    requires amx_scores
  {
    for (std::size_t j = 0; j < block; ++j) __builtin_memcpy(stage + j * D, k[j], D);
  }

  /// scores_int<int16_t> on AMX (the caller holds a tile_scope of amx_config()).
  /// @param qt [amx_q_bytes] the batch's query tiles (amx_pack_q)
  /// @param q_scale [16] lane a: the scale of head a / R
  /// @param stage [block * D] the block's int8 rows (amx_stage)
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void scores_amx(const std::int8_t* qt, const float* q_scale, const std::int8_t* stage, float* s,
                         const T* const* pf) noexcept
    requires amx_scores
  {
    _tile_zero(3);
    _tile_zero(4);
    for (std::size_t c = 0; c < amx_chunks; ++c) {
      if (pf != nullptr)
        for (std::size_t j = c * block / amx_chunks; j < (c + 1) * block / amx_chunks; ++j)
          prefetch_row<row_bytes>(pf[j]);
      const std::int8_t* hi = qt + c * 2 * 16 * GB * 4;
      _tile_loadd(0, stage + c * 64, D);
      _tile_loadd(1, hi, GB * 4);
      _tile_loadd(2, hi + 16 * GB * 4, GB * 4);
      _tile_dpbssd(3, 0, 1);
      _tile_dpbsud(4, 0, 2);
    }
    alignas(64) std::int32_t sum_hi[block * GB], sum_lo[block * GB];
    _tile_stored(3, sum_hi, GB * 4);
    _tile_stored(4, sum_lo, GB * 4);
    // [row][head] -> lane layout: lane g * R + r of pass p takes row p * R + r, head g.
    static constexpr auto lane_index = [] {
      std::array<std::int32_t, 16> x{};
      for (std::size_t g = 0; g < GB; ++g)
        for (std::size_t r = 0; r < R; ++r) x[g * R + r] = static_cast<std::int32_t>(r * GB + g);
      return x;
    }();
    const __m512i idx = _mm512_loadu_si512(lane_index.data());
    const __m512 qs = _mm512_load_ps(q_scale);
    for (std::size_t p = 0; p < passes; ++p) {
      const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sum_hi + p * 16), 8),
                                           _mm512_load_si512(sum_lo + p * 16));
      _mm512_store_ps(s + p * width, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(idx, sum)), qs));
    }
  }
#endif

  /// int8 values with AVX-512 VNNI (AVX2: `avx2_values`): the block's
  /// probabilities (times the value scales) rounded to int16, one scale per head and block (its largest
  /// probability / 32767), and P.V in integers: VPDPWSSD multiplies two
  /// rows at once (rows j and j + 1 interleaved per column) with the
  /// probability pair (p_j, p_j+1) of each head, so no int8 -> f32
  /// conversion is spent per value. The result is added to the f32 output
  /// once per block (rescaled by alpha like accumulate()).
  static constexpr bool vnni512_values = vnni_int16 && D % 64 == 0 && block % 2 == 0;

  /// acc + VPDPWSSD(a, b) (A = std::int16_t: int16 pairs) or VPDPBUSD(a, b)
  /// (A = std::uint8_t: a unsigned bytes, b signed), computed in acc's
  /// register. GCC 12 compiles the intrinsics in accumulate_int's loop as a
  /// copy of each accumulator to a new register before the instruction and
  /// back after it (two moves per dot product, and accumulators spilled to
  /// the stack); the asm names the accumulator as both input and output, so
  /// it stays where it is.
  template <class A>
  static __m512i vnni_dot(__m512i acc, __m512i a, __m512i b) noexcept {
    static_assert(std::is_same_v<A, std::int16_t> || std::is_same_v<A, std::uint8_t>);
#if defined(__GNUC__) && !defined(__clang__)
    if constexpr (sizeof(A) == 2) asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    else asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
#else
    if constexpr (sizeof(A) == 2) return _mm512_dpwssd_epi32(acc, a, b);
    else return _mm512_dpbusd_epi32(acc, a, b);
#endif
  }

  /// p16 (lane layout, [block * GB] int16) = round(p / p_scale[g]) with
  /// p_scale[g] = max_j p(g, j) / levels (0 for a head whose block is all
  /// 0; levels <= 32767).
  /// @param p [passes] registers of probabilities, lane layout (softmax)
  static void quantize_p(const __m512* p, std::int16_t* p16, float* p_scale, float levels) noexcept
    requires vnni512_values
  {
    const __m512 inv = p_levels(p, levels, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(p[ps], inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16 + ps * width), _mm512_cvtepi32_epi16(q));
    }
  }

  /// int8 values with 8-bit probabilities (`decode_params::int8_probabilities`):
  /// VPDPBUSD multiplies four rows at once (rows j .. j + 3 interleaved per
  /// column) with each head's unsigned 8-bit probabilities (p_j .. p_j+3),
  /// 64 products per instruction: half the multiply-adds of
  /// accumulate_int<std::int16_t>, and no sign extension of the rows (VPDPBUSD takes
  /// them as signed bytes). The four probabilities of a row quad are
  /// adjacent in the lane layout (`row_group`).
  static constexpr bool vnni512_u8_values = vnni512_values && block % 4 == 0;

  /// p8 (lane layout, [block * GB] uint8) = round(p / p_scale[g]) with
  /// p_scale[g] = max_j p(g, j) / 255 (0 for a head whose block is all 0).
  /// @param p [passes] registers of probabilities, lane layout (softmax)
  static void quantize_p_u8(const __m512* p, std::uint8_t* p8, float* p_scale) noexcept
    requires vnni512_u8_values
  {
    const __m512 inv = p_levels(p, 255.0f, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      // NaN * 0 converts to INT_MIN: the max with 0 keeps it a 0, as the
      // int16 path's truncation does; values above 255 saturate.
      const __m512i q = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(p[ps], inv)), _mm512_setzero_si512());
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p8 + ps * width), _mm512_cvtusepi32_epi8(q));
    }
  }

  /// o[g] = alpha[g] * o[g] + p_scale[g] * sum_j pq(g, j) * v[j] for g < GB,
  /// in passes of 64 columns (layout::pv_passes: GB x 4 int32 accumulators
  /// of 16 columns).
  /// P = std::int16_t (`vnni512_values`): rows j, j + 1 sign-extended and
  /// interleaved per column, two rows per VPDPWSSD; P = std::uint8_t
  /// (`vnni512_u8_values`): rows j .. j + 3 interleaved as bytes, four rows
  /// per VPDPBUSD.
  /// @param pq [block * GB] probabilities, lane layout (quantize_p or quantize_p_u8)
  /// @param p_scale [GB] their steps
  /// @param v [block] pointers to [D] int8 rows (unscaled: the row scales are in pq)
  /// @param pf [block] rows to prefetch meanwhile, or null
  template <class P>
  static void accumulate_int(float* const* o, const float* alpha, const P* pq, const float* p_scale,
                             const T* const* v, const T* const* pf) noexcept
    requires(std::is_same_v<P, std::int16_t> && vnni512_values) ||
            (std::is_same_v<P, std::uint8_t> && vnni512_u8_values)
  {
    constexpr std::size_t rows = 4 / sizeof(P);  // value rows per dot product
    layout::template pv_passes<rows, __m512i>(
        pq,
        [&](std::size_t j, std::size_t c0, __m512i* x) {
          if (pf != nullptr)  // one line per row (D / 64 per row in all)
#pragma GCC unroll 4
            for (std::size_t r = 0; r < rows; ++r) prefetch_slot<D / 64, 64>(pf, (c0 / 64) * block + j + r);
          interleave_rows<P>(v + j, c0, x);
        },
        [](__m512i acc, __m512i p, __m512i x) { return vnni_dot<P>(acc, p, x); },
        [&](std::size_t g, std::size_t c0, const __m512i* acc) {
          __m512 sums[4];
          if constexpr (rows == 2) {
            in_column_order(_mm512_cvtepi32_ps(acc[0]), _mm512_cvtepi32_ps(acc[1]), sums);
            in_column_order(_mm512_cvtepi32_ps(acc[2]), _mm512_cvtepi32_ps(acc[3]), sums + 2);
          } else {
            quad_column_order(acc, sums);
          }
          layout::template add_pass<4>(o[g] + c0, sums, alpha[g], p_scale[g]);
        });
  }

  /// The 64 columns from c0 of value rows v[0 .. 4 / sizeof(P)), interleaved
  /// for accumulate_int. P = std::int16_t: per 32-column half h and 128-bit
  /// lane L, x[2h] holds columns 32h + 8L .. 32h + 8L + 3 and x[2h + 1]
  /// 32h + 8L + 4 .. 32h + 8L + 7, as (row 0, row 1) int16 pairs;
  /// P = std::uint8_t: x[k] holds columns 16L + 4k .. 16L + 4k + 3, each as
  /// the bytes of rows 0 .. 3.
  template <class P>
  static void interleave_rows(const T* const* v, std::size_t c0, __m512i* x) noexcept {
    if constexpr (sizeof(P) == 2) {
#pragma GCC unroll 2
      for (std::size_t h = 0; h < 2; ++h) {
        const auto widened = [&](std::size_t i) {
          return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[i] + c0 + h * 32)));
        };
        const __m512i a = widened(0), b = widened(1);
        x[2 * h] = _mm512_unpacklo_epi16(a, b);
        x[2 * h + 1] = _mm512_unpackhi_epi16(a, b);
      }
    } else {
      __m512i r[4];
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) r[k] = _mm512_loadu_si512(v[k] + c0);
      const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]), hi01 = _mm512_unpackhi_epi8(r[0], r[1]);
      const __m512i lo23 = _mm512_unpacklo_epi8(r[2], r[3]), hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
      x[0] = _mm512_unpacklo_epi16(lo01, lo23);
      x[1] = _mm512_unpackhi_epi16(lo01, lo23);
      x[2] = _mm512_unpacklo_epi16(hi01, hi23);
      x[3] = _mm512_unpackhi_epi16(hi01, hi23);
    }
  }

  /// The int32 sums of accumulate_int<std::uint8_t>'s four registers as f32 in column
  /// order: register k holds, per 128-bit lane L, columns 16L + 4k ..
  /// 16L + 4k + 3 (a 4 x 4 transpose of 128-bit blocks).
  /// @param cols [4] register x: columns 16x .. 16x + 15
  static void quad_column_order(const __m512i* acc, __m512* cols) noexcept {
    const __m512i i_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i_hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512 f[4];
    for (std::size_t k = 0; k < 4; ++k) f[k] = _mm512_cvtepi32_ps(acc[k]);
    // t: (k0 L0, k1 L0, k0 L1, k1 L1) / (k0 L2, k1 L2, k0 L3, k1 L3); u the same for k2, k3.
    const __m512 t0 = _mm512_permutex2var_ps(f[0], i_lo, f[1]), t1 = _mm512_permutex2var_ps(f[0], i_hi, f[1]);
    const __m512 u0 = _mm512_permutex2var_ps(f[2], i_lo, f[3]), u1 = _mm512_permutex2var_ps(f[2], i_hi, f[3]);
    cols[0] = _mm512_shuffle_f32x4(t0, u0, _MM_SHUFFLE(1, 0, 1, 0));
    cols[1] = _mm512_shuffle_f32x4(t0, u0, _MM_SHUFFLE(3, 2, 3, 2));
    cols[2] = _mm512_shuffle_f32x4(t1, u1, _MM_SHUFFLE(1, 0, 1, 0));
    cols[3] = _mm512_shuffle_f32x4(t1, u1, _MM_SHUFFLE(3, 2, 3, 2));
  }

  /// This arch's int8 paths (int8_paths_off, decode_int8_avx2.hpp).
  static constexpr bool int16_values = vnni512_values;
  static constexpr bool u8_values = vnni512_u8_values;
  static constexpr bool int8_queries = int8_queries_512;
#endif
};

/// decode_int8_kernels_of (decode_int8_avx2.hpp) on AVX-512's tags.
template <class Arch, std::size_t D, class T, std::size_t GB>
decode_int8_avx512<Arch, D, T, GB> decode_int8_kernels_of(requires_arch<xsimd::avx512f>) noexcept;

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
