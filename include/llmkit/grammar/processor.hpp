// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/processor.hpp
/// `grammar_processor`: the logits processor that keeps generation inside a
/// grammar, masking (to -inf) every token that cannot continue it.
///
/// ```
/// auto vocab = grammar::token_vocabulary::from_tokenizer(tok);
/// auto masker = grammar::compile_cached(grammar::schema_to_gbnf(schema), vocab);
/// sampling::runtime_chain chain({grammar::grammar_processor(masker), sampling::temperature{1.0f}});
/// ```
///
/// The processor needs no "accept" hook: a processor already sees the
/// request's history, and the grammar position is a function of the
/// generated tokens. It keeps the positions after each generated token and,
/// at each step, resumes from the longest common prefix of what it saw last
/// and the current history. So a rejected speculative draft (history cut
/// back) rolls back for free, and a beam whose history differs re-advances
/// from where the histories part (a table lookup per byte). Put it first in
/// a chain: truncations before it could leave only tokens it forbids.
///
/// An object serves one request at a time (its positions are mutable state);
/// `token_masker`s are shared between requests.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/automaton.hpp"
#include "llmkit/grammar/gbnf.hpp"
#include "llmkit/grammar/token_mask.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::grammar {

/// See the file comment.
class grammar_processor {
 public:
  explicit grammar_processor(std::shared_ptr<const token_masker> masker) : masker_(std::move(masker)) {
    LLMKIT_CHECK(masker_ != nullptr, "grammar_processor: null masker");
    states_.push_back(masker_->grammar_automaton().start());
  }

  /// Masks the candidates the grammar forbids after the generated part of
  /// `ctx.history`.
  /// @throws llmkit::error if a generated token breaks the grammar, if the
  /// grammar allows no token, or if no allowed token is left among the
  /// candidates (processors before this one removed them all).
  void apply(sampling::candidates& c, const sampling::sampling_context& ctx) const {
    LLMKIT_CHECK(c.vocab_size() == masker_->vocab_size(), "grammar_processor: logits row has ", c.vocab_size(),
                 " entries, the grammar's vocabulary ", masker_->vocab_size());
    const state_id s = sync(ctx);
    const auto allowed = masker_->allowed(s);
    const token_mask& m = *allowed;
    std::size_t n_keep = 0;
    if (c.is_dense()) {
      n_keep = m.count();
    } else {
      for (std::size_t i = 0; i < c.size(); ++i) n_keep += m.contains(c.token(i)) ? 1 : 0;
    }
    LLMKIT_CHECK(n_keep > 0 || !c.is_dense(), "grammar_processor: the grammar allows no token after ",
                 ctx.n_generated(), " generated tokens");
    LLMKIT_CHECK(n_keep > 0, "grammar_processor: none of the ", c.size(),
                 " candidates left by earlier processors is allowed by the grammar (put the grammar first)");
    if (!c.is_dense()) {
      c.retain([&](std::size_t i) { return m.contains(c.token(i)); }, n_keep, false);
    } else {
      // Each form costs what it stores: gather the allowed entries, clear the
      // forbidden ones, or one pass over the row.
      constexpr float neg_inf = -std::numeric_limits<float>::infinity();
      float* v = c.values().data();
      switch (m.storage()) {
        case token_mask::form::allowed: {
          gathered_.resize(m.ids().size());
          for (std::size_t i = 0; i < gathered_.size(); ++i) gathered_[i] = v[static_cast<std::size_t>(m.ids()[i])];
          c.assign_sparse(m.ids(), gathered_, sampling::candidates::order::any);
          break;
        }
        case token_mask::form::forbidden:
          for (token_id t : m.ids()) v[static_cast<std::size_t>(t)] = neg_inf;
          c.values_changed();
          break;
        case token_mask::form::bitset: {
          const token_bitset& bits = m.bits();
          const std::size_t n = c.size();
          for (std::size_t w = 0; w * 64 < n; ++w) {
            const std::uint64_t word = bits[w];
            if (word == ~std::uint64_t{0}) continue;
            const std::size_t begin = w * 64, end = std::min(n, begin + 64);
            for (std::size_t i = begin; i < end; ++i) v[i] = ((word >> (i - begin)) & 1u) ? v[i] : neg_inf;
          }
          c.values_changed();
          break;
        }
      }
    }
    LLMKIT_CHECK(c.max() != -std::numeric_limits<float>::infinity(),
                 "grammar_processor: every token the grammar allows has logit -inf (removed by earlier processors)");
  }

