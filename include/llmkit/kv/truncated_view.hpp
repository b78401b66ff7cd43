// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/truncated_view.hpp
/// A read-only view of cache sequences cut at a position: view sequence i
/// is sequence `seqs[i]` of the cache with only its rows at positions <=
/// `last[i]`. Attention kernels read it as any cache, so a decode kernel
/// can score a query at an earlier position of a sequence that already
/// holds later tokens (the rows of a speculative verification, each as the
/// one-token decode it stands for).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/kv_view.hpp"

namespace llmkit::kv {

/// See the file comment. Rows of a chunk have consecutive positions from
/// its `first_pos`. Holds the spans and the cache by reference.
template <kv_readable C>
class truncated_view {
 public:
  using storage_type = typename C::storage_type;

  /// `[n] seqs` and `[n] last`: view sequence i (an id in [0, n)) is
  /// `seqs[i]` up to position `last[i]`.
  truncated_view(const C& cache, std::span<const seq_id> seqs, std::span<const std::int32_t> last)
      : cache_(&cache), seqs_(seqs), last_(last) {
    LLMKIT_CHECK(seqs.size() == last.size(), "truncated_view: ", seqs.size(), " sequences but ", last.size(),
                 " last positions");
  }

  kv_shape shape() const { return cache_->shape(); }

  std::size_t n_chunks(seq_id v) const { return cache_->n_chunks(seqs_[index(v)]); }

  kv_chunk<storage_type> chunk(seq_id v, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    kv_chunk<storage_type> c = cache_->chunk(seqs_[index(v)], layer, kv_head, i);
    const std::int64_t visible = std::int64_t{last_[index(v)]} - c.first_pos + 1;
    c.n_tokens = static_cast<std::size_t>(std::clamp<std::int64_t>(visible, 0, static_cast<std::int64_t>(c.n_tokens)));
    return c;
  }

  /// Positions of view sequence v: those of its sequence up to `last[v]`
  /// (the rows visible, except in caches that keep only some of them, such
  /// as sliding_window_cache and hybrid_cache, whose n_tokens counts
  /// positions too; a hybrid cache's layers hold different rows).
  std::size_t n_tokens(seq_id v) const {
    const std::size_t i = index(v);
    return std::min(cache_->n_tokens(seqs_[i]), static_cast<std::size_t>(std::max(last_[i] + 1, 0)));
  }

 private:
  std::size_t index(seq_id v) const {
    LLMKIT_CHECK(v >= 0 && static_cast<std::size_t>(v) < seqs_.size(), "truncated_view: sequence ", v,
                 " is outside the view's ", seqs_.size());
    return static_cast<std::size_t>(v);
  }

  const C* cache_;
  std::span<const seq_id> seqs_;
  std::span<const std::int32_t> last_;
};

}  // namespace llmkit::kv
