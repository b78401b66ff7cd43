// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul.hpp
/// Y = X * W^T (or Y += X * W^T) with row-major f32 activations X [n, in]
/// and a row-major weight matrix W [out, in] stored as f16 or Q8_0 (f32
/// matrices are panel-packed: model/detail/matmul_panels.hpp; see
/// model/weights.hpp).
///
/// The weights are read through an accessor that widens `lanes` of them to
/// f32 registers (f16: VCVTPH2PS; Q8_0: sign-extend the int8 values, convert,
/// times the block's scale, which is exact in f32), so one register-tiled
/// FMA kernel serves both storage types, and each W load is shared by the
/// tile's tokens.
///
/// Batch invariant by construction: every output element is one dot product
/// summed in the same order (f32 lanes of the arch, FMA over `in` in steps
/// of the register width, then one fixed horizontal-add tree, then the
/// scalar tail)
/// whatever the batch size, the tile it falls in or the thread that runs it.
/// So a token's logits are bit-identical whether it runs alone, in a packed
/// prefill, or as a decode step. Register tiles of 4 tokens x 6 output rows
/// (24 accumulators) give 2.4 FMAs per load. Products of up to
/// matmul_stream_max_tokens tokens (decode steps, speculative verification,
/// continuous batches) stream W once, strip by strip, with software
/// prefetch; a single token runs 1 x 4 tiles, 5-8 tokens one n x 2 tile,
/// 9-32 tokens 4 x 6 tiles over each 6-row strip.
/// W's rows are split across the executor when the product is large enough.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/dtype.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"
#include "llmkit/simd/detail/hadd16.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// Tokens and output rows per register tile of a compute-bound product
/// (prefill, and streaming products of more than 8 tokens): 4 x 6 = 24
/// accumulators + 4 token registers + 1 weight register of the 32 AVX-512
/// registers, 2.4 FMAs per load (a 4 x 4 tile reaches only 2). Set by the
/// register file and the tail cases below, so not in model/tuning.hpp.
inline constexpr std::size_t matmul_tile_tokens = 4;
inline constexpr std::size_t matmul_tile_rows = 6;
/// Output rows per tile of a streaming product of at most 4 tokens.
inline constexpr std::size_t matmul_stream_rows = 4;
static_assert(matmul_tile_tokens == 4 && matmul_tile_rows == 6 && matmul_stream_rows == 4,
              "the tail cases of matmul_rows, matmul_strip and matmul_stream are written for these tiles");

/// Asks for the cache line `bytes_ahead` past p in L2. A hint: it never
/// faults, so it may point past the end of W (the address is formed as an
/// integer, not by pointer arithmetic beyond the array).
inline void prefetch_l2(const void* p, std::size_t bytes_ahead) noexcept {
#if defined(__SSE__)
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + bytes_ahead), _MM_HINT_T1);
#else
  (void)p;
  (void)bytes_ahead;
#endif
}

/// Asks for every 64-byte cache line of [address, address + bytes) in L2:
/// a product whose rows are shorter than the hardware prefetcher's ramp
/// (the 4- to 6-bit formats: ~1-2 KiB per row) prefetches all the bytes it
/// will read, not one line per block. A hint, as prefetch_l2.
inline void prefetch_lines_l2(std::uintptr_t address, std::size_t bytes) noexcept {
  for (std::size_t line = 0; line < bytes; line += 64) prefetch_l2(reinterpret_cast<const void*>(address + line), 0);
}

/// f16 weights (bit patterns): row o at w + o * in.
struct f16_weights {
  const std::uint16_t* w;
  std::size_t in;
  template <class Arch>
  xsimd::batch<float, Arch> load(std::size_t o, std::size_t k) const noexcept {
    return simd::detail::load_f16_as_f32<Arch>(w + o * in + k, Arch{});
  }
  float at(std::size_t o, std::size_t k) const noexcept { return f16_bits_to_f32(w[o * in + k]); }
  void prefetch(std::size_t o, std::size_t k) const noexcept { prefetch_l2(w + o * in + k, matmul_prefetch_bytes); }
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
    return xsimd::batch_cast<float>(simd::detail::load_i8_as_i32<Arch>(q + o * in + k, Arch{})) * scale;
  }
  float at(std::size_t o, std::size_t k) const noexcept {
    return s[(o * in + k) / q8_block_size] * static_cast<float>(q[o * in + k]);
  }
  void prefetch(std::size_t o, std::size_t k) const noexcept {
    prefetch_l2(q + o * in + k, matmul_prefetch_bytes);
    if ((o * in + k) % (16 * q8_block_size) == 0) prefetch_l2(s + (o * in + k) / q8_block_size, matmul_prefetch_bytes / 8);
  }
};

