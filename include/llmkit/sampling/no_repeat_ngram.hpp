// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/no_repeat_ngram.hpp
/// No-repeat n-gram (Hugging Face's no_repeat_ngram_size): bans every token
/// that would complete an n-gram already present in the history (prompt
/// included). n = 1 bans every token seen; n = 0 disables it.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/token_sets.hpp"

namespace llmkit::sampling {

/// Bans tokens completing a repeated `n`-gram.
struct no_repeat_ngram {
  std::int64_t n = 0;

  /// @throws llmkit::error if n < 0.
  void validate() const { LLMKIT_CHECK(n >= 0, "no_repeat_ngram: n must be >= 0, got ", n); }

  void apply(candidates& c, const sampling_context& ctx) const {
    validate();
    const auto h = ctx.history;
    if (n == 0 || h.size() < static_cast<std::size_t>(n)) return;
    const std::size_t order = static_cast<std::size_t>(n), len = h.size();
    auto& s = c.scratch();
    detail::grow(s.tokens, len);
    std::size_t n_banned = 0;
    // The current (n-1)-token suffix, compared with every earlier window.
    const auto suffix = h.last(order - 1);
    for (std::size_t j = 0; j + order <= len; ++j)
      if (std::equal(suffix.begin(), suffix.end(), h.begin() + static_cast<std::ptrdiff_t>(j)))
        s.tokens[n_banned++] = h[j + order - 1];
    detail::check_tokens({s.tokens.data(), n_banned}, c.vocab_size(), "no_repeat_ngram", "history");
    detail::ban(c, {s.tokens.data(), n_banned});
  }
};

}  // namespace llmkit::sampling
