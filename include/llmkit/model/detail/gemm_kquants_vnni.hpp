// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/gemm_kquants_vnni.hpp
/// Prefill products of the K-quants (Q2_K ... Q6_K) and IQ4_XS with int8
/// activations (per 256 values, q8_activations::assign_k) as a
/// register-blocked AVX-512 VNNI GEMM: output rows in the vector lanes, as
/// the Q8_0 GEMM (matmul_q8_vnni.hpp) does.
///
/// W's rows are decoded 16 at a time (a panel), once per strip of two
/// panels, into a per-thread buffer of one record per super-block i
/// (kquant_record):
///
///     u[G * 64 + 4 r + j]  = value 4 G + j of row r              (uint8, G < 64)
///     sc[s * 16 + r]       = sub-block s's scale                  (int32; 8 of 32 values or 16 of 16)
///     pairs[k * 16 + r]    = m_{2k} | m_{2k + 1} << 16            (int16 pairs; without minimums sc_{2k}, sc_{2k + 1})
///     d[r], dmin[r]        = the super-block's f32 scales
///
/// Q2_K, Q4_K and Q5_K have minimums; Q3_K, Q6_K and IQ4_XS store their
/// values u offset by a power of two (4, 32; IQ4_XS its signed levels + 128,
/// unsigned for VPDPBUSD), taken off as the offset times sum_s sc_s * sum q.
///
/// A tile of TN tokens x RV panels then runs, per sub-block, VPDPBUSD (16
/// rows x 4 values each) into int32 dot products started at zero, one
/// VPMULLD by the sub-block scales and an add; per super-block, VPDPWSSD of
/// the pairs by the activations' sums (of 32: kquant_pair_sums, computed
/// once per product; of 16: xa.sums16) gives the minimums' sum M, or
/// sum_s sc_s * sum q for the offset. The super-block sums are exact in
/// int32 (at most 8 * 32 * 32 * 241 * 127, IQ4_XS's):
///
///     I = sum_s sc_s * sum_{j in s} u_j q_j  (less offset * sum_s sc_s * sum_{j in s} q_j)
///     M = sum_s m_s * sum_{j in s} q_j
///     y = fma(float(I), d * d_x, y);  y = fma(float(M), -(dmin * d_x), y)    super-blocks ascending
///
/// which is the arithmetic of the register-decoding kernel for few tokens
/// (kquant_tile in matmul_kquants_vnni.hpp), so a token gives the same bits
/// alone or in a batch, on any thread count.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/model/detail/matmul_blocks.hpp"
#include "llmkit/model/detail/matmul_kquants_vnni.hpp"
#include "llmkit/model/detail/matmul_q8.hpp"
#include "llmkit/model/detail/matmul_q8_vnni.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// The formats the K-quant GEMM covers: every K-quant and IQ4_XS.
template <class Block>
inline constexpr bool has_kquant_gemm = is_kquant_block<Block>;

