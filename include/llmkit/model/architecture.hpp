// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/architecture.hpp
/// The GGUF architectures llama_model runs (`general.architecture`) and what
/// sets them apart. All of them are decoder-only transformers with RMSNorm,
/// grouped-query attention with RoPE and a gated feed-forward, so an
/// architecture is a row of traits, not a new model class: the loader and the
/// forward pass read the traits (key prefix, RoPE pair layout, biases,
/// per-head Q/K norms, post-norms, embedding scale, activation, which layers
/// attend through a sliding window).
///
/// Adding one that fits this skeleton: a new enumerator, a row in
/// `architectures`, and, if it has a new kind of tensor, a trait read by the
/// loader (detail/llama_forward.hpp) and by the test oracle
/// (tests/reference/model_reference.hpp).

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "llmkit/core/error.hpp"
#include "llmkit/simd/rope.hpp"

namespace llmkit::model {

/// A supported `general.architecture`.
enum class architecture {
  llama,  ///< Llama 1/2/3/3.1, Mistral, TinyLlama, ... (interleaved RoPE)
  qwen2,  ///< Qwen2 / Qwen2.5 (Q/K/V biases, split-half RoPE)
  qwen3,  ///< Qwen3 dense (per-head Q/K RMSNorm, split-half RoPE, no biases)
  gemma2, ///< Gemma 2 (post-norms, GeGLU, local/global layers, soft-capping)
  gemma3, ///< Gemma 3 text (Gemma 2 + Q/K norms, 5 local : 1 global, local RoPE base)
  phi3,   ///< Phi-3 / Phi-3.5-mini, Phi-4-mini (fused QKV and gate|up, LongRoPE)
  qwen3moe, ///< Qwen3-MoE (Qwen3's attention, a routed mixture of SwiGLU experts for the FFN)
  gpt_oss,  ///< gpt-oss (biases, attention sinks, alternating window, top-k-softmax router, clamped SwiGLU experts)
  qwen2moe, ///< Qwen1.5-MoE / Qwen2-MoE (Qwen2's attention, routed experts without renormalisation, a gated shared expert)
};

/// How a mixture's router turns its logits into k experts and weights
/// (moe/router.hpp).
enum class expert_router : std::uint8_t {
  softmax_top_k,  ///< softmax over all experts, the k best, renormalised as `expert_weights_norm` says (Qwen3-MoE)
  top_k_softmax,  ///< the k largest logits, softmax over those (gpt-oss)
};

/// The feed-forward's gate activation: h = act(gate) * up.
enum class ffn_activation : std::uint8_t {
  silu,       ///< SwiGLU (Llama, Qwen)
  gelu_tanh,  ///< GeGLU with GELU's tanh approximation (Gemma)
  swiglu_oai, ///< gpt-oss's clamped SwiGLU: min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1)
};

/// What the loader and the forward pass need to know about an architecture.
struct architecture_traits {
  architecture id{};
  /// `general.architecture` value, also the prefix of the hyper-parameter
  /// keys (`<name>.embedding_length`, ...).
  std::string_view name{};
  /// RoPE pair layout: llama.cpp's rope type NORM is interleaved, NEOX is
  /// half-split.
  simd::rope_layout rope_layout = simd::rope_layout::interleaved;
  /// Whether each layer has F32 biases `blk.N.attn_q.bias`, `attn_k.bias`,
  /// `attn_v.bias`, added to the projections before RoPE.
  bool qkv_bias = false;
  /// Whether each layer has F32 `blk.N.attn_q_norm.weight` and
  /// `attn_k_norm.weight` ([head_dim]): an RMSNorm of every query and key
  /// head, after the projections and before RoPE.
  bool qk_norm = false;
  /// Whether each layer has `blk.N.post_attention_norm.weight` and
  /// `post_ffw_norm.weight` ([dim]): RMSNorms of the attention and
  /// feed-forward outputs before each joins the residual.
  bool post_norms = false;
  /// Whether token embeddings are multiplied by sqrt(dim) before layer 0.
  bool scaled_embedding = false;
  ffn_activation activation = ffn_activation::silu;
  /// When the file has `attention.sliding_window` but no
  /// `attention.sliding_window_pattern`: layer l attends globally when
  /// (l + 1) is a multiple of this, through the window otherwise (Gemma 2:
  /// 2, Gemma 3: 6). Non-zero also makes the window key required. 0: every
  /// layer uses the window the file gives, if any.
  std::uint32_t window_pattern = 0;
  /// RoPE base of the sliding-window layers when the file has no
  /// `rope.freq_base_swa`; 0: the global layers' base.
  float local_rope_theta = 0.0f;
  /// Whether the file's linear RoPE scaling is for the global layers only.
  bool local_rope_unscaled = false;
  /// The layer count of the family's model whose queries are scaled by
  /// 1/sqrt(dim / n_heads), not 1/sqrt(head_dim) (Gemma 2 and 3 27B: their
  /// `query_pre_attn_scalar`, which GGUF files do not carry), when the file
  /// has no `attention.scale`; 0: none.
  std::uint32_t wide_query_scale_layers = 0;
  /// Whether Q|K|V come as one `blk.N.attn_qkv.weight` ([qd + 2 kvd, dim])
  /// and gate|up as one `blk.N.ffn_up.weight` ([2 ffn, dim], gate first).
  bool fused_projections = false;
  /// Whether `attention.sliding_window` at or beyond context_length means
  /// full attention instead of an error (Phi-3.5-mini and Phi-4-mini files
  /// carry 262144 with a context of 131072, from their Hugging Face config).
  bool window_beyond_context_is_full = false;
  /// Whether the feed-forward is a mixture of experts: a router
  /// `blk.N.ffn_gate_inp.weight` ([n_expert, dim]) and expert tensors
  /// `ffn_gate_exps`, `ffn_up_exps` ([n_expert, expert_ffn, dim]) and
  /// `ffn_down_exps` ([n_expert, dim, expert_ffn]); each token uses the
  /// n_expert_used most probable experts (softmax, top-k, renormalised as
  /// `expert_weights_norm` says; moe/router.hpp, moe/routed_ffn.hpp).
  bool routed_experts = false;
  /// How the router chooses and weighs the experts.
  expert_router router = expert_router::softmax_top_k;
  /// `expert_weights_norm` when the file does not say: whether the k
  /// routing weights are renormalised to sum 1 (Qwen3-MoE: yes, Qwen2-MoE:
  /// no).
  bool expert_weights_norm = true;
  /// Whether each layer also has a shared expert that every token uses:
  /// SwiGLU `blk.N.ffn_gate_shexp.weight`, `ffn_up_shexp.weight`
  /// ([shared_expert_ffn, dim]) and `ffn_down_shexp.weight` ([dim,
  /// shared_expert_ffn]), its output scaled by sigmoid(g . x) with the F32
  /// `ffn_gate_inp_shexp.weight` g ([dim]) and added to the routed experts'.
  bool shared_expert = false;
  /// Whether the router and the experts have F32 biases:
  /// `blk.N.ffn_gate_inp.bias` ([n_expert]), `ffn_gate_exps.bias`,
  /// `ffn_up_exps.bias` ([n_expert, expert_ffn]) and `ffn_down_exps.bias`
  /// ([n_expert, dim]), added to the router logits and each product.
  bool expert_biases = false;
  /// Whether each layer has an F32 `blk.N.attn_output.bias` ([dim]).
  bool output_bias = false;
  /// Whether each layer has F32 `blk.N.attn_sinks.weight` ([n_heads]):
  /// learned attention-sink logits (attention::decode_params::sinks).
  bool attention_sinks = false;
  /// The tensor (without `blk.N.` and `.weight`) of the RMSNorm before the
  /// feed-forward: gpt-oss files call it `post_attention_norm`.
  std::string_view ffn_norm_tensor = "ffn_norm";
};

/// Every supported architecture, one row each; a field a row leaves out
/// keeps its default, which is what Llama does.
inline constexpr std::array<architecture_traits, 9> architectures{{
    {.id = architecture::llama,
     .name = "llama"},
    {.id = architecture::qwen2,
     .name = "qwen2",
     .rope_layout = simd::rope_layout::half_split,
     .qkv_bias = true},
    {.id = architecture::qwen3,
     .name = "qwen3",
     .rope_layout = simd::rope_layout::half_split,
     .qk_norm = true},
    {.id = architecture::gemma2,
     .name = "gemma2",
     .rope_layout = simd::rope_layout::half_split,
     .post_norms = true,
     .scaled_embedding = true,
     .activation = ffn_activation::gelu_tanh,
     .window_pattern = 2,
     .wide_query_scale_layers = 46},
    {.id = architecture::gemma3,
     .name = "gemma3",
     .rope_layout = simd::rope_layout::half_split,
     .qk_norm = true,
     .post_norms = true,
     .scaled_embedding = true,
     .activation = ffn_activation::gelu_tanh,
     .window_pattern = 6,
     .local_rope_theta = 10000.0f,
     .local_rope_unscaled = true,
     .wide_query_scale_layers = 62},
    {.id = architecture::phi3,
     .name = "phi3",
     .rope_layout = simd::rope_layout::half_split,
     .fused_projections = true,
     .window_beyond_context_is_full = true},
    {.id = architecture::qwen3moe,
     .name = "qwen3moe",
     .rope_layout = simd::rope_layout::half_split,
     .qk_norm = true,
     .routed_experts = true},
    {.id = architecture::gpt_oss,
     .name = "gpt-oss",
     .rope_layout = simd::rope_layout::half_split,
     .qkv_bias = true,
     .activation = ffn_activation::swiglu_oai,
     .window_pattern = 2,
     .routed_experts = true,
     .router = expert_router::top_k_softmax,
     .expert_biases = true,
     .output_bias = true,
     .attention_sinks = true,
     .ffn_norm_tensor = "post_attention_norm"},
    {.id = architecture::qwen2moe,
     .name = "qwen2moe",
     .rope_layout = simd::rope_layout::half_split,
     .qkv_bias = true,
     .routed_experts = true,
     .expert_weights_norm = false,
     .shared_expert = true},
}};

/// The traits of `a`.
constexpr const architecture_traits& traits(architecture a) noexcept {
  for (const auto& t : architectures)
    if (t.id == a) return t;
  return architectures[0];  // unreachable: every enumerator has a row
}

/// "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, qwen2moe": the supported names, for error messages.
inline std::string supported_architectures_text() {
  std::string s;
  for (const auto& t : architectures) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

/// The architecture called `name` (a `general.architecture` value).
/// @throws llmkit::error naming `name` and listing the supported ones.
inline architecture architecture_from_name(std::string_view name) {
  for (const auto& t : architectures)
    if (t.name == name) return t.id;
  ::llmkit::detail::throw_error("model: unsupported general.architecture '", name, "' (supported: ",
                                supported_architectures_text(), ")");
}

}  // namespace llmkit::model
