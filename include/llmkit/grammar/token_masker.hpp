// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/token_masker.hpp
/// Token masks: which tokens of a vocabulary can continue a grammar position.
///
/// A mask is a bitset over the vocabulary: token t is allowed when its bytes
/// take the automaton from the position to a live position; EOS tokens are
/// allowed exactly where the grammar may end; special tokens never are. It is
/// computed by one walk of the vocabulary trie in preorder that skips every
/// subtree whose prefix the automaton rejects, and cached per position (the
/// positions of a generation repeat: inside a JSON string every character
/// leads back to the same one), so most steps cost a cache lookup.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/automaton.hpp"
#include "llmkit/grammar/vocabulary_trie.hpp"
#include "llmkit/model/tokenizer.hpp"

namespace llmkit::grammar {

/// A vocabulary as masks need it: its trie, each token's bytes and its
/// end-of-sequence ids. Build once per vocabulary and share. Special
/// (control, user-defined), unknown and unused tokens get no bytes: no
/// grammar allows them; EOS ids are allowed where the grammar may end.
struct token_vocabulary {
  vocabulary_trie trie;
  std::vector<std::string> bytes;  ///< [n_vocab] bytes of each token (empty for special tokens)
  std::vector<token_id> eos;       ///< ids that end the output (allowed where the grammar may end)

  std::size_t size() const noexcept { return bytes.size(); }
  bool is_eos(token_id t) const noexcept { return std::find(eos.begin(), eos.end(), t) != eos.end(); }

  /// From a tokenizer; `eos` defaults to the tokenizer's EOS id.
  static std::shared_ptr<const token_vocabulary> from_tokenizer(const model::tokenizer& tok,
                                                                std::vector<token_id> eos = {}) {
    auto v = std::make_shared<token_vocabulary>();
    const std::size_t n = tok.vocab_size();
    v->bytes.resize(n);
    std::vector<bool> excluded(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<token_id>(i);
      const model::token_type type = tok.type(id);
      excluded[i] = model::is_special(type) || type == model::token_type::unknown || type == model::token_type::unused;
      if (!excluded[i]) tok.decode_token(id, v->bytes[i]);
    }
    v->trie = vocabulary_trie(v->bytes, excluded);
    if (eos.empty() && tok.eos() >= 0) eos.push_back(tok.eos());
    for (token_id e : eos)
      LLMKIT_CHECK(e >= 0 && static_cast<std::size_t>(e) < n, "token_vocabulary: eos id ", e, " outside [0, ", n, ")");
    v->eos = std::move(eos);
    return v;
  }
};

/// A bitset over a vocabulary: `[ceil(n_vocab / 64)]` words, bit t of word
/// t / 64 set when token t is allowed.
using token_bitset = std::vector<std::uint64_t>;

inline bool test_bit(const token_bitset& b, token_id t) noexcept {
  return (b[static_cast<std::size_t>(t) >> 6] >> (static_cast<std::size_t>(t) & 63)) & 1u;
}

/// Masks of one grammar over one vocabulary (see the file comment).
/// Thread-safe; share it between the requests that use the same grammar.
class token_masker {
 public:
  /// @param max_cached_masks  masks kept (each n_vocab / 8 bytes); the cache
  ///                          is emptied when full.
  token_masker(std::shared_ptr<const automaton> a, std::shared_ptr<const token_vocabulary> v,
               std::size_t max_cached_masks = 1024)
      : automaton_(std::move(a)), vocab_(std::move(v)), max_cached_(max_cached_masks) {
    LLMKIT_CHECK(automaton_ && vocab_, "token_masker: null automaton or vocabulary");
  }

  const automaton& grammar_automaton() const noexcept { return *automaton_; }
  const token_vocabulary& vocabulary() const noexcept { return *vocab_; }
  std::size_t vocab_size() const noexcept { return vocab_->size(); }

  /// The mask of position `s` (shared, immutable).
  std::shared_ptr<const token_bitset> mask(state_id s) const {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(s); it != cache_.end()) return it->second;
    }
    auto m = std::make_shared<token_bitset>(compute_mask(s));
    std::lock_guard lock(mutex_);
    if (cache_.size() >= max_cached_) cache_.clear();
    cache_.emplace(s, m);
    return m;
  }

  /// The mask of `s`, computed without the cache (for benchmarks and tests).
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
        for (std::uint32_t k = nd.tokens_begin; k < nd.tokens_end; ++k) {
          const auto t = static_cast<std::size_t>(toks[k]);
          bits[t >> 6] |= std::uint64_t{1} << (t & 63);
        }
        ++i;
      }
      return can_end(s);
    });
    if (end_ok)
      for (token_id e : vocab_->eos) bits[static_cast<std::size_t>(e) >> 6] |= std::uint64_t{1} << (e & 63);
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
  std::shared_ptr<const automaton> automaton_;
  std::shared_ptr<const token_vocabulary> vocab_;
  std::size_t max_cached_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<state_id, std::shared_ptr<const token_bitset>> cache_;
};

}  // namespace llmkit::grammar
