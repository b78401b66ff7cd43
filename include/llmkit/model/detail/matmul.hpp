// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul.hpp
/// Y = X * W^T (or Y += X * W^T) with row-major f32 activations X [n, in]
/// and a weight matrix W [out, in] stored as f32, f16 or Q8_0 (the product
/// of every linear layer of the reference model; see model/weights.hpp).
///
/// The weights are read through an accessor that widens `lanes` of them to
/// f32 registers (f16: VCVTPH2PS; Q8_0: sign-extend the int8 values, convert,
/// times the block's scale, which is exact in f32), so one register-tiled
/// FMA kernel serves every storage type, and each W load is shared by the
/// tile's tokens.
///
/// Batch invariant by construction: every output element is one dot product
/// summed in the same order (f32 lanes of the arch, FMA over `in` in steps
/// of the register width, then one fixed horizontal-add tree, then the
/// scalar tail)
/// whatever the batch size, the tile it falls in or the thread that runs it.
/// So a token's logits are bit-identical whether it runs alone, in a packed
/// prefill, or as a decode step. Register tiles of 4 tokens x 4 output rows
/// (16 accumulators) give 2 FMAs per load; a single token (decode) runs
/// 1 x 4 tiles, a matrix-vector product that streams W once. W's rows are
/// split in blocks across the executor when the product is large enough.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <xsimd/xsimd.hpp>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "llmkit/core/dtype.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// Products below this many multiply-adds run on the calling thread: waking
/// a worker (~5-20 us) costs more than they do. 2^16 multiply-adds of f32
/// weights is 256 KiB of W, ~25 us at one core's DRAM bandwidth.
inline constexpr double matmul_parallel_min_work = 1 << 16;

/// Tokens and output rows per register tile.
inline constexpr std::size_t matmul_tile_tokens = 4;
inline constexpr std::size_t matmul_tile_rows = 4;

/// f32 weights: row o at w + o * in.
struct f32_weights {
  const float* w;
  std::size_t in;
  template <class Arch>
  xsimd::batch<float, Arch> load(std::size_t o, std::size_t k) const noexcept {
    return xsimd::batch<float, Arch>::load_unaligned(w + o * in + k);
  }
  float at(std::size_t o, std::size_t k) const noexcept { return w[o * in + k]; }
};

/// f16 weights (bit patterns): row o at w + o * in.
struct f16_weights {
  const std::uint16_t* w;
  std::size_t in;
  template <class Arch>
  xsimd::batch<float, Arch> load(std::size_t o, std::size_t k) const noexcept {
    return simd::detail::load_f16_as_f32<Arch>(w + o * in + k);
  }
  float at(std::size_t o, std::size_t k) const noexcept { return f16_bits_to_f32(w[o * in + k]); }
};

/// Q8_0 weights: int8 values q [out, in] and one f32 scale per 32 of them,
/// s [out, in / 32]; value = s * q (exact in f32). @pre in % 32 == 0, so
/// register widths (4, 8, 16 lanes) never straddle a block.
struct q8_weights {
  const std::int8_t* q;
  const float* s;
  std::size_t in;
  template <class Arch>
  xsimd::batch<float, Arch> load(std::size_t o, std::size_t k) const noexcept {
    using batch = xsimd::batch<float, Arch>;
    const batch scale(s[(o * in + k) / q8_block_size]);
    return xsimd::batch_cast<float>(simd::detail::load_i8_as_i32<Arch>(q + o * in + k)) * scale;
  }
  float at(std::size_t o, std::size_t k) const noexcept {
    return s[(o * in + k) / q8_block_size] * static_cast<float>(q[o * in + k]);
  }
};


