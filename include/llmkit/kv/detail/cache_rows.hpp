// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/detail/cache_rows.hpp
/// The row writes of `store` and the per-sequence sums of `usage`, shared by
/// every cache. A cache says only where a token slot's rows live; the walk
/// over tokens and heads, the write prefetch and the int8 scales are here.

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

/// Runs of every cache's rows: one per (layer, K/V, KV head), in that order.
inline std::size_t n_runs(const kv_shape& shape) noexcept { return shape.n_layers * 2 * shape.n_kv_heads; }

/// Index of the run of (layer, kv: 0 for K and 1 for V, head).
inline std::size_t run_index(const kv_shape& shape, std::size_t layer, std::size_t kv, std::size_t head) noexcept {
  return (layer * 2 + kv) * shape.n_kv_heads + head;
}

/// slot_rows of slot `slot` in a region of `[n_runs][slots_per_run][head_dim]
/// rows` and `[n_runs][slots_per_run] scales` (scales unused unless T has
/// row scales).
template <kv_storage T>
slot_rows<T> slot_at(T* rows, float* scales, std::size_t slot, std::size_t head_dim) noexcept {
  slot_rows<T> at{rows + slot * head_dim};
  if constexpr (has_row_scale_v<T>) at.scales = scales + slot;
  return at;
}

/// The chunk of `count` rows from slot `first_slot` of (layer, kv_head) in
/// a region laid out as for slot_at, its row 0 at position `first_pos`.
template <kv_storage T>
kv_chunk<T> run_chunk(const T* rows, const float* scales, const kv_shape& shape, std::size_t slots_per_run,
                      std::size_t layer, std::size_t kv_head, std::size_t first_slot, std::size_t count,
                      std::size_t first_pos) noexcept {
  const std::size_t k_run = run_index(shape, layer, 0, kv_head), v_run = run_index(shape, layer, 1, kv_head);
  kv_chunk<T> c;
  c.k = rows + (k_run * slots_per_run + first_slot) * shape.head_dim;
  c.v = rows + (v_run * slots_per_run + first_slot) * shape.head_dim;
  if constexpr (has_row_scale_v<T>) {
    c.k_scale = scales + k_run * slots_per_run + first_slot;
    c.v_scale = scales + v_run * slots_per_run + first_slot;
  }
  c.n_tokens = count;
  c.row_stride = shape.head_dim;
  c.first_pos = static_cast<std::int32_t>(first_pos);
  return c;
}

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
      const std::size_t k_run = run_index(shape, layer, 0, h), v_run = run_index(shape, layer, 1, h);
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
