// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/cost_model.hpp
/// A roofline cost model of one engine step: FLOPs and bytes moved (weights,
/// KV read, KV written, swap copies) from a Llama-style model config and a
/// step plan; time = max(FLOPs / peak FLOP/s, bytes / bandwidth) + a fixed
/// per-step overhead (or the sum of the two terms, for an engine that does
/// not overlap arithmetic with memory traffic; `fit_machine_limits`
/// calibrates either form to measured steps). The machine limits are plain numbers (measure them with
/// bench/bench_roofline, or take them from a data sheet). Helpers pick the
/// largest prefill chunk or decode batch that meets a step-latency target.
///
/// What is counted, per step:
/// - linear layers: 2 * (weights per layer) FLOPs per computed token slot
///   (padding included) and layer; the LM head (2 * dim * vocab) once per
///   sampled token or idle slot;
/// - attention: 4 * n_heads * head_dim FLOPs per (query, visible key) pair
///   and layer; a padded row computes its whole causal square (padding
///   included), a packed row only its pieces' blocks; idle slots none;
/// - weights: every weight byte read once per non-empty step (layers and
///   LM head; norms and the embedding lookup are ignored);
/// - KV: each item reads the K and V of its visible context once
///   (first_pos + n_tokens rows) and writes its n_tokens new rows, per layer;
///   padding reads and writes no KV;
/// - swap: each moved block is read and written once.
/// Activations are ignored (small next to weights for these batch sizes).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/sched/step_plan.hpp"

namespace llmkit::sched {

/// Shapes of a Llama-architecture decoder and its storage precision.
struct llama_config {
  std::int64_t n_layers = 0, dim = 0;                      ///< depth, residual width
  std::int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;  ///< attention (GQA when n_kv_heads < n_heads)
  std::int64_t ffn_dim = 0, vocab = 0;                     ///< FFN hidden width, vocabulary
  /// Bytes per stored weight (4 for f32, 2 for f16/bf16, 34/32 for q8_0).
  double bytes_per_weight = 4.0;
  /// Bytes per stored K or V element.
  double bytes_per_kv = 4.0;

  /// Weights of one layer's matrices: wq, wk, wv, wo, and the three FFN
  /// matrices (w1, w2, w3).
  constexpr std::int64_t weights_per_layer() const noexcept {
    const std::int64_t q = n_heads * head_dim, kv = n_kv_heads * head_dim;
    return dim * q + 2 * dim * kv + q * dim + 3 * dim * ffn_dim;
  }
  /// Matrix weights read per step: every layer plus the LM head.
  constexpr std::int64_t n_weights() const noexcept { return n_layers * weights_per_layer() + vocab * dim; }
  /// Bytes of K and V one token occupies across all layers.
  constexpr double kv_bytes_per_token() const noexcept {
    return 2.0 * static_cast<double>(n_layers * n_kv_heads * head_dim) * bytes_per_kv;
  }
};

/// The machine's roofline: plain numbers.
struct machine_limits {
  /// Sustained FLOP/s (e.g. the FMA peak of the cores the engine uses).
  double peak_flops = 1e12;
  /// Sustained memory read bandwidth in bytes/s.
  double bandwidth = 1e11;
  /// Fixed cost of one step in seconds (launch, sampling, scheduling).
  double step_overhead_s = 0.0;
  /// True: arithmetic and memory traffic overlap, a step's busy time is
  /// max(FLOPs / peak, bytes / bandwidth) (the roofline). False: they take
  /// turns and the two terms add (an engine that streams each weight matrix
  /// and then computes with it, e.g. a single-threaded reference forward).
  bool overlap = true;

  /// Busy time of a step of `flops` FLOPs moving `bytes` bytes (no overhead).
  constexpr double busy_s(double flops, double bytes) const noexcept {
    const double c = flops / peak_flops, m = bytes / bandwidth;
    return overlap ? (c > m ? c : m) : c + m;
  }
};

/// FLOPs, bytes and time of one step.
struct step_cost {
  double linear_flops = 0, attention_flops = 0;
  double weight_bytes = 0, kv_read_bytes = 0, kv_write_bytes = 0, swap_bytes = 0;
  double compute_s = 0, memory_s = 0, time_s = 0;

  double flops() const noexcept { return linear_flops + attention_flops; }
  double bytes() const noexcept { return weight_bytes + kv_read_bytes + kv_write_bytes + swap_bytes; }
  /// True when the FLOPs, not the bytes, set the time.
  bool compute_bound() const noexcept { return compute_s >= memory_s; }
};

/// Costs step plans on one model and machine.
struct cost_model {
  llama_config model;
  machine_limits machine;
  /// Tokens per KV block (to cost swap copies).
  std::int64_t block_size = 16;

