// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_kquants_vnni.hpp
/// The K-quants' (Q2_K ... Q6_K) and IQ4_XS's int8-activation products with AVX-512
/// VNNI, the weights decoded in registers as they stream in, at every token
/// count. The activations are quantised per 256-value super-block (ggml's
/// Q8_K, q8_activations::assign_k): one activation scale per super-block
/// lets the sub-block scales stay integers. Q4_K and Q5_K take VPDPBUSD per
/// 64 values and one VPACKSSDW and VPDPWSSD (the scales) per 128, the fewest
/// vector instructions of the one-token product, which is bound by them.
/// With VBMI and GFNI, Q2_K, Q3_K and IQ4_XS have one-token decoders of
/// their own (k_super_block_sums: GF2P8AFFINE crumbs, Q2_K's VPSHUFB table
/// of crumb * scale, VPERMB magnitudes for IQ4_XS) with the same int32 sums.
/// Q6_K (and without VBMI / GFNI the rest), per 64 values: VPMADDUBSW
/// multiplies the unsigned weights by the int8 activations into 16-bit pair
/// sums (at most 2 * 63 * 127, no saturation) and VPDPWSSD multiplies those
/// by their sub-block scales into int32 lanes; per super-block one
/// conversion and one FMA by d * d_x, plus the minimums or Q6_K's and Q3_K's offset
/// (-32 or -4 times sum_s sc_s * sum q, in int32); Q2_K's minimums are per
/// 16 values, so -dmin * d_x * sum_s m_s * sum q in int32 too (VPMADDWD of
/// its 4-bit mins by the activations' sums of 16). IQ4_XS's values are
/// signed levels (-127..113): VPMADDUBSW takes their magnitudes and the
/// activations with the levels' signs (at most 2 * 127 * 127, no
/// saturation), then its 6-bit sub-block scales as Q4_K's. Every format's
/// super-block sums (I = sum_s sc_s * sum u q, less Q3_K's and Q6_K's
/// offset; M = sum_s m_s * sum q) are reduced to exact int32 and added as
/// fma(float(I), d * d_x, y), then fma(float(M), -(dmin * d_x), y): the
/// arithmetic of their prefill GEMM (gemm_kquants_vnni.hpp), which runs
/// them from 4 tokens on. Each output is
/// accumulated in the same order whatever the batch or tile, so the product
/// is batch and thread invariant. Without VNNI the strip kernel (matmul_blocks_q8.hpp)
/// computes the same formula in scalar code.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "llmkit/model/detail/matmul_blocks_q8.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// K-quant formats: products with activations per 256 values (assign_k).
template <class Block>
inline constexpr bool is_kquant_block = std::is_same_v<Block, block_q2_k> || std::is_same_v<Block, block_q3_k> ||
                                        std::is_same_v<Block, block_q4_k> ||
                                        std::is_same_v<Block, block_q5_k> || std::is_same_v<Block, block_q6_k> ||
                                        std::is_same_v<Block, block_iq4_xs>;

/// The K-quants with one signed scale per 16 values (Q3_K, Q6_K) rather
/// than a scale and a minimum per 32.
template <class Block>
inline constexpr bool has_k_scales16 = std::is_same_v<Block, block_q3_k> || std::is_same_v<Block, block_q6_k>;

#if defined(__AVX2__)
/// Q3_K's 16 scales - 32 as int16 words, unpacked in a vector: a scalar
/// loop over the split 6-bit fields costs more than the super-block's
/// products.
inline __m256i q3_k_scale_words(const std::uint8_t (&scales)[12]) noexcept {
  std::uint64_t low;
  std::uint32_t high;
  std::memcpy(&low, scales, 8);
  std::memcpy(&high, scales + 8, 4);
  // Bytes 0-7: low nibbles of scales[0..7] (s 0-7); 8-15: their high nibbles (s 8-15).
  const __m128i l = _mm_cvtsi64_si128(std::int64_t(low));
  const __m128i nibbles = _mm_and_si128(_mm_unpacklo_epi64(l, _mm_srli_epi16(l, 4)), _mm_set1_epi8(0x0F));
  // Byte s: bits 2 (s / 4).. of scales[8 + s % 4] (dword s / 4 is high >> 2 (s / 4)).
  const __m128i h = _mm_setr_epi32(int(high), int(high >> 2), int(high >> 4), int(high >> 6));
  const __m128i top = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi8(0x03)), 4);
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_or_si128(nibbles, top)), _mm256_set1_epi16(32));
}

/// Q2_K's 16 scales and minimums as int16 words, in vectors.
inline void q2_k_scale_words(const block_q2_k& p, __m256i& sc, __m256i& m) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.scales));
  sc = _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
  m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)));
}

/// IQ4_XS's 8 scales - 32 as int16 words (low 128 bits).
inline __m128i iq4_xs_scale_words(const block_iq4_xs& p) noexcept {
#if defined(__BMI2__)
  std::uint32_t low;
  std::memcpy(&low, p.scales_l, 4);
  // Nibble j of scales_l and bits 2j.. of scales_h to byte j.
  const std::uint64_t bytes = _pdep_u64(low, 0x0F0F0F0F0F0F0F0Full) | (_pdep_u64(p.scales_h, 0x0303030303030303ull) << 4);
  return _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(std::int64_t(bytes))), _mm_set1_epi16(32));
#else
  alignas(16) std::int16_t sc[8];
  for (std::size_t j = 0; j < 8; ++j) sc[j] = static_cast<std::int16_t>(int(iq4_xs_scale(p, j)) - 32);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
#endif
}
#endif

/// The magnitudes of kvalues_iq4nl (the levels' signs: index < 8 is negative).
inline constexpr std::int8_t iq4nl_magnitudes[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};

/// A 16-scale K-quant's sub-block scales as int16 words (Q3_K: sc - 32).
template <class Block>
  requires has_k_scales16<Block>
inline void k_scales16(const Block& p, std::int16_t (&out)[16]) noexcept {
  for (std::size_t j = 0; j < 16; ++j) {
    if constexpr (std::is_same_v<Block, block_q6_k>)
      out[j] = p.scales[j];
    else
      out[j] = static_cast<std::int16_t>(int(q3_k_scale(p.scales, j)) - 32);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

#if defined(__GFNI__)
/// VGF2P8AFFINEQB bit matrices (byte 7 - i selects the input bits of output
/// bit i): a byte's low nibble, and its high nibble shifted down.
inline constexpr long long k_gf2_low_4 = 0x0102040800000000;
inline constexpr long long k_gf2_shift_right_4 = 0x1020408000000000;
#endif

/// Group g of a K-quant's 4-bit values: low nibbles of qs[32g..] (values
/// 0-31), then their high nibbles (values 32-63).
inline __m512i k_nibbles(const std::uint8_t* qs, std::size_t g) noexcept {
  const __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * g)));
