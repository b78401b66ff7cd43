// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/synthetic.ipp
/// The synthetic-model writer (model/synthetic.hpp): compiled inline by the
/// header, or once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/architecture.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"
#include "llmkit/model/llama_config.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/model/synthetic.hpp"

namespace llmkit::model {

LLMKIT_DECL tensor_type_rule q4_k_m_types(const synthetic_options& options) {
  const std::size_t n_layers = options.config.n_layers;
  const std::string_view output = options.tied_output ? "token_embd.weight" : "output.weight";
  return [n_layers, output](std::string_view name) {
    if (name == output) return ggml_type::q6_k;
    const auto n = static_cast<long>(n_layers);
    auto more_bits = [n](long l) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; };
    long layer = -1;
    if (name.starts_with("blk.")) layer = std::strtol(std::string(name.substr(4)).c_str(), nullptr, 10);
    const bool sensitive = name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight") ||
                           name.ends_with(".ffn_down_exps.weight");
    return layer >= 0 && sensitive && more_bits(layer) ? ggml_type::q6_k : ggml_type::q4_k;
  };
}

namespace detail {
/// `wanted` for a matrix `name` of rows `cols` long, or llama-quantize's
/// fallback when the K-quants' 256-value blocks do not divide `cols`.
/// @throws llmkit::error naming the tensor when neither fits.
inline ggml_type fitting_type(ggml_type wanted, const std::string& name, std::size_t cols) {
  if (cols % ggml_block_elements(wanted) == 0) return wanted;
  ggml_type fallback = wanted;
  switch (wanted) {
    case ggml_type::q4_k: fallback = ggml_type::q5_0; break;
    case ggml_type::q5_k: fallback = ggml_type::q5_1; break;
    case ggml_type::q6_k: fallback = ggml_type::q8_0; break;
    case ggml_type::q2_k: case ggml_type::q3_k: case ggml_type::iq4_xs: fallback = ggml_type::iq4_nl; break;
    default: break;
  }
  LLMKIT_CHECK(cols % ggml_block_elements(fallback) == 0, "synthetic_llama: tensor '", name, "' has rows of ", cols,
               " values, not a multiple of the ", ggml_block_elements(fallback), "-value blocks of ",
               ggml_type_name(std::uint32_t(fallback)),
               fallback == wanted ? "" : std::string(" (the fallback of ") + std::string(ggml_type_name(std::uint32_t(wanted))) + ")");
  return fallback;
}

/// Distinct vocabulary pieces: "▁", then a..z, aa..zz, ... with and without
/// the "▁" prefix, alternately.
inline std::string synthetic_piece(std::size_t i) {
  const bool word_start = i % 2 == 0;
  std::size_t k = i / 2;
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('a' + k % 26));
    k /= 26;
  } while (k-- > 0);
  return word_start ? "\xe2\x96\x81" + s : s;
}
}  // namespace detail