/// Runs the GEMM for rows [row_first, row_last) where the arch and format
/// have one and xa holds enough tokens to repay the decoding; false (and
/// nothing written) otherwise, for the caller's own kernel. This fallback
/// has none.
template <class Block>
inline bool int8_gemm_rows(const q8_activations&, const block_weights&, float*, std::size_t, bool, std::size_t,
                           std::size_t, simd::requires_arch<xsimd::generic>) noexcept {
  return false;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

/// Tokens and panels per register tile: 6 x 2 each of the sub-block dot
/// products and the super-block sums (24 registers), plus the weights and
/// scales; two 64-byte weight loads and six 4-byte broadcasts feed 12
/// VPDPBUSD. Set by the register file.
inline constexpr std::size_t kquant_gemm_tile_tokens = 6;
inline constexpr std::size_t kquant_gemm_tile_panels = 2;
/// Products of fewer tokens run kquant_tile, which decodes in registers.
inline constexpr std::size_t kquant_gemm_min_tokens = 4;

/// One panel's record of one super-block (layout in the file comment):
/// 8 sub-blocks (Q4_K, Q5_K, IQ4_XS) or 16, and the minimums as int16
/// pairs, or without minimums the scales again (for the offset).
template <class Block>
struct kquant_record {
  static constexpr bool has_mins =
      std::is_same_v<Block, block_q2_k> || std::is_same_v<Block, block_q4_k> || std::is_same_v<Block, block_q5_k>;
  static constexpr std::size_t sub_blocks =
      std::is_same_v<Block, block_q4_k> || std::is_same_v<Block, block_q5_k> || std::is_same_v<Block, block_iq4_xs> ? 8
                                                                                                                    : 16;
  static constexpr std::size_t groups = 64 / sub_blocks;  ///< groups of 4 values per sub-block
  /// Without minimums the values are u - 2^offset_shift.
  static constexpr int offset_shift =
      std::is_same_v<Block, block_q3_k> ? 2 : std::is_same_v<Block, block_q6_k> ? 5 : has_mins ? 0 : 7;
  static constexpr std::size_t u = 0, sc = 4096, pairs = sc + sub_blocks * 64, n_pairs = sub_blocks / 2,
                               d = pairs + n_pairs * 64, dmin = d + 64, bytes = dmin + 64;
};

/// The per-thread buffers: a strip of panels and the activations' sub-block sums.
struct kquant_gemm_buffer {
  aligned_vector<std::uint8_t> panels;    ///< [panels, units, kquant_record<Block>::bytes]
  aligned_vector<std::int32_t> pair_sums;  ///< [n, units, 4]: sums of sub-blocks 2k, 2k + 1 as int16 pairs
};

/// xa's sub-block sums (of 32 q) as int16 pairs, [n, units, 4].
inline void kquant_pair_sums(const q8_activations& xa, std::int32_t* out) noexcept {
  const std::size_t pairs = xa.in / 64;
  for (std::size_t t = 0; t < xa.n; ++t) {
    const std::int16_t* s16 = xa.sums16.data() + t * xa.stride / 16;
    for (std::size_t k = 0; k < pairs; ++k) {
      const int lo = s16[4 * k] + s16[4 * k + 1], hi = s16[4 * k + 2] + s16[4 * k + 3];
      out[t * pairs + k] = std::int32_t(std::uint32_t(std::uint16_t(lo)) | (std::uint32_t(std::uint16_t(hi)) << 16));
    }
  }
}

/// Q4_K / Q5_K: the 6-bit scales and minimums (k_scale_min's bit layout, 4
/// sub-blocks per dword) and d, dmin of 16 rows' super-blocks at base
/// (rows `offsets` bytes apart, `live` of them) into a record.
inline void kquant_pack_affine_scales(const std::byte* base, __m512i offsets, __mmask16 live, std::uint8_t* rec) noexcept {
  using R = kquant_record<block_q4_k>;
  const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, base, 1);
  const __m512i w0 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, base + 4, 1);
  const __m512i w1 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, base + 8, 1);
  const __m512i w2 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, base + 12, 1);
  const __m512i low6 = _mm512_set1_epi8(0x3F), low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x03);
  const __m512i sc03 = _mm512_and_si512(w0, low6), m03 = _mm512_and_si512(w1, low6);
  const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(w2, low4),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), top2), 4));
  const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), low4),
                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), top2), 4));
  const __m512i byte = _mm512_set1_epi32(0xFF);
#pragma GCC unroll 4
  for (std::size_t s = 0; s < 4; ++s) {
    _mm512_store_si512(rec + R::sc + s * 64, _mm512_and_si512(_mm512_srli_epi32(sc03, int(8 * s)), byte));
    _mm512_store_si512(rec + R::sc + (4 + s) * 64, _mm512_and_si512(_mm512_srli_epi32(sc47, int(8 * s)), byte));
  }
  // Bytes (m0, m1, m2, m3) to the word pairs (m0, m1) and (m2, m3).
  const __m512i pair01 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13, -1));
  const __m512i pair23 = _mm512_broadcast_i32x4(_mm_setr_epi8(2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1, 14, -1, 15, -1));
  _mm512_store_si512(rec + R::pairs + 0 * 64, _mm512_shuffle_epi8(m03, pair01));
  _mm512_store_si512(rec + R::pairs + 1 * 64, _mm512_shuffle_epi8(m03, pair23));
  _mm512_store_si512(rec + R::pairs + 2 * 64, _mm512_shuffle_epi8(m47, pair01));
  _mm512_store_si512(rec + R::pairs + 3 * 64, _mm512_shuffle_epi8(m47, pair23));
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::d), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::dmin),
                  _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
}

/// Q6_K: the 16 signed scales (as int32 lanes and as int16 pairs) and d of
/// 16 rows' super-blocks at base into a record.
inline void kquant_pack_q6_k_scales(const std::byte* base, __m512i offsets, __mmask16 live, std::uint8_t* rec) noexcept {
  using R = kquant_record<block_q6_k>;
  constexpr std::size_t at = offsetof(block_q6_k, scales);
  __m512i sc[16];
#pragma GCC unroll 4
  for (std::size_t k = 0; k < 4; ++k) {
    const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, base + at + 4 * k, 1);
#pragma GCC unroll 4
    for (std::size_t j = 0; j < 4; ++j) sc[4 * k + j] = _mm512_srai_epi32(_mm512_slli_epi32(v, int(24 - 8 * j)), 24);
  }
