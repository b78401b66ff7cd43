// SPDX-License-Identifier: MIT
#pragma once
// Oracle for llmkit/grammar: an Earley recogniser over code points, written
// for obviousness, not speed. It shares only the parsed grammar with the
// library (rules, alternatives, classes), not the pushdown matcher, the
// interning, the UTF-8 handling or the trie.
//
// A byte string is accepted as a prefix when it decodes (strict UTF-8: no
// overlong forms, surrogates or values above U+10FFFF) to code points C plus
// an unfinished sequence P, C is a prefix of a sentence, and some code point
// whose encoding starts with P extends C.

#include <llmkit/grammar/gbnf.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace llmkit::grammar::reference {

/// Strict UTF-8 encoding of one code point.
inline std::string encode_utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// Splits bytes into complete code points and an unfinished tail, by trying
/// every code point's encoding: nullopt when the bytes are not a prefix of
/// valid UTF-8.
struct decoded {
  std::vector<char32_t> code_points;
  std::string tail;  // bytes of an unfinished sequence
};
inline std::optional<decoded> decode_utf8(std::string_view bytes) {
  decoded d;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const std::size_t n = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (i + n > bytes.size()) {
      d.tail = std::string(bytes.substr(i));
      // Some valid code point must start with the tail.
      return d;
    }
    // Decode by value then re-encode: only the strict encoding round-trips.
    char32_t cp = n == 1 ? lead : lead & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3F);
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || encode_utf8(cp) != bytes.substr(i, n)) return std::nullopt;
    d.code_points.push_back(cp);
    i += n;
  }
  return d;
}

/// Earley recogniser (see the file comment).
class earley {
 public:
  explicit earley(const compiled_grammar& g) : g_(g), nullable_(g.n_rules(), false) {
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < g.n_rules(); ++r) {
        if (nullable_[r]) continue;
        for (std::uint32_t a : g.alternatives[r]) {
          bool all = true;
          for (std::uint32_t p = a; g.elements[p].type != element::kind::end; ++p)
            all = all && g.elements[p].type == element::kind::rule_ref && nullable_[g.elements[p].value];
          if (all) nullable_[r] = changed = true;
        }
      }
    }
  }

  // (rule, element offset of the dot, origin set)
  using item = std::tuple<std::uint32_t, std::uint32_t, std::size_t>;
  using chart = std::vector<std::set<item>>;

  chart start() const {
    chart c(1);
    for (std::uint32_t a : g_.alternatives[g_.root]) c[0].insert({g_.root, a, 0});
    close(c);
    return c;
  }
  /// Adds a set for code point `cp`; false (chart unchanged) when nothing scans it.
  bool scan(chart& c, char32_t cp) const {
    std::set<item> next;
    for (const auto& [r, p, o] : c.back())
      if (g_.elements[p].type == element::kind::char_class && g_.classes[g_.elements[p].value].contains(cp))
        next.insert({r, p + 1, o});
    if (next.empty()) return false;
    c.push_back(std::move(next));
    close(c);
    return true;
  }
  /// True when some class the last set may scan contains a code point with `fits(cp)`.
  template <class Pred>
  bool can_scan_any(const chart& c, char32_t lo, char32_t hi, Pred&& fits) const {
    for (char32_t cp = lo; cp <= hi; ++cp) {
      if (!fits(cp)) continue;
      for (const auto& [r, p, o] : c.back())
        if (g_.elements[p].type == element::kind::char_class && g_.classes[g_.elements[p].value].contains(cp))
          return true;
    }
    return false;
  }
  bool complete(const chart& c) const {
    for (const auto& [r, p, o] : c.back())
      if (r == g_.root && o == 0 && g_.elements[p].type == element::kind::end) return true;
    return false;
  }

  /// True when `bytes` is accepted as a prefix after the chart `c`.
  bool accepts(chart c, std::string_view bytes) const {
    const auto d = decode_utf8(bytes);
    if (!d) return false;
    for (char32_t cp : d->code_points)
      if (!scan(c, cp)) return false;
    if (d->tail.empty()) return true;
    const std::string tail = d->tail;
    // Every code point whose encoding starts with the tail has the tail's
    // payload bits on top: enumerate those, keep the ones that encode to it.
    const auto lead = static_cast<unsigned char>(tail[0]);
    const std::size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    char32_t bits = lead & (0x7F >> n);
    for (std::size_t k = 1; k < tail.size(); ++k) bits = (bits << 6) | (static_cast<unsigned char>(tail[k]) & 0x3F);
    const unsigned shift = 6u * static_cast<unsigned>(n - tail.size());
    const char32_t lo = bits << shift;
    const char32_t hi = std::min<char32_t>(lo | ((1u << shift) - 1), 0x10FFFF);
    if (lo > 0x10FFFF) return false;
    return can_scan_any(c, lo, hi, [&](char32_t cp) {
      return cp >= 0x80 && !(cp >= 0xD800 && cp <= 0xDFFF) && encode_utf8(cp).compare(0, tail.size(), tail) == 0;
    });
  }

 private:
  // Prediction and completion to a fixed point on the last set.
  void close(chart& c) const {
    const std::size_t k = c.size() - 1;
    for (bool changed = true; changed;) {
      changed = false;
      std::vector<item> add;
      for (const auto& [r, p, o] : c[k]) {
        const element& e = g_.elements[p];
        if (e.type == element::kind::rule_ref) {
          for (std::uint32_t a : g_.alternatives[e.value]) add.push_back({e.value, a, k});
          if (nullable_[e.value]) add.push_back({r, p + 1, o});
        } else if (e.type == element::kind::end) {
          for (const auto& [r2, p2, o2] : c[o])
            if (g_.elements[p2].type == element::kind::rule_ref && g_.elements[p2].value == r) add.push_back({r2, p2 + 1, o2});
        }
      }
      for (const item& i : add) changed = c[k].insert(i).second || changed;
    }
  }

  const compiled_grammar& g_;
  std::vector<bool> nullable_;
};

}  // namespace llmkit::grammar::reference
