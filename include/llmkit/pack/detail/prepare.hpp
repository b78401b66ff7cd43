// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/detail/prepare.hpp
/// What every packer shares: reading item sizes through the projection,
/// choosing the capacity, cutting oversized items into chunks, the
/// decreasing order of FFD/BFD, and assembling the flat `packing`.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>
#include <iterator>
#include <utility>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// A range of items whose size `proj(item)` is an integer (tokens, bytes...).
template <class R, class Proj>
concept sized_items = std::ranges::forward_range<R> && std::ranges::sized_range<R> &&
                      std::integral<std::remove_cvref_t<std::invoke_result_t<Proj&, std::ranges::range_reference_t<R>>>>;

namespace detail {

/// Sizes of the items, checked non-negative.
template <class R, class Proj>
std::vector<std::size_t> item_sizes(R&& items, Proj& proj, const char* who) {
  std::vector<std::size_t> sizes;
  sizes.reserve(std::ranges::size(items));
  std::size_t i = 0;
  for (auto&& item : items) {
    const auto s = std::invoke(proj, item);
    if constexpr (std::is_signed_v<decltype(s)>)
      LLMKIT_CHECK(s >= 0, who, ": item ", i, " has negative size ", s);
    sizes.push_back(static_cast<std::size_t>(s));
    ++i;
  }
  return sizes;
}

/// Items cut to fit: bins reserved for whole-capacity chunks, and the pieces
/// left for the packer.
struct prepared_items {
  std::size_t capacity = 0;
  std::size_t n_items = 0;
  std::vector<piece> dedicated;    ///< each alone in its own bin, placed first
  std::vector<std::size_t> sizes;  ///< [n_packable] size of each packable piece (<= capacity)
  /// True when nothing was cut: packable piece i is {i, 0, sizes[i]} and
  /// `packable` stays empty (saves a pass and a random gather on 10^6 items).
  bool whole = true;
  std::vector<piece> packable;     ///< [n_packable] the pieces, when !whole

