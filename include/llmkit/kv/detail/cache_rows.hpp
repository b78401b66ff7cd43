// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/detail/cache_rows.hpp
/// The row writes of `store` and the per-sequence sums of `usage`, shared by
/// every cache. A cache says only where a token slot's rows live; the walk
/// over tokens and heads, the write prefetch and the int8 scales are here.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>

#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/storage.hpp"
#include "llmkit/kv/tuning.hpp"

namespace llmkit::kv::detail {

/// Where one token slot lives: its row and scale in run 0 (layer 0, K,
/// head 0). Run r's row is `rows + r * rows_per_run * head_dim` and its
/// scale `scales + r * rows_per_run`; `scales` is null unless T has row scales.
template <kv_storage T>
struct slot_rows {
  T* rows = nullptr;
  float* scales = nullptr;
};

/// Encodes `[n_new, n_kv_heads, head_dim] k, v` into token slots
/// [first_token, first_token + n_new) of layer `layer`, token by token, and
/// prefetches for writing the rows `store_prefetch_tokens<T>` slots ahead.
/// `locate(slot) -> slot_rows<T>` maps a slot to its rows; runs (layer,
/// K/V, head) are `rows_per_run` rows apart.
/// @pre the arguments passed check_store and the slots are writable.
template <kv_storage T, class Locate>
void store_rows(const kv_shape& shape, std::size_t rows_per_run, std::size_t layer, std::size_t first_token,
                std::size_t n_new, const float* k, const float* v, Locate&& locate) {
  constexpr std::size_t prefetch = store_prefetch_tokens<T>;
  const std::size_t d = shape.head_dim, run_stride = rows_per_run * d;
  for (std::size_t t = 0; t < n_new; ++t) {
    const slot_rows<T> at = locate(first_token + t);
    const bool ahead = prefetch > 0 && t + prefetch < n_new;
    const slot_rows<T> next = ahead ? locate(first_token + t + prefetch) : slot_rows<T>{};
    for (std::size_t h = 0; h < shape.n_kv_heads; ++h) {
      const std::size_t src = (t * shape.n_kv_heads + h) * d;
      const std::size_t k_run = (layer * 2 + 0) * shape.n_kv_heads + h;
      const std::size_t v_run = (layer * 2 + 1) * shape.n_kv_heads + h;
      if (ahead) {
        prefetch_for_write(next.rows + k_run * run_stride, d);
        prefetch_for_write(next.rows + v_run * run_stride, d);
      }
      const float ks = encode_row(k + src, at.rows + k_run * run_stride, d);
      const float vs = encode_row(v + src, at.rows + v_run * run_stride, d);
      if constexpr (has_row_scale_v<T>) {
        at.scales[k_run * rows_per_run] = ks;
        at.scales[v_run * rows_per_run] = vs;
      }
    }
  }
}

/// n_sequences, n_tokens and token_bytes of a cache's live sequences; the
/// caller fills in bytes_allocated and bytes_in_use. A sequence's
/// token_bytes count at most `max_rows_held` rows (a ring holds no more).
/// `sequences` is a sequence_table whose states have an `n_tokens` field.
template <class Table>
cache_usage sequence_usage(const Table& sequences, std::size_t bytes_per_token,
                           std::size_t max_rows_held = std::numeric_limits<std::size_t>::max()) {
  cache_usage u;
  sequences.for_each([&](seq_id, const auto& seq) {
    ++u.n_sequences;
    u.n_tokens += seq.n_tokens;
    u.token_bytes += std::min(seq.n_tokens, max_rows_held) * bytes_per_token;
  });
  return u;
}

}  // namespace llmkit::kv::detail
