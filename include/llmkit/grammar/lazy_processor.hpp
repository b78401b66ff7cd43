// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/lazy_processor.hpp
/// `lazy_grammar_processor`: a grammar that starts constraining only once
/// the generated text contains a trigger word (llama.cpp's lazy grammars):
/// free text until, say, `<tool_call>`, then the grammar from the trigger's
/// first byte on.
///
/// ```
/// auto masker = grammar::compile_cached(tool_grammar.gbnf, vocab);   // the grammar starts with the trigger
/// sampling::runtime_chain chain({grammar::lazy_grammar_processor(masker, {"<tool_call>"}),
///                                sampling::temperature{0.7f}});
/// ```
///
/// As grammar_processor, it derives everything from `sampling_context::history`
/// and keeps, per generated token, the text so far and the grammar position,
/// resuming from the longest common prefix of what it saw and the current
/// history (a rejected draft rolls back, a trigger cut back deactivates).
/// The text of a token is its bytes in the masker's vocabulary, or the text
/// given for it in `marker_tokens`: a trigger the model writes as one special
/// token (Qwen's `<tool_call>`, Mistral's `[TOOL_CALLS]`) has no bytes in
/// the vocabulary (a grammar never allows special tokens), so pass its id and
/// text there.
///
/// The token that completes a trigger is drawn unconstrained; whatever it
/// holds after the trigger must continue the grammar, or the next step
/// raises llmkit::error (as a forbidden token does for grammar_processor).

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/automaton.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::grammar {

/// See the file comment.
class lazy_grammar_processor {
 public:
  /// @param triggers       `[n]` non-empty words; the first occurrence of
  ///                       any of them in the generated text activates the
  ///                       grammar, which reads the text from that word's
  ///                       first byte
  /// @param marker_tokens  `[m]` (id, text) of tokens whose text the
  ///                       vocabulary does not hold (special tokens)
  /// @throws llmkit::error on a null masker, no trigger, an empty trigger or
  ///         a marker id outside the vocabulary.
  lazy_grammar_processor(std::shared_ptr<const token_masker> masker, std::vector<std::string> triggers,
                         std::vector<std::pair<token_id, std::string>> marker_tokens = {})
      : masker_(std::move(masker)), triggers_(std::move(triggers)) {
    LLMKIT_CHECK(masker_ != nullptr, "lazy_grammar_processor: null masker");
    LLMKIT_CHECK(!triggers_.empty(), "lazy_grammar_processor: no trigger word");
    for (const auto& t : triggers_) {
      LLMKIT_CHECK(!t.empty(), "lazy_grammar_processor: empty trigger word");
      longest_ = std::max(longest_, t.size());
    }
    for (auto& [id, text] : marker_tokens) {
      LLMKIT_CHECK(id >= 0 && static_cast<std::size_t>(id) < masker_->vocab_size(), "lazy_grammar_processor: marker token ",
                   id, " outside [0, ", masker_->vocab_size(), ")");
      markers_[id] = std::move(text);
    }
  }

  /// Leaves the row as it is until a trigger has been generated; then masks
  /// the candidates the grammar forbids, as grammar_processor does.
  /// @throws llmkit::error if a token after the trigger breaks the grammar,
  /// if the grammar allows no token, or if no allowed candidate is left.
  void apply(sampling::candidates& c, const sampling::sampling_context& ctx) const {
    LLMKIT_CHECK(c.vocab_size() == masker_->vocab_size(), "lazy_grammar_processor: logits row has ", c.vocab_size(),
                 " entries, the grammar's vocabulary ", masker_->vocab_size());
    const auto s = sync(ctx);
    if (!s) return;
    const auto mask = masker_->mask(*s);
    const token_bitset& bits = *mask;
    std::size_t n_keep = 0;
    for (std::size_t i = 0; i < c.size(); ++i) n_keep += test_bit(bits, c.token(i)) ? 1 : 0;
    LLMKIT_CHECK(n_keep > 0 || !c.is_dense(), "lazy_grammar_processor: the grammar allows no token after ",
                 ctx.n_generated(), " generated tokens");
    LLMKIT_CHECK(n_keep > 0, "lazy_grammar_processor: none of the ", c.size(),
                 " candidates left by earlier processors is allowed by the grammar (put the grammar first)");
    c.retain([&](std::size_t i) { return test_bit(bits, c.token(i)); }, n_keep, false);
    LLMKIT_CHECK(c.max() != -std::numeric_limits<float>::infinity(),
                 "lazy_grammar_processor: every token the grammar allows has logit -inf (removed by earlier processors)");
  }

  /// The grammar position after the generated part of `ctx.history`, or
  /// nullopt while no trigger has been generated.
  /// @throws llmkit::error if the text after the trigger breaks the grammar.
  std::optional<state_id> sync(const sampling::sampling_context& ctx) const {
    const std::span<const token_id> gen =
        ctx.history.size() > ctx.n_prompt ? ctx.history.subspan(ctx.n_prompt) : std::span<const token_id>{};
    std::size_t k = 0;
    while (k < tokens_.size() && k < gen.size() && tokens_[k] == gen[k]) ++k;
    tokens_.resize(k);
    states_.resize(k);
    text_ends_.resize(k);
    text_.resize(k == 0 ? 0 : text_ends_.back());
    if (trigger_token_ >= k) trigger_token_ = npos;
    const automaton& a = masker_->grammar_automaton();
    for (; k < gen.size(); ++k) {
      const token_id t = gen[k];
      LLMKIT_CHECK(t >= 0 && static_cast<std::size_t>(t) < masker_->vocab_size(), "lazy_grammar_processor: token ", t,
                   " at generated position ", k, " outside the vocabulary");
      LLMKIT_CHECK(tokens_.empty() || !masker_->vocabulary().is_eos(tokens_.back()),
                   "lazy_grammar_processor: tokens follow an end-of-sequence token at generated position ", k);
      const std::size_t before = text_.size();
      text_ += token_text(t);
      state_id s = dead_state;
      if (trigger_token_ != npos) {
        s = a.advance(states_.back(), std::string_view(text_).substr(before));
      } else if (const std::size_t at = find_trigger(before); at != npos) {
        trigger_token_ = k;
        s = a.advance(a.start(), std::string_view(text_).substr(at));
      }
      LLMKIT_CHECK(trigger_token_ == npos || s != dead_state, "lazy_grammar_processor: generated token ", t,
                   " at position ", k, " is not allowed by the grammar");
      tokens_.push_back(t);
      states_.push_back(s);
      text_ends_.push_back(text_.size());
    }
    if (trigger_token_ == npos) return std::nullopt;
    return states_.back();
  }

  /// True once a trigger has been generated (as of the last `sync`/`apply`).
  bool active() const noexcept { return trigger_token_ != npos; }

  const token_masker& masker() const noexcept { return *masker_; }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::string_view token_text(token_id t) const {
    if (auto it = markers_.find(t); it != markers_.end()) return it->second;
    return masker_->vocabulary().bytes[static_cast<std::size_t>(t)];
  }

  // The first trigger occurrence that ends after byte `from` of text_ (only
  // those can be new), or npos.
  std::size_t find_trigger(std::size_t from) const {
    const std::size_t start = from >= longest_ ? from - longest_ + 1 : 0;
    std::size_t best = npos;
    for (const auto& w : triggers_)
      if (const std::size_t at = text_.find(w, start); at != std::string::npos) best = std::min(best, at);
    return best;
  }

  std::shared_ptr<const token_masker> masker_;
  std::vector<std::string> triggers_;
  std::unordered_map<token_id, std::string> markers_;
  std::size_t longest_ = 0;
  mutable std::vector<token_id> tokens_;
  mutable std::vector<state_id> states_;        // after each token; dead_state before the trigger
  mutable std::vector<std::size_t> text_ends_;  // text_ size after each token
  mutable std::string text_;
  mutable std::size_t trigger_token_ = npos;    // index of the token that completed the trigger
};

}  // namespace llmkit::grammar
