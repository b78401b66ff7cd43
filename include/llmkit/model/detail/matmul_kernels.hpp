// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_kernels.hpp
/// The model's products over each weight storage: the row-range kernels of
/// one arch (`matmul_kernels<Arch>`, compiled once per program under
/// LLMKIT_MODEL_EXTERN_KERNELS: model/kernels.hpp) and the entry points
/// that split a product's output rows across an executor.
///
/// A kernel computes rows [row_first, row_last) of
/// `[n, out] y (row stride y_stride) (+)= [n, in] x * ([out, in] w)^T` for
/// every token; it does not depend on the executor, so one compiled kernel
/// serves serial calls, thread pools and OpenMP alike.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "llmkit/core/error.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/detail/matmul_blocks.hpp"
#include "llmkit/model/detail/matmul_blocks_q8.hpp"
#include "llmkit/model/detail/matmul_blocks32_vnni.hpp"
#include "llmkit/model/detail/matmul_blocks_avx2.hpp"
#include "llmkit/model/detail/gemm_blocks32_vnni.hpp"
#include "llmkit/model/detail/gemm_kquants_vnni.hpp"
#include "llmkit/model/detail/matmul_kquants_vnni.hpp"
#include "llmkit/model/detail/matmul_lookup4_vnni.hpp"
#include "llmkit/model/detail/matmul_panels.hpp"
#include "llmkit/model/detail/matmul_q8.hpp"
#include "llmkit/model/detail/matmul_q8_vnni.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/arch.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// The operands of one product: `[n, in] x`, the weights' accessor,
/// `[n, out] y` with row stride y_stride.
template <class W>
struct product_args {
  const float* x;
  std::size_t n, in;
  W w;
  std::size_t out;
  float* y;
  std::size_t y_stride;
  bool accumulate;
};

/// The product kernels of Arch, one overload per weight storage. A class
/// with out-of-line members so that one translation unit can compile them
/// for a whole program (model/kernels.hpp).
template <class Arch>
struct matmul_kernels {
  /// Rows [row_first, row_last) of a product over f16 / Q8_0 weights
  /// widened to f32 (model/detail/matmul.hpp); row_first a multiple of
  /// matmul_dense_block_rows.
  static void rows(const product_args<f16_weights>& p, std::size_t row_first, std::size_t row_last) noexcept;
  static void rows(const product_args<q8_weights>& p, std::size_t row_first, std::size_t row_last) noexcept;
  /// Rows [row_first, row_last) of a product over weights in a quantised
  /// block format, decoded a strip at a time (model/detail/matmul_blocks.hpp).
  static void rows(const product_args<block_weights>& p, std::size_t row_first, std::size_t row_last);
  /// Rows [row_first, row_last) of a product over panel-packed f32 weights
  /// (model/detail/matmul_panels.hpp); row_first a multiple of
  /// matmul_panel_rows.
  static void rows(const product_args<f32_panels>& p, std::size_t row_first, std::size_t row_last) noexcept;
  /// Rows [row_first, row_last) of a Q8_0 x int8-activation product over
  /// activations quantised by `quantize` (model/detail/matmul_q8.hpp).
  static void rows(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride, bool accumulate,
                   std::size_t row_first, std::size_t row_last) noexcept;
  /// Rows [row_first, row_last) of a product over weights in a quantised
  /// block format times activations quantised by `quantize`, with the sums
  /// of the format's offset (model/detail/matmul_blocks_q8.hpp).
  static void rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride, bool accumulate,
                   std::size_t row_first, std::size_t row_last);
  /// Quantises `[n, in] x` into xa per 32-value block. @pre in % 32 == 0
  static void quantize(q8_activations& xa, const float* x, std::size_t n, std::size_t in);
  /// Quantises `[n, in] x` into xa per 256-value super-block (the K-quants'
  /// products). @pre in % 256 == 0
  static void quantize_k(q8_activations& xa, const float* x, std::size_t n, std::size_t in);
};

template <class Arch>
void matmul_kernels<Arch>::rows(const product_args<f16_weights>& p, std::size_t row_first,
                                std::size_t row_last) noexcept {
  matmul_dense_rows<Arch>(p.x, p.n, p.in, p.w, p.y, p.y_stride, p.accumulate, row_first, row_last);
}

