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
  std::vector<piece> dedicated;  ///< each alone in its own bin, placed first
  std::vector<piece> packable;   ///< every piece has size <= capacity
};

inline prepared_items prepare(const std::vector<std::size_t>& sizes, const pack_options& options, const char* who) {
  prepared_items out;
  out.n_items = sizes.size();
  out.capacity = options.capacity;
  if (out.capacity == 0) {
    for (std::size_t s : sizes) out.capacity = std::max(out.capacity, s);
    LLMKIT_CHECK(out.capacity > 0 || sizes.empty(), who,
                 ": capacity 0 asks for the largest item's size, but every item has size 0");
  }
  out.packable.reserve(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t s = sizes[i];
    if (s <= out.capacity) {
      out.packable.push_back({i, 0, s});
      continue;
    }
    LLMKIT_CHECK(options.split_oversized, who, ": item ", i, " has size ", s, " > capacity ", out.capacity,
                 " (set pack_options::split_oversized to cut it into chunks)");
    std::size_t offset = 0;
    for (; s - offset >= out.capacity; offset += out.capacity) out.dedicated.push_back({i, offset, out.capacity});
    if (offset < s) out.packable.push_back({i, offset, s - offset});
  }
  return out;
}

/// Indices of `pieces` by decreasing size, ties by increasing index (stable).
/// Counting sort when the capacity is small next to the count (the usual case
/// for token budgets), comparison sort otherwise.
inline std::vector<std::size_t> decreasing_order(std::span<const piece> pieces, std::size_t capacity) {
  std::vector<std::size_t> order(pieces.size());
  if (capacity <= 4 * pieces.size() + 4096) {
    std::vector<std::size_t> start(capacity + 2, 0);
    for (const piece& p : pieces) ++start[capacity - p.size + 1];
    for (std::size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    for (std::size_t i = 0; i < pieces.size(); ++i) order[start[capacity - pieces[i].size]++] = i;
  } else {
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return pieces[a].size > pieces[b].size; });
  }
  return order;
}

/// Sizes of the packable pieces in placement order: `[n_packable]`, so the
/// packers' hot loops read and write sequentially.
inline std::vector<std::size_t> sizes_in_order(std::span<const piece> pieces, std::span<const std::size_t> order) {
  std::vector<std::size_t> sizes(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) sizes[k] = pieces[order[k]].size;
  return sizes;
}

/// Builds the packing: the dedicated bins first, then the packer's bins,
/// each bin's pieces in placement order.
/// `[n_packable] placement_order` (piece placed k-th), `[n_packable] bin_in_order`
/// (bin of the piece placed k-th).
inline packing assemble(prepared_items&& items, std::span<const std::size_t> placement_order,
                        std::span<const std::size_t> bin_in_order, std::size_t n_bins) {
  const std::size_t n_dedicated = items.dedicated.size();
  std::vector<std::size_t> offsets(n_dedicated + n_bins + 1, 0);
  for (std::size_t b = 0; b <= n_dedicated; ++b) offsets[b] = b;
  for (std::size_t b : bin_in_order) ++offsets[n_dedicated + b + 1];
  for (std::size_t b = n_dedicated + 1; b < offsets.size(); ++b) offsets[b] += offsets[b - 1];
  std::vector<piece> pieces(n_dedicated + items.packable.size());
  std::copy(items.dedicated.begin(), items.dedicated.end(), pieces.begin());
  std::vector<std::size_t> fill(offsets.begin() + static_cast<std::ptrdiff_t>(n_dedicated), offsets.end() - 1);
  for (std::size_t k = 0; k < placement_order.size(); ++k)
    pieces[fill[bin_in_order[k]]++] = items.packable[placement_order[k]];
  return packing(items.capacity, items.n_items, std::move(pieces), std::move(offsets));
}

}  // namespace detail
}  // namespace llmkit::pack