#if defined(__GFNI__)
  // One GF(2) affine map per byte instead of a shift and a mask: bit matrix
  // x & 0x0F on the low 256 bits, x >> 4 on the high.
  const __m512i split = _mm512_set_epi64(k_gf2_shift_right_4, k_gf2_shift_right_4, k_gf2_shift_right_4,
                                         k_gf2_shift_right_4, k_gf2_low_4, k_gf2_low_4, k_gf2_low_4, k_gf2_low_4);
  return _mm512_gf2p8affine_epi64_epi8(z, split, 0);
#else
  return _mm512_and_si512(_mm512_mask_srli_epi16(z, __mmask32(0xFFFF0000u), z, 4), _mm512_set1_epi8(0x0F));
#endif
}

/// Group g of Q2_K's / Q3_K's 2-bit crumbs (values 0-31: bits 2r.. of
/// qs[32h + l], values 32-63: bits 2r + 2.., h = g / 2, r = 2 (g % 2)).
inline __m512i k_crumbs(const std::uint8_t* qs, std::size_t g) noexcept {
  const std::size_t h = g / 2, r = 2 * (g % 2);
  const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * h)));
#if defined(__AVX512VBMI__)
  // One VPMULTISHIFTQB: byte j of each qword takes the 8 bits from bit 8j + 2r (+ 2 in the high half).
  const __m512i at = _mm512_add_epi8(_mm512_set1_epi64(0x3830282018100800),
                                     _mm512_mask_blend_epi8(__mmask64(0xFFFFFFFF00000000ull), _mm512_set1_epi8(char(2 * r)),
                                                            _mm512_set1_epi8(char(2 * r + 2))));
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(at, q), _mm512_set1_epi8(0x03));
#else
  __m512i c = _mm512_srl_epi16(q, _mm_cvtsi32_si128(int(2 * r)));
  c = _mm512_mask_srli_epi16(c, __mmask32(0xFFFF0000u), c, 2);
  return _mm512_and_si512(c, _mm512_set1_epi8(0x03));
#endif
}

/// A super-block's scales for the ON rows of a tile: `sc` the sub-block
/// scales as int16 words (Q6_K: row b's 16 in sc[b]; Q4_K / Q5_K: every
/// row's 8 in sc[0], row b's from word 8b), `d[b]` row b's super-block
/// scale.
template <std::size_t ON>
struct k_tile_scales {
  __m512i sc[ON];
  float d[ON];
  __m256i min_words[ON];  ///< Q2_K: row b's 16 minimums as int16 words
  float dmin[ON];         ///< Q2_K: row b's dmin
  __m512i mins4;          ///< Q4_K / Q5_K: row b's 8 minimums as int16 words in 128-bit lane b
  __m128 d4, dmin4;       ///< Q4_K / Q5_K: row b's d and dmin in lane b
};

/// K-quant register decoders: `scales<ON>(rows, i)` (super-block i of each
/// row), `values(p, g)` (group g's unsigned values in natural order) and,
/// but for Q4_K / Q5_K (k_affine_pair_scales), `group_scales(sc, b, g)` (the
/// scale of each of group g's 32 VPMADDUBSW pair sums of row b, as int16 words).
template <class Block>
struct kquant_block;

/// Word w of group g (values 2w, 2w + 1) gets sub-block 4g + w / 8 of a
/// 16-scale K-quant's scale words sc.
inline __m512i k_scales16_group(__m512i sc, std::size_t g) noexcept {
  const __m512i pick = _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                                         0x0002000200020002, 0x0001000100010001, 0x0001000100010001,
                                                         0, 0),
                                        _mm512_set1_epi16(short(4 * g)));
  return _mm512_permutexvar_epi16(pick, sc);
}

/// Q4_K / Q5_K: super-block i's scales of ON (<= 4) rows at once. Row b's
/// 16-byte head (d, dmin, then the 6-bit scales and mins in the bit layout
/// of k_scale_min) goes to 128-bit lane b, where one pass of shuffles,
/// shifts and masks unpacks every row's scales and mins: a fraction of the
/// instructions of a scalar unpacking per row.
template <std::size_t ON, class Block>
inline k_tile_scales<ON> k_affine_scales(const Block* const (&rows)[ON], std::size_t i) noexcept {
  static_assert(ON <= 4, "k_affine_scales: one 128-bit lane per row");
  __m512i head = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b)
    head = _mm512_mask_broadcast_i32x4(head, __mmask16(0xFu << (4 * b)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[b] + i)));
  // With w0, w1, w2 the head's dwords 1-3: scales 0-3 = w0 & 0x3F, scales
  // 4-7 = (w2 & 0x0F) | (w0 >> 6) << 4, mins 0-3 = w1 & 0x3F, mins 4-7 =
  // (w2 >> 4 & 0x0F) | (w1 >> 6) << 4, as dwords 0-3 of each lane.
  const __m512i w_low = _mm512_shuffle_epi8(  // w0, w2, w1, w2
      head, _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
  constexpr char zero = char(0x80);  // a shuffle index that clears the byte
  const __m512i w_top = _mm512_shuffle_epi8(  // 0, w0, 0, w1
      head,
      _mm512_broadcast_i32x4(_mm_setr_epi8(zero, zero, zero, zero, 4, 5, 6, 7, zero, zero, zero, zero, 8, 9, 10, 11)));
  const __m512i low_bits = _mm512_broadcast_i32x4(_mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m512i shifts = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0, 0, 4));
  const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(w_low, shifts), low_bits);
  // low | (w_top >> 2 & 0x30): each byte's bits 6-7 to bits 4-5.
  const __m512i unpacked = _mm512_ternarylogic_epi32(low, _mm512_srli_epi32(w_top, 2), _mm512_set1_epi8(0x30), 0xF8);
  // Lane b holds row b's 8 scales then its 8 mins: every row's scales to
  // the low 256 bits, the mins to the high.
  const __m512i by_kind = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), unpacked);
  k_tile_scales<ON> out;
  out.sc[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(by_kind));
  // Every row's d and dmin (the head's dword 0) as f32: d_b at 2b, dmin_b at 2b + 1.
  const __m512i d_dmin =
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), head);
  const __m512 scale = _mm512_cvtph_ps(_mm512_castsi512_si256(d_dmin));
  alignas(64) float scale_f[16];
  _mm512_store_ps(scale_f, scale);
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b) out.d[b] = scale_f[2 * b];
  // Row b's 8 mins are 64-bit element b of the high half.
  out.mins4 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(by_kind, 1));
  const __m512 d_then_dmin = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 0, 0, 0, 0, 0, 0, 0, 0), scale);
  out.d4 = _mm512_castps512_ps128(d_then_dmin);
  out.dmin4 = _mm256_extractf128_ps(_mm512_castps512_ps256(d_then_dmin), 1);
  return out;
}

