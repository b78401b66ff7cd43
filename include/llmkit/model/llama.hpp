// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/llama.hpp
/// Reference Llama-architecture model driven by GGUF metadata: token
/// embedding, per layer RMSNorm -> Q/K/V projections -> RoPE -> grouped-query
/// causal attention over a KV cache -> output projection (residual), RMSNorm ->
/// SwiGLU feed-forward (residual); final RMSNorm and the output projection
/// (separate `output.weight`, or tied to the embedding when absent).
///
/// Weights: every tensor (F32, F16, BF16 or Q8_0 in the file) is converted
/// to f32 once, at load, into 64-byte aligned buffers; Q, K, V are fused into
/// one matrix and so are the gate and up projections, so a layer runs four
/// products. Products use llmkit's register-tiled kernel
/// (model/detail/matmul.hpp), split over output rows across the caller's
/// executor; it is batch invariant (each output is one dot product summed in
/// a fixed order), so a sequence's logits do not depend on what else is in
/// the batch. RMSNorm and RoPE are llmkit::simd kernels, K/V go through the
/// `kv_cache` contract, and attention is llmkit::attention::prefill (causal
/// mask) over the cache, one batch sequence per segment.
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
#include "llmkit/simd/rmsnorm.hpp"
#include "llmkit/simd/rope.hpp"

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

  /// Head sizes the attention kernels (attention/prefill.hpp) are compiled for.
  static constexpr std::array<std::size_t, 9> supported_head_dims{8, 16, 32, 64, 80, 96, 112, 128, 256};

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
    LLMKIT_CHECK(std::ranges::find(supported_head_dims, head_dim) != supported_head_dims.end(),
                 "llama_config: head_dim = ", head_dim,
                 " is not supported by the attention kernels (supported: 8 16 32 64 80 96 112 128 256)");
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

/// Converts a GGUF tensor of shape `[rows, cols]` to f32. ([rows * cols] out)
inline void load_f32(const gguf_file& file, const std::string& name, std::size_t rows, std::size_t cols, float* out) {
  const gguf_tensor& t = check_tensor(file, name, rows, cols);
  const std::size_t n = rows * cols;
  switch (t.type) {
    case ggml_type::f32: std::memcpy(out, t.data, n * sizeof(float)); break;
    case ggml_type::f16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = f16_bits_to_f32(b);
      }
      break;
    case ggml_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = bf16_bits_to_f32(b);
      }
      break;
    case ggml_type::q8_0:
      for (std::size_t blk = 0; blk < n / q8_block_size; ++blk) {
        block_q8_0 q;
        std::memcpy(&q, t.data + blk * sizeof(block_q8_0), sizeof(block_q8_0));
        const float s = to_f32(q.scale);
        for (std::size_t j = 0; j < q8_block_size; ++j) out[blk * q8_block_size + j] = s * float(q.qs[j]);
      }
      break;
  }
}
}  // namespace detail

/// Positions with precomputed RoPE factors; later ones are computed on the fly.
inline constexpr std::size_t rope_table_max_positions = 8192;

