// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/mask.hpp
/// Attention mask policies. A mask is a small value type that answers two
/// questions about token *positions* of one sequence (a query at position
/// `q_pos` and a key at position `k_pos`):
///
/// - `visible(q_pos, k_pos)`: may the query attend to the key?
/// - `classify(q_first, q_last, k_first, k_last)`: for every query position
///   in [q_first, q_last] and key position in [k_first, k_last] (inclusive),
///   are all pairs visible (`tile_visibility::full`), all hidden
///   (`tile_visibility::hidden`) or mixed (`tile_visibility::partial`)?
///
/// Kernels skip hidden tiles and drop the per-element test in full ones, so
/// `classify` must be conservative: answer `full` or `hidden` only when it
/// holds for every pair (`partial` is always a correct answer). No dense
/// n x n mask is ever built.
///
/// Positions are those the cache reports (`kv_chunk::first_pos + row`); the
/// queries of a call are the last positions of their sequence.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::attention {

/// Token position inside a sequence (as stored in kv_chunk::first_pos).
using position = std::int32_t;

/// What a mask says about a rectangle of (query, key) positions.
enum class tile_visibility : std::uint8_t {
  hidden,   ///< no query sees any key: skip the tile
  partial,  ///< mixed: test every element
  full,     ///< every query sees every key: no per-element test
};

/// A mask policy: per-element visibility and a conservative tile classifier.
template <class M>
concept mask_policy = std::copy_constructible<M> && requires(const M& m, position q, position k) {
  { m.visible(q, k) } -> std::convertible_to<bool>;
  { m.classify(q, q, k, k) } -> std::same_as<tile_visibility>;
};

/// No mask: every query sees every key (bidirectional / encoder attention).
struct no_mask {
  constexpr bool visible(position, position) const noexcept { return true; }
  constexpr tile_visibility classify(position, position, position, position) const noexcept {
    return tile_visibility::full;
  }
};

/// Causal: a query sees keys at its own or earlier positions.
struct causal_mask {
  constexpr bool visible(position q, position k) const noexcept { return k <= q; }
  constexpr tile_visibility classify(position q_first, position q_last, position k_first,
                                     position k_last) const noexcept {
    if (k_first > q_last) return tile_visibility::hidden;
    if (k_last <= q_first) return tile_visibility::full;
    return tile_visibility::partial;
  }
};

/// Causal sliding window with attention sinks: a query at q sees key k when
/// k <= q and either q - k < window (the `window` most recent positions,
/// itself included) or k < sinks (the first `sinks` positions are always
/// kept, as in StreamingLLM).
struct sliding_window_mask {
  position window = 1;  ///< >= 1
  position sinks = 0;   ///< >= 0

  /// @pre window >= 1, sinks >= 0
  constexpr sliding_window_mask(position window_size, position n_sinks = 0) : window(window_size), sinks(n_sinks) {
    LLMKIT_CHECK(window_size >= 1, "sliding_window_mask: window must be >= 1, got ", window_size);
    LLMKIT_CHECK(n_sinks >= 0, "sliding_window_mask: sinks must be >= 0, got ", n_sinks);
  }

  constexpr bool visible(position q, position k) const noexcept {
    return k <= q && (static_cast<std::int64_t>(q) - k < window || k < sinks);
  }
  constexpr tile_visibility classify(position q_first, position q_last, position k_first,
                                     position k_last) const noexcept {
    if (k_first > q_last) return tile_visibility::hidden;
    // Every key too old for the earliest query is too old for all of them.
    if (k_first >= sinks && static_cast<std::int64_t>(q_first) - k_last >= window) return tile_visibility::hidden;
    if (k_last <= q_first && (static_cast<std::int64_t>(q_last) - k_first < window || k_last < sinks))
      return tile_visibility::full;
    return tile_visibility::partial;
  }
};

/// Prefix-LM: the first `prefix_length` positions (the prompt) attend to each
/// other bidirectionally; later positions are causal and see the whole
/// prompt. visible(q, k) = k < prefix_length || k <= q.
struct prefix_lm_mask {
  position prefix_length = 0;  ///< >= 0

  constexpr explicit prefix_lm_mask(position prefix) : prefix_length(prefix) {
    LLMKIT_CHECK(prefix >= 0, "prefix_lm_mask: prefix_length must be >= 0, got ", prefix);
  }
  constexpr bool visible(position q, position k) const noexcept { return k < prefix_length || k <= q; }
  constexpr tile_visibility classify(position q_first, position q_last, position k_first,
                                     position k_last) const noexcept {
    if (k_last < prefix_length || k_last <= q_first) return tile_visibility::full;
    if (k_first > q_last && k_first >= prefix_length) return tile_visibility::hidden;
    return tile_visibility::partial;
  }
};

