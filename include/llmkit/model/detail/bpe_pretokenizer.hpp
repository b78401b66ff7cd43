// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/bpe_pretokenizer.hpp
/// The byte-level BPE pre-tokenizers as a state machine over code points:
/// Llama 3's split regex
///   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
///   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
/// and Qwen2's (the same with single digits, \p{N}), and GPT-4o's o200k
/// regex (`pre_tokenize_o200k`). The alternatives are tried in order at
/// each position, with the regex's greedy backtracking worked out by hand;
/// every position matches one of them, so the pieces cover the text. Case
/// folding of the contractions is ASCII only; \s is Unicode White_Space
/// (model/detail/unicode_categories.hpp).

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
  char_kind kind;
  char_class cls;
};

/// Decodes `text` into `chars` (cleared first); each character's kind only
/// `with_kinds` (else `other`), as only the o200k split needs it.
inline void decode_chars(std::string_view text, std::vector<pretoken_char>& chars, bool with_kinds) {
  chars.clear();
  for (std::size_t at = 0; at < text.size();) {
    const utf8_char c = decode_utf8(text, at);
    if (with_kinds) {
      const char_kind k = kind_of(c.code_point);
      chars.push_back({static_cast<std::uint32_t>(at), c.code_point, k, class_of(k)});
    } else {
      chars.push_back({static_cast<std::uint32_t>(at), c.code_point, char_kind::other, classify(c.code_point)});
    }
    at += c.length;
  }
}

/// Emits the pieces of `text` (decoded in `chars`) that `match(i)`, the end
/// of the match starting at character i, cuts.
template <class Match, class Emit>
void emit_pieces(std::string_view text, const std::vector<pretoken_char>& chars, Match&& match, Emit&& emit) {
  const std::size_t n = chars.size();
  for (std::size_t i = 0; i < n;) {
    const std::size_t end = match(i);
    const std::size_t from = chars[i].offset, to = end < n ? chars[end].offset : text.size();
    emit(text.substr(from, to - from));
    i = end;
  }
}

