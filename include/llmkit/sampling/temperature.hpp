// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/temperature.hpp
/// Temperature: logit_i <- logit_i / T. T <= 0 means greedy: the candidates
/// shrink to the arg-max token (lowest token id on ties), so any sampler
/// after it returns that token.

#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/argmax.hpp"

namespace llmkit::sampling {

/// Divides every logit by `value` (T = 1: no-op; T <= 0: greedy).
struct temperature {
  float value = 1.0f;

  /// @throws llmkit::error if T is NaN.
  void validate() const { LLMKIT_CHECK(value == value, "temperature: T is NaN"); }

  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (value == 1.0f) return;
    if (value <= 0.0f) {
      const float m = c.max();
      const std::size_t best = detail::argmax_lowest_token(c, m);
      const token_id token = c.token(best);
      c.assign_sparse({&token, 1}, {&m, 1}, candidates::order::sorted);
      return;
    }
    const float t = value;
    const float m = c.max();  // before the division: x -> x / t is monotone, so max / t is the new max
    for (float& x : c.values()) x = x / t;
    c.values_changed_monotone(m / t);
  }
};

}  // namespace llmkit::sampling
