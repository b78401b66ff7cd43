// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/gbnf.hpp
/// GBNF, the grammar notation of llama.cpp, parsed and compiled into a
/// `compiled_grammar`: every rule a list of alternatives, every alternative
/// a run of elements (a character class over Unicode code points, a
/// reference to a rule) closed by an `end` element.
///
/// ```
/// root   ::= "{" ws pair ("," ws pair)* "}"   # comments run to the end of the line
/// pair   ::= [a-z]+ ws ":" ws ("true" | "false")
/// ws     ::= [ \t\n]*
/// ```
/// Syntax: `name ::= alternatives` (names of letters, digits, '-' and '_';
/// one rule per line, continued over newlines inside parentheses and after
/// '|'); literals `"..."`; classes `[a-z0-9_]`, negated `[^"\\]`; `.` (any
/// code point); groups `( ... )`; repetitions `x*`, `x+`, `x?`, `x{m}`,
/// `x{m,}`, `x{m,n}`; escapes `\n \r \t \\ \" \[ \] \- \xHH \uHHHH
/// \UHHHHHHHH` in literals and classes. `root` is the start rule.
///
/// Repetitions become helper rules (`x*` is `R ::= x R | ` with a tail call,
/// so matching stacks do not grow with the repetition count). Rules that are
/// left-recursive (a rule reachable from itself without consuming a code
/// point) are refused: the pushdown matcher (matcher.hpp) would never stop
/// expanding them. Compiling is bounded by `compile_limits`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::grammar {

/// Bounds on what a grammar may compile to (adversarial input gets an error,
/// not a hung or swollen process).
struct compile_limits {
  std::size_t max_rules = 1u << 16;       ///< rules, helper rules of repetitions included
  std::size_t max_elements = 1u << 20;    ///< elements over all alternatives
  std::uint32_t max_repetition = 4096;    ///< largest m or n in `{m,n}`
  std::size_t max_source_bytes = 1u << 22;  ///< grammar text size
  std::size_t max_nesting = 256;          ///< parentheses nested in one rule
};

/// One element of an alternative.
struct element {
  enum class kind : std::uint8_t { end, char_class, rule_ref };
  kind type = kind::end;
  std::uint32_t value = 0;  ///< class index for char_class, rule index for rule_ref
};

/// A set of code points as sorted, disjoint, inclusive ranges.
struct char_class {
  std::vector<std::pair<char32_t, char32_t>> ranges;
  /// `[4] ascii` bitmap of the code points below 128, for the common case.
  std::uint32_t ascii[4] = {0, 0, 0, 0};

  bool contains(char32_t cp) const noexcept {
    if (cp < 128) return (ascii[cp >> 5] >> (cp & 31)) & 1u;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](char32_t c, const std::pair<char32_t, char32_t>& r) { return c < r.first; });
    return it != ranges.begin() && std::prev(it)->second >= cp;
  }
  /// True when some code point in [lo, hi] belongs to the class.
  bool intersects(char32_t lo, char32_t hi) const noexcept {
    for (const auto& r : ranges)
      if (r.first <= hi && r.second >= lo) return true;
    return false;
  }
};

/// A grammar ready for matching. `alternatives[r]` holds, for rule r, the
/// offsets into `elements` where each alternative starts; each alternative
/// runs to an `end` element.
struct compiled_grammar {
  std::vector<std::string> rule_names;                   ///< [n_rules]
  std::vector<std::vector<std::uint32_t>> alternatives;  ///< [n_rules][n_alternatives of the rule]
  std::vector<element> elements;                         ///< all alternatives, each closed by `end`
  std::vector<char_class> classes;                       ///< referenced by char_class elements
  std::uint32_t root = 0;                                ///< index of the `root` rule

  std::size_t n_rules() const noexcept { return alternatives.size(); }
};

