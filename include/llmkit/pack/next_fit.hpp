// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/next_fit.hpp
/// Next-fit bin packing: one open bin; an item that does not fit closes it
/// and opens the next. O(n), at most 2 OPT bins; keeps the input order
/// inside and across bins (bin b's items all come before bin b + 1's).

#include <cstddef>
#include <functional>
#include <numeric>
#include <ranges>
#include <vector>

#include "llmkit/pack/detail/prepare.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// Next-fit in input order. Same parameters and errors as `first_fit_decreasing`.
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing next_fit(R&& items, const pack_options& options = {}, Proj proj = {}) {
  auto prepared = detail::prepare(detail::item_sizes(items, proj, "next_fit"), options, "next_fit");
  const auto placed = detail::input_order(prepared.sizes);
  const std::size_t n = placed.sizes.size();
  std::vector<std::size_t> bins(n);
  std::size_t n_bins = 0, room = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t s = placed.sizes[i];
    if (n_bins == 0 || s > room) {
      ++n_bins;
      room = prepared.capacity;
    }
    room -= s;
    bins[i] = n_bins - 1;
  }
  return detail::assemble(std::move(prepared), placed, bins, n_bins);
}

}  // namespace llmkit::pack
