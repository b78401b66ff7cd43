// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/stop.hpp
/// When a generated sequence ends, for every generation driver (search's
/// generate, beam search and speculative decoding, the scheduler, a serving
/// engine): an end-of-sequence token, a stop sequence (a run of token ids), a
/// stop string (matched on the decoded text, across token boundaries), a
/// token budget, or cancellation by the caller.
///
/// The tokens that triggered the stop (the EOS token, the whole stop
/// sequence, the token that completed a stop string) are part of the output;
/// `finish_reason` says which rule fired.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"

namespace llmkit {

/// Why a generation ended.
enum class finish_reason : std::uint8_t {
  eos,            ///< the last token is one of `eos_tokens`
  stop_sequence,  ///< the generated tokens end with one of `stop_sequences`
  stop_string,    ///< the generated text contains one of `stop_strings`
  max_tokens,     ///< `max_new_tokens` tokens were generated
  cancelled,      ///< the caller cancelled it (a streaming callback returned false, scheduler::cancel)
};

/// Printable name ("eos", "stop_sequence", "stop_string", "max_tokens", "cancelled").
constexpr std::string_view finish_reason_name(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::stop_sequence: return "stop_sequence";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::max_tokens: return "max_tokens";
    case finish_reason::cancelled: return "cancelled";
  }
  return "?";
}

/// The stop rules of one request.
struct stop_criteria {
  std::size_t max_new_tokens = 128;                   ///< generated-token budget (> 0)
  std::vector<token_id> eos_tokens{};                 ///< any of these ends the sequence
  std::vector<std::vector<token_id>> stop_sequences{};  ///< token runs that end the sequence (each non-empty)
  /// Texts that end the sequence as soon as the decoded output contains one
  /// (each non-empty). Only drivers that decode text check them (an engine
  /// with a tokenizer, through `check(generated, text)`); token-level
  /// drivers ignore them.
  std::vector<std::string> stop_strings{};

  /// @throws llmkit::error naming the field when max_new_tokens is 0 or a
  /// stop sequence or stop string is empty; `who` prefixes the message.
  void validate(std::string_view who) const {
    LLMKIT_CHECK(max_new_tokens > 0, who, ": max_new_tokens must be > 0, got ", max_new_tokens);
    for (std::size_t i = 0; i < stop_sequences.size(); ++i)
      LLMKIT_CHECK(!stop_sequences[i].empty(), who, ": stop_sequences[", i, "] is empty");
    for (std::size_t i = 0; i < stop_strings.size(); ++i)
      LLMKIT_CHECK(!stop_strings[i].empty(), who, ": stop_strings[", i, "] is empty");
  }

  /// True when `token` is an end-of-sequence token.
  bool is_eos(token_id token) const noexcept {
    return std::find(eos_tokens.begin(), eos_tokens.end(), token) != eos_tokens.end();
  }

  /// The token rule that ends a sequence whose generated tokens are
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

  /// check(generated), with the stop strings matched on `text`, the
  /// decoded generated tokens (not the prompt). A stop string ranks after
  /// the token rules and before the budget.
  std::optional<finish_reason> check(std::span<const token_id> generated, std::string_view text) const noexcept {
    if (generated.empty()) return std::nullopt;
    if (is_eos(generated.back())) return finish_reason::eos;
    const auto by_tokens = check(generated);
    if (by_tokens && *by_tokens != finish_reason::max_tokens) return by_tokens;
    if (find_stop_string(text)) return finish_reason::stop_string;
    return by_tokens;
  }

  /// Offset in `text` where the earliest stop string occurrence begins, or
  /// nullopt. An engine cuts its text output there. When the text grows by
  /// `n_new` characters since the last call, pass it: only occurrences that
  /// end in those characters are looked for (the earlier text was checked).
  std::optional<std::size_t> find_stop_string(std::string_view text,
                                              std::size_t n_new = std::string_view::npos) const noexcept {
    std::optional<std::size_t> first;
    for (const std::string& s : stop_strings) {
      if (s.empty() || s.size() > text.size()) continue;
      // A match ending in the new characters starts at most s.size() - 1 before them.
      const std::size_t new_from = n_new >= text.size() ? 0 : text.size() - n_new;
      const std::size_t from = new_from >= s.size() - 1 ? new_from - (s.size() - 1) : 0;
      const std::size_t at = text.find(s, from);
      if (at != std::string_view::npos && (!first || at < *first)) first = at;
    }
    return first;
  }

  /// Characters at the end of `text` that begin some stop string without
  /// completing it: a streaming engine holds them back until the next tokens
  /// show whether a stop string follows.
  std::size_t partial_stop_length(std::string_view text) const noexcept {
    std::size_t longest = 0;
    for (const std::string& s : stop_strings)
      for (std::size_t k = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); k > longest; --k)
        if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
          longest = k;
          break;
        }
    return longest;
  }
};

}  // namespace llmkit
