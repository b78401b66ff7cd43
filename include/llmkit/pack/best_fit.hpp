// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/best_fit.hpp
/// Best-fit decreasing: items largest first, each into the bin it fills
/// most tightly (least room left that still fits; among equals the
/// lowest-numbered), a new bin when none fits. At most 11/9 OPT + 6/9 bins.
///
/// O(n log n): bins are bucketed by their remaining room, with a successor
/// set over the room values (O(log_64 capacity) per query) and a min-heap of
/// bin numbers per bucket; when the capacity is huge next to the item count,
/// an ordered set of (room, bin) pairs replaces the buckets.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <ranges>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "llmkit/pack/detail/prepare.hpp"
#include "llmkit/pack/detail/successor_set.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {
namespace detail {

/// Best-fit over `[n] sizes` (in placement order, each <= capacity), rooms
/// bucketed by value; writes `[n] bins` (bin of each) and returns the number of bins.
inline std::size_t best_fit_buckets(std::span<const std::size_t> sizes, std::size_t capacity,
                                    std::span<std::size_t> bins) {
  successor_set nonempty(capacity + 1);
  std::vector<std::vector<std::size_t>> bucket(capacity + 1);  // min-heaps of bin numbers
  const auto later = std::greater<std::size_t>{};
  std::size_t n_bins = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t s = sizes[k];
    std::size_t bin = 0, room = 0;
    if (const auto r = nonempty.successor(s)) {
      room = *r;
      auto& heap = bucket[room];
      std::pop_heap(heap.begin(), heap.end(), later);
      bin = heap.back();
      heap.pop_back();
      if (heap.empty()) nonempty.erase(room);
    } else {
      bin = n_bins++;
      room = capacity;
    }
    bins[k] = bin;
    auto& heap = bucket[room - s];
    heap.push_back(bin);
    std::push_heap(heap.begin(), heap.end(), later);
    nonempty.insert(room - s);
  }
  return n_bins;
}

/// Best-fit with an ordered set of (room, bin), for any capacity; same
/// arguments and result as `best_fit_buckets`.
inline std::size_t best_fit_ordered(std::span<const std::size_t> sizes, std::size_t capacity,
                                    std::span<std::size_t> bins) {
  std::set<std::pair<std::size_t, std::size_t>> open_bins;  // (room, bin)
  std::size_t n_bins = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t s = sizes[k];
    std::size_t bin = 0, room = 0;
    if (auto it = open_bins.lower_bound({s, 0}); it != open_bins.end()) {
      std::tie(room, bin) = *it;
      open_bins.erase(it);
    } else {
      bin = n_bins++;
      room = capacity;
    }
    bins[k] = bin;
    open_bins.emplace(room - s, bin);
  }
  return n_bins;
}

}  // namespace detail

/// Best-fit decreasing. Same parameters and errors as `first_fit_decreasing`;
/// each bin's pieces are in placement order (largest first).
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing best_fit_decreasing(R&& items, const pack_options& options = {}, Proj proj = {}) {
  return detail::run_packer(items, options, proj, "best_fit_decreasing", detail::placement::decreasing,
                            [](std::span<const std::size_t> sizes, std::size_t capacity, std::span<std::size_t> bins) {
                              const bool small_capacity = capacity <= 8 * sizes.size() + 65536;
                              return small_capacity ? detail::best_fit_buckets(sizes, capacity, bins)
                                                    : detail::best_fit_ordered(sizes, capacity, bins);
                            });
}

}  // namespace llmkit::pack
