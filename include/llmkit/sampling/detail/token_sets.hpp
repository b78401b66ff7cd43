// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/token_sets.hpp
/// Helpers of the history-based processors: sorting token lists in place,
/// range checks, and banning.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/sampling/candidates.hpp"

namespace llmkit::sampling::detail {

/// Throws unless every token is in [0, vocab); `who` names the processor.
inline void check_tokens(std::span<const std::int32_t> tokens, std::size_t vocab, const char* who, const char* what) {
  for (std::int32_t t : tokens)
    LLMKIT_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, who, ": ", what, " token ", t,
                 " is out of range [0, ", vocab, ")");
}

/// Sorts `[n] tokens` and removes duplicates; returns the unique prefix.
inline std::span<std::int32_t> sort_unique(std::span<std::int32_t> tokens) {
  std::sort(tokens.begin(), tokens.end());
  return tokens.first(static_cast<std::size_t>(std::unique(tokens.begin(), tokens.end()) - tokens.begin()));
}

/// Sets the logit of every token of `[n] tokens` (any order, duplicates
/// allowed, each in range) to -inf.
inline void ban(candidates& c, std::span<std::int32_t> tokens) {
  if (tokens.empty()) return;
  const auto unique = sort_unique(tokens);
  auto values = c.values();
  c.for_tokens(unique, [&](std::size_t i, std::size_t) { values[i] = -std::numeric_limits<float>::infinity(); });
  c.values_changed();
}

}  // namespace llmkit::sampling::detail