/// The scales of a Q4_K / Q5_K row's sub-blocks 4h..4h + 3 for the VPACKSSDW
/// of two groups' VPDPBUSD sums (groups 2h, 2h + 1): in 128-bit lanes 0-1,
/// words 0-3 get sub-block 4h (group 2h's values 0-31), words 4-7 sub-block
/// 4h + 2; in lanes 2-3, sub-blocks 4h + 1 and 4h + 3 (values 32-63).
template <std::size_t ON>
inline __m512i k_affine_pair_scales(const k_tile_scales<ON>& sc, std::size_t b, std::size_t h) noexcept {
  const __m512i pick = _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003, 0x0001000100010001, 0x0003000300030003,
                                                         0x0001000100010001, 0x0002000200020002, 0, 0x0002000200020002, 0),
                                        _mm512_set1_epi16(short(8 * b + 4 * h)));
  return _mm512_permutexvar_epi16(pick, sc.sc[0]);
}

/// Q4_K and Q5_K: affine sub-blocks (scale and minimum each), 4-bit values
/// plus, in Q5_K, a fifth bit from qh.
template <class Block>
  requires(std::is_same_v<Block, block_q4_k> || std::is_same_v<Block, block_q5_k>)
struct kquant_block<Block> {
  static constexpr bool has_mins = true;
  static constexpr bool signed_values = false;
  static constexpr int offset = 0;
  static constexpr bool mins16 = false;
  template <std::size_t ON>
  static k_tile_scales<ON> scales(const Block* const (&rows)[ON], std::size_t i) noexcept {
    return k_affine_scales(rows, i);
  }
  static __m512i values(const Block* p, std::size_t g) noexcept {
    if constexpr (std::is_same_v<Block, block_q5_k>) {
      // Fifth bits: bit 2g of qh[l] for values 0-31, bit 2g + 1 for 32-63.
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p->qh)));
      __m512i t = _mm512_srl_epi16(h, _mm_cvtsi32_si128(int(2 * g)));
      t = _mm512_mask_srli_epi16(t, __mmask32(0xFFFF0000u), t, 1);
      const __m512i fifth = _mm512_and_si512(_mm512_slli_epi16(t, 4), _mm512_set1_epi8(0x10));
      return _mm512_or_si512(k_nibbles(p->qs, g), fifth);
    } else {
      return k_nibbles(p->qs, g);
    }
  }
};

template <>
struct kquant_block<block_q6_k> {
  static constexpr bool has_mins = false;
  static constexpr bool signed_values = false;
  static constexpr int offset = 32;
  static constexpr bool mins16 = false;
  template <std::size_t ON>
  static k_tile_scales<ON> scales(const block_q6_k* const (&rows)[ON], std::size_t i) noexcept {
    k_tile_scales<ON> out;
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) {
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[b][i].scales));
      out.sc[b] = _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(sc));
      out.d[b] = scale_f32(rows[b][i].d);
    }
    return out;
  }
  static __m512i values(const block_q6_k* p, std::size_t g) noexcept {
    // Half h = g / 2; even g: low nibbles of ql[64h..] with qh bits 0-1
    // (values 0-31) and 2-3 (32-63); odd g: high nibbles with bits 4-5, 6-7.
    const std::size_t h = g / 2, odd = g % 2;
    __m512i lo = _mm512_loadu_si512(p->ql + 64 * h);
    if (odd) lo = _mm512_srli_epi16(lo, 4);
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p->qh + 32 * h)));
    __m512i t = _mm512_srl_epi16(q, _mm_cvtsi32_si128(int(4 * odd)));
    t = _mm512_mask_srli_epi16(t, __mmask32(0xFFFF0000u), t, 2);
    const __m512i high = _mm512_slli_epi16(_mm512_and_si512(t, _mm512_set1_epi8(0x03)), 4);
    // (lo & 0x0F) | high in one ternary-logic instruction: (A & C) | B.
    return _mm512_ternarylogic_epi32(lo, high, _mm512_set1_epi8(0x0F), 0xEC);
  }
  template <std::size_t ON>
  static __m512i group_scales(const k_tile_scales<ON>& sc, std::size_t b, std::size_t g) noexcept {
    return k_scales16_group(sc.sc[b], g);
  }
};

/// Q3_K: values u = crumb + 4 * hmask bit (0..7, offset 4), 16 scales sc - 32.
template <>
struct kquant_block<block_q3_k> {
  static constexpr bool has_mins = false;
  static constexpr bool signed_values = false;
  static constexpr int offset = 4;
  static constexpr bool mins16 = false;
  template <std::size_t ON>
  static k_tile_scales<ON> scales(const block_q3_k* const (&rows)[ON], std::size_t i) noexcept {
    k_tile_scales<ON> out;
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) {
      out.sc[b] = _mm512_zextsi256_si512(q3_k_scale_words(rows[b][i].scales));
      out.d[b] = scale_f32(rows[b][i].d);
    }
    return out;
  }
  static __m512i values(const block_q3_k* p, std::size_t g) noexcept {
    // Group g is half h = g / 2, crumb rows r = 2 (g % 2) (values 0-31) and
    // r + 1 (32-63): the crumbs plus 4 where bit 4h + r (4h + r + 1) of hmask[l] is set.
    const std::size_t h = g / 2, r = 2 * (g % 2);
    const __m512i m = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p->hmask)));
    const __m512i bit = _mm512_mask_blend_epi8(__mmask64(0xFFFFFFFF00000000ull), _mm512_set1_epi8(char(1u << (4 * h + r))),
                                               _mm512_set1_epi8(char(1u << (4 * h + r + 1))));
    const __m512i c = k_crumbs(p->qs, g);
    return _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(m, bit), c, _mm512_set1_epi8(4));
  }
  template <std::size_t ON>
  static __m512i group_scales(const k_tile_scales<ON>& sc, std::size_t b, std::size_t g) noexcept {
    return k_scales16_group(sc.sc[b], g);
  }
};

