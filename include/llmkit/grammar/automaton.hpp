// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/automaton.hpp
/// A byte-level matcher for a compiled grammar, built lazily as a
/// deterministic automaton.
///
/// A matcher position is the set of *stacks* of a pushdown recogniser (as
/// llama.cpp's grammar sampler keeps them): each stack lists element offsets
/// into `compiled_grammar::elements`, its top the character class expected
/// next, the rest return addresses; an empty stack means the input so far is
/// a complete sentence. Reading a code point keeps the stacks whose top class
/// contains it, advances them and expands rule references at the new tops.
/// Bytes are read one at a time: a partial UTF-8 sequence is part of the
/// position, and it survives only while some stack top can still match one
/// of the code points it may complete to.
///
/// Positions are interned: each distinct position gets a `state_id`, and the
/// transition on each byte is computed once and then read from a table. So a
/// matcher's state is one integer (copy it to fork a beam, keep a vector of
/// them to roll back a speculative draft), and walking a vocabulary trie costs
/// a table lookup per byte once the states it meets are known. Memory is
/// bounded by `automaton_limits` (an error, never unbounded growth).
///
/// Thread safety: `step` and `can_end` may be called from several threads
/// (one mutex guards the tables).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/grammar/gbnf.hpp"

namespace llmkit::grammar {

/// An interned matcher position.
using state_id = std::uint32_t;
/// `step` result when the byte cannot continue the input.
inline constexpr state_id dead_state = 0xFFFFFFFFu;

/// Bounds on a matcher's work and memory.
struct automaton_limits {
  std::size_t max_states = 1u << 15;       ///< interned positions (each holds a 1 KiB transition row)
  std::size_t max_stacks = 1u << 12;       ///< stacks in one position (ambiguous grammars)
  std::size_t max_stack_depth = 1u << 10;  ///< nesting depth of one stack
};

/// The lazily built automaton of a grammar (see the file comment).
class automaton {
 public:
  /// @throws llmkit::error if the start position exceeds `limits`.
  explicit automaton(compiled_grammar g, automaton_limits limits = {}) : g_(std::move(g)), limits_(limits) {
    std::vector<std::vector<std::uint32_t>> stacks;
    for (std::uint32_t s : g_.alternatives[g_.root]) expand({s}, stacks);
    std::lock_guard lock(mutex_);
    start_ = intern(normalise(std::move(stacks)), 0, 0, 0);
  }

  const compiled_grammar& grammar() const noexcept { return g_; }
  /// The position before any input.
  state_id start() const noexcept { return start_; }

  /// The position after reading `byte` in position `s`, or `dead_state`.
  /// @pre s is a state of this automaton (not dead_state).
  /// @throws llmkit::error when a limit of `automaton_limits` is exceeded.
  state_id step(state_id s, std::uint8_t byte) const {
    std::lock_guard lock(mutex_);
    return step_locked(s, byte);
  }
  /// The position after reading `bytes`, or `dead_state`.
  state_id advance(state_id s, std::string_view bytes) const {
    std::lock_guard lock(mutex_);
    for (char c : bytes) {
      s = step_locked(s, static_cast<std::uint8_t>(c));
      if (s == dead_state) break;
    }
    return s;
  }
  /// True when the input read to `s` is a complete sentence of the grammar.
  bool can_end(state_id s) const {
    std::lock_guard lock(mutex_);
    return states_[s].can_end;
  }
  const automaton_limits& limits() const noexcept { return limits_; }
  /// Interned positions so far.
  std::size_t n_states() const {
    std::lock_guard lock(mutex_);
    return states_.size();
  }

