// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/token_masker.hpp
/// Token masks: which tokens of a vocabulary can continue a grammar position.
///
/// Token t is allowed when its bytes take the automaton from the position to
/// a live position; EOS tokens are allowed exactly where the grammar may end;
/// special tokens never are.
///
/// Built once per grammar and vocabulary, the element tables
/// (mask_tables.hpp) hold for each grammar element the tokens accepted
/// whatever the stack. A position's mask is the accepted set of its stack
/// tops plus the few stack-dependent tokens that pass from the real
/// position, so a position never seen before costs those checks, not a walk
/// of the vocabulary. Masks are cached per position (positions repeat:
/// inside a JSON string every character leads back to the same one). A
/// position inside a UTF-8 sequence, or with a top whose dependent tokens
/// are too many to list, is computed by the full walk of the vocabulary
/// trie, which skips every subtree whose prefix the automaton rejects.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
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
#include "llmkit/grammar/mask_tables.hpp"
#include "llmkit/grammar/token_mask.hpp"
#include "llmkit/grammar/token_vocabulary.hpp"
#include "llmkit/grammar/vocabulary_trie.hpp"

namespace llmkit::grammar {

/// Masks of one grammar over one vocabulary (see the file comment).
/// Thread-safe; share it between the requests that use the same grammar.
class token_masker {
 public:
  /// Builds the element tables (the vocabulary read from each grammar
  /// element: the bulk of compiling a grammar).
  /// @param max_cached_masks  masks kept; the cache is emptied when full.
  /// @param max_dependent     dependent tokens listed per element (`mask_tables`; 0: n_vocab / 8).
  /// @param eager_pairs       top pairs read now (`mask_tables`; the others on first use).
  /// @throws llmkit::error on null arguments or when the automaton exceeds its limits.
  token_masker(std::shared_ptr<const automaton> a, std::shared_ptr<const token_vocabulary> v,
               std::size_t max_cached_masks = 1024, std::size_t max_dependent = 0,
               std::size_t eager_pairs = mask_tables::default_eager_pairs)
      : automaton_(std::move(a)), vocab_(std::move(v)), max_cached_(max_cached_masks) {
    LLMKIT_CHECK(automaton_ && vocab_, "token_masker: null automaton or vocabulary");
    tables_ = mask_tables(*automaton_, *vocab_, max_dependent, eager_pairs);
  }

  const automaton& grammar_automaton() const noexcept { return *automaton_; }
  const token_vocabulary& vocabulary() const noexcept { return *vocab_; }
  const mask_tables& tables() const noexcept { return tables_; }
  std::size_t vocab_size() const noexcept { return vocab_->size(); }