namespace detail {
/// The synthetic image, its tensors filled now or, when `deferred`, as the
/// file is written (one tensor in memory at a time).
inline gguf_writer synthetic_image(const synthetic_options& options, bool deferred) {
  llama_config c = options.config;
  c.tied_output = options.tied_output;
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  if (c.rope.rotary_dim == 0) c.rope.rotary_dim = c.head_dim;
  const architecture_traits& arch = traits(c.arch);
  LLMKIT_CHECK(c.sliding_window > 0 || arch.window_pattern == 0, "synthetic_llama: ", arch.name,
               " needs config.sliding_window > 0");
  // The pattern is written only when the caller gives one; otherwise the
  // reader's default (the architecture's, or every layer) applies.
  const bool write_pattern = !c.local_layers.empty();
  if (c.sliding_window > 0 && c.local_layers.empty())
    c.local_layers = arch.window_pattern != 0 ? local_layer_pattern(c.n_layers, arch.window_pattern)
                                              : std::vector<std::uint8_t>(c.n_layers, 1);
  if (c.sliding_window > 0) c.local_rope = c.rope;  // the reader derives it
  if (arch.shared_expert && c.shared_expert_ffn_dim == 0) c.shared_expert_ffn_dim = c.ffn_dim;
  c.validate();
  LLMKIT_CHECK(c.n_vocab >= 3, "synthetic_llama: n_vocab must be >= 3 (control tokens), got ", c.n_vocab);
  if (!options.tensor_types) {
    const std::size_t block = ggml_block_elements(options.weight_type);
    const std::size_t ffn = c.has_experts() ? c.expert_ffn_dim : c.ffn_dim;
    LLMKIT_CHECK(c.dim % block == 0 && ffn % block == 0 && (c.n_heads * c.head_dim) % block == 0,
                 "synthetic_llama: weight type ", ggml_type_name(std::uint32_t(options.weight_type)), " needs dim (",
                 c.dim, "), ", c.has_experts() ? "expert_ffn_dim (" : "ffn_dim (", ffn, ") and n_heads * head_dim (",
                 c.n_heads * c.head_dim, ") to be multiples of ", block);
  }

  const std::string p = std::string(arch.name) + ".";
  gguf_writer w;
  w.add("general.architecture", arch.name);
  w.add("general.name", std::string_view("llmkit-synthetic"));
  w.add(p + "context_length", std::uint32_t(c.context_length));
  w.add(p + "embedding_length", std::uint32_t(c.dim));
  w.add(p + "feed_forward_length", std::uint32_t(c.ffn_dim));
  w.add(p + "block_count", std::uint32_t(c.n_layers));
  w.add(p + "attention.head_count", std::uint32_t(c.n_heads));
  w.add(p + "attention.head_count_kv", std::uint32_t(c.n_kv_heads));
  w.add(p + "attention.layer_norm_rms_epsilon", c.rms_eps);
  if (c.has_experts()) {
    w.add(p + "expert_count", std::uint32_t(c.n_expert));
    w.add(p + "expert_used_count", std::uint32_t(c.n_expert_used));
    w.add(p + "expert_feed_forward_length", std::uint32_t(c.expert_ffn_dim));
    if (c.expert_weights_norm != arch.expert_weights_norm) w.add(p + "expert_weights_norm", c.expert_weights_norm);
    if (arch.shared_expert) w.add(p + "expert_shared_feed_forward_length", std::uint32_t(c.shared_expert_ffn_dim));
  }
  if (c.head_dim != c.dim / c.n_heads) {  // Qwen3: heads wider than dim / n_heads
    w.add(p + "attention.key_length", std::uint32_t(c.head_dim));
    w.add(p + "attention.value_length", std::uint32_t(c.head_dim));
  }
  if (c.sliding_window > 0) {
    w.add(p + "attention.sliding_window", std::uint32_t(c.sliding_window));
    if (write_pattern) {
      const auto flags = std::make_unique<bool[]>(c.n_layers);  // one bool per layer, true = local
      for (std::size_t l = 0; l < c.n_layers; ++l) flags[l] = c.local_layers[l] != 0;
      w.add_array(p + "attention.sliding_window_pattern", std::span<const bool>(flags.get(), c.n_layers));
    }
  }
  if (c.original_context_length != 0)
    w.add(p + "rope.scaling.original_context_length", std::uint32_t(c.original_context_length));
  if (c.rope_attn_factor != 1.0f) w.add(p + "rope.scaling.attn_factor", c.rope_attn_factor);
  if (c.attention_scale != 0.0f) w.add(p + "attention.scale", c.attention_scale);
  if (c.attention_softcap != 0.0f) w.add(p + "attn_logit_softcapping", c.attention_softcap);
  if (c.final_softcap != 0.0f) w.add(p + "final_logit_softcapping", c.final_softcap);
  w.add(p + "rope.freq_base", c.rope.theta);
  w.add(p + "rope.dimension_count", std::uint32_t(c.rope.rotary_dim));
  if (c.rope.yarn.ext_factor != 0.0f) {
    w.add(p + "rope.scaling.type", std::string_view("yarn"));
    w.add(p + "rope.scaling.factor", 1.0f / c.rope.freq_scale);
    w.add(p + "rope.scaling.yarn_ext_factor", c.rope.yarn.ext_factor);
    w.add(p + "rope.scaling.yarn_beta_fast", c.rope.yarn.beta_fast);
    w.add(p + "rope.scaling.yarn_beta_slow", c.rope.yarn.beta_slow);
    if (c.original_context_length == 0)
      w.add(p + "rope.scaling.original_context_length", std::uint32_t(c.rope.yarn.original_context));
  } else if (c.rope.freq_scale != 1.0f) {
    w.add(p + "rope.scaling.type", std::string_view("linear"));
    w.add(p + "rope.scaling.factor", 1.0f / c.rope.freq_scale);
  }

  // Tokenizer: <unk>, <s>, </s>, byte tokens if there is room, then pieces.
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<float> scores{0.0f, 0.0f, 0.0f};
  std::vector<std::int32_t> types{2, 3, 3};
  if (c.n_vocab >= 3 + 256 + 27) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      tokens.emplace_back(name);
      scores.push_back(0.0f);
      types.push_back(6);
    }
  }
  for (std::size_t i = 0; tokens.size() < c.n_vocab; ++i) {
    tokens.push_back(i == 0 ? std::string("\xe2\x96\x81") : detail::synthetic_piece(i - 1));
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  w.add("tokenizer.ggml.model", std::string_view("llama"));
  w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  w.add_array("tokenizer.ggml.scores", std::span<const float>(scores));
  w.add_array("tokenizer.ggml.token_type", std::span<const std::int32_t>(types));
  w.add("tokenizer.ggml.unknown_token_id", std::uint32_t{0});
  w.add("tokenizer.ggml.bos_token_id", std::uint32_t{1});
  w.add("tokenizer.ggml.eos_token_id", std::uint32_t{2});

  // Every value comes from one random stream in tensor order, so a tensor's
  // bytes are the same whether it is filled when added or when written.
  const auto rng = std::make_shared<std::mt19937_64>(options.seed);
  // [n] values uniform in [center - half_width, center + half_width) as
  // `type`, drawn a chunk at a time so a large tensor never exists as floats.
  auto uniform = [rng](ggml_type type, std::size_t n, float center, float half_width) {
    return [rng, type, n, center, half_width](std::span<std::byte> out) {
      constexpr std::size_t chunk = std::size_t{1} << 20;  // a multiple of every block
      std::vector<float> values;
      const std::size_t block = ggml_block_elements(type), block_bytes = ggml_block_bytes(type);
      for (std::size_t at = 0; at < n; at += chunk) {
        values.resize(std::min(chunk, n - at));
        // 24 random bits per value. The offset is exact and std::fma rounds
        // once, so the bytes do not depend on whether the compiler contracts
        // a multiply-add.
        for (auto& v : values) v = std::fma(half_width, static_cast<float>((*rng)() >> 40) * 0x1p-23f - 1.0f, center);
        quantize_row(type, values.data(), out.data() + at / block * block_bytes, values.size());
      }
    };
  };
  // Filled now (an image in memory) or when written (a file).
  auto add = [&](const std::string& name, ggml_type type, std::initializer_list<std::uint64_t> dims,
                 gguf_writer::tensor_fill fill) {
    const std::span<const std::uint64_t> d(dims.begin(), dims.size());
    if (deferred) return w.add_tensor(name, type, d, std::move(fill));
    std::uint64_t n = 1;
    for (auto x : dims) n *= x;
    std::vector<std::byte> bytes(n / ggml_block_elements(type) * ggml_block_bytes(type));
    fill(bytes);
    w.add_tensor(name, type, d, bytes);
  };
  auto constant = [](std::span<const float> values) {
    return [v = std::vector<float>(values.begin(), values.end())](std::span<std::byte> out) {
      std::memcpy(out.data(), v.data(), out.size());
    };
  };
  auto matrix = [&](const std::string& name, std::size_t rows, std::size_t cols, float half_width) {
    const ggml_type type =
        options.tensor_types ? detail::fitting_type(options.tensor_types(name), name, cols) : options.weight_type;
    add(name, type, {cols, rows}, uniform(type, rows * cols, 0.0f, half_width));
  };
  // [n_expert, rows, cols] (dims {cols, rows, n_expert}), expert after expert.
  auto experts = [&](const std::string& name, std::size_t rows, std::size_t cols, float half_width) {
    const ggml_type type =
        options.tensor_types ? detail::fitting_type(options.tensor_types(name), name, cols) : options.weight_type;
    add(name, type, {cols, rows, c.n_expert}, uniform(type, c.n_expert * rows * cols, 0.0f, half_width));
  };
  auto vector = [&](const std::string& name, std::size_t n, float center, float half_width) {
    add(name, ggml_type::f32, {n}, uniform(ggml_type::f32, n, center, half_width));
  };
  auto norm = [&](const std::string& name, std::size_t n) { vector(name, n, 1.0f, 0.1f); };
  if (!c.rope.freq_factors.empty())
    add("rope_freqs.weight", ggml_type::f32, {c.rope.freq_factors.size()}, constant(c.rope.freq_factors));
  if (!c.rope_long_factors.empty()) {
    add("rope_factors_long.weight", ggml_type::f32, {c.rope_long_factors.size()}, constant(c.rope_long_factors));
    add("rope_factors_short.weight", ggml_type::f32, {c.rope_short_factors.size()}, constant(c.rope_short_factors));
  }
  const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const float in_dim = std::sqrt(3.0f / float(c.dim)), in_q = std::sqrt(3.0f / float(qd)),
              in_ffn = std::sqrt(3.0f / float(c.ffn_dim));
  matrix("token_embd.weight", c.n_vocab, c.dim, 1.0f);
  norm("output_norm.weight", c.dim);
  if (!c.tied_output) matrix("output.weight", c.n_vocab, c.dim, in_dim);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    if (arch.fused_projections) {
      matrix(b + "attn_qkv.weight", qd + 2 * kvd, c.dim, in_dim);
    } else {
      matrix(b + "attn_q.weight", qd, c.dim, in_dim);
      matrix(b + "attn_k.weight", kvd, c.dim, in_dim);
      matrix(b + "attn_v.weight", kvd, c.dim, in_dim);
    }
    if (arch.qkv_bias) {
      vector(b + "attn_q.bias", qd, 0.0f, 0.5f);
      vector(b + "attn_k.bias", kvd, 0.0f, 0.5f);
      vector(b + "attn_v.bias", kvd, 0.0f, 0.5f);
    }
    if (arch.qk_norm) {
      norm(b + "attn_q_norm.weight", c.head_dim);
      norm(b + "attn_k_norm.weight", c.head_dim);
    }
    matrix(b + "attn_output.weight", c.dim, qd, in_q);
    if (arch.output_bias) vector(b + "attn_output.bias", c.dim, 0.0f, 0.5f);
    if (arch.attention_sinks) vector(b + "attn_sinks.weight", c.n_heads, 0.0f, 2.0f);
    norm(b + "attn_norm.weight", c.dim);
    if (c.has_experts()) {
      // The router stays F32, as llama-quantize leaves ffn_gate_inp.
      add(b + "ffn_gate_inp.weight", ggml_type::f32, {c.dim, c.n_expert},
          uniform(ggml_type::f32, c.n_expert * c.dim, 0.0f, in_dim));
      const float in_expert = std::sqrt(3.0f / float(c.expert_ffn_dim));
      experts(b + "ffn_gate_exps.weight", c.expert_ffn_dim, c.dim, in_dim);
      experts(b + "ffn_down_exps.weight", c.dim, c.expert_ffn_dim, in_expert);
      experts(b + "ffn_up_exps.weight", c.expert_ffn_dim, c.dim, in_dim);
      if (arch.expert_biases) {  // F32 [n_expert, rows] (dims {rows, n_expert})
        vector(b + "ffn_gate_inp.bias", c.n_expert, 0.0f, 0.5f);
        const auto bias = [&](const std::string& name, std::size_t rows) {
          add(name, ggml_type::f32, {rows, c.n_expert}, uniform(ggml_type::f32, c.n_expert * rows, 0.0f, 0.5f));
        };
        bias(b + "ffn_gate_exps.bias", c.expert_ffn_dim);
        bias(b + "ffn_up_exps.bias", c.expert_ffn_dim);
        bias(b + "ffn_down_exps.bias", c.dim);
      }
      if (arch.shared_expert) {
        const std::size_t fs = c.shared_expert_ffn_dim;
        vector(b + "ffn_gate_inp_shexp.weight", c.dim, 0.0f, in_dim);
        matrix(b + "ffn_gate_shexp.weight", fs, c.dim, in_dim);
        matrix(b + "ffn_down_shexp.weight", c.dim, fs, std::sqrt(3.0f / float(fs)));
        matrix(b + "ffn_up_shexp.weight", fs, c.dim, in_dim);
      }
    } else {
      if (!arch.fused_projections) matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim, in_dim);
      matrix(b + "ffn_down.weight", c.dim, c.ffn_dim, in_ffn);
      matrix(b + "ffn_up.weight", arch.fused_projections ? 2 * c.ffn_dim : c.ffn_dim, c.dim, in_dim);
    }
    norm(b + std::string(arch.ffn_norm_tensor) + ".weight", c.dim);
    if (arch.post_norms) {
      norm(b + "post_attention_norm.weight", c.dim);
      norm(b + "post_ffw_norm.weight", c.dim);
    }
  }
  return w;
}
}  // namespace detail

LLMKIT_DECL gguf_writer synthetic_llama(const synthetic_options& options) {
  return detail::synthetic_image(options, false);
}

LLMKIT_DECL void write_synthetic_llama(const std::string& path, const synthetic_options& options) {
  detail::synthetic_image(options, true).write(path);
}

}  // namespace llmkit::model
