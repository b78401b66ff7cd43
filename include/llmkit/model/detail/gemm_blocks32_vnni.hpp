// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/gemm_blocks32_vnni.hpp
/// The int8-activation products of the 4-bit formats whose block is a scale
/// then 16 bytes of nibbles (Q4_0, IQ4_NL, MXFP4) with AVX-512 VNNI, in the
/// Q8_0 GEMM's arithmetic (matmul_q8_vnni.hpp): each block's int32 sum
/// exact, then
///
///     y[t, o] = fma(float(sum_j q_x u_w - 128 sum_j q_x), d_x[t, b] * d_w[o, b], y[t, o])     blocks b ascending
///
/// with u_w = level + 128 (Q4_0's levels nibble - 8, IQ4_NL's and MXFP4's
/// kvalues tables; MXFP4's d_w = 2^(e - 128) for the doubled levels).
///
/// They are a panel source of the Q8_0 GEMM: from 4 tokens on, block32_pack_panel
/// decodes 16 rows into the Q8_0 panel layout and the Q8_0 tiles run
/// unchanged. Under 4 tokens block32_rows_direct decodes each row in
/// registers as the lookup kernel does (matmul_lookup4_vnni.hpp: 4 blocks
/// per step, block k in 128-bit lane k), multiplies it by the token, then
/// sums the 16 rows' lanes per block in a tree (exact int32) to one vector
/// per block with the rows in its lanes, and applies the same FMA. The 16
/// rows' block scales travel without a gather: each row's first 64 bytes
/// already hold its 4 scales, one per 128-bit lane, and one merge-masked
/// VPSHUFB per row drops them into slot r of that lane. Both paths give the
/// same bits, so a token's output does not depend on its batch.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/model/detail/matmul_blocks_q8.hpp"
#include "llmkit/model/detail/matmul_lookup4_vnni.hpp"
#include "llmkit/model/detail/matmul_q8.hpp"
#include "llmkit/model/detail/matmul_q8_vnni.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// The formats these kernels can multiply.
template <class Block>
inline constexpr bool is_block32_panel_source =
    std::is_same_v<Block, block_q4_0> || std::is_same_v<Block, block_iq4_nl> || std::is_same_v<Block, block_mxfp4>;

/// The formats whose products take them (int8_gemm_rows) at every token
/// count, so that a token's bits never depend on its batch: Q4_0, whose
/// prefill runs 3x the lane kernel's (matmul_blocks32_vnni.hpp) for a
/// one-token decode 4% slower. IQ4_NL's and MXFP4's decode from DRAM
/// measured 18% and 8% below their lane kernels' (matmul_lookup4_vnni.hpp),
/// so they keep those (docs/model.md).
template <class Block>
inline constexpr bool has_block32_gemm = std::is_same_v<Block, block_q4_0>;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

/// VPSHUFB indices that move block k's scale (byte k * gap of 128-bit lane
/// k) into slot r of that lane (a byte for MXFP4's exponent, a word for the
/// f16 scales), zeros elsewhere: OR-ing 16 rows' shuffles (8 for f16)
/// gathers their scales without a gather.
template <class Block>
inline constexpr auto block32_scale_index = [] {
  constexpr int gap = int(sizeof(Block)) - 16;
  std::array<std::array<std::int8_t, 64>, 16> index{};
  for (int r = 0; r < 16; ++r)
    for (int lane = 0; lane < 4; ++lane)
      for (int i = 0; i < 16; ++i) {
        const int slot = gap == 1 ? r : r % 8;
        index[std::size_t(r)][std::size_t(16 * lane + i)] =
            i / gap == slot ? std::int8_t(lane * gap + i % gap) : std::int8_t(-128);
      }
  return index;
}();

/// Collects the block scales of 16 rows' 4-block groups: add(r, first)
/// takes row r's first 64 bytes (lookup4_group::scale_bytes: block k's
/// scale in 128-bit lane k); get gives them as f32, rows in lanes.
template <class Block>
struct block32_scales {
  static constexpr bool e8m0 = std::is_same_v<Block, block_mxfp4>;
  __m512i slots[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};

  /// Rows r and r + 1 (r even).
  void add_pair(std::size_t r, __m512i first0, __m512i first1) noexcept {
    const __m512i a = _mm512_shuffle_epi8(first0, _mm512_loadu_si512(block32_scale_index<Block>[r].data()));
    const __m512i b = _mm512_shuffle_epi8(first1, _mm512_loadu_si512(block32_scale_index<Block>[r + 1].data()));
    __m512i& dst = slots[e8m0 ? 0 : r / 8];
    dst = _mm512_ternarylogic_epi32(dst, a, b, 0xFE);
  }

