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
  c.ffn_dim = file.get<std::size_t>(p + "feed_forward_length");
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
  } else {
    LLMKIT_CHECK(scaling == "none", "llama_config: unsupported ", p, "rope.scaling.type '", scaling, "'");
  }
  if (const gguf_tensor* t = file.find_tensor("rope_freqs.weight")) c.rope.freq_factors = read_rope_freqs(*t, c);
  const gguf_tensor& emb = file.tensor("token_embd.weight");
  c.n_vocab = static_cast<std::size_t>(emb.rows());
  c.tied_output = file.find_tensor("output.weight") == nullptr;
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
}

LLMKIT_DECL std::vector<float> llama_config::read_rope_freqs(const gguf_tensor& t, const llama_config& c) {
  const std::size_t rotary = c.rope.rotary_dim == 0 ? c.head_dim : c.rope.rotary_dim;
  LLMKIT_CHECK(t.type == ggml_type::f32, "llama_config: tensor 'rope_freqs.weight' has type ",
               ggml_type_name(std::uint32_t(t.type)), ", expected F32");
  LLMKIT_CHECK(t.n_dims == 1 && t.dims[0] == rotary / 2, "llama_config: tensor 'rope_freqs.weight' has ",
               t.n_elements, " values in ", t.n_dims, " dims, expected [rotary_dim / 2 = ", rotary / 2, "]");
  std::vector<float> v(rotary / 2);
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i)
    LLMKIT_CHECK(v[i] > 0.0f && std::isfinite(v[i]), "llama_config: tensor 'rope_freqs.weight' value ", i, " = ",
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
