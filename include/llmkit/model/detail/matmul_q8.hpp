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
/// instruction) instead of widen + convert + scale + FMA.
///
/// Every kernel sums an output in one order: the blocks ascending, each
/// block's exact int32 sum converted and added with one FMA,
///
///     y[t, o] = fma(float(sum_j q_x q_w), d_x[t, b] * d_w[o, b], y[t, o]),
///
/// so the product is batch, thread and arch invariant: the AVX-512 VNNI
/// GEMM (matmul_q8_vnni.hpp) gives the bits of the scalar loop below,
/// which is the fallback on every other arch.

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
  aligned_vector<std::int32_t> bias_sums;  ///< assign: [n, stride / 32] -128 * the sum of each block's q
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
    bias_sums.assign(n * stride / q8_block_size, 0);
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
        int sum = 0;
        for (std::size_t j = 0; j < q8_block_size; ++j) sum += qb[j];
        bias_sums[t * stride / q8_block_size + b] = -128 * sum;
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
