// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/llama_forward.hpp
/// llama_model's forward pass, a template over the cache and the executor
/// (model/llama.hpp declares it and includes this file at its end; the
/// loader is in model/impl/llama.ipp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llmkit/attention/decode.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/prefill.hpp"
#include "llmkit/kv/truncated_view.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/model/detail/activations.hpp"
#include "llmkit/model/detail/matmul_kernels.hpp"
#include "llmkit/model/llama.hpp"
#include "llmkit/model/tuning.hpp"
#include "llmkit/simd/dot.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/rmsnorm.hpp"
#include "llmkit/simd/rope.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model {

namespace detail {
/// v[i] = cap * tanh(v[i] / cap) = cap (2 / (1 + e^(-2 v / cap)) - 1):
/// Gemma 2's soft-capping of the logits. ([n] v; cap > 0)
template <class Arch = simd::default_arch>
inline void softcap(float* v, std::size_t n, float cap) noexcept {
  const float k = -2.0f / cap;
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using vf = xsimd::batch<float, Arch>;
    for (; i + vf::size <= n; i += vf::size) {
      const vf e = simd::detail::exp_batch<Arch>(vf::load_unaligned(v + i) * vf(k));
      (vf(cap) * (vf(2.0f) / (vf(1.0f) + e) - vf(1.0f))).store_unaligned(v + i);
    }
  }
  for (; i < n; ++i) v[i] = cap * (2.0f / (1.0f + simd::detail::exp_scalar<Arch>(v[i] * k)) - 1.0f);
}

/// RMSNorm of each of the `n_heads` heads of `heads` in place, with one
/// weight vector shared by all heads (Qwen3's attn_q_norm / attn_k_norm).
/// ([n_heads * head_dim] heads, [head_dim] weight)
inline void head_rmsnorm(float* heads, std::size_t n_heads, std::span<const float> weight, float eps) {
  const std::size_t hd = weight.size();
  for (std::size_t h = 0; h < n_heads; ++h)
    simd::rmsnorm(std::span<const float>(heads + h * hd, hd), weight, std::span(heads + h * hd, hd), eps);
}
}  // namespace detail