/// One tile: tokens [t0, t0 + TN) x rows [o0, o0 + ON).
template <class Arch, std::size_t TN, std::size_t ON, class W>
inline void matmul_tile(const float* x, std::size_t in, const W& w, float* y, std::size_t y_stride, bool accumulate,
                        std::size_t t0, std::size_t o0) noexcept {
  float sums[TN][ON];
  std::size_t k = 0;
  if constexpr (simd::is_scalar_v<Arch>) {
    for (std::size_t a = 0; a < TN; ++a)
      for (std::size_t b = 0; b < ON; ++b) sums[a][b] = 0.0f;
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    batch acc[TN][ON];
    for (std::size_t a = 0; a < TN; ++a)
      for (std::size_t b = 0; b < ON; ++b) acc[a][b] = batch(0.0f);
    for (; k + lanes <= in; k += lanes) {
      batch xv[TN];
      for (std::size_t a = 0; a < TN; ++a) xv[a] = batch::load_unaligned(x + (t0 + a) * in + k);
      for (std::size_t b = 0; b < ON; ++b) {
        const batch wv = w.template load<Arch>(o0 + b, k);
        for (std::size_t a = 0; a < TN; ++a) acc[a][b] = xsimd::fma(xv[a], wv, acc[a][b]);
      }
    }
#if defined(__AVX512F__)
    if constexpr (batch::size == 16 && TN * ON <= 16) {
      __m512 r[16];
      for (std::size_t i = 0; i < 16; ++i) r[i] = _mm512_setzero_ps();
      for (std::size_t a = 0; a < TN; ++a)
        for (std::size_t b = 0; b < ON; ++b) r[a * ON + b] = acc[a][b];
      alignas(64) float s16[16];
      // attention's fixed tree: every register is reduced in the same order
      // whatever its slot, so an output does not depend on its tile.
      _mm512_store_ps(s16, attention::detail::haddp16(r));
      for (std::size_t a = 0; a < TN; ++a)
        for (std::size_t b = 0; b < ON; ++b) sums[a][b] = s16[a * ON + b];
    } else
#endif
    {
      for (std::size_t a = 0; a < TN; ++a)
        for (std::size_t b = 0; b < ON; ++b) sums[a][b] = xsimd::hadd(acc[a][b]);
    }
  }
  for (std::size_t a = 0; a < TN; ++a) {
    const float* xr = x + (t0 + a) * in;
    for (std::size_t b = 0; b < ON; ++b) {
      float s = sums[a][b];
      for (std::size_t kk = k; kk < in; ++kk) s = std::fma(xr[kk], w.at(o0 + b, kk), s);
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + s : s;
    }
  }
}

/// Rows [row_first, row_last) of the product for tokens [t0, t0 + TN).
template <class Arch, std::size_t TN, class W>
inline void matmul_rows(const float* x, std::size_t in, const W& w, float* y, std::size_t y_stride, bool accumulate,
                        std::size_t t0, std::size_t row_first, std::size_t row_last) noexcept {
  std::size_t o = row_first;
  for (; o + matmul_tile_rows <= row_last; o += matmul_tile_rows)
    matmul_tile<Arch, TN, matmul_tile_rows>(x, in, w, y, y_stride, accumulate, t0, o);
  switch (row_last - o) {
    case 3: matmul_tile<Arch, TN, 3>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 2: matmul_tile<Arch, TN, 2>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 1: matmul_tile<Arch, TN, 1>(x, in, w, y, y_stride, accumulate, t0, o); break;
    default: break;
  }
}

/// `[n, out] y (row stride y_stride) (+)= [n, in] x * ([out, in] w)^T`.
template <class Arch = simd::default_arch, class Exec, class W>
void matmul(Exec& exec, const float* x, std::size_t n, std::size_t in, const W& w, std::size_t out, float* y,
            std::size_t y_stride, bool accumulate) {
  if (n == 0 || out == 0) return;
  // Row blocks of 64 (a multiple of the tile) keep a block of W hot in L1/L2
  // while every token tile passes over it.
  constexpr std::size_t block_rows = 64;
  const std::size_t n_blocks = (out + block_rows - 1) / block_rows;
  auto body = [&](std::size_t first, std::size_t last) {
    std::size_t t = 0;
    for (; t + matmul_tile_tokens <= n; t += matmul_tile_tokens)
      matmul_rows<Arch, matmul_tile_tokens>(x, in, w, y, y_stride, accumulate, t, first, last);
    switch (n - t) {
      case 3: matmul_rows<Arch, 3>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      case 2: matmul_rows<Arch, 2>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      case 1: matmul_rows<Arch, 1>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      default: break;
    }
  };
  const double work = double(n) * double(in) * double(out);
  if (exec.concurrency() <= 1 || n_blocks == 1 || work < matmul_parallel_min_work) {
    if (n <= matmul_tile_tokens) {
      body(0, out);  // one pass over W
    } else {
      for (std::size_t blk = 0; blk < n_blocks; ++blk) body(blk * block_rows, std::min(out, (blk + 1) * block_rows));
    }
    return;
  }
  // A matrix-vector product (decode) is one stream over W: one contiguous
  // share of the rows per thread, so each hand-off moves the most bytes.
  // Larger products take a few blocks per task to balance.
  const std::size_t n_tasks =
      n <= matmul_tile_tokens ? std::min(n_blocks, exec.concurrency()) : std::min(n_blocks, exec.concurrency() * 4);
  exec.parallel_for(n_tasks, [&](std::size_t task) {
    const std::size_t b0 = n_blocks * task / n_tasks, b1 = n_blocks * (task + 1) / n_tasks;
    if (n <= matmul_tile_tokens) {
      body(b0 * block_rows, std::min(out, b1 * block_rows));
    } else {
      for (std::size_t blk = b0; blk < b1; ++blk) body(blk * block_rows, std::min(out, (blk + 1) * block_rows));
    }
  });
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
