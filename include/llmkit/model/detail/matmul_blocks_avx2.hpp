// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_blocks_avx2.hpp
/// The int8-activation products of the 4-6-bit block formats for AVX2
/// targets without AVX-512 VNNI: the formulas of matmul_blocks32_vnni.hpp
/// and matmul_kquants_vnni.hpp on 32-value registers, with VPMADDUBSW
/// (unsigned weights x int8 activations into 16-bit pair sums) and
/// VPMADDWD in place of VPDPBUSD / VPDPWSSD: by ones for the 32-value
/// formats (int32 sums of 4 values, started from the activations'
/// -offset * sum q), by the sub-block scales for the K-quants. IQ4_NL and
/// IQ4_XS take their levels' magnitudes and the activations with the
/// levels' signs (VPSIGNB), as level + 128 would saturate VPMADDUBSW's
/// 16-bit pair sums. The weights
/// are decoded in registers; each output is accumulated in one order
/// whatever the batch, tile or thread.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmkit/model/detail/matmul_blocks32_vnni.hpp"
#include "llmkit/model/detail/matmul_blocks_q8.hpp"
#include "llmkit/model/detail/matmul_kquants_vnni.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

#if defined(__AVX2__) && defined(__FMA__)

/// 32 bits as 32 bytes: 0x10 where bit j of `bits` is set (Q5's fifth bits).
inline __m256i avx2_bits_to_16s(std::uint32_t bits) noexcept {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(std::int64_t(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/// A 32-value block's 4-bit values in natural order (low nibbles, then high).
inline __m256i avx2_nibbles(const std::uint8_t* qs) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(z, _mm256_set1_epi8(0x0F));
}

/// The table formats (IQ4_NL, IQ4_XS, MXFP4): signed levels, multiplied as
/// magnitudes times signed activations.
template <class Block>
inline constexpr bool avx2_signed_levels = std::is_same_v<Block, block_iq4_nl> ||
                                           std::is_same_v<Block, block_iq4_xs> || std::is_same_v<Block, block_mxfp4>;

/// The 16 signed levels of a table format.
template <class Block>
inline constexpr const std::int8_t* avx2_level_table = kvalues_iq4nl;
template <>
inline constexpr const std::int8_t* avx2_level_table<block_mxfp4> = kvalues_mxfp4;

/// 32 indices (avx2_nibbles order) into `levels` as level magnitudes, and
/// the levels themselves in `sign` (for VPSIGNB, which zeroes where a level
/// is 0: its magnitude is 0 too).
inline __m256i avx2_table_levels(const std::int8_t* levels, __m256i index, __m256i& sign) noexcept {
  sign = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels))), index);
  return _mm256_abs_epi8(sign);
}

/// Block p's 32 unsigned values, scale and (Q4_1 / Q5_1) m_b of w = d * u - m_b.
template <class Block>
inline __m256i avx2_block_values(const Block& p) noexcept {
  if constexpr (std::is_same_v<Block, block_q4_0> || std::is_same_v<Block, block_q4_1>) {
    return avx2_nibbles(p.qs);
  } else {
    std::uint32_t qh;
    std::memcpy(&qh, p.qh, 4);
    return _mm256_or_si256(avx2_nibbles(p.qs), avx2_bits_to_16s(qh));
  }
}