  /// Raises `llmkit::error` naming the field when a shape or limit is not
  /// positive.
  void validate() const {
    const llama_config& m = model;
    for (auto [name, v] : {std::pair{"n_layers", m.n_layers}, {"dim", m.dim}, {"n_heads", m.n_heads},
                           {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim}, {"ffn_dim", m.ffn_dim},
                           {"vocab", m.vocab}, {"block_size", block_size}})
      LLMKIT_CHECK(v >= 1, "cost_model: ", name, " must be >= 1, got ", v);
    LLMKIT_CHECK(m.bytes_per_weight > 0 && m.bytes_per_kv > 0, "cost_model: bytes_per_weight = ", m.bytes_per_weight,
                 " and bytes_per_kv = ", m.bytes_per_kv, " must be > 0");
    LLMKIT_CHECK(machine.peak_flops > 0 && machine.bandwidth > 0, "cost_model: peak_flops = ", machine.peak_flops,
                 " and bandwidth = ", machine.bandwidth, " must be > 0");
    LLMKIT_CHECK(machine.step_overhead_s >= 0, "cost_model: step_overhead_s must be >= 0, got ",
                 machine.step_overhead_s);
  }

  /// The cost of `plan`.
  step_cost operator()(const step_plan& plan) const {
    const llama_config& m = model;
    step_cost c;
    const double layers = static_cast<double>(m.n_layers);
    const double attn_per_pair = 4.0 * static_cast<double>(m.n_heads * m.head_dim) * layers;
    const double kv_row = m.kv_bytes_per_token();  // all layers
    const double computed = static_cast<double>(plan.n_computed_tokens());
    const double heads_out = static_cast<double>(plan.n_samples() + plan.n_idle_slots);
    c.linear_flops = 2.0 * (computed * layers * static_cast<double>(m.weights_per_layer()) +
                            heads_out * static_cast<double>(m.dim * m.vocab));
    auto causal_pairs = [](double first_pos, double n) { return n * first_pos + n * (n + 1) / 2; };
    std::vector<char> in_padded_row(plan.items.size(), 0);
    if (plan.layout == prefill_layout::padded)
      for (const auto& row : plan.prefill_rows) {
        double first_pos = 0;
        for (std::size_t k : row) {
          in_padded_row[k] = 1;
          first_pos = std::max(first_pos, static_cast<double>(plan.items[k].first_pos));
        }
        c.attention_flops += attn_per_pair * causal_pairs(first_pos, static_cast<double>(plan.row_length));
      }
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
      const step_item& it = plan.items[i];
      const double first = static_cast<double>(it.first_pos), n = static_cast<double>(it.n_tokens);
      if (!in_padded_row[i]) c.attention_flops += attn_per_pair * causal_pairs(first, n);
      c.kv_read_bytes += (first + n) * kv_row;
      c.kv_write_bytes += n * kv_row;
    }
    if (!plan.items.empty()) c.weight_bytes = static_cast<double>(m.n_weights()) * m.bytes_per_weight;
    std::int64_t moved = 0;
    for (const auto* list : {&plan.swapped_out, &plan.swapped_in})
      for (const block_move& b : *list) moved += b.n_blocks;
    c.swap_bytes = 2.0 * static_cast<double>(moved * block_size) * kv_row;
    c.compute_s = c.flops() / machine.peak_flops;
    c.memory_s = c.bytes() / machine.bandwidth;
    c.time_s = machine.busy_s(c.flops(), c.bytes()) +
               (plan.items.empty() && moved == 0 ? 0.0 : machine.step_overhead_s);
    return c;
  }

  /// Time of a step of `n_decodes` single-token decodes, each at context
  /// `decode_context` (cached tokens before the step), plus, when
  /// `chunk > 0`, one prefill chunk of `chunk` tokens starting at position
  /// `chunk_first_pos`.
  double mixed_step_time(std::int64_t n_decodes, std::int64_t decode_context, std::int64_t chunk,
                         std::int64_t chunk_first_pos = 0) const {
    step_plan plan;
    for (std::int64_t d = 0; d < n_decodes; ++d)
      plan.items.push_back({.id = d, .first_pos = decode_context, .n_tokens = 1, .samples = true, .is_prefill = false});
    if (chunk > 0)
      plan.items.push_back(
          {.id = n_decodes, .first_pos = chunk_first_pos, .n_tokens = chunk, .samples = true, .is_prefill = true});
    return (*this)(plan).time_s;
  }
};

/// One measured step: its modelled FLOPs and bytes, and its measured time.
struct step_sample {
  double flops = 0, bytes = 0, time_s = 0;
};

