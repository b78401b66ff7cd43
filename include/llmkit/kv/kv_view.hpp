// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/kv_view.hpp
/// The contract between KV caches and attention kernels.
///
/// Every cache (contiguous, paged, prefix, sliding window; any storage type)
/// presents the keys and values of one (sequence, layer, KV head) as a short
/// list of *chunks*: runs of consecutive token rows that are contiguous in
/// memory. Attention kernels iterate chunks and never know which cache they
/// read, so one kernel serves every cache type.
///
/// Writing is two-phase, as engines do it: `grow(seq, n)` reserves n more
/// token slots in every layer (or returns false and changes nothing), then
/// the model `store`s each layer's new K/V rows into those slots before that
/// layer's attention runs.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "llmkit/core/ids.hpp"

namespace llmkit::kv {

/// Identifies a sequence inside a cache.
using seq_id = std::int32_t;

/// The shape every cache is built with.
struct kv_shape {
  std::size_t n_layers = 0;
  std::size_t n_kv_heads = 0;
  std::size_t head_dim = 0;
  friend constexpr bool operator==(const kv_shape&, const kv_shape&) = default;
};

/// A run of `n_tokens` consecutive token rows of K and V for one
/// (sequence, layer, KV head). Row t of K starts at `k + t * row_stride` and
/// holds `head_dim` elements of `T` (float, f16, bf16 or std::int8_t); the
/// token at row t has position `first_pos + t`. For int8 storage the real
/// value is `k[t * row_stride + d] * k_scale[t]` (likewise V); for other
/// types the scale pointers are null.
template <class T>
struct kv_chunk {
  const T* k = nullptr;             ///< [n_tokens rows, row_stride apart] keys
  const T* v = nullptr;             ///< [n_tokens rows, row_stride apart] values
  const float* k_scale = nullptr;   ///< [n_tokens] int8 key scales, else null
  const float* v_scale = nullptr;   ///< [n_tokens] int8 value scales, else null
  std::size_t n_tokens = 0;
  std::size_t row_stride = 0;       ///< elements between consecutive rows
  std::int32_t first_pos = 0;       ///< position of row 0
};

/// What attention kernels read. Chunks are random access so that long
/// contexts can be split across threads (split-KV).
template <class C>
concept kv_readable = requires(const C& c, seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) {
  typename C::storage_type;
  { c.shape() } -> std::convertible_to<kv_shape>;
  { c.n_tokens(s) } -> std::convertible_to<std::size_t>;  ///< tokens visible to attention
  { c.n_chunks(s) } -> std::convertible_to<std::size_t>;
  { c.chunk(s, layer, kv_head, i) } -> std::same_as<kv_chunk<typename C::storage_type>>;
};

/// What a model writes through. `k` and `v` are `[n_new, n_kv_heads, head_dim]`
/// f32 rows for the tokens at slots [first_token, first_token + n_new) of the
/// sequence, converted to the cache's storage type on the way in.
template <class C>
concept kv_cache = kv_readable<C> && requires(C& c, seq_id s, std::size_t layer, std::size_t first_token,
                                               std::size_t n, std::span<const float> k, std::span<const float> v) {
  { c.grow(s, n) } -> std::same_as<bool>;
  c.store(s, layer, first_token, k, v);
};

/// A cache that records the token ids of the slots it reserves, through
/// `grow(s, [n] tokens)`: `prefix_cache` needs them to publish full blocks by
/// content. Its plain `grow(s, n)` reserves slots of unknown ids instead.
template <class C>
concept token_tracking_cache = kv_cache<C> && requires(C& c, seq_id s, std::span<const token_id> tokens) {
  { c.grow(s, tokens) } -> std::same_as<bool>;
};

/// Reserves slots for the `[n] tokens` that continue s: `grow(s, tokens)`
/// where the cache tracks token ids (so a prefix cache can publish them),
/// `grow(s, n)` otherwise. Models call this rather than `grow(s, n)`.
/// Returns false, with nothing changed, when the cache has no room.
template <kv_cache C>
bool grow_with_tokens(C& c, seq_id s, std::span<const token_id> tokens) {
  if constexpr (token_tracking_cache<C>)
    return c.grow(s, tokens);
  else
    return c.grow(s, tokens.size());
}

/// Rows attention reads for s: the sum of its chunks' n_tokens (layer 0,
/// KV head 0; every layer and head has the same chunking). Equals
/// n_tokens(s) for every cache except `sliding_window_cache`, whose
/// n_tokens(s) counts every position appended (the next token's position)
/// while its chunks hold only the sinks and the window.
template <kv_readable C>
std::size_t n_visible_rows(const C& c, seq_id s) {
  std::size_t rows = 0;
  const std::size_t n = c.n_chunks(s);
  for (std::size_t i = 0; i < n; ++i) rows += c.chunk(s, 0, 0, i).n_tokens;
  return rows;
}

}  // namespace llmkit::kv
