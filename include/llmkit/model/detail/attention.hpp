// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/attention.hpp
/// The reference model's causal attention over a KV cache: each query token
/// attends to the rows of its sequence whose position is <= its own, read
/// chunk by chunk through the kv_readable contract.
///
/// Per (query token, KV head): the group of query heads sharing the KV head
/// is scored against the visible K rows with the batch-invariant product of
/// matmul.hpp ([group, head_dim] x [rows, head_dim]^T), the scores go through
/// simd::softmax (max-subtracted, f32) and the output is the probability-
/// weighted sum of the V rows. Rows of non-f32 storage are converted to f32
/// in a per-thread scratch first. Every step depends only on the query and
/// its own sequence, so results do not depend on the rest of the batch.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/simd/softmax.hpp"

namespace llmkit::model::detail {

/// Largest head_dim the reference model accepts.
inline constexpr std::size_t attention_max_head_dim = 512;

/// Rows [0, n) of a chunk's K or V as a dense f32 `[n, head_dim]` array:
/// the cache's own memory when it already is one, else converted into `scratch`.
template <class T>
inline const float* kv_rows_f32(const T* base, const float* scales, std::size_t n, std::size_t row_stride,
                                std::size_t head_dim, aligned_vector<float>& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    if (row_stride == head_dim) return base;
  }
  if (scratch.size() < n * head_dim) scratch.resize(n * head_dim);
  for (std::size_t t = 0; t < n; ++t) {
    const T* row = base + t * row_stride;
    float* out = scratch.data() + t * head_dim;
    if constexpr (std::is_same_v<T, std::int8_t>) {
      for (std::size_t d = 0; d < head_dim; ++d) out[d] = static_cast<float>(row[d]) * scales[t];
    } else {
      for (std::size_t d = 0; d < head_dim; ++d) out[d] = to_f32(row[d]);
    }
  }
  return scratch.data();
}

/// Causal attention for every (query token, head) of a batch.
/// `[n_tokens] seq_of` and `[n_tokens] positions` give each query's sequence
/// and position; `q` is `[n_tokens, n_heads * head_dim]` with row stride
/// q_stride, `out` `[n_tokens, n_heads * head_dim]` with row stride
/// out_stride. Query head h reads KV head h / (n_heads / n_kv_heads).
template <kv::kv_readable Cache, class Exec>
void cache_attention(Exec& exec, const Cache& cache, std::size_t layer, std::span<const kv::seq_id> seq_of,
                     std::span<const std::int32_t> positions, const float* q, std::size_t q_stride, float* out,
                     std::size_t out_stride, std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim) {
  using T = typename Cache::storage_type;
  const std::size_t group = n_heads / n_kv_heads;
  const float temperature = std::sqrt(static_cast<float>(head_dim));  // softmax(s / sqrt(d))
  const std::size_t n_tokens = seq_of.size();
  serial_executor serial;
  auto body = [&](std::size_t task) {
    thread_local aligned_vector<float> scores, k_scratch, v_scratch;
    const std::size_t i = task / n_kv_heads, g = task % n_kv_heads;
    const kv::seq_id s = seq_of[i];
    const std::int32_t pos = positions[i];
    const std::size_t n_chunks = cache.n_chunks(s);
    auto visible = [&](const kv::kv_chunk<T>& c) -> std::size_t {
      const std::int64_t v = std::int64_t(pos) - std::int64_t(c.first_pos) + 1;
      return static_cast<std::size_t>(std::clamp<std::int64_t>(v, 0, std::int64_t(c.n_tokens)));
    };
    std::size_t total = 0;
    for (std::size_t c = 0; c < n_chunks; ++c) total += visible(cache.chunk(s, layer, g, c));
    if (scores.size() < group * total) scores.resize(group * total);
    const float* qg = q + i * q_stride + g * group * head_dim;  // [group, head_dim]
    std::size_t offset = 0;
    for (std::size_t c = 0; c < n_chunks; ++c) {
      const kv::kv_chunk<T> chunk = cache.chunk(s, layer, g, c);
      const std::size_t n = visible(chunk);
      if (n == 0) continue;
      const float* k = kv_rows_f32(chunk.k, chunk.k_scale, n, chunk.row_stride, head_dim, k_scratch);
      matmul(serial, qg, group, head_dim, k, n, scores.data() + offset, total, false);
      offset += n;
    }
    for (std::size_t a = 0; a < group; ++a) simd::softmax(std::span(scores.data() + a * total, total), temperature);
    float* og = out + i * out_stride + g * group * head_dim;
    for (std::size_t a = 0; a < group; ++a) std::fill_n(og + a * head_dim, head_dim, 0.0f);
    offset = 0;
    for (std::size_t c = 0; c < n_chunks; ++c) {
      const kv::kv_chunk<T> chunk = cache.chunk(s, layer, g, c);
      const std::size_t n = visible(chunk);
      if (n == 0) continue;
      const float* v = kv_rows_f32(chunk.v, chunk.v_scale, n, chunk.row_stride, head_dim, v_scratch);
      for (std::size_t a = 0; a < group; ++a) {
        const float* p = scores.data() + a * total + offset;
        float* o = og + a * head_dim;
        for (std::size_t t = 0; t < n; ++t) {
          const float* vr = v + t * head_dim;
          const float w = p[t];
          for (std::size_t d = 0; d < head_dim; ++d) o[d] += w * vr[d];
        }
      }
      offset += n;
    }
  };
  // Small attention (decode of a short context) costs less than a hand-off.
  double work = 0;
  for (std::size_t i = 0; i < n_tokens; ++i) work += double(positions[i] + 1);
  work *= double(n_heads * head_dim);
  if (exec.concurrency() <= 1 || work < matmul_parallel_min_work) {
    for (std::size_t task = 0; task < n_tokens * n_kv_heads; ++task) body(task);
  } else {
    exec.parallel_for(n_tokens * n_kv_heads, body);
  }
}

}  // namespace llmkit::model::detail
