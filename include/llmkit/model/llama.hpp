// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/llama.hpp
/// Reference Llama-family model driven by GGUF metadata (the architectures
/// of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3,
/// qwen3moe, gpt-oss, qwen2moe): token
/// embedding (times sqrt(dim) for Gemma), per
/// layer RMSNorm -> Q/K/V projections (+ biases where the architecture has
/// them; + a per-head RMSNorm of Q and K where it has those) -> RoPE (the architecture's pair layout) -> grouped-query
/// causal attention over a KV cache (through a sliding window in the local
/// layers; scale and soft-capping from the file) -> output projection
/// (RMSNorm'd for Gemma) added to the residual, RMSNorm -> gated
/// feed-forward (SwiGLU, or GELU-tanh for Gemma; RMSNorm'd for Gemma) added
/// to the residual (for a mixture of experts, qwen3moe: the router's
/// softmax top-k and the chosen experts' SwiGLU FFNs, moe/routed_ffn.hpp;
/// qwen2moe adds a shared expert, gated per token);
/// final RMSNorm and the output projection (separate
/// `output.weight`, or tied to the embedding when absent), soft-capped for
/// Gemma 2.
///
/// Weights: each matrix is a `weight_matrix` (model/weights.hpp) kept in its
/// GGUF type (F32, F16, Q8_0; BF16 widened to f32) or converted at load to
/// the `llama_options::weight_type` asked for; Q, K, V are fused into one
/// matrix and so are the gate and up projections, so a layer runs four
/// products. Products widen the weights to f32 in registers and run
/// llmkit's register-tiled kernel (model/detail/matmul.hpp), split over
/// output rows across the caller's executor; it is batch invariant (each
/// output is one dot product summed in a fixed order), so a sequence's
/// logits do not depend on what else is in the batch. RMSNorm and RoPE are
/// llmkit::simd kernels, K/V go through the `kv_cache` contract, and
/// attention is llmkit::attention::prefill (causal mask) for segments of
/// several tokens and llmkit::attention::decode for one-token segments.
///
/// forward() takes a packed batch (see batch.hpp): any number of sequences,
/// each a contiguous run of tokens continuing its sequence in the cache, and
/// returns the logits of the rows asked for.
///
/// The hyper-parameters are in llama_config.hpp; the forward pass is
/// defined in detail/llama_forward.hpp and the loader in impl/llama.ipp,
/// both included at the end (the loader only without
/// LLMKIT_SEPARATE_COMPILATION, see core/config.hpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmkit/attention/decode.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/config.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/detail/matmul_kernels.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/llama_config.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/moe/expert_tensor.hpp"
#include "llmkit/moe/routed_ffn.hpp"
#include "llmkit/moe/router.hpp"
#include "llmkit/simd/rope.hpp"

