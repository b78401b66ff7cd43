// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_panels.hpp
/// Y = X * W^T (or Y += X * W^T) for f32 weights stored in panels of 64
/// output rows, the product of every f32 matrix of the reference model.
///
/// Panel layout: W [out, in] is kept as ceil(out / 64) panels of [in, 64]:
/// element (o, k) at `w[(o / 64) * in * 64 + k * 64 + o % 64]`, the rows of
/// the last panel past `out` zero. One step k of a panel is 64 consecutive
/// floats (four AVX-512 registers) holding W[o0 .. o0 + 63][k], so the kernel
/// is an outer product: each token's x[t][k] is broadcast and multiply-added
/// into 64 outputs at once, with no horizontal reduction at the end and the
/// token values read as scalars from L1.
///
///     for each panel (64 outputs; in x 64 floats, contiguous):
///       for each tile of TN tokens (6 on AVX-512: 24 accumulators):
///         for k in [0, in):  acc[t][0..3] += broadcast(x[t][k]) * panel[k][0..63]
///
/// A prefill streams a panel (192 KiB at in = 768) from L2 for every token
/// tile; a decode step streams the whole matrix once, in address order, with
/// software prefetch 32 KiB ahead. Unlike the dot-product tiles of
/// matmul.hpp, no output is reduced horizontally (figures in docs/model.md).
///
/// Batch invariant and arch invariant: every output is
/// `fma(x[k], w[k], acc)` for k = 0, 1, ..., in - 1 from acc = 0 (then added
/// to y when accumulating), in one lane, whatever n, the tile, the thread or
/// the register width (the scalar path runs the same std::fma chain).

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// Output rows per panel: the f32 weights' storage layout (four AVX-512
/// registers per step k), so not in model/tuning.hpp.
inline constexpr std::size_t matmul_panel_rows = 64;

/// Floats a panel-packed [rows, cols] matrix occupies (rows rounded up to
/// whole panels).
constexpr std::size_t panel_storage_size(std::size_t rows, std::size_t cols) noexcept {
  return (rows + matmul_panel_rows - 1) / matmul_panel_rows * matmul_panel_rows * cols;
}

/// Index of element (o, k) of a panel-packed matrix with `cols` columns.
constexpr std::size_t panel_index(std::size_t o, std::size_t k, std::size_t cols) noexcept {
  return (o / matmul_panel_rows) * cols * matmul_panel_rows + k * matmul_panel_rows + o % matmul_panel_rows;
}

/// f32 weights in panels: see the file comment. `in` = columns.
struct f32_panels {
  const float* w;
  std::size_t in;
};

/// Tokens per register tile: 24 accumulators of the 32 AVX-512 registers
/// (fewer on narrower archs, whose 64-output panel needs more registers).
template <class Arch>
inline constexpr std::size_t panel_tile_tokens =
    simd::is_scalar_v<Arch> ? 1 : std::max<std::size_t>(1, 24 / (matmul_panel_rows / xsimd::batch<float, Arch>::size));

/// Tokens [t0, t0 + TN) x the panel starting at output row o0 (`valid` of
/// its 64 rows exist).
template <class Arch, std::size_t TN, bool Prefetch>
inline void panel_tile(const float* x, std::size_t in, const float* panel, float* y, std::size_t y_stride,
                       bool accumulate, std::size_t t0, std::size_t o0, std::size_t valid) noexcept {
  constexpr std::size_t P = matmul_panel_rows;
  alignas(64) float out[TN][P];
  if constexpr (simd::is_scalar_v<Arch>) {
    for (std::size_t a = 0; a < TN; ++a) {
      for (std::size_t j = 0; j < P; ++j) out[a][j] = 0.0f;
      const float* xr = x + (t0 + a) * in;
      for (std::size_t k = 0; k < in; ++k)
        for (std::size_t j = 0; j < P; ++j) out[a][j] = std::fma(xr[k], panel[k * P + j], out[a][j]);
    }
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t R = P / batch::size;  // registers per panel step
    batch acc[TN][R];
    for (std::size_t a = 0; a < TN; ++a)
      for (std::size_t r = 0; r < R; ++r) acc[a][r] = batch(0.0f);
    const float* xr[TN];
    for (std::size_t a = 0; a < TN; ++a) xr[a] = x + (t0 + a) * in;
    for (std::size_t k = 0; k < in; ++k) {
      const float* wk = panel + k * P;
      if constexpr (Prefetch)
        for (std::size_t line = 0; line < P * sizeof(float); line += 64) prefetch_l2(reinterpret_cast<const char*>(wk) + line, matmul_prefetch_bytes);
      batch wv[R];
      for (std::size_t r = 0; r < R; ++r) wv[r] = batch::load_aligned(wk + r * batch::size);
      for (std::size_t a = 0; a < TN; ++a) {
        const batch xv(xr[a][k]);
        for (std::size_t r = 0; r < R; ++r) acc[a][r] = xsimd::fma(xv, wv[r], acc[a][r]);
      }
    }
    for (std::size_t a = 0; a < TN; ++a)
      for (std::size_t r = 0; r < R; ++r) acc[a][r].store_aligned(out[a] + r * batch::size);
  }
  for (std::size_t a = 0; a < TN; ++a) {
    float* yr = y + (t0 + a) * y_stride + o0;
    if (accumulate)
      for (std::size_t j = 0; j < valid; ++j) yr[j] += out[a][j];
    else
      std::copy_n(out[a], valid, yr);
  }
}

/// The last m < M + 1 tokens [t0, t0 + m) of a panel as one tile.
template <class Arch, bool Prefetch, std::size_t M>
inline void panel_rest(const float* x, std::size_t m, std::size_t in, const float* panel, float* y,
                       std::size_t y_stride, bool accumulate, std::size_t t0, std::size_t o0, std::size_t valid) noexcept {
  if constexpr (M > 0) {
    if (m == M) return panel_tile<Arch, M, Prefetch>(x, in, panel, y, y_stride, accumulate, t0, o0, valid);
    panel_rest<Arch, Prefetch, M - 1>(x, m, in, panel, y, y_stride, accumulate, t0, o0, valid);
  }
}

/// Panels [p0, p1) for every token.
template <class Arch, bool Prefetch>
inline void panel_range(const float* x, std::size_t n, std::size_t in, const f32_panels& w, std::size_t out, float* y,
                        std::size_t y_stride, bool accumulate, std::size_t p0, std::size_t p1) noexcept {
  constexpr std::size_t P = matmul_panel_rows, TN = panel_tile_tokens<Arch>;
  for (std::size_t p = p0; p < p1; ++p) {
    const float* panel = w.w + p * in * P;
    const std::size_t o0 = p * P, valid = std::min(P, out - o0);
    std::size_t t = 0;
    for (; t + TN <= n; t += TN) panel_tile<Arch, TN, Prefetch>(x, in, panel, y, y_stride, accumulate, t, o0, valid);
    panel_rest<Arch, Prefetch, TN - 1>(x, n - t, in, panel, y, y_stride, accumulate, t, o0, valid);
  }
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