/// Q2_K: crumbs (0..3) with 16 4-bit scales; its 16 4-bit minimums go
/// through mins16 (tile_scales' min_words and dmin).
template <>
struct kquant_block<block_q2_k> {
  static constexpr bool has_mins = false;
  static constexpr bool signed_values = false;
  static constexpr int offset = 0;
  static constexpr bool mins16 = true;
  template <std::size_t ON>
  static k_tile_scales<ON> scales(const block_q2_k* const (&rows)[ON], std::size_t i) noexcept {
    k_tile_scales<ON> out;
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) {
      __m256i sc;
      q2_k_scale_words(rows[b][i], sc, out.min_words[b]);
      out.sc[b] = _mm512_zextsi256_si512(sc);
      out.d[b] = scale_f32(rows[b][i].d);
      out.dmin[b] = scale_f32(rows[b][i].dmin);
    }
    return out;
  }
  static __m512i values(const block_q2_k* p, std::size_t g) noexcept { return k_crumbs(p->qs, g); }
  template <std::size_t ON>
  static __m512i group_scales(const k_tile_scales<ON>& sc, std::size_t b, std::size_t g) noexcept {
    return k_scales16_group(sc.sc[b], g);
  }
};

/// IQ4_XS: 8 sub-blocks of 32 with scales ls - 32; `values` gives the
/// levels' magnitudes and sets `negative` where a level is below zero.
template <>
struct kquant_block<block_iq4_xs> {
  static constexpr bool has_mins = false;
  static constexpr bool signed_values = true;
  static constexpr int offset = 0;
  static constexpr bool mins16 = false;
  template <std::size_t ON>
  static k_tile_scales<ON> scales(const block_iq4_xs* const (&rows)[ON], std::size_t i) noexcept {
    k_tile_scales<ON> out;
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) {
      out.sc[b] = _mm512_zextsi128_si512(iq4_xs_scale_words(rows[b][i]));
      out.d[b] = scale_f32(rows[b][i].d);
    }
    return out;
  }
  /// Group g's 4-bit level indices in natural order.
  static __m512i indices(const block_iq4_xs* p, std::size_t g) noexcept {
    // Group g is sub-blocks 2g and 2g + 1: qs[32g..] and qs[32g + 16..], each
    // low nibbles then high; k_nibbles gives both low halves first.
    const __m512i split = k_nibbles(p->qs, g);
    return _mm512_shuffle_i64x2(split, split, _MM_SHUFFLE(3, 1, 2, 0));
  }
  static __m512i values(const block_iq4_xs* p, std::size_t g, __mmask64& negative) noexcept {
    const __m512i index = indices(p, g);
    negative = _mm512_cmplt_epu8_mask(index, _mm512_set1_epi8(8));
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4nl_magnitudes)));
    return _mm512_shuffle_epi8(table, index);
  }
  template <std::size_t ON>
  static __m512i group_scales(const k_tile_scales<ON>& sc, std::size_t b, std::size_t g) noexcept {
    // Words 0-15 (values 0-31) get sub-block 2g, words 16-31 sub-block 2g + 1.
    const __m512i pick = _mm512_add_epi16(_mm512_set_epi64(0x0001000100010001, 0x0001000100010001, 0x0001000100010001,
                                                           0x0001000100010001, 0, 0, 0, 0),
                                          _mm512_set1_epi16(short(2 * g)));
    return _mm512_permutexvar_epi16(pick, sc.sc[b]);
  }
};

/// The exact int32 sums of ON (<= 4) vectors in lanes 0..ON-1, through one
/// transposing tree for all (a fraction of ON separate reductions).
template <std::size_t ON>
inline __m128i k_row_sums(const __m512i (&v)[ON]) noexcept {
  __m512i p[4];
#pragma GCC unroll 4
  for (std::size_t b = 0; b < 4; ++b) p[b] = b < ON ? v[b] : _mm512_setzero_si512();
  // Per 128-bit lane: [p0 p1 p0 p1] and [p2 p3 p2 p3] partial sums, then [p0 p1 p2 p3].
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/// v[0..ON) in lanes 0..ON-1 of a vector, the others zero.
template <std::size_t ON>
inline __m128 k_lanes(const float (&v)[ON]) noexcept {
  constexpr auto at = [](std::size_t b) { return b < ON ? b : ON - 1; };
  return _mm_setr_ps(v[0], ON > 1 ? v[at(1)] : 0.0f, ON > 2 ? v[at(2)] : 0.0f, ON > 3 ? v[at(3)] : 0.0f);
}

#if defined(__AVX512VBMI__) && defined(__GFNI__)
/// The exact int32 super-block sums of ON (<= 4) rows for TN tokens, row b
/// in lane b: `sum` I (less Q3_K's offset), `mins` Q2_K's M; the rows' d
/// and dmin as f32 in the same lanes.
template <std::size_t TN>
struct k_super_sums {
  __m128i sum[TN];
  __m128i mins[TN];
  __m128 d, dmin;
};

/// f(integral_constant<0>) ... f(integral_constant<N - 1>): group indices that
/// must be immediates (GF2P8AFFINE's constant).
template <std::size_t N, class Fn>
inline void k_for_groups(Fn&& fn) {
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    (fn(std::integral_constant<std::size_t, G>{}), ...);
  }(std::make_index_sequence<N>{});
}

/// A VGF2P8AFFINEQB bit matrix (one qword) moving input bit `from` to output bit `to`.
constexpr long long k_gf2_bit(int from, int to) noexcept {
  return static_cast<long long>(std::uint64_t(1u << from) << (8 * (7 - to)));
}

/// The matrices of group g's crumbs from a broadcast half of qs (k_crumbs'
/// layout): bits 2r, 2r + 1 (r = 2 (g % 2)) to bits 0-1 in the low 256 bits,
/// bits 2r + 2, 2r + 3 in the high.
inline __m512i k_crumb_matrix(std::size_t g) noexcept {
  const int r = 2 * int(g % 2);
  const long long lo = k_gf2_bit(2 * r, 0) | k_gf2_bit(2 * r + 1, 1);
  const long long hi = k_gf2_bit(2 * r + 2, 0) | k_gf2_bit(2 * r + 3, 1);
  return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);
}

/// Lanes 0..ON-1 of four rows' 16-byte loads at byte `at` of super-block i, in 128-bit lane b.
template <std::size_t ON, class Block>
inline __m512i k_row_heads(const Block* const (&rows)[ON], std::size_t i, std::size_t at) noexcept {
  __m512i head = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b)
    head = _mm512_mask_broadcast_i32x4(
        head, __mmask16(0xFu << (4 * b)),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint8_t*>(rows[b] + i) + at)));
  return head;
}

/// The 16 activation sums of 16 of token t's super-block i.
inline __m256i k_sums16(const q8_activations& xa, std::size_t t, std::size_t i) noexcept {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * xa.stride + qk_k * i) / 16));
}