namespace detail {

inline void add_range(std::vector<std::pair<char32_t, char32_t>>& r, char32_t lo, char32_t hi) {
  if (lo <= hi) r.emplace_back(lo, hi);
}

/// Sorts and merges ranges, complements them when `negated`, fills the bitmap.
inline char_class make_class(std::vector<std::pair<char32_t, char32_t>> r, bool negated) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  if (negated) {
    std::vector<std::pair<char32_t, char32_t>> inv;
    char32_t next = 0;
    for (const auto& x : merged) {
      if (x.first > next) inv.emplace_back(next, x.first - 1);
      next = x.second + 1;
    }
    if (next <= 0x10FFFF) inv.emplace_back(next, 0x10FFFF);
    merged = std::move(inv);
  }
  char_class c;
  c.ranges = std::move(merged);
  for (const auto& x : c.ranges)
    for (char32_t cp = x.first; cp <= x.second && cp < 128; ++cp) c.ascii[cp >> 5] |= 1u << (cp & 31);
  return c;
}

// A sequence item before compilation: a class, a rule reference, or a group
// (alternatives of sequences), with its repetition bounds.
struct node {
  enum class kind { cls, ref, group } type = kind::cls;
  std::uint32_t index = 0;  // class or rule index
  std::vector<std::vector<node>> alts;
  std::uint32_t min = 1, max = 1;  // max == UINT32_MAX: unbounded
};

class gbnf_parser {
 public:
  gbnf_parser(std::string_view text, const compile_limits& limits) : s_(text), limits_(limits) {}