  /// ws[k] lane r: block k's scale of row r as combined() takes it: the f16
  /// scale as f32, MXFP4's exponent e - 128 as f32.
  void get(__m512 (&ws)[4]) const noexcept {
    if constexpr (e8m0) {
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) {
        // Byte r of lane k (byte 16 k + r) to dword r: lane k to lane 0, then widened (no VBMI needed).
        const __m512i lane = _mm512_permutexvar_epi32(
            _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3),
                             _mm512_set1_epi32(int(4 * k))),
            slots[0]);
        const __m512i e = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(lane));
        ws[k] = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
      }
    } else {
#pragma GCC unroll 4
      for (std::size_t k = 0; k < 4; ++k) {
        const long long q = 2 * static_cast<long long>(k);
        const __m512i pick = _mm512_setr_epi64(q, q + 1, 8 + q, 9 + q, 0, 0, 0, 0);
        ws[k] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi64(slots[0], pick, slots[1])));
      }
    }
  }

  /// d_x * d_w (MXFP4: d_x * 2^(e - 128) by VSCALEFPS, which rounds as the
  /// multiply by the exact scale_f32 does).
  static __m512 combined(__m512 dx, __m512 ws) noexcept {
    if constexpr (e8m0)
      return _mm512_scalef_ps(dx, ws);
    else
      return _mm512_mul_ps(dx, ws);
  }
};

/// The format's levels + 128 for lookup4_group::load.
template <class Block>
inline __m512i block32_levels() noexcept {
  if constexpr (std::is_same_v<Block, block_q4_0>)
    return _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
                           _mm512_set1_epi8(120));
  else
    return lookup4_levels<Block>();
}

/// The 16 rows of a panel from W's row o; with `Full` false, rows past
/// `valid` repeat row o (decoded and multiplied like the others, their
/// outputs never stored). A full panel addresses row r as o + r, so no
/// table of row pointers takes registers.
template <class Block, bool Full>
struct block32_panel {
  const std::byte* base;
  std::size_t row_bytes, valid;

  block32_panel(const block_weights& w, std::size_t o, std::size_t valid_rows) noexcept
      : base(w.data + o * w.row_bytes()), row_bytes(w.row_bytes()), valid(valid_rows) {}

  /// Row r's group g (blocks [4g, 4g + NB)) decoded.
  template <std::size_t NB>
  lookup4_group load(std::size_t r, std::size_t g, __m512i levels) const noexcept {
    const auto* p = reinterpret_cast<const Block*>(base + (Full || r < valid ? r : 0) * row_bytes) + 4 * g;
    prefetch_l2(p, q8_panel_rows * row_bytes);  // the same row of the next panel
    return lookup4_group::load<Block, NB>(p, levels);
  }
};

/// Decodes W's rows [o, o + valid) (valid <= 16) into the Q8_0 panel layout
/// at u, s (q8_pack_panel's): u[(b * 8 + j) * 64 + 4 r + i] = value 4 j + i
/// of block b of row r, + 128; s[b * 16 + r] = d_w.
template <class Block>
inline void block32_pack_panel(const block_weights& w, std::size_t o, std::size_t valid, std::uint8_t* u,
                               float* s) noexcept {
  const std::size_t blocks = w.in / 32;
  const __m512i levels = block32_levels<Block>();
  const block32_panel<Block, false> panel(w, o, valid);
  auto group = [&]<std::size_t NB>(std::size_t g) {
    __m512i lo[16], hi[16];
    block32_scales<Block> scales;
#pragma GCC unroll 8
    for (std::size_t r = 0; r < 16; r += 2) {
      const lookup4_group r0 = panel.template load<NB>(r, g, levels);
      const lookup4_group r1 = panel.template load<NB>(r + 1, g, levels);
      lo[r] = r0.lo, hi[r] = r0.hi, lo[r + 1] = r1.lo, hi[r + 1] = r1.hi;
      scales.add_pair(r, r0.scale_bytes, r1.scale_bytes);
    }
    // Dword 4k + j of lo (hi) is values 4j..4j+3 (16 + 4j..) of block k.
    transpose_16x16_epi32(lo);
    transpose_16x16_epi32(hi);
    __m512 ws[4];
    scales.get(ws);
#pragma GCC unroll 4
    for (std::size_t k = 0; k < NB; ++k) {
      std::uint8_t* dst = u + (4 * g + k) * 8 * 64;
#pragma GCC unroll 4
      for (std::size_t j = 0; j < 4; ++j) {
        _mm512_store_si512(dst + j * 64, lo[4 * k + j]);
        _mm512_store_si512(dst + (4 + j) * 64, hi[4 * k + j]);
      }
      _mm512_store_ps(s + (4 * g + k) * 16, block32_scales<Block>::combined(_mm512_set1_ps(1.0f), ws[k]));
    }
  };
  for_block_groups4(blocks, group);
}