namespace llmkit::model {

/// Positions with precomputed RoPE factors; later ones are computed on the fly.
inline constexpr std::size_t rope_table_max_positions = 8192;

/// How llama_model loads a file.
struct llama_options {
  /// In-memory storage of the weight matrices (embedding, projections,
  /// output): `native` keeps each tensor's GGUF type (F32, F16, Q8_0; BF16
  /// is widened to f32); f32, f16 and q8_0 convert at load. Matrices whose
  /// input width is not a multiple of 32 stay f32 under q8_0. Norm weights
  /// are always f32.
  model::weight_type weight_type = model::weight_type::native;
  /// What the quantised matrices (Q8_0, Q4_0 ... Q6_K) multiply: `q8_0`,
  /// activations rounded to int8 (ggml's integer products: per 32 values,
  /// per 256 for the K-quants; several times faster decode for a <1%
  /// rounding of the activations; the default, as in llama.cpp), or `f32`
  /// activations (exact: the dequantised weights in f32 arithmetic). F32
  /// and F16 matrices always multiply f32. See model::activation_type.
  model::activation_type activations = model::activation_type::q8_0;
  /// With an int8 KV cache, decode attention rounds each query head to int8
  /// before its dot products with the keys (attention::decode_params::
  /// int8_queries, as llama.cpp does with a q8_0 cache); other caches
  /// ignore it.
  bool int8_attention_queries = false;
  /// With a bf16 KV cache, decode attention rounds each query to bf16
  /// before its dot products with the keys (attention::decode_params::
  /// bf16_queries, as llama.cpp's bf16 dot products do); other caches
  /// ignore it.
  bool bf16_attention_queries = false;
  /// With a bf16 KV cache, decode attention rounds each block's softmax
  /// probabilities to bf16 before they multiply the values
  /// (attention::decode_params::bf16_probabilities); other caches ignore it.
  bool bf16_attention_probabilities = false;
  /// With an int8 KV cache, decode attention rounds each block's softmax
  /// probabilities to 8-bit levels before they multiply the values
  /// (attention::decode_params::int8_probabilities); other caches ignore it.
  bool int8_attention_probabilities = false;
  /// Weights used where they lie: with a memory-mapped file (gguf_file::
  /// open), a matrix whose storage keeps the file's layout (F16, and the
  /// block types Q4_0 ... Q6_K when `weight_type` is native) is read from
  /// the mapping in place, nothing copied, and the model holds the mapping
  /// (the gguf_file may go). Matrices converted at load (F32 into panels,
  /// Q8_0 into int8 and scales, any `weight_type` conversion) are copied,
  /// and their mapped pages then dropped from the resident set, so resident
  /// memory stays about the file's size. false copies every matrix.
  bool weights_in_place = true;
  /// Locks the weights read in place in memory (mlock, as llama.cpp's
  /// --mlock), so the system never pages them out; needs a locked-memory
  /// limit (`ulimit -l`) of the file's size, else loading fails saying so.
  bool lock_weights = false;
  /// Tokens per sequence the caller will run (0: the file's
  /// context_length): picks Phi-3's LongRoPE factors (long beyond
  /// `rope.scaling.original_context_length`), as llama.cpp's n_ctx does.
  std::size_t context_length = 0;
};

/// A Llama-architecture model with its weights in memory (f32, f16 or Q8_0,
/// see llama_options). forward() is not reentrant (the model owns its
/// activation workspace); use one model object per concurrent caller.
class llama_model {
 public:
  /// Loads config and weights from an open GGUF file. The file may be
  /// closed afterwards: weights are copied, or (llama_options::
  /// weights_in_place) the model holds the file's mapping.
  explicit llama_model(const gguf_file& file, const llama_options& options = {});

  /// Opens, loads and closes a GGUF file.
  static llama_model load(const std::string& path, const llama_options& options = {}) {
    return llama_model(gguf_file::open(path), options);
  }

  const llama_config& config() const noexcept { return config_; }
  const llama_options& options() const noexcept { return options_; }
  std::size_t vocab_size() const noexcept { return config_.n_vocab; }
  kv::kv_shape kv_shape() const noexcept { return config_.kv_shape(); }

  /// Bytes of weights one forward pass of one token reads (every matrix
  /// once, plus one embedding row per token, not counted here; of a mixture
  /// of experts, the router and n_expert_used experts' gate, up and down,
  /// and the shared expert where there is one):
  /// the memory traffic of a decode step besides the KV cache.
  std::size_t weight_bytes_per_step() const noexcept {
    std::size_t bytes = (c_output().bytes()) + output_norm_.size() * sizeof(float);
    for (const layer& w : layers_)
      bytes += w.wqkv.bytes() + w.wo.bytes() + w.w_gate_up.bytes() + w.w_down.bytes() + routed_bytes_per_token(w) +
               (w.attn_norm.size() + w.ffn_norm.size() + w.bqkv.size() + w.q_norm.size() + w.k_norm.size() +
                w.post_attn_norm.size() + w.post_ffn_norm.size() + w.shared_gate.size()) *
                   sizeof(float);
    return bytes;
  }

