// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/validate.hpp
/// The checks a request passes on the caller's thread before the engine
/// queues it (`engine::submit`, `engine::submit_prefilled`): each failure
/// throws `llmkit::error` naming the field and its value.

#include <cstddef>
#include <cstdint>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/serve/detail/staging.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/request.hpp"

namespace llmkit::serve::detail {

/// Checks that every id of `[n] tokens` is inside a vocabulary of `vocab`
/// tokens; the message names the array (`name`) and the index.
/// @throws llmkit::error for the first id outside [0, vocab).
inline void check_in_vocabulary(const char* name, std::span<const token_id> tokens, std::size_t vocab) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    LLMKIT_CHECK(tokens[i] >= 0 && static_cast<std::size_t>(tokens[i]) < vocab, name, "[", i, "] = ", tokens[i],
                 " is outside the vocabulary of ", vocab, " tokens");
}

/// Checks a request's speculative decoding against the engine's options:
/// k in [1, max_draft_tokens] when it drafts, and a draft model for
/// `draft_source::model`.
/// @throws llmkit::error naming the field and value.
inline void check_speculation(const speculation& s, const engine_options& o) {
  if (s.drafter == draft_source::none) return;
  LLMKIT_CHECK(s.drafter == draft_source::ngram || s.drafter == draft_source::model,
               "speculative.drafter = ", static_cast<int>(s.drafter), " is not a draft source");
  LLMKIT_CHECK(s.max_tokens >= 1 && s.max_tokens <= o.max_draft_tokens, "speculative.max_tokens = ", s.max_tokens,
               " is outside [1, max_draft_tokens = ", o.max_draft_tokens, "]");
  LLMKIT_CHECK(s.drafter != draft_source::model || o.draft_model != nullptr,
               "speculative.drafter = model, but the engine has no draft model (engine_options::draft_model)");
}

/// Checks a request against an engine's model (`vocab` tokens), options
/// and tokenizer (`has_tokenizer`): a non-empty prompt inside the
/// vocabulary, valid stop rules, prompt + `max_new_tokens` within
/// `max_context`, stop strings only with a tokenizer, `top_logprobs` <=
/// vocab, `n` in [1, max_queued], a grammar compiled for `vocab` tokens.
/// The sampling string is checked apart (by
/// parsing it).
/// @throws llmkit::error for the first check that fails.
inline void check_request(const generation_request& r, std::size_t vocab, const engine_options& o,
                          bool has_tokenizer) {
  LLMKIT_CHECK(!r.prompt.empty(), "prompt is empty");
  check_in_vocabulary("prompt", r.prompt, vocab);
  r.stop.validate("stop");
  const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
  LLMKIT_CHECK(n_prompt < o.max_context && r.stop.max_new_tokens <= static_cast<std::size_t>(o.max_context - n_prompt),
               "prompt length ", n_prompt, " + max_new_tokens ", r.stop.max_new_tokens, " exceeds the context of ",
               o.max_context, " tokens");
  LLMKIT_CHECK(r.stop.stop_strings.empty() || has_tokenizer, "stop strings need a tokenizer; the engine has none");
  LLMKIT_CHECK(r.top_logprobs <= vocab, "top_logprobs = ", r.top_logprobs, " exceeds the vocabulary of ", vocab,
               " tokens");
  LLMKIT_CHECK(r.n >= 1 && r.n <= o.max_queued, "n = ", r.n, " is outside [1, max_queued = ", o.max_queued, "]");
  check_speculation(r.speculative, o);
  LLMKIT_CHECK(!r.grammar || r.grammar->vocab_size() == vocab, "grammar: compiled for a vocabulary of ",
               r.grammar ? r.grammar->vocab_size() : 0, " tokens, the model has ", vocab);
}

/// Adds the EOS ids of request `r`'s grammar vocabulary to its stop
/// tokens (a grammar allows EOS where it may end; drawing it must end the
/// request). Nothing without a grammar.
inline void add_grammar_eos(generation_request& r) {
  if (!r.grammar) return;
  for (token_id e : r.grammar->vocabulary().eos)
    if (!r.stop.is_eos(e)) r.stop.eos_tokens.push_back(e);
}

/// Checks a prefilled request as `check_request` does, plus: the engine
/// has a staging area (`limits.n_swap_blocks` > 0), `n` is 1, no beam search, at least one
/// given token, all inside the vocabulary, and its buffer fits the whole
/// staging area. Returns the staging blocks its buffer takes
/// (`staged_blocks`).
/// @throws llmkit::error for the first check that fails.
inline std::int64_t check_prefilled(const prefilled_request& p, std::size_t vocab, const engine_options& o,
                                    bool has_tokenizer, const sched::engine_limits& limits) {
  LLMKIT_CHECK(limits.n_swap_blocks > 0,
               "submit_prefilled: the engine has no staging area (engine_options::staging_blocks = 0)");
  check_request(p.request, vocab, o, has_tokenizer);
  LLMKIT_CHECK(p.request.n == 1, "submit_prefilled: n = ", p.request.n, " (a prefilled request is one sample)");
  LLMKIT_CHECK(!p.request.beam, "submit_prefilled: a beam-search request is submitted whole (submit)");
  LLMKIT_CHECK(!p.generated.empty(), "submit_prefilled: no generated token (the first one comes with the request)");
  check_in_vocabulary("generated", p.generated, vocab);
  const std::int64_t blocks = staged_blocks(p.request, p.generated, limits.block_size);
  LLMKIT_CHECK(blocks <= limits.n_swap_blocks, "submit_prefilled: the KV of ",
               p.request.prompt.size() + p.generated.size() - 1, " tokens needs ", blocks,
               " staging blocks, the staging area holds ", limits.n_swap_blocks);
  return blocks;
}

}  // namespace llmkit::serve::detail