/// Tokens [0, TN) x W's rows [o, o + valid) (valid <= 16) decoded in
/// registers, for products of a few tokens: per 4-block group and row, two
/// VPDPBUSD per token against the lookup kernel's permuted activations,
/// then the 16 rows' dot vectors are reduced to one vector per block (row r
/// in lane r) and each block's FMA is the GEMM tiles'.
template <class Block, std::size_t TN, bool Full>
inline void block32_rows_direct(const q8_activations& xa, const block_weights& w, std::size_t o, std::size_t valid,
                                float* y, std::size_t y_stride, bool accumulate) noexcept {
  const std::size_t blocks = w.in / 32;
  const __m512i levels = block32_levels<Block>();
  const block32_panel<Block, Full> panel(w, o, valid);
  __m512 f[TN];
#pragma GCC unroll 4
  for (std::size_t t = 0; t < TN; ++t) f[t] = _mm512_setzero_ps();
  auto group = [&]<std::size_t NB>(std::size_t g) {
    lookup4_activations x[TN];
#pragma GCC unroll 4
    for (std::size_t t = 0; t < TN; ++t) x[t] = lookup4_activations::load<NB>(xa, t, g);
    block32_scales<Block> scales;
    // c[t][j], lane k, element e: block k's sum of row 4j + e for token t.
    __m512i c[TN][4];
#pragma GCC unroll 4
    for (std::size_t j = 0; j < 4; ++j) {
      __m512i a[TN][2];
#pragma GCC unroll 2
      for (std::size_t i = 0; i < 2; ++i) {
        const std::size_t r = 4 * j + 2 * i;
        const lookup4_group r0 = panel.template load<NB>(r, g, levels);
        const lookup4_group r1 = panel.template load<NB>(r + 1, g, levels);
        scales.add_pair(r, r0.scale_bytes, r1.scale_bytes);
#pragma GCC unroll 4
        for (std::size_t t = 0; t < TN; ++t) {
          const __m512i v0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x[t].start, r0.lo, x[t].lo), r0.hi, x[t].hi);
          const __m512i v1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x[t].start, r1.lo, x[t].lo), r1.hi, x[t].hi);
          a[t][i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
        }
      }
#pragma GCC unroll 4
      for (std::size_t t = 0; t < TN; ++t)
        c[t][j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[t][0], a[t][1]), _mm512_unpackhi_epi64(a[t][0], a[t][1]));
    }
    __m512 ws[4];
    scales.get(ws);
#pragma GCC unroll 4
    for (std::size_t t = 0; t < TN; ++t) {
      // A 4 x 4 transposition of 128-bit lanes: d[k] holds block k, row r in lane r.
      const __m512i v0 = _mm512_shuffle_i32x4(c[t][0], c[t][1], 0x44), v1 = _mm512_shuffle_i32x4(c[t][0], c[t][1], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(c[t][2], c[t][3], 0x44), v3 = _mm512_shuffle_i32x4(c[t][2], c[t][3], 0xEE);
      const __m512i d[4] = {_mm512_shuffle_i32x4(v0, v2, 0x88), _mm512_shuffle_i32x4(v0, v2, 0xDD),
                            _mm512_shuffle_i32x4(v1, v3, 0x88), _mm512_shuffle_i32x4(v1, v3, 0xDD)};
#pragma GCC unroll 4
      for (std::size_t k = 0; k < NB; ++k)
        f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[k]),
                               block32_scales<Block>::combined(_mm512_set1_ps(xa.scale(t, 4 * g + k)), ws[k]), f[t]);
    }
  };
  for_block_groups4(blocks, group);
  const __mmask16 m = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (std::size_t t = 0; t < TN; ++t) {
    float* out = y + t * y_stride + o;
    __m512 v = f[t];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), v);
    _mm512_mask_storeu_ps(out, m, v);
  }
}

/// Rows [row_first, row_last) of W times every token of xa: the GEMM from 4
/// tokens on, block32_rows_direct under, in the same f32 order.
template <class Block>
  requires is_block32_panel_source<Block>
inline void block32_gemm_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                              bool accumulate, std::size_t row_first, std::size_t row_last) {
  if (xa.n < q8_gemm_min_tokens) {
    for (std::size_t o = row_first; o < row_last; o += q8_panel_rows) {
      const std::size_t valid = std::min(q8_panel_rows, row_last - o);
      auto direct = [&]<std::size_t TN>() {
        if (valid == q8_panel_rows)
          block32_rows_direct<Block, TN, true>(xa, w, o, valid, y, y_stride, accumulate);
        else
          block32_rows_direct<Block, TN, false>(xa, w, o, valid, y, y_stride, accumulate);
      };
      switch (xa.n) {
        case 1: direct.template operator()<1>(); break;
        case 2: direct.template operator()<2>(); break;
        case 3: direct.template operator()<3>(); break;
        default: break;
      }
    }
    return;
  }
  q8_gemm_rows(xa, y, y_stride, accumulate, row_first, row_last,
               [&](std::size_t o, std::size_t valid, std::uint8_t* u, float* s) {
                 block32_pack_panel<Block>(w, o, valid, u, s);
               });
}

/// int8_gemm_rows for the has_block32_gemm formats on AVX-512 VNNI
/// (avx512bw stands for VNNI where the build enables it): every token
/// count, so a token's bits never depend on its batch.
template <class Block>
  requires has_block32_gemm<Block>
inline bool int8_gemm_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last,
                           simd::requires_arch<xsimd::avx512bw>) noexcept {
  block32_gemm_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last);
  return true;
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
