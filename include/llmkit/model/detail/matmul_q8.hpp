// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_q8.hpp
/// Y = X * W^T (or Y += X * W^T) for Q8_0 weights W [out, in] with the
/// activations X [n, in] quantised to int8 too: the integer product ggml runs
/// for Q8_0 x Q8_0, here with AVX-512 VNNI.
///
/// Each 32-value block b of a token row x is stored as int8 q_x and one f32
/// scale d_x = amax / 127 (q_x = round(x / d_x), as quantize_q8_0 does), so
///
///     y[t, o] = sum_b d_x[t, b] * d_w[o, b] * sum_{j < 32} q_x[t, 32 b + j] * q_w[o, 32 b + j]
///
/// where the inner sum is exact in int32. The product differs from the exact
/// one of matmul.hpp (f32 activations times the dequantised weights) only by
/// the activations' rounding, at most d_x / 2 per value. In exchange the
/// arithmetic per weight is one int8 multiply-add in a VPDPBUSD (64 per
/// instruction) instead of widen + convert + scale + FMA, so a decode step
/// runs at the int8 weights' memory speed.
///
/// VPDPBUSD multiplies unsigned by signed bytes: the unsigned side is |q_w|
/// (VPABSB, exact for -128 too) and the signed side q_x with the sign of q_w
/// (q_x is in [-127, 127], so negating it is exact). Two blocks fill a
/// 64-byte register; lanes 0-7 sum block 2p, lanes 8-15 block 2p + 1, and
/// the f32 accumulator gets cvt(int32 lanes) * (d_x * d_w) per pair. An odd
/// last block is a pair with zero upper half.
///
/// Batch invariant like matmul.hpp: every output is accumulated in the same
/// order (pairs ascending, then the fixed horizontal-add tree), whatever n,
/// the tile or the thread. Without AVX-512 VNNI the same formula runs as a
/// scalar loop (blocks ascending; a different but equally fixed order).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// Activations X [n, in] quantised to int8 per 32-value block (ggml's Q8_0,
/// `assign`) or per 256-value super-block (ggml's Q8_K, `assign_k`, for
/// the K-quants' integer products). Rows are zero-padded to a whole number
/// of 64-value groups (one 512-bit register of int8), so kernels read whole
/// groups without masks.
struct q8_activations {
  std::size_t n = 0, in = 0;
  std::size_t block = 32;         ///< values per scale: 32 (assign) or 256 (assign_k)
  std::size_t stride = 0;         ///< in rounded up to a multiple of 64
  aligned_vector<std::int8_t> q;  ///< [n, stride] int8 values (0 in the padding)
  aligned_vector<float> d;        ///< [n, pairs, 16]: lanes 0-7 the scale of the 32 values 64p.., 8-15 of the next 32 (0 past the end)
  aligned_vector<std::int16_t> sums16;  ///< assign_k: [n, stride / 16] the sum of each 16 consecutive q
  /// For products with weights stored as unsigned integers minus an
  /// offset (model/detail/matmul_blocks_q8.hpp), filled by `assign_sums`:
  aligned_vector<std::int32_t> offset_sums;  ///< [n, stride / 4]: -offset * the sum of each 4 consecutive q
  aligned_vector<float> block_sums;          ///< [n, stride / 32]: each block's scale * the sum of its q
  int sums_offset = -1;                      ///< the offset offset_sums holds (-1: none yet)

  std::size_t pairs() const noexcept { return stride / 64; }
  const std::int8_t* row(std::size_t t) const noexcept { return q.data() + t * stride; }
  const float* pair_scales(std::size_t t, std::size_t p) const noexcept { return d.data() + (t * pairs() + p) * 16; }
  float scale(std::size_t t, std::size_t b) const noexcept { return pair_scales(t, b / 2)[(b % 2) * 8]; }

  /// Super-block i's scale of token t (assign_k).
  float k_scale(std::size_t t, std::size_t i) const noexcept { return pair_scales(t, 4 * i)[0]; }