template <kv::kv_cache Cache, executor Exec>
matrix_view<const float> llama_model::forward(const batch& b, Cache& cache, Exec& exec) {
  const auto& c = config_;
  const std::size_t n = b.n_tokens();
  LLMKIT_CHECK(b.positions.size() == n, "llama_model::forward: positions.size() = ", b.positions.size(),
               " differs from token_ids.size() = ", n);
  LLMKIT_CHECK(b.seq_ids.size() == n, "llama_model::forward: seq_ids.size() = ", b.seq_ids.size(),
               " differs from token_ids.size() = ", n);
  LLMKIT_CHECK(cache.shape() == c.kv_shape(), "llama_model::forward: the cache's shape {", cache.shape().n_layers,
               ", ", cache.shape().n_kv_heads, ", ", cache.shape().head_dim, "} differs from the model's {",
               c.n_layers, ", ", c.n_kv_heads, ", ", c.head_dim, "}");
  // A cache that keeps only a window in some layers (kv::hybrid_cache) may
  // hold this model's local layers there, and no others.
  if constexpr (requires { cache.local_cache().options().window; }) {
    const std::size_t window = cache.local_cache().options().window;
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      if (!cache.is_local(l)) continue;
      LLMKIT_CHECK(c.is_local(l), "llama_model::forward: the cache keeps a window of ", window,
                   " positions in layer ", l, ", a global layer of the model");
      LLMKIT_CHECK(window >= c.sliding_window, "llama_model::forward: the cache keeps a window of ", window,
                   " positions in layer ", l, ", narrower than the model's sliding_window = ", c.sliding_window);
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    LLMKIT_CHECK(b.token_ids[i] >= 0 && static_cast<std::size_t>(b.token_ids[i]) < c.n_vocab,
                 "llama_model::forward: token_ids[", i, "] = ", b.token_ids[i], " is outside the vocabulary of ",
                 c.n_vocab, " tokens");
  for (std::size_t r = 0; r < b.n_logits(); ++r)
    LLMKIT_CHECK(b.logit_rows[r] >= 0 && static_cast<std::size_t>(b.logit_rows[r]) < n,
                 "llama_model::forward: logit_rows[", r, "] = ", b.logit_rows[r], " is outside the ", n, " tokens");
  plan_segments(b, cache);
  reserve(n, b.n_logits());

  // Grow every sequence (with its token ids, so a prefix cache can publish
  // the blocks); undo on failure where the cache can.
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    const segment& seg = segments_[s];
    if (!kv::grow_with_tokens(cache, seg.seq, b.token_ids.subspan(seg.first, seg.count))) {
      if constexpr (requires { cache.truncate(seg.seq, std::size_t{0}); })
        for (std::size_t u = 0; u < s; ++u) cache.truncate(segments_[u].seq, segments_[u].base);
      ::llmkit::detail::throw_error("llama_model::forward: the cache has no room for ", seg.count,
                          " more tokens of sequence ", seg.seq);
    }
  }

  const std::size_t dim = c.dim, hd = c.head_dim;
  const std::size_t qd = c.n_heads * hd, kvd = c.n_kv_heads * hd, qkvd = qd + 2 * kvd;
  float* x = x_.data();
  float* xn = xn_.data();
  for (std::size_t i = 0; i < n; ++i)
    token_embd_.row(std::size_t(b.token_ids[i]), std::span(x + i * dim, dim));
  if (traits(c.arch).scaled_embedding) {
    const float scale = std::sqrt(float(dim));
    for (std::size_t i = 0; i < n * dim; ++i) x[i] *= scale;
  }
  const ffn_activation activation = traits(c.arch).activation;

  // Attention runs on the calling thread when it is smaller than a hand-off.
  const bool prefill_parallel = exec.concurrency() > 1 && attention_work_ >= detail::matmul_parallel_min_work;
  const bool decode_parallel = exec.concurrency() > 1 && decode_work_ >= detail::matmul_parallel_min_work;
  const bool mixed = !decode_seqs_.empty() && !prefill_seqs_.empty();
  const std::size_t n_prefill = std::size_t(cu_seqlens_.back());
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const layer& w = layers_[l];
    const bool local = c.is_local(l);
    for (std::size_t i = 0; i < n; ++i)
      simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.attn_norm, std::span(xn + i * dim, dim), c.rms_eps);
    product(exec, xn, n, w.wqkv, qkv_.data(), qkvd);
    for (std::size_t i = 0; i < n; ++i) {
      float* row = qkv_.data() + i * qkvd;
      if (!w.bqkv.empty())
        for (std::size_t j = 0; j < qkvd; ++j) row[j] += w.bqkv[j];
      if (!w.q_norm.empty()) {
        detail::head_rmsnorm(row, c.n_heads, w.q_norm, c.rms_eps);
        detail::head_rmsnorm(row + qd, c.n_kv_heads, w.k_norm, c.rms_eps);
      }
      rope(std::span(row, qd), b.positions[i], local);
      rope(std::span(row + qd, kvd), b.positions[i], local);
    }
    for (const segment& seg : segments_) {
      if (seg.count == 1) {
        const float* row = qkv_.data() + seg.first * qkvd;
        cache.store(seg.seq, l, seg.base, std::span<const float>(row + qd, kvd),
                    std::span<const float>(row + qd + kvd, kvd));
        continue;
      }
      for (std::size_t i = seg.first; i < seg.first + seg.count; ++i) {
        const float* row = qkv_.data() + i * qkvd;
        std::memcpy(k_.data() + i * kvd, row + qd, kvd * sizeof(float));
        std::memcpy(v_.data() + i * kvd, row + qd + kvd, kvd * sizeof(float));
      }
      cache.store(seg.seq, l, seg.base, std::span<const float>(k_.data() + seg.first * kvd, seg.count * kvd),
                  std::span<const float>(v_.data() + seg.first * kvd, seg.count * kvd));
    }
    // Queries in attention order: the prefill segments' rows (the last
    // seg.count positions of their sequences, K/V now stored), then one
    // row per decode segment. Without a mix this is the batch order.
    for (std::size_t i = 0; i < n; ++i)
      std::memcpy(q_.data() + std::size_t(attention_row_[i]) * qd, qkv_.data() + i * qkvd, qd * sizeof(float));
    // Local layers see the last sliding_window positions, global ones all.
    auto attend = [&](const auto& mask) {
      if (n_prefill > 0) {
        const attention::prefill_params ap{.q = std::span<const float>(q_.data(), n_prefill * qd),
                                           .out = std::span<float>(att_.data(), n_prefill * qd),
                                           .cu_seqlens = cu_seqlens_,
                                           .seq_ids = prefill_seqs_,
                                           .layer = l,
                                           .n_heads = c.n_heads,
                                           .scale = c.attention_scale,
                                           .softcap = c.attention_softcap,
                                           .sinks = w.sinks};
        if (prefill_parallel)
          attention::prefill(ap, std::as_const(cache), mask, exec);
        else
          attention::prefill(ap, std::as_const(cache), mask, serial_executor{});
      }
      if (!decode_seqs_.empty()) {
        const std::size_t nd = decode_seqs_.size();
        attention::decode_params dp{.q = std::span<const float>(q_.data() + n_prefill * qd, nd * qd),
                                    .out = std::span<float>(att_.data() + n_prefill * qd, nd * qd),
                                    .seq_ids = decode_seqs_,
                                    .layer = l,
                                    .n_heads = c.n_heads,
                                    .scale = c.attention_scale,
                                    .softcap = c.attention_softcap,
                                    .sinks = w.sinks,
                                    .workspace = &decode_ws_,
                                    .int8_queries = options_.int8_attention_queries,
                                    .bf16_queries = options_.bf16_attention_queries,
                                    .bf16_probabilities = options_.bf16_attention_probabilities,
                                    .int8_probabilities = options_.int8_attention_probabilities};
        auto run = [&](const auto& source) {
          if (decode_parallel)
            attention::decode(dp, source, mask, exec);
          else
            attention::decode(dp, source, mask, serial_executor{});
        };
        if (stepwise_) {  // every decode row sees its sequence up to its own position
          dp.seq_ids = decode_views_;
          run(kv::truncated_view<Cache>(cache, decode_seqs_, decode_last_));
        } else {
          run(std::as_const(cache));
        }
      }
    };
    if (local)
      attend(attention::sliding_window_mask(attention::position(c.sliding_window)));
    else
      attend(attention::causal_mask{});
    const float* att = att_.data();
    if (mixed) {  // back to batch order for the output projection
      for (std::size_t i = 0; i < n; ++i)
        std::memcpy(q_.data() + i * qd, att_.data() + std::size_t(attention_row_[i]) * qd, qd * sizeof(float));
      att = q_.data();
    }
    add_to_residual(exec, att, n, w.wo, w.post_attn_norm, w.bo);

    for (std::size_t i = 0; i < n; ++i)
      simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.ffn_norm, std::span(xn + i * dim, dim), c.rms_eps);
    if (c.has_experts()) {  // router (f32 logits), its top k, the chosen experts added to the residual
      product(exec, xn, n, w.router, router_logits_.data(), c.n_expert, output_mode::overwrite);
      if (!w.router_bias.empty())
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t e = 0; e < c.n_expert; ++e) router_logits_[i * c.n_expert + e] += w.router_bias[e];
      const std::size_t k = c.n_expert_used, fe = c.expert_ffn_dim;
      const matrix_view<const float> logits(router_logits_.data(), n, c.n_expert);
      const matrix_view<moe::expert_id> ids(route_ids_.data(), n, k);
      const matrix_view<float> weights(route_weights_.data(), n, k);
      if (traits(c.arch).router == expert_router::top_k_softmax)
        moe::route(moe::top_k_softmax{}, logits, ids, weights);
      else
        moe::route(moe::softmax_top_k{.renormalize = c.expert_weights_norm}, logits, ids, weights);
      auto bias = [&](const aligned_vector<float>& b, std::size_t cols) {
        return b.empty() ? matrix_view<const float>{} : matrix_view<const float>(b.data(), c.n_expert, cols);
      };
      moe::routed_ffn(exec,
                      {.x = matrix_view<const float>(xn, n, dim),
                       .ids = ids,
                       .weights = weights,
                       .gate = w.gate_exps,
                       .up = w.up_exps,
                       .down = w.down_exps,
                       .out = matrix_view<float>(x, n, dim),
                       .mode = output_mode::accumulate,
                       .activations = options_.activations,
                       .activation = activation,
                       .gate_bias = bias(w.gate_exps_bias, fe),
                       .up_bias = bias(w.up_exps_bias, fe),
                       .down_bias = bias(w.down_exps_bias, dim)},
                      moe_ws_);
      if (w.shared_gate.empty()) continue;
    }
    // The dense FFN, or a mixture's shared expert, whose hidden row is
    // scaled by its gate sigmoid(g . x) (the down product is linear).
    const std::size_t f = c.has_experts() ? c.shared_expert_ffn_dim : c.ffn_dim;
    product(exec, xn, n, w.w_gate_up, ffn_.data(), 2 * f);
    for (std::size_t i = 0; i < n; ++i) {
      float* h = hidden_.data() + i * f;
      detail::gated_activation(activation, ffn_.data() + i * 2 * f, ffn_.data() + i * 2 * f + f, h, f);
      if (!w.shared_gate.empty()) {
        const float g = simd::dot(std::span<const float>(w.shared_gate.data(), dim),
                                  std::span<const float>(xn + i * dim, dim));
        const float scale = 1.0f / (1.0f + std::exp(-g));
        for (std::size_t j = 0; j < f; ++j) h[j] *= scale;
      }
    }
    add_to_residual(exec, hidden_.data(), n, w.w_down, w.post_ffn_norm);
  }

  const std::size_t n_out = b.n_logits();
  for (std::size_t r = 0; r < n_out; ++r)
    simd::rmsnorm(std::span<const float>(x + std::size_t(b.logit_rows[r]) * dim, dim), output_norm_,
                  std::span(xn + r * dim, dim), c.rms_eps);
  product(exec, xn, n_out, c_output(), logits_.data(), c.n_vocab, output_mode::overwrite);
  if (c.final_softcap > 0.0f) detail::softcap(logits_.data(), n_out * c.n_vocab, c.final_softcap);
  return matrix_view<const float>(logits_.data(), n_out, c.n_vocab);
}

