// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/banned_sequences.hpp
/// Banned token sequences (Hugging Face's bad_words_ids): for each sequence
/// s of length L, bans s[L-1] when the history ends with s[0, L-1); a
/// one-token sequence is always banned.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/token_sets.hpp"

namespace llmkit::sampling {

/// Prevents any of the listed token sequences from being completed.
class banned_sequences {
 public:
  banned_sequences() = default;
  /// @throws llmkit::error for an empty sequence or a negative token.
  explicit banned_sequences(std::vector<std::vector<token_id>> sequences) : sequences_(std::move(sequences)) {
    for (std::size_t i = 0; i < sequences_.size(); ++i) {
      LLMKIT_CHECK(!sequences_[i].empty(), "banned_sequences: sequence ", i, " is empty");
      for (token_id t : sequences_[i])
        LLMKIT_CHECK(t >= 0, "banned_sequences: sequence ", i, " has negative token ", t);
    }
  }

  void apply(candidates& c, const sampling_context& ctx) const {
    if (sequences_.empty()) return;
    auto& s = c.scratch();
    detail::grow(s.tokens, sequences_.size());
    std::size_t n_banned = 0;
    for (const auto& seq : sequences_) {
      const std::size_t prefix = seq.size() - 1;
      if (prefix > ctx.history.size()) continue;
      if (std::equal(seq.begin(), seq.end() - 1, ctx.history.end() - static_cast<std::ptrdiff_t>(prefix)))
        s.tokens[n_banned++] = seq.back();
    }
    detail::check_tokens({s.tokens.data(), n_banned}, c.vocab_size(), "banned_sequences", "banned");
    detail::ban(c, {s.tokens.data(), n_banned});
  }

  const std::vector<std::vector<token_id>>& sequences() const noexcept { return sequences_; }

 private:
  std::vector<std::vector<token_id>> sequences_;
};

}  // namespace llmkit::sampling
