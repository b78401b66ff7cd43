// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/logit_bias.hpp
/// Logit bias: logit_t <- logit_t + bias_t for listed tokens (a bias of -inf
/// bans the token).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/token_sets.hpp"

namespace llmkit::sampling {

/// Adds a per-token bias.
class logit_bias {
 public:
  logit_bias() = default;
  /// `[m] (token, bias)` pairs; a token listed twice has its biases added.
  /// @throws llmkit::error for a negative token or a NaN bias.
  explicit logit_bias(std::vector<std::pair<token_id, float>> biases) {
    for (const auto& [t, b] : biases) {
      LLMKIT_CHECK(t >= 0, "logit_bias: token must be >= 0, got ", t);
      LLMKIT_CHECK(b == b, "logit_bias: bias of token ", t, " is NaN");
    }
    std::sort(biases.begin(), biases.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [t, b] : biases) {
      if (!tokens_.empty() && tokens_.back() == t) {
        biases_.back() += b;
      } else {
        tokens_.push_back(t);
        biases_.push_back(b);
      }
    }
  }

  void apply(candidates& c, const sampling_context&) const {
    if (tokens_.empty()) return;
    detail::check_tokens(tokens_, c.vocab_size(), "logit_bias", "biased");
    auto values = c.values();
    c.for_tokens(tokens_, [&](std::size_t i, std::size_t r) { values[i] += biases_[r]; });
    c.values_changed();
  }

  /// `[m]` distinct biased tokens, ascending, and their biases.
  const std::vector<token_id>& tokens() const noexcept { return tokens_; }
  const std::vector<float>& biases() const noexcept { return biases_; }

 private:
  std::vector<token_id> tokens_;
  std::vector<float> biases_;
};

}  // namespace llmkit::sampling
