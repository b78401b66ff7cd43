// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/greedy.hpp
/// Greedy sampler: the arg-max of the candidates, the lowest token id on ties.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/argmax.hpp"
#include "llmkit/sampling/detail/kernels.hpp"

namespace llmkit::sampling {

namespace detail {
/// Throws when no candidate has a finite logit; returns the maximum.
inline float checked_max(candidates& c, const char* who) {
  const float m = c.max();
  LLMKIT_CHECK(m != -std::numeric_limits<float>::infinity(), who,
               ": every candidate logit is -inf (all tokens were removed), vocab ", c.vocab_size());
  return m;
}
/// log of the softmax normaliser sum_i exp(v_i - m), canonical (see kernels.hpp).
inline double log_normaliser(candidates& c, float m) {
  auto& s = c.scratch();
  grow(s.block_sums, n_sum_blocks(c.size()));
  return std::log(exp_block_sums(c.values(), m, s.block_sums));
}
}  // namespace detail

/// Picks the most probable token (lowest id on ties); deterministic.
struct greedy {
  /// Also compute the log-probability (one exp pass); otherwise logprob = 0.
  bool with_logprob = true;

  sample_result sample(candidates& c, const sampling_context&) const {
    const float m = detail::checked_max(c, "greedy");
    const std::size_t best = detail::argmax_lowest_token(c, m);
    const float logprob = with_logprob ? static_cast<float>(-detail::log_normaliser(c, m)) : 0.0f;
    return {c.token(best), logprob};
  }
};

}  // namespace llmkit::sampling
