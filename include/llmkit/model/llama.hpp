// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/llama.hpp
/// Reference Llama-architecture model driven by GGUF metadata: token
/// embedding, per layer RMSNorm -> Q/K/V projections -> RoPE -> grouped-query
/// causal attention over a KV cache -> output projection (residual), RMSNorm ->
/// SwiGLU feed-forward (residual); final RMSNorm and the output projection
/// (separate `output.weight`, or tied to the embedding when absent).
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

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/decode.hpp"
#include "llmkit/attention/head_dims.hpp"
#include "llmkit/attention/prefill.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/rmsnorm.hpp"
#include "llmkit/simd/rope.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model {

/// Hyper-parameters of a Llama-architecture model.
struct llama_config {
  std::size_t n_vocab = 0;
  std::size_t dim = 0;          ///< embedding width
  std::size_t n_layers = 0;
  std::size_t n_heads = 0;      ///< query heads
  std::size_t n_kv_heads = 0;   ///< key/value heads (divides n_heads)
  std::size_t head_dim = 0;     ///< dim / n_heads
  std::size_t ffn_dim = 0;      ///< hidden width of the SwiGLU feed-forward
  std::size_t context_length = 2048;  ///< training context (RoPE table size)
  float rms_eps = 1e-5f;
  simd::rope_config rope{};     ///< theta, interleaved pairs (GGUF "llama"), rotary_dim, freq_scale
  bool tied_output = false;     ///< output projection shares the embedding

  /// The KV-cache shape this model needs.
  kv::kv_shape kv_shape() const noexcept { return {n_layers, n_kv_heads, head_dim}; }

  /// Reads `<arch>.*` keys (arch = general.architecture, which must be
  /// "llama"); n_vocab comes from token_embd.weight, tied_output from the
  /// absence of output.weight.
  static llama_config from_gguf(const gguf_file& file) {
    const auto arch = file.get<std::string_view>("general.architecture");
    LLMKIT_CHECK(arch == "llama", "llama_config: general.architecture is '", arch, "', expected 'llama'");
    const std::string p = std::string(arch) + ".";
    llama_config c;
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
    c.rope.theta = file.get_optional<float>(p + "rope.freq_base").value_or(10000.0f);
    c.rope.layout = simd::rope_layout::interleaved;
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
    const gguf_tensor& emb = file.tensor("token_embd.weight");
    c.n_vocab = static_cast<std::size_t>(emb.rows());
    c.tied_output = file.find_tensor("output.weight") == nullptr;
    c.validate();
    return c;
  }


  /// @throws llmkit::error naming the first inconsistent field.
  void validate() const {
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
  }
};

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


/// SwiGLU: h[j] = silu(g[j]) * u[j] = g[j] / (1 + e^-g[j]) * u[j]. ([f] g, u, h)
template <class Arch = simd::default_arch>
inline void swiglu(const float* g, const float* u, float* h, std::size_t f) noexcept {
  std::size_t j = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using vf = xsimd::batch<float, Arch>;
    for (; j + vf::size <= f; j += vf::size) {
      const vf gv = vf::load_unaligned(g + j);
      const vf e = simd::detail::exp_batch<Arch>(-gv);
      (gv / (vf(1.0f) + e) * vf::load_unaligned(u + j)).store_unaligned(h + j);
    }
  }
  for (; j < f; ++j) h[j] = g[j] / (1.0f + simd::detail::exp_scalar<Arch>(-g[j])) * u[j];
}
}  // namespace detail

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
  /// What the Q8_0 matrices multiply: `f32` activations (exact: the
  /// dequantised weights in f32 arithmetic) or `q8_0`, activations quantised
  /// per 32 values to int8 (ggml's Q8_0 x Q8_0 product; ~3.5x faster decode
  /// for a ~0.4% rounding of the activations). See model::activation_type.
  model::activation_type activations = model::activation_type::f32;
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
};