  piece packable_piece(std::size_t i) const noexcept { return whole ? piece{i, 0, sizes[i]} : packable[i]; }
};

inline prepared_items prepare(std::vector<std::size_t>&& sizes, const pack_options& options, const char* who) {
  prepared_items out;
  out.n_items = sizes.size();
  out.capacity = options.capacity;
  std::size_t largest = 0;
  for (std::size_t s : sizes) largest = std::max(largest, s);
  if (out.capacity == 0) {
    out.capacity = largest;
    LLMKIT_CHECK(out.capacity > 0 || sizes.empty(), who,
                 ": capacity 0 asks for the largest item's size, but every item has size 0");
  }
  if (largest <= out.capacity) {
    out.sizes = std::move(sizes);
    return out;
  }
  out.whole = false;
  out.packable.reserve(sizes.size());
  out.sizes.reserve(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t s = sizes[i];
    if (s <= out.capacity) {
      out.packable.push_back({i, 0, s});
      out.sizes.push_back(s);
      continue;
    }
    LLMKIT_CHECK(options.split_oversized, who, ": item ", i, " has size ", s, " > capacity ", out.capacity,
                 " (set pack_options::split_oversized to cut it into chunks)");
    std::size_t offset = 0;
    for (; s - offset >= out.capacity; offset += out.capacity) out.dedicated.push_back({i, offset, out.capacity});
    if (offset < s) {
      out.packable.push_back({i, offset, s - offset});
      out.sizes.push_back(s - offset);
    }
  }
  return out;
}

/// A placement order and the sizes in that order.
struct ordered_sizes {
  std::vector<std::size_t> order;  ///< [n] piece placed k-th
  std::vector<std::size_t> sizes;  ///< [n] its size
};

/// Pieces by decreasing size, ties by increasing index (stable). Counting
/// sort when the capacity is small next to the count (the usual case for
/// token budgets; the sorted sizes then come out as runs, without a gather),
/// comparison sort otherwise.
inline ordered_sizes decreasing_order(std::span<const std::size_t> sizes, std::size_t capacity) {
  ordered_sizes out;
  out.order.resize(sizes.size());
  out.sizes.resize(sizes.size());
  if (capacity <= 4 * sizes.size() + 4096) {
    std::vector<std::size_t> start(capacity + 2, 0);
    for (std::size_t s : sizes) ++start[capacity - s + 1];
    for (std::size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    for (std::size_t key = 0; key <= capacity; ++key)
      std::fill(out.sizes.begin() + static_cast<std::ptrdiff_t>(start[key]),
                out.sizes.begin() + static_cast<std::ptrdiff_t>(start[key + 1]), capacity - key);
    for (std::size_t i = 0; i < sizes.size(); ++i) out.order[start[capacity - sizes[i]]++] = i;
  } else {
    for (std::size_t i = 0; i < out.order.size(); ++i) out.order[i] = i;
    std::stable_sort(out.order.begin(), out.order.end(),
                     [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
    for (std::size_t k = 0; k < out.order.size(); ++k) out.sizes[k] = sizes[out.order[k]];
  }
  return out;
}

/// Input order.
inline ordered_sizes input_order(std::span<const std::size_t> sizes) {
  ordered_sizes out;
  out.order.resize(sizes.size());
  for (std::size_t i = 0; i < out.order.size(); ++i) out.order[i] = i;
  out.sizes.assign(sizes.begin(), sizes.end());
  return out;
}

/// Builds the packing: the dedicated bins first, then the packer's bins,
/// each bin's pieces in placement order.
/// `[n_packable] bin_in_order`: bin of the piece placed k-th (`placed.order[k]`).
inline packing assemble(prepared_items&& items, const ordered_sizes& placed, std::span<const std::size_t> bin_in_order,
                        std::size_t n_bins) {
  const std::size_t n_dedicated = items.dedicated.size();
  std::vector<std::size_t> offsets(n_dedicated + n_bins + 1, 0);
  for (std::size_t b = 0; b <= n_dedicated; ++b) offsets[b] = b;
  for (std::size_t b : bin_in_order) ++offsets[n_dedicated + b + 1];
  for (std::size_t b = n_dedicated + 1; b < offsets.size(); ++b) offsets[b] += offsets[b - 1];
  std::vector<piece> pieces(n_dedicated + items.sizes.size());
  std::copy(items.dedicated.begin(), items.dedicated.end(), pieces.begin());
  std::vector<std::size_t> fill(offsets.begin() + static_cast<std::ptrdiff_t>(n_dedicated), offsets.end() - 1);
  if (items.whole) {
    for (std::size_t k = 0; k < placed.order.size(); ++k)
      pieces[fill[bin_in_order[k]]++] = piece{placed.order[k], 0, placed.sizes[k]};
  } else {
    for (std::size_t k = 0; k < placed.order.size(); ++k)
      pieces[fill[bin_in_order[k]]++] = items.packable[placed.order[k]];
  }
  return packing(items.capacity, items.n_items, std::move(pieces), std::move(offsets));
}

/// The order in which a packer places the pieces.
enum class placement : bool { input_order, decreasing };

/// What every packer does around its placement rule (`who`: its name, for
/// the messages): the items' sizes checked and prepared with `options`, put
/// in `order`, placed by `place(sizes, capacity, bins)` (`[n] sizes` in
/// placement order; it fills `[n] bins` and returns the number of bins),
/// and assembled into bins of pieces.
template <class R, class Proj, class Place>
packing run_packer(R&& items, const pack_options& options, Proj& proj, const char* who, placement order,
                   Place&& place) {
  auto prepared = prepare(item_sizes(items, proj, who), options, who);
  const auto placed = order == placement::decreasing ? decreasing_order(prepared.sizes, prepared.capacity)
                                                     : input_order(prepared.sizes);
  std::vector<std::size_t> bins(placed.sizes.size());
  const std::size_t n_bins =
      place(std::span<const std::size_t>(placed.sizes), prepared.capacity, std::span<std::size_t>(bins));
  return assemble(std::move(prepared), placed, bins, n_bins);
}

}  // namespace detail
}  // namespace llmkit::pack
