// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_q8_vnni.hpp
/// The Q8_0 x int8-activation product (matmul_q8.hpp) with AVX-512 VNNI as a
/// register-blocked GEMM: output rows in the vector lanes, so no horizontal
/// sums.
///
/// W's rows are taken 16 at a time (a panel) and transposed, a strip of
/// panels at a time, into a per-thread buffer (L2-sized) where one 64-byte
/// vector holds 4 consecutive weights of each of the 16 rows:
///
///     u[(b * 8 + g) * 64 + 4 r + j] = q_w[o + r][32 b + 4 g + j] + 128   (as uint8)
///     s[b * 16 + r]                 = d_w[o + r][b]
///
/// Then VPDPBUSD multiplies that vector by 4 activation bytes broadcast from
/// memory: 16 rows x 4 values, 64 multiply-adds, per instruction, every
/// weight load shared by the tile's tokens. A tile of TN tokens x RV panels
/// keeps TN * RV int32 and TN * RV f32 accumulators in registers. Since the
/// weights are biased by +128 (VPDPBUSD's unsigned side), each block's int32
/// sum starts at -128 * sum q_x (q8_activations::bias_sums) and so ends at
/// the exact sum_j q_x q_w; then
///
///     y[t, o] = fma(float(sum_j q_x q_w), d_x[t, b] * d_w[o, b], y[t, o])     blocks b ascending
///
/// the generic loop's arithmetic exactly (matmul_q8.hpp), so every token
/// count, tile, thread and arch gives the same bits. The transposition costs
/// about one instruction per 16 weights and is done once per strip for all
/// the tokens. Fewer than q8_gemm_min_tokens tokens (decode) would not repay
/// it: q8_rows_direct reads W's rows where they lie and reaches the same
/// per-block sums through a tree.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/model/detail/matmul_q8.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

/// Rows per panel: one int32 lane each.
inline constexpr std::size_t q8_panel_rows = 16;
/// Tokens and panels per register tile: 6 x 2 int32 + 6 x 2 f32
/// accumulators + 2 weight registers of the 32 AVX-512 registers; two
/// 64-byte weight loads and six 4-byte broadcasts feed 12 VPDPBUSD. Set by
/// the register file, so not in model/tuning.hpp.
inline constexpr std::size_t q8_gemm_tile_tokens = 6;
inline constexpr std::size_t q8_gemm_tile_panels = 2;
/// Products of fewer tokens run q8_rows_direct (the tail cases there are
/// written for 1-3 tokens).
inline constexpr std::size_t q8_gemm_min_tokens = 4;

/// The per-thread buffer a strip of panels is transposed into.
struct q8_panel_buffer {
  aligned_vector<std::uint8_t> u;  ///< [panels, in * 16]
  aligned_vector<float> s;         ///< [panels, in / 32 * 16]
};

/// Transposes the 16 x 16 dwords r (row i in r[i]) in place: afterwards
/// r[g] holds dword g of every row, row i in lane i.
inline void transpose_16x16_epi32(__m512i (&r)[16]) noexcept {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4j + e], 128-bit lane L: dword 4L + e of rows 4j .. 4j + 3.
#pragma GCC unroll 4
  for (std::size_t j = 0; j < 4; ++j) {
    u[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
    u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
    u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
    u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
  }
  // A 4 x 4 transposition of 128-bit lanes for each e.
#pragma GCC unroll 4
  for (std::size_t e = 0; e < 4; ++e) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44),
                  v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

/// Transposes W's rows [o, o + valid) (valid <= 16; the missing rows are
/// zero weights with zero scales) into panel layout at u, s.
inline void q8_pack_panel(const q8_weights& w, std::size_t o, std::size_t valid, std::uint8_t* u, float* s) noexcept {
  const std::size_t in = w.in, blocks = in / q8_block_size;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  for (std::size_t p = 0; p < blocks / 2 + blocks % 2; ++p) {
    const bool full = 2 * p + 1 < blocks;
    const __mmask64 bytes = full ? ~__mmask64(0) : __mmask64(0xFFFFFFFFu);
    __m512i r[16];
#pragma GCC unroll 16
    for (std::size_t i = 0; i < 16; ++i)
      r[i] = i < valid ? _mm512_maskz_loadu_epi8(bytes, w.q + (o + i) * in + 64 * p) : _mm512_setzero_si512();
    transpose_16x16_epi32(r);
    std::uint8_t* dst = u + p * 16 * 64;
    for (std::size_t g = 0; g < (full ? 16u : 8u); ++g)
      _mm512_store_si512(dst + g * 64, _mm512_xor_si512(r[g], bias));
  }
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(int(blocks)));
  const __mmask16 live = __mmask16((1u << valid) - 1);
  for (std::size_t b = 0; b < blocks; ++b)
    _mm512_store_ps(s + b * 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, rows, w.s + o * blocks + b, 4));
}

