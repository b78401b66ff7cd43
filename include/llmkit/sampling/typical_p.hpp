// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/typical_p.hpp
/// Locally typical sampling (Meister et al., 2022): with entropy
/// H = -sum p_i log p_i, orders tokens by |-log p_i - H| ascending (token
/// ascending on ties) and keeps the shortest prefix with mass >= p. Since
/// -log p_i - H = c - logit_i with c = sum_j p_j logit_j (the mean logit),
/// the order is the distance of the logit to c: a radix select on
/// |logit_i - c| weighted by p_i, no sort. p in (0, 1]; 1 disables it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <bit>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/detail/select.hpp"

namespace llmkit::sampling {

/// Keeps the most typical tokens up to mass `p_`.
struct typical_p {
  float p_ = 1.0f;

  /// @throws llmkit::error unless 0 < p <= 1.
  void validate() const { LLMKIT_CHECK(p_ > 0.0f && p_ <= 1.0f, "typical_p: p must be in (0, 1], got ", p_); }

  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (p_ == 1.0f || c.size() == 1) return;
    auto& s = c.scratch();
    const auto values = c.values();
    const std::size_t n = values.size();
    const float m = c.max();
    detail::grow(s.weights, n);
    detail::grow(s.block_sums, detail::n_sum_blocks(n));
    const double total = detail::exp_block_sums(values, m, s.block_sums, {s.weights.data(), n});
    double weighted = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      if (s.weights[i] > 0.0f) weighted += static_cast<double>(s.weights[i]) * static_cast<double>(values[i] - m);
    const float center = m + static_cast<float>(weighted / total);
    const detail::typical_score score{center};
    auto token = [&](std::size_t i) { return c.token(i); };
    auto sel = detail::mass_select(values, {s.weights.data(), n}, token, score, p_, total, s);
    if (!sel) {
      detail::grow(s.keys, n);
      for (std::size_t i = 0; i < n; ++i) s.keys[i] = score.key(values[i]);
      sel = detail::weighted_select({s.keys.data(), n}, {s.weights.data(), n}, token, p_, true, s);
    }
    if (sel->keep_all_) return;
    // Keep |v - center| <= d_K (vectorised), then drop boundary ties past the cutoff token, if any.
    const float d_k = std::bit_cast<float>(sel->key_);
    c.retain_values([score, d_k](const auto& x) { return score(x) <= decltype(x)(d_k); },
                    [score, d_k](float x) { return score(x) <= d_k; }, sel->n_keep_, false);
    if (sel->partial_ties_) {
      const auto kept = c.values();
      const std::int32_t cut = sel->tie_cutoff_;
      c.retain([&](std::size_t i) { return score(kept[i]) < d_k || c.token(i) <= cut; }, sel->n_keep_, false);
    }
  }
};

}  // namespace llmkit::sampling
