// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/unicode.hpp
/// UTF-8 decoding that never fails, and the kind of a code point (letter by
/// case, mark, number, space or other) from the generated range table with
/// the coarser class most pre-tokenizers use (\p{L}, \p{N}, \s or other).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "llmkit/model/detail/unicode_categories.hpp"

namespace llmkit::model::detail {

/// One decoded character: its code point and how many bytes it took.
/// An invalid or truncated sequence decodes as one byte of class `other`
/// (`invalid_code_point`), so any byte string splits into characters.
struct utf8_char {
  char32_t code_point;
  std::uint32_t length;
};

/// Stands for a byte that does not start a valid UTF-8 sequence.
inline constexpr char32_t invalid_code_point = 0xffffffff;

/// Decodes the character at `text[at]`. @pre at < text.size()
inline utf8_char decode_utf8(std::string_view text, std::size_t at) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return {lead, 1};
  std::uint32_t length = 0;
  char32_t cp = 0, min = 0;
  if ((lead & 0xe0) == 0xc0) length = 2, cp = lead & 0x1f, min = 0x80;
  else if ((lead & 0xf0) == 0xe0) length = 3, cp = lead & 0x0f, min = 0x800;
  else if ((lead & 0xf8) == 0xf0) length = 4, cp = lead & 0x07, min = 0x10000;
  else return {invalid_code_point, 1};
  if (text.size() - at < length) return {invalid_code_point, 1};
  for (std::uint32_t k = 1; k < length; ++k) {
    const unsigned char c = byte(at + k);
    if ((c & 0xc0) != 0x80) return {invalid_code_point, 1};
    cp = (cp << 6) | (c & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not characters.
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {invalid_code_point, 1};
  return {cp, length};
}

/// The classes of Llama 3's and Qwen2's split regexes (disjoint).
enum class char_class : std::uint8_t { other, letter, number, space };

/// The class of a kind of character.
constexpr char_class class_of(char_kind k) noexcept {
  switch (k) {
    case char_kind::upper:
    case char_kind::lower:
    case char_kind::caseless: return char_class::letter;
    case char_kind::number: return char_class::number;
    case char_kind::space: return char_class::space;
    case char_kind::other:
    case char_kind::mark: break;
  }
  return char_class::other;
}

/// char_kind_ranges through class_of, adjacent runs of one class merged
/// and `other` (marks) left out: the first `n` entries of `runs`.
struct class_runs {
  std::array<code_point_range<char_class>, char_kind_ranges.size()> runs{};
  std::size_t n = 0;
};

constexpr class_runs merge_class_runs() noexcept {
  class_runs out;
  for (const auto& r : char_kind_ranges) {
    const char_class c = class_of(r.value);
    if (c == char_class::other) continue;
    auto& last = out.runs[out.n > 0 ? out.n - 1 : 0];
    if (out.n > 0 && last.value == c && last.last + 1 == r.first) last.last = r.last;
    else out.runs[out.n++] = {r.first, r.last, c};
  }
  return out;
}

/// The ranges of each class, sorted by `first`, disjoint (computed at
/// compile time, so the two tables cannot disagree).
inline constexpr auto char_class_ranges = [] {
  constexpr class_runs merged = merge_class_runs();
  std::array<code_point_range<char_class>, merged.n> out{};
  std::copy_n(merged.runs.begin(), merged.n, out.begin());
  return out;
}();

/// The value of code point `cp` in `Ranges` (sorted by `first`, disjoint),
/// the value type's first enumerator (`other`) outside them; a table for
/// ASCII, a binary search above.
template <const auto& Ranges>
inline auto range_value(char32_t cp) noexcept {
  using value_type = decltype(Ranges[0].value);
  static constexpr auto ascii = [] {
    std::array<value_type, 128> t{};
    for (const auto& r : Ranges)
      for (char32_t c = r.first; c <= r.last && c < 128; ++c) t[c] = r.value;
    return t;
  }();
  if (cp < 128) return ascii[cp];
  const auto it =
      std::upper_bound(Ranges.begin(), Ranges.end(), cp, [](char32_t c, const auto& r) { return c < r.first; });
  if (it == Ranges.begin()) return value_type{};
  const auto& r = *(it - 1);
  return cp <= r.last ? r.value : value_type{};
}

/// The kind of code point `cp` (`other` for `invalid_code_point`).
inline char_kind kind_of(char32_t cp) noexcept { return range_value<char_kind_ranges>(cp); }

/// The class of code point `cp` (`other` for `invalid_code_point`).
inline char_class classify(char32_t cp) noexcept { return range_value<char_class_ranges>(cp); }

}  // namespace llmkit::model::detail