/// A Llama-architecture model with its weights in memory (f32, f16 or Q8_0,
/// see llama_options). forward() is not reentrant (the model owns its
/// activation workspace); use one model object per concurrent caller.
class llama_model {
 public:
  /// Loads config and weights from an open GGUF file (the file may be closed
  /// afterwards: weights are copied).
  explicit llama_model(const gguf_file& file, const llama_options& options = {})
      : config_(llama_config::from_gguf(file)),
        options_(options),
        rope_table_(config_.rope, config_.head_dim, std::min<std::size_t>(config_.context_length, rope_table_max_positions)) {
    const auto& c = config_;
    const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    // Every shape is checked against the file before anything is allocated,
    // so sizes in the metadata cannot make the loader allocate more than the
    // file's tensors hold.
    detail::check_tensor(file, "token_embd.weight", c.n_vocab, c.dim);
    detail::check_tensor(file, "output_norm.weight", 1, c.dim);
    if (!c.tied_output) detail::check_tensor(file, "output.weight", c.n_vocab, c.dim);
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      detail::check_tensor(file, b + "attn_norm.weight", 1, c.dim);
      detail::check_tensor(file, b + "attn_q.weight", qd, c.dim);
      detail::check_tensor(file, b + "attn_k.weight", kvd, c.dim);
      detail::check_tensor(file, b + "attn_v.weight", kvd, c.dim);
      detail::check_tensor(file, b + "attn_output.weight", c.dim, qd);
      detail::check_tensor(file, b + "ffn_norm.weight", 1, c.dim);
      detail::check_tensor(file, b + "ffn_gate.weight", c.ffn_dim, c.dim);
      detail::check_tensor(file, b + "ffn_up.weight", c.ffn_dim, c.dim);
      detail::check_tensor(file, b + "ffn_down.weight", c.dim, c.ffn_dim);
    }
    // A (possibly fused) matrix takes the storage its first tensor resolves to.
    auto load_matrix = [&](std::initializer_list<std::string> names, std::size_t rows, std::size_t cols) {
      const gguf_tensor& first = file.tensor(*names.begin());
      weight_matrix m(resolve_weight_type(options_.weight_type, first.type, cols), rows, cols);
      std::size_t row = 0;
      for (const std::string& name : names) {
        const gguf_tensor& t = file.tensor(name);
        m.copy_from(t, row);
        row += static_cast<std::size_t>(t.rows());
      }
      return m;
    };
    auto load_norm = [&](const std::string& name) {
      weight_matrix m(weight_type::f32, 1, c.dim);
      m.copy_from(file.tensor(name), 0);
      aligned_vector<float> v(c.dim);
      m.row(0, v);
      return v;
    };
    token_embd_ = load_matrix({"token_embd.weight"}, c.n_vocab, c.dim);
    output_norm_ = load_norm("output_norm.weight");
    if (!c.tied_output) output_ = load_matrix({"output.weight"}, c.n_vocab, c.dim);
    layers_.resize(c.n_layers);
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      layer& w = layers_[l];
      w.attn_norm = load_norm(b + "attn_norm.weight");
      w.wqkv = load_matrix({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"}, qd + 2 * kvd, c.dim);
      w.wo = load_matrix({b + "attn_output.weight"}, c.dim, qd);
      w.ffn_norm = load_norm(b + "ffn_norm.weight");
      w.w_gate_up = load_matrix({b + "ffn_gate.weight", b + "ffn_up.weight"}, 2 * c.ffn_dim, c.dim);
      w.w_down = load_matrix({b + "ffn_down.weight"}, c.dim, c.ffn_dim);
    }
  }

  /// Opens, loads and closes a GGUF file.
  static llama_model load(const std::string& path, const llama_options& options = {}) {
    return llama_model(gguf_file::open(path), options);
  }

  const llama_config& config() const noexcept { return config_; }
  const llama_options& options() const noexcept { return options_; }
  std::size_t vocab_size() const noexcept { return config_.n_vocab; }
  kv::kv_shape kv_shape() const noexcept { return config_.kv_shape(); }

