// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/llama_config.hpp
/// Hyper-parameters of a Llama-family model (any model::architecture) and
/// how they are read from a GGUF file's metadata.

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
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/model/architecture.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/simd/rope.hpp"

namespace llmkit::model {

/// Hyper-parameters of a Llama-family model.
struct llama_config {
  model::architecture arch = model::architecture::llama;  ///< general.architecture; see architecture.hpp
  std::size_t n_vocab = 0;
  std::size_t dim = 0;          ///< embedding width
  std::size_t n_layers = 0;
  std::size_t n_heads = 0;      ///< query heads
  std::size_t n_kv_heads = 0;   ///< key/value heads (divides n_heads)
  std::size_t head_dim = 0;     ///< dim / n_heads
  std::size_t ffn_dim = 0;      ///< hidden width of the SwiGLU feed-forward
  std::size_t context_length = 2048;  ///< training context (RoPE table size)
  float rms_eps = 1e-5f;
  /// theta, pair layout (the architecture's), rotary_dim, freq_scale and the
  /// per-pair freq_factors of `rope_freqs.weight` (Llama 3.1) when present
  simd::rope_config rope{};
  bool tied_output = false;     ///< output projection shares the embedding
  /// Local attention: a query at position q sees the keys at
  /// q - sliding_window < k <= q in the layers `local_layers` marks. 0: none.
  std::size_t sliding_window = 0;
  /// [n_layers] 1 for a layer attending through the sliding window, 0 for a
  /// global one; empty exactly when sliding_window is 0.
  std::vector<std::uint8_t> local_layers{};
  /// RoPE of the local layers (Gemma 3: base 10000, unscaled); the same
  /// layout and rotary_dim as `rope`.
  simd::rope_config local_rope{};
  float attention_scale = 0.0f;   ///< softmax scale of q.k; 0: 1/sqrt(head_dim)
  float attention_softcap = 0.0f; ///< scores s become cap * tanh(s / cap) (Gemma 2); 0: none
  float final_softcap = 0.0f;     ///< the same for the logits (Gemma 2); 0: none
  /// Phi-3's LongRoPE: `[rotary_dim / 2]` frequency divisors for contexts up
  /// to `original_context_length` (short) and beyond it (long), from
  /// `rope_factors_short.weight` / `rope_factors_long.weight`; both empty
  /// without. use_context() copies the right set to rope.freq_factors.
  std::vector<float> rope_short_factors{}, rope_long_factors{};
  /// `rope.scaling.original_context_length` (0: context_length).
  std::size_t original_context_length = 0;
  /// `rope.scaling.attn_factor`: multiplies the rotated part of every query
  /// and key (ggml's rope attn_factor: cos and sin times it).
  float rope_attn_factor = 1.0f;
  /// Mixture of experts (architectures with routed_experts; 0 elsewhere):
  /// `expert_count`, `expert_used_count` (k) and `expert_feed_forward_length`.
  std::size_t n_expert = 0, n_expert_used = 0, expert_ffn_dim = 0;
  /// `expert_weights_norm`: the k routing weights renormalised to sum 1 (Qwen3-MoE's norm_topk_prob).
  bool expert_weights_norm = true;
  /// The shared expert's FFN width (architectures with a shared_expert; 0
  /// elsewhere): `expert_shared_feed_forward_length`, else
  /// `feed_forward_length`, as llama.cpp reads it.
  std::size_t shared_expert_ffn_dim = 0;

  /// Whether the feed-forward is a routed mixture of experts.
  bool has_experts() const noexcept { return n_expert != 0; }

  /// Chooses the LongRoPE factors for a run of `context` tokens per
  /// sequence: long when context > original_context_length, as llama.cpp
  /// does; no-op without LongRoPE factors. from_gguf calls it with
  /// context_length.
  void use_context(std::size_t context) {
    if (rope_long_factors.empty()) return;
    const std::size_t original = original_context_length == 0 ? context_length : original_context_length;
    rope.freq_factors = context > original ? rope_long_factors : rope_short_factors;
  }

  /// Whether layer l attends through the sliding window.
  bool is_local(std::size_t l) const noexcept { return l < local_layers.size() && local_layers[l] != 0; }

  /// The KV-cache shape this model needs.
  kv::kv_shape kv_shape() const noexcept { return {n_layers, n_kv_heads, head_dim}; }

  /// Reads `<arch>.*` keys (arch = general.architecture, one of
  /// model::architectures; the RoPE layout is the architecture's; the
  /// window, its layers and their RoPE as docs/model.md describes); n_vocab
  /// comes from token_embd.weight, tied_output from the absence of
  /// output.weight, rope.freq_factors from the optional F32 tensor
  /// `rope_freqs.weight` ([rotary_dim / 2]).
  /// @throws llmkit::error naming an unsupported architecture (and listing
  /// the supported ones), a missing or invalid key or tensor.
  static llama_config from_gguf(const gguf_file& file);

  /// @throws llmkit::error naming the first inconsistent field.
  void validate() const;

 private:
  // attention.sliding_window, its layer pattern and the local layers' RoPE.
  static void read_sliding_window(const gguf_file& file, const std::string& prefix, llama_config& c);
  // rope_freqs.weight: an F32 vector of rotary_dim / 2 frequency divisors.
  // (also rope_factors_long / _short.weight: the same shape)
  static std::vector<float> read_rope_freqs(const gguf_tensor& t, const llama_config& c);
};

/// [n_layers] local_layers for "every `every`-th layer global": layer l is
/// local unless (l + 1) is a multiple of `every` (Gemma 3: every = 6 gives 5
/// local layers, then a global one). @pre every >= 1
std::vector<std::uint8_t> local_layer_pattern(std::size_t n_layers, std::size_t every);

/// Llama 3.1's RoPE scaling (Hugging Face `rope_scaling` with
/// `rope_type: "llama3"`), which GGUF files carry as `rope_freqs.weight`.
struct llama3_rope_scaling {
  float factor = 8.0f;                        ///< divisor of the low frequencies
  float low_freq_factor = 1.0f;               ///< wavelengths above context / this are divided by `factor`
  float high_freq_factor = 4.0f;              ///< wavelengths below context / this are kept
  std::size_t original_context_length = 8192; ///< `original_max_position_embeddings`
};

/// The `[rotary_dim / 2]` frequency divisors of Llama 3.1's scaling, as the
/// GGUF converter writes them to `rope_freqs.weight`: 1 for pairs of short
/// wavelength, `factor` for long ones, and a smooth blend in between (use as
/// `llama_config::rope.freq_factors`).
/// @pre rotary_dim even and > 0; theta > 0; high_freq_factor > low_freq_factor > 0
std::vector<float> llama3_rope_freq_factors(const llama3_rope_scaling& s, float theta, std::size_t rotary_dim);

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/llama_config.ipp"
#endif