/// A Llama-architecture model with f32 weights in memory. forward() is not
/// reentrant (the model owns its activation workspace); use one model object
/// per concurrent caller.
class llama_model {
 public:
  /// Loads config and weights from an open GGUF file (the file may be closed
  /// afterwards: weights are copied).
  explicit llama_model(const gguf_file& file)
      : config_(llama_config::from_gguf(file)),
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
    token_embd_.resize(c.n_vocab * c.dim);
    detail::load_f32(file, "token_embd.weight", c.n_vocab, c.dim, token_embd_.data());
    output_norm_.resize(c.dim);
    detail::load_f32(file, "output_norm.weight", 1, c.dim, output_norm_.data());
    if (!c.tied_output) {
      output_.resize(c.n_vocab * c.dim);
      detail::load_f32(file, "output.weight", c.n_vocab, c.dim, output_.data());
    }
    layers_.resize(c.n_layers);
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      layer& w = layers_[l];
      w.attn_norm.resize(c.dim);
      detail::load_f32(file, b + "attn_norm.weight", 1, c.dim, w.attn_norm.data());
      w.wqkv.resize((qd + 2 * kvd) * c.dim);
      detail::load_f32(file, b + "attn_q.weight", qd, c.dim, w.wqkv.data());
      detail::load_f32(file, b + "attn_k.weight", kvd, c.dim, w.wqkv.data() + qd * c.dim);
      detail::load_f32(file, b + "attn_v.weight", kvd, c.dim, w.wqkv.data() + (qd + kvd) * c.dim);
      w.wo.resize(c.dim * qd);
      detail::load_f32(file, b + "attn_output.weight", c.dim, qd, w.wo.data());
      w.ffn_norm.resize(c.dim);
      detail::load_f32(file, b + "ffn_norm.weight", 1, c.dim, w.ffn_norm.data());
      w.w_gate_up.resize(2 * c.ffn_dim * c.dim);
      detail::load_f32(file, b + "ffn_gate.weight", c.ffn_dim, c.dim, w.w_gate_up.data());
      detail::load_f32(file, b + "ffn_up.weight", c.ffn_dim, c.dim, w.w_gate_up.data() + c.ffn_dim * c.dim);
      w.w_down.resize(c.dim * c.ffn_dim);
      detail::load_f32(file, b + "ffn_down.weight", c.dim, c.ffn_dim, w.w_down.data());
    }
  }

  /// Opens, loads and closes a GGUF file.
  static llama_model load(const std::string& path) { return llama_model(gguf_file::open(path)); }

  const llama_config& config() const noexcept { return config_; }
  std::size_t vocab_size() const noexcept { return config_.n_vocab; }
  kv::kv_shape kv_shape() const noexcept { return config_.kv_shape(); }

  /// Bytes of weights one forward pass reads (every matrix once, plus one
  /// embedding row per token, not counted here): the memory traffic of a
  /// decode step besides the KV cache.
  std::size_t weight_bytes_per_step() const noexcept {
    const auto& c = config_;
    const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    const std::size_t per_layer = (qd + 2 * kvd) * c.dim + c.dim * qd + 3 * c.ffn_dim * c.dim + 2 * c.dim;
    return sizeof(float) * (c.n_layers * per_layer + c.n_vocab * c.dim + c.dim);
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
      std::memcpy(x + i * dim, token_embd_.data() + std::size_t(b.token_ids[i]) * dim, dim * sizeof(float));

    for (std::size_t l = 0; l < c.n_layers; ++l) {
      const layer& w = layers_[l];
      for (std::size_t i = 0; i < n; ++i)
        simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.attn_norm, std::span(xn + i * dim, dim), c.rms_eps);
      detail::matmul(exec, xn, n, dim, w.wqkv.data(), qkvd, qkv_.data(), qkvd, false);
      for (std::size_t i = 0; i < n; ++i) {
        float* row = qkv_.data() + i * qkvd;
        rope(std::span(row, qd), b.positions[i]);
        rope(std::span(row + qd, kvd), b.positions[i]);
        std::memcpy(k_.data() + i * kvd, row + qd, kvd * sizeof(float));
        std::memcpy(v_.data() + i * kvd, row + qd + kvd, kvd * sizeof(float));
      }
      for (const segment& seg : segments_)
        cache.store(seg.seq, l, seg.base, std::span<const float>(k_.data() + seg.first * kvd, seg.count * kvd),
                    std::span<const float>(v_.data() + seg.first * kvd, seg.count * kvd));
      // The segments' queries are the last seg.count positions of their
      // sequences, now that their K/V rows are stored.
      for (std::size_t i = 0; i < n; ++i) std::memcpy(q_.data() + i * qd, qkv_.data() + i * qkvd, qd * sizeof(float));
      const attention::prefill_params ap{.q = std::span<const float>(q_.data(), n * qd),
                                         .out = std::span<float>(att_.data(), n * qd),
                                         .cu_seqlens = cu_seqlens_,
                                         .seq_ids = segment_seqs_,
                                         .layer = l,
                                         .n_heads = c.n_heads};
      // Small attention (decode of a short context) costs less than a
      // hand-off; the result does not depend on the executor.
      if (exec.concurrency() <= 1 || attention_work_ < detail::matmul_parallel_min_work)
        attention::prefill(ap, std::as_const(cache), attention::causal_mask{}, serial_executor{});
      else
        attention::prefill(ap, std::as_const(cache), attention::causal_mask{}, exec);
      detail::matmul(exec, att_.data(), n, qd, w.wo.data(), dim, x, dim, true);

      for (std::size_t i = 0; i < n; ++i)
        simd::rmsnorm(std::span<const float>(x + i * dim, dim), w.ffn_norm, std::span(xn + i * dim, dim), c.rms_eps);
      const std::size_t f = c.ffn_dim;
      detail::matmul(exec, xn, n, dim, w.w_gate_up.data(), 2 * f, ffn_.data(), 2 * f, false);
      for (std::size_t i = 0; i < n; ++i) {
        const float* g = ffn_.data() + i * 2 * f;
        const float* u = g + f;
        float* h = hidden_.data() + i * f;
        for (std::size_t j = 0; j < f; ++j) h[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
      }
      detail::matmul(exec, hidden_.data(), n, f, w.w_down.data(), dim, x, dim, true);
    }

    const std::size_t n_out = b.n_logits();
    for (std::size_t r = 0; r < n_out; ++r)
      simd::rmsnorm(std::span<const float>(x + std::size_t(b.logit_rows[r]) * dim, dim), output_norm_,
                    std::span(xn + r * dim, dim), c.rms_eps);
    const float* w_out = c.tied_output ? token_embd_.data() : output_.data();
    detail::matmul(exec, xn, n_out, dim, w_out, c.n_vocab, logits_.data(), c.n_vocab, false);
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
    aligned_vector<float> attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down;
  };
  struct segment {
    kv::seq_id seq;
    std::size_t first, count, base;
  };

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
    cu_seqlens_.assign(1, 0);
    segment_seqs_.clear();
    attention_work_ = 0;
    for (const segment& seg : segments_) {
      cu_seqlens_.push_back(static_cast<std::int32_t>(seg.first + seg.count));
      segment_seqs_.push_back(seg.seq);
      // (query, key) pairs the causal mask keeps, times the head width.
      const double q = double(seg.count), k0 = double(seg.base);
      attention_work_ += (q * k0 + q * (q + 1) / 2) * double(config_.n_heads * config_.head_dim);
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
    auto ensure = [](aligned_vector<float>& v, std::size_t size) {
      if (v.size() < size) v.resize(size);
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
  simd::rope_table rope_table_;
  aligned_vector<float> token_embd_, output_norm_, output_;
  std::vector<layer> layers_;
  // Workspace, grown on demand and reused across calls.
  aligned_vector<float> x_, xn_, qkv_, q_, k_, v_, att_, ffn_, hidden_, logits_;
  std::vector<segment> segments_;
  std::vector<std::int32_t> cu_seqlens_;    // [segments + 1] token offsets of the segments
  std::vector<kv::seq_id> segment_seqs_;   // [segments] their sequences
  double attention_work_ = 0;              // multiply-adds of one layer's attention, roughly
};

}  // namespace llmkit::model