  /// Bytes of the weight matrices read from the file's mapping in place
  /// (llama_options::weights_in_place), the embedding included; the rest
  /// of the model's weights are copies.
  std::size_t weight_bytes_in_place() const noexcept {
    auto of = [](const weight_matrix& m) { return m.is_in_place() ? m.bytes() : std::size_t{0}; };
    std::size_t bytes = of(token_embd_) + of(output_);
    for (const layer& w : layers_) {
      for (const weight_matrix& p : w.wqkv.parts) bytes += of(p);
      for (const weight_matrix& p : w.w_gate_up.parts) bytes += of(p);
      bytes += of(w.wo) + of(w.w_down);
      for (const moe::expert_tensor* t : {&w.gate_exps, &w.up_exps, &w.down_exps})
        for (std::size_t e = 0; e < t->n_expert(); ++e) bytes += of(t->expert(e));
    }
    return bytes;
  }

  /// The storage each matrix got (after resolve_weight_type): the fused
  /// Q/K/V (its Q part when the three have different storages), output,
  /// gate/up, down projections (the experts' of a mixture) of layer 0, then the output projection (the
  /// embedding when tied).
  std::array<weight_type, 5> weight_types() const noexcept {
    const layer& w = layers_.front();
    if (config_.has_experts())
      return {w.wqkv.type(), w.wo.type(), w.gate_exps.type(), w.down_exps.type(), c_output().type()};
    return {w.wqkv.type(), w.wo.type(), w.w_gate_up.type(), w.w_down.type(), c_output().type()};
  }

  /// Runs the batch through the model, appending each token's K/V to `cache`
  /// (kv::grow_with_tokens + store), and returns the logits of the rows `b.logit_rows` asks
  /// for: `[n_logits, n_vocab]`, valid until the next forward().
  /// @pre every sequence of the batch exists in `cache`, its tokens form one
  /// contiguous run of the batch whose positions are cache.n_tokens(s),
  /// cache.n_tokens(s) + 1, ...; token ids < n_vocab; logit rows < n_tokens.
  /// @throws llmkit::error naming the offending argument, or when the cache
  /// has no room (sequences already grown by this call are rolled back when
  /// the cache offers truncate()).
  template <kv::kv_cache Cache, executor Exec>
  matrix_view<const float> forward(const batch& b, Cache& cache, Exec& exec);

  /// forward() on the calling thread.
  template <kv::kv_cache Cache>
  matrix_view<const float> forward(const batch& b, Cache& cache) {
    serial_executor serial;
    return forward(b, cache, serial);
  }

 private:
  // Matrices that multiply the same input, their outputs side by side: one
  // fused weight_matrix when their tensors resolve to one storage, else one
  // per tensor (a Q4_K_M layer's Q6_K attn_v next to Q4_K attn_q), so that
  // each keeps its own storage.
  struct stacked_matrix {
    std::vector<weight_matrix> parts;  // in output-row order
    weight_type type() const noexcept { return parts.front().type(); }
    std::size_t bytes() const noexcept {
      std::size_t b = 0;
      for (const weight_matrix& p : parts) b += p.bytes();
      return b;
    }
  };
  struct layer {
    aligned_vector<float> attn_norm, ffn_norm;          // [dim] f32
    aligned_vector<float> bqkv;                         // [qd + 2 kvd] Q|K|V biases; empty without
    aligned_vector<float> q_norm, k_norm;               // [head_dim] per-head norms; empty without
    aligned_vector<float> post_attn_norm, post_ffn_norm; // [dim] output norms; empty without
    stacked_matrix wqkv, w_gate_up;                     // Q|K|V, gate|up (with experts: the shared expert's, or empty)
    weight_matrix wo, w_down;                           // attention output, down (the same)
    aligned_vector<float> shared_gate;                  // [dim] ffn_gate_inp_shexp; empty without a shared expert
    weight_matrix router;                               // [n_expert, dim] ffn_gate_inp; empty without experts
    moe::expert_tensor gate_exps, up_exps, down_exps;   // [n_expert, expert_ffn, dim] x 2, [n_expert, dim, expert_ffn]
    aligned_vector<float> bo;                           // [dim] attn_output bias; empty without
    aligned_vector<float> sinks;                        // [n_heads] attention-sink logits; empty without
    aligned_vector<float> router_bias;                  // [n_expert]; empty without expert biases
    aligned_vector<float> gate_exps_bias, up_exps_bias; // [n_expert, expert_ffn]
    aligned_vector<float> down_exps_bias;               // [n_expert, dim]
  };
  struct segment {
    kv::seq_id seq;
    std::size_t first, count, base;
  };

