// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/regex.hpp
/// Regular expressions (the ECMAScript subset JSON Schema `pattern` uses) to
/// a GBNF expression over the *JSON text* of a string's content: a `"` or `\`
/// the pattern matches is written `\"` or `\\`, and control characters are
/// not produced (the grammar is narrower there, never wider).
///
/// Supported: literals, `.`, classes `[a-z]` / `[^...]` with ranges,
/// escapes `\d \w \s \D \W \S \n \t \r \. \\ \/ \-` etc., groups `( )` and
/// `(?: )`, `|`, quantifiers `* + ? {m} {m,} {m,n}`, `^` at the start and `$`
/// at the end (without them, any text may come before or after, as JSON
/// Schema's unanchored patterns allow). Anything else (back-references,
/// lookarounds, lazy quantifiers, `\b`, `^`/`$` elsewhere) is an error.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/grammar/gbnf.hpp"

namespace llmkit::grammar {

namespace detail {

class regex_converter {
 public:
  explicit regex_converter(std::string_view re) : s_(re) {}

  std::string convert() {
    bool anchored_start = false, anchored_end = false;
    if (!s_.empty() && s_.front() == '^') {
      anchored_start = true;
      s_.remove_prefix(1);
    }
    if (!s_.empty() && s_.back() == '$' && (s_.size() < 2 || s_[s_.size() - 2] != '\\')) {
      anchored_end = true;
      s_.remove_suffix(1);
    }
    std::string body = alternatives(0);
    if (pos_ != s_.size()) fail("unexpected ')'");
    const std::string any = "([^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\])*";
    return std::string(anchored_start ? "" : any + " ") + "(" + body + ")" + (anchored_end ? "" : " " + any);
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    ::llmkit::detail::throw_error("pattern: at offset ", pos_, ": ", parts...);
  }

  static std::string hex(char32_t cp) {
    static const char* d = "0123456789ABCDEF";
    std::string out = "\\U";
    for (int i = 7; i >= 0; --i) out += d[(cp >> (4 * i)) & 15];
    return out;
  }
  // The JSON text of a set of code points: plain ranges, plus `\"` and `\\`.
  static std::string set_text(const std::vector<std::pair<char32_t, char32_t>>& ranges, bool negated) {
    const char_class c = make_class(ranges, negated);
    std::vector<std::pair<char32_t, char32_t>> plain;
    bool quote = false, backslash = false;
    for (auto [lo, hi] : c.ranges) {
      quote = quote || (lo <= U'"' && U'"' <= hi);
      backslash = backslash || (lo <= U'\\' && U'\\' <= hi);
      // Cut out controls, '"' and '\'.
      const std::pair<char32_t, char32_t> cuts[] = {{0, 0x1F}, {U'"', U'"'}, {U'\\', U'\\'}};
      std::vector<std::pair<char32_t, char32_t>> pieces{{lo, hi}};
      for (auto [a, b] : cuts) {
        std::vector<std::pair<char32_t, char32_t>> next;
        for (auto [x, y] : pieces) {
          if (y < a || x > b) {
            next.emplace_back(x, y);
            continue;
          }
          if (x < a) next.emplace_back(x, a - 1);
          if (y > b) next.emplace_back(b + 1, y);
        }
        pieces = std::move(next);
      }
      plain.insert(plain.end(), pieces.begin(), pieces.end());
    }
    std::string out = "(";
    bool first = true;
    if (!plain.empty()) {
      out += "[";
      for (auto [lo, hi] : plain) out += hex(lo) + (lo == hi ? "" : "-" + hex(hi));
      out += "]";
      first = false;
    }
    if (quote) out += std::string(first ? "" : " | ") + "\"\\\\\\\"\"", first = false;
    if (backslash) out += std::string(first ? "" : " | ") + "\"\\\\\\\\\"", first = false;
    if (first) ::llmkit::detail::throw_error("pattern: a class matches no character allowed in a JSON string");
    return out + ")";
  }

  // Ranges of a class escape (\d \w \s), complemented for the capitals.
  static bool class_escape(char e, std::vector<std::pair<char32_t, char32_t>>& r, bool& negated) {
    negated = e == 'D' || e == 'W' || e == 'S';
    switch (e) {
      case 'd': case 'D': r = {{'0', '9'}}; return true;
      case 'w': case 'W': r = {{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'_', '_'}}; return true;
      case 's': case 'S': r = {{' ', ' '}, {'\t', '\r'}, {0xA0, 0xA0}, {0xFEFF, 0xFEFF}, {0x2028, 0x2029}}; return true;
      default: return false;
    }
  }
  char32_t escaped_char(char e) {
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
          fail("escape '\\", e, "' is not supported");
        return static_cast<unsigned char>(e);
    }
  }
  char32_t next_char() {
    const auto c = static_cast<unsigned char>(s_[pos_]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (pos_ + n > s_.size()) fail("invalid UTF-8");
    char32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (std::size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + i]) & 0x3F);
    pos_ += n;
    return cp;
  }

