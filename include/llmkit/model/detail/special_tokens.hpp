// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/special_tokens.hpp
/// Finds the text of special tokens in a string, longest match first, so
/// `encode` can split text around them when asked to parse specials.

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model::detail {

/// A set of (text, id) pairs to find in text.
class special_token_matcher {
 public:
  /// Adds `text` (ignored when empty; the first id added for a text wins).
  void add(std::string_view text, token_id id) {
    if (text.empty()) return;
    auto& bucket = by_first_[static_cast<unsigned char>(text[0])];
    for (const auto& [t, i] : bucket)
      if (t == text) return;
    bucket.emplace_back(std::string(text), id);
    // Longest first, so "<|a|>x" wins over "<|a|>".
    std::stable_sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  bool empty() const noexcept {
    return std::all_of(by_first_.begin(), by_first_.end(), [](const auto& b) { return b.empty(); });
  }

  /// Calls `on_text(std::string_view)` for each stretch of text between
  /// special tokens (never empty) and `on_token(token_id)` for each special
  /// token, in order. A special token's text that overlaps one of the
  /// `[n] literal` ranges (sorted by offset, not overlapping) is left in the
  /// text.
  template <class OnText, class OnToken>
  void split(std::string_view text, std::span<const text_span> literal, OnText&& on_text, OnToken&& on_token) const {
    std::size_t start = 0;
    std::size_t next_literal = 0;  // the first range that ends after `at`
    for (std::size_t at = 0; at < text.size();) {
      while (next_literal < literal.size() &&
             (literal[next_literal].end() <= at || literal[next_literal].length == 0))
        ++next_literal;
      // Matches may end at `limit`: the start of the next literal range.
      std::size_t limit = text.size();
      if (next_literal < literal.size()) {
        const text_span& r = literal[next_literal];
        if (r.offset <= at) {  // inside a literal range: skip to its end
          at = std::min(r.end(), text.size());
          continue;
        }
        limit = std::min(r.offset, text.size());
      }
      const auto& bucket = by_first_[static_cast<unsigned char>(text[at])];
      std::size_t matched = 0;
      for (const auto& [t, id] : bucket) {
        if (t.size() <= limit - at && text.compare(at, t.size(), t) == 0) {
          if (at > start) on_text(text.substr(start, at - start));
          on_token(id);
          matched = t.size();
          break;
        }
      }
      if (matched == 0) {
        ++at;
        continue;
      }
      at += matched;
      start = at;
    }
    if (start < text.size()) on_text(text.substr(start));
  }

 private:
  std::array<std::vector<std::pair<std::string, token_id>>, 256> by_first_;
};

}  // namespace llmkit::model::detail
