// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/moe/routed_ffn.hpp
/// The routed feed-forward of a mixture-of-experts layer: each token's k
/// chosen experts' gated FFNs, combined with the router's weights,
///
///   out[t] (+)= sum_j w[t, j] * (down_e act(gate_e x[t] + bg_e, up_e x[t] + bu_e) + bd_e),  e = ids[t, j],
///
/// act SwiGLU (silu(g) * u) by default or another gated activation
/// (gpt-oss's clamped SwiGLU), the per-expert biases bg, bu, bd optional
/// (gpt-oss has them),
/// with only the chosen experts' weights read. The (token, slot) pairs are
/// grouped by expert (gather), each expert runs one batched product per
/// projection over its group with the dense kernels (model/detail/
/// matmul_kernels.hpp) on row ranges of its matrix, and the results are
/// added back per token in slot order (weighted scatter-add). The work is
/// cut into (expert, row range) tasks sized by each expert's share, so a
/// skewed routing (every token to one expert) still keeps every thread busy,
/// and a decode step (one token) reads each chosen expert's rows once.
///
/// ```
/// moe::routed_ffn_workspace ws;
/// moe::routed_ffn(pool, {.x = xn, .ids = ids, .weights = w, .gate = gate, .up = up, .down = down, .out = y}, ws);
/// ```
///
/// Batch invariant: a token's output does not depend on the other tokens of
/// the batch nor on the threads (each dense product's output is one dot
/// product in a fixed order, the activation runs on the same lanes, and the
/// k contributions are added in slot order), so a token alone and in any
/// batch gives bit-identical results, with f32 or int8 activations.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/model/detail/activations.hpp"
#include "llmkit/model/detail/matmul_kernels.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/moe/expert_tensor.hpp"
#include "llmkit/moe/router.hpp"