/// The length of the contraction (?i:'s|'t|'re|'ve|'m|'ll|'d) at character
/// i, 0 if none (ASCII case folding).
inline std::size_t contraction_length(const std::vector<pretoken_char>& chars, std::size_t i) noexcept {
  const auto lower = [&](std::size_t k) -> char32_t {
    if (k >= chars.size()) return 0;
    const char32_t c = chars[k].code_point;
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
  };
  if (i >= chars.size() || chars[i].code_point != '\'') return 0;
  const char32_t a = lower(i + 1), b = lower(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/// The end of the white-space alternatives \s*[\r\n]+|\s+(?!\S)|\s+ at
/// character i, which is white space.
inline std::size_t match_space(const std::vector<pretoken_char>& chars, std::size_t i) noexcept {
  const std::size_t n = chars.size();
  std::size_t end = i;
  while (end < n && chars[end].cls == char_class::space) ++end;
  for (std::size_t k = end; k > i; --k)  // \s*[\r\n]+: up to the run's last CR or LF
    if (chars[k - 1].code_point == '\r' || chars[k - 1].code_point == '\n') return k;
  if (end == n || end - 1 == i) return end;  // \s+(?!\S) at the end of the text, else \s+
  return end - 1;                            // \s+(?!\S): leave the last space to the next piece
}

/// Splits `text` into pre-tokens and calls `emit(std::string_view piece)`
/// for each, in order. `max_digits` is 3 for Llama 3 and 1 for Qwen2.
/// `chars` is scratch space (reused across calls to avoid allocations).
/// @pre text.size() < 2^32
template <class Emit>
void pre_tokenize(std::string_view text, std::size_t max_digits, std::vector<pretoken_char>& chars, Emit&& emit) {
  decode_chars(text, chars, false);
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
  // The end of the match starting at character i.
  const auto match = [&](std::size_t i) -> std::size_t {
    const pretoken_char& c = chars[i];
    if (const std::size_t k = contraction_length(chars, i); k != 0) return i + k;  // (?i:'s|'t|...)
    if (c.cls == char_class::letter) return run(i, char_class::letter);              // \p{L}+
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
    return match_space(chars, i);  // c is white space
  };
  emit_pieces(text, chars, match, emit);
}

/// Splits `text` as GPT-4o's o200k regex (`tokenizer.ggml.pre` "gpt-4o"):
///   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
///   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
///   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
/// calling `emit(std::string_view piece)` for each piece in order: words
/// split at lower-to-upper case changes ("camelCase" is "camel", "Case"),
/// with marks and caseless letters on both sides. `chars` is scratch space.
/// @pre text.size() < 2^32
template <class Emit>
void pre_tokenize_o200k(std::string_view text, std::vector<pretoken_char>& chars, Emit&& emit) {
  decode_chars(text, chars, true);
  const std::size_t n = chars.size();
  const auto upper = [&](std::size_t i) {  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
    const char_kind k = chars[i].kind;
    return k == char_kind::upper || k == char_kind::caseless || k == char_kind::mark;
  };
  const auto lower = [&](std::size_t i) {  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
    const char_kind k = chars[i].kind;
    return k == char_kind::lower || k == char_kind::caseless || k == char_kind::mark;
  };
  const auto run = [&](std::size_t i, auto&& in) {
    while (i < n && in(i)) ++i;
    return i;
  };
  const auto with_contraction = [&](std::size_t end) { return end + contraction_length(chars, end); };
  // Upper* lower+ from j (the star backtracks: the largest start of lower+ wins); 0 if none.
  const auto upper_star_lower_plus = [&](std::size_t j) -> std::size_t {
    const std::size_t a = run(j, upper);
    for (std::size_t k = a + 1; k-- > j;)
      if (k < n && lower(k)) return with_contraction(run(k, lower));
    return 0;
  };
  // Upper+ lower* from j; 0 if none.
  const auto upper_plus_lower_star = [&](std::size_t j) -> std::size_t {
    const std::size_t a = run(j, upper);
    return a > j ? with_contraction(run(a, lower)) : 0;
  };
  const auto other = [&](std::size_t i) { return chars[i].cls == char_class::other; };  // [^\s\p{L}\p{N}]
  const auto match = [&](std::size_t i) -> std::size_t {
    const pretoken_char& c = chars[i];
    // [^\r\n\p{L}\p{N}]?: tried with the character, then without.
    const bool prefix = c.code_point != '\r' && c.code_point != '\n' && c.cls != char_class::letter &&
                        c.cls != char_class::number;
    if (prefix)
      if (const std::size_t e = upper_star_lower_plus(i + 1); e != 0) return e;
    if (const std::size_t e = upper_star_lower_plus(i); e != 0) return e;
    if (prefix)
      if (const std::size_t e = upper_plus_lower_star(i + 1); e != 0) return e;
    if (const std::size_t e = upper_plus_lower_star(i); e != 0) return e;
    if (c.cls == char_class::number) {  // \p{N}{1,3}
      std::size_t j = i;
      while (j < n && j - i < 3 && chars[j].cls == char_class::number) ++j;
      return j;
    }
    const auto crlf_slash = [&](std::size_t k) {  // [\r\n/]*
      while (k < n && (chars[k].code_point == '\r' || chars[k].code_point == '\n' || chars[k].code_point == '/')) ++k;
      return k;
    };
    if (c.code_point == ' ' && i + 1 < n && other(i + 1)) return crlf_slash(run(i + 1, other));  // ' '[^\s\p{L}\p{N}]+
    if (other(i)) return crlf_slash(run(i, other));
    return match_space(chars, i);  // c is white space
  };
  emit_pieces(text, chars, match, emit);
}

}  // namespace llmkit::model::detail