  const weight_matrix& c_output() const noexcept { return config_.tied_output ? token_embd_ : output_; }
  // Router and k experts' bytes: what one token's routed feed-forward reads.
  std::size_t routed_bytes_per_token(const layer& w) const noexcept {
    if (!config_.has_experts()) return 0;
    return w.router.bytes() + config_.n_expert_used * (w.gate_exps.expert_bytes() + w.up_exps.expert_bytes() +
                                                        w.down_exps.expert_bytes());
  }

  template <class Exec>
  void product(Exec& exec, const float* x, std::size_t n, const weight_matrix& w, float* y, std::size_t y_stride,
               output_mode mode);
  template <class Exec>
  void product(Exec& exec, const float* x, std::size_t n, const stacked_matrix& w, float* y, std::size_t y_stride);

  template <class Cache>
  void plan_segments(const batch& b, const Cache& cache);

  void rope(std::span<float> heads, std::int32_t position, bool local) const;

  // y (+)= x * W^T for a layer's output (attention or feed-forward): added
  // to the residual x_, through `post_norm` (an RMSNorm of the product, in
  // xn_) when the architecture has one.
  template <class Exec>
  void add_to_residual(Exec& exec, const float* in, std::size_t n, const weight_matrix& w,
                       const aligned_vector<float>& post_norm, const aligned_vector<float>& bias = {});

  void reserve(std::size_t n, std::size_t n_out);

  llama_config config_;
  llama_options options_;
  simd::rope_table rope_table_;
  simd::rope_table local_rope_table_;   // the local layers' (one position when there are none)
  weight_matrix token_embd_, output_;   // [n_vocab, dim]; output_ empty when tied
  aligned_vector<float> output_norm_;  // [dim]
  std::vector<layer> layers_;
  // Workspace, grown on demand and reused across calls.
  aligned_vector<float> x_, xn_, qkv_, q_, k_, v_, att_, ffn_, hidden_, logits_;
  std::vector<segment> segments_;
  std::vector<std::int32_t> cu_seqlens_;    // [prefill segments + 1] offsets in attention order
  std::vector<kv::seq_id> prefill_seqs_;   // [prefill segments] their sequences
  std::vector<kv::seq_id> decode_seqs_;    // [decode rows] sequences with one token in the batch, or stepwise rows
  std::vector<std::int32_t> decode_last_;  // [decode rows] position of each decode row (stepwise_ only)
  std::vector<kv::seq_id> decode_views_;   // [decode rows] 0, 1, ...: the rows' ids in a truncated_view
  bool stepwise_ = false;                  // some decode rows come from stepwise segments
  std::vector<std::int32_t> attention_row_;  // [n_tokens] row of each token in attention order
  attention::decode_workspace decode_ws_;
  detail::q8_activations q8_x_;  // activations quantised for Q8_0 products (options_.activations == q8_0)
  aligned_vector<float> router_logits_, route_weights_;  // [n, n_expert], [n, n_expert_used]
  std::vector<moe::expert_id> route_ids_;                // [n, n_expert_used]
  moe::routed_ffn_workspace moe_ws_;
  double attention_work_ = 0;              // multiply-adds of one layer's prefill attention, roughly
  double decode_work_ = 0;                 // same for the decode rows
};

}  // namespace llmkit::model

#include "llmkit/model/detail/llama_forward.hpp"

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/llama.ipp"
#endif
