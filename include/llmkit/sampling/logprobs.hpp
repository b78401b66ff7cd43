// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/logprobs.hpp
/// The n most probable alternatives of a processed row and their
/// log-probabilities (what OpenAI-style `top_logprobs` returns), without a
/// full sort (detail/select.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/detail/select.hpp"
#include "llmkit/sampling/greedy.hpp"

namespace llmkit::sampling {

/// A token and its log-probability: the pair a sampler returns
/// (concepts.hpp), here one of the alternatives listed beside it.
using token_logprob = sample_result;

/// Writes the min(out.size(), candidates) most probable tokens, most probable
/// first (token ascending on ties), to `[n] out`; returns how many. Tokens of
/// probability 0 (logit -inf) are not listed. Does not change the
/// distribution (only the scratch buffers of `c`).
inline std::size_t top_logprobs(candidates& c, std::span<token_logprob> out) {
  const float m = detail::checked_max(c, "top_logprobs");
  const double log_z = detail::log_normaliser(c, m);
  const std::size_t k = std::min(out.size(), c.size());
  if (k == 0) return 0;
  const auto index = detail::top_k_indices(c, k);
  const auto v = c.values();
  std::size_t w = 0;
  for (std::size_t j = 0; j < k; ++j) {
    if (v[index[j]] == -std::numeric_limits<float>::infinity()) break;
    out[w++] = {c.token(index[j]), static_cast<float>(static_cast<double>(v[index[j]] - m) - log_z)};
  }
  return w;
}

}  // namespace llmkit::sampling
