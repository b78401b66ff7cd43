// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_lookup4_vnni.hpp
/// The int8-activation product of the 4-bit lookup formats (IQ4_NL, MXFP4:
/// 32 values per block, each a nibble indexing 16 levels, one scale per
/// block) with AVX-512 VNNI, four blocks (128 values) per step.
///
/// The four blocks' 64 bytes of nibbles go to one register, block k in
/// 128-bit lane k (with VBMI one VPERMT2B from two loads, else four loads),
/// so its low nibbles are values 0-15 of the four blocks and its high nibbles
/// values 16-31; a VPERMB (or a mask and a VPSHUFB) each turns them into
/// level + 128. The activations are permuted to match (two 128-bit-lane
/// shuffles per token, shared by the tile's rows), and both halves go
/// through VPDPBUSD into one int32 accumulator started from the blocks'
/// -128 * sum q, so each block's exact integer dot lies in 4 lanes. Then one
/// conversion and one FMA per four blocks apply d_w * d_x: the four weight
/// scales come from the first load and one VPSHUFB (each block's scale byte
/// falls in its own 128-bit lane: blocks are 16 bytes of nibbles plus 1 or
/// 2 scale bytes), times the activations' scales by a multiply (IQ4_NL's
/// f16) or an exact VSCALEFPS (MXFP4's power of two). No scalar work per
/// block.
///
/// Every output sums its 16 lanes group by group in the same order and
/// reduces them with one fixed tree whatever the tile or batch, so the
/// product is batch and thread invariant.

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/model/detail/matmul_blocks_q8.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// The formats lookup4_tile serves: a block is a scale of 1 or 2 bytes then
/// 16 bytes of nibbles indexing 16 levels.
template <class Block>
inline constexpr bool is_lookup4_block = std::is_same_v<Block, block_iq4_nl> || std::is_same_v<Block, block_mxfp4>;

/// step.template operator()<4>(g) for each whole group g of four blocks,
/// then operator()<blocks % 4> on the rest: the group size is a template
/// argument, so a step's per-block registers stay registers.
template <class Step>
inline void for_block_groups4(std::size_t blocks, Step&& step) {
  std::size_t g = 0;
  for (; g < blocks / 4; ++g) step.template operator()<4>(g);
  switch (blocks % 4) {
    case 3: step.template operator()<3>(g); break;
    case 2: step.template operator()<2>(g); break;
    case 1: step.template operator()<1>(g); break;
    default: break;
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

/// A format's levels + 128 (VPDPBUSD's unsigned operand), repeated in each
/// 16 bytes: VPSHUFB reads a 16-entry table per 128-bit lane, VPERMB indexes
/// all 64 bytes by an index's low 6 bits, so either ignores the bits above
/// the nibble they look up.
template <class Block>
inline __m512i lookup4_levels() noexcept {
  const std::uint8_t* levels = std::is_same_v<Block, block_mxfp4> ? mxfp4_biased : iq4nl_biased;
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)));
}

/// VPSHUFB indices that move block k's scale (byte k * (sizeof(Block) - 16)
/// of 128-bit lane k, 1 or 2 bytes) into the low bytes of every int32 of
/// lane k, zeros above.
template <class Block>
inline constexpr auto lookup4_scale_index = [] {
  constexpr int gap = int(sizeof(Block)) - 16, scale_bytes = int(sizeof(Block::d));
  std::array<std::int8_t, 64> index{};
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < 16; ++i)
      index[std::size_t(16 * lane + i)] = i % 4 < scale_bytes ? std::int8_t(lane * gap + i % 4) : std::int8_t(-128);
  return index;
}();

/// VPERMT2B indices that gather block k's 16 bytes of nibbles into 128-bit
/// lane k from the 128 bytes that follow p[0].
template <class Block>
inline constexpr auto lookup4_nibble_index = [] {
  constexpr int scale_bytes = int(sizeof(Block)) - 16;
  std::array<std::int8_t, 64> index{};
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < 16; ++i) index[std::size_t(16 * lane + i)] = std::int8_t(lane * int(sizeof(Block)) + scale_bytes + i);
  return index;
}();

