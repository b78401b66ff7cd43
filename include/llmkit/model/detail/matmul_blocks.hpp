// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_blocks.hpp
/// Y = X * W^T (or Y += X * W^T) for W [out, in] stored in one of ggml's
/// quantised block formats (model/quants.hpp), in f32 arithmetic over the
/// exact decoded weights.
///
/// W is decoded a strip of rows at a time into a per-thread f32 buffer
/// small enough to stay in L1/L2, and the strip runs through the same
/// register-tiled dot-product kernels as f16 and Q8_0 weights
/// (model/detail/matmul.hpp): a decode step reads each weight byte once, a
/// prefill reuses each decoded strip for every token tile. Every output is
/// the same fixed-order dot product as there, so products are batch and
/// thread invariant.

#include <algorithm>
#include <cstddef>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// Weights in a quantised block format: row o's blocks start at
/// `data + o * row_bytes`, in storage aligned for the block struct.
/// @pre in % block values == 0
struct block_weights {
  ggml_type type;
  const std::byte* data;
  std::size_t in;
  std::size_t row_bytes() const noexcept { return in / ggml_block_elements(type) * ggml_block_bytes(type); }
};

/// f32 rows [o_base, o_base + rows) of a decoded strip, row-major with
/// stride `in`: the accessor matmul_tile reads.
struct f32_strip {
  const float* w;
  std::size_t in;
  std::size_t o_base;
  template <class Arch>
  xsimd::batch<float, Arch> load(std::size_t o, std::size_t k) const noexcept {
    return xsimd::batch<float, Arch>::load_unaligned(w + (o - o_base) * in + k);
  }
  float at(std::size_t o, std::size_t k) const noexcept { return w[(o - o_base) * in + k]; }
  void prefetch(std::size_t, std::size_t) const noexcept {}
};

/// Rows [row_first, row_last) of `[n, out] y (+)= [n, in] x * W^T`.
template <class Arch, class Block>
void matmul_quant_rows(const float* x, std::size_t n, std::size_t in, const block_weights& w, float* y,
                       std::size_t y_stride, bool accumulate, std::size_t row_first, std::size_t row_last) {
  constexpr std::size_t k = block_values<Block>;
  const std::size_t strip_bytes =
      n <= matmul_stream_max_tokens ? matmul_strip_bytes_streaming : matmul_strip_bytes_prefill;
  const std::size_t strip_rows = std::max<std::size_t>(1, strip_bytes / (in * sizeof(float)));
  const std::size_t row_bytes = w.row_bytes(), blocks = in / k;
  thread_local aligned_vector<float> buffer;
  if (buffer.size() < strip_rows * in) buffer.resize(strip_rows * in);
  for (std::size_t o = row_first; o < row_last; o += strip_rows) {
    const std::size_t rows = std::min(strip_rows, row_last - o);
    for (std::size_t r = 0; r < rows; ++r) {
      // The matrix's storage holds its blocks as objects (weight_matrix
      // copies them in), so they are read in place: a copy to the stack
      // would stall every block's vector loads on store forwarding.
      const auto* src = reinterpret_cast<const Block*>(w.data + (o + r) * row_bytes);
      prefetch_l2(src, matmul_prefetch_bytes);
      for (std::size_t b = 0; b < blocks; ++b) dequantize_block(src[b], buffer.data() + r * in + b * k);
    }
    const f32_strip strip{buffer.data(), in, o};
    if (n <= matmul_stream_max_tokens) {
      matmul_stream<Arch>(x, n, in, strip, y, y_stride, accumulate, o, o + rows);
    } else {
      std::size_t t = 0;
      for (; t + matmul_tile_tokens <= n; t += matmul_tile_tokens)
        matmul_rows<Arch, matmul_tile_tokens>(x, in, strip, y, y_stride, accumulate, t, o, o + rows);
      switch (n - t) {
        case 3: matmul_rows<Arch, 3>(x, in, strip, y, y_stride, accumulate, t, o, o + rows); break;
        case 2: matmul_rows<Arch, 2>(x, in, strip, y, y_stride, accumulate, t, o, o + rows); break;
        case 1: matmul_rows<Arch, 1>(x, in, strip, y, y_stride, accumulate, t, o, o + rows); break;
        default: break;
      }
    }
  }
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
