// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/synthetic.hpp
/// Writes a Llama-family GGUF (any architecture of model/architecture.hpp) with seeded random weights, so that benchmarks
/// and tests can run models of any size (e.g. dim 768, 12 layers, 12 heads,
/// 4 KV heads, vocab 32000: ~110M parameters) through the same loader as
/// real files. The file carries full `<arch>.*` metadata and a SentencePiece
/// tokenizer section (control tokens, the 256 byte tokens when the
/// vocabulary has room, then distinct letter pieces), so
/// `tokenizer::from_gguf` and `llama_model` load it like a trained model.
///
/// Weights: matrices uniform in +-sqrt(3 / in) (unit-variance activations),
/// norm weights (qwen3's Q/K head norms too) 1 + uniform(+-0.1), embedding
/// uniform(+-1), qwen2's Q/K/V biases uniform(+-0.5); phi3's fused
/// attn_qkv / gate|up ffn_up, a mixture's F32 router ffn_gate_inp and 3-D
/// expert tensors (config.n_expert > 0: qwen3moe), and the LongRoPE factors, sliding window, soft-caps
/// and scales of the config when set; `rope_freqs.weight` when config.rope.freq_factors
/// is set. Matrices are stored in one type (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
/// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) or per tensor (synthetic_options::
/// tensor_types, e.g. the Q4_K_M mix of q4_k_m_types). The same options and
/// seed give the same bytes.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/architecture.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"
#include "llmkit/model/llama.hpp"
#include "llmkit/model/quants.hpp"

namespace llmkit::model {

/// Chooses the storage of one weight matrix from its GGUF name
/// ("token_embd.weight", "output.weight", "blk.3.attn_v.weight", ...).
using tensor_type_rule = std::function<ggml_type(std::string_view tensor_name)>;

/// What to generate.
struct synthetic_options {
  /// arch, n_vocab, dim, n_layers, n_heads, n_kv_heads, ffn_dim, ...
  /// (head_dim 0 = dim / n_heads; another value is written as
  /// attention.key_length / value_length); rope.freq_factors non-empty
  /// writes them as `rope_freqs.weight` (rope.layout is the architecture's)
  llama_config config{};
  ggml_type weight_type = ggml_type::f32;  ///< storage of every matrix when tensor_types is empty (norms, biases stay F32)
  std::uint64_t seed = 0;
  bool tied_output = false;                ///< omit output.weight
  /// Per-matrix storage, overriding weight_type. A type whose block does not
  /// divide the matrix's row length falls back as llama-quantize does (Q4_K
  /// -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K / IQ4_XS -> IQ4_NL); if
  /// that does not divide it either,
  /// synthetic_llama throws naming the tensor.
  tensor_type_rule tensor_types{};
};

/// llama-quantize's Q4_K_M mix for a model with `options.config.n_layers`
/// layers: Q4_K everywhere except Q6_K on the output projection (on
/// token_embd.weight when options.tied_output, as the embedding is the
/// output) and on attn_v / ffn_down (ffn_down_exps) of the layers that "use more bits": the
/// first and last eighth of the layers and every third one in between.
tensor_type_rule q4_k_m_types(const synthetic_options& options);

/// A Llama config of roughly `dim`-wide GPT-2-small shape: the synthetic
/// ~100M model of the benchmarks (dim 768, 12 layers, 12 heads, 4 KV heads,
/// ffn 2048, vocab 32000).
inline llama_config synthetic_100m_config() {
  llama_config c;
  c.n_vocab = 32000;
  c.dim = 768;
  c.n_layers = 12;
  c.n_heads = 12;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.ffn_dim = 2048;
  c.context_length = 2048;
  c.rms_eps = 1e-5f;
  c.rope.theta = 10000.0f;
  c.rope.rotary_dim = 64;
  return c;
}

/// Builds the synthetic GGUF image.
/// @throws llmkit::error for an invalid config, a weight_type whose block
/// does not divide a matrix row length (dim, ffn_dim, n_heads * head_dim),
/// or a tensor_types choice that does not fit even after its fallback.
gguf_writer synthetic_llama(const synthetic_options& options);

/// Writes the synthetic model to `path`.
void write_synthetic_llama(const std::string& path, const synthetic_options& options);

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/synthetic.ipp"
#endif