namespace llmkit::moe {

/// The operands of routed_ffn. Shapes: `[n, dim] x`, `[n, k] ids` and
/// `[n, k] weights` (moe::route's output), `[n_expert, ffn, dim] gate` and
/// `up`, `[n_expert, dim, ffn] down`, `[n, dim] out`; out may be x itself
/// (x is gathered before out is written). The biases, when given, are
/// `[n_expert, ffn] gate_bias` and `up_bias`, `[n_expert, dim] down_bias`.
struct routed_ffn_params {
  matrix_view<const float> x;
  matrix_view<const expert_id> ids;
  matrix_view<const float> weights;
  const expert_tensor& gate;
  const expert_tensor& up;
  const expert_tensor& down;
  matrix_view<float> out;
  /// overwrite: out = the routed sum; accumulate: out += it (a residual).
  model::output_mode mode = model::output_mode::overwrite;
  /// f32: the exact product over the stored weights; q8_0: int8 activations
  /// for quantised experts, as model::linear (model/weights.hpp).
  model::activation_type activations = model::activation_type::f32;
  /// The gated activation (model/detail/activations.hpp).
  model::ffn_activation activation = model::ffn_activation::silu;
  /// Per-expert biases added to the gate, up and down products; empty: none.
  matrix_view<const float> gate_bias{}, up_bias{}, down_bias{};
};

/// Scratch of routed_ffn, reused across calls (and layers) to avoid
/// allocating per step.
struct routed_ffn_workspace {
  std::vector<std::uint32_t> count, offset, cursor;  // [n_expert] pairs per expert, the first, the next
  std::vector<expert_id> active;              // experts with tokens, ascending
  std::vector<std::uint32_t> pair_token;      // [n * k] token of each pair, grouped by expert
  std::vector<std::uint32_t> slot_pair;       // [n * k] pair of (token, slot)
  aligned_vector<float> xg, g, u, h, yd;      // gathered inputs, gate, up, activation, down outputs
  std::vector<model::detail::q8_activations> xa, xb;  // [n_expert] int8 inputs of each group
  struct task {
    expert_id expert;
    std::uint32_t row_first, row_last;
  };
  std::vector<task> tasks;
};

namespace detail {

/// Output rows [row_first, row_last) of the dense product of `[m, w.cols()] x`
/// (or its quantised form `xa` when `int8`) with matrix w into `[m, w.rows()] y`
/// (row stride y_stride). row_first a multiple of product_row_unit(w, int8).
template <class Arch = simd::default_arch>
void product_rows(const model::weight_matrix& w, const float* x, const model::detail::q8_activations& xa,
                  std::size_t m, float* y, std::size_t y_stride, bool int8, std::size_t row_first,
                  std::size_t row_last) {
  using namespace model::detail;
  if (int8) {
    if (w.type() == model::weight_type::q8_0)
      return matmul_kernels<Arch>::rows(xa, q8_weights{w.q8_data(), w.q8_scales(), w.cols()}, y, y_stride, false,
                                        row_first, row_last);
    return matmul_kernels<Arch>::rows(xa, block_weights{stored_block_type(w.type()), w.block_data(), w.cols()}, y,
                                      y_stride, false, row_first, row_last);
  }
  w.visit([&](const auto& acc) {
    using W = std::remove_cvref_t<decltype(acc)>;
    matmul_kernels<Arch>::rows(product_args<W>{x, m, w.cols(), acc, w.rows(), y, y_stride, false}, row_first,
                               row_last);
  });
}

/// The row alignment of product_rows' row_first for w.
inline std::size_t product_row_unit(const model::weight_matrix& w, bool int8) noexcept {
  if (int8) return model::detail::matmul_q8_block_rows;
  return w.type() == model::weight_type::f32 ? model::detail::matmul_panel_rows : model::detail::matmul_dense_block_rows;
}

/// Whether a product over w with `activations` multiplies int8 activations.
inline bool uses_int8(const model::weight_matrix& w, model::activation_type activations) noexcept {
  return activations == model::activation_type::q8_0 && w.type() != model::weight_type::f32 &&
         w.type() != model::weight_type::f16;
}

/// Quantises `[m, w.cols()] x` into xa as w's int8 product wants it (per 32
/// values, or per 256 for the K-quants, with the format's offset sums), as
/// model::linear does.
template <class Arch = simd::default_arch>
void quantize_for(const model::weight_matrix& w, const float* x, std::size_t m, model::detail::q8_activations& xa) {
  using namespace model::detail;
  if (w.type() == model::weight_type::q8_0) return matmul_kernels<Arch>::quantize(xa, x, m, w.cols());
  visit_block(stored_block_type(w.type()), [&](auto block) {
    using B = decltype(block);
    if constexpr (has_int8_product<B>) {
      if constexpr (is_kquant_block<B>)
        matmul_kernels<Arch>::quantize_k(xa, x, m, w.cols());
      else
        matmul_kernels<Arch>::quantize(xa, x, m, w.cols());
      xa.assign_sums(int8_form<B>::offset);
    }
  });
}

/// Cuts each active expert's `rows` outputs into tasks: about `target`
/// tasks in all, each expert's share in proportion to its tokens (at least
/// one, at most one per row unit), so that one heavy expert is split across
/// every thread while many light ones are taken whole.
inline void plan_tasks(routed_ffn_workspace& ws, std::size_t rows, std::size_t unit, std::size_t target) {
  ws.tasks.clear();
  std::size_t pairs = 0;
  for (expert_id e : ws.active) pairs += ws.count[std::size_t(e)];
  const std::size_t units = (rows + unit - 1) / unit;
  for (expert_id e : ws.active) {
    const std::size_t m = ws.count[std::size_t(e)];
    const std::size_t chunks = std::clamp<std::size_t>((target * m + pairs - 1) / pairs, 1, units);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t u0 = units * c / chunks, u1 = units * (c + 1) / chunks;
      ws.tasks.push_back({e, std::uint32_t(u0 * unit), std::uint32_t(std::min(rows, u1 * unit))});
    }
  }
}

/// Runs fn(i) for i in [0, n): across exec when `parallel`, else here.
template <class Exec, class Fn>
void run_tasks(Exec& exec, std::size_t n, bool parallel, Fn&& fn) {
  if (parallel && n > 1)
    exec.parallel_for(n, fn);
  else
    for (std::size_t i = 0; i < n; ++i) fn(i);
}

}  // namespace detail

