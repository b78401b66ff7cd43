// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/first_fit.hpp
/// First-fit bin packing: each item goes into the lowest-numbered bin with
/// room for it, a new bin when none has. `first_fit_decreasing` places the
/// items largest first (at most 11/9 OPT + 6/9 bins); `online_first_fit`
/// places them in input order, and `first_fit_bins` is the same as an
/// incremental object for items that arrive one at a time. O(log n_bins) per
/// item through a tree of the bins' remaining room.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <functional>
#include <numeric>
#include <ranges>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/detail/capacity_tree.hpp"
#include "llmkit/pack/detail/prepare.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// Incremental (online) first-fit over bins of a fixed capacity.
class first_fit_bins {
 public:
  /// @param capacity room of every bin, > 0.
  explicit first_fit_bins(std::size_t capacity) : tree_(check_capacity(capacity)) {}

  /// Places an item of `size` (<= capacity) and returns its bin.
  std::size_t add(std::size_t size) {
    LLMKIT_CHECK(size <= tree_.capacity(), "first_fit_bins::add: size ", size, " > capacity ", tree_.capacity());
    return tree_.place(size);
  }
  /// Bins opened so far.
  std::size_t n_bins() const noexcept { return tree_.n_bins(); }
  /// Room left in bin b.
  std::size_t room(std::size_t b) const {
    LLMKIT_CHECK(b < n_bins(), "first_fit_bins::room: b = ", b, " is out of range [0, ", n_bins(), ")");
    return tree_.room(b);
  }
  std::size_t capacity() const noexcept { return tree_.capacity(); }

 private:
  static std::size_t check_capacity(std::size_t capacity) {
    LLMKIT_CHECK(capacity > 0, "first_fit_bins: capacity must be > 0, got ", capacity);
    return capacity;
  }
  detail::capacity_tree<std::size_t> tree_;
};

namespace detail {
/// First-fit over `[n] sizes` (in placement order, each <= capacity); writes
/// `[n] bins` (bin of each) and returns the number of bins.
template <class Room>
std::size_t first_fit_engine(std::span<const std::size_t> sizes, std::size_t capacity, std::span<std::size_t> bins) {
  // Start the tree near the bins first-fit will need (a little over the lower bound).
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  capacity = std::max<std::size_t>(capacity, 1);
  capacity_tree<Room> tree(capacity, total / capacity + total / capacity / 16 + 64);
  // Runs of equal sizes (long in decreasing order) reuse the previous bin
  // while it has room: it is still the leftmost fit, so no descent is needed.
  std::size_t last_size = 0, last_bin = 0;
  bool have_last = false;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t s = sizes[k];
    if (have_last && s == last_size && tree.room(last_bin) >= s) {
      tree.place_at(last_bin, s);
    } else {
      last_bin = tree.place(s);
      last_size = s;
      have_last = true;
    }
    bins[k] = last_bin;
  }
  return tree.n_bins();
}

/// First-fit placement of `[n] sizes` in that order into `[n] bins`;
/// returns the number of bins (`run_packer`'s `place`).
inline std::size_t first_fit_place(std::span<const std::size_t> sizes, std::size_t capacity,
                                   std::span<std::size_t> bins) {
  return capacity <= UINT32_MAX ? first_fit_engine<std::uint32_t>(sizes, capacity, bins)
                                : first_fit_engine<std::size_t>(sizes, capacity, bins);
}
}  // namespace detail

/// First-fit decreasing.
/// @param items any sized forward range; `proj(item)` gives its size (an integer >= 0).
/// @param options capacity (0 = the largest item) and chunking of oversized items.
/// @return bins of pieces; each bin's pieces in placement order (largest first).
/// @throws llmkit::error for a negative size, or an item larger than the
///   capacity when `split_oversized` is false.
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing first_fit_decreasing(R&& items, const pack_options& options = {}, Proj proj = {}) {
  return detail::run_packer(items, options, proj, "first_fit_decreasing", detail::placement::decreasing,
                            detail::first_fit_place);
}

/// First-fit in input order (the online algorithm, run over a whole range).
/// Same parameters and errors as `first_fit_decreasing`.
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing online_first_fit(R&& items, const pack_options& options = {}, Proj proj = {}) {
  return detail::run_packer(items, options, proj, "online_first_fit", detail::placement::input_order,
                            detail::first_fit_place);
}

}  // namespace llmkit::pack