/// Block-diagonal causal mask of a packed (prepacked) row: several segments
/// (prompts) share one sequence's positions back to back, segment s holding
/// positions [cu_seqlens[s], cu_seqlens[s + 1]). A query sees the keys of its
/// own segment at its own or earlier positions. Positions at or beyond
/// cu_seqlens.back() belong to the last segment (its continuation), negative
/// ones to the first.
class packed_causal_mask {
 public:
  /// `[n_segments + 1] cu_seqlens` (cu_seqlens[0] == 0, non-decreasing).
  explicit packed_causal_mask(std::span<const std::int32_t> cu_seqlens) {
    LLMKIT_CHECK(cu_seqlens.size() >= 2, "packed_causal_mask: cu_seqlens must hold n_segments + 1 >= 2 offsets, got ",
                 cu_seqlens.size());
    LLMKIT_CHECK(cu_seqlens[0] == 0, "packed_causal_mask: cu_seqlens[0] must be 0, got ", cu_seqlens[0]);
    for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
      LLMKIT_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1], "packed_causal_mask: cu_seqlens[", i, "] = ", cu_seqlens[i],
                   " is below cu_seqlens[", i - 1, "] = ", cu_seqlens[i - 1]);
    // Only segment starts matter; empty segments have none of their own.
    starts_.reserve(cu_seqlens.size() - 1);
    for (std::size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
      if (cu_seqlens[i + 1] > cu_seqlens[i] || i == 0) starts_.push_back(cu_seqlens[i]);
  }

  /// Builds the mask from one segment id per position (`[n_positions] ids`);
  /// each segment must occupy one contiguous run.
  static packed_causal_mask from_segment_ids(std::span<const std::int32_t> ids) {
    std::vector<std::int32_t> cu{0};
    for (std::size_t i = 1; i < ids.size(); ++i) {
      if (ids[i] == ids[i - 1]) continue;
      for (std::size_t j = 0; j + 1 < cu.size(); ++j)
        LLMKIT_CHECK(ids[static_cast<std::size_t>(cu[j])] != ids[i], "packed_causal_mask: segment id ", ids[i],
                     " at position ", i, " is not contiguous");
      cu.push_back(static_cast<std::int32_t>(i));
    }
    cu.push_back(static_cast<std::int32_t>(ids.size()));
    if (ids.empty()) cu.push_back(0);
    return packed_causal_mask(cu);
  }

  /// First position of the segment holding position p.
  position segment_start(position p) const noexcept {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), p);
    return it == starts_.begin() ? starts_.front() : *(it - 1);
  }
  bool visible(position q, position k) const noexcept { return k <= q && k >= segment_start(q); }
  tile_visibility classify(position q_first, position q_last, position k_first, position k_last) const noexcept {
    if (k_first > q_last) return tile_visibility::hidden;
    if (k_last < segment_start(q_first)) return tile_visibility::hidden;  // older than every query's segment
    if (k_last <= q_first && k_first >= segment_start(q_last)) return tile_visibility::full;
    return tile_visibility::partial;
  }

 private:
  std::vector<position> starts_;
};

/// Tile classifier of a custom mask that knows nothing: always `partial`.
struct classify_partial {
  constexpr tile_visibility operator()(position, position, position, position) const noexcept {
    return tile_visibility::partial;
  }
};

/// A user predicate `bool(position q, position k)` as a mask, with an
/// optional conservative tile classifier (default: every tile partial).
template <class Predicate, class Classifier = classify_partial>
struct custom_mask {
  Predicate predicate;
  Classifier classifier{};

  bool visible(position q, position k) const { return static_cast<bool>(predicate(q, k)); }
  tile_visibility classify(position q_first, position q_last, position k_first, position k_last) const {
    return classifier(q_first, q_last, k_first, k_last);
  }
};

template <class Predicate>
custom_mask(Predicate) -> custom_mask<Predicate>;
template <class Predicate, class Classifier>
custom_mask(Predicate, Classifier) -> custom_mask<Predicate, Classifier>;

static_assert(mask_policy<no_mask> && mask_policy<causal_mask> && mask_policy<sliding_window_mask> &&
              mask_policy<prefix_lm_mask> && mask_policy<packed_causal_mask>);

}  // namespace llmkit::attention