/// Q2_K, one to three tokens: VPSHUFB of a crumb (made crumb + 4g by
/// GF2P8AFFINE's constant) in a per-row table of crumb * scale (<= 45, as
/// 128-bit lane L of group g is sub-block 4g + L) feeds VPDPBUSD the scaled
/// values: per row and super-block 4 x (GF2P8AFFINE, VPSHUFB, VPDPBUSD) and
/// the table (VPERMB, VPMULLW); the 4 rows' minimums in 2 VPMADDWD and one tree.
template <std::size_t TN, std::size_t ON>
[[gnu::always_inline]] inline k_super_sums<TN> q2_k_super_sums(const block_q2_k* const (&rows)[ON], std::size_t i, const q8_activations& xa,
                                        std::size_t t0) noexcept {
  const __m512i head = k_row_heads(rows, i, offsetof(block_q2_k, scales));
  const __m512i sc = _mm512_and_si512(head, _mm512_set1_epi8(0x0F));
  const __m512i mins = _mm512_gf2p8affine_epi64_epi8(head, _mm512_set1_epi64(k_gf2_shift_right_4), 0);
  k_super_sums<TN> out;
  {  // d_b, dmin_b as halves 2b, 2b + 1
    std::uint32_t dd[4] = {};
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) std::memcpy(&dd[b], &rows[b][i].d, 4);
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32(int(dd[0]), int(dd[1]), int(dd[2]), int(dd[3])));
    const __m256 split = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), f);
    out.d = _mm256_castps256_ps128(split);
    out.dmin = _mm256_extractf128_ps(split, 1);
  }
  __m512i iacc[TN][ON];
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b) {
    // Lane L, byte 4g + c of row b's table: c * scale 4g + L, from words (s, s) * (0x0100, 0x0302).
    const __m512i pick = _mm512_add_epi8(
        _mm512_set_epi32(0x0F0F0F0F, 0x0B0B0B0B, 0x07070707, 0x03030303, 0x0E0E0E0E, 0x0A0A0A0A, 0x06060606, 0x02020202,
                         0x0D0D0D0D, 0x09090909, 0x05050505, 0x01010101, 0x0C0C0C0C, 0x08080808, 0x04040404, 0),
        _mm512_set1_epi8(char(16 * b)));
    const __m512i table = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(__mmask64(0x5555555555555555ull), pick, sc),
                                             _mm512_set1_epi32(0x03020100));
    const std::uint8_t* qs = rows[b][i].qs;
    const __m512i q[2] = {_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs))),
                          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32)))};
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) iacc[a][b] = _mm512_setzero_si512();
    k_for_groups<4>([&](auto group) {
      constexpr std::size_t g = decltype(group)::value;
      const __m512i index = _mm512_gf2p8affine_epi64_epi8(q[g / 2], k_crumb_matrix(g), int(4 * g));
      const __m512i u = _mm512_shuffle_epi8(table, index);
#pragma GCC unroll 16
      for (std::size_t a = 0; a < TN; ++a)
        iacc[a][b] = _mm512_dpbusd_epi32(iacc[a][b], u, _mm512_load_si512(xa.row(t0 + a) + qk_k * i + 64 * g));
    });
  }
  // M: rows 0-1's minimums as words times the sums of 16 (broadcast), rows 2-3's,
  // then one tree: row b's 8 dwords to lane b.
  const __m512i m01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(mins));
  const __m512i m23 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(mins, 1));
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) {
    out.sum[a] = k_row_sums(iacc[a]);
    const __m512i s16 = _mm512_broadcast_i64x4(k_sums16(xa, t0 + a, i));
    const __m512i p01 = _mm512_madd_epi16(m01, s16);
    const __m512i p23 = ON > 2 ? _mm512_madd_epi16(m23, s16) : _mm512_setzero_si512();
    // Per 128-bit lane: [p01, p23, p01, p23] partial sums, then the lane's totals in dwords 0-1.
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi32(p01, p23), _mm512_unpackhi_epi32(p01, p23));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_ENUM(0x4E)));
    // Lanes 0-1 are rows 0 (dword 0) and 2 (dword 1), lanes 2-3 rows 1 and 3.
    s = _mm512_add_epi32(s, _mm512_shuffle_i64x2(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    out.mins[a] = _mm512_castsi512_si128(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
  }
  return out;
}

/// Q3_K, one to three tokens: per row and super-block 4 x (GF2P8AFFINE of
/// the crumbs, of the high bits, VPOR, VPDPBUSD) (sums of 4 at most
/// 4 * 7 * 127), 2 x (VPACKSSDW, VPERMW, VPDPWSSD) for the scales and one
/// VPDPWSSD for the offset (-4 * sum_s sc_s * sum q); the 4 rows' 6-bit
/// scales unpacked together.
template <std::size_t TN, std::size_t ON>
[[gnu::always_inline]] inline k_super_sums<TN> q3_k_super_sums(const block_q3_k* const (&rows)[ON], std::size_t i, const q8_activations& xa,
                                        std::size_t t0) noexcept {
  static_assert(offsetof(block_q3_k, scales) + 14 == sizeof(block_q3_k), "q3_k_super_sums: the 16 bytes end at d");
  // Lane b: row b's last 16 bytes (2 of qs, the 12 scale bytes, d).
  const __m512i head = k_row_heads(rows, i, offsetof(block_q3_k, scales) - 2);
  // Low 4 bits: bytes 0-7 scales[0..7] & 0x0F (s 0-7), 8-15 scales[0..7] >> 4 (s 8-15).
  const __m512i low8 = _mm512_shuffle_epi8(
      head, _mm512_broadcast_i32x4(_mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9)));
  const __m512i low = _mm512_gf2p8affine_epi64_epi8(
      low8,
      _mm512_set_epi64(k_gf2_shift_right_4, k_gf2_low_4, k_gf2_shift_right_4, k_gf2_low_4, k_gf2_shift_right_4,
                       k_gf2_low_4, k_gf2_shift_right_4, k_gf2_low_4),
      0);
  // High 2 bits of s: bits 2 (s / 4).. of scales[8 + s % 4], each qword holding
  // scales[8..11]; one VPMULTISHIFTQB puts them at bits 4-5.
  const __m512i high8 = _mm512_shuffle_epi8(
      head, _mm512_broadcast_i32x4(_mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13)));
  const __m512i at = _mm512_broadcast_i32x4(_mm_setr_epi8(60, 4, 12, 20, 62, 6, 14, 22, 0, 8, 16, 24, 2, 10, 18, 26));
  const __m512i high = _mm512_multishift_epi64_epi8(at, high8);
  const __m512i sc = _mm512_sub_epi8(_mm512_ternarylogic_epi32(low, high, _mm512_set1_epi8(0x30), 0xF8),
                                     _mm512_set1_epi8(32));
  const __m512i words[2] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc)),  // rows 0-1, row 1 from word 16
                            _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc, 1))};
  k_super_sums<TN> out;
  out.d = _mm_cvtph_ps(_mm512_castsi512_si128(
      _mm512_permutexvar_epi16(_mm512_zextsi128_si512(_mm_setr_epi16(7, 15, 23, 31, 0, 0, 0, 0)), head)));
  out.dmin = _mm_setzero_ps();
  // The offset's -4 * sums of 16 as words, against row 0's scale words (low 256 bits) or row 1's (high).
  __m512i offset_sums[TN][2];
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) {
    const __m256i s = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(k_sums16(xa, t0 + a, i), 2));
    offset_sums[a][0] = _mm512_zextsi256_si512(s);
    offset_sums[a][1] = _mm512_inserti64x4(_mm512_setzero_si512(), s, 1);
  }
  __m512i iacc[TN][ON];
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b) {
    const block_q3_k& p = rows[b][i];
    const __m512i q[2] = {_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs))),
                          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs + 32)))};
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.hmask)));
    __m512i d[TN][4];
    k_for_groups<4>([&](auto group) {
      constexpr std::size_t g = decltype(group)::value;
      // Values 0-31 of group g take bit 4h + r of hmask[l], 32-63 bit 4h + r + 1, as 4 (bit 2).
      constexpr int h = int(g / 2), r = 2 * int(g % 2);
      const __m512i to_bit2 = _mm512_set_epi64(k_gf2_bit(4 * h + r + 1, 2), k_gf2_bit(4 * h + r + 1, 2),
                                               k_gf2_bit(4 * h + r + 1, 2), k_gf2_bit(4 * h + r + 1, 2),
                                               k_gf2_bit(4 * h + r, 2), k_gf2_bit(4 * h + r, 2),
                                               k_gf2_bit(4 * h + r, 2), k_gf2_bit(4 * h + r, 2));
      const __m512i u = _mm512_or_si512(_mm512_gf2p8affine_epi64_epi8(q[h], k_crumb_matrix(g), 0),
                                        _mm512_gf2p8affine_epi64_epi8(hm, to_bit2, 0));
#pragma GCC unroll 16
      for (std::size_t a = 0; a < TN; ++a)
        d[a][g] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_load_si512(xa.row(t0 + a) + qk_k * i + 64 * g));
    });
    // Lane L of group g is sub-block 4g + L: VPACKSSDW of groups 2k, 2k + 1
    // puts sub-blocks 8k + L (words 0-3) and 8k + 4 + L (words 4-7) in lane L.
    const __m512i base = _mm512_add_epi16(_mm512_set_epi64(0x0007000700070007, 0x0003000300030003, 0x0006000600060006,
                                                            0x0002000200020002, 0x0005000500050005, 0x0001000100010001,
                                                            0x0004000400040004, 0),
                                           _mm512_set1_epi16(short(16 * (b % 2))));
    const __m512i s01 = _mm512_permutexvar_epi16(base, words[b / 2]);
    const __m512i s23 = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(8)), words[b / 2]);
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) {
      __m512i v = _mm512_dpwssd_epi32(_mm512_setzero_si512(), words[b / 2], offset_sums[a][b % 2]);
      v = _mm512_dpwssd_epi32(v, _mm512_packs_epi32(d[a][0], d[a][1]), s01);
      iacc[a][b] = _mm512_dpwssd_epi32(v, _mm512_packs_epi32(d[a][2], d[a][3]), s23);
    }
  }
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) {
    out.sum[a] = k_row_sums(iacc[a]);
    out.mins[a] = _mm_setzero_si128();
  }
  return out;
}