#pragma GCC unroll 16
  for (std::size_t s = 0; s < 16; ++s) _mm512_store_si512(rec + R::sc + s * 64, sc[s]);
#pragma GCC unroll 8
  for (std::size_t k = 0; k < 8; ++k)
    _mm512_store_si512(rec + R::pairs + k * 64,
                       _mm512_or_si512(_mm512_and_si512(sc[2 * k], _mm512_set1_epi32(0xFFFF)),
                                       _mm512_slli_epi32(sc[2 * k + 1], 16)));
  // d is the block's last 2 bytes: the dword ending there, high half.
  const __m512i dw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets,
                                                 base + offsetof(block_q6_k, d) - 2, 1);
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::d), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dw, 16))));
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::dmin), _mm512_setzero_ps());
}

/// Q2_K, Q3_K, IQ4_XS: the sub-block scales (and Q2_K's minimums) of 16
/// rows' super-blocks at base (rows row_bytes apart, `valid` of them), as
/// the register decoder's int16 words per row, transposed to rows in lanes.
template <class Block>
inline void kquant_pack_word_scales(const std::byte* base, std::size_t row_bytes, std::size_t valid,
                                    std::uint8_t* rec) noexcept {
  using R = kquant_record<Block>;
  __m512i sc[16], pairs[16];  // row b's scales as int32, and its words (two a dword: the pairs)
  alignas(64) float d[16] = {}, dmin[16] = {};
#pragma GCC unroll 16
  for (std::size_t b = 0; b < 16; ++b) {
    sc[b] = pairs[b] = _mm512_setzero_si512();
    if (b >= valid) continue;
    const Block& p = *reinterpret_cast<const Block*>(base + b * row_bytes);
    __m256i words, mins = _mm256_setzero_si256();
    if constexpr (std::is_same_v<Block, block_q2_k>) {
      q2_k_scale_words(p, words, mins);
      dmin[b] = scale_f32(p.dmin);
    } else if constexpr (std::is_same_v<Block, block_q3_k>) {
      words = q3_k_scale_words(p.scales);
    } else {
      words = _mm256_zextsi128_si256(iq4_xs_scale_words(p));
    }
    d[b] = scale_f32(p.d);
    sc[b] = _mm512_cvtepi16_epi32(words);
    pairs[b] = _mm512_zextsi256_si512(R::has_mins ? mins : words);
  }
  transpose_16x16_epi32(sc);
  transpose_16x16_epi32(pairs);
#pragma GCC unroll 16
  for (std::size_t s = 0; s < R::sub_blocks; ++s) _mm512_store_si512(rec + R::sc + s * 64, sc[s]);
#pragma GCC unroll 8
  for (std::size_t k = 0; k < R::n_pairs; ++k) _mm512_store_si512(rec + R::pairs + k * 64, pairs[k]);
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::d), _mm512_load_ps(d));
  _mm512_store_ps(reinterpret_cast<float*>(rec + R::dmin), _mm512_load_ps(dmin));
}

/// Group g of a super-block's values as the record stores them: unsigned,
/// IQ4_XS's levels + 128 (a level's byte with its top bit flipped).
template <class Block>
inline __m512i kquant_record_values(const Block* p, std::size_t g) noexcept {
  if constexpr (std::is_same_v<Block, block_iq4_xs>) {
    const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    const __m512i biased = _mm512_xor_si512(levels, _mm512_set1_epi8(char(0x80)));
    return _mm512_shuffle_epi8(biased, kquant_block<Block>::indices(p, g));
  } else {
    return kquant_block<Block>::values(p, g);
  }
}