  /// Quantises x [n, in] per 256 values (scale amax / 127, as assign per
  /// 32); every lane of d holds its super-block's scale. @pre in % 256 == 0
  template <class Arch>
  void assign_k(const float* x, std::size_t n_tokens, std::size_t width) {
    n = n_tokens;
    in = width;
    block = 256;
    stride = in;
    q.resize(n * stride);
    d.resize(n * pairs() * 16);
    sums16.resize(n * stride / 16);
    sums_offset = -1;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < in / 256; ++i) {
        const float* xb = x + t * in + i * 256;
        std::int8_t* qb = q.data() + t * stride + i * 256;
        bool finite = true;
        const float amax = simd::detail::abs_max<Arch>(xb, 256, finite);
        float scale = amax / 127.0f;
        if (finite) {
          simd::detail::quantize_round<Arch>(xb, 256, scale != 0.0f ? 1.0f / scale : 0.0f, qb);
        } else {  // a NaN scale: the outputs are NaN, as the f32 product's would be
          std::fill_n(qb, 256, std::int8_t{0});
          scale = std::numeric_limits<float>::quiet_NaN();
        }
        std::fill_n(d.data() + (t * pairs() + 4 * i) * 16, 64, scale);
        for (std::size_t j = 0; j < 16; ++j) {
          int sum = 0;
          for (std::size_t k = 0; k < 16; ++k) sum += qb[16 * j + k];
          sums16[(t * stride + i * 256) / 16 + j] = static_cast<std::int16_t>(sum);
        }
      }
  }

  /// Quantises x [n, in] per 32 values. @pre in % 32 == 0
  template <class Arch>
  void assign(const float* x, std::size_t n_tokens, std::size_t width) {
    n = n_tokens;
    in = width;
    block = 32;
    stride = (in + 63) / 64 * 64;
    q.assign(n * stride, std::int8_t{0});
    d.assign(n * pairs() * 16, 0.0f);
    sums_offset = -1;
    const std::size_t blocks = in / q8_block_size;
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t b = 0; b < blocks; ++b) {
        const float* xb = x + t * in + b * q8_block_size;
        std::int8_t* qb = q.data() + t * stride + b * q8_block_size;
        bool finite = true;
        const float amax = simd::detail::block_abs_max<Arch>(xb, finite);
        float scale = amax / 127.0f;
        if (finite) {
          simd::detail::block_quantize<Arch>(xb, scale != 0.0f ? 1.0f / scale : 0.0f, qb);
        } else {  // a NaN scale: the block's outputs are NaN, as the f32 product's would be
          std::fill_n(qb, q8_block_size, std::int8_t{0});
          scale = std::numeric_limits<float>::quiet_NaN();
        }
        std::fill_n(d.data() + (t * pairs() + b / 2) * 16 + (b % 2) * 8, 8, scale);
      }
    }
  }

  /// Fills offset_sums for `offset` and block_sums (once per assign).
  void assign_sums(int offset) {
    if (sums_offset == offset) return;
    sums_offset = offset;
    offset_sums.resize(n * stride / 4);
    block_sums.resize(n * stride / 32);
    for (std::size_t t = 0; t < n; ++t) {
      const std::int8_t* qt = row(t);
      for (std::size_t l = 0; l < stride / 4; ++l)
        offset_sums[t * stride / 4 + l] = -offset * (int(qt[4 * l]) + qt[4 * l + 1] + qt[4 * l + 2] + qt[4 * l + 3]);
      for (std::size_t b = 0; b < stride / 32; ++b) {
        int sum = 0;
        for (std::size_t j = 0; j < 32; ++j) sum += qt[32 * b + j];
        block_sums[t * stride / 32 + b] = scale(t, b) * float(sum);
      }
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

/// Folds pair p (blocks 2p, 2p + 1; only 2p when !Full) of tokens
/// [t0, t0 + TN) x rows [o0, o0 + ON) into acc.
template <std::size_t TN, std::size_t ON, bool Full>
inline void matmul_q8_pair(const q8_activations& xa, const q8_weights& w, std::size_t t0, std::size_t o0,
                           std::size_t p, __m512 (&acc)[TN][ON]) noexcept {
  const std::size_t in = xa.in, blocks = in / q8_block_size, k = p * 2 * q8_block_size;
  const __mmask64 bytes = Full ? ~__mmask64(0) : __mmask64(0xFFFFFFFFu);
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512i aw[ON];
  __mmask64 neg[ON];
  __m512 dw[ON];
  #pragma GCC unroll 16
  for (std::size_t b = 0; b < ON; ++b) {
    const std::int8_t* wp = w.q + (o0 + b) * in + k;
    const float* sp = w.s + (o0 + b) * blocks + 2 * p;
    prefetch_l2(wp, matmul_prefetch_bytes);
    prefetch_l2(sp, matmul_prefetch_bytes / 8);
    const __m512i wq = Full ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8(bytes, wp);
    aw[b] = _mm512_abs_epi8(wq);
    neg[b] = _mm512_movepi8_mask(wq);
    const __m128 s2 = Full ? _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp))) : _mm_load_ss(sp);
    dw[b] = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(s2));
  }
  #pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a) {
    const std::int8_t* xp = xa.row(t0 + a) + k;
    const __m512i xq = Full ? _mm512_loadu_si512(xp) : _mm512_maskz_loadu_epi8(bytes, xp);
    const __m512 dx = _mm512_load_ps(xa.pair_scales(t0 + a, p));
    #pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) {
      const __m512i sx = _mm512_mask_sub_epi8(xq, neg[b], _mm512_setzero_si512(), xq);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw[b], sx);
      acc[a][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx, dw[b]), acc[a][b]);
    }
  }
}

