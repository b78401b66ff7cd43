// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/stopping.hpp
/// When a generated sequence ends: an end-of-sequence token, a stop
/// sequence (a run of token ids), or a token budget. Shared by the
/// generation loop, beam search and speculative decoding.
///
/// The tokens that triggered the stop (the EOS token, the whole stop
/// sequence) are part of the output; `finish_reason` says which rule fired.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"

namespace llmkit::search {

/// Why a generation ended.
enum class finish_reason : std::uint8_t {
  eos,            ///< the last token is one of `eos_tokens`
  stop_sequence,  ///< the generated tokens end with one of `stop_sequences`
  max_tokens,     ///< `max_new_tokens` tokens were generated
  cancelled,      ///< the streaming callback returned false
};

/// Printable name ("eos", "stop_sequence", "max_tokens", "cancelled").
constexpr std::string_view finish_reason_name(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::stop_sequence: return "stop_sequence";
    case finish_reason::max_tokens: return "max_tokens";
    case finish_reason::cancelled: return "cancelled";
  }
  return "?";
}

/// The stop rules of one request.
struct stop_criteria {
  std::size_t max_new_tokens = 128;                       ///< generated-token budget (> 0)
  std::vector<token_id> eos_tokens{};                 ///< any of these ends the sequence
  std::vector<std::vector<token_id>> stop_sequences{};  ///< token runs that end the sequence (each non-empty)

  /// @throws llmkit::error naming the field when max_new_tokens is 0 or a
  /// stop sequence is empty; `who` prefixes the message.
  void validate(const char* who) const {
    LLMKIT_CHECK(max_new_tokens > 0, who, ": max_new_tokens must be > 0, got ", max_new_tokens);
    for (std::size_t i = 0; i < stop_sequences.size(); ++i)
      LLMKIT_CHECK(!stop_sequences[i].empty(), who, ": stop_sequences[", i, "] is empty");
  }

  /// True when `token` is an end-of-sequence token.
  bool is_eos(token_id token) const noexcept {
    return std::find(eos_tokens.begin(), eos_tokens.end(), token) != eos_tokens.end();
  }

  /// The rule that ends a sequence whose generated tokens are
  /// `[n] generated` (the newest last), or nullopt to continue. EOS wins over
  /// a stop sequence, which wins over the budget. Stop sequences match only
  /// generated tokens, never the prompt.
  std::optional<finish_reason> check(std::span<const token_id> generated) const noexcept {
    if (generated.empty()) return std::nullopt;
    if (is_eos(generated.back())) return finish_reason::eos;
    for (const auto& seq : stop_sequences)
      if (!seq.empty() && seq.size() <= generated.size() &&
          std::equal(seq.begin(), seq.end(), generated.end() - static_cast<std::ptrdiff_t>(seq.size())))
        return finish_reason::stop_sequence;
    if (generated.size() >= max_new_tokens) return finish_reason::max_tokens;
    return std::nullopt;
  }
};

namespace detail {
/// Calls `on_token(token)`; a callback returning bool may return false to
/// cancel the generation (this returns false then), a void one never does.
template <class OnToken>
bool notify(OnToken& on_token, token_id token) {
  if constexpr (std::is_same_v<decltype(on_token(token)), void>) {
    on_token(token);
    return true;
  } else {
    return static_cast<bool>(on_token(token));
  }
}

/// The default streaming callback: does nothing.
struct no_callback {
  void operator()(token_id) const noexcept {}
};
}  // namespace detail

}  // namespace llmkit::search
