// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/python_strip.hpp
/// Python's `str.strip()` on UTF-8 text: what Jinja's `trim` filter and
/// `content.strip()` do inside the chat templates of model/chat_template.hpp.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llmkit::model::detail {

/// True for the code points Python's `str.isspace()` accepts (Unicode White_Space
/// plus the separators U+001C..U+001F), the set `str.strip()` removes.
constexpr bool python_isspace(char32_t c) noexcept {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// Decodes the UTF-8 code point at `s[at]`; `length` = 0 when the bytes there
/// are not well-formed UTF-8 (such bytes are never whitespace).
struct utf8_code_point {
  char32_t value = 0;
  std::size_t length = 0;
};
constexpr utf8_code_point decode_utf8_at(std::string_view s, std::size_t at) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(at);
  std::size_t n = 0;
  char32_t c = 0;
  if (b0 < 0x80) return {b0, 1};
  if ((b0 & 0xE0) == 0xC0) { n = 2; c = b0 & 0x1F; }
  else if ((b0 & 0xF0) == 0xE0) { n = 3; c = b0 & 0x0F; }
  else if ((b0 & 0xF8) == 0xF0) { n = 4; c = b0 & 0x07; }
  else return {};
  if (s.size() - at < n) return {};
  for (std::size_t i = 1; i < n; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return {};
    c = (c << 6) | (byte(at + i) & 0x3F);
  }
  return {c, n};
}

/// `s` without leading and trailing Python whitespace.
constexpr std::string_view python_strip(std::string_view s) noexcept {
  std::size_t begin = 0;
  while (begin < s.size()) {
    const auto cp = decode_utf8_at(s, begin);
    if (cp.length == 0 || !python_isspace(cp.value)) break;
    begin += cp.length;
  }
  std::size_t end = s.size();
  while (end > begin) {
    // The last code point starts at the last byte that is not a continuation byte.
    std::size_t start = end - 1;
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const auto cp = decode_utf8_at(s, start);
    if (cp.length != end - start || !python_isspace(cp.value)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace llmkit::model::detail