  /// The position whose only stack is `frames` (bottom first, a character
  /// class on top): nothing below it. Reading from it tells what a token does
  /// inside those frames whatever the stack below is (see mask_tables.hpp).
  /// @throws llmkit::error if `frames` is empty, names an element outside the
  /// grammar, or its top is not a character class.
  state_id stack_state(std::span<const std::uint32_t> frames) const {
    LLMKIT_CHECK(!frames.empty(), "automaton::stack_state: no frames");
    for (std::uint32_t p : frames)
      LLMKIT_CHECK(p < g_.elements.size() && g_.elements[p].type != element::kind::end,
                   "automaton::stack_state: element ", p, " is outside the grammar or an alternative's end");
    LLMKIT_CHECK(g_.elements[frames.back()].type == element::kind::char_class, "automaton::stack_state: top element ",
                 frames.back(), " is not a character class");
    std::lock_guard lock(mutex_);
    return intern({stack(frames.begin(), frames.end())}, 0, 0, 0);
  }
  /// Copies the stacks of `s` (each bottom first) to `out`; false (and
  /// nothing copied) when `s` is inside a UTF-8 sequence.
  bool stacks(state_id s, std::vector<std::vector<std::uint32_t>>& out) const {
    std::lock_guard lock(mutex_);
    const state& st = states_[s];
    if (st.remaining != 0) return false;
    out.assign(st.stacks.begin(), st.stacks.end());
    return true;
  }
  /// The position where a stack `rest` (bottom first) resumes its top frame:
  /// what follows once the frames above it have ended. An empty `rest` is
  /// the end of the input.
  /// @throws llmkit::error if `rest` names an element outside the grammar.
  state_id resume_state(std::span<const std::uint32_t> rest) const {
    for (std::uint32_t p : rest)
      LLMKIT_CHECK(p < g_.elements.size(), "automaton::resume_state: element ", p, " is outside the grammar");
    std::vector<stack> out;
    expand(stack(rest.begin(), rest.end()), out);
    std::lock_guard lock(mutex_);
    return intern(normalise(std::move(out)), 0, 0, 0);
  }
  /// Marks "no frame below the top" in `stack_tops`.
  static constexpr std::uint32_t no_frame = 0xFFFFFFFFu;
  /// Appends to `out` the distinct (frame below the top, top) pairs of the
  /// non-empty stacks of `s`, ascending, with `no_frame` below a stack of one
  /// frame; false (and nothing appended) when `s` is inside a UTF-8 sequence.
  bool stack_tops(state_id s, std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) const {
    std::lock_guard lock(mutex_);
    const state& st = states_[s];
    if (st.remaining != 0) return false;
    const std::size_t first = out.size();
    for (const stack& x : st.stacks)
      if (!x.empty()) out.emplace_back(x.size() > 1 ? x[x.size() - 2] : no_frame, x.back());
    std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    out.erase(std::unique(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()), out.end());
    return true;
  }

  /// Runs `f(step)` under the lock, where `step(state, byte)` is the unlocked
  /// transition: lets a vocabulary walk take the lock once.
  template <class F>
  decltype(auto) with_lock(F&& f) const {
    std::lock_guard lock(mutex_);
    return f([this](state_id s, std::uint8_t b) { return step_locked(s, b); },
             [this](state_id s) { return states_[s].can_end; });
  }

 private:
  using stack = std::vector<std::uint32_t>;
  struct state {
    std::vector<stack> stacks;  // sorted, unique
    char32_t partial = 0;       // code point bits read so far of an unfinished UTF-8 sequence
    std::uint8_t remaining = 0; // continuation bytes still expected
    std::uint8_t length = 0;    // bytes of the whole sequence
    bool can_end = false;
    std::unique_ptr<std::array<state_id, 256>> next;  // transitions; unknown_state until computed
  };
  static constexpr state_id unknown_state = 0xFFFFFFFEu;

  // Expands the top of `st` until it is a character class or the stack is
  // empty, appending the results to `out`. Left recursion is refused at
  // compile time, so this terminates; depth and count are still bounded.
  void expand(stack st, std::vector<stack>& out, std::size_t depth = 0) const {
    // Recursion depth: chains of references at the left edge (bounded by the
    // rule count) plus returns (bounded by the stack depth).
    LLMKIT_CHECK(depth <= 2 * limits_.max_stack_depth, "grammar: expanding a position went deeper than ",
                 2 * limits_.max_stack_depth, " references (a long chain of rules)");
    if (st.empty()) {
      out.push_back(std::move(st));
      return;
    }
    LLMKIT_CHECK(st.size() <= limits_.max_stack_depth, "grammar: matcher stack deeper than ",
                 limits_.max_stack_depth, " (input nested too deeply)");
    const std::uint32_t p = st.back();
    const element& e = g_.elements[p];
    switch (e.type) {
      case element::kind::char_class: out.push_back(std::move(st)); break;
      case element::kind::end:
        st.pop_back();
        expand(std::move(st), out, depth + 1);
        break;
      case element::kind::rule_ref: {
        st.pop_back();
        // Tail call: no return address when the reference ends its alternative.
        if (g_.elements[p + 1].type != element::kind::end) st.push_back(p + 1);
        for (std::uint32_t a : g_.alternatives[e.value]) {
          stack next = st;
          next.push_back(a);
          expand(std::move(next), out, depth + 1);
        }
        break;
      }
    }
    LLMKIT_CHECK(out.size() <= limits_.max_stacks * 4, "grammar: more than ", limits_.max_stacks,
                 " matcher stacks at one position (the grammar is too ambiguous)");
  }
  std::vector<stack> normalise(std::vector<stack> stacks) const {
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
    LLMKIT_CHECK(stacks.size() <= limits_.max_stacks, "grammar: more than ", limits_.max_stacks,
                 " matcher stacks at one position (the grammar is too ambiguous)");
    return stacks;
  }

