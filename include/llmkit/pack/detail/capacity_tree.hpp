// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/detail/capacity_tree.hpp
/// A max segment tree over the remaining room of bins, for first-fit in
/// O(log n_bins) per item. Leaves not yet opened hold the full capacity, so
/// "the leftmost bin with room >= size" is also how a new bin is opened; the
/// tree doubles when every leaf is open.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::pack::detail {

class capacity_tree {
 public:
  explicit capacity_tree(std::size_t capacity, std::size_t expected_bins = 64) : capacity_(capacity) {
    std::size_t leaves = 1;
    while (leaves < expected_bins) leaves *= 2;
    reset(leaves);
  }

  std::size_t n_bins() const noexcept { return n_bins_; }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Room left in bin b (< n_bins()).
  std::size_t room(std::size_t b) const noexcept { return tree_[leaves_ + b]; }

  /// Places `size` (<= capacity) in the leftmost bin with enough room,
  /// opening a new bin when none has; returns the bin.
  std::size_t place(std::size_t size) {
    LLMKIT_ASSERT(size <= capacity_);
    if (tree_[1] < size) grow();
    // Branch-free descent: the comparison picks the child.
    std::size_t node = 1;
    while (node < leaves_) {
      node *= 2;
      node += static_cast<std::size_t>(tree_[node] < size);
    }
    tree_[node] -= size;
    const std::size_t bin = node - leaves_;
    if (bin >= n_bins_) n_bins_ = bin + 1;
    for (node /= 2; node >= 1; node /= 2) {
      const std::size_t m = std::max(tree_[2 * node], tree_[2 * node + 1]);
      if (tree_[node] == m) break;
      tree_[node] = m;
    }
    return bin;
  }

 private:
  void reset(std::size_t leaves) {
    std::vector<std::size_t> old(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_),
                                 tree_.begin() + static_cast<std::ptrdiff_t>(leaves_ + n_bins_));
    leaves_ = leaves;
    tree_.assign(2 * leaves_, capacity_);
    std::copy(old.begin(), old.end(), tree_.begin() + static_cast<std::ptrdiff_t>(leaves_));
    for (std::size_t node = leaves_ - 1; node >= 1; --node) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  void grow() {
    LLMKIT_ASSERT(n_bins_ == leaves_);
    reset(2 * leaves_);
  }

  std::size_t capacity_;
  std::size_t leaves_ = 0;
  std::size_t n_bins_ = 0;
  std::vector<std::size_t> tree_;
};

}  // namespace llmkit::pack::detail