/// Blocks p[0, NB) of a row, NB in 1-4, decoded: `lo` and `hi` block k's
/// values 0-15 and 16-31 as level + 128 in 128-bit lane k (past NB: level
/// 0's, against zero activations), `scale_bytes` the first 64 bytes from
/// p[0] (block k's scale lies in lane k; zeros past NB).
struct lookup4_group {
  __m512i lo, hi, scale_bytes;

  template <class Block, std::size_t NB>
  static lookup4_group load(const Block* p, __m512i levels) noexcept {
    static_assert(NB >= 1 && NB <= 4);
    constexpr std::size_t bytes = NB * sizeof(Block);
    // Four blocks span 68 or 72 bytes: the first 64 whole, the rest (and
    // any shorter group) byte-masked, so nothing past the blocks is read.
    const auto* base = reinterpret_cast<const std::uint8_t*>(p);
    const __m512i a = bytes >= 64 ? _mm512_loadu_si512(base)
                                  : _mm512_maskz_loadu_epi8(__mmask64((std::uint64_t{1} << bytes) - 1), base);
#if defined(__AVX512VBMI__)
    // One VPERMT2B gathers the four blocks' nibbles; VPERMB looks them up
    // without masking off the other nibble (the table repeats every 16 bytes).
    const __m512i b = bytes > 64 ? _mm512_maskz_loadu_epi8(__mmask64((std::uint64_t{1} << (bytes - 64)) - 1), base + 64)
                                 : _mm512_setzero_si512();
    const __m512i z = _mm512_permutex2var_epi8(a, _mm512_loadu_si512(lookup4_nibble_index<Block>.data()), b);
    return {_mm512_permutexvar_epi8(z, levels), _mm512_permutexvar_epi8(_mm512_srli_epi16(z, 4), levels), a};
#else
    __m512i z = _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0].qs)));
    if constexpr (NB > 1) z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[1].qs)), 1);
    if constexpr (NB > 2) z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[2].qs)), 2);
    if constexpr (NB > 3) z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[3].qs)), 3);
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    return {_mm512_shuffle_epi8(levels, _mm512_and_si512(z, low_nibbles)),
            _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(z, 4), low_nibbles)), a};
#endif
  }
};

/// d_w * d_x per lane: `weight` the block's scale as lookup4_weight_scale
/// gives it, `dx` the activations' scales (per block, 4 lanes each).
inline __m512 lookup4_combined_scale(__m512 weight, __m512 dx, std::type_identity<block_iq4_nl>) noexcept {
  return _mm512_mul_ps(weight, dx);
}
/// MXFP4: `weight` holds the exponent e - 128 as a float; d_x * 2^(e - 128)
/// is exact (a VSCALEFPS rounds as the multiply by scale_f32(e) does).
inline __m512 lookup4_combined_scale(__m512 weight, __m512 dx, std::type_identity<block_mxfp4>) noexcept {
  return _mm512_scalef_ps(dx, weight);
}

/// The per-lane weight scales of a group from its scale_bytes (index:
/// lookup4_scale_index): IQ4_NL's f16 as f32, MXFP4's exponent e - 128.
inline __m512 lookup4_weight_scale(__m512i scale_bytes, __m512i index, std::type_identity<block_iq4_nl>) noexcept {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_shuffle_epi8(scale_bytes, index)));
}
inline __m512 lookup4_weight_scale(__m512i scale_bytes, __m512i index, std::type_identity<block_mxfp4>) noexcept {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_shuffle_epi8(scale_bytes, index), _mm512_set1_epi32(128)));
}

/// Token t's activations for blocks [4g, 4g + NB), permuted as the weights'
/// nibbles: `lo` values 0-15 and `hi` values 16-31 of block k in 128-bit
/// lane k, `start` the blocks' -128 * sum q in lanes 0, 4, 8, 12, `d` the
/// blocks' scales, 4 lanes each.
struct lookup4_activations {
  __m512i lo, hi, start;
  __m512 d;