/// Tokens [t0, t0 + TN) x rows [o0, o0 + ON) of a 32-value format.
template <class Block, std::size_t TN, std::size_t ON>
inline void avx2_block32_tile(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                              bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  constexpr bool signed_levels = avx2_signed_levels<Block>;
  constexpr int offset = signed_levels ? 0 : int8_form<Block>::offset;
  constexpr bool has_mins = int8_form<Block>::has_mins;
  const std::size_t stride = xa.stride, row_bytes = w.row_bytes(), blocks = w.in / 32;
  const Block* rows[ON];
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  __m256 acc[TN][ON];
  float macc[TN][ON] = {};
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) acc[a][b] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const std::size_t step_bytes = ON * sizeof(Block);
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  for (std::size_t k = 0; k < blocks; ++k) {
    // Rows are contiguous: each block step prefetches about its share of them.
    prefetch_lines_l2(ahead + k * step_bytes, step_bytes);
    __m256i u[ON];
    [[maybe_unused]] __m256i sign[ON];
    __m256 s[ON];
#pragma GCC unroll 8
    for (std::size_t b = 0; b < ON; ++b) {
      if constexpr (signed_levels)
        u[b] = avx2_table_levels(avx2_level_table<Block>, avx2_nibbles(rows[b][k].qs), sign[b]);
      else
        u[b] = avx2_block_values(rows[b][k]);
      s[b] = _mm256_set1_ps(scale_f32(rows[b][k].d));
    }
#pragma GCC unroll 8
    for (std::size_t a = 0; a < TN; ++a) {
      const std::size_t t = t0 + a;
      const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.row(t) + 32 * k));
      const __m256 d = _mm256_load_ps(xa.pair_scales(t, k / 2) + 8 * (k % 2));
      [[maybe_unused]] __m256i start;
      if constexpr (offset != 0)
        start = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.offset_sums.data() + t * stride / 4 + 8 * k));
#pragma GCC unroll 8
      for (std::size_t b = 0; b < ON; ++b) {
        const __m256i qb = signed_levels ? _mm256_sign_epi8(q, sign[b]) : q;
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u[b], qb), ones);
        if constexpr (offset != 0) dot = _mm256_add_epi32(dot, start);
        acc[a][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s[b], d), acc[a][b]);
        if constexpr (has_mins)
          macc[a][b] = std::fma(-scale_f32(rows[b][k].m), xa.block_sums[t * stride / 32 + k], macc[a][b]);
      }
    }
  }
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) {
      const float v = reduce8(acc[a][b]) - macc[a][b];
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + v : v;
    }
}

/// A K-quant super-block's scales as int16 words (8 for Q4_K / Q5_K, 16 for
/// Q3_K / Q6_K), d, and dmin * m_s.
struct avx2_k_scales {
  alignas(32) std::int16_t sc[16];
  float d;
  __m256 mins;
  alignas(32) std::int16_t m16[16];  ///< Q2_K: its 16 minimums
  float dmin;                        ///< Q2_K
};

template <class Block>
inline avx2_k_scales avx2_kquant_scales(const Block& p) noexcept {
  avx2_k_scales out{};
  if constexpr (std::is_same_v<Block, block_q3_k>) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.sc), q3_k_scale_words(p.scales));
    out.d = scale_f32(p.d);
    out.mins = _mm256_setzero_ps();
  } else if constexpr (has_k_scales16<Block>) {
    k_scales16(p, out.sc);
    out.d = scale_f32(p.d);
    out.mins = _mm256_setzero_ps();
  } else if constexpr (std::is_same_v<Block, block_q2_k>) {
    __m256i sc, m;
    q2_k_scale_words(p, sc, m);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.sc), sc);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.m16), m);
    out.d = scale_f32(p.d);
    out.dmin = scale_f32(p.dmin);
    out.mins = _mm256_setzero_ps();
  } else if constexpr (std::is_same_v<Block, block_iq4_xs>) {
    _mm_store_si128(reinterpret_cast<__m128i*>(out.sc), iq4_xs_scale_words(p));
    out.d = scale_f32(p.d);
    out.mins = _mm256_setzero_ps();
  } else {
    float m[8];
    for (std::size_t j = 0; j < 8; ++j) {
      std::uint8_t sc, mn;
      k_scale_min(p.scales, j, sc, mn);
      out.sc[j] = sc;
      m[j] = float(mn);
    }
    out.d = scale_f32(p.d);
    out.mins = _mm256_mul_ps(_mm256_set1_ps(scale_f32(p.dmin)), _mm256_loadu_ps(m));
  }
  return out;
}

