// SPDX-License-Identifier: MIT
#pragma once

/// @file reference/attention_reference.hpp
/// Test harness of the attention kernels:
/// - `chunked_test_cache<T>`: a small kv_readable cache that splits every
///   sequence's rows into caller-chosen (e.g. random) chunks, with padded
///   rows, any first position and optionally a rotated chunk order (a ring);
/// - `reference_attention`: the naive double-precision oracle, reading K/V
///   through the same chunk view, materialising every score;
/// - `uniform_values` and `attention_errors`: random inputs and the largest
///   deviations of a kernel's output from the oracle.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/core/error.hpp>
#include <llmkit/kv/kv_view.hpp>

namespace llmkit::test {

/// Largest |out - oracle on the stored K/V| accepted from the f32 kernels
/// (values in [-1, 1]).
inline constexpr double attention_f32_tolerance = 1e-5;
/// The same for int8 decode on a VNNI CPU (AVX-512 VNNI or AVX-VNNI): P.V
/// runs in integers with each block's probabilities rounded to 16 bits
/// (decode_kernels::int16_values), which adds up to ~1.2e-5 on the tests'
/// cases; 12-bit probabilities fail it.
inline constexpr double attention_int8_decode_tolerance = 4e-5;

/// [n] values uniform in [lo, hi).
inline std::vector<float> uniform_values(std::size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = u(rng);
  return x;
}

/// Largest |out - oracle| of a kernel's output, against the oracle on the
/// stored (converted) K/V and on the original f32 K/V.
struct attention_errors {
  double stored = 0.0;
  double original = 0.0;
  bool finite = true;
  std::vector<float> out;  ///< the kernel's output, when the test keeps it

  /// Folds in `out[x]` against `ref[x]` (stored) and `ref0[x]` (original).
  void add(const float* out_rows, const std::vector<double>& ref, const std::vector<double>& ref0) {
    for (std::size_t x = 0; x < ref.size(); ++x) {
      const double o = out_rows[x];
      if (!std::isfinite(o)) finite = false;
      stored = std::max(stored, std::fabs(o - ref[x]));
      original = std::max(original, std::fabs(o - ref0[x]));
    }
  }
};

/// Stored value of an f32 for storage type T (int8 uses the row's scale).
template <class T>
T quantize_value(float x, float int8_scale) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, f16>) return to_f16(x);
  else if constexpr (std::is_same_v<T, bf16>) return to_bf16(x);
  else {
    const float q = std::nearbyint(x / int8_scale);
    return static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
}

/// A kv_readable cache for tests: rows of each (sequence, layer, KV head)
/// cut into the given chunks, each chunk its own allocation with row_stride
/// = head_dim + row_padding.
template <class T>
class chunked_test_cache {
 public:
  using storage_type = T;

  explicit chunked_test_cache(kv::kv_shape shape, std::size_t row_padding = 0)
      : shape_(shape), row_stride_(shape.head_dim + row_padding) {}

  kv::kv_shape shape() const { return shape_; }
  std::size_t n_tokens(kv::seq_id s) const { return find(s).n_tokens; }
  std::size_t n_chunks(kv::seq_id s) const { return find(s).chunk_sizes.size(); }
  kv::kv_chunk<T> chunk(kv::seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    const sequence& seq = find(s);
    LLMKIT_CHECK(layer < shape_.n_layers && kv_head < shape_.n_kv_heads && i < seq.chunk_sizes.size(),
                 "chunked_test_cache: chunk index out of range");
    const stored_chunk& c = seq.chunks[(layer * shape_.n_kv_heads + kv_head) * seq.chunk_sizes.size() + i];
    kv::kv_chunk<T> out;
    out.k = c.k.data();
    out.v = c.v.data();
    if constexpr (std::is_same_v<T, std::int8_t>) {
      out.k_scale = c.k_scale.data();
      out.v_scale = c.v_scale.data();
    }
    out.n_tokens = c.n_tokens;
    out.row_stride = row_stride_;
    out.first_pos = c.first_pos;
    return out;
  }