  std::string alternatives(std::size_t depth) {
    if (depth > 64) fail("groups nested deeper than 64");
    std::string out = sequence(depth);
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      out += " | " + sequence(depth);
    }
    return out;
  }

  std::string sequence(std::size_t depth) {
    std::string out = "\"\"";
    while (pos_ < s_.size() && s_[pos_] != '|' && s_[pos_] != ')') {
      std::string atom;
      const char c = s_[pos_];
      if (c == '(') {
        ++pos_;
        if (s_.substr(pos_, 2) == "?:") pos_ += 2;
        else if (pos_ < s_.size() && s_[pos_] == '?') fail("lookarounds and named groups are not supported");
        atom = "(" + alternatives(depth + 1) + ")";
        if (pos_ >= s_.size() || s_[pos_] != ')') fail("unclosed '('");
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        bool negated = false;
        if (pos_ < s_.size() && s_[pos_] == '^') negated = true, ++pos_;
        std::vector<std::pair<char32_t, char32_t>> r;
        bool first = true;
        while (pos_ < s_.size() && (s_[pos_] != ']' || first)) {
          first = false;
          char32_t lo;
          if (s_[pos_] == '\\') {
            if (++pos_ >= s_.size()) fail("unfinished escape");
            std::vector<std::pair<char32_t, char32_t>> er;
            bool eneg;
            if (class_escape(s_[pos_], er, eneg)) {
              if (eneg) fail("negated class escapes inside a class are not supported");
              r.insert(r.end(), er.begin(), er.end());
              ++pos_;
              continue;
            }
            lo = escaped_char(s_[pos_++]);
          } else {
            lo = next_char();
          }
          char32_t hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            if (s_[pos_] == '\\') {
              if (++pos_ >= s_.size()) fail("unfinished escape");
              hi = escaped_char(s_[pos_++]);
            } else {
              hi = next_char();
            }
            if (hi < lo) fail("class range out of order");
          }
          r.emplace_back(lo, hi);
        }
        if (pos_ >= s_.size()) fail("unclosed '['");
        ++pos_;
        atom = set_text(r, negated);
      } else if (c == '.') {
        ++pos_;
        atom = set_text({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true);
      } else if (c == '\\') {
        if (++pos_ >= s_.size()) fail("unfinished escape");
        std::vector<std::pair<char32_t, char32_t>> r;
        bool negated;
        if (class_escape(s_[pos_], r, negated)) {
          ++pos_;
          atom = set_text(r, negated);
        } else {
          const char32_t cp = escaped_char(s_[pos_++]);
          atom = set_text({{cp, cp}}, false);
        }
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail("quantifier '", c, "' follows nothing");
      } else if (c == '^' || c == '$') {
        fail("'", c, "' is supported only at the start or the end");
      } else {
        const char32_t cp = next_char();
        atom = set_text({{cp, cp}}, false);
      }
      // Quantifier.
      if (pos_ < s_.size()) {
        const char q = s_[pos_];
        if (q == '*' || q == '+' || q == '?') {
          atom += q;
          ++pos_;
        } else if (q == '{') {
          const std::size_t close = s_.find('}', pos_);
          if (close == std::string_view::npos) fail("unclosed '{'");
          const std::string_view inside = s_.substr(pos_ + 1, close - pos_ - 1);
          for (char d : inside)
            if (!(d >= '0' && d <= '9') && d != ',') fail("bad quantifier '{", std::string(inside), "}'");
          if (inside.empty() || inside.front() == ',') fail("bad quantifier '{", std::string(inside), "}'");
          atom += "{" + std::string(inside) + "}";
          pos_ = close + 1;
        }
        if (pos_ < s_.size() && (s_[pos_] == '?' || s_[pos_] == '*' || s_[pos_] == '+' || s_[pos_] == '{'))
          fail("lazy or repeated quantifiers are not supported");
      }
      out += " " + atom;
    }
    return out;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace detail

/// The GBNF expression of the JSON text of strings matching `pattern`
/// (without the quotes; see the file comment).
/// @throws llmkit::error naming the offset of an unsupported or invalid part.
inline std::string regex_to_gbnf(std::string_view pattern) { return detail::regex_converter(pattern).convert(); }

}  // namespace llmkit::grammar
