// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/contiguous_cache.hpp
/// One dense buffer per sequence, reserved for `max_tokens` tokens when the
/// sequence is added (llama.cpp-style slots).
///
/// Layout of one sequence's buffer (T = storage type):
///
///     [n_layers][2 (K, V)][n_kv_heads][max_tokens][head_dim] T
///     [n_layers][2 (K, V)][n_kv_heads][max_tokens] float        (int8 scales)
///
/// so the keys of one (layer, KV head) are a single run of rows, token after
/// token: decode attention reads them front to back as one stream (and the
/// values as a second stream), which is what the hardware prefetchers want.
/// Every (sequence, layer, head) is therefore exactly one chunk.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/detail/cache_rows.hpp"
#include "llmkit/kv/detail/checks.hpp"
#include "llmkit/kv/detail/sequence_table.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/storage.hpp"

namespace llmkit::kv {

/// Capacity of a contiguous cache.
struct contiguous_cache_options {
  std::size_t max_sequences = 1;  ///< sequences that may be live at once (> 0)
  std::size_t max_tokens = 0;     ///< tokens each sequence may hold (> 0)
};

/// A KV cache with one dense, fully reserved buffer per sequence.
/// Satisfies `kv_cache`. Memory per live sequence:
/// `max_tokens * kv_bytes_per_token<T>(shape)`.
template <kv_storage T>
class contiguous_cache {
 public:
  using storage_type = T;

  /// @throws llmkit::error when a shape field, max_sequences or max_tokens is 0.
  contiguous_cache(kv_shape shape, contiguous_cache_options options)
      : shape_(shape), options_(options), sequences_(options.max_sequences) {
    detail::check_shape("contiguous_cache", shape);
    LLMKIT_CHECK(options.max_sequences > 0, "contiguous_cache: options.max_sequences must be > 0, got ",
                 options.max_sequences);
    LLMKIT_CHECK(options.max_tokens > 0, "contiguous_cache: options.max_tokens must be > 0, got ", options.max_tokens);
    LLMKIT_CHECK(options.max_tokens <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
                 "contiguous_cache: options.max_tokens ", options.max_tokens, " exceeds the int32 position range");
  }

  kv_shape shape() const noexcept { return shape_; }
  std::size_t max_tokens() const noexcept { return options_.max_tokens; }
  std::size_t max_sequences() const noexcept { return options_.max_sequences; }
  /// Bytes one token takes (K + V, all layers and heads, int8 scales).
  std::size_t bytes_per_token() const noexcept {
    return kv_bytes_per_token<T>(shape_.n_layers, shape_.n_kv_heads, shape_.head_dim);
  }

  /// Adds an empty sequence and reserves its buffer; nullopt when
  /// max_sequences are live.
  std::optional<seq_id> add_sequence() {
    if (sequences_.full()) return std::nullopt;
    sequence seq;
    seq.rows.resize(row_elements());
    if constexpr (has_row_scale_v<T>) seq.scales.resize(scale_elements());
    return sequences_.insert(std::move(seq));
  }

  /// Frees the sequence and its buffer. @throws llmkit::error for an unknown id.
  void free(seq_id s) {
    sequences_.at(s, "free");
    sequences_.erase(s);
  }

  /// A new sequence holding a copy of s's tokens (copies n_tokens rows per
  /// layer and head); nullopt when max_sequences are live.
  std::optional<seq_id> fork(seq_id s) {
    const std::size_t n = sequences_.at(s, "fork").n_tokens;
    auto child = add_sequence();
    if (!child) return std::nullopt;
    const sequence& from = sequences_.at(s, "fork");
    sequence& to = sequences_.at(*child, "fork");
    for (std::size_t run = 0; run < n_runs(); ++run) {
      std::copy_n(from.rows.data() + run * run_elements(), n * shape_.head_dim, to.rows.data() + run * run_elements());
      if constexpr (has_row_scale_v<T>)
        std::copy_n(from.scales.data() + run * options_.max_tokens, n, to.scales.data() + run * options_.max_tokens);
    }
    to.n_tokens = n;
    return child;
  }