  state_id intern(std::vector<stack> stacks, char32_t partial, std::uint8_t remaining, std::uint8_t length) const {
    std::string key;
    key.reserve(8 + stacks.size() * 16);
    auto put = [&key](std::uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(partial);
    put(remaining | (static_cast<std::uint32_t>(length) << 8));
    for (const stack& s : stacks) {
      put(static_cast<std::uint32_t>(s.size()));
      for (std::uint32_t v : s) put(v);
    }
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
    LLMKIT_CHECK(states_.size() < limits_.max_states, "grammar: more than ", limits_.max_states,
                 " matcher states (raise automaton_limits::max_states or simplify the grammar)");
    state s;
    s.can_end = remaining == 0 && std::any_of(stacks.begin(), stacks.end(), [](const stack& x) { return x.empty(); });
    s.stacks = std::move(stacks);
    s.partial = partial;
    s.remaining = remaining;
    s.length = length;
    s.next = std::make_unique<std::array<state_id, 256>>();
    s.next->fill(unknown_state);
    const auto id = static_cast<state_id>(states_.size());
    states_.push_back(std::move(s));
    index_.emplace(std::move(key), id);
    return id;
  }

  state_id step_locked(state_id id, std::uint8_t byte) const {
    state_id& slot = (*states_[id].next)[byte];
    if (slot == unknown_state) slot = compute(id, byte);
    return slot;
  }

  // The valid code points [lo, hi] (none when lo > hi) that an unfinished
  // sequence of `length` bytes, `remaining` of them unread, may complete to:
  // overlong forms and surrogates excluded, as a strict UTF-8 decoder does.
  static std::pair<char32_t, char32_t> completions(char32_t bits, std::uint8_t remaining, std::uint8_t length) {
    static constexpr char32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    static constexpr char32_t max_of[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    const unsigned shift = 6u * remaining;
    char32_t lo = std::max<char32_t>(bits << shift, min_of[length]);
    char32_t hi = std::min<char32_t>((bits << shift) | ((1u << shift) - 1), max_of[length]);
    if (lo >= 0xD800 && hi <= 0xDFFF) return {1, 0};
    if (lo < 0xD800 && hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    return {lo, hi};
  }

  state_id compute(state_id id, std::uint8_t byte) const {
    const state& s = states_[id];
    char32_t cp;
    if (s.remaining == 0) {
      if (byte < 0x80) {
        cp = byte;
      } else {
        if ((byte & 0xE0) == 0xC0) return partial_state(s, byte & 0x1F, 1, 2);
        if ((byte & 0xF0) == 0xE0) return partial_state(s, byte & 0x0F, 2, 3);
        if ((byte & 0xF8) == 0xF0) return partial_state(s, byte & 0x07, 3, 4);
        return dead_state;  // a continuation byte without a lead, or an invalid lead
      }
    } else {
      if ((byte & 0xC0) != 0x80) return dead_state;
      const char32_t bits = (s.partial << 6) | (byte & 0x3F);
      if (s.remaining > 1) return partial_state(s, bits, static_cast<std::uint8_t>(s.remaining - 1), s.length);
      const auto [lo, hi] = completions(bits, 0, s.length);
      if (lo > hi) return dead_state;
      cp = bits;
    }
    std::vector<stack> next;
    for (const stack& st : s.stacks) {
      if (st.empty() || !g_.classes[g_.elements[st.back()].value].contains(cp)) continue;
      stack moved = st;
      moved.back() += 1;
      expand(std::move(moved), next);
    }
    if (next.empty()) return dead_state;
    return intern(normalise(std::move(next)), 0, 0, 0);
  }

  state_id partial_state(const state& s, char32_t bits, std::uint8_t remaining, std::uint8_t length) const {
    const auto [lo, hi] = completions(bits, remaining, length);
    if (lo > hi) return dead_state;
    std::vector<stack> alive;
    bool any_code_point = true;  // every live top takes every non-ASCII code point
    for (const stack& st : s.stacks) {
      if (st.empty()) continue;
      const char_class& c = g_.classes[g_.elements[st.back()].value];
      if (!c.intersects(lo, hi)) continue;
      alive.push_back(st);
      any_code_point = any_code_point && covers(c, 0x80, 0xD7FF) && covers(c, 0xE000, 0x10FFFF);
    }
    if (alive.empty()) return dead_state;
    // Then the bits read so far matter only if they restrict the next byte
    // (E0, ED, F0, F4 leads): otherwise one position per byte count serves
    // every prefix, instead of one per prefix in the vocabulary.
    if (any_code_point && next_byte_free(bits, remaining, length))
      bits = static_cast<char32_t>(length == 2 ? 2 : 1) << (6 * (length - 1 - remaining));
    return intern(std::move(alive), bits, remaining, length);
  }
  static bool covers(const char_class& c, char32_t lo, char32_t hi) {
    for (const auto& r : c.ranges)
      if (r.first <= lo && r.second >= hi) return true;
    return false;
  }
  // True when every continuation byte keeps the sequence valid.
  static bool next_byte_free(char32_t bits, std::uint8_t remaining, std::uint8_t length) {
    for (char32_t x = 0; x < 64; ++x) {
      const auto [lo, hi] = completions((bits << 6) | x, static_cast<std::uint8_t>(remaining - 1), length);
      if (lo > hi) return false;
    }
    return true;
  }

  compiled_grammar g_;
  automaton_limits limits_;
  mutable std::mutex mutex_;
  mutable std::vector<state> states_;
  mutable std::unordered_map<std::string, state_id> index_;
  state_id start_ = 0;
};

}  // namespace llmkit::grammar
