// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/typical_p.hpp
/// Locally typical sampling (Meister et al., 2022): with entropy
/// H = -sum p_i log p_i, orders tokens by |-log p_i - H| ascending (token
/// ascending on ties) and keeps the shortest prefix with mass >= p. Since
/// -log p_i - H = c - logit_i with c = sum_j p_j logit_j (the mean logit),
/// the order is the distance of the logit to c: the sorting-free mass
/// selection of detail/mass_select.hpp with score |logit_i - c|, after one
/// fused pass for the exponentials, their sum and c. p in (0, 1]; 1
/// disables it.

#include <cmath>
#include <cstddef>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/detail/mass_select.hpp"
#include "llmkit/simd/arch.hpp"

namespace llmkit::sampling {

/// Keeps the most typical tokens up to mass `p`.
struct typical_p {
  float p = 1.0f;

  /// @throws llmkit::error unless 0 < p <= 1.
  void validate() const { LLMKIT_CHECK(p > 0.0f && p <= 1.0f, "typical_p: p must be in (0, 1], got ", p); }

  /// Truncates `c` in place. `Arch` picks the kernels (simd::scalar always
  /// takes the radix select).
  template <class Arch = simd::default_arch>
  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (p == 1.0f || c.size() == 1) return;
    auto& s = c.scratch();
    const auto values = c.values();
    const std::size_t n = values.size();
    const float m = c.max();
    detail::grow(s.weights, n);
    const auto [total, weighted] = detail::exp_weighted_sums<Arch>(values, m, {s.weights.data(), n});
    const float center = m + static_cast<float>(weighted / total);
    detail::truncate_by_mass<Arch>(c, detail::typical_score{center}, p, {s.weights.data(), n}, total);
  }
};

}  // namespace llmkit::sampling