/// One tile: tokens [t0, t0 + TN) x the RV panels at u, s (panel stride
/// `panel_bytes`, `panel_scales`), output rows [o0, o0 + valid).
template <std::size_t TN, std::size_t RV>
inline void q8_gemm_tile(const q8_activations& xa, const std::uint8_t* u, const float* s, std::size_t panel_bytes,
                         std::size_t panel_scales, std::size_t t0, float* y, std::size_t y_stride, bool accumulate,
                         std::size_t o0, std::size_t valid) noexcept {
  const std::size_t blocks = xa.in / q8_block_size;
  __m512 f[TN][RV];
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TN; ++t)
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RV; ++r) f[t][r] = _mm512_setzero_ps();
  const std::int8_t* x[TN];
  const std::int32_t* bias[TN];
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TN; ++t) {
    x[t] = xa.row(t0 + t);
    bias[t] = xa.bias_sums.data() + (t0 + t) * (xa.stride / q8_block_size);
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    __m512i acc[TN][RV];
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TN; ++t) {
      const __m512i c = _mm512_set1_epi32(bias[t][b]);
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) acc[t][r] = c;
    }
    const std::uint8_t* ub = u + b * 8 * 64;
#pragma GCC unroll 8
    for (std::size_t g = 0; g < 8; ++g) {
      __m512i wv[RV];
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r) wv[r] = _mm512_load_si512(ub + r * panel_bytes + g * 64);
#pragma GCC unroll 8
      for (std::size_t t = 0; t < TN; ++t) {
        std::int32_t x4;
        std::memcpy(&x4, x[t] + b * q8_block_size + 4 * g, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
        for (std::size_t r = 0; r < RV; ++r) acc[t][r] = _mm512_dpbusd_epi32(acc[t][r], wv[r], xv);
      }
    }
    __m512 dw[RV];
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RV; ++r) dw[r] = _mm512_load_ps(s + r * panel_scales + b * 16);
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TN; ++t) {
      const __m512 dx = _mm512_set1_ps(xa.scale(t0 + t, b));
#pragma GCC unroll 4
      for (std::size_t r = 0; r < RV; ++r)
        f[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][r]), _mm512_mul_ps(dx, dw[r]), f[t][r]);
    }
  }
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RV; ++r) {
    if (16 * r >= valid) break;
    const std::size_t left = valid - 16 * r;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    for (std::size_t t = 0; t < TN; ++t) {
      float* out = y + (t0 + t) * y_stride + o0 + 16 * r;
      __m512 v = f[t][r];
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), v);
      _mm512_mask_storeu_ps(out, m, v);
    }
  }
}

/// Calls `tile.template operator()<N>(t)` over tokens [0, n) in tiles of
/// TN tokens (N = TN), the last tile N = n % TN tokens wide: the
/// GEMMs' tile sizes are template arguments, so their accumulators stay in
/// registers.
template <std::size_t TN, class Tile>
inline void for_token_tiles(std::size_t n, Tile&& tile) {
  static_assert(TN == 6, "the tail cases below are written for 6-token tiles");
  std::size_t t = 0;
  for (; t + TN <= n; t += TN) tile.template operator()<TN>(t);
  switch (n - t) {
    case 5: tile.template operator()<5>(t); break;
    case 4: tile.template operator()<4>(t); break;
    case 3: tile.template operator()<3>(t); break;
    case 2: tile.template operator()<2>(t); break;
    case 1: tile.template operator()<1>(t); break;
    default: break;
  }
}