/// Decodes W's rows [o, o + valid) (valid <= 16; the others zero) into a
/// panel's records at dst.
template <class Block>
inline void kquant_pack_panel(const block_weights& w, std::size_t o, std::size_t valid, std::uint8_t* dst) noexcept {
  using R = kquant_record<Block>;
  const std::size_t units = w.in / qk_k, row_bytes = w.row_bytes();
  const __mmask16 live = __mmask16((1u << valid) - 1);
  const __m512i offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(int(row_bytes)));
  for (std::size_t i = 0; i < units; ++i) {
    std::uint8_t* rec = dst + i * R::bytes;
    const std::byte* base = w.data + o * row_bytes + i * sizeof(Block);
    if constexpr (std::is_same_v<Block, block_q4_k> || std::is_same_v<Block, block_q5_k>)
      kquant_pack_affine_scales(base, offsets, live, rec);
    else if constexpr (std::is_same_v<Block, block_q6_k>)
      kquant_pack_q6_k_scales(base, offsets, live, rec);
    else
      kquant_pack_word_scales<Block>(base, row_bytes, valid, rec);
    // The values, 64 per row at a time, transposed to dwords with rows in lanes.
    for (std::size_t g = 0; g < 4; ++g) {
      __m512i r[16];
#pragma GCC unroll 16
      for (std::size_t b = 0; b < 16; ++b)
        r[b] = b < valid ? kquant_record_values(reinterpret_cast<const Block*>(w.data + (o + b) * row_bytes) + i, g)
                         : _mm512_setzero_si512();
      transpose_16x16_epi32(r);
#pragma GCC unroll 16
      for (std::size_t k = 0; k < 16; ++k) _mm512_store_si512(rec + R::u + (16 * g + k) * 64, r[k]);
    }
  }
}

/// dot[t][r] = vnni(dot[t][r], w_r, x_t) for tokens t < TN and panels
/// r < RV, where w_r is the 64 bytes at w + r * panel_bytes and x_t the 4
/// bytes at x[t] + at broadcast to every lane: one column group of a tile
/// (VPDPBUSD of values, or VPDPWSSD of minimum pairs).
template <std::size_t TN, std::size_t RV, class X, class Vnni>
[[gnu::always_inline]] inline void kquant_tile_dots(__m512i (&dot)[TN][RV], const std::uint8_t* w, std::size_t panel_bytes,
                                                   const X* const (&x)[TN], std::size_t at, Vnni vnni) noexcept {
  __m512i wv[RV];
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RV; ++r) wv[r] = _mm512_load_si512(w + r * panel_bytes);
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TN; ++t) {
    std::int32_t x4;
    std::memcpy(&x4, x[t] + at, 4);
    const __m512i xv = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RV; ++r) dot[t][r] = vnni(dot[t][r], wv[r], xv);
  }
}

/// One tile: tokens [t0, t0 + TN) x the RV panels at `panels` (stride
/// panel_bytes), output rows [o0, o0 + valid). `pairs` holds each token's
/// int16 pairs of activation sums the record's pairs multiply:
/// kquant_pair_sums for sub-blocks of 32, xa.sums16 for 16.
template <class Block, std::size_t TN, std::size_t RV>
inline void kquant_gemm_tile(const q8_activations& xa, const std::int32_t* pairs, std::size_t pairs_stride,
                             const std::uint8_t* panels, std::size_t panel_bytes, std::size_t t0, float* y,
                             std::size_t y_stride, bool accumulate, std::size_t o0, std::size_t valid) noexcept {
  using R = kquant_record<Block>;
  const std::size_t units = xa.in / qk_k;
  // The f32 sums wait in L1 (two loads and stores per super-block), so the
  // registers hold the tile's int32 dot products and super-block sums.
  alignas(64) float f[TN][RV][16] = {};
  const std::int8_t* x[TN];
  const std::int32_t* ps[TN];
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TN; ++t) {
    x[t] = xa.row(t0 + t);
    ps[t] = pairs + (t0 + t) * pairs_stride;
  }
  for (std::size_t i = 0; i < units; ++i) {
    const std::uint8_t* rec = panels + i * R::bytes;
    __m512i isum[TN][RV], dot[TN][RV];
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TN; ++t)
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) isum[t][r] = _mm512_setzero_si512();
    for (std::size_t s = 0; s < R::sub_blocks; ++s) {
#pragma GCC unroll 8
      for (std::size_t t = 0; t < TN; ++t)
#pragma GCC unroll 4
        for (std::size_t r = 0; r < RV; ++r) dot[t][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (std::size_t g = R::groups * s; g < R::groups * (s + 1); ++g)
        kquant_tile_dots(dot, rec + R::u + g * 64, panel_bytes, x, qk_k * i + 4 * g,
                         [](__m512i acc, __m512i u, __m512i q) { return _mm512_dpbusd_epi32(acc, u, q); });
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) {
        const __m512i sc = _mm512_load_si512(rec + r * panel_bytes + R::sc + s * 64);
#pragma GCC unroll 8
        for (std::size_t t = 0; t < TN; ++t) isum[t][r] = _mm512_add_epi32(isum[t][r], _mm512_mullo_epi32(dot[t][r], sc));
      }
    }
    // The minimums' sum M or the offset's sum_s sc_s * sum q, in the dot registers.
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TN; ++t)
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) dot[t][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (std::size_t k = 0; k < R::n_pairs; ++k)
      kquant_tile_dots(dot, rec + R::pairs + k * 64, panel_bytes, ps, R::n_pairs * i + k,
                       [](__m512i acc, __m512i m, __m512i sums) { return _mm512_dpwssd_epi32(acc, m, sums); });
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TN; ++t) {
      const __m512 dx = _mm512_set1_ps(xa.k_scale(t0 + t, i));
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) {
        const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(rec + r * panel_bytes + R::d));
        if constexpr (R::has_mins) {
          const __m512 dmin = _mm512_load_ps(reinterpret_cast<const float*>(rec + r * panel_bytes + R::dmin));
          __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t][r]), _mm512_mul_ps(d, dx), _mm512_load_ps(f[t][r]));
          v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(dot[t][r]), _mm512_mul_ps(dmin, dx), v);
          _mm512_store_ps(f[t][r], v);
        } else {  // values u - 2^offset_shift
          const __m512i sum = _mm512_sub_epi32(isum[t][r], _mm512_slli_epi32(dot[t][r], R::offset_shift));
          _mm512_store_ps(f[t][r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dx), _mm512_load_ps(f[t][r])));
        }
      }
    }
  }
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RV; ++r) {
    if (16 * r >= valid) break;
    const std::size_t left = valid - 16 * r;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    for (std::size_t t = 0; t < TN; ++t) {
      float* out = y + (t0 + t) * y_stride + o0 + 16 * r;
      __m512 v = _mm512_load_ps(f[t][r]);
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), v);
      _mm512_mask_storeu_ps(out, m, v);
    }
  }
}

