// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/llama_config.ipp
/// Reading and checking llama_config (model/llama_config.hpp): compiled
/// inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "llmkit/attention/head_dims.hpp"
#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/architecture.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/llama_config.hpp"

namespace llmkit::model {

LLMKIT_DECL llama_config llama_config::from_gguf(const gguf_file& file) {
  const auto arch_name = file.get<std::string_view>("general.architecture");
  llama_config c;
  c.arch = architecture_from_name(arch_name);
  const std::string p = std::string(arch_name) + ".";
  c.dim = file.get<std::size_t>(p + "embedding_length");
  c.n_layers = file.get<std::size_t>(p + "block_count");
  c.n_heads = file.get<std::size_t>(p + "attention.head_count");
  c.n_kv_heads = file.get_optional<std::size_t>(p + "attention.head_count_kv").value_or(c.n_heads);
  if (traits(c.arch).routed_experts) {
    c.n_expert = file.get<std::size_t>(p + "expert_count");
    c.n_expert_used = file.get<std::size_t>(p + "expert_used_count");
    c.expert_ffn_dim = file.get<std::size_t>(p + "expert_feed_forward_length");
    c.expert_weights_norm =
        file.get_optional<bool>(p + "expert_weights_norm").value_or(traits(c.arch).expert_weights_norm);
    LLMKIT_CHECK(c.n_expert >= 1, "llama_config: ", p, "expert_count = 0 (", arch_name, " has routed experts)");
  }
  // A mixture of experts has no dense feed-forward; its files may still carry the key.
  c.ffn_dim = c.has_experts() ? file.get_optional<std::size_t>(p + "feed_forward_length").value_or(c.expert_ffn_dim)
                              : file.get<std::size_t>(p + "feed_forward_length");
  if (traits(c.arch).shared_expert)
    c.shared_expert_ffn_dim = file.get_optional<std::size_t>(p + "expert_shared_feed_forward_length")
                                  .value_or(file.get<std::size_t>(p + "feed_forward_length"));
  c.context_length = file.get_optional<std::size_t>(p + "context_length").value_or(2048);
  c.rms_eps = file.get_optional<float>(p + "attention.layer_norm_rms_epsilon").value_or(1e-5f);
  LLMKIT_CHECK(c.n_heads > 0, "llama_config: ", p, "attention.head_count must be > 0");
  c.head_dim = c.dim / c.n_heads;
  if (auto kl = file.get_optional<std::size_t>(p + "attention.key_length")) c.head_dim = *kl;
  // One head width for keys and values: the cache stores both at head_dim.
  if (auto vl = file.get_optional<std::size_t>(p + "attention.value_length"))
    LLMKIT_CHECK(*vl == c.head_dim, "llama_config: ", p, "attention.value_length = ", *vl, " differs from the key length ",
                 c.head_dim, " (unsupported)");
  c.rope.theta = file.get_optional<float>(p + "rope.freq_base").value_or(10000.0f);
  c.rope.layout = traits(c.arch).rope_layout;
  c.rope.rotary_dim = file.get_optional<std::size_t>(p + "rope.dimension_count").value_or(c.head_dim);
  const auto scaling = file.get_optional<std::string_view>(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const float factor = file.get<float>(p + "rope.scaling.factor");
    LLMKIT_CHECK(factor > 0.0f && std::isfinite(factor), "llama_config: ", p, "rope.scaling.factor must be > 0, got ",
                 factor);
    c.rope.freq_scale = 1.0f / factor;
  } else if (scaling == "yarn") {
    const float factor = file.get<float>(p + "rope.scaling.factor");
    LLMKIT_CHECK(factor > 0.0f && std::isfinite(factor), "llama_config: ", p, "rope.scaling.factor must be > 0, got ",
                 factor);
    c.rope.freq_scale = 1.0f / factor;
    c.rope.yarn = {.ext_factor = file.get_optional<float>(p + "rope.scaling.yarn_ext_factor").value_or(1.0f),
                   .beta_fast = file.get_optional<float>(p + "rope.scaling.yarn_beta_fast").value_or(32.0f),
                   .beta_slow = file.get_optional<float>(p + "rope.scaling.yarn_beta_slow").value_or(1.0f),
                   .original_context = file.get<std::size_t>(p + "rope.scaling.original_context_length")};
  } else {
    LLMKIT_CHECK(scaling == "none", "llama_config: unsupported ", p, "rope.scaling.type '", scaling,
                 "' (supported: none, linear, yarn)");
  }
  if (const gguf_tensor* t = file.find_tensor("rope_freqs.weight")) c.rope.freq_factors = read_rope_freqs(*t, c);
  const gguf_tensor* long_factors = file.find_tensor("rope_factors_long.weight");
  const gguf_tensor* short_factors = file.find_tensor("rope_factors_short.weight");
  LLMKIT_CHECK((long_factors == nullptr) == (short_factors == nullptr), "llama_config: tensor '",
               long_factors ? "rope_factors_long.weight" : "rope_factors_short.weight", "' without '",
               long_factors ? "rope_factors_short.weight" : "rope_factors_long.weight", "'");
  if (long_factors != nullptr) {
    LLMKIT_CHECK(c.rope.freq_factors.empty(), "llama_config: rope_freqs.weight and LongRoPE factors together");
    c.rope_long_factors = read_rope_freqs(*long_factors, c);
    c.rope_short_factors = read_rope_freqs(*short_factors, c);
  }
  c.original_context_length = file.get_optional<std::size_t>(p + "rope.scaling.original_context_length").value_or(0);
  c.rope_attn_factor = file.get_optional<float>(p + "rope.scaling.attn_factor").value_or(1.0f);
  c.use_context(c.context_length);
  const gguf_tensor& emb = file.tensor("token_embd.weight");
  c.n_vocab = static_cast<std::size_t>(emb.rows());
  c.tied_output = file.find_tensor("output.weight") == nullptr;
  const architecture_traits& t = traits(c.arch);
  c.attention_scale = file.get_optional<float>(p + "attention.scale").value_or(0.0f);
  if (!file.contains(p + "attention.scale") && t.wide_query_scale_layers != 0 && c.n_layers == t.wide_query_scale_layers)
    c.attention_scale = 1.0f / std::sqrt(float(c.dim / c.n_heads));
  c.attention_softcap = file.get_optional<float>(p + "attn_logit_softcapping").value_or(0.0f);
  c.final_softcap = file.get_optional<float>(p + "final_logit_softcapping").value_or(0.0f);
  read_sliding_window(file, p, c);
  c.validate();
  return c;
}

LLMKIT_DECL void llama_config::validate() const {
  LLMKIT_CHECK(n_vocab > 0 && n_vocab <= std::size_t(INT32_MAX), "llama_config: n_vocab = ", n_vocab,
               " must be in [1, 2^31)");
  constexpr std::size_t max_extent = std::size_t{1} << 24;  // keeps every size product far from overflow
  for (auto [name, value] : {std::pair{"dim", dim}, std::pair{"n_layers", n_layers}, std::pair{"n_heads", n_heads},
                             std::pair{"n_kv_heads", n_kv_heads}, std::pair{"ffn_dim", ffn_dim}})
    LLMKIT_CHECK(value <= max_extent, "llama_config: ", name, " = ", value, " exceeds ", max_extent);
  LLMKIT_CHECK(dim > 0, "llama_config: dim must be > 0");
  LLMKIT_CHECK(n_layers > 0, "llama_config: n_layers must be > 0");
  LLMKIT_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0, "llama_config: n_heads = ", n_heads,
               " is not a positive multiple of n_kv_heads = ", n_kv_heads);
  LLMKIT_CHECK(attention::supports_head_dim(head_dim), "llama_config: head_dim = ", head_dim,
               " is not supported by the attention kernels (supported: ", attention::supported_head_dims_text(), ")");
  LLMKIT_CHECK(ffn_dim > 0, "llama_config: ffn_dim must be > 0");
  LLMKIT_CHECK(context_length > 0 && context_length <= (std::size_t{1} << 24), "llama_config: context_length = ",
               context_length, " must be in [1, 2^24]");
  LLMKIT_CHECK(rms_eps >= 0.0f && std::isfinite(rms_eps), "llama_config: rms_eps = ", rms_eps,
               " must be finite and >= 0");
  LLMKIT_CHECK(rope.rotary_dim <= head_dim && rope.rotary_dim % 2 == 0, "llama_config: rope.rotary_dim = ",
               rope.rotary_dim, " must be even and <= head_dim = ", head_dim);
  const std::size_t rotary = rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
  LLMKIT_CHECK(rope.freq_factors.empty() || rope.freq_factors.size() == rotary / 2,
               "llama_config: rope.freq_factors has ", rope.freq_factors.size(), " values, expected rotary_dim / 2 = ",
               rotary / 2);
  for (std::size_t i = 0; i < rope.freq_factors.size(); ++i)
    LLMKIT_CHECK(rope.freq_factors[i] > 0.0f && std::isfinite(rope.freq_factors[i]), "llama_config: rope.freq_factors[",
                 i, "] = ", rope.freq_factors[i], " must be finite and > 0");
  for (auto [name, value] : {std::pair{"attention_scale", attention_scale},
                             std::pair{"attention_softcap", attention_softcap},
                             std::pair{"final_softcap", final_softcap}})
    LLMKIT_CHECK(value >= 0.0f && std::isfinite(value), "llama_config: ", name, " = ", value,
                 " must be finite and >= 0");
  for (const simd::rope_config* r : {&rope, &local_rope})
    if (r->yarn.ext_factor != 0.0f) simd::detail::rope_rotary_dim(*r, head_dim);  // checks the YaRN fields
  LLMKIT_CHECK(rope_attn_factor > 0.0f && std::isfinite(rope_attn_factor), "llama_config: rope_attn_factor = ",
               rope_attn_factor, " must be finite and > 0");
  LLMKIT_CHECK(rope_long_factors.size() == rope_short_factors.size() &&
                   (rope_long_factors.empty() || rope_long_factors.size() == rotary / 2),
               "llama_config: LongRoPE factors have ", rope_long_factors.size(), " (long) and ",
               rope_short_factors.size(), " (short) values, expected rotary_dim / 2 = ", rotary / 2, " each");
  for (const auto* set : {&rope_long_factors, &rope_short_factors})
    for (std::size_t i = 0; i < set->size(); ++i)
      LLMKIT_CHECK((*set)[i] > 0.0f && std::isfinite((*set)[i]), "llama_config: LongRoPE factor ", i, " = ",
                   (*set)[i], " must be finite and > 0");
  LLMKIT_CHECK(sliding_window <= context_length, "llama_config: sliding_window = ", sliding_window,
               " exceeds context_length = ", context_length);
  LLMKIT_CHECK((sliding_window == 0) == local_layers.empty(), "llama_config: local_layers has ", local_layers.size(),
               " entries with sliding_window = ", sliding_window, " (both or neither)");
  if (n_expert != 0 || traits(arch).routed_experts) {
    LLMKIT_CHECK(traits(arch).routed_experts, "llama_config: n_expert = ", n_expert, " for ", traits(arch).name,
                 ", which has no routed experts");
    LLMKIT_CHECK(n_expert >= 1 && n_expert <= 4096, "llama_config: n_expert = ", n_expert, " must be in [1, 4096]");
    LLMKIT_CHECK(n_expert_used >= 1 && n_expert_used <= n_expert, "llama_config: n_expert_used = ", n_expert_used,
                 " must be in [1, n_expert = ", n_expert, "]");
    LLMKIT_CHECK(expert_ffn_dim > 0 && expert_ffn_dim <= max_extent, "llama_config: expert_ffn_dim = ",
                 expert_ffn_dim, " must be in [1, ", max_extent, "]");
  }
  if (traits(arch).shared_expert)
    LLMKIT_CHECK(shared_expert_ffn_dim > 0 && shared_expert_ffn_dim <= max_extent,
                 "llama_config: shared_expert_ffn_dim = ", shared_expert_ffn_dim, " must be in [1, ", max_extent,
                 "] for ", traits(arch).name);
  else
    LLMKIT_CHECK(shared_expert_ffn_dim == 0, "llama_config: shared_expert_ffn_dim = ", shared_expert_ffn_dim, " for ",
                 traits(arch).name, ", which has no shared expert");
  if (sliding_window == 0) return;
  LLMKIT_CHECK(local_layers.size() == n_layers, "llama_config: local_layers has ", local_layers.size(),
               " entries for ", n_layers, " layers");
  LLMKIT_CHECK(local_rope.layout == rope.layout && local_rope.rotary_dim == rope.rotary_dim &&
                   local_rope.theta > 0.0f && std::isfinite(local_rope.theta) && std::isfinite(local_rope.freq_scale),
               "llama_config: local_rope (theta ", local_rope.theta, ", rotary_dim ", local_rope.rotary_dim,
               ") must have a finite theta > 0 and the layout and rotary_dim of rope");
}

