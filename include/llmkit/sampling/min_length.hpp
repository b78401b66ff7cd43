// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/min_length.hpp
/// Minimum length: bans the end-of-sequence token(s) while fewer than
/// `min_new_tokens` tokens have been generated (prompt not counted).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/token_sets.hpp"

namespace llmkit::sampling {

/// Suppresses EOS until `min_new_tokens` tokens exist.
struct min_length {
  std::int64_t min_new_tokens = 0;
  std::vector<token_id> eos_tokens{};

  /// @throws llmkit::error if min_new_tokens < 0 or an EOS token is negative.
  void validate() const {
    LLMKIT_CHECK(min_new_tokens >= 0, "min_length: min_new_tokens must be >= 0, got ", min_new_tokens);
    for (token_id t : eos_tokens) LLMKIT_CHECK(t >= 0, "min_length: eos token must be >= 0, got ", t);
  }

  void apply(candidates& c, const sampling_context& ctx) const {
    validate();
    if (ctx.n_generated() >= static_cast<std::size_t>(min_new_tokens) || eos_tokens.empty()) return;
    detail::check_tokens(eos_tokens, c.vocab_size(), "min_length", "eos");
    auto& s = c.scratch();
    detail::grow(s.tokens, eos_tokens.size());
    std::copy(eos_tokens.begin(), eos_tokens.end(), s.tokens.begin());
    detail::ban(c, {s.tokens.data(), eos_tokens.size()});
  }
};

}  // namespace llmkit::sampling