/// Values [32 h, 32 h + 32) of group g (64 values) of a K-quant super-block.
template <class Block>
inline __m256i avx2_kquant_values(const Block& p, std::size_t g, std::size_t h) noexcept {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (std::is_same_v<Block, block_q6_k>) {
    const std::size_t half = g / 2, shift = 4 * (g % 2) + 2 * h;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.ql + 64 * half + 32 * h));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qh + 32 * half));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(int(4 * (g % 2)))), low4);
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(int(shift))), _mm256_set1_epi8(0x03));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  } else if constexpr (std::is_same_v<Block, block_q3_k> || std::is_same_v<Block, block_q2_k>) {
    // Values 64g + 32h + l: crumb row r = 2 (g % 2) + h of half g / 2 (Q3_K: plus 4 * its hmask bit).
    const std::size_t half = g / 2, r = 2 * (g % 2) + h;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs + 32 * half));
    const __m256i c = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(int(2 * r))), _mm256_set1_epi8(0x03));
    if constexpr (std::is_same_v<Block, block_q2_k>) {
      return c;
    } else {
      const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.hmask));
      const __m256i t = _mm256_srl_epi16(m, _mm_cvtsi32_si128(int(4 * half + r)));
      return _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi16(t, 2), _mm256_set1_epi8(0x04)));
    }
  } else {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs + 32 * g));
    __m256i u = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(int(4 * h))), low4);
    if constexpr (std::is_same_v<Block, block_q5_k>) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qh));
      const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(int(2 * g + h))), _mm256_set1_epi8(1));
      u = _mm256_or_si256(u, _mm256_slli_epi16(bit, 4));
    }
    return u;
  }
}

/// The scale word of each of the 16 pair sums of values [32 h, 32 h + 32)
/// of group g: one sub-block of 32 (Q4_K / Q5_K, IQ4_XS) or two of 16 (Q2_K, Q3_K, Q6_K).
template <class Block>
inline __m256i avx2_kquant_words(const avx2_k_scales& sc, std::size_t g, std::size_t h) noexcept {
  if constexpr (has_k_scales16<Block> || std::is_same_v<Block, block_q2_k>) {
    const std::size_t j = 4 * g + 2 * h;
    return _mm256_setr_m128i(_mm_set1_epi16(sc.sc[j]), _mm_set1_epi16(sc.sc[j + 1]));
  } else {
    return _mm256_set1_epi16(sc.sc[2 * g + h]);
  }
}