LLMKIT_DECL void llama_config::read_sliding_window(const gguf_file& file, const std::string& p, llama_config& c) {
  const architecture_traits& t = traits(c.arch);
  const auto window = file.get_optional<std::size_t>(p + "attention.sliding_window");
  LLMKIT_CHECK(window || t.window_pattern == 0, "llama_config: missing ", p, "attention.sliding_window (", t.name,
               " has sliding-window layers)");
  if (!window) return;
  LLMKIT_CHECK(*window > 0, "llama_config: ", p, "attention.sliding_window must be > 0");
  if (*window >= c.context_length && t.window_beyond_context_is_full) return;
  LLMKIT_CHECK(*window <= c.context_length, "llama_config: ", p, "attention.sliding_window = ", *window,
               " exceeds the context_length ", c.context_length);
  c.sliding_window = *window;
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  const gguf_value* pattern = file.find(pattern_key);
  if (pattern != nullptr && std::holds_alternative<gguf_array>(*pattern)) {
    // One flag per layer, true = local (llama.cpp's swa_layers).
    const gguf_array& a = std::get<gguf_array>(*pattern);
    LLMKIT_CHECK(a.size() == c.n_layers, "llama_config: ", pattern_key, " has ", a.size(), " entries for ", c.n_layers,
                 " layers");
    c.local_layers.resize(c.n_layers);
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const auto v = a.type() == gguf_type::boolean ? std::uint32_t(a.get<bool>(l)) : a.get<std::uint32_t>(l);
      LLMKIT_CHECK(v <= 1, "llama_config: ", pattern_key, "[", l, "] = ", v, " is not a flag (0 or 1)");
      c.local_layers[l] = std::uint8_t(v);
    }
  } else {
    const std::size_t every = pattern != nullptr ? file.get<std::size_t>(pattern_key) : t.window_pattern;
    LLMKIT_CHECK(pattern == nullptr || every >= 1, "llama_config: unknown layer pattern ", pattern_key, " = ", every,
                 " (expected every n-th layer global, n >= 1, or one flag per layer)");
    c.local_layers = every == 0 ? std::vector<std::uint8_t>(c.n_layers, 1) : local_layer_pattern(c.n_layers, every);
  }
  c.local_rope = c.rope;
  const float local_theta = t.local_rope_theta != 0.0f ? t.local_rope_theta : c.rope.theta;
  c.local_rope.theta = file.get_optional<float>(p + "rope.freq_base_swa").value_or(local_theta);
  if (t.local_rope_unscaled) {
    c.local_rope.freq_scale = 1.0f;
    c.local_rope.yarn = {};
  }
}