template <class Arch>
void matmul_kernels<Arch>::rows(const product_args<q8_weights>& p, std::size_t row_first,
                                std::size_t row_last) noexcept {
  matmul_dense_rows<Arch>(p.x, p.n, p.in, p.w, p.y, p.y_stride, p.accumulate, row_first, row_last);
}

template <class Arch>
void matmul_kernels<Arch>::rows(const product_args<block_weights>& p, std::size_t row_first, std::size_t row_last) {
  visit_block(p.w.type, [&](auto block) {
    matmul_quant_rows<Arch, decltype(block)>(p.x, p.n, p.in, p.w, p.y, p.y_stride, p.accumulate, row_first,
                                             row_last);
  });
}

template <class Arch>
void matmul_kernels<Arch>::rows(const product_args<f32_panels>& p, std::size_t row_first,
                                std::size_t row_last) noexcept {
  // Every tile prefetches 32 KiB ahead: a decode step streams the panels
  // from memory, and a prefill's first token tile of each panel does too (the
  // other tiles find it in L2, where the prefetches cost a load slot each).
  panel_range<Arch, true>(p.x, p.n, p.in, p.w, p.out, p.y, p.y_stride, p.accumulate, row_first / matmul_panel_rows,
                          (row_last + matmul_panel_rows - 1) / matmul_panel_rows);
}

template <class Arch>
void matmul_kernels<Arch>::rows(const q8_activations& xa, const q8_weights& w, float* y, std::size_t y_stride,
                                bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  matmul_q8_rows(xa, w, y, y_stride, accumulate, row_first, row_last, simd::kernel_arch<Arch>{});
}

template <class Arch>
void matmul_kernels<Arch>::rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                                bool accumulate, std::size_t row_first, std::size_t row_last) {
  visit_block(w.type, [&](auto block) {
    using B = decltype(block);
    // Q8_0 weights take the overload above (matmul_q8.hpp); formats without
    // an integer form never reach here (matmul_blocks_q8 refuses them).
    if constexpr (has_int8_product<B>)
      if (!int8_gemm_rows<B>(xa, w, y, y_stride, accumulate, row_first, row_last, simd::kernel_arch<Arch>{}))
        int8_block_rows<B>(xa, w, y, y_stride, accumulate, row_first, row_last, simd::kernel_arch<Arch>{});
  });
}

template <class Arch>
void matmul_kernels<Arch>::quantize(q8_activations& xa, const float* x, std::size_t n, std::size_t in) {
  xa.template assign<Arch>(x, n, in);
}

template <class Arch>
void matmul_kernels<Arch>::quantize_k(q8_activations& xa, const float* x, std::size_t n, std::size_t in) {
  xa.template assign_k<Arch>(x, n, in);
}

/// Runs run(row_first, row_last) over the output rows [0, out) in blocks of
/// block_rows: on the calling thread when `serial` (or with one thread or
/// one block), else split across `exec`: one contiguous share per thread for
/// a streaming product (one stream over W, so each hand-off moves the most
/// bytes), a few shares per thread for prefill (to balance).
template <class Exec, class Run>
void split_rows(Exec& exec, std::size_t out, std::size_t block_rows, bool streaming, bool serial, Run&& run) {
  const std::size_t n_blocks = (out + block_rows - 1) / block_rows;
  auto blocks = [&](std::size_t b0, std::size_t b1) { run(b0 * block_rows, std::min(out, b1 * block_rows)); };
  if (serial || exec.concurrency() <= 1 || n_blocks <= 1) return blocks(0, n_blocks);
  const std::size_t n_tasks = std::min(n_blocks, exec.concurrency() * (streaming ? 1 : matmul_prefill_tasks_per_thread));
  exec.parallel_for(n_tasks, [&](std::size_t task) { blocks(n_blocks * task / n_tasks, n_blocks * (task + 1) / n_tasks); });
}

/// Output rows per block a product over W is split in.
template <class W>
inline constexpr std::size_t matmul_block_rows = matmul_dense_block_rows;
template <>
inline constexpr std::size_t matmul_block_rows<f32_panels> = matmul_panel_rows;

