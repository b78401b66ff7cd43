// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/detail/capacity_tree.hpp
/// A 16-ary max tree over the remaining room of bins, for first-fit in
/// O(log_16 n_bins) steps per item. Leaves not yet opened hold the full
/// capacity, so "the leftmost bin with room >= size" is also how a new bin is
/// opened; the tree doubles when every leaf is open.
///
/// Why 16-ary: a binary tree makes every placement a chain of ~17 dependent
/// loads for 10^5 bins; with 16 children per node (one cache line of
/// uint32) the chain is 4-5 loads, and each step's 16 comparisons vectorise.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::pack::detail {

/// `Room` is the stored integer type: std::uint32_t halves the memory
/// traffic when the capacity fits in it.
template <class Room = std::size_t>
class capacity_tree {
 public:
  static constexpr std::size_t fanout = 16;

  explicit capacity_tree(std::size_t capacity, std::size_t expected_bins = 64) : capacity_(static_cast<Room>(capacity)) {
    LLMKIT_ASSERT(static_cast<std::size_t>(capacity_) == capacity);
    std::size_t leaves = fanout;
    while (leaves < expected_bins) leaves *= fanout;
    reset(leaves);
  }

  std::size_t n_bins() const noexcept { return n_bins_; }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Room left in bin b (< n_bins()).
  std::size_t room(std::size_t b) const noexcept { return levels_.back()[b]; }

  /// Places `size` (<= capacity) in the leftmost bin with enough room,
  /// opening a new bin when none has; returns the bin.
  std::size_t place(std::size_t size) {
    LLMKIT_ASSERT(size <= static_cast<std::size_t>(capacity_));
    const Room s = static_cast<Room>(size);
    if (first_fit_in(levels_[0].data(), s) == fanout) grow();
    std::size_t index = 0;
    for (const auto& level : levels_) index = index * fanout + first_fit_in(level.data() + index * fanout, s);
    take(index, s);
    return index;
  }

  /// Places `size` in bin b, which the caller knows is the leftmost bin with
  /// room for it (first-fit decreasing: the bin that took the previous item
  /// of the same size, if it still has room: bins only lose room, so nothing
  /// to its left can fit). Skips the descent.
  /// @pre b < n_bins(), room(b) >= size, no bin before b has room >= size.
  void place_at(std::size_t b, std::size_t size) {
    LLMKIT_ASSERT(b < n_bins_ && levels_.back()[b] >= size);
    take(b, static_cast<Room>(size));
  }

 private:
  void take(std::size_t index, Room s) {
    auto& leaves = levels_.back();
    leaves[index] -= s;
    if (index >= n_bins_) n_bins_ = index + 1;
    // Refresh the maxima above while they change.
    std::size_t child = index;
    for (std::size_t l = levels_.size() - 1; l > 0; --l) {
      const std::size_t group = child / fanout;
      const Room m = max_of(levels_[l].data() + group * fanout);
      Room& parent = levels_[l - 1][group];
      if (parent == m) break;
      parent = m;
      child = group;
    }
  }

  /// Index of the first of 16 values >= s, or 16.
  static std::size_t first_fit_in(const Room* values, Room s) noexcept {
    std::uint32_t mask = 0;
    for (std::size_t j = 0; j < fanout; ++j) mask |= static_cast<std::uint32_t>(values[j] >= s) << j;
    return mask == 0 ? fanout : static_cast<std::size_t>(__builtin_ctz(mask));
  }
  static Room max_of(const Room* values) noexcept {
    Room m = values[0];
    for (std::size_t j = 1; j < fanout; ++j) m = std::max(m, values[j]);
    return m;
  }

  // levels_[0] is the root group (16 entries), levels_.back() the leaves.
  void reset(std::size_t n_leaves) {
    std::vector<Room> old;
    if (!levels_.empty()) old.assign(levels_.back().begin(), levels_.back().begin() + static_cast<std::ptrdiff_t>(n_bins_));
    std::vector<std::size_t> sizes;
    for (std::size_t n = n_leaves; n >= fanout; n /= fanout) sizes.push_back(n);
    std::reverse(sizes.begin(), sizes.end());
    levels_.assign(sizes.size(), {});
    for (std::size_t l = 0; l < sizes.size(); ++l) levels_[l].assign(sizes[l], capacity_);
    std::copy(old.begin(), old.end(), levels_.back().begin());
    for (std::size_t l = levels_.size() - 1; l > 0; --l)
      for (std::size_t g = 0; g < levels_[l - 1].size(); ++g) levels_[l - 1][g] = max_of(levels_[l].data() + g * fanout);
  }
  void grow() {
    LLMKIT_ASSERT(n_bins_ == levels_.back().size());
    reset(levels_.back().size() * fanout);
  }

  Room capacity_;
  std::size_t n_bins_ = 0;
  std::vector<std::vector<Room>> levels_;
};

}  // namespace llmkit::pack::detail
