// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/argmax.hpp
/// The arg-max with llmkit's tie rule (lowest token id), shared by `greedy`
/// and by `temperature` at T <= 0 so both pick the same token.

#include <cstddef>

#include "llmkit/sampling/candidates.hpp"

namespace llmkit::sampling::detail {

/// Entry of c whose logit is `m` (the maximum) with the lowest token id.
/// Dense rows and sorted sets list tokens in ascending order among equal
/// logits, so the first match is the answer there; other sparse sets are
/// scanned to the end.
/// @pre m == c.max()
inline std::size_t argmax_lowest_token(const candidates& c, float m) noexcept {
  const auto v = c.values();
  if (c.is_dense() || c.is_sorted()) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] == m) return i;
    return 0;
  }
  std::size_t best = 0;
  bool found = false;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == m && (!found || c.token(i) < c.token(best))) {
      best = i;
      found = true;
    }
  }
  return best;
}

}  // namespace llmkit::sampling::detail