LLMKIT_DECL std::vector<std::uint8_t> local_layer_pattern(std::size_t n_layers, std::size_t every) {
  LLMKIT_CHECK(every >= 1, "local_layer_pattern: every must be >= 1, got ", every);
  std::vector<std::uint8_t> out(n_layers);
  for (std::size_t l = 0; l < n_layers; ++l) out[l] = (l + 1) % every != 0;
  return out;
}

LLMKIT_DECL std::vector<float> llama_config::read_rope_freqs(const gguf_tensor& t, const llama_config& c) {
  const std::size_t rotary = c.rope.rotary_dim == 0 ? c.head_dim : c.rope.rotary_dim;
  LLMKIT_CHECK(t.type == ggml_type::f32, "llama_config: tensor '", t.name, "' has type ",
               ggml_type_name(std::uint32_t(t.type)), ", expected F32");
  LLMKIT_CHECK(t.n_dims == 1 && t.dims[0] == rotary / 2, "llama_config: tensor '", t.name, "' has ",
               t.n_elements, " values in ", t.n_dims, " dims, expected [rotary_dim / 2 = ", rotary / 2, "]");
  std::vector<float> v(rotary / 2);
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i)
    LLMKIT_CHECK(v[i] > 0.0f && std::isfinite(v[i]), "llama_config: tensor '", t.name, "' value ", i, " = ",
                 v[i], " must be finite and > 0");
  return v;
}

LLMKIT_DECL std::vector<float> llama3_rope_freq_factors(const llama3_rope_scaling& s, float theta, std::size_t rotary_dim) {
  LLMKIT_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "llama3_rope_freq_factors: rotary_dim = ", rotary_dim,
               " must be even and > 0");
  LLMKIT_CHECK(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0.0f && s.factor > 0.0f,
               "llama3_rope_freq_factors: needs high_freq_factor (", s.high_freq_factor, ") > low_freq_factor (",
               s.low_freq_factor, ") > 0 and factor (", s.factor, ") > 0");
  const double context = double(s.original_context_length);
  const double low_wavelen = context / s.low_freq_factor, high_wavelen = context / s.high_freq_factor;
  std::vector<float> out(rotary_dim / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double freq = std::pow(double(theta), -2.0 * double(i) / double(rotary_dim));
    const double wavelen = 2.0 * 3.14159265358979323846 / freq;
    double f = 1.0;
    if (wavelen > low_wavelen) {
      f = s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

}  // namespace llmkit::model