  /// The allowed tokens of position `s`, in their smallest form (shared, immutable).
  std::shared_ptr<const token_mask> allowed(state_id s) const {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(s); it != cache_.end()) return it->second;
    }
    auto m = std::make_shared<const token_mask>(compute_allowed(s));
    std::lock_guard lock(mutex_);
    if (cache_.size() >= max_cached_) cache_.clear();
    cache_.emplace(s, m);
    return m;
  }

  /// The mask of position `s` as a bitset.
  std::shared_ptr<const token_bitset> mask(state_id s) const {
    return std::make_shared<const token_bitset>(allowed(s)->to_bitset());
  }

  /// The allowed tokens of `s` from the tables, without the cache. Lists
  /// up to n_vocab / 16 ids long are kept as lists, as scattering them on a
  /// row is cheaper than a pass over the bitset.
  token_mask compute_allowed(state_id s) const {
    std::vector<std::vector<std::uint32_t>> stacks;
    if (!automaton_->stacks(s, stacks)) return token_mask::from_bitset(compute_mask(s), vocab_->size(), row_list_max());
    // Each stack: its top's table, and the rest below the frames the table read.
    std::vector<std::pair<const element_tokens*, std::vector<std::uint32_t>>> items;
    for (auto& st : stacks) {
      if (st.empty()) continue;
      const element_tokens& t = tables_.at(st.size() > 1 ? st[st.size() - 2] : mask_tables::no_frame, st.back());
      if (t.walk) return token_mask::from_bitset(compute_mask(s), vocab_->size(), row_list_max());
      st.resize(st.size() - t.frames);
      items.emplace_back(&t, std::move(st));
    }
    std::sort(items.begin(), items.end());
    items.erase(std::unique(items.begin(), items.end()), items.end());
    // A dependent token passes when, from some point where its frames may
    // end, the rest of the stack reads the remaining bytes.
    const auto& toks = vocab_->trie.node_tokens();
    std::vector<token_id> extra;  // dependent tokens that pass, and EOS
    for (const auto& item : items) {
      const auto& table = item.first;  // not a structured binding: clang before 16 cannot capture one
      const auto& rest = item.second;
      if (table->dependent.empty() || rest.empty()) continue;  // nothing follows the bottom frame
      const state_id resume = automaton_->resume_state(rest);
      automaton_->with_lock([&](auto step, auto) {
        for (std::size_t k = 0; k < table->dependent.size(); ++k) {
          const token_id t = toks[table->dependent[k]];
          const std::string& b = vocab_->bytes[static_cast<std::size_t>(t)];
          for (const std::uint16_t* j = &table->ends[table->ends_at[k]]; *j != 0; ++j) {
            state_id x = resume;
            for (std::size_t d = *j; d < b.size() && x != dead_state; ++d) x = step(x, static_cast<std::uint8_t>(b[d]));
            if (x != dead_state) {
              extra.push_back(t);
              break;
            }
          }
        }
        return 0;
      });
    }
    if (automaton_->can_end(s)) extra.insert(extra.end(), vocab_->eos.begin(), vocab_->eos.end());
    std::sort(extra.begin(), extra.end());
    extra.erase(std::unique(extra.begin(), extra.end()), extra.end());
    const element_tokens* first = items.empty() ? nullptr : items[0].first;
    const bool one_table = first && std::all_of(items.begin(), items.end(), [&](const auto& x) { return x.first == first; });
    if (one_table) return for_rows(first->accepted.with(extra));
    token_bitset bits((vocab_->size() + 63) / 64, 0);
    for (const auto& item : items) item.first->accepted.add_to(bits);
    for (token_id t : extra) set_bit(bits, t);
    return token_mask::from_bitset(std::move(bits), vocab_->size(), row_list_max());
  }

  /// The mask of `s` by the full walk of the vocabulary trie, without the
  /// tables or the cache (the reference path, for tests and benchmarks).
  token_bitset compute_mask(state_id s) const {
    token_bitset bits((vocab_->size() + 63) / 64, 0);
    const auto& nodes = vocab_->trie.nodes();
    const auto& toks = vocab_->trie.node_tokens();
    std::vector<state_id> at(vocab_->trie.max_depth() + 1);
    at[0] = s;
    const bool end_ok = automaton_->with_lock([&](auto step, auto can_end) {
      const std::size_t n = nodes.size();
      for (std::size_t i = 0; i < n;) {
        const auto& nd = nodes[i];
        const state_id next = step(at[nd.depth - 1], nd.byte);
        if (next == dead_state) {
          i = nd.subtree_end;
          continue;
        }
        at[nd.depth] = next;
        for (std::uint32_t k = nd.tokens_begin; k < nd.tokens_end; ++k) set_bit(bits, toks[k]);
        ++i;
      }
      return can_end(s);
    });
    if (end_ok)
      for (token_id e : vocab_->eos) set_bit(bits, e);
    return bits;
  }

  /// The position after token `t` in position `s`: `dead_state` when the
  /// token is not allowed there. An EOS token leaves the position as it is
  /// when the grammar may end, else gives `dead_state`.
  /// @throws llmkit::error if t is outside the vocabulary.
  state_id advance(state_id s, token_id t) const {
    LLMKIT_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab_->size(), "token_masker::advance: token ", t,
                 " outside [0, ", vocab_->size(), ")");
    if (vocab_->is_eos(t)) return automaton_->can_end(s) ? s : dead_state;
    const std::string& b = vocab_->bytes[static_cast<std::size_t>(t)];
    if (b.empty()) return dead_state;  // special tokens
    return automaton_->advance(s, b);
  }

 private:
  std::size_t row_list_max() const noexcept { return vocab_->size() / 16; }
  token_mask for_rows(token_mask m) const {
    if (m.storage() != token_mask::form::bitset) return m;
    const std::size_t n = vocab_->size();
    if (m.count() > row_list_max() && n - m.count() > row_list_max()) return m;
    return token_mask::from_bitset(m.bits(), n, row_list_max());
  }

  std::shared_ptr<const automaton> automaton_;
  std::shared_ptr<const token_vocabulary> vocab_;
  mask_tables tables_;
  std::size_t max_cached_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<state_id, std::shared_ptr<const token_mask>> cache_;
};

}  // namespace llmkit::grammar
