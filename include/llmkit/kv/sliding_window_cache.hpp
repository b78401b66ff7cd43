// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/sliding_window_cache.hpp
/// A KV cache for sliding-window attention (Mistral, Gemma local layers)
/// with attention sinks (StreamingLLM): the first `n_sink` positions are
/// kept forever, later positions live in a ring of `window + slack` rows,
/// so memory per sequence is fixed however long it runs.
///
/// Layout of one sequence (S = n_sink, C = ring capacity, see below):
///
///     [n_layers][2 (K, V)][n_kv_heads][S + C][head_dim] T   rows: sinks, then the ring
///     [n_layers][2 (K, V)][n_kv_heads][S + C] float         (int8 scales)
///
///     position p lives in row  p                  if p < S
///                              S + (p - S) % C    otherwise
///
///     S = 2, window 4, max_rollback 1 -> C = 5. Rows after 10 tokens:
///         row   0   1 | 2   3   4   5   6
///              [p0  p1 | p7  p8  p9  p5  p6 ]   chunks {p0 p1} {p6} {p7 p8 p9}
///     after 12 tokens:
///              [p0  p1 | p7  p8  p9  p10 p11]   chunks {p0 p1} {p8 p9 p10 p11}
///
/// The chunks of a sequence are the sinks and the visible part of the ring
/// (split where it wraps), in position order, each with its true
/// `first_pos`: a kernel masks by position. After a grow of g tokens, the
/// visible ring positions are [T - window - g + 1, T) (T = n_tokens), which
/// is exactly what the g new queries need under a window of `window`: a
/// query at position p sees keys k with p - window < k <= p, plus the sinks.
/// After single-token growth (decode) plain causal attention over the
/// chunks is therefore exact sliding-window attention; multi-token growth
/// (chunked prefill) needs a sliding-window mask.
///
/// Ring capacity C = window + max(max_grow - 1, max_rollback): room for a
/// grow of max_grow tokens, and for truncate to roll back max_rollback
/// tokens (speculative decoding) with every row the next query needs still
/// present.
///
/// With `align` = A > 1 the visible ring starts at a position that is a
/// multiple of A (up to A - 1 rows earlier than needed; the mask hides
/// them) and C is a multiple of A, so with n_sink a multiple of A every
/// chunk boundary is too. Attention kernels group keys into tiles by row
/// from the first visible one: when A is a multiple of their tile, the
/// tiles hold the same positions as in a cache that keeps every row, and
/// the sums run in the same order (a local layer of a model then gives the
/// same bits on this cache as on a full one). C grows by A - 1, rounded up
/// to a multiple of A.
///
/// Unlike the other caches, `n_tokens(s)` counts every position appended
/// (the next token's position), not just the rows attention sees; those are
/// `n_visible(s)`, the sum of the chunks' n_tokens.

#include <algorithm>
#include <array>
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

/// Window, sinks and capacity of a sliding-window cache.
struct sliding_window_options {
  std::size_t window = 0;         ///< W > 0: a query at p sees keys in (p - W, p]
  std::size_t n_sink = 0;         ///< S: the first S positions are always visible
  std::size_t max_grow = 1;       ///< most tokens one grow may add (prefill chunk size), >= 1
  std::size_t max_rollback = 0;   ///< tokens truncate may roll back
  std::size_t max_sequences = 1;  ///< live sequences at once (> 0)
  std::size_t align = 1;          ///< the visible ring starts at a multiple of this position (> 0)
};

/// A ring-buffer KV cache for sliding-window attention with sinks.
/// Satisfies `kv_cache`; see the file comment for the meaning of n_tokens.
template <kv_storage T>
class sliding_window_cache {
 public:
  using storage_type = T;

  /// @throws llmkit::error when a shape field, window, max_grow or max_sequences is 0.
  sliding_window_cache(kv_shape shape, sliding_window_options options)
      : shape_(shape), options_(options), sequences_(options.max_sequences) {
    detail::check_shape("sliding_window_cache", shape);
    LLMKIT_CHECK(options.window > 0, "sliding_window_cache: options.window must be > 0, got ", options.window);
    LLMKIT_CHECK(options.max_grow > 0, "sliding_window_cache: options.max_grow must be > 0, got ", options.max_grow);
    LLMKIT_CHECK(options.max_sequences > 0, "sliding_window_cache: options.max_sequences must be > 0, got ",
                 options.max_sequences);
    LLMKIT_CHECK(options.align > 0, "sliding_window_cache: options.align must be > 0, got ", options.align);
    const std::size_t need = options.window + std::max(options.max_grow - 1, options.max_rollback) + options.align - 1;
    ring_ = (need + options.align - 1) / options.align * options.align;
    LLMKIT_CHECK(options.n_sink + ring_ <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
                 "sliding_window_cache: n_sink + ring capacity ", options.n_sink + ring_, " is too large");
  }

