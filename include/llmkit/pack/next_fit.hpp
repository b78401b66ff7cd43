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
#include <span>
#include <vector>

#include "llmkit/pack/detail/prepare.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// Next-fit in input order. Same parameters and errors as `first_fit_decreasing`.
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing next_fit(R&& items, const pack_options& options = {}, Proj proj = {}) {
  return detail::run_packer(items, options, proj, "next_fit", detail::placement::input_order,
                            [](std::span<const std::size_t> sizes, std::size_t capacity, std::span<std::size_t> bins) {
                              std::size_t n_bins = 0, room = 0;
                              for (std::size_t i = 0; i < sizes.size(); ++i) {
                                if (n_bins == 0 || sizes[i] > room) {
                                  ++n_bins;
                                  room = capacity;
                                }
                                room -= sizes[i];
                                bins[i] = n_bins - 1;
                              }
                              return n_bins;
                            });
}

}  // namespace llmkit::pack