/// Tokens [t0, t0 + TN) x rows [o0, o0 + ON) of a K-quant format (or
/// IQ4_XS) over activations quantised by assign_k.
template <class Block, std::size_t TN, std::size_t ON>
inline void avx2_kquant_tile(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                             bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  // Q2_K's minimums are per 16: mins16 below, not the per-32 block sums.
  constexpr bool has_mins = int8_form<Block>::has_mins && min_values<Block> == 32;
  const std::size_t stride = xa.stride, row_bytes = w.row_bytes(), units = w.in / qk_k;
  const Block* rows[ON];
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  __m256 acc[TN][ON], macc[TN][ON];
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) acc[a][b] = macc[a][b] = _mm256_setzero_ps();
  const std::size_t step_bytes = ON * sizeof(Block);
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  for (std::size_t i = 0; i < units; ++i) {
    prefetch_lines_l2(ahead + i * step_bytes, step_bytes);
    avx2_k_scales sc[ON];
    __m256i iacc[TN][ON];
    for (std::size_t b = 0; b < ON; ++b) {
      sc[b] = avx2_kquant_scales(rows[b][i]);
      for (std::size_t a = 0; a < TN; ++a) iacc[a][b] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (std::size_t half = 0; half < 8; ++half) {
      const std::size_t g = half / 2, h = half % 2;
      __m256i u[ON], ws[ON];
      [[maybe_unused]] __m256i sign[ON];
#pragma GCC unroll 8
      for (std::size_t b = 0; b < ON; ++b) {
        if constexpr (avx2_signed_levels<Block>)  // sub-block `half`: qs[16 half..], low nibbles then high
          u[b] = avx2_table_levels(kvalues_iq4nl, avx2_nibbles(rows[b][i].qs + 16 * half), sign[b]);
        else
          u[b] = avx2_kquant_values(rows[b][i], g, h);
        ws[b] = avx2_kquant_words<Block>(sc[b], g, h);
      }
#pragma GCC unroll 8
      for (std::size_t a = 0; a < TN; ++a) {
        const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.row(t0 + a) + qk_k * i + 32 * half));
#pragma GCC unroll 8
        for (std::size_t b = 0; b < ON; ++b) {
          const __m256i qb = avx2_signed_levels<Block> ? _mm256_sign_epi8(q, sign[b]) : q;
          iacc[a][b] = _mm256_add_epi32(iacc[a][b], _mm256_madd_epi16(_mm256_maddubs_epi16(u[b], qb), ws[b]));
        }
      }
    }
    for (std::size_t a = 0; a < TN; ++a) {
      const std::size_t t = t0 + a;
      const float dk = xa.k_scale(t, i);
      if constexpr (has_k_scales16<Block>) {  // values are u - offset (a power of two)
        constexpr int shift = std::countr_zero(unsigned(int8_form<Block>::offset));
        const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * stride + qk_k * i) / 16));
        for (std::size_t b = 0; b < ON; ++b) {
          const __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(sc[b].sc));
          iacc[a][b] = _mm256_sub_epi32(iacc[a][b], _mm256_slli_epi32(_mm256_madd_epi16(words, s16), shift));
        }
      }
      for (std::size_t b = 0; b < ON; ++b)
        acc[a][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[a][b]), _mm256_set1_ps(sc[b].d * dk), acc[a][b]);
      if constexpr (std::is_same_v<Block, block_q2_k>) {  // - dmin * d_x * sum_s m_s * sum q (int32)
        const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * stride + qk_k * i) / 16));
        for (std::size_t b = 0; b < ON; ++b) {
          const __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(sc[b].m16));
          acc[a][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(words, s16)), _mm256_set1_ps(-(sc[b].dmin * dk)),
                                      acc[a][b]);
        }
      }
      if constexpr (has_mins) {
        const __m256 xs = _mm256_loadu_ps(xa.block_sums.data() + t * stride / 32 + 8 * i);
        for (std::size_t b = 0; b < ON; ++b) macc[a][b] = _mm256_fmadd_ps(sc[b].mins, xs, macc[a][b]);
      }
    }
  }
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) {
      float v = reduce8(acc[a][b]);
      if constexpr (has_mins) v -= reduce8(macc[a][b]);
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + v : v;
    }
}

/// Rows [row_first, row_last) for every token: one token in tiles of 4
/// rows, more in 2 x 2 tiles.
template <class Block>
void matmul_blocks_avx2_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                             bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  auto tile = [&]<std::size_t TN, std::size_t ON>(std::size_t t, std::size_t o) {
    if constexpr (is_kquant_block<Block>)
      avx2_kquant_tile<Block, TN, ON>(xa, w, y, y_stride, accumulate, t, o);
    else
      avx2_block32_tile<Block, TN, ON>(xa, w, y, y_stride, accumulate, t, o);
  };
  if (xa.n == 1) {
    std::size_t o = row_first;
    for (; o + 4 <= row_last; o += 4) tile.template operator()<1, 4>(0, o);
    for (; o < row_last; ++o) tile.template operator()<1, 1>(0, o);
    return;
  }
  std::size_t o = row_first;
  for (; o + 2 <= row_last; o += 2) {
    std::size_t t = 0;
    for (; t + 2 <= xa.n; t += 2) tile.template operator()<2, 2>(t, o);
    if (t < xa.n) tile.template operator()<1, 2>(t, o);
  }
  for (; o < row_last; ++o)
    for (std::size_t t = 0; t < xa.n; ++t) tile.template operator()<1, 1>(t, o);
}

/// int8_block_rows on AVX2 (xsimd::avx2 and fma3<avx2>).
template <class Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::avx2>) noexcept {
  matmul_blocks_avx2_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last);
}

#if defined(__AVX512F__)
/// AVX-512 without VNNI (and the formats VNNI has no kernel for) runs the
/// AVX2 kernel: xsimd's avx512f does not derive from avx2, so it forwards.
template <class Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::avx512f>) noexcept {
  int8_block_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last, xsimd::avx2{});
}
#endif
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