  kv_shape shape() const noexcept { return shape_; }
  const sliding_window_options& options() const noexcept { return options_; }
  /// Rows in the ring: window + max(max_grow - 1, max_rollback) (+ align
  /// - 1, rounded up to a multiple of align).
  std::size_t ring_capacity() const noexcept { return ring_; }
  /// Rows per sequence and (layer, head): n_sink + ring_capacity().
  std::size_t rows_per_sequence() const noexcept { return options_.n_sink + ring_; }
  std::size_t bytes_per_token() const noexcept {
    return kv_bytes_per_token<T>(shape_.n_layers, shape_.n_kv_heads, shape_.head_dim);
  }

  /// Adds an empty sequence and reserves its rows; nullopt when
  /// max_sequences are live.
  std::optional<seq_id> add_sequence() {
    if (sequences_.full()) return std::nullopt;
    sequence seq;
    seq.rows.resize(n_runs() * rows_per_sequence() * shape_.head_dim);
    if constexpr (has_row_scale_v<T>) seq.scales.resize(n_runs() * rows_per_sequence());
    seq.retained_begin = options_.n_sink;
    return sequences_.insert(std::move(seq));
  }

  /// Frees the sequence. @throws llmkit::error for an unknown id.
  void free(seq_id s) {
    sequences_.at(s, "free");
    sequences_.erase(s);
  }

  /// A new sequence with a copy of s's rows; nullopt when max_sequences are live.
  std::optional<seq_id> fork(seq_id s) {
    sequence copy = sequences_.at(s, "fork");
    return sequences_.insert(std::move(copy));
  }

  /// Rolls s back to its first n_tokens positions.
  /// @throws llmkit::error when n_tokens > n_tokens(s), or when rows the
  /// next query would need have already left the ring (more than
  /// max_rollback tokens back).
  void truncate(seq_id s, std::size_t n_tokens) {
    sequence& seq = sequences_.at(s, "truncate");
    LLMKIT_CHECK(n_tokens <= seq.n_tokens, "truncate: n_tokens ", n_tokens, " exceeds the ", seq.n_tokens,
                 " tokens of sequence ", s);
    const std::size_t needed_from = visible_begin(n_tokens, 1);
    LLMKIT_CHECK(n_tokens == seq.n_tokens || seq.retained_begin <= needed_from, "truncate: n_tokens ", n_tokens,
                 " of sequence ", s, " cannot be restored: it needs positions from ", needed_from,
                 " but the ring holds positions from ", seq.retained_begin, " (options.max_rollback = ",
                 options_.max_rollback, ")");
    if (n_tokens < seq.n_tokens) {
      seq.n_tokens = n_tokens;
      seq.last_grow = 1;
    }
  }

  bool contains(seq_id s) const noexcept { return sequences_.contains(s); }
  std::size_t n_sequences() const noexcept { return sequences_.size(); }
  /// Positions appended to s (the next token's position).
  std::size_t n_tokens(seq_id s) const { return sequences_.at(s, "n_tokens").n_tokens; }
  /// Rows attention sees: the sum of the chunks' n_tokens.
  std::size_t n_visible(seq_id s) const {
    std::size_t n = 0;
    for (const part& p : parts(sequences_.at(s, "n_visible"))) n += p.count;
    return n;
  }

