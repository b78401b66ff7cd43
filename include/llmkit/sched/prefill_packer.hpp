// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/prefill_packer.hpp
/// The hook through which a policy prepacks the prefill pieces of a step
/// into rows of a fixed capacity, and the default packer (first-fit
/// decreasing, what the prepacking paper uses).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::sched {

/// Packs `[n] lengths` (each in [1, capacity]) into rows whose lengths sum to
/// at most `capacity`; returns `[n_rows][...]` indices into `lengths`, each
/// index exactly once. Any bin-packer fits (e.g. from llmkit/pack).
using prefill_packer =
    std::function<std::vector<std::vector<std::size_t>>(std::span<const std::int64_t> lengths, std::int64_t capacity)>;

/// First-fit decreasing: items by decreasing length (ties by index), each
/// into the first row with room. At most 11/9 OPT + 6/9 rows.
/// `[n] lengths` -> `[n_rows][...]` indices.
inline std::vector<std::vector<std::size_t>> first_fit_decreasing(std::span<const std::int64_t> lengths,
                                                                  std::int64_t capacity) {
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<std::size_t>> rows;
  std::vector<std::int64_t> load;
  for (std::size_t i : order) {
    LLMKIT_CHECK(lengths[i] >= 1 && lengths[i] <= capacity, "first_fit_decreasing: lengths[", i, "] = ", lengths[i],
                 " is outside [1, capacity = ", capacity, "]");
    std::size_t r = 0;
    while (r < rows.size() && load[r] + lengths[i] > capacity) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      load.push_back(0);
    }
    rows[r].push_back(i);
    load[r] += lengths[i];
  }
  return rows;
}

}  // namespace llmkit::sched
