// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/detail/log_softmax.hpp
/// Double-precision softmax helpers of the search strategies: scores are
/// sums of log-probabilities over many steps, so they are kept in double.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/sampling/detail/inverse_cdf.hpp"

namespace llmkit::search::detail {

/// `[n] out` = log_softmax(`[n] logits`) in double; -inf (and NaN) logits
/// give -inf. @throws llmkit::error when every logit is -inf or NaN, or one is +inf.
inline void log_softmax(std::span<const float> logits, std::span<double> out, const char* who) {
  LLMKIT_ASSERT(out.size() == logits.size());
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) {
    LLMKIT_CHECK(x != std::numeric_limits<float>::infinity(), who, ": a logit is +inf");
    if (x == x) m = std::max(m, static_cast<double>(x));
  }
  LLMKIT_CHECK(m != -std::numeric_limits<double>::infinity(), who, ": every logit is -inf or NaN (vocab ",
               logits.size(), ")");
  double sum = 0.0;
  for (float x : logits)
    if (x == x) sum += std::exp(static_cast<double>(x) - m);
  const double lse = m + std::log(sum);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    out[i] = x == x ? static_cast<double>(x) - lse : -std::numeric_limits<double>::infinity();
  }
}

/// `[n] out` = softmax(`[n] logits`) in double (see log_softmax).
inline void softmax(std::span<const float> logits, std::span<double> out, const char* who) {
  log_softmax(logits, out, who);
  for (double& v : out) v = std::exp(v);
}

/// Index i with cumulative weight sum_{j<=i} w_j > u * total (the inverse
/// CDF), skipping zero weights; `[n] weights`, u in [0, 1).
/// @pre total = sum of weights > 0
inline std::size_t inverse_cdf(std::span<const double> weights, double total, double u) {
  LLMKIT_ASSERT(total > 0.0);
  return sampling::detail::inverse_cdf_scan(0, weights.size(), 0.0, u * total,
                                            [&](std::size_t i) { return weights[i]; });
}

}  // namespace llmkit::search::detail