/// The routed gated feed-forward (see the file comment): for every token t
/// and slot j, expert ids[t, j]'s FFN of x[t], weighted by weights[t, j],
/// summed over j in slot order into out[t] (or added to it).
/// @throws llmkit::error naming the argument for mismatched shapes (x, ids,
/// weights, out, or the expert tensors against each other), k = 0, k above
/// the expert count, or an expert id outside [0, n_expert) (token and slot named).
template <class Arch = simd::default_arch, executor Exec>
void routed_ffn(Exec& exec, const routed_ffn_params& p, routed_ffn_workspace& ws) {
  const std::size_t n = p.x.rows(), dim = p.x.cols(), k = p.ids.cols();
  const std::size_t n_expert = p.gate.n_expert(), f = p.gate.rows();
  LLMKIT_CHECK(n_expert >= 1, "moe::routed_ffn: the gate tensor has no experts");
  LLMKIT_CHECK(p.gate.cols() == dim, "moe::routed_ffn: gate is [", n_expert, ", ", f, ", ", p.gate.cols(),
               "], x has ", dim, " columns");
  LLMKIT_CHECK(p.up.n_expert() == n_expert && p.up.rows() == f && p.up.cols() == dim, "moe::routed_ffn: up is [",
               p.up.n_expert(), ", ", p.up.rows(), ", ", p.up.cols(), "], gate is [", n_expert, ", ", f, ", ", dim, "]");
  LLMKIT_CHECK(p.down.n_expert() == n_expert && p.down.rows() == dim && p.down.cols() == f,
               "moe::routed_ffn: down is [", p.down.n_expert(), ", ", p.down.rows(), ", ", p.down.cols(),
               "], must be [", n_expert, ", ", dim, ", ", f, "]");
  LLMKIT_CHECK(k >= 1 && k <= n_expert, "moe::routed_ffn: k = ", k, " experts per token, the layer has ", n_expert);
  LLMKIT_CHECK(p.ids.rows() == n && p.weights.rows() == n && p.weights.cols() == k, "moe::routed_ffn: ids [",
               p.ids.rows(), ", ", k, "] and weights [", p.weights.rows(), ", ", p.weights.cols(), "] for ", n,
               " tokens");
  LLMKIT_CHECK(p.out.rows() == n && p.out.cols() == dim, "moe::routed_ffn: out is [", p.out.rows(), ", ",
               p.out.cols(), "], must be [", n, ", ", dim, "]");
  auto check_bias = [&](const char* name, matrix_view<const float> b, std::size_t cols) {
    LLMKIT_CHECK(b.empty() || (b.rows() == n_expert && b.cols() == cols), "moe::routed_ffn: ", name, " is [",
                 b.rows(), ", ", b.cols(), "], must be [", n_expert, ", ", cols, "] or empty");
  };
  check_bias("gate_bias", p.gate_bias, f);
  check_bias("up_bias", p.up_bias, f);
  check_bias("down_bias", p.down_bias, dim);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < k; ++j)
      LLMKIT_CHECK(p.ids(t, j) >= 0 && std::size_t(p.ids(t, j)) < n_expert, "moe::routed_ffn: ids[", t, ", ", j,
                   "] = ", p.ids(t, j), " is not an expert of the ", n_expert);
  if (n == 0) return;

  // Group the (token, slot) pairs by expert, tokens in order within each.
  const std::size_t n_pairs = n * k;
  ws.count.assign(n_expert, 0);
  ws.offset.assign(n_expert, 0);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < k; ++j) ++ws.count[std::size_t(p.ids(t, j))];
  ws.active.clear();
  for (std::size_t e = 0, at = 0; e < n_expert; ++e) {
    ws.offset[e] = std::uint32_t(at);
    at += ws.count[e];
    if (ws.count[e] > 0) ws.active.push_back(expert_id(e));
  }
  ws.pair_token.resize(n_pairs);
  ws.slot_pair.resize(n_pairs);
  ws.cursor.assign(ws.offset.begin(), ws.offset.end());
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t pair = ws.cursor[std::size_t(p.ids(t, j))]++;
      ws.pair_token[pair] = std::uint32_t(t);
      ws.slot_pair[t * k + j] = pair;
    }
  ws.xg.resize(n_pairs * dim);
  ws.g.resize(n_pairs * f);
  ws.u.resize(n_pairs * f);
  ws.h.resize(n_pairs * f);
  ws.yd.resize(n_pairs * dim);
  for (std::size_t q = 0; q < n_pairs; ++q)
    std::copy_n(p.x.row(ws.pair_token[q]).data(), dim, ws.xg.data() + q * dim);

  const std::size_t threads = exec.concurrency();
  const bool streaming = n <= model::detail::matmul_stream_max_tokens;
  const std::size_t target = threads <= 1 ? 1 : threads * (streaming ? 1 : model::detail::matmul_prefill_tasks_per_thread);
  // As model::linear: hand off only products above ~2^16 multiply-adds.
  const bool parallel = threads > 1 && double(n_pairs) * double(dim) * double(f) >= model::detail::matmul_parallel_min_work;
  // Quantising a decode step's few rows takes less than handing it off.
  const bool parallel_quantize =
      parallel && double(n_pairs) * double(std::max(dim, f)) >= model::detail::matmul_parallel_min_work;
  ws.xa.resize(n_expert);
  ws.xb.resize(n_expert);

  // Gate and up, then the activation, per (expert, row range).
  const model::weight_matrix& gate0 = p.gate.expert(0);
  const model::weight_matrix& up0 = p.up.expert(0);
  const bool int8_gate = detail::uses_int8(gate0, p.activations), int8_up = detail::uses_int8(up0, p.activations);
  // Up shares the gate's quantised input unless its format wants another form.
  const bool share_xa = int8_gate && int8_up && gate0.type() == up0.type();
  if (int8_gate || int8_up)
    detail::run_tasks(exec, ws.active.size(), parallel_quantize, [&](std::size_t i) {
      const std::size_t e = std::size_t(ws.active[i]);
      const float* xe = ws.xg.data() + std::size_t(ws.offset[e]) * dim;
      if (int8_gate) detail::quantize_for<Arch>(p.gate.expert(e), xe, ws.count[e], ws.xa[e]);
      if (int8_up && !share_xa) detail::quantize_for<Arch>(p.up.expert(e), xe, ws.count[e], ws.xb[e]);
    });
  // Chunks start at multiples of 64 rows, so the activation runs each value
  // on the same SIMD lane as over whole rows.
  detail::plan_tasks(ws, f, std::max(detail::product_row_unit(gate0, int8_gate), detail::product_row_unit(up0, int8_up)), target);
  detail::run_tasks(exec, ws.tasks.size(), parallel, [&](std::size_t i) {
    const auto task = ws.tasks[i];
    const std::size_t e = std::size_t(task.expert), m = ws.count[e], first = ws.offset[e];
    const float* xe = ws.xg.data() + first * dim;
    detail::product_rows<Arch>(p.gate.expert(e), xe, ws.xa[e], m, ws.g.data() + first * f, f, int8_gate, task.row_first,
                       task.row_last);
    detail::product_rows<Arch>(p.up.expert(e), xe, share_xa ? ws.xa[e] : ws.xb[e], m, ws.u.data() + first * f, f, int8_up,
                       task.row_first, task.row_last);
    const std::size_t r0 = task.row_first, width = task.row_last - task.row_first;
    for (std::size_t q = first; q < first + m; ++q) {
      float* g = ws.g.data() + q * f + r0;
      float* u = ws.u.data() + q * f + r0;
      if (!p.gate_bias.empty())
        for (std::size_t r = 0; r < width; ++r) g[r] += p.gate_bias(e, r0 + r);
      if (!p.up_bias.empty())
        for (std::size_t r = 0; r < width; ++r) u[r] += p.up_bias(e, r0 + r);
      model::detail::gated_activation<Arch>(p.activation, g, u, ws.h.data() + q * f + r0, width);
    }
  });

  // Down, per (expert, row range).
  const model::weight_matrix& down0 = p.down.expert(0);
  const bool int8_down = detail::uses_int8(down0, p.activations);
  if (int8_down)
    detail::run_tasks(exec, ws.active.size(), parallel_quantize, [&](std::size_t i) {
      const std::size_t e = std::size_t(ws.active[i]);
      detail::quantize_for<Arch>(p.down.expert(e), ws.h.data() + std::size_t(ws.offset[e]) * f, ws.count[e], ws.xa[e]);
    });
  detail::plan_tasks(ws, dim, detail::product_row_unit(down0, int8_down), target);
  detail::run_tasks(exec, ws.tasks.size(), parallel, [&](std::size_t i) {
    const auto task = ws.tasks[i];
    const std::size_t e = std::size_t(task.expert), first = ws.offset[e];
    detail::product_rows<Arch>(p.down.expert(e), ws.h.data() + first * f, ws.xa[e], ws.count[e], ws.yd.data() + first * dim,
                       dim, int8_down, task.row_first, task.row_last);
    if (!p.down_bias.empty())
      for (std::size_t q = first; q < first + ws.count[e]; ++q)
        for (std::size_t r = task.row_first; r < task.row_last; ++r) ws.yd[q * dim + r] += p.down_bias(e, r);
  });

  // Weighted scatter-add, slot by slot in order for every token.
  const bool accumulate = p.mode == model::output_mode::accumulate;
  for (std::size_t t = 0; t < n; ++t) {
    float* o = p.out.row(t).data();
    if (!accumulate) std::fill_n(o, dim, 0.0f);
    for (std::size_t j = 0; j < k; ++j) {
      const float wj = p.weights(t, j);
      const float* y = ws.yd.data() + std::size_t(ws.slot_pair[t * k + j]) * dim;
      for (std::size_t d = 0; d < dim; ++d) o[d] += wj * y[d];
    }
  }
}

}  // namespace llmkit::moe