  /// Bytes of weights one forward pass reads (every matrix once, plus one
  /// embedding row per token, not counted here): the memory traffic of a
  /// decode step besides the KV cache.
  std::size_t weight_bytes_per_step() const noexcept {
    std::size_t bytes = (c_output().bytes()) + output_norm_.size() * sizeof(float);
    for (const layer& w : layers_)
      bytes += w.wqkv.bytes() + w.wo.bytes() + w.w_gate_up.bytes() + w.w_down.bytes() +
               (w.attn_norm.size() + w.ffn_norm.size()) * sizeof(float);
    return bytes;
  }

  /// The storage each matrix got (after resolve_weight_type): the fused
  /// Q/K/V, output, gate/up, down projections of layer 0, then the output
  /// projection (the embedding when tied).
  std::array<weight_type, 5> weight_types() const noexcept {
    const layer& w = layers_.front();
    return {w.wqkv.type(), w.wo.type(), w.w_gate_up.type(), w.w_down.type(), c_output().type()};
  }

  /// Runs the batch through the model, appending each token's K/V to `cache`
  /// (grow + store), and returns the logits of the rows `b.logit_rows` asks
  /// for: `[n_logits, n_vocab]`, valid until the next forward().
  /// @pre every sequence of the batch exists in `cache`, its tokens form one
  /// contiguous run of the batch whose positions are cache.n_tokens(s),
  /// cache.n_tokens(s) + 1, ...; token ids < n_vocab; logit rows < n_tokens.
  /// @throws llmkit::error naming the offending argument, or when the cache
  /// has no room (sequences already grown by this call are rolled back when
  /// the cache offers truncate()).
  template <kv::kv_cache Cache, executor Exec>
  matrix_view<const float> forward(const batch& b, Cache& cache, Exec& exec) {
    const auto& c = config_;
    const std::size_t n = b.n_tokens();
    LLMKIT_CHECK(b.positions.size() == n, "llama_model::forward: positions.size() = ", b.positions.size(),
                 " differs from token_ids.size() = ", n);
    LLMKIT_CHECK(b.seq_ids.size() == n, "llama_model::forward: seq_ids.size() = ", b.seq_ids.size(),
                 " differs from token_ids.size() = ", n);
    LLMKIT_CHECK(cache.shape() == c.kv_shape(), "llama_model::forward: the cache's shape {", cache.shape().n_layers,
                 ", ", cache.shape().n_kv_heads, ", ", cache.shape().head_dim, "} differs from the model's {",
                 c.n_layers, ", ", c.n_kv_heads, ", ", c.head_dim, "}");
    for (std::size_t i = 0; i < n; ++i)
      LLMKIT_CHECK(b.token_ids[i] >= 0 && static_cast<std::size_t>(b.token_ids[i]) < c.n_vocab,
                   "llama_model::forward: token_ids[", i, "] = ", b.token_ids[i], " is outside the vocabulary of ",
                   c.n_vocab, " tokens");
    for (std::size_t r = 0; r < b.n_logits(); ++r)
      LLMKIT_CHECK(b.logit_rows[r] >= 0 && static_cast<std::size_t>(b.logit_rows[r]) < n,
                   "llama_model::forward: logit_rows[", r, "] = ", b.logit_rows[r], " is outside the ", n, " tokens");
    plan_segments(b, cache);
    reserve(n, b.n_logits());

    // Grow every sequence; undo on failure where the cache can.
    for (std::size_t s = 0; s < segments_.size(); ++s) {
      const segment& seg = segments_[s];
      if (!cache.grow(seg.seq, seg.count)) {
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

    // Attention runs on the calling thread when it is smaller than a hand-off.
    const bool prefill_parallel = exec.concurrency() > 1 && attention_work_ >= detail::matmul_parallel_min_work;
    const bool decode_parallel = exec.concurrency() > 1 && decode_work_ >= detail::matmul_parallel_min_work;
    const bool mixed = !decode_seqs_.empty() && !prefill_seqs_.empty();
    const std::size_t n_prefill = std::size_t(cu_seqlens_.back());
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const layer& w = layers_[l];
      for (std::size_t i = 0; i < n; ++i)
        simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.attn_norm, std::span(xn + i * dim, dim), c.rms_eps);
      product(exec, xn, n, w.wqkv, qkv_.data(), qkvd, false);
      for (std::size_t i = 0; i < n; ++i) {
        float* row = qkv_.data() + i * qkvd;
        rope(std::span(row, qd), b.positions[i]);
        rope(std::span(row + qd, kvd), b.positions[i]);
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
      if (n_prefill > 0) {
        const attention::prefill_params ap{.q = std::span<const float>(q_.data(), n_prefill * qd),
                                           .out = std::span<float>(att_.data(), n_prefill * qd),
                                           .cu_seqlens = cu_seqlens_,
                                           .seq_ids = prefill_seqs_,
                                           .layer = l,
                                           .n_heads = c.n_heads};
        if (prefill_parallel)
          attention::prefill(ap, std::as_const(cache), attention::causal_mask{}, exec);
        else
          attention::prefill(ap, std::as_const(cache), attention::causal_mask{}, serial_executor{});
      }
      if (!decode_seqs_.empty()) {
        const std::size_t nd = decode_seqs_.size();
        const attention::decode_params dp{.q = std::span<const float>(q_.data() + n_prefill * qd, nd * qd),
                                          .out = std::span<float>(att_.data() + n_prefill * qd, nd * qd),
                                          .seq_ids = decode_seqs_,
                                          .layer = l,
                                          .n_heads = c.n_heads,
                                          .workspace = &decode_ws_,
                                          .int8_queries = options_.int8_attention_queries,
                                          .bf16_queries = options_.bf16_attention_queries,
                                          .bf16_probabilities = options_.bf16_attention_probabilities,
                                          .int8_probabilities = options_.int8_attention_probabilities};
        if (decode_parallel)
          attention::decode(dp, std::as_const(cache), attention::causal_mask{}, exec);
        else
          attention::decode(dp, std::as_const(cache), attention::causal_mask{}, serial_executor{});
      }
      const float* att = att_.data();
      if (mixed) {  // back to batch order for the output projection
        for (std::size_t i = 0; i < n; ++i)
          std::memcpy(q_.data() + i * qd, att_.data() + std::size_t(attention_row_[i]) * qd, qd * sizeof(float));
        att = q_.data();
      }
      product(exec, att, n, w.wo, x, dim, true);

      for (std::size_t i = 0; i < n; ++i)
        simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.ffn_norm, std::span(xn + i * dim, dim), c.rms_eps);
      const std::size_t f = c.ffn_dim;
      product(exec, xn, n, w.w_gate_up, ffn_.data(), 2 * f, false);
      for (std::size_t i = 0; i < n; ++i)
        detail::swiglu(ffn_.data() + i * 2 * f, ffn_.data() + i * 2 * f + f, hidden_.data() + i * f, f);
      product(exec, hidden_.data(), n, w.w_down, x, dim, true);
    }

    const std::size_t n_out = b.n_logits();
    for (std::size_t r = 0; r < n_out; ++r)
      simd::rmsnorm(std::span<const float>(x + std::size_t(b.logit_rows[r]) * dim, dim), output_norm_,
                    std::span(xn + r * dim, dim), c.rms_eps);
    product(exec, xn, n_out, c_output(), logits_.data(), c.n_vocab, false);
    return matrix_view<const float>(logits_.data(), n_out, c.n_vocab);
  }