  /// Adds sequence `s` with `[n_layers, n_tokens, n_kv_heads, head_dim]` f32
  /// keys and values (token t at position first_pos + t), stored as T and
  /// split into chunks of `chunk_sizes` (summing to n_tokens). With
  /// `rotate` > 0 the chunk list starts at chunk `rotate` (a ring buffer's
  /// order: positions no longer increase across chunks).
  void add_sequence(kv::seq_id s, std::size_t n_tokens, std::span<const float> k, std::span<const float> v,
                    std::vector<std::size_t> chunk_sizes, std::int32_t first_pos = 0, std::size_t rotate = 0) {
    const std::size_t H = shape_.n_kv_heads, D = shape_.head_dim;
    LLMKIT_CHECK(k.size() == shape_.n_layers * n_tokens * H * D && v.size() == k.size(),
                 "chunked_test_cache: k/v size mismatch");
    LLMKIT_CHECK(std::accumulate(chunk_sizes.begin(), chunk_sizes.end(), std::size_t{0}) == n_tokens,
                 "chunked_test_cache: chunk sizes must sum to n_tokens");
    sequence seq;
    seq.n_tokens = n_tokens;
    std::vector<std::size_t> starts(chunk_sizes.size());
    std::exclusive_scan(chunk_sizes.begin(), chunk_sizes.end(), starts.begin(), std::size_t{0});
    if (!chunk_sizes.empty()) {
      rotate %= chunk_sizes.size();
      std::rotate(chunk_sizes.begin(), chunk_sizes.begin() + static_cast<std::ptrdiff_t>(rotate), chunk_sizes.end());
      std::rotate(starts.begin(), starts.begin() + static_cast<std::ptrdiff_t>(rotate), starts.end());
    }
    seq.chunk_sizes = chunk_sizes;
    for (std::size_t layer = 0; layer < shape_.n_layers; ++layer)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < chunk_sizes.size(); ++c) {
          stored_chunk sc;
          sc.n_tokens = chunk_sizes[c];
          sc.first_pos = first_pos + static_cast<std::int32_t>(starts[c]);
          // Never empty, so pointers are valid even for empty chunks.
          sc.k.assign(std::max<std::size_t>(1, sc.n_tokens) * row_stride_, T{});
          sc.v.assign(std::max<std::size_t>(1, sc.n_tokens) * row_stride_, T{});
          sc.k_scale.assign(std::max<std::size_t>(1, sc.n_tokens), 1.0f);
          sc.v_scale.assign(std::max<std::size_t>(1, sc.n_tokens), 1.0f);
          for (std::size_t t = 0; t < sc.n_tokens; ++t) {
            const std::size_t src = ((layer * n_tokens + starts[c] + t) * H + h) * D;
            store_row(k.subspan(src, D), sc.k.data() + t * row_stride_, sc.k_scale[t]);
            store_row(v.subspan(src, D), sc.v.data() + t * row_stride_, sc.v_scale[t]);
          }
          seq.chunks.push_back(std::move(sc));
        }
    // chunks are indexed [(layer * H + h) * n_chunks + c]
    sequences_[s] = std::move(seq);
  }

 private:
  struct stored_chunk {
    aligned_vector<T> k, v;
    std::vector<float> k_scale, v_scale;
    std::size_t n_tokens = 0;
    std::int32_t first_pos = 0;
  };
  struct sequence {
    std::size_t n_tokens = 0;
    std::vector<std::size_t> chunk_sizes;
    std::vector<stored_chunk> chunks;
  };

  void store_row(std::span<const float> x, T* dst, float& scale) const {
    float amax = 0.0f;
    for (float e : x) amax = std::max(amax, std::fabs(e));
    scale = std::is_same_v<T, std::int8_t> ? (amax > 0.0f ? amax / 127.0f : 1.0f) : 1.0f;
    for (std::size_t d = 0; d < x.size(); ++d) dst[d] = quantize_value<T>(x[d], scale);
  }

  const sequence& find(kv::seq_id s) const {
    const auto it = sequences_.find(s);
    LLMKIT_CHECK(it != sequences_.end(), "chunked_test_cache: unknown sequence ", s);
    return it->second;
  }

  kv::kv_shape shape_;
  std::size_t row_stride_;
  std::map<kv::seq_id, sequence> sequences_;
};

/// Random chunk sizes summing to n (sizes 0..max_chunk, zeros included).
inline std::vector<std::size_t> random_chunks(std::size_t n, std::size_t max_chunk, std::mt19937& rng) {
  std::vector<std::size_t> sizes;
  std::uniform_int_distribution<std::size_t> pick(0, max_chunk);
  while (n > 0) {
    const std::size_t c = std::min(n, pick(rng));
    sizes.push_back(c);
    n -= c;
  }
  if (sizes.empty() || rng() % 4 == 0) sizes.push_back(0);
  return sizes;
}

