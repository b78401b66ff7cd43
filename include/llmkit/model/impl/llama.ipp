// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/llama.ipp
/// llama_model's loader and workspace (model/llama.hpp): compiled inline by
/// the header, or once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/architecture.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/llama.hpp"
#include "llmkit/model/llama_config.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/moe/expert_tensor.hpp"

namespace llmkit::model {

namespace detail {
/// Checks that a GGUF tensor has shape `[rows, cols]` (ggml dims {cols,
/// rows}; rows == 1 also accepts a 1-D tensor).
inline const gguf_tensor& check_tensor(const gguf_file& file, const std::string& name, std::size_t rows,
                                       std::size_t cols) {
  const gguf_tensor& t = file.tensor(name);
  const bool shape_ok = t.dims[0] == cols && t.rows() == rows && (t.n_dims == 2 || (t.n_dims == 1 && rows == 1));
  LLMKIT_CHECK(shape_ok, "llama_model: tensor '", name, "' has dims [", t.dims[0], ", ", t.dims[1], ", ", t.dims[2],
               ", ", t.dims[3], "], expected [", cols, ", ", rows, "]");
  return t;
}

/// Checks that a GGUF tensor has the 3-D shape `[n_expert, rows, cols]`
/// (ggml dims {cols, rows, n_expert}).
inline const gguf_tensor& check_experts(const gguf_file& file, const std::string& name, std::size_t n_expert,
                                        std::size_t rows, std::size_t cols) {
  const gguf_tensor& t = file.tensor(name);
  LLMKIT_CHECK(t.n_dims == 3 && t.dims[0] == cols && t.dims[1] == rows && t.dims[2] == n_expert,
               "llama_model: tensor '", name, "' has dims [", t.dims[0], ", ", t.dims[1], ", ", t.dims[2], ", ",
               t.dims[3], "], expected [", cols, ", ", rows, ", ", n_expert, "]");
  return t;
}
}  // namespace detail

namespace detail {
/// The file's config with the LongRoPE factors chosen for the options' context.
inline llama_config config_for(const gguf_file& file, const llama_options& options) {
  llama_config c = llama_config::from_gguf(file);
  if (options.context_length != 0) c.use_context(options.context_length);
  return c;
}
}  // namespace detail

LLMKIT_DECL llama_model::llama_model(const gguf_file& file, const llama_options& options)
    : config_(detail::config_for(file, options)),
      options_(options),
      rope_table_(config_.rope, config_.head_dim, std::min<std::size_t>(config_.context_length, rope_table_max_positions)),
      local_rope_table_(config_.sliding_window != 0 ? config_.local_rope : config_.rope, config_.head_dim,
                        config_.sliding_window != 0
                            ? std::min<std::size_t>(config_.context_length, rope_table_max_positions)
                            : 1) {
  const auto& c = config_;
  const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  // Every shape is checked against the file before anything is allocated,
  // so sizes in the metadata cannot make the loader allocate more than the
  // file's tensors hold.
  detail::check_tensor(file, "token_embd.weight", c.n_vocab, c.dim);
  detail::check_tensor(file, "output_norm.weight", 1, c.dim);
  if (!c.tied_output) detail::check_tensor(file, "output.weight", c.n_vocab, c.dim);
  const architecture_traits& arch = traits(c.arch);
  const bool qkv_bias = arch.qkv_bias, qk_norm = arch.qk_norm, post_norms = arch.post_norms,
             fused = arch.fused_projections;
  const std::string ffn_norm = std::string(arch.ffn_norm_tensor) + ".weight";
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    detail::check_tensor(file, b + "attn_norm.weight", 1, c.dim);
    if (fused) {
      detail::check_tensor(file, b + "attn_qkv.weight", qd + 2 * kvd, c.dim);
    } else {
      detail::check_tensor(file, b + "attn_q.weight", qd, c.dim);
      detail::check_tensor(file, b + "attn_k.weight", kvd, c.dim);
      detail::check_tensor(file, b + "attn_v.weight", kvd, c.dim);
    }
    if (qkv_bias) {
      detail::check_tensor(file, b + "attn_q.bias", 1, qd);
      detail::check_tensor(file, b + "attn_k.bias", 1, kvd);
      detail::check_tensor(file, b + "attn_v.bias", 1, kvd);
    }
    if (qk_norm) {
      detail::check_tensor(file, b + "attn_q_norm.weight", 1, c.head_dim);
      detail::check_tensor(file, b + "attn_k_norm.weight", 1, c.head_dim);
    }
    detail::check_tensor(file, b + "attn_output.weight", c.dim, qd);
    if (arch.output_bias) detail::check_tensor(file, b + "attn_output.bias", 1, c.dim);
    if (arch.attention_sinks) detail::check_tensor(file, b + "attn_sinks.weight", 1, c.n_heads);
    detail::check_tensor(file, b + ffn_norm, 1, c.dim);
    if (post_norms) {
      detail::check_tensor(file, b + "post_attention_norm.weight", 1, c.dim);
      detail::check_tensor(file, b + "post_ffw_norm.weight", 1, c.dim);
    }
    if (c.has_experts()) {
      detail::check_tensor(file, b + "ffn_gate_inp.weight", c.n_expert, c.dim);
      detail::check_experts(file, b + "ffn_gate_exps.weight", c.n_expert, c.expert_ffn_dim, c.dim);
      detail::check_experts(file, b + "ffn_up_exps.weight", c.n_expert, c.expert_ffn_dim, c.dim);
      detail::check_experts(file, b + "ffn_down_exps.weight", c.n_expert, c.dim, c.expert_ffn_dim);
      if (arch.expert_biases) {
        detail::check_tensor(file, b + "ffn_gate_inp.bias", 1, c.n_expert);
        detail::check_tensor(file, b + "ffn_gate_exps.bias", c.n_expert, c.expert_ffn_dim);
        detail::check_tensor(file, b + "ffn_up_exps.bias", c.n_expert, c.expert_ffn_dim);
        detail::check_tensor(file, b + "ffn_down_exps.bias", c.n_expert, c.dim);
      }
      if (arch.shared_expert) {
        const std::size_t fs = c.shared_expert_ffn_dim;
        detail::check_tensor(file, b + "ffn_gate_inp_shexp.weight", 1, c.dim);
        detail::check_tensor(file, b + "ffn_gate_shexp.weight", fs, c.dim);
        detail::check_tensor(file, b + "ffn_up_shexp.weight", fs, c.dim);
        detail::check_tensor(file, b + "ffn_down_shexp.weight", c.dim, fs);
      }
      continue;
    }
    if (!fused) detail::check_tensor(file, b + "ffn_gate.weight", c.ffn_dim, c.dim);
    detail::check_tensor(file, b + "ffn_up.weight", fused ? 2 * c.ffn_dim : c.ffn_dim, c.dim);
    detail::check_tensor(file, b + "ffn_down.weight", c.dim, c.ffn_dim);
  }
  // The mapping the in-place matrices hold; null when they must be copies.
  const std::shared_ptr<const void> owner = options_.weights_in_place ? file.mapping_owner() : nullptr;
  auto in_place = [&](const gguf_tensor& t, std::size_t cols) {
    return owner != nullptr && keeps_file_layout(resolve_weight_type(options_.weight_type, t.type, cols), t.type);
  };
  auto load_matrix = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    const gguf_tensor& t = file.tensor(name);
    if (in_place(t, cols)) {
      if (options_.lock_weights) file.lock(t);
      file.advise(t, page_advice::will_need);
      return weight_matrix::in_place(t, owner);
    }
    weight_matrix m(resolve_weight_type(options_.weight_type, t.type, cols), rows, cols);
    m.copy_from(t, 0);
    file.advise(t, page_advice::dont_need);  // the copy is what the model reads
    return m;
  };
  // A 3-D expert tensor: each expert's slice in place, or copied as load_matrix does.
  auto load_experts = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    const gguf_tensor& t = file.tensor(name);
    const bool view = in_place(t, cols);
    if (view && options_.lock_weights) file.lock(t);
    std::vector<weight_matrix> experts;
    experts.reserve(c.n_expert);
    for (std::size_t e = 0; e < c.n_expert; ++e) {
      const gguf_tensor slice = moe::expert_slice(t, e);
      if (view) {
        experts.push_back(weight_matrix::in_place(slice, owner));
        continue;
      }
      experts.emplace_back(resolve_weight_type(options_.weight_type, t.type, cols), rows, cols);
      experts.back().copy_from(slice, 0);
    }
    // Only the routed experts are read: no read-ahead of the whole tensor.
    if (!view) file.advise(t, page_advice::dont_need);
    return moe::expert_tensor(std::move(experts));
  };
  // Tensors multiplied by the same input: fused into one matrix when they
  // resolve to one storage, else kept apart (see stacked_matrix).
  // In place, each keeps its own bytes: one product per part.
  auto load_stacked = [&](std::initializer_list<std::string> names, std::size_t cols) {
    const weight_type type = resolve_weight_type(options_.weight_type, file.tensor(*names.begin()).type, cols);
    bool same = true, all_in_place = true;
    std::size_t rows = 0;
    for (const std::string& name : names) {
      const gguf_tensor& t = file.tensor(name);
      same = same && resolve_weight_type(options_.weight_type, t.type, cols) == type;
      all_in_place = all_in_place && in_place(t, cols);
      rows += static_cast<std::size_t>(t.rows());
    }
    stacked_matrix m;
    if (!same || all_in_place) {
      for (const std::string& name : names)
        m.parts.push_back(load_matrix(name, static_cast<std::size_t>(file.tensor(name).rows()), cols));
      return m;
    }
    weight_matrix fused(type, rows, cols);
    std::size_t row = 0;
    for (const std::string& name : names) {
      const gguf_tensor& t = file.tensor(name);
      fused.copy_from(t, row);
      file.advise(t, page_advice::dont_need);
      row += static_cast<std::size_t>(t.rows());
    }
    m.parts.push_back(std::move(fused));
    return m;
  };
  // Norm weights and biases: f32 vectors, concatenated when several.
  auto load_vector = [&](std::initializer_list<std::string> names, std::size_t n) {
    aligned_vector<float> v(n);
    std::size_t at = 0;
    for (const std::string& name : names) {
      const gguf_tensor& t = file.tensor(name);
      const std::size_t len = static_cast<std::size_t>(t.dims[0]);
      weight_matrix m(weight_type::f32, 1, len);
      m.copy_from(t, 0);
      m.row(0, std::span(v.data() + at, len));
      at += len;
    }
    return v;
  };
  auto load_norm = [&](const std::string& name) { return load_vector({name}, c.dim); };
  // A [rows, cols] F32 tensor (the experts' biases), row after row.
  auto load_rows = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    weight_matrix m(weight_type::f32, rows, cols);
    m.copy_from(file.tensor(name), 0);
    aligned_vector<float> v(rows * cols);
    for (std::size_t r = 0; r < rows; ++r) m.row(r, std::span(v.data() + r * cols, cols));
    return v;
  };
  token_embd_ = load_matrix("token_embd.weight", c.n_vocab, c.dim);
  output_norm_ = load_norm("output_norm.weight");
  if (!c.tied_output) output_ = load_matrix("output.weight", c.n_vocab, c.dim);
  layers_.resize(c.n_layers);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    layer& w = layers_[l];
    w.attn_norm = load_norm(b + "attn_norm.weight");
    w.wqkv = fused ? load_stacked({b + "attn_qkv.weight"}, c.dim)
                   : load_stacked({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"}, c.dim);
    if (qkv_bias) w.bqkv = load_vector({b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}, qd + 2 * kvd);
    if (qk_norm) {
      w.q_norm = load_vector({b + "attn_q_norm.weight"}, c.head_dim);
      w.k_norm = load_vector({b + "attn_k_norm.weight"}, c.head_dim);
    }
    w.wo = load_matrix(b + "attn_output.weight", c.dim, qd);
    if (arch.output_bias) w.bo = load_vector({b + "attn_output.bias"}, c.dim);
    if (arch.attention_sinks) w.sinks = load_vector({b + "attn_sinks.weight"}, c.n_heads);
    w.ffn_norm = load_norm(b + ffn_norm);
    if (post_norms) {
      w.post_attn_norm = load_norm(b + "post_attention_norm.weight");
      w.post_ffn_norm = load_norm(b + "post_ffw_norm.weight");
    }
    if (c.has_experts()) {
      w.router = load_matrix(b + "ffn_gate_inp.weight", c.n_expert, c.dim);
      w.gate_exps = load_experts(b + "ffn_gate_exps.weight", c.expert_ffn_dim, c.dim);
      w.up_exps = load_experts(b + "ffn_up_exps.weight", c.expert_ffn_dim, c.dim);
      w.down_exps = load_experts(b + "ffn_down_exps.weight", c.dim, c.expert_ffn_dim);
      if (arch.expert_biases) {
        w.router_bias = load_vector({b + "ffn_gate_inp.bias"}, c.n_expert);
        w.gate_exps_bias = load_rows(b + "ffn_gate_exps.bias", c.n_expert, c.expert_ffn_dim);
        w.up_exps_bias = load_rows(b + "ffn_up_exps.bias", c.n_expert, c.expert_ffn_dim);
        w.down_exps_bias = load_rows(b + "ffn_down_exps.bias", c.n_expert, c.dim);
      }
      if (arch.shared_expert) {  // a dense SwiGLU FFN in the dense path's matrices, and its gate
        w.shared_gate = load_vector({b + "ffn_gate_inp_shexp.weight"}, c.dim);
        w.w_gate_up = load_stacked({b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight"}, c.dim);
        w.w_down = load_matrix(b + "ffn_down_shexp.weight", c.dim, c.shared_expert_ffn_dim);
      }
      continue;
    }
    w.w_gate_up = fused ? load_stacked({b + "ffn_up.weight"}, c.dim)
                        : load_stacked({b + "ffn_gate.weight", b + "ffn_up.weight"}, c.dim);
    w.w_down = load_matrix(b + "ffn_down.weight", c.dim, c.ffn_dim);
  }
}

LLMKIT_DECL void llama_model::reserve(std::size_t n, std::size_t n_out) {
  const auto& c = config_;
  const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  // Exact growth: release the old buffer, then allocate `size` (a plain
  // resize would double the capacity, up to 2x the largest forward's
  // activations kept for the model's lifetime).
  auto ensure = [](aligned_vector<float>& v, std::size_t size) {
    if (v.size() >= size) return;
    v.clear();
    v.shrink_to_fit();
    v.resize(size);
  };
  ensure(x_, n * c.dim);
  ensure(xn_, std::max(n, n_out) * c.dim);
  ensure(qkv_, n * (qd + 2 * kvd));
  ensure(k_, n * kvd);
  ensure(v_, n * kvd);
  ensure(q_, n * qd);
  ensure(att_, n * qd);
  if (c.has_experts()) {
    ensure(router_logits_, n * c.n_expert);
    ensure(route_weights_, n * c.n_expert_used);
    if (route_ids_.size() < n * c.n_expert_used) route_ids_.resize(n * c.n_expert_used);
  }
  if (const std::size_t f = c.has_experts() ? c.shared_expert_ffn_dim : c.ffn_dim; f != 0) {
    ensure(ffn_, n * 2 * f);
    ensure(hidden_, n * f);
  }
  ensure(logits_, n_out * c.n_vocab);
}

}  // namespace llmkit::model
