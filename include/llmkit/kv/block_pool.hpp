// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/block_pool.hpp
/// Bookkeeping of a fixed set of KV blocks: a free list and one reference
/// count per block. The pool owns no K/V memory; a paged cache maps block
/// ids to its storage. Allocation is O(1) (LIFO free list: a freed block is
/// reused first, while it is still warm in cache).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::kv {

/// Index of a block in a pool.
using block_id = std::int32_t;

/// Free/used block counts of a pool.
struct block_pool_stats {
  std::size_t n_total = 0;  ///< blocks in the pool
  std::size_t n_free = 0;   ///< blocks on the free list
  std::size_t n_used = 0;   ///< blocks with reference count > 0
  friend constexpr bool operator==(const block_pool_stats&, const block_pool_stats&) = default;
};

/// Free list and reference counts of `n_blocks` blocks.
class block_pool {
 public:
  /// @throws llmkit::error when n_blocks exceeds the block_id range.
  explicit block_pool(std::size_t n_blocks) : refcounts_(n_blocks, 0) {
    LLMKIT_CHECK(n_blocks <= static_cast<std::size_t>(std::numeric_limits<block_id>::max()),
                 "block_pool: n_blocks ", n_blocks, " exceeds the block_id range");
    free_.reserve(n_blocks);
    for (std::size_t b = n_blocks; b-- > 0;) free_.push_back(static_cast<block_id>(b));  // block 0 comes out first
  }

  std::size_t n_total() const noexcept { return refcounts_.size(); }
  std::size_t n_free() const noexcept { return free_.size(); }
  std::size_t n_used() const noexcept { return refcounts_.size() - free_.size(); }
  block_pool_stats stats() const noexcept { return {n_total(), n_free(), n_used()}; }

  /// Takes a free block (reference count 1); nullopt when none is free.
  std::optional<block_id> allocate() noexcept {
    if (free_.empty()) return std::nullopt;
    const block_id b = free_.back();
    free_.pop_back();
    refcounts_[static_cast<std::size_t>(b)] = 1;
    return b;
  }

  /// Adds a reference to a used block. @throws llmkit::error for a bad or free block.
  void retain(block_id b) {
    check_used(b, "block_pool::retain");
    ++refcounts_[static_cast<std::size_t>(b)];
  }

  /// Drops a reference; the block returns to the free list when none is
  /// left. Returns true when it did. @throws llmkit::error for a bad or free block.
  bool release(block_id b) {
    check_used(b, "block_pool::release");
    if (--refcounts_[static_cast<std::size_t>(b)] > 0) return false;
    free_.push_back(b);
    return true;
  }

  /// References held on b (0 when free). @throws llmkit::error when b is out of range.
  std::uint32_t refcount(block_id b) const {
    LLMKIT_CHECK(b >= 0 && static_cast<std::size_t>(b) < refcounts_.size(), "block_pool::refcount: block ", b,
                 " is out of range [0, ", refcounts_.size(), ")");
    return refcounts_[static_cast<std::size_t>(b)];
  }

 private:
  void check_used(block_id b, const char* what) const {
    LLMKIT_CHECK(b >= 0 && static_cast<std::size_t>(b) < refcounts_.size(), what, ": block ", b,
                 " is out of range [0, ", refcounts_.size(), ")");
    LLMKIT_CHECK(refcounts_[static_cast<std::size_t>(b)] > 0, what, ": block ", b, " is free");
  }

  std::vector<std::uint32_t> refcounts_;
  std::vector<block_id> free_;
};

}  // namespace llmkit::kv
