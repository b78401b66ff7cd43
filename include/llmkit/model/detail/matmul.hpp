// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul.hpp
/// Y = X * W^T (or Y += X * W^T) with row-major f32 X [n, in], W [out, in],
/// the product of every linear layer of the reference model.
///
/// Batch invariant by construction: every output element is one dot product
/// summed in the same order (f32 lanes of the arch, FMA over `in` in steps
/// of the register width, then the horizontal add, then the scalar tail)
/// whatever the batch size, the tile it falls in or the thread that runs it.
/// So a token's logits are bit-identical whether it runs alone, in a packed
/// prefill, or as a decode step, which is what makes "packed == alone"
/// exact. Register tiles of 4 tokens x 4 output rows (16 accumulators) give
/// 2 FMAs per load; W's rows are split in blocks across the executor.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <xsimd/xsimd.hpp>

#include "llmkit/core/executor.hpp"
#include "llmkit/simd/arch.hpp"

namespace llmkit::model::detail {

/// Products below this many multiply-adds run on the calling thread: a
/// thread hand-off costs more than they do.
inline constexpr double matmul_parallel_min_work = 1 << 16;

/// Tokens and output rows per register tile.
inline constexpr std::size_t matmul_tile_tokens = 4;
inline constexpr std::size_t matmul_tile_rows = 4;

/// One tile: tokens [t0, t0 + TN) x rows [o0, o0 + ON).
template <class Arch, std::size_t TN, std::size_t ON>
inline void matmul_tile(const float* x, std::size_t in, const float* w, float* y, std::size_t y_stride,
                        bool accumulate, std::size_t t0, std::size_t o0) noexcept {
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
        const batch wv = batch::load_unaligned(w + (o0 + b) * in + k);
        for (std::size_t a = 0; a < TN; ++a) acc[a][b] = xsimd::fma(xv[a], wv, acc[a][b]);
      }
    }
    for (std::size_t a = 0; a < TN; ++a)
      for (std::size_t b = 0; b < ON; ++b) sums[a][b] = xsimd::hadd(acc[a][b]);
  }
  for (std::size_t a = 0; a < TN; ++a) {
    const float* xr = x + (t0 + a) * in;
    for (std::size_t b = 0; b < ON; ++b) {
      const float* wr = w + (o0 + b) * in;
      float s = sums[a][b];
      for (std::size_t kk = k; kk < in; ++kk) s = std::fma(xr[kk], wr[kk], s);
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + s : s;
    }
  }
}

/// Rows [row_first, row_last) of the product for all n tokens.
template <class Arch, std::size_t TN>
inline void matmul_rows(const float* x, std::size_t in, const float* w, float* y, std::size_t y_stride,
                        bool accumulate, std::size_t t0, std::size_t row_first, std::size_t row_last) noexcept {
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
template <class Arch = simd::default_arch, class Exec>
void matmul(Exec& exec, const float* x, std::size_t n, std::size_t in, const float* w, std::size_t out, float* y,
            std::size_t y_stride, bool accumulate) {
  if (n == 0 || out == 0) return;
  // Row blocks of 64 (a multiple of the tile) keep a block of W hot in L1/L2
  // while every token tile passes over it.
  constexpr std::size_t block_rows = 64;
  const std::size_t n_blocks = (out + block_rows - 1) / block_rows;
  auto body = [&](std::size_t blk) {
    const std::size_t first = blk * block_rows, last = std::min(out, first + block_rows);
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
    for (std::size_t blk = 0; blk < n_blocks; ++blk) body(blk);
    return;
  }
  // Hand each worker a few contiguous blocks: enough tasks to balance, few
  // enough that the hand-off stays cheap.
  const std::size_t n_tasks = std::min(n_blocks, exec.concurrency() * 4);
  exec.parallel_for(n_tasks, [&](std::size_t task) {
    const std::size_t b0 = n_blocks * task / n_tasks, b1 = n_blocks * (task + 1) / n_tasks;
    for (std::size_t blk = b0; blk < b1; ++blk) body(blk);
  });
}

}  // namespace llmkit::model::detail
