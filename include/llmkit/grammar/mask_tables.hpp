// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/mask_tables.hpp
/// Per stack top, the tokens whose fate does not depend on the rest of the
/// stack (XGrammar's adaptive token mask cache, built for the pushdown
/// automaton).
///
/// A stack `[..., r, c]` (character class c on top, return address r below
/// it) reads a token's bytes inside those two frames until both have ended;
/// only then does the rest of the stack matter. So reading every token from
/// the position `[r, c]` alone (`automaton::stack_state`) sorts the
/// vocabulary once per top pair:
///
/// - *accepted*: the bytes are read whole (the frames may end exactly at the
///   last byte). Accepted under any stack, as the rest is never reached or is
///   reached with nothing left to read;
/// - *rejected*: the bytes die before the frames could end. Rejected under
///   any stack;
/// - *dependent*: the bytes die after a prefix at which the frames could
///   end: what lies below decides, so these are checked at run time against
///   the real position.
///
/// Two frames rather than one because small rules end almost at once: a
/// JSON string character is a rule of one code point and whitespace a
/// nullable rule, so from `[c]` alone nearly every token would depend on the
/// stack, while from `[r, c]` only those leaving the string (holding a quote)
/// or the whitespace (`" \"name"`) do. The pairs are enumerated from the
/// grammar: r follows a rule reference that is not last in its alternative,
/// and c is a class of the referenced rule or of a rule it reaches by tail
/// calls. A stack of one frame, or a pair not listed, uses the table of `[c]`.
/// The first pairs are read when the tables are built, the others on first
/// use (`at`), so a grammar with many pairs keeps its build time bounded.
///
/// A position's mask is then the accepted set of each of its tops plus the
/// dependent tokens that pass from the real position. Dependent tokens are
/// kept in trie (byte) order with the length each shares with the previous
/// one, so the run-time check reuses the positions of the common prefix
/// instead of re-reading it. A table with more than `max_dependent` of them
/// (a string one character short of its maxLength: every longer token
/// depends on what follows) stores none and is marked for the full trie walk.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/automaton.hpp"
#include "llmkit/grammar/token_mask.hpp"
#include "llmkit/grammar/token_vocabulary.hpp"

namespace llmkit::grammar {

/// What the tokens do from one stack top (see the file comment).
struct element_tokens {
  token_mask accepted;                 ///< accepted under any stack
  std::vector<std::uint32_t> dependent;  ///< [n] tokens to check against the stack, as ascending indices
                                        ///< into `vocabulary_trie::node_tokens()` (trie order)
  std::vector<std::uint32_t> ends_at;    ///< [n] offset in `ends` of each dependent token's end points
  std::vector<std::uint16_t> ends;       ///< byte counts after which the frames may end, each list closed by 0
  std::uint8_t frames = 1;               ///< frames the table reads: 1 for `[c]`, 2 for `[r, c]`
  bool walk = false;                   ///< too many dependent tokens: positions with this top walk the trie
};

/// The tables of one grammar over one vocabulary (see the file comment).
class mask_tables {
 public:
  /// Marks "no frame below" (automaton::no_frame).
  static constexpr std::uint32_t no_frame = automaton::no_frame;

  /// Pairs considered at most (beyond them, stacks use `[c]`).
  static constexpr std::size_t max_pairs = 1u << 14;
  /// Pairs read when the tables are built; the others are read on their
  /// first use. Reading all of them up front costs as much as a few
  /// thousand trie walks for a grammar with long bounded repetitions (each
  /// copy of `[ \t\n]{0,20}` is a pair of its own), most of them never met.
  static constexpr std::size_t default_eager_pairs = 1024;

  mask_tables() : mutex_(std::make_unique<std::mutex>()) {}