  /// Rolls s back to its first n_tokens tokens (speculative-decoding
  /// rollback). @throws llmkit::error when n_tokens > n_tokens(s).
  void truncate(seq_id s, std::size_t n_tokens) {
    sequence& seq = sequences_.at(s, "truncate");
    LLMKIT_CHECK(n_tokens <= seq.n_tokens, "truncate: n_tokens ", n_tokens, " exceeds the ", seq.n_tokens,
                 " tokens of sequence ", s);
    seq.n_tokens = n_tokens;
  }

  bool contains(seq_id s) const noexcept { return sequences_.contains(s); }
  std::size_t n_sequences() const noexcept { return sequences_.size(); }

  /// Tokens of s (all visible to attention).
  std::size_t n_tokens(seq_id s) const { return sequences_.at(s, "n_tokens").n_tokens; }

  /// Reserves n more token slots; false (nothing changed) when s would
  /// exceed max_tokens.
  bool grow(seq_id s, std::size_t n) {
    sequence& seq = sequences_.at(s, "grow");
    if (n > options_.max_tokens - seq.n_tokens) return false;
    seq.n_tokens += n;
    return true;
  }

  /// Writes `[n_new, n_kv_heads, head_dim] k, v` (f32) into token slots
  /// [first_token, first_token + n_new) of layer `layer`, converting to T.
  /// @throws llmkit::error for an unknown id, a bad layer, sizes that are
  /// not whole rows, slots beyond n_tokens(s), or (int8) non-finite values;
  /// nothing is written then.
  void store(seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    sequence& seq = sequences_.at(s, "store");
    const std::size_t n_new =
        detail::check_store(shape_, layer, k, v, has_row_scale_v<T>, s, first_token, seq.n_tokens);
    const std::size_t d = shape_.head_dim;
    detail::store_rows<T>(shape_, options_.max_tokens, layer, first_token, n_new, k.data(), v.data(),
                          [&](std::size_t slot) { return detail::slot_at(seq.rows.data(), seq.scales.data(), slot, d); });
  }

  /// 1 when s holds tokens, else 0.
  std::size_t n_chunks(seq_id s) const { return sequences_.at(s, "n_chunks").n_tokens > 0 ? 1 : 0; }

  /// All of s's rows for (layer, kv_head): one chunk, first_pos 0.
  kv_chunk<T> chunk(seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    const sequence& seq = sequences_.at(s, "chunk");
    detail::check_chunk(shape_, layer, kv_head, i, seq.n_tokens > 0 ? 1 : 0);
    return detail::run_chunk(seq.rows.data(), seq.scales.data(), shape_, options_.max_tokens, layer, kv_head, 0,
                             seq.n_tokens, 0);
  }

  /// Memory and sequence statistics.
  cache_usage usage() const {
    cache_usage u = detail::sequence_usage(sequences_, bytes_per_token());
    u.bytes_allocated = u.n_sequences * options_.max_tokens * bytes_per_token();
    u.bytes_in_use = u.bytes_allocated;
    return u;
  }

 private:
  struct sequence {
    std::size_t n_tokens = 0;
    aligned_vector<T> rows;        // [n_layers][2][n_kv_heads][max_tokens][head_dim]
    aligned_vector<float> scales;  // [n_layers][2][n_kv_heads][max_tokens] (int8 only)
  };

  std::size_t n_runs() const noexcept { return detail::n_runs(shape_); }
  std::size_t run_elements() const noexcept { return options_.max_tokens * shape_.head_dim; }
  std::size_t row_elements() const noexcept { return n_runs() * run_elements(); }
  std::size_t scale_elements() const noexcept { return n_runs() * options_.max_tokens; }

  kv_shape shape_;
  contiguous_cache_options options_;
  detail::sequence_table<sequence> sequences_;
};

}  // namespace llmkit::kv
