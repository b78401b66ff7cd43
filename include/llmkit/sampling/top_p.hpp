// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/top_p.hpp
/// Top-p (nucleus): with p_i = softmax(logits)_i and the tokens in the order
/// (p descending, token ascending), keeps the shortest prefix whose summed
/// probability reaches p. p must be in (0, 1]; p = 1 keeps everything. On a
/// sorted sparse set this is a prefix scan; otherwise the sorting-free mass
/// selection of detail/mass_select.hpp with score -logit.

#include <cstddef>
#include <span>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/detail/mass_select.hpp"
#include "llmkit/simd/arch.hpp"

namespace llmkit::sampling {

/// Keeps the smallest set of most probable tokens with mass >= `p`.
struct top_p {
  float p = 1.0f;

  /// @throws llmkit::error unless 0 < p <= 1.
  void validate() const { LLMKIT_CHECK(p > 0.0f && p <= 1.0f, "top_p: p must be in (0, 1], got ", p); }

  /// Truncates `c` in place. `Arch` picks the kernels (simd::scalar always
  /// takes the radix select).
  template <class Arch = simd::default_arch>
  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (p == 1.0f || c.size() == 1) return;
    if (!c.is_sorted()) {
      detail::truncate_by_mass<Arch>(c, detail::top_p_score{}, p);
      return;
    }
    // Sorted sparse set (after top-k): a prefix scan.
    auto& s = c.scratch();
    const auto values = c.values();
    const std::size_t n = values.size();
    detail::grow(s.weights, n);
    detail::grow(s.block_sums, detail::n_sum_blocks(n));
    const double total = detail::exp_block_sums<Arch>(values, c.max(), s.block_sums, {s.weights.data(), n});
    const double goal = static_cast<double>(p) * total;
    double cum = 0.0;
    std::size_t keep = n;
    for (std::size_t i = 0; i < n; ++i) {
      cum += s.weights[i];
      if (cum >= goal) {
        keep = i + 1;
        break;
      }
    }
    c.retain([keep](std::size_t i) { return i < keep; }, keep);
  }
};

}  // namespace llmkit::sampling