/// One tile: tokens [t0, t0 + TN) x rows [o0, o0 + ON).
template <std::size_t TN, std::size_t ON>
inline void matmul_q8_tile(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  static_assert(TN * ON <= 16);
  const std::size_t blocks = xa.in / q8_block_size;
  __m512 acc[TN][ON];
  #pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a)
    #pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) acc[a][b] = _mm512_setzero_ps();
  for (std::size_t p = 0; p < blocks / 2; ++p) matmul_q8_pair<TN, ON, true>(xa, w, t0, o0, p, acc);
  if (blocks % 2 != 0) matmul_q8_pair<TN, ON, false>(xa, w, t0, o0, blocks / 2, acc);
  float sums[TN][ON];
  reduce_tile16(acc, sums);
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) {
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + sums[a][b] : sums[a][b];
    }
}

/// Output rows [o, o + ON) for every token: tiles of up to 4 tokens while
/// the strip's int8 rows stay in L1.
template <std::size_t ON>
inline void matmul_q8_strip(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                            bool accumulate, std::size_t o) noexcept {
  std::size_t t = 0;
  for (; t + 4 <= xa.n; t += 4) matmul_q8_tile<4, ON>(xa, w, y, y_stride, accumulate, t, o);
  switch (xa.n - t) {
    case 3: matmul_q8_tile<3, ON>(xa, w, y, y_stride, accumulate, t, o); break;
    case 2: matmul_q8_tile<2, ON>(xa, w, y, y_stride, accumulate, t, o); break;
    case 1: matmul_q8_tile<1, ON>(xa, w, y, y_stride, accumulate, t, o); break;
    default: break;
  }
}

/// matmul_q8_rows on AVX-512 VNNI (xsimd has no VNNI tag: avx512bw stands
/// for it where the build enables VNNI; without, it takes the fallback).
inline void matmul_q8_rows(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last,
                           simd::requires_arch<xsimd::avx512bw>) noexcept {
  std::size_t o = row_first;
  for (; o + 4 <= row_last; o += 4) matmul_q8_strip<4>(xa, w, y, y_stride, accumulate, o);
  switch (row_last - o) {
    case 3: matmul_q8_strip<3>(xa, w, y, y_stride, accumulate, o); break;
    case 2: matmul_q8_strip<2>(xa, w, y, y_stride, accumulate, o); break;
    case 1: matmul_q8_strip<1>(xa, w, y, y_stride, accumulate, o); break;
    default: break;
  }
}
#endif

/// Rows [row_first, row_last) of y for every token of xa on an arch, one
/// overload per xsimd tag; this scalar loop is the fallback.
inline void matmul_q8_rows(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last,
                           simd::requires_arch<xsimd::generic>) noexcept {
  const std::size_t in = xa.in, blocks = in / q8_block_size;
  for (std::size_t t = 0; t < xa.n; ++t)
    for (std::size_t o = row_first; o < row_last; ++o) {
      float s = 0.0f;
      for (std::size_t b = 0; b < blocks; ++b) {
        std::int32_t dot = 0;
        for (std::size_t j = 0; j < q8_block_size; ++j)
          dot += std::int32_t(xa.row(t)[b * q8_block_size + j]) * std::int32_t(w.q[o * in + b * q8_block_size + j]);
        s = std::fma(float(dot), xa.scale(t, b) * w.s[o * blocks + b], s);
      }
      float& out = y[t * y_stride + o];
      out = accumulate ? out + s : s;
    }
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