/// IQ4_XS's level magnitudes by VPERMB index: a byte's low nibble (bits 4-5
/// ignored), and bits 2-7 of a byte shifted right by 2 (its high nibble).
alignas(64) inline constexpr std::uint8_t iq4_xs_magnitude_low[64] = {
    127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113, 127, 104, 83, 65, 49, 35,
    22,  10,  1,  13, 25, 38, 53, 69, 89, 113, 127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38,
    53,  69,  89, 113, 127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};
alignas(64) inline constexpr std::uint8_t iq4_xs_magnitude_high[64] = {
    127, 127, 127, 127, 104, 104, 104, 104, 83, 83, 83, 83, 65, 65, 65, 65, 49, 49, 49, 49, 35, 35,
    35,  35,  22,  22,  22,  22,  10,  10,  10,  10,  1,  1,  1,  1,  13, 13, 13, 13, 25, 25, 25, 25,
    38,  38,  38,  38,  53,  53,  53,  53,  69,  69,  69,  69, 89, 89, 89, 89, 113, 113, 113, 113};

/// IQ4_XS, one to three tokens: per 128 values of a row, one 64-byte load of
/// qs and VPERMB (2) of the levels' magnitudes with the bytes as indices,
/// their signs as masks (VPTESTMB, VPMOVB2M) choosing q or -q (2 VPBLENDMB
/// per token), then VPMADDUBSW and VPDPWSSD (2 each) by one VPERMW of the
/// scales (128-bit lane L is sub-block 4h + L in both halves of the bytes);
/// the activations reordered once per token to match.
template <std::size_t TN, std::size_t ON>
[[gnu::always_inline]] inline k_super_sums<TN> iq4_xs_super_sums(const block_iq4_xs* const (&rows)[ON], std::size_t i,
                                          const q8_activations& xa, std::size_t t0) noexcept {
  static_assert(offsetof(block_iq4_xs, qs) == 8, "iq4_xs_super_sums: d, scales_h, scales_l in one qword");
  std::uint64_t head[4] = {};
#pragma GCC unroll 4
  for (std::size_t b = 0; b < ON; ++b) std::memcpy(&head[b], &rows[b][i], 8);
  const __m256i h = _mm256_setr_epi64x(std::int64_t(head[0]), std::int64_t(head[1]), std::int64_t(head[2]),
                                       std::int64_t(head[3]));
  // Scale s: nibble s of scales_l (bits 32 + 4s) and bits 16 + 2s of scales_h to bits 4-5.
  const __m256i low = _mm256_multishift_epi64_epi8(
_mm256_set1_epi64x(0x3C3834302C282420), h);
  const __m256i top = _mm256_and_si256(_mm256_multishift_epi64_epi8(_mm256_set1_epi64x(0x1A18161412100E0C), h),
                                       _mm256_set1_epi8(0x30));
  const __m256i ls = _mm256_ternarylogic_epi32(low, top, _mm256_set1_epi8(0x0F), 0xEC);
  const __m512i words = _mm512_cvtepi8_epi16(_mm256_sub_epi8(ls, _mm256_set1_epi8(32)));  // row b from word 8b
  k_super_sums<TN> out;
  out.d = _mm_cvtph_ps(_mm256_cvtepi64_epi16(h));
  out.dmin = _mm_setzero_ps();
  const __m512i mag_low = _mm512_load_si512(iq4_xs_magnitude_low), mag_high = _mm512_load_si512(iq4_xs_magnitude_high);
  __m512i iacc[TN][ON];
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a)
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) iacc[a][b] = _mm512_setzero_si512();
#pragma GCC unroll 2
  for (std::size_t half = 0; half < 2; ++half) {
    // Lane L of the low nibbles: values 128 half + 32L + 0..15; of the high: + 16..31.
    __m512i x_low[TN], x_high[TN], neg_low[TN], neg_high[TN];
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) {
      const std::int8_t* x = xa.row(t0 + a) + qk_k * i + 128 * half;
      const __m512i x0 = _mm512_load_si512(x), x1 = _mm512_load_si512(x + 64);
      x_low[a] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
      x_high[a] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
      neg_low[a] = _mm512_sub_epi8(_mm512_setzero_si512(), x_low[a]);
      neg_high[a] = _mm512_sub_epi8(_mm512_setzero_si512(), x_high[a]);
    }
