// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/ngram_drafter.hpp
/// Prompt-lookup drafting (no model): find the most recent earlier
/// occurrence of the history's last n tokens (n from `max_ngram` down to
/// `min_ngram`) in the history itself (prompt and generated tokens) and
/// propose the tokens that followed it. Works well when the output copies
/// spans of the input (summaries, code edits, retrieval answers).
/// Deterministic: guesses come with no distribution (q is one-hot).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/search/drafter.hpp"

namespace llmkit::search {

/// Prompt-lookup n-gram drafter; satisfies `drafter`.
struct ngram_drafter {
  std::size_t max_ngram = 3;  ///< longest suffix matched (>= min_ngram)
  std::size_t min_ngram = 1;  ///< shortest suffix matched (>= 1)

  /// @throws llmkit::error when min_ngram is 0 or exceeds max_ngram.
  void validate() const {
    LLMKIT_CHECK(min_ngram >= 1, "ngram_drafter: min_ngram must be >= 1, got ", min_ngram);
    LLMKIT_CHECK(max_ngram >= min_ngram, "ngram_drafter: max_ngram = ", max_ngram, " is below min_ngram = ", min_ngram);
  }

  std::string_view name() const noexcept { return "ngram"; }
  void reset() noexcept {}

  /// Proposes up to r.max_tokens tokens (possibly none).
  void propose(const draft_request& r, draft& out) const {
    validate();
    out.clear();
    const std::span<const token_id> h = r.history;
    const std::size_t len = h.size();
    if (r.max_tokens == 0 || len < 2) return;
    for (std::size_t n = std::min(max_ngram, len - 1); n >= min_ngram; --n) {
      const auto suffix = h.subspan(len - n);
      // Most recent match that ends before the suffix itself: start j with j + n < len.
      for (std::size_t j = len - n; j-- > 0;) {
        if (!std::equal(suffix.begin(), suffix.end(), h.begin() + static_cast<std::ptrdiff_t>(j))) continue;
        const std::size_t from = j + n;
        const std::size_t count = std::min(r.max_tokens, len - from);
        out.tokens.assign(h.begin() + static_cast<std::ptrdiff_t>(from),
                          h.begin() + static_cast<std::ptrdiff_t>(from + count));
        return;
      }
      if (n == 1) break;
    }
  }
};

static_assert(drafter<ngram_drafter>);

}  // namespace llmkit::search