  /// Reads the vocabulary from every character class `[c]` and from the
  /// first `eager_pairs` top pairs `[r, c]` worth it; the other pairs are
  /// read by `at` on first use. Keeps pointers to `a` and `v`: both must
  /// outlive the tables (token_masker holds them).
  /// @param max_dependent  dependent tokens kept per table; 0 means
  ///                       n_vocab / 8 (beyond it the full walk is as cheap).
  /// @throws llmkit::error if the automaton exceeds its limits.
  mask_tables(const automaton& a, const token_vocabulary& v, std::size_t max_dependent = 0,
              std::size_t eager_pairs = default_eager_pairs)
      : a_(&a), v_(&v), max_dependent_(max_dependent == 0 ? v.size() / 8 : max_dependent),
        mutex_(std::make_unique<std::mutex>()) {
    const compiled_grammar& g = a.grammar();
    for (std::uint32_t c = 0; c < g.elements.size(); ++c)
      if (g.elements[c].type == element::kind::char_class) read(no_frame, c);
    std::size_t n_eager = 0;
    for (const auto& [r, c] : top_pairs(g, max_pairs)) {
      // A pair is worth a table only when `[c]` leaves many tokens to the stack.
      const element_tokens& single = entries_[index_.at(key(no_frame, c))];
      if (!single.walk && single.dependent.size() <= pair_threshold) continue;
      if (n_eager < eager_pairs && room()) {
        read(r, c);
        ++n_eager;
      } else {
        deferred_.insert(key(r, c));
      }
    }
  }

  /// The table of a stack whose top is `top` with `below` under it
  /// (no_frame: nothing), reading it now on its first use.
  /// @pre top is the offset of a char_class element of the grammar.
  /// @throws llmkit::error if reading a deferred pair exceeds the automaton's limits.
  const element_tokens& at(std::uint32_t below, std::uint32_t top) const {
    std::lock_guard lock(*mutex_);
    auto it = index_.find(key(below, top));
    if (it != index_.end()) return entries_[it->second];
    if (auto d = deferred_.find(key(below, top)); d != deferred_.end()) {
      deferred_.erase(d);
      // Pairs stop before their positions crowd out the automaton's run-time ones.
      if (room()) return entries_[read(below, top)];
    }
    return entries_[index_.find(key(no_frame, top))->second];
  }
  /// The table of `[top]` alone.
  const element_tokens& at(std::uint32_t top) const { return at(no_frame, top); }
  /// Tables read so far (classes and top pairs).
  std::size_t size() const {
    std::lock_guard lock(*mutex_);
    return entries_.size();
  }
  /// Pairs left to read on first use.
  std::size_t n_deferred() const {
    std::lock_guard lock(*mutex_);
    return deferred_.size();
  }
  /// Tables whose positions take the full walk.
  std::size_t n_walk() const {
    std::lock_guard lock(*mutex_);
    std::size_t n = 0;
    for (const auto& e : entries_) n += e.walk ? 1 : 0;
    return n;
  }
  /// Bytes held by the tables read so far.
  std::size_t memory_bytes() const {
    std::lock_guard lock(*mutex_);
    std::size_t n = (index_.size() + deferred_.size()) * (sizeof(std::uint64_t) + sizeof(std::uint32_t) + 2 * sizeof(void*)) +
                    entries_.size() * sizeof(element_tokens);
    for (const auto& e : entries_)
      n += e.accepted.memory_bytes() + (e.dependent.capacity() + e.ends_at.capacity()) * sizeof(std::uint32_t) +
           e.ends.capacity() * sizeof(std::uint16_t);
    return n;
  }

 private:
  static constexpr std::size_t pair_threshold = 64;  // dependent tokens of `[c]` that make `[r, c]` worth reading

  static std::uint64_t key(std::uint32_t below, std::uint32_t top) noexcept {
    return (static_cast<std::uint64_t>(below) << 32) | top;
  }

  // The (r, c) pairs of the file comment, at most `limit`.
  static std::vector<std::array<std::uint32_t, 2>> top_pairs(const compiled_grammar& g, std::size_t limit) {
    const std::size_t n_rules = g.n_rules();
    std::vector<std::vector<std::uint32_t>> classes(n_rules), tail_refs(n_rules);
    for (std::uint32_t r = 0; r < n_rules; ++r)
      for (std::uint32_t p : g.alternatives[r])
        for (; g.elements[p].type != element::kind::end; ++p) {
          if (g.elements[p].type == element::kind::char_class) classes[r].push_back(p);
          else if (g.elements[p + 1].type == element::kind::end) tail_refs[r].push_back(g.elements[p].value);
        }
    std::vector<std::array<std::uint32_t, 2>> out;
    std::vector<std::uint32_t> reach_of(n_rules, UINT32_MAX);  // reach_of[x] == r when x was reached for r
    std::vector<std::uint32_t> todo;
    for (std::uint32_t q = 0; q + 1 < g.elements.size(); ++q) {
      if (g.elements[q].type != element::kind::rule_ref || g.elements[q + 1].type == element::kind::end) continue;
      const std::uint32_t r = q + 1;
      todo.assign(1, g.elements[q].value);
      reach_of[todo[0]] = r;
      while (!todo.empty()) {
        const std::uint32_t x = todo.back();
        todo.pop_back();
        for (std::uint32_t c : classes[x]) {
          if (out.size() >= limit) return out;
          out.push_back({r, c});
        }
        for (std::uint32_t y : tail_refs[x])
          if (reach_of[y] != r) {
            reach_of[y] = r;
            todo.push_back(y);
          }
      }
    }
    return out;
  }

