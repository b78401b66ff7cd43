// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/penalties.hpp
/// Repetition, frequency and presence penalties over the last `last_n`
/// tokens of the history (prompt included; -1 = the whole history, 0 =
/// disabled). For each distinct token t of that window, seen count_t times:
///   logit_t <- logit_t > 0 ? logit_t / repeat : logit_t * repeat
///   logit_t <- logit_t - count_t * frequency - presence
/// (the repetition penalty of Keskar et al. 2019 as in llama.cpp and Hugging
/// Face, then OpenAI's frequency/presence terms).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/token_sets.hpp"

namespace llmkit::sampling {

/// The three penalties over a window of the history.
struct penalties {
  float repeat = 1.0f;     ///< repetition penalty, > 0 (1 = none)
  float frequency = 0.0f;  ///< subtracted once per occurrence
  float presence = 0.0f;   ///< subtracted once per distinct token
  std::int64_t last_n = 64;

  /// @throws llmkit::error unless repeat > 0, last_n >= -1, and the terms are numbers.
  void validate() const {
    LLMKIT_CHECK(repeat > 0.0f, "penalties: repeat must be > 0, got ", repeat);
    LLMKIT_CHECK(last_n >= -1, "penalties: last_n must be >= -1, got ", last_n);
    LLMKIT_CHECK(frequency == frequency && presence == presence, "penalties: frequency/presence is NaN");
  }

  void apply(candidates& c, const sampling_context& ctx) const {
    validate();
    if (last_n == 0 || ctx.history.empty()) return;
    if (repeat == 1.0f && frequency == 0.0f && presence == 0.0f) return;
    const std::size_t window = last_n < 0 ? ctx.history.size()
                                           : std::min(ctx.history.size(), static_cast<std::size_t>(last_n));
    const auto recent = ctx.history.last(window);
    detail::check_tokens(recent, c.vocab_size(), "penalties", "history");
    auto& s = c.scratch();
    detail::grow(s.tokens, window);
    detail::grow(s.tokens2, window);
    detail::grow(s.counts, window);
    std::copy(recent.begin(), recent.end(), s.tokens.begin());
    std::sort(s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(window));
    std::size_t n_unique = 0;
    for (std::size_t i = 0; i < window; ++i) {
      if (n_unique > 0 && s.tokens2[n_unique - 1] == s.tokens[i]) {
        ++s.counts[n_unique - 1];
      } else {
        s.tokens2[n_unique] = s.tokens[i];
        s.counts[n_unique] = 1;
        ++n_unique;
      }
    }
    auto values = c.values();
    c.for_tokens({s.tokens2.data(), n_unique}, [&](std::size_t i, std::size_t r) {
      float x = values[i];
      x = x > 0.0f ? x / repeat : x * repeat;
      values[i] = x - static_cast<float>(s.counts[r]) * frequency - presence;
    });
    c.values_changed();
  }
};

}  // namespace llmkit::sampling