  /// The position after the generated part of `ctx.history` (advancing or
  /// rolling back as needed).
  /// @throws llmkit::error if a generated token is not allowed by the grammar.
  state_id sync(const sampling::sampling_context& ctx) const {
    const std::span<const token_id> gen =
        ctx.history.size() > ctx.n_prompt ? ctx.history.subspan(ctx.n_prompt) : std::span<const token_id>{};
    std::size_t k = 0;
    while (k < tokens_.size() && k < gen.size() && tokens_[k] == gen[k]) ++k;
    tokens_.resize(k);
    states_.resize(k + 1);
    for (; k < gen.size(); ++k) {
      LLMKIT_CHECK(!masker_->vocabulary().is_eos(tokens_.empty() ? -1 : tokens_.back()),
                   "grammar_processor: tokens follow an end-of-sequence token at generated position ", k);
      const state_id next = masker_->advance(states_.back(), gen[k]);
      LLMKIT_CHECK(next != dead_state, "grammar_processor: generated token ", gen[k], " at position ", k,
                   " is not allowed by the grammar");
      tokens_.push_back(gen[k]);
      states_.push_back(next);
    }
    return states_.back();
  }

  /// True when the generated text so far is a complete sentence.
  bool can_end(const sampling::sampling_context& ctx) const { return masker_->grammar_automaton().can_end(sync(ctx)); }

  const token_masker& masker() const noexcept { return *masker_; }

 private:
  std::shared_ptr<const token_masker> masker_;
  mutable std::vector<token_id> tokens_;
  mutable std::vector<state_id> states_;
  mutable std::vector<float> gathered_;  // logits of the allowed tokens when the mask is a short list
};

/// Builds the first positions of `m`'s automaton ahead of use: the mask
/// of the start, then the positions reachable byte by byte, breadth first,
/// until `max_positions` are known. A grammar whose early positions exceed
/// the automaton's limits (ambiguity that multiplies stacks, nesting that
/// deepens them) fails here, when it is compiled, rather than in the
/// middle of a generation; the work is bounded by `max_positions` x 256
/// transitions.
/// @throws llmkit::error when a limit of `automaton_limits` is exceeded.
inline void warm_up(const token_masker& m, std::size_t max_positions = 256) {
  const automaton& a = m.grammar_automaton();
  (void)m.mask(a.start());
  std::vector<state_id> queue{a.start()};
  std::unordered_map<state_id, bool> seen{{a.start(), true}};
  for (std::size_t head = 0; head < queue.size() && seen.size() < max_positions; ++head)
    for (unsigned b = 0; b < 256 && seen.size() < max_positions; ++b) {
      const state_id next = a.step(queue[head], static_cast<std::uint8_t>(b));
      if (next != dead_state && seen.emplace(next, true).second) queue.push_back(next);
    }
}

/// Compiles GBNF `text` for `vocab`, reusing the masker of an earlier call
/// with the same text, vocabulary object and limits (and so its automaton
/// and mask caches). With `warm_up_positions` > 0 a new masker is first
/// warmed up (`warm_up`), and only one that passes is kept: a grammar that
/// fails a limit frees what it built. Thread-safe; the cache keeps up to 64
/// grammars, then restarts.
/// @throws llmkit::error as parse_gbnf, the automaton's constructor and
/// `warm_up` do.
inline std::shared_ptr<const token_masker> compile_cached(const std::string& text,
                                                          const std::shared_ptr<const token_vocabulary>& vocab,
                                                          const compile_limits& limits = {},
                                                          const automaton_limits& positions = {},
                                                          std::size_t warm_up_positions = 0) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<const token_masker>> cache;
  LLMKIT_CHECK(vocab != nullptr, "compile_cached: null vocabulary");
  std::string key = text;
  key += '\0';
  for (std::size_t v : {static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(vocab.get())), limits.max_rules,
                        limits.max_elements, static_cast<std::size_t>(limits.max_repetition), limits.max_source_bytes,
                        limits.max_nesting, positions.max_states, positions.max_stacks, positions.max_stack_depth,
                        warm_up_positions})
    key += std::to_string(v) + ',';
  {
    std::lock_guard lock(mutex);
    if (auto it = cache.find(key); it != cache.end() && &it->second->vocabulary() == vocab.get()) return it->second;
  }
  auto masker = std::make_shared<const token_masker>(
      std::make_shared<const automaton>(parse_gbnf(text, limits), positions), vocab);
  if (warm_up_positions > 0) warm_up(*masker, warm_up_positions);
  std::lock_guard lock(mutex);
  if (cache.size() >= 64) cache.clear();
  cache.emplace(std::move(key), masker);
  return masker;
}

}  // namespace llmkit::grammar
