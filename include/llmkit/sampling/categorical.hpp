// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/categorical.hpp
/// Categorical sampler: draws token i with probability softmax(logits)_i by
/// inverting the cumulative distribution at u * Z, u the step's Philox
/// uniform (draw 0 of (seed, request_id, step)), Z = sum exp(logit - max).
/// Exponentials and sums are canonical (detail/kernels.hpp), so a seed gives
/// the same token whatever the batch, thread count or arch (with FMA).
/// Cost: one max (usually cached) and one exp pass over the candidates.

#include <cmath>
#include <cstddef>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/greedy.hpp"

namespace llmkit::sampling {

/// Draws from softmax of the candidates with the request's counter-based RNG.
struct categorical {
  sample_result sample(candidates& c, const sampling_context& ctx) const {
    const float m = detail::checked_max(c, "categorical");
    auto& s = c.scratch();
    const auto v = c.values();
    detail::grow(s.block_sums, detail::n_sum_blocks(v.size()));
    const double total = detail::exp_block_sums(v, m, s.block_sums);
    const double u = ctx.uniform(0);
    const std::size_t i = detail::inverse_cdf(v, m, s.block_sums, u * total);
    return {c.token(i), static_cast<float>(static_cast<double>(v[i] - m) - std::log(total))};
  }
};

}  // namespace llmkit::sampling
