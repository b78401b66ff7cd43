// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/top_p.hpp
/// Top-p (nucleus): with p_i = softmax(logits)_i and the tokens in the order
/// (p descending, token ascending), keeps the shortest prefix whose summed
/// probability reaches p. p must be in (0, 1]; p = 1 keeps everything. On a
/// sorted sparse set this is a prefix scan; otherwise a radix select on the
/// logits weighted by exp(logit - max) (detail/select.hpp), no sort.

#include <cstddef>
#include <span>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/detail/select.hpp"

namespace llmkit::sampling {

/// Keeps the smallest set of most probable tokens with mass >= `p_`.
struct top_p {
  float p_ = 1.0f;

  /// @throws llmkit::error unless 0 < p <= 1.
  void validate() const { LLMKIT_CHECK(p_ > 0.0f && p_ <= 1.0f, "top_p: p must be in (0, 1], got ", p_); }

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
    if (c.is_sorted()) {
      const double goal = static_cast<double>(p_) * total;
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
      return;
    }
    const detail::top_p_score score;
    auto token = [&](std::size_t i) { return c.token(i); };
    auto sel = detail::mass_select(values, {s.weights.data(), n}, token, score, p_, total, s);
    if (!sel) {
      detail::grow(s.keys, n);
      detail::descending_keys(values, {s.keys.data(), n});
      sel = detail::weighted_select({s.keys.data(), n}, {s.weights.data(), n}, token, p_, true, s);
    }
    if (sel->keep_all_) return;
    // Keep v >= v_K (vectorised), then drop the boundary ties past the cutoff token, if any.
    const float v_k = detail::value_of_descending_key(sel->key_);
    c.retain_values([v_k](const auto& x) { return x >= decltype(x)(v_k); }, [v_k](float x) { return x >= v_k; },
                    sel->n_keep_);
    if (sel->partial_ties_) detail::trim_ties(c, v_k, sel->tie_cutoff_, sel->n_keep_);
  }
};

}  // namespace llmkit::sampling