template <class Exec>
void llama_model::product(Exec& exec, const float* x, std::size_t n, const weight_matrix& w, float* y,
                          std::size_t y_stride, output_mode mode) {
  detail::linear(exec, x, n, w, y, y_stride, mode == output_mode::accumulate, options_.activations, q8_x_);
}

template <class Exec>
void llama_model::add_to_residual(Exec& exec, const float* in, std::size_t n, const weight_matrix& w,
                                  const aligned_vector<float>& post_norm, const aligned_vector<float>& bias) {
  const std::size_t dim = config_.dim;
  if (post_norm.empty() && bias.empty()) return product(exec, in, n, w, x_.data(), dim, output_mode::accumulate);
  float* y = xn_.data();
  product(exec, in, n, w, y, dim, output_mode::overwrite);
  if (!bias.empty())
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t d = 0; d < dim; ++d) y[i * dim + d] += bias[d];
  for (std::size_t i = 0; i < n; ++i) {
    if (post_norm.empty()) {
      for (std::size_t d = 0; d < dim; ++d) x_[i * dim + d] += y[i * dim + d];
      continue;
    }
    simd::rmsnorm(std::span<const float>(y + i * dim, dim), post_norm, std::span(y + i * dim, dim), config_.rms_eps);
    for (std::size_t d = 0; d < dim; ++d) x_[i * dim + d] += y[i * dim + d];
  }
}

