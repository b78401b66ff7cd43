// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/architecture.hpp
/// The GGUF architectures llama_model runs (`general.architecture`) and what
/// sets them apart. All of them are decoder-only transformers with RMSNorm,
/// grouped-query attention with RoPE and a SwiGLU feed-forward, so an
/// architecture is a row of traits, not a new model class: the loader and the
/// forward pass read the traits (key prefix, RoPE pair layout, biases).
///
/// Adding one that fits this skeleton: a new enumerator, a row in
/// `architectures`, and, if it has a new kind of tensor, a trait read by the
/// loader (detail/llama_forward.hpp) and by the test oracle
/// (tests/reference/model_reference.hpp).

#include <array>
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
};

/// What the loader and the forward pass need to know about an architecture.
struct architecture_traits {
  architecture id;
  /// `general.architecture` value, also the prefix of the hyper-parameter
  /// keys (`<name>.embedding_length`, ...).
  std::string_view name;
  /// RoPE pair layout: llama.cpp's rope type NORM is interleaved, NEOX is
  /// half-split.
  simd::rope_layout rope_layout;
  /// Whether each layer has F32 biases `blk.N.attn_q.bias`, `attn_k.bias`,
  /// `attn_v.bias`, added to the projections before RoPE.
  bool qkv_bias;
  /// Whether each layer has F32 `blk.N.attn_q_norm.weight` and
  /// `attn_k_norm.weight` ([head_dim]): an RMSNorm of every query and key
  /// head, after the projections and before RoPE.
  bool qk_norm;
};

/// Every supported architecture, one row each.
inline constexpr std::array<architecture_traits, 3> architectures{{
    {.id = architecture::llama,
     .name = "llama",
     .rope_layout = simd::rope_layout::interleaved,
     .qkv_bias = false,
     .qk_norm = false},
    {.id = architecture::qwen2,
     .name = "qwen2",
     .rope_layout = simd::rope_layout::half_split,
     .qkv_bias = true,
     .qk_norm = false},
    {.id = architecture::qwen3,
     .name = "qwen3",
     .rope_layout = simd::rope_layout::half_split,
     .qkv_bias = false,
     .qk_norm = true},
}};

/// The traits of `a`.
constexpr const architecture_traits& traits(architecture a) noexcept {
  for (const auto& t : architectures)
    if (t.id == a) return t;
  return architectures[0];  // unreachable: every enumerator has a row
}

/// "llama, qwen2, qwen3": the supported names, for error messages.
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