/// Calibrates the roofline to an engine: the limits (peak, bandwidth,
/// per-step overhead, overlap) under which `overhead + busy_s(flops, bytes)`
/// best predicts the `[n] samples`, in the sense of the `error_quantile`
/// quantile of the relative errors (0.5, the median, is robust to noisy
/// steps; 1.0 minimises the worst error, for a few clean measurements). Both forms are tried, overlapped (max of the two terms) and not
/// (their sum); with `both_forms` false only the form `machine.overlap`
/// names. Peak and
/// bandwidth are searched on a log grid from `machine.peak_flops` and
/// `machine.bandwidth` (upper bounds, e.g. the measured roofline) down by
/// `range` (1e4 = four decades), `grid` points each; for each pair the
/// overhead is the median residual (>= 0).
/// @throws llmkit::error for no samples, non-positive limits, grid < 2,
///   range < 1 or error_quantile outside [0, 1].
inline machine_limits fit_machine_limits(std::span<const step_sample> samples, const machine_limits& machine,
                                         double range = 1e4, int grid = 81, bool both_forms = true,
                                         double error_quantile = 0.5) {
  LLMKIT_CHECK(!samples.empty(), "fit_machine_limits: no samples");
  LLMKIT_CHECK(machine.peak_flops > 0 && machine.bandwidth > 0, "fit_machine_limits: peak_flops = ",
               machine.peak_flops, " and bandwidth = ", machine.bandwidth, " must be > 0");
  LLMKIT_CHECK(grid >= 2 && range >= 1, "fit_machine_limits: grid = ", grid, " must be >= 2 and range = ", range,
               " >= 1");
  LLMKIT_CHECK(error_quantile >= 0 && error_quantile <= 1, "fit_machine_limits: error_quantile must be in [0, 1], got ",
               error_quantile);
  const auto q = std::min(samples.size() - 1, static_cast<std::size_t>(
                                                  std::ceil(error_quantile * static_cast<double>(samples.size() - 1))));
  machine_limits best = machine;
  double best_err = std::numeric_limits<double>::infinity();
  std::vector<double> residual(samples.size()), err(samples.size());
  for (const bool overlap : {true, false}) {
    if (!both_forms && overlap != machine.overlap) continue;
    for (int i = 0; i < grid; ++i) {
      const double peak = machine.peak_flops / std::pow(range, static_cast<double>(i) / (grid - 1));
      for (int j = 0; j < grid; ++j) {
        const double bw = machine.bandwidth / std::pow(range, static_cast<double>(j) / (grid - 1));
        const machine_limits m{.peak_flops = peak, .bandwidth = bw, .step_overhead_s = 0, .overlap = overlap};
        for (std::size_t k = 0; k < samples.size(); ++k)
          residual[k] = samples[k].time_s - m.busy_s(samples[k].flops, samples[k].bytes);
        std::nth_element(residual.begin(), residual.begin() + static_cast<std::ptrdiff_t>(residual.size() / 2),
                         residual.end());
        const double overhead = std::max(0.0, residual[residual.size() / 2]);
        for (std::size_t k = 0; k < samples.size(); ++k)
          err[k] = std::fabs((overhead + m.busy_s(samples[k].flops, samples[k].bytes)) / samples[k].time_s - 1.0);
        std::nth_element(err.begin(), err.begin() + static_cast<std::ptrdiff_t>(q), err.end());
        if (err[q] < best_err) {
          best_err = err[q];
          best = {.peak_flops = peak, .bandwidth = bw, .step_overhead_s = overhead, .overlap = overlap};
        }
      }
    }
  }
  return best;
}

/// The largest prefill chunk (<= `max_chunk`) that a step with `n_decodes`
/// decodes at context `decode_context` can add while taking at most
/// `target_s`; 0 when even the decodes alone (plus one token) miss it. Use
/// it as the chunked-prefill token budget: max_step_tokens = n_decodes + chunk.
inline std::int64_t max_chunk_for_latency(const cost_model& cm, std::int64_t n_decodes, std::int64_t decode_context,
                                          double target_s, std::int64_t max_chunk = 1 << 20,
                                          std::int64_t chunk_first_pos = 0) {
  LLMKIT_CHECK(target_s > 0, "max_chunk_for_latency: target_s must be > 0, got ", target_s);
  LLMKIT_CHECK(n_decodes >= 0 && decode_context >= 0 && max_chunk >= 0, "max_chunk_for_latency: n_decodes = ",
               n_decodes, ", decode_context = ", decode_context, ", max_chunk = ", max_chunk, " must be >= 0");
  std::int64_t lo = 0, hi = max_chunk;  // time is increasing in the chunk
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (cm.mixed_step_time(n_decodes, decode_context, mid, chunk_first_pos) <= target_s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// The largest decode batch (<= `max_batch`) whose step at context
/// `decode_context` takes at most `target_s` (a TPOT target); 0 when even
/// one sequence misses it.
inline std::int64_t max_batch_for_latency(const cost_model& cm, std::int64_t decode_context, double target_s,
                                          std::int64_t max_batch = 1 << 16) {
  LLMKIT_CHECK(target_s > 0, "max_batch_for_latency: target_s must be > 0, got ", target_s);
  LLMKIT_CHECK(decode_context >= 0 && max_batch >= 0, "max_batch_for_latency: decode_context = ", decode_context,
               " and max_batch = ", max_batch, " must be >= 0");
  std::int64_t lo = 0, hi = max_batch;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (cm.mixed_step_time(mid, decode_context, 0) <= target_s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace llmkit::sched