template <class Exec>
void llama_model::product(Exec& exec, const float* x, std::size_t n, const stacked_matrix& w, float* y,
                          std::size_t y_stride) {
  std::size_t row = 0;
  for (const weight_matrix& part : w.parts) {
    product(exec, x, n, part, y + row, y_stride, output_mode::overwrite);
    row += part.rows();
  }
}

template <class Cache>
void llama_model::plan_segments(const batch& b, const Cache& cache) {
  segments_.clear();
  const std::size_t n = b.n_tokens();
  for (std::size_t i = 0; i < n;) {
    const kv::seq_id s = b.seq_ids[i];
    std::size_t j = i + 1;
    while (j < n && b.seq_ids[j] == s) ++j;
    for (const segment& earlier : segments_)  // few segments per batch: a scan beats a hash set
      LLMKIT_CHECK(earlier.seq != s, "llama_model::forward: sequence ", s,
                   " appears in more than one run of the batch (token ", i, "); its tokens must be contiguous");
    const std::size_t base = cache.n_tokens(s);
    for (std::size_t k = i; k < j; ++k)
      LLMKIT_CHECK(b.positions[k] == static_cast<std::int32_t>(base + (k - i)), "llama_model::forward: positions[",
                   k, "] = ", b.positions[k], " but sequence ", s, " continues at position ", base + (k - i));
    segments_.push_back({s, i, j - i, base});
    i = j;
  }
  // Segments of one token are decode rows (attention::decode), and so is
  // every row of a stepwise segment; longer ones go through
  // attention::prefill. attention_row_ maps a batch row to its row in the
  // attention order: prefill rows first, then decode rows.
  auto stepwise = [&](const segment& seg) {
    return seg.count > 1 && std::find(b.stepwise_seqs.begin(), b.stepwise_seqs.end(), seg.seq) != b.stepwise_seqs.end();
  };
  cu_seqlens_.assign(1, 0);
  prefill_seqs_.clear();
  decode_seqs_.clear();
  decode_last_.clear();
  decode_views_.clear();
  stepwise_ = false;
  attention_row_.resize(n);
  attention_work_ = 0;
  decode_work_ = 0;
  std::int32_t next = 0;
  const double width = double(config_.n_heads * config_.head_dim);
  for (const segment& seg : segments_) {
    if (seg.count == 1 || stepwise(seg)) continue;
    for (std::size_t k = 0; k < seg.count; ++k) attention_row_[seg.first + k] = next++;
    cu_seqlens_.push_back(next);
    prefill_seqs_.push_back(seg.seq);
    // (query, key) pairs the causal mask keeps, times the head width.
    const double q = double(seg.count), k0 = double(seg.base);
    attention_work_ += (q * k0 + q * (q + 1) / 2) * width;
  }
  for (const segment& seg : segments_) {
    if (seg.count != 1 && !stepwise(seg)) continue;
    stepwise_ = stepwise_ || seg.count > 1;
    for (std::size_t k = 0; k < seg.count; ++k) {
      attention_row_[seg.first + k] = next++;
      decode_views_.push_back(static_cast<kv::seq_id>(decode_seqs_.size()));
      decode_seqs_.push_back(seg.seq);
      decode_last_.push_back(static_cast<std::int32_t>(seg.base + k));
      decode_work_ += double(seg.base + k + 1) * width;
    }
  }
}

inline void llama_model::rope(std::span<float> heads, std::int32_t position, bool local) const {
  const simd::rope_table& table = local ? local_rope_table_ : rope_table_;
  if (static_cast<std::size_t>(position) < table.max_positions())
    simd::apply_rope(heads, config_.head_dim, position, table);
  else
    simd::apply_rope(heads, config_.head_dim, position, local ? config_.local_rope : config_.rope);
  if (config_.rope_attn_factor != 1.0f) {  // LongRoPE: cos and sin times the factor, so the rotated dims
    const std::size_t hd = config_.head_dim, rotary = config_.rope.rotary_dim == 0 ? hd : config_.rope.rotary_dim;
    for (std::size_t h = 0; h < heads.size() / hd; ++h)
      for (std::size_t j = 0; j < rotary; ++j) heads[h * hd + j] *= config_.rope_attn_factor;
  }
}

}  // namespace llmkit::model

LLMKIT_SIMD_DIAGNOSTICS_END
