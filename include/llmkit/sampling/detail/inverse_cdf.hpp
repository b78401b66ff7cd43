// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/inverse_cdf.hpp
/// The inverse-CDF walk shared by the categorical sampler (float weights
/// recomputed from logits) and the search strategies (double weights).

#include <cstddef>

namespace llmkit::sampling::detail {

/// Adds `weight(i)` for i in [begin, end), in order, to `cum` (in double),
/// skipping weights <= 0, and returns the first i at which cum > target.
/// When rounding leaves target at or beyond the sum, returns the last
/// positive entry (begin when there is none).
/// `weight(std::size_t i) -> float or double`.
template <class Weight>
std::size_t inverse_cdf_scan(std::size_t begin, std::size_t end, double cum, double target, Weight&& weight) {
  std::size_t last_positive = begin;
  for (std::size_t i = begin; i < end; ++i) {
    const auto w = weight(i);
    if (w <= 0) continue;
    last_positive = i;
    cum += w;
    if (cum > target) return i;
  }
  return last_positive;
}

}  // namespace llmkit::sampling::detail