  /// forward() on the calling thread.
  template <kv::kv_cache Cache>
  matrix_view<const float> forward(const batch& b, Cache& cache) {
    serial_executor serial;
    return forward(b, cache, serial);
  }

 private:
  struct layer {
    aligned_vector<float> attn_norm, ffn_norm;          // [dim] f32
    weight_matrix wqkv, wo, w_gate_up, w_down;          // fused Q|K|V, output, gate|up, down
  };
  struct segment {
    kv::seq_id seq;
    std::size_t first, count, base;
  };

  const weight_matrix& c_output() const noexcept { return config_.tied_output ? token_embd_ : output_; }

  template <class Exec>
  void product(Exec& exec, const float* x, std::size_t n, const weight_matrix& w, float* y, std::size_t y_stride,
               bool accumulate) {
    if (options_.activations == activation_type::q8_0 && w.type() == weight_type::q8_0) {
      detail::matmul_q8(exec, x, n, w.cols(), detail::q8_weights{w.q8_data(), w.q8_scales(), w.cols()}, w.rows(), y,
                        y_stride, accumulate, q8_x_);
      return;
    }
    w.visit([&](const auto& acc) { detail::matmul(exec, x, n, w.cols(), acc, w.rows(), y, y_stride, accumulate); });
  }

  template <class Cache>
  void plan_segments(const batch& b, const Cache& cache) {
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
    // Segments of one token are decode rows (attention::decode); longer ones
    // go through attention::prefill. attention_row_ maps a batch row to its
    // row in the attention order: prefill rows first, then decode rows.
    cu_seqlens_.assign(1, 0);
    prefill_seqs_.clear();
    decode_seqs_.clear();
    attention_row_.resize(n);
    attention_work_ = 0;
    decode_work_ = 0;
    std::int32_t next = 0;
    const double width = double(config_.n_heads * config_.head_dim);
    for (const segment& seg : segments_) {
      if (seg.count == 1) continue;
      for (std::size_t k = 0; k < seg.count; ++k) attention_row_[seg.first + k] = next++;
      cu_seqlens_.push_back(next);
      prefill_seqs_.push_back(seg.seq);
      // (query, key) pairs the causal mask keeps, times the head width.
      const double q = double(seg.count), k0 = double(seg.base);
      attention_work_ += (q * k0 + q * (q + 1) / 2) * width;
    }
    for (const segment& seg : segments_) {
      if (seg.count != 1) continue;
      attention_row_[seg.first] = next++;
      decode_seqs_.push_back(seg.seq);
      decode_work_ += double(seg.base + 1) * width;
    }
  }