/// Every token of xa over the RV panels at `panels` in tiles of
/// kquant_gemm_tile_tokens tokens (the last tile narrower).
template <class Block, std::size_t RV>
inline void kquant_gemm_panels(const q8_activations& xa, const std::int32_t* pairs, std::size_t pairs_stride,
                               const std::uint8_t* panels, std::size_t panel_bytes, float* y, std::size_t y_stride,
                               bool accumulate, std::size_t o0, std::size_t valid) noexcept {
  for_token_tiles<kquant_gemm_tile_tokens>(xa.n, [&]<std::size_t N>(std::size_t t) {
    kquant_gemm_tile<Block, N, RV>(xa, pairs, pairs_stride, panels, panel_bytes, t, y, y_stride, accumulate, o0, valid);
  });
}

/// int8_gemm_rows on AVX-512 VNNI (avx512bw stands for it where the build
/// enables VNNI, as for the other int8 kernels).
template <class Block>
inline bool int8_gemm_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last,
                           simd::requires_arch<xsimd::avx512bw>) noexcept {
  if constexpr (!has_kquant_gemm<Block>) {
    return false;
  } else {
    if (xa.n < kquant_gemm_min_tokens) return false;
    using R = kquant_record<Block>;
    constexpr std::size_t RV = kquant_gemm_tile_panels, P = q8_panel_rows;
    const std::size_t units = w.in / qk_k, panel_bytes = units * R::bytes;
    thread_local kquant_gemm_buffer buf;
    if (buf.panels.size() < RV * panel_bytes) buf.panels.resize(RV * panel_bytes);
    const std::int32_t* pairs;
    std::size_t pairs_stride;
    if constexpr (R::sub_blocks == 8) {
      if (buf.pair_sums.size() < xa.n * units * 4) buf.pair_sums.resize(xa.n * units * 4);
      kquant_pair_sums(xa, buf.pair_sums.data());
      pairs = buf.pair_sums.data();
      pairs_stride = units * 4;
    } else {  // the sums of 16 as they are, two per dword
      pairs = reinterpret_cast<const std::int32_t*>(xa.sums16.data());
      pairs_stride = xa.stride / 32;
    }
    for (std::size_t o = row_first; o < row_last; o += RV * P) {
      const std::size_t rows = std::min(RV * P, row_last - o), panels = (rows + P - 1) / P;
      for (std::size_t p = 0; p < panels; ++p)
        kquant_pack_panel<Block>(w, o + p * P, std::min(P, rows - p * P), buf.panels.data() + p * panel_bytes);
      if (panels == RV) {
        kquant_gemm_panels<Block, RV>(xa, pairs, pairs_stride, buf.panels.data(), panel_bytes, y, y_stride, accumulate,
                                      o, rows);
      } else {
        for (std::size_t p = 0; p < panels; ++p)
          kquant_gemm_panels<Block, 1>(xa, pairs, pairs_stride, buf.panels.data() + p * panel_bytes, panel_bytes, y,
                                       y_stride, accumulate, o + p * P, std::min(P, rows - p * P));
      }
    }
    return true;
  }
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