/// sums[a][b] = the horizontal sum of matmul_tile's register acc[a][b], one
/// overload per instruction set (`reduce_tile(acc, sums, Arch{})`): xsimd's
/// hadd per register, or on AVX-512 reduce_tile16's one tree for all.
template <class Arch, std::size_t TN, std::size_t ON>
inline void reduce_tile(const xsimd::batch<float, Arch> (&acc)[TN][ON], float (&sums)[TN][ON],
                        simd::requires_arch<xsimd::generic>) noexcept {
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) sums[a][b] = xsimd::hadd(acc[a][b]);
}

#if defined(__AVX512F__)
/// sums[a][b] = the horizontal sum of the 16-lane register acc[a][b], all
/// through one fixed tree (simd::detail::haddp16, on groups of 16 registers):
/// every register is reduced in the same order whatever its slot, so an
/// output does not depend on its tile. V: __m512 or an AVX-512 xsimd batch.
template <std::size_t TN, std::size_t ON, class V>
inline void reduce_tile16(const V (&acc)[TN][ON], float (&sums)[TN][ON]) noexcept {
  constexpr std::size_t G = (TN * ON + 15) / 16;
  __m512 r[G][16];
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t i = 0; i < 16; ++i) r[g][i] = _mm512_setzero_ps();
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) r[(a * ON + b) / 16][(a * ON + b) % 16] = acc[a][b];
  alignas(64) float s16[G][16];
  for (std::size_t g = 0; g < G; ++g) _mm512_store_ps(s16[g], simd::detail::haddp16(r[g]));
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) sums[a][b] = s16[(a * ON + b) / 16][(a * ON + b) % 16];
}

template <class Arch, std::size_t TN, std::size_t ON>
inline void reduce_tile(const xsimd::batch<float, Arch> (&acc)[TN][ON], float (&sums)[TN][ON],
                        simd::requires_arch<xsimd::avx512f>) noexcept {
  reduce_tile16(acc, sums);
}
#endif

/// One tile: tokens [t0, t0 + TN) x rows [o0, o0 + ON). `Prefetch`: ask for
/// W's rows matmul_prefetch_bytes ahead (streaming products).
template <class Arch, std::size_t TN, std::size_t ON, class W, bool Prefetch = false>
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
        if constexpr (Prefetch) w.prefetch(o0 + b, k);
        const batch wv = w.template load<Arch>(o0 + b, k);
        for (std::size_t a = 0; a < TN; ++a) acc[a][b] = xsimd::fma(xv[a], wv, acc[a][b]);
      }
    }
    reduce_tile(acc, sums, Arch{});
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
    case 5: matmul_tile<Arch, TN, 5>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 4: matmul_tile<Arch, TN, 4>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 3: matmul_tile<Arch, TN, 3>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 2: matmul_tile<Arch, TN, 2>(x, in, w, y, y_stride, accumulate, t0, o); break;
    case 1: matmul_tile<Arch, TN, 1>(x, in, w, y, y_stride, accumulate, t0, o); break;
    default: break;
  }
}