  /// Appends n positions (the oldest ring rows are overwritten). Always
  /// true: the ring never runs out.
  /// @throws llmkit::error when n > options.max_grow.
  bool grow(seq_id s, std::size_t n) {
    sequence& seq = sequences_.at(s, "grow");
    LLMKIT_CHECK(n <= options_.max_grow, "grow: n = ", n, " exceeds options.max_grow = ", options_.max_grow,
                 " (grow in chunks, or raise max_grow)");
    LLMKIT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()) - seq.n_tokens, "grow: n = ",
                 n, " overflows the position range of sequence ", s);
    if (n == 0) return true;
    seq.n_tokens += n;
    seq.last_grow = n;
    if (seq.n_tokens > options_.n_sink + ring_) seq.retained_begin = std::max(seq.retained_begin, seq.n_tokens - ring_);
    return true;
  }

  /// Writes `[n_new, n_kv_heads, head_dim] k, v` (f32) for positions
  /// [first_token, first_token + n_new) of layer `layer`.
  /// @throws llmkit::error for an unknown id, a bad layer, sizes that are not
  /// whole rows, positions beyond n_tokens(s) or already out of the ring,
  /// or (int8) non-finite values; nothing is written then.
  void store(seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    sequence& seq = sequences_.at(s, "store");
    const std::size_t n_new =
        detail::check_store(shape_, layer, k, v, has_row_scale_v<T>, s, first_token, seq.n_tokens);
    LLMKIT_CHECK(n_new == 0 || seq.retained_begin == options_.n_sink || first_token >= seq.retained_begin ||
                     first_token + n_new <= options_.n_sink,
                 "store: positions [", first_token, ", ", first_token + n_new, ") of sequence ", s,
                 " are no longer in the ring, which holds positions from ", seq.retained_begin);
    const std::size_t d = shape_.head_dim;
    detail::store_rows<T>(shape_, rows_per_sequence(), layer, first_token, n_new, k.data(), v.data(),
                          [&](std::size_t pos) { return detail::slot_at(seq.rows.data(), seq.scales.data(), slot(pos), d); });
  }

  /// Sinks, then the visible ring (1 or 2 chunks): 0 to 3.
  std::size_t n_chunks(seq_id s) const { return parts(sequences_.at(s, "n_chunks")).size(); }

  /// Chunk i of s for (layer, kv_head), with its true first_pos.
  kv_chunk<T> chunk(seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    const sequence& seq = sequences_.at(s, "chunk");
    const auto ps = parts(seq);
    detail::check_chunk(shape_, layer, kv_head, i, ps.size());
    const part& p = ps[i];
    return detail::run_chunk(seq.rows.data(), seq.scales.data(), shape_, rows_per_sequence(), layer, kv_head, p.row,
                             p.count, p.first_pos);
  }

  /// Memory statistics; token_bytes counts the rows held (sinks + ring
  /// contents), n_tokens every position appended.
  cache_usage usage() const {
    cache_usage u = detail::sequence_usage(sequences_, bytes_per_token(), rows_per_sequence());
    u.bytes_allocated = u.n_sequences * rows_per_sequence() * bytes_per_token();
    u.bytes_in_use = u.bytes_allocated;
    return u;
  }

 private:
  struct sequence {
    std::size_t n_tokens = 0;
    std::size_t last_grow = 1;       // tokens added by the last grow (queries that still need rows)
    std::size_t retained_begin = 0;  // oldest non-sink position still in the ring
    aligned_vector<T> rows;          // [n_layers][2][n_kv_heads][n_sink + ring][head_dim]
    aligned_vector<float> scales;    // [n_layers][2][n_kv_heads][n_sink + ring] (int8 only)
  };
  struct part {
    std::size_t first_pos = 0, row = 0, count = 0;
  };
  struct part_list {
    std::array<part, 3> items{};
    std::size_t n = 0;
    std::size_t size() const noexcept { return n; }
    const part& operator[](std::size_t i) const noexcept { return items[i]; }
    const part* begin() const noexcept { return items.data(); }
    const part* end() const noexcept { return items.data() + n; }
  };

  std::size_t slot(std::size_t pos) const noexcept {
    return pos < options_.n_sink ? pos : options_.n_sink + (pos - options_.n_sink) % ring_;
  }

  part_list parts(const sequence& seq) const noexcept {
    part_list out;
    const std::size_t sinks = std::min(options_.n_sink, seq.n_tokens);
    if (sinks > 0) out.items[out.n++] = {0, 0, sinks};
    const std::size_t begin = visible_begin(seq.n_tokens, seq.last_grow);
    if (begin >= seq.n_tokens) return out;
    LLMKIT_ASSERT(begin >= seq.retained_begin);
    const std::size_t row = slot(begin), count = seq.n_tokens - begin;
    const std::size_t end_row = options_.n_sink + ring_;
    if (row + count <= end_row) {
      out.items[out.n++] = {begin, row, count};
    } else {
      const std::size_t first = end_row - row;
      out.items[out.n++] = {begin, row, first};
      out.items[out.n++] = {begin + first, options_.n_sink, count - first};
    }
    return out;
  }

  // First ring position the last `grow` queries of n_tokens need: their
  // window back from the first of them, aligned down.
  std::size_t visible_begin(std::size_t n_tokens, std::size_t grow) const noexcept {
    const std::size_t reach = options_.window + grow - 1;
    const std::size_t begin = n_tokens > reach ? n_tokens - reach : 0;
    return std::max(options_.n_sink, begin / options_.align * options_.align);
  }

  std::size_t n_runs() const noexcept { return detail::n_runs(shape_); }

  kv_shape shape_;
  sliding_window_options options_;
  std::size_t ring_ = 0;
  detail::sequence_table<sequence> sequences_;
};

}  // namespace llmkit::kv