/// Value of stored element x (with its row scale) as the oracle sees it.
template <class T>
double dequantize(T x, float scale) {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<double>(x) * static_cast<double>(scale);
  else return static_cast<double>(to_f32(x));
}

/// Naive double-precision attention of `n_q` query tokens of one sequence:
/// `[n_q, n_heads, head_dim] q` at positions `q_pos[0..n_q)`, reading every
/// K/V row of (seq, layer) through the chunk view. Returns `[n_q, n_heads,
/// head_dim]`; a query that sees no key gives zeros. `visible(q_pos, k_pos)`
/// is the mask; scores are scale * q.k, then cap * tanh(s / cap) if cap > 0.
/// `[n_heads] sinks` (or empty): head h's softmax denominator has one more
/// term exp(sinks[h]), with no value.
template <class Cache, class Visible>
std::vector<double> reference_attention(const Cache& cache, kv::seq_id seq, std::size_t layer,
                                        std::span<const float> q, std::span<const std::int32_t> q_pos,
                                        std::size_t n_heads, double scale, double softcap, Visible&& visible,
                                        std::span<const float> sinks = {}) {
  using T = typename Cache::storage_type;
  const kv::kv_shape shape = cache.shape();
  const std::size_t D = shape.head_dim, H = shape.n_kv_heads, group = n_heads / H, n_q = q_pos.size();
  std::vector<double> out(n_q * n_heads * D, 0.0);
  for (std::size_t h = 0; h < H; ++h) {
    std::vector<std::vector<double>> keys, values;
    std::vector<std::int32_t> pos;
    for (std::size_t c = 0; c < cache.n_chunks(seq); ++c) {
      const auto ch = cache.chunk(seq, layer, h, c);
      for (std::size_t t = 0; t < ch.n_tokens; ++t) {
        std::vector<double> kr(D), vr(D);
        for (std::size_t d = 0; d < D; ++d) {
          kr[d] = dequantize<T>(ch.k[t * ch.row_stride + d], ch.k_scale ? ch.k_scale[t] : 1.0f);
          vr[d] = dequantize<T>(ch.v[t * ch.row_stride + d], ch.v_scale ? ch.v_scale[t] : 1.0f);
        }
        keys.push_back(std::move(kr));
        values.push_back(std::move(vr));
        pos.push_back(ch.first_pos + static_cast<std::int32_t>(t));
      }
    }
    std::vector<double> scores(keys.size());
    for (std::size_t i = 0; i < n_q; ++i)
      for (std::size_t g = 0; g < group; ++g) {
        const std::size_t head = h * group + g;
        const float* qr = q.data() + (i * n_heads + head) * D;
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < keys.size(); ++j) {
          if (!visible(q_pos[i], pos[j])) {
            scores[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double s = 0.0;
          for (std::size_t d = 0; d < D; ++d) s += static_cast<double>(qr[d]) * keys[j][d];
          s *= scale;
          if (softcap > 0.0) s = softcap * std::tanh(s / softcap);
          scores[j] = s;
          m = std::max(m, s);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // nothing visible: zeros
        double sum = 0.0;
        std::vector<double> acc(D, 0.0);
        for (std::size_t j = 0; j < keys.size(); ++j) {
          if (scores[j] == -std::numeric_limits<double>::infinity()) continue;
          const double p = std::exp(scores[j] - m);
          sum += p;
          for (std::size_t d = 0; d < D; ++d) acc[d] += p * values[j][d];
        }
        if (!sinks.empty()) sum += std::exp(static_cast<double>(sinks[head]) - m);
        double* o = out.data() + (i * n_heads + head) * D;
        for (std::size_t d = 0; d < D; ++d) o[d] = acc[d] / sum;
      }
  }
  return out;
}

/// Largest position held for `seq` (layer 0, KV head 0).
template <class Cache>
std::int32_t reference_last_position(const Cache& cache, kv::seq_id seq) {
  std::int32_t last = std::numeric_limits<std::int32_t>::min();
  for (std::size_t c = 0; c < cache.n_chunks(seq); ++c) {
    const auto ch = cache.chunk(seq, 0, 0, c);
    if (ch.n_tokens > 0) last = std::max(last, ch.first_pos + static_cast<std::int32_t>(ch.n_tokens) - 1);
  }
  return last;
}

}  // namespace llmkit::test