/// Output rows [o, o + ON) for all n tokens, W streaming (prefetched): one
/// tile of n x 2 when 5 <= n <= 8 (ON == 2, up to 16 accumulators), else
/// tiles of 4 tokens (the strip's W stays in L1 while they pass over it).
template <class Arch, std::size_t ON, class W>
inline void matmul_strip(const float* x, std::size_t n, std::size_t in, const W& w, float* y, std::size_t y_stride,
                         bool accumulate, std::size_t o) noexcept {
  if constexpr (ON <= 2) {
    switch (n) {
      case 5: return matmul_tile<Arch, 5, ON, W, true>(x, in, w, y, y_stride, accumulate, 0, o);
      case 6: return matmul_tile<Arch, 6, ON, W, true>(x, in, w, y, y_stride, accumulate, 0, o);
      case 7: return matmul_tile<Arch, 7, ON, W, true>(x, in, w, y, y_stride, accumulate, 0, o);
      case 8: return matmul_tile<Arch, 8, ON, W, true>(x, in, w, y, y_stride, accumulate, 0, o);
      default: break;
    }
  }
  std::size_t t = 0;
  for (; t + matmul_tile_tokens <= n; t += matmul_tile_tokens)
    matmul_tile<Arch, matmul_tile_tokens, ON, W, true>(x, in, w, y, y_stride, accumulate, t, o);
  switch (n - t) {
    case 3: matmul_tile<Arch, 3, ON, W, true>(x, in, w, y, y_stride, accumulate, t, o); break;
    case 2: matmul_tile<Arch, 2, ON, W, true>(x, in, w, y, y_stride, accumulate, t, o); break;
    case 1: matmul_tile<Arch, 1, ON, W, true>(x, in, w, y, y_stride, accumulate, t, o); break;
    default: break;
  }
}

/// Rows [row_first, row_last) of a streaming product (n <=
/// matmul_stream_max_tokens): W is read from memory once, strip by strip.
template <class Arch, class W>
inline void matmul_stream(const float* x, std::size_t n, std::size_t in, const W& w, float* y, std::size_t y_stride,
                          bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  std::size_t o = row_first;
  if (n >= 5 && n <= 8) {
    for (; o + 2 <= row_last; o += 2) matmul_strip<Arch, 2>(x, n, in, w, y, y_stride, accumulate, o);
    if (o < row_last) matmul_strip<Arch, 1>(x, n, in, w, y, y_stride, accumulate, o);
    return;
  }
  if (n > matmul_tile_tokens) {  // 9-32 tokens: 4 x 6 tiles over 6-row strips
    for (; o + matmul_tile_rows <= row_last; o += matmul_tile_rows)
      matmul_strip<Arch, matmul_tile_rows>(x, n, in, w, y, y_stride, accumulate, o);
    if (row_last - o == 5) return matmul_strip<Arch, 5>(x, n, in, w, y, y_stride, accumulate, o);
  }
  for (; o + matmul_stream_rows <= row_last; o += matmul_stream_rows)
    matmul_strip<Arch, matmul_stream_rows>(x, n, in, w, y, y_stride, accumulate, o);
  switch (row_last - o) {
    case 3: matmul_strip<Arch, 3>(x, n, in, w, y, y_stride, accumulate, o); break;
    case 2: matmul_strip<Arch, 2>(x, n, in, w, y, y_stride, accumulate, o); break;
    case 1: matmul_strip<Arch, 1>(x, n, in, w, y, y_stride, accumulate, o); break;
    default: break;
  }
}

/// Rows [row_first, row_last) of `[n, out] y (row stride y_stride) (+)=
/// [n, in] x * ([out, in] w)^T`; row_first a multiple of
/// matmul_dense_block_rows. A streaming product (n <=
/// matmul_stream_max_tokens) reads W once, strip by strip; a larger one runs
/// matmul_dense_block_rows rows at a time.
template <class Arch, class W>
void matmul_dense_rows(const float* x, std::size_t n, std::size_t in, const W& w, float* y, std::size_t y_stride,
                       bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  if (n <= matmul_stream_max_tokens) return matmul_stream<Arch>(x, n, in, w, y, y_stride, accumulate, row_first, row_last);
  for (std::size_t first = row_first; first < row_last; first += matmul_dense_block_rows) {
    const std::size_t last = std::min(row_last, first + matmul_dense_block_rows);
    std::size_t t = 0;
    for (; t + matmul_tile_tokens <= n; t += matmul_tile_tokens)
      matmul_rows<Arch, matmul_tile_tokens>(x, in, w, y, y_stride, accumulate, t, first, last);
    switch (n - t) {
      case 3: matmul_rows<Arch, 3>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      case 2: matmul_rows<Arch, 2>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      case 1: matmul_rows<Arch, 1>(x, in, w, y, y_stride, accumulate, t, first, last); break;
      default: break;
    }
  }
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