/// `[n, out] y (row stride y_stride) (+)= [n, in] x * ([out, in] w)^T` over
/// the weights' own storage, rows split across `exec` above
/// matmul_parallel_min_work multiply-adds.
template <class Arch = simd::default_arch, class Exec, class W>
void matmul(Exec& exec, const float* x, std::size_t n, std::size_t in, const W& w, std::size_t out, float* y,
            std::size_t y_stride, bool accumulate) {
  if (n == 0 || out == 0) return;
  const product_args<W> p{x, n, in, w, out, y, y_stride, accumulate};
  const double work = double(n) * double(in) * double(out);
  split_rows(exec, out, matmul_block_rows<W>, n <= matmul_stream_max_tokens, work < matmul_parallel_min_work,
             [&](std::size_t first, std::size_t last) { matmul_kernels<Arch>::rows(p, first, last); });
}

/// `[n, out] y (row stride y_stride) (+)= quantise([n, in] x) * ([out, in] w)^T`,
/// x quantised into `xa` (the caller's scratch, reused across calls).
/// @pre in % 32 == 0 (Q8_0 rows)
template <class Arch = simd::default_arch, class Exec>
void matmul_q8(Exec& exec, const float* x, std::size_t n, std::size_t in, const q8_weights& w, std::size_t out,
               float* y, std::size_t y_stride, bool accumulate, q8_activations& xa) {
  if (n == 0 || out == 0) return;
  matmul_kernels<Arch>::quantize(xa, x, n, in);
  const double work = double(n) * double(in) * double(out);
  // int8 products do ~4x the work of f32 ones per unit of time.
  split_rows(exec, out, matmul_q8_block_rows, n <= matmul_stream_max_tokens, work < 4 * matmul_parallel_min_work,
             [&](std::size_t first, std::size_t last) {
               matmul_kernels<Arch>::rows(xa, w, y, y_stride, accumulate, first, last);
             });
}

/// True when block type t has an int8-activation product (matmul_blocks_q8).
inline bool has_int8_product_for(ggml_type t) {
  return visit_block(t, []<class B>(B) { return has_int8_product<B>; });
}

/// `[n, out] y (row stride y_stride) (+)= quantise([n, in] x) * ([out, in] w)^T`
/// for w in a quantised block format (not Q8_0: matmul_q8), x quantised
/// into `xa` (the caller's scratch, reused across calls).
/// @throws llmkit::error when w's format has no int8 product (has_int8_product_for)
template <class Arch = simd::default_arch, class Exec>
void matmul_blocks_q8(Exec& exec, const float* x, std::size_t n, const block_weights& w, std::size_t out, float* y,
                      std::size_t y_stride, bool accumulate, q8_activations& xa) {
  LLMKIT_CHECK(has_int8_product_for(w.type), "matmul_blocks_q8: ", ggml_type_name(std::uint32_t(w.type)),
               " weights have no int8-activation product");
  if (n == 0 || out == 0) return;
  visit_block(w.type, [&](auto block) {
    using B = decltype(block);
    if constexpr (has_int8_product<B>) {
      if constexpr (is_kquant_block<B>)
        matmul_kernels<Arch>::quantize_k(xa, x, n, w.in);
      else
        matmul_kernels<Arch>::quantize(xa, x, n, w.in);
      xa.assign_sums(int8_form<B>::offset);
    }
  });
  const double work = double(n) * double(w.in) * double(out);
  split_rows(exec, out, matmul_q8_block_rows, n <= matmul_stream_max_tokens, work < 4 * matmul_parallel_min_work,
             [&](std::size_t first, std::size_t last) {
               matmul_kernels<Arch>::rows(xa, w, y, y_stride, accumulate, first, last);
             });
}

}  // namespace llmkit::model::detail

#if defined(LLMKIT_MODEL_EXTERN_KERNELS)
// The kernels for the default arch are compiled elsewhere (model/kernels.hpp).
namespace llmkit::model::detail {
extern template struct matmul_kernels<simd::default_arch>;
}  // namespace llmkit::model::detail
#endif

LLMKIT_SIMD_DIAGNOSTICS_END
