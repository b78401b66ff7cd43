// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/bpe_pretokenizer.hpp
/// The byte-level BPE pre-tokenizers as a state machine over code points:
/// Llama 3's split regex
///   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
///   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
/// and Qwen2's (the same with single digits, \p{N}). The alternatives are
/// tried in order at each position, with the regex's greedy backtracking
/// worked out by hand; every position matches one of them, so the pieces
/// cover the text. Case folding of the contractions is ASCII only; \s is
/// Unicode White_Space (model/detail/unicode_categories.hpp).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "llmkit/model/detail/unicode.hpp"

namespace llmkit::model::detail {

/// One decoded character of the text being split.
struct pretoken_char {
  std::uint32_t offset;  // byte offset in the text
  char32_t code_point;
  char_class cls;
};

/// Splits `text` into pre-tokens and calls `emit(std::string_view piece)`
/// for each, in order. `max_digits` is 3 for Llama 3 and 1 for Qwen2.
/// `chars` is scratch space (reused across calls to avoid allocations).
/// @pre text.size() < 2^32
template <class Emit>
void pre_tokenize(std::string_view text, std::size_t max_digits, std::vector<pretoken_char>& chars, Emit&& emit) {
  chars.clear();
  for (std::size_t at = 0; at < text.size();) {
    const utf8_char c = decode_utf8(text, at);
    chars.push_back({static_cast<std::uint32_t>(at), c.code_point, classify(c.code_point)});
    at += c.length;
  }
  const std::size_t n = chars.size();
  const auto is = [&](std::size_t i, char_class c) { return i < n && chars[i].cls == c; };
  const auto is_crlf = [&](std::size_t i) { return i < n && (chars[i].code_point == '\r' || chars[i].code_point == '\n'); };
  const auto run = [&](std::size_t i, char_class c) {
    while (i < n && chars[i].cls == c) ++i;
    return i;
  };
  const auto crlf_run = [&](std::size_t i) {
    while (is_crlf(i)) ++i;
    return i;
  };
  const auto lower = [&](std::size_t i) -> char32_t {
    if (i >= n) return 0;
    const char32_t c = chars[i].code_point;
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
  };
  // The end of the match starting at character i.
  const auto match = [&](std::size_t i) -> std::size_t {
    const pretoken_char& c = chars[i];
    if (c.code_point == '\'') {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
      const char32_t a = lower(i + 1), b = lower(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    if (c.cls == char_class::letter) return run(i, char_class::letter);  // \p{L}+
    if (c.cls != char_class::number && !is_crlf(i) && is(i + 1, char_class::letter))
      return run(i + 1, char_class::letter);  // [^\r\n\p{L}\p{N}]\p{L}+
    if (c.cls == char_class::number) {       // \p{N}{1,max_digits}
      std::size_t j = i;
      while (j < n && j - i < max_digits && chars[j].cls == char_class::number) ++j;
      return j;
    }
    if (c.code_point == ' ' && is(i + 1, char_class::other))  // ' '[^\s\p{L}\p{N}]+[\r\n]*
      return crlf_run(run(i + 1, char_class::other));
    if (c.cls == char_class::other) return crlf_run(run(i, char_class::other));
    // c is white space.
    const std::size_t end = run(i, char_class::space);
    for (std::size_t k = end; k > i; --k)  // \s*[\r\n]+: up to the run's last CR or LF
      if (is_crlf(k - 1)) return k;
    if (end == n || end - 1 == i) return end;  // \s+(?!\S) at the end of the text, else \s+
    return end - 1;                            // \s+(?!\S): leave the last space to the next piece
  };
  for (std::size_t i = 0; i < n;) {
    const std::size_t end = match(i);
    const std::size_t from = chars[i].offset, to = end < n ? chars[end].offset : text.size();
    emit(text.substr(from, to - from));
    i = end;
  }
}

}  // namespace llmkit::model::detail
