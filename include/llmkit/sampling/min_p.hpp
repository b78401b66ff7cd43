// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/min_p.hpp
/// Min-p: keeps the tokens with p_i >= min_p * max_j p_j, that is
/// logit_i - max >= log(min_p): one threshold pass, no exponentials.
/// min_p must be in [0, 1]; 0 disables it.

#include <cmath>
#include <cstddef>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::sampling {

/// Keeps tokens at least `p` times as probable as the most probable one.
struct min_p {
  float p = 0.0f;

  /// @throws llmkit::error unless 0 <= min_p <= 1.
  void validate() const {
    LLMKIT_CHECK(p >= 0.0f && p <= 1.0f, "min_p: min_p must be in [0, 1], got ", p);
  }

  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (p == 0.0f || c.size() == 1) return;
    const float threshold = c.max() + static_cast<float>(std::log(static_cast<double>(p)));
    const auto values = c.values();
    std::size_t n_keep = 0;
    for (float x : values) n_keep += x >= threshold ? 1 : 0;
    if (n_keep == values.size()) return;
    c.retain_values([threshold](const auto& x) { return x >= decltype(x)(threshold); },
                    [threshold](float x) { return x >= threshold; }, n_keep);
  }
};

}  // namespace llmkit::sampling