  void rope(std::span<float> heads, std::int32_t position) const {
    if (static_cast<std::size_t>(position) < rope_table_.max_positions())
      simd::apply_rope(heads, config_.head_dim, position, rope_table_);
    else
      simd::apply_rope(heads, config_.head_dim, position, config_.rope);
  }

  void reserve(std::size_t n, std::size_t n_out) {
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
    ensure(ffn_, n * 2 * c.ffn_dim);
    ensure(hidden_, n * c.ffn_dim);
    ensure(logits_, n_out * c.n_vocab);
  }

  llama_config config_;
  llama_options options_;
  simd::rope_table rope_table_;
  weight_matrix token_embd_, output_;   // [n_vocab, dim]; output_ empty when tied
  aligned_vector<float> output_norm_;  // [dim]
  std::vector<layer> layers_;
  // Workspace, grown on demand and reused across calls.
  aligned_vector<float> x_, xn_, qkv_, q_, k_, v_, att_, ffn_, hidden_, logits_;
  std::vector<segment> segments_;
  std::vector<std::int32_t> cu_seqlens_;    // [prefill segments + 1] offsets in attention order
  std::vector<kv::seq_id> prefill_seqs_;   // [prefill segments] their sequences
  std::vector<kv::seq_id> decode_seqs_;    // [decode segments] sequences with one token in the batch
  std::vector<std::int32_t> attention_row_;  // [n_tokens] row of each token in attention order
  attention::decode_workspace decode_ws_;
  detail::q8_activations q8_x_;  // activations quantised for Q8_0 products (options_.activations == q8_0)
  double attention_work_ = 0;              // multiply-adds of one layer's prefill attention, roughly
  double decode_work_ = 0;                 // same for the decode rows
};

}  // namespace llmkit::model

LLMKIT_SIMD_DIAGNOSTICS_END