#pragma GCC unroll 4
    for (std::size_t b = 0; b < ON; ++b) {
      const __m512i q = _mm512_loadu_si512(rows[b][i].qs + 64 * half);
      const __m512i m_low = _mm512_permutexvar_epi8(q, mag_low);
      const __m512i m_high = _mm512_permutexvar_epi8(_mm512_srli_epi16(q, 2), mag_high);
      // A level is non-negative where its nibble's bit 3 is set.
      const __mmask64 pos_low = _mm512_test_epi8_mask(q, _mm512_set1_epi8(0x08));
      const __mmask64 pos_high = _mm512_movepi8_mask(q);
      // Every word of lane L: scale 4 half + L of row b.
      const __m512i pick = _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                                             0x0002000200020002, 0x0001000100010001, 0x0001000100010001,
                                                             0, 0),
                                            _mm512_set1_epi16(short(8 * b + 4 * half)));
      const __m512i sw = _mm512_permutexvar_epi16(pick, words);
#pragma GCC unroll 16
      for (std::size_t a = 0; a < TN; ++a) {
        iacc[a][b] = _mm512_dpwssd_epi32(
            iacc[a][b], _mm512_maddubs_epi16(m_low, _mm512_mask_blend_epi8(pos_low, neg_low[a], x_low[a])), sw);
        iacc[a][b] = _mm512_dpwssd_epi32(
            iacc[a][b], _mm512_maddubs_epi16(m_high, _mm512_mask_blend_epi8(pos_high, neg_high[a], x_high[a])), sw);
      }
    }
  }
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) {
    out.sum[a] = k_row_sums(iacc[a]);
    out.mins[a] = _mm_setzero_si128();
  }
  return out;
}

/// The formats with a one-to-three-token decoder above.
template <class Block>
inline constexpr bool has_k_super_sums =
    std::is_same_v<Block, block_q2_k> || std::is_same_v<Block, block_q3_k> || std::is_same_v<Block, block_iq4_xs>;

template <std::size_t TN, std::size_t ON, class Block>
[[gnu::always_inline]] inline k_super_sums<TN> k_super_block_sums(const Block* const (&rows)[ON], std::size_t i, const q8_activations& xa,
                                           std::size_t t0) noexcept {
  if constexpr (std::is_same_v<Block, block_q2_k>)
    return q2_k_super_sums<TN>(rows, i, xa, t0);
  else if constexpr (std::is_same_v<Block, block_q3_k>)
    return q3_k_super_sums<TN>(rows, i, xa, t0);
  else
    return iq4_xs_super_sums<TN>(rows, i, xa, t0);
}
#else
template <class Block>
inline constexpr bool has_k_super_sums = false;
#endif

#if defined(__AVX512VBMI__) && defined(__GFNI__)
/// kquant_tile for the formats of k_super_block_sums: each super-block's
/// sums of the ON rows, then fma(float(I), d * d_x, y) and Q2_K's
/// fma(float(M), -(dmin * d_x), y), the GEMM's order.
template <class Block, std::size_t TN, std::size_t ON>
inline void kquant_tile_super_sums(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                                   bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  static_assert(ON <= 4, "kquant_tile: the exact sums of a token's rows share one 4-lane vector");
  const std::size_t row_bytes = w.row_bytes(), units = w.in / qk_k;
  const Block* rows[ON];
#pragma GCC unroll 16
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  __m128 sums_f[TN];  // row b in lane b
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) sums_f[a] = _mm_setzero_ps();
  const std::size_t step_bytes = ON * row_bytes / units;
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  for (std::size_t i = 0; i < units; ++i) {
    prefetch_lines_l2(ahead + i * step_bytes, step_bytes);
    const k_super_sums<TN> s = k_super_block_sums<TN>(rows, i, xa, t0);
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) {
      const __m128 dk = _mm_set1_ps(xa.k_scale(t0 + a, i));
      __m128 v = _mm_fmadd_ps(_mm_cvtepi32_ps(s.sum[a]), _mm_mul_ps(s.d, dk), sums_f[a]);
      if constexpr (std::is_same_v<Block, block_q2_k>) v = _mm_fnmadd_ps(_mm_cvtepi32_ps(s.mins[a]), _mm_mul_ps(s.dmin, dk), v);
      sums_f[a] = v;
    }
  }
  for (std::size_t a = 0; a < TN; ++a) {
    alignas(16) float row_sums[4];
    _mm_store_ps(row_sums, sums_f[a]);
    for (std::size_t b = 0; b < ON; ++b) {
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + row_sums[b] : row_sums[b];
    }
  }
}
#endif