  template <class Step, class CanEnd>
  static element_tokens classify(const token_vocabulary& v, state_id start, std::size_t max_dependent, Step& step,
                                 CanEnd& can_end) {
    const std::size_t n_vocab = v.size();
    const auto& nodes = v.trie.nodes();
    const auto& toks = v.trie.node_tokens();
    std::vector<state_id> at(v.trie.max_depth() + 1);
    std::vector<std::uint8_t> could_end(v.trie.max_depth() + 1);  // some prefix up to this depth ends the frames
    std::vector<std::uint32_t> dep;                                // dependent tokens, as node_tokens indices
    element_tokens out;
    constexpr std::size_t no_depth = ~std::size_t{0};
    std::size_t ends_parent = no_depth;  // depth whose path the last end list belongs to
    std::uint32_t ends_first = 0;
    token_bitset acc((n_vocab + 63) / 64, 0);
    at[0] = start;
    could_end[0] = 0;
    for (std::size_t i = 0; i < nodes.size();) {
      const auto& nd = nodes[i];
      const state_id next = step(at[nd.depth - 1], nd.byte);
      if (next == dead_state) {
        if (could_end[nd.depth - 1] && dep.size() <= max_dependent) {
          // The subtree's tokens share the path to here, so its end points
          // too, and so do the dead siblings that follow.
          if (ends_parent != nd.depth - 1u) {
            ends_parent = nd.depth - 1u;
            ends_first = static_cast<std::uint32_t>(out.ends.size());
            for (std::size_t j = 1; j < nd.depth; ++j)
              if (can_end(at[j])) out.ends.push_back(static_cast<std::uint16_t>(j));
            out.ends.push_back(0);
          }
          const std::uint32_t first = ends_first;
          const auto [lo, hi] = v.trie.subtree_tokens(i);
          for (std::uint32_t k = lo; k < hi; ++k) {
            dep.push_back(k);
            out.ends_at.push_back(first);
          }
        }
        i = nd.subtree_end;
        continue;
      }
      at[nd.depth] = next;
      could_end[nd.depth] = could_end[nd.depth - 1] | static_cast<std::uint8_t>(can_end(next));
      if (ends_parent != no_depth && ends_parent >= nd.depth) ends_parent = no_depth;  // that path changed
      for (std::uint32_t k = nd.tokens_begin; k < nd.tokens_end; ++k) set_bit(acc, toks[k]);
      ++i;
    }
    out.accepted = token_mask::from_bitset(std::move(acc), n_vocab);
    if (dep.size() > max_dependent) {
      out.walk = true;
      out.ends_at = {};
      out.ends = {};
      return out;
    }
    out.dependent.assign(dep.begin(), dep.end());
    return out;
  }

  bool room() const { return a_->n_states() <= a_->limits().max_states / 2; }

  // Reads the table of (below, top) and returns its index in entries_.
  std::uint32_t read(std::uint32_t below, std::uint32_t top) const {
    const std::uint32_t frames[2] = {below, top};
    const state_id start = below == no_frame ? a_->stack_state(std::span(frames + 1, 1)) : a_->stack_state(frames);
    element_tokens e =
        a_->with_lock([&](auto step, auto can_end) { return classify(*v_, start, max_dependent_, step, can_end); });
    e.frames = below == no_frame ? 1 : 2;
    entries_.push_back(std::move(e));
    const auto i = static_cast<std::uint32_t>(entries_.size() - 1);
    index_.emplace(key(below, top), i);
    return i;
  }

  const automaton* a_ = nullptr;
  const token_vocabulary* v_ = nullptr;
  std::size_t max_dependent_ = 0;
  std::unique_ptr<std::mutex> mutex_;  // guards the three below (pairs are read on first use)
  mutable std::unordered_map<std::uint64_t, std::uint32_t> index_;  // key(below, top) -> entries_
  mutable std::deque<element_tokens> entries_;                      // a deque: references stay valid as it grows
  mutable std::unordered_set<std::uint64_t> deferred_;              // pairs not read yet
};

}  // namespace llmkit::grammar