/// Every token of xa over the RV panels at u, s in tiles of
/// q8_gemm_tile_tokens tokens (the last tile narrower).
template <std::size_t RV>
inline void q8_gemm_panels(const q8_activations& xa, const std::uint8_t* u, const float* s, std::size_t panel_bytes,
                           std::size_t panel_scales, float* y, std::size_t y_stride, bool accumulate, std::size_t o0,
                           std::size_t valid) noexcept {
  for_token_tiles<q8_gemm_tile_tokens>(xa.n, [&]<std::size_t N>(std::size_t t) {
    q8_gemm_tile<N, RV>(xa, u, s, panel_bytes, panel_scales, t, y, y_stride, accumulate, o0, valid);
  });
}

/// The 16 scales d_w[o + r][b0 + i] (i < 16, r < valid; 0 elsewhere), as
/// sc[i] with row r in lane r.
inline void q8_panel_scales(const q8_weights& w, std::size_t o, std::size_t valid, std::size_t b0,
                            __m512i (&sc)[16]) noexcept {
  const std::size_t blocks = w.in / q8_block_size, left = std::min<std::size_t>(16, blocks - b0);
  const __mmask16 live = __mmask16((1u << left) - 1);
#pragma GCC unroll 16
  for (std::size_t r = 0; r < 16; ++r) {
    const float* src = w.s + (o + r) * blocks + b0;
    prefetch_l2(src, 16 * blocks * sizeof(float));  // the same row of the next panel
    sc[r] = r < valid ? _mm512_maskz_loadu_epi32(live, src) : _mm512_setzero_si512();
  }
  transpose_16x16_epi32(sc);
}

/// Tokens [0, TN) x W's rows [o, o + valid) (valid <= 16) straight from W's
/// row-major storage, for products of a few tokens (decode), where a
/// transposition into a panel would cost more than the products: one
/// VPDPBUSD per row and 64 values, then the 16 rows' lanes are summed per
/// block in a tree (exact int32) into one vector with the rows in its
/// lanes, and each block's FMA as the GEMM tiles do.
template <std::size_t TN>
inline void q8_rows_direct(const q8_activations& xa, const q8_weights& w, std::size_t t0, std::size_t o,
                           std::size_t valid, float* y, std::size_t y_stride, bool accumulate) noexcept {
  const std::size_t in = w.in, blocks = in / q8_block_size;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  __m512 f[TN];
#pragma GCC unroll 4
  for (std::size_t t = 0; t < TN; ++t) f[t] = _mm512_setzero_ps();
  for (std::size_t b0 = 0; b0 < blocks; b0 += 16) {
    __m512i sc[16];
    q8_panel_scales(w, o, valid, b0, sc);
    for (std::size_t pp = 0; pp < 8 && b0 + 2 * pp < blocks; ++pp) {
      const std::size_t p = b0 / 2 + pp;
      const bool full = 2 * p + 1 < blocks;
      const __mmask64 bytes = full ? ~__mmask64(0) : __mmask64(0xFFFFFFFFu);
      __m512i wv[16];
#pragma GCC unroll 16
      for (std::size_t r = 0; r < 16; ++r) {
        if (r < valid) {
          const std::int8_t* src = w.q + (o + r) * in + 64 * p;
          prefetch_l2(src, q8_panel_rows * in);  // the same row of the next panel
          wv[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, src), bias);
        } else {
          wv[r] = bias;
        }
      }
#pragma GCC unroll 4
      for (std::size_t t = 0; t < TN; ++t) {
        const __m512i xq = _mm512_maskz_loadu_epi8(bytes, xa.row(t0 + t) + 64 * p);
        __m512i a[8], c[4];
#pragma GCC unroll 8
        for (std::size_t i = 0; i < 8; ++i) {
          const __m512i v0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[2 * i], xq);
          const __m512i v1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[2 * i + 1], xq);
          a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
        }
        // c[j], 128-bit lane L, element e: the sum of quarter L of row 4j + e.
#pragma GCC unroll 4
        for (std::size_t j = 0; j < 4; ++j)
          c[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                                  _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]));
        // Quarters 0-1 are block 2p, 2-3 block 2p + 1.
        const __m512i h01 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88), _mm512_shuffle_i32x4(c[0], c[1], 0xDD));
        const __m512i h23 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x88), _mm512_shuffle_i32x4(c[2], c[3], 0xDD));
        const std::int32_t* bs = xa.bias_sums.data() + (t0 + t) * (xa.stride / q8_block_size);
        const __m512i d0 = _mm512_add_epi32(_mm512_shuffle_i32x4(h01, h23, 0x88), _mm512_set1_epi32(bs[2 * p]));
        f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0),
                               _mm512_mul_ps(_mm512_set1_ps(xa.scale(t0 + t, 2 * p)), _mm512_castsi512_ps(sc[2 * pp])),
                               f[t]);
        if (full) {
          const __m512i d1 = _mm512_add_epi32(_mm512_shuffle_i32x4(h01, h23, 0xDD), _mm512_set1_epi32(bs[2 * p + 1]));
          f[t] = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(d1),
              _mm512_mul_ps(_mm512_set1_ps(xa.scale(t0 + t, 2 * p + 1)), _mm512_castsi512_ps(sc[2 * pp + 1])), f[t]);
        }
      }
    }
  }
  const __mmask16 m = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (std::size_t t = 0; t < TN; ++t) {
    float* out = y + (t0 + t) * y_stride + o;
    __m512 v = f[t];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), v);
    _mm512_mask_storeu_ps(out, m, v);
  }
}