/// Tokens [t0, t0 + TN) x rows [o0, o0 + ON) of a K-quant product over
/// activations quantised by assign_k (with assign_sums for the minimums).
template <class Block, std::size_t TN, std::size_t ON>
inline void kquant_tile(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                        bool accumulate, std::size_t t0, std::size_t o0) noexcept {
#if defined(__AVX512VBMI__) && defined(__GFNI__)
  if constexpr (has_k_super_sums<Block>) return kquant_tile_super_sums<Block, TN, ON>(xa, w, y, y_stride, accumulate, t0, o0);
#endif
  using F = kquant_block<Block>;
  const std::size_t stride = xa.stride, row_bytes = w.row_bytes(), units = w.in / qk_k;
  const Block* rows[ON];
#pragma GCC unroll 16
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  // Each super-block's sums reduced to exact int32 and added in f32 as the
  // GEMM does (gemm_kquants_vnni.hpp), so batches agree.
  static_assert(ON <= 4, "kquant_tile: the exact sums of a token's rows share one 4-lane vector");
  __m128 sums_f[TN];  // row b in lane b
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) sums_f[a] = _mm_setzero_ps();
  // The tile's rows are contiguous: each step prefetches its share of the
  // bytes matmul_prefetch_bytes ahead, every cache line of them.
  const std::size_t step_bytes = ON * row_bytes / units;
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  for (std::size_t i = 0; i < units; ++i) {
    __m512i iacc[TN][ON];
    prefetch_lines_l2(ahead + i * step_bytes, step_bytes);
    const k_tile_scales<ON> sc = F::scales(rows, i);
    // Row b's d (and Q2_K's dmin) in lane b, once per super-block (Q4_K / Q5_K: sc.d4).
    __m128 d4, dmin4 = _mm_setzero_ps();
    if constexpr (F::has_mins)
      d4 = sc.d4;
    else
      d4 = k_lanes(sc.d);
    if constexpr (F::mins16) dmin4 = k_lanes(sc.dmin);
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a)
#pragma GCC unroll 16
      for (std::size_t b = 0; b < ON; ++b) iacc[a][b] = _mm512_setzero_si512();
    if constexpr (F::has_mins) {
      // VPDPBUSD sums each 4 values of a group (at most 4 * 31 * 127, so
      // two groups pack to int16 words exactly); one VPDPWSSD per two groups
      // then applies the sub-block scales.
#pragma GCC unroll 16
      for (std::size_t b = 0; b < ON; ++b) {
        __m512i d[TN][4];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < 4; ++g) {
          const __m512i u = F::values(rows[b] + i, g);
#pragma GCC unroll 16
          for (std::size_t a = 0; a < TN; ++a)
            d[a][g] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                          _mm512_load_si512(xa.row(t0 + a) + qk_k * i + 64 * g));
        }
        const __m512i s01 = k_affine_pair_scales(sc, b, 0), s23 = k_affine_pair_scales(sc, b, 1);
#pragma GCC unroll 16
        for (std::size_t a = 0; a < TN; ++a)
          iacc[a][b] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(iacc[a][b], _mm512_packs_epi32(d[a][0], d[a][1]), s01),
                                           _mm512_packs_epi32(d[a][2], d[a][3]), s23);
      }
    } else {
#pragma GCC unroll 4
      for (std::size_t g = 0; g < 4; ++g) {
        __m512i u[ON], ws[ON];
        [[maybe_unused]] __mmask64 negative[ON];
#pragma GCC unroll 16
        for (std::size_t b = 0; b < ON; ++b) {
          if constexpr (F::signed_values)
            u[b] = F::values(rows[b] + i, g, negative[b]);
          else
            u[b] = F::values(rows[b] + i, g);
          ws[b] = F::group_scales(sc, b, g);
        }
#pragma GCC unroll 16
        for (std::size_t a = 0; a < TN; ++a) {
          const __m512i q = _mm512_load_si512(xa.row(t0 + a) + qk_k * i + 64 * g);
#pragma GCC unroll 16
          for (std::size_t b = 0; b < ON; ++b) {
            // Signed levels: |level| times q with the level's sign (q in [-127, 127], so exact).
            __m512i qb = q;
            if constexpr (F::signed_values) qb = _mm512_mask_sub_epi8(q, negative[b], _mm512_setzero_si512(), q);
            iacc[a][b] = _mm512_dpwssd_epi32(iacc[a][b], _mm512_maddubs_epi16(u[b], qb), ws[b]);
          }
        }
      }
    }
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) {
      const std::size_t t = t0 + a;
      const float dk = xa.k_scale(t, i);
      if constexpr (has_k_scales16<Block>) {  // values are u - offset (a power of two)
        constexpr int shift = std::countr_zero(unsigned(F::offset));
        const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * stride + qk_k * i) / 16));
#pragma GCC unroll 16
        for (std::size_t b = 0; b < ON; ++b) {
          const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(_mm512_castsi512_si256(sc.sc[b]), s16), shift);
          iacc[a][b] = _mm512_sub_epi32(iacc[a][b], _mm512_zextsi256_si512(offset));
        }
      }
      {  // fma(float(I), d * d_x, y), then (Q2_K, Q4_K, Q5_K) fma(float(M), -(dmin * d_x), y)
        const __m128 d_dk = _mm_mul_ps(d4, _mm_set1_ps(dk));
        __m128 v = _mm_fmadd_ps(_mm_cvtepi32_ps(k_row_sums(iacc[a])), d_dk, sums_f[a]);
        if constexpr (F::has_mins) {
          // The 8 sub-block sums (of 32) as words in every 128-bit lane, by row b's minimums in lane b.
          const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * stride + qk_k * i) / 16));
          const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
          const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(s32, s32), 0x08);
          const __m512i m = _mm512_madd_epi16(sc.mins4, _mm512_broadcast_i32x4(_mm256_castsi256_si128(words)));
          __m512i h = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_ENUM(0x4E)));
          h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, _MM_PERM_ENUM(0xB1)));
          const __m128i mins = _mm512_castsi512_si128(
              _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), h));
          v = _mm_fnmadd_ps(_mm_cvtepi32_ps(mins), _mm_mul_ps(sc.dmin4, _mm_set1_ps(dk)), v);
        } else if constexpr (F::mins16) {  // M = sum_s m_s * sum q over Q2_K's 16 sub-blocks of 16
          const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xa.sums16.data() + (t * stride + qk_k * i) / 16));
          __m512i m[ON];
#pragma GCC unroll 4
          for (std::size_t b = 0; b < ON; ++b) m[b] = _mm512_zextsi256_si512(_mm256_madd_epi16(sc.min_words[b], s16));
          v = _mm_fnmadd_ps(_mm_cvtepi32_ps(k_row_sums(m)), _mm_mul_ps(dmin4, _mm_set1_ps(dk)), v);
        }
        sums_f[a] = v;
      }
    }
  }
  for (std::size_t a = 0; a < TN; ++a) {
    alignas(16) float row_sums[4];
    _mm_store_ps(row_sums, sums_f[a]);
    for (std::size_t b = 0; b < ON; ++b) {
      const float v = row_sums[b];
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + v : v;
    }
  }
}

/// Rows [row_first, row_last) of a K-quant product for every token: one
/// token in tiles of 4 rows, two in 2 x 2, more in 4 x 2 tiles (the most
/// that keeps the int32, f32 and minimum accumulators in registers).
template <class Block>
void matmul_kquant_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                        bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  for_each_int8_tile<2>(xa.n, row_first, row_last, [&]<std::size_t TN, std::size_t ON>(std::size_t t, std::size_t o) {
    kquant_tile<Block, TN, ON>(xa, w, y, y_stride, accumulate, t, o);
  });
}

/// int8_block_rows for the K-quants on AVX-512 VNNI (xsimd has no VNNI tag:
/// avx512bw stands for it where the build enables VNNI; without, avx512bw
/// falls back to the avx512f overload).
template <class Block>
  requires is_kquant_block<Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::avx512bw>) noexcept {
  matmul_kquant_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last);
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