  template <std::size_t NB>
  static lookup4_activations load(const q8_activations& xa, std::size_t t, std::size_t g) noexcept {
    const std::int8_t* q = xa.row(t) + 128 * g;
    // Past NB > 2 the second 64 values (and their scales) lie beyond the padded row.
    const __m512i x0 = _mm512_load_si512(q);
    const __m512i x1 = NB > 2 ? _mm512_load_si512(q + 64) : _mm512_setzero_si512();
    const __m512 p0 = _mm512_load_ps(xa.pair_scales(t, 2 * g));
    const __m512 p1 = NB > 2 ? _mm512_load_ps(xa.pair_scales(t, 2 * g + 1)) : _mm512_setzero_ps();
    const __m512i to_blocks = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m128i sums = _mm_maskz_loadu_epi32(__mmask8((1u << NB) - 1), xa.bias_sums.data() + t * xa.stride / 32 + 4 * g);
    return {_mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)),
            _mm512_maskz_expand_epi32(0x1111, _mm512_castsi128_si512(sums)), _mm512_permutex2var_ps(p0, to_blocks, p1)};
  }
};

/// Tokens [t0, t0 + TN) x rows [o0, o0 + ON) over the whole row.
template <class Block, std::size_t TN, std::size_t ON>
inline void lookup4_tile(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                         bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  constexpr std::type_identity<Block> format{};
  const std::size_t row_bytes = w.row_bytes(), blocks = w.in / 32, groups = (blocks + 3) / 4;
  const Block* rows[ON];
#pragma GCC unroll 16
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  const __m512i levels = lookup4_levels<Block>();
  const __m512i scale_index = _mm512_loadu_si512(lookup4_scale_index<Block>.data());
  __m512 acc[TN][ON];
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a)
#pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) acc[a][b] = _mm512_setzero_ps();
  // The tile's rows are contiguous: each step prefetches its share of them
  // matmul_prefetch_bytes ahead.
  const std::size_t step_bytes = (ON * row_bytes + groups - 1) / groups;
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  auto step = [&]<std::size_t NB>(std::size_t g) {
    prefetch_lines_l2(ahead + g * step_bytes, step_bytes);
    lookup4_activations x[TN];
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) x[a] = lookup4_activations::load<NB>(xa, t0 + a, g);
    // Row by row: a row's decoded group is dead once its tokens used it.
#pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) {
      const auto group = lookup4_group::load<Block, NB>(rows[b] + 4 * g, levels);
      const __m512 ws = lookup4_weight_scale(group.scale_bytes, scale_index, format);
#pragma GCC unroll 16
      for (std::size_t a = 0; a < TN; ++a) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x[a].start, group.lo, x[a].lo), group.hi, x[a].hi);
        acc[a][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), lookup4_combined_scale(ws, x[a].d, format), acc[a][b]);
      }
    }
  };
  for_block_groups4(blocks, step);
  float sums[TN][ON];
  reduce_tile16(acc, sums);
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) {
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + sums[a][b] : sums[a][b];
    }
}

/// int8_block_rows for IQ4_NL and MXFP4 on AVX-512 VNNI (avx512bw stands for
/// VNNI where the build enables it, as in matmul_blocks32_vnni.hpp): one
/// token in 1 x 8 tiles (a token's permuted activations shared by 8 rows),
/// two in 2 x 2, more in 4 x 2 (four tokens' activations fill the registers).
template <class Block>
  requires is_lookup4_block<Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::avx512bw>) noexcept {
  if (xa.n == 1) {
    std::size_t o = row_first;
    for (; o + 8 <= row_last; o += 8) lookup4_tile<Block, 1, 8>(xa, w, y, y_stride, accumulate, 0, o);
    if (o + 4 <= row_last) {
      lookup4_tile<Block, 1, 4>(xa, w, y, y_stride, accumulate, 0, o);
      o += 4;
    }
    for (; o < row_last; ++o) lookup4_tile<Block, 1, 1>(xa, w, y, y_stride, accumulate, 0, o);
    return;
  }
  for_each_int8_tile<2>(xa.n, row_first, row_last, [&]<std::size_t TN, std::size_t ON>(std::size_t t, std::size_t o) {
    lookup4_tile<Block, TN, ON>(xa, w, y, y_stride, accumulate, t, o);
  });
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