/// The GEMM over rows [row_first, row_last) for every token of xa, from the
/// panels `pack(o, valid, u, s)` writes: W's rows [o, o + valid) (valid <=
/// 16) in q8_pack_panel's layout at u, s. Any format whose blocks of 32
/// decode to int8 levels with one f32 scale is a panel source.
template <class Pack>
inline void q8_gemm_rows(const q8_activations& xa, float* y, std::size_t y_stride, bool accumulate,
                         std::size_t row_first, std::size_t row_last, Pack&& pack) {
  constexpr std::size_t RV = q8_gemm_tile_panels;
  const std::size_t in = xa.in, panel_bytes = in * 16, panel_scales = in / q8_block_size * 16;
  thread_local q8_panel_buffer buf;
  if (buf.u.size() < RV * panel_bytes) buf.u.resize(RV * panel_bytes);
  if (buf.s.size() < RV * panel_scales) buf.s.resize(RV * panel_scales);
  for (std::size_t o = row_first; o < row_last; o += RV * q8_panel_rows) {
    const std::size_t rows = std::min(RV * q8_panel_rows, row_last - o);
    const std::size_t panels = (rows + q8_panel_rows - 1) / q8_panel_rows;
    for (std::size_t p = 0; p < panels; ++p)
      pack(o + p * q8_panel_rows, std::min(q8_panel_rows, rows - p * q8_panel_rows), buf.u.data() + p * panel_bytes,
           buf.s.data() + p * panel_scales);
    if (panels == RV) {
      q8_gemm_panels<RV>(xa, buf.u.data(), buf.s.data(), panel_bytes, panel_scales, y, y_stride, accumulate, o, rows);
    } else {
      for (std::size_t p = 0; p < panels; ++p)
        q8_gemm_panels<1>(xa, buf.u.data() + p * panel_bytes, buf.s.data() + p * panel_scales, panel_bytes,
                          panel_scales, y, y_stride, accumulate, o + p * q8_panel_rows,
                          std::min(q8_panel_rows, rows - p * q8_panel_rows));
    }
  }
}

/// matmul_q8_rows on AVX-512 VNNI (xsimd has no VNNI tag: avx512bw stands
/// for it where the build enables VNNI; without, it takes the fallback).
inline void matmul_q8_rows(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last,
                           simd::requires_arch<xsimd::avx512bw>) noexcept {
  if (xa.n < q8_gemm_min_tokens) {
    for (std::size_t o = row_first; o < row_last; o += q8_panel_rows) {
      const std::size_t valid = std::min(q8_panel_rows, row_last - o);
      switch (xa.n) {
        case 1: q8_rows_direct<1>(xa, w, 0, o, valid, y, y_stride, accumulate); break;
        case 2: q8_rows_direct<2>(xa, w, 0, o, valid, y, y_stride, accumulate); break;
        case 3: q8_rows_direct<3>(xa, w, 0, o, valid, y, y_stride, accumulate); break;
        default: break;
      }
    }
    return;
  }
  q8_gemm_rows(xa, y, y_stride, accumulate, row_first, row_last,
               [&](std::size_t o, std::size_t valid, std::uint8_t* u, float* s) { q8_pack_panel(w, o, valid, u, s); });
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