  compiled_grammar parse() {
    LLMKIT_CHECK(s_.size() <= limits_.max_source_bytes, "grammar: text of ", s_.size(), " bytes exceeds the limit of ",
                 limits_.max_source_bytes);
    std::vector<std::pair<std::uint32_t, std::vector<std::vector<node>>>> bodies;
    skip_space(true);
    while (pos_ < s_.size()) {
      const std::size_t name_at = pos_;
      const std::string name = parse_name();
      skip_space(false);
      if (s_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '", name, "'");
      pos_ += 3;
      skip_space(true);
      const std::uint32_t r = rule_index(name);
      LLMKIT_CHECK(!defined_[r], "grammar: ", where(name_at), ": rule '", name, "' is defined twice");
      defined_[r] = true;
      bodies.emplace_back(r, parse_alternatives(false));
      skip_space(false);
      if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') fail(pos_, "expected end of line after rule '", name, "'");
      skip_space(true);
    }
    for (std::size_t r = 0; r < names_.size(); ++r)
      if (!defined_[r]) fail(first_use_[r], "undefined rule '", names_[r], "'");
    auto root = index_.find("root");
    LLMKIT_CHECK(root != index_.end(), "grammar: no 'root' rule");
    return compile(bodies, root->second);
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(std::size_t at, const Parts&... parts) const {
    ::llmkit::detail::throw_error("grammar: ", where(at), ": ", parts...);
  }
  std::string where(std::size_t at) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }

  static bool is_name_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  // Skips blanks and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  std::string parse_name() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    if (pos_ == start) fail(start, "expected a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }
  std::uint32_t rule_index(const std::string& name) {
    auto [it, inserted] = index_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
    if (inserted) {
      LLMKIT_CHECK(names_.size() < limits_.max_rules, "grammar: more than ", limits_.max_rules, " rules");
      names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(pos_);
    }
    return it->second;
  }

  std::uint32_t parse_hex(std::size_t n_digits) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < n_digits; ++i) {
      if (pos_ >= s_.size()) fail(pos_, "expected ", n_digits, " hex digits");
      const char c = s_[pos_];
      std::uint32_t d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail(pos_, "expected a hex digit, got '", c, "'");
      v = v * 16 + d;
      ++pos_;
    }
    if (v > 0x10FFFF) fail(pos_, "code point ", v, " is beyond U+10FFFF");
    return v;
  }
  // One code point of a literal or class, escapes resolved.
  char32_t parse_char() {
    if (pos_ >= s_.size()) fail(pos_, "unexpected end of grammar");
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail(pos_, "unfinished escape");
      const char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return static_cast<char32_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: fail(pos_ - 2, "unknown escape '\\", e, "'");
      }
    }
    // UTF-8 decoding of the grammar's own text.
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > s_.size()) fail(pos_, "invalid UTF-8 in grammar");
    char32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (std::size_t i = 1; i < n; ++i) {
      const auto b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail(pos_, "invalid UTF-8 in grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += n;
    return cp;
  }

  std::uint32_t add_class(char_class c) {
    classes_.push_back(std::move(c));
    return static_cast<std::uint32_t>(classes_.size() - 1);
  }

  std::vector<std::vector<node>> parse_alternatives(bool nested) {
    std::vector<std::vector<node>> alts;
    alts.push_back(parse_sequence(nested));
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  std::uint32_t parse_count() {
    const std::size_t start = pos_;
    std::uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + static_cast<std::uint64_t>(s_[pos_] - '0');
      if (v > limits_.max_repetition) fail(start, "repetition count exceeds the limit of ", limits_.max_repetition);
      ++pos_;
    }
    if (pos_ == start) fail(start, "expected a number in '{m,n}'");
    return static_cast<std::uint32_t>(v);
  }

  std::vector<node> parse_sequence(bool nested) {
    std::vector<node> seq;
    for (;;) {
      if (pos_ >= s_.size()) break;
      const std::size_t at = pos_;
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        std::vector<node> chars;
        while (pos_ < s_.size() && s_[pos_] != '"') {
          if (s_[pos_] == '\n') fail(pos_, "unterminated literal");
          const char32_t cp = parse_char();
          node n;
          n.index = add_class(make_class({{cp, cp}}, false));
          chars.push_back(std::move(n));
        }
        if (pos_ >= s_.size()) fail(at, "unterminated literal");
        ++pos_;
        std::size_t next = pos_;
        while (next < s_.size() && (s_[next] == ' ' || s_[next] == '\t')) ++next;
        const bool repeated = next < s_.size() && (s_[next] == '*' || s_[next] == '+' || s_[next] == '?' || s_[next] == '{');
        if (repeated && chars.size() > 1) {
          // A repetition applies to the whole literal, as in llama.cpp ("ab"? is "ab" or nothing).
          node n;
          n.type = node::kind::group;
          n.alts.push_back(std::move(chars));
          seq.push_back(std::move(n));
        } else {
          for (node& n : chars) seq.push_back(std::move(n));
        }
      } else if (c == '[') {
        ++pos_;
        bool negated = false;
        if (pos_ < s_.size() && s_[pos_] == '^') {
          negated = true;
          ++pos_;
        }
        std::vector<std::pair<char32_t, char32_t>> ranges;
        while (pos_ < s_.size() && s_[pos_] != ']') {
          if (s_[pos_] == '\n') fail(pos_, "unterminated character class");
          const char32_t lo = parse_char();
          char32_t hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            const std::size_t hi_at = pos_;
            hi = parse_char();
            if (hi < lo) fail(hi_at, "range end U+", static_cast<std::uint32_t>(hi), " is below its start U+",
                              static_cast<std::uint32_t>(lo));
          }
          add_range(ranges, lo, hi);
        }
        if (pos_ >= s_.size()) fail(at, "unterminated character class");
        ++pos_;
        node n;
        n.index = add_class(make_class(std::move(ranges), negated));
        if (classes_.back().ranges.empty()) fail(at, "character class matches nothing");
        seq.push_back(std::move(n));
      } else if (c == '.') {
        ++pos_;
        node n;
        n.index = add_class(make_class({{0, 0x10FFFF}}, false));
        seq.push_back(std::move(n));
      } else if (is_name_char(c)) {
        const std::size_t save = pos_;
        const std::string name = parse_name();
        std::size_t look = pos_;
        while (look < s_.size() && (s_[look] == ' ' || s_[look] == '\t')) ++look;
        if (s_.substr(look, 3) == "::=") {
          pos_ = save;  // the next rule starts here: this sequence has ended
          if (nested) fail(save, "missing ')' before rule '", name, "'");
          break;
        }
        node n;
        n.type = node::kind::ref;
        n.index = rule_index(name);
        if (first_use_[n.index] == pos_) first_use_[n.index] = save;
        seq.push_back(std::move(n));
      } else if (c == '(') {
        if (++nesting_ > limits_.max_nesting) fail(at, "parentheses nested deeper than ", limits_.max_nesting);
        ++pos_;
        skip_space(true);
        node n;
        n.type = node::kind::group;
        n.alts = parse_alternatives(true);
        if (pos_ >= s_.size() || s_[pos_] != ')') fail(at, "unclosed '('");
        ++pos_;
        --nesting_;
        seq.push_back(std::move(n));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (seq.empty()) fail(at, "'", c, "' follows nothing");
        node& last = seq.back();
        if (last.min != 1 || last.max != 1) fail(at, "'", c, "' follows a repetition (group it first)");
        ++pos_;
        if (c == '*') last.min = 0, last.max = UINT32_MAX;
        else if (c == '+') last.min = 1, last.max = UINT32_MAX;
        else if (c == '?') last.min = 0, last.max = 1;
        else {
          skip_space(false);
          last.min = parse_count();
          skip_space(false);
          last.max = last.min;
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            skip_space(false);
            last.max = (pos_ < s_.size() && s_[pos_] == '}') ? UINT32_MAX : parse_count();
            skip_space(false);
          }
          if (pos_ >= s_.size() || s_[pos_] != '}') fail(pos_, "expected '}' closing '{m,n}'");
          ++pos_;
          if (last.max < last.min) fail(at, "repetition {", last.min, ",", last.max, "} has max below min");
        }
      } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
        if (c == ')' && !nested) fail(at, "unmatched ')'");
        if ((c == '\n' || c == '\r') && nested) {
          skip_space(true);
          continue;
        }
        break;
      } else {
        fail(at, "unexpected character '", c, "'");
      }
      skip_space(nested);
    }
    return seq;
  }

  // ---- compilation: nodes to elements, repetitions to helper rules ----

  std::uint32_t new_rule(const std::string& base) {
    LLMKIT_CHECK(rules_.size() < limits_.max_rules, "grammar: more than ", limits_.max_rules,
                 " rules after expanding repetitions");
    rules_.emplace_back();
    rule_names_.push_back(base + "_" + std::to_string(rules_.size()));
    return static_cast<std::uint32_t>(rules_.size() - 1);
  }
  void count(std::size_t n) {
    n_elements_ += n;
    LLMKIT_CHECK(n_elements_ <= limits_.max_elements, "grammar: more than ", limits_.max_elements,
                 " elements after expanding repetitions (a large {m,n} or deep nesting)");
  }

  // Appends the elements of one unrepeated item to `out`.
  void emit_once(const node& n, std::vector<element>& out, const std::string& base) {
    switch (n.type) {
      case node::kind::cls: out.push_back({element::kind::char_class, n.index}); break;
      case node::kind::ref: out.push_back({element::kind::rule_ref, n.index}); break;
      case node::kind::group: {
        if (n.alts.size() == 1) {
          for (const node& m : n.alts[0]) emit(m, out, base);
        } else {
          const std::uint32_t r = new_rule(base);
          std::vector<std::vector<element>> alts;
          for (const auto& a : n.alts) {
            std::vector<element> e;
            for (const node& m : a) emit(m, e, base);
            alts.push_back(std::move(e));
          }
          rules_[r] = std::move(alts);
          out.push_back({element::kind::rule_ref, r});
        }
        break;
      }
    }
    count(1);
  }
  // Rule `R ::= x R | ` (x repeated any number of times, tail-called).
  std::uint32_t star_rule(const node& once, const std::string& base) {
    const std::uint32_t r = new_rule(base);
    std::vector<element> a;
    emit_once(once, a, base);
    a.push_back({element::kind::rule_ref, r});
    rules_[r] = {std::move(a), {}};
    return r;
  }
  void emit(const node& n, std::vector<element>& out, const std::string& base) {
    if (n.min == 1 && n.max == 1) return emit_once(n, out, base);
    node once = n;
    once.min = once.max = 1;
    for (std::uint32_t i = 0; i < n.min; ++i) emit_once(once, out, base);
    if (n.max == UINT32_MAX) {
      out.push_back({element::kind::rule_ref, star_rule(once, base)});
      count(1);
    } else if (n.max > n.min) {
      // Nested optionals: R_k ::= x R_{k-1} | , built from the innermost out.
      std::uint32_t inner = UINT32_MAX;
      for (std::uint32_t k = 0; k < n.max - n.min; ++k) {
        const std::uint32_t r = new_rule(base);
        std::vector<element> a;
        emit_once(once, a, base);
        if (inner != UINT32_MAX) a.push_back({element::kind::rule_ref, inner});
        rules_[r] = {std::move(a), {}};
        inner = r;
      }
      out.push_back({element::kind::rule_ref, inner});
      count(1);
    }
  }

  compiled_grammar compile(const std::vector<std::pair<std::uint32_t, std::vector<std::vector<node>>>>& bodies,
                           std::uint32_t root) {
    rules_.assign(names_.size(), {});
    rule_names_ = names_;
    for (const auto& [r, alts] : bodies) {
      std::vector<std::vector<element>> out;
      for (const auto& a : alts) {
        std::vector<element> e;
        for (const node& n : a) emit(n, e, names_[r]);
        out.push_back(std::move(e));
      }
      rules_[r] = std::move(out);
    }
    compiled_grammar g;
    g.rule_names = std::move(rule_names_);
    g.classes = std::move(classes_);
    g.root = root;
    for (auto& alts : rules_) {
      std::vector<std::uint32_t> starts;
      for (auto& a : alts) {
        starts.push_back(static_cast<std::uint32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), a.begin(), a.end());
        g.elements.push_back({element::kind::end, 0});
      }
      g.alternatives.push_back(std::move(starts));
    }
    check_left_recursion(g);
    return g;
  }

  // A rule is nullable when some alternative's elements are all nullable
  // rules; left recursion is a cycle through references reachable before
  // anything is consumed.
  static void check_left_recursion(const compiled_grammar& g) {
    const std::size_t n = g.n_rules();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (std::uint32_t s : g.alternatives[r]) {
          bool all = true;
          for (std::uint32_t p = s; g.elements[p].type != element::kind::end; ++p)
            if (g.elements[p].type == element::kind::char_class || !nullable[g.elements[p].value]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<std::uint32_t>> first(n);  // rules reachable at the left edge
    for (std::size_t r = 0; r < n; ++r)
      for (std::uint32_t s : g.alternatives[r])
        for (std::uint32_t p = s; g.elements[p].type == element::kind::rule_ref; ++p) {
          first[r].push_back(g.elements[p].value);
          if (!nullable[g.elements[p].value]) break;
        }
    // Iterative DFS for a cycle (0 unvisited, 1 on the path, 2 done).
    std::vector<char> mark(n, 0);
    for (std::size_t start = 0; start < n; ++start) {
      if (mark[start]) continue;
      std::vector<std::pair<std::uint32_t, std::size_t>> path{{static_cast<std::uint32_t>(start), 0}};
      mark[start] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i < first[r].size()) {
          const std::uint32_t next = first[r][i++];
          if (mark[next] == 1)
            ::llmkit::detail::throw_error("grammar: rule '", g.rule_names[next],
                                          "' is left-recursive (it can reach itself without consuming input); "
                                          "rewrite it with repetition, e.g. 'list ::= item (\",\" item)*'");
          if (mark[next] == 0) {
            mark[next] = 1;
            path.emplace_back(next, 0);
          }
        } else {
          mark[r] = 2;
          path.pop_back();
        }
      }
    }
  }

  std::string_view s_;
  compile_limits limits_;
  std::size_t pos_ = 0;
  std::map<std::string, std::uint32_t, std::less<>> index_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<std::size_t> first_use_;
  std::vector<char_class> classes_;
  std::vector<std::vector<std::vector<element>>> rules_;
  std::vector<std::string> rule_names_;
  std::size_t n_elements_ = 0;
  std::size_t nesting_ = 0;
};

}  // namespace detail

/// Parses and compiles GBNF text.
/// @throws llmkit::error naming the line and column of the first syntax
/// error, an undefined rule, a missing `root`, left recursion, or a limit
/// of `limits` exceeded.
inline compiled_grammar parse_gbnf(std::string_view text, const compile_limits& limits = {}) {
  return detail::gbnf_parser(text, limits).parse();
}

}  // namespace llmkit::grammar
