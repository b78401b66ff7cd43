// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/sample.hpp
/// How the engine draws a request's next token, as a function of its own:
/// a prefill worker that hands requests over with
/// `engine::submit_prefilled` draws their first tokens with it, so a seeded
/// request's tokens do not depend on where its prompt was prefilled.

#include <cstddef>
#include <optional>
#include <span>

#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/processor.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/logprobs.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/serve/request.hpp"

namespace llmkit::serve {

/// The chain request `r` samples with: `r.chain` when set, else `r.sampling` parsed.
/// @throws llmkit::error for a configuration string that does not parse.
inline sampling::runtime_chain chain_of(const generation_request& r) {
  return r.chain ? *r.chain : sampling::runtime_chain::parse(r.sampling);
}

/// Draws the next token of request `r` from its `[vocab] logits` row:
/// r's grammar mask (when `r.grammar` is set), then r's chain (`chain`,
/// from `chain_of(r)`) over a copy of the row in workspace `ws`, with r's
/// Philox stream (`r.seed`, `r.stream`) at step n_generated, where
/// `[n_prompt + n_generated] context` is r's prompt then its tokens so far.
/// `grammar` is r's grammar position kept across calls (it re-advances from
/// where the context last differed); without it a fresh one walks the
/// generated tokens from the grammar's start. Fills `[k] top` with the k
/// most probable tokens of the processed distribution (empty = none; shrunk
/// to what the chain left) and returns how many it wrote in `*n_top` when
/// given.
/// @throws llmkit::error when the grammar or the chain fails on the row.
inline sampling::sample_result sample_token(const sampling::runtime_chain& chain, const generation_request& r,
                                            std::span<const token_id> context, std::span<const float> logits,
                                            sampling::candidates& ws, std::span<sampling::token_logprob> top = {},
                                            std::size_t* n_top = nullptr,
                                            const grammar::grammar_processor* grammar = nullptr) {
  const std::size_t n_prompt = r.prompt.size();
  const sampling::sampling_context ctx{.seed = r.seed,
                                       .request_id = r.stream,
                                       .step = context.size() > n_prompt ? context.size() - n_prompt : 0,
                                       .history = context,
                                       .n_prompt = n_prompt};
  ws.reset_copy(logits);
  if (r.grammar) {
    std::optional<grammar::grammar_processor> fresh;
    if (grammar == nullptr) grammar = &fresh.emplace(r.grammar);
    grammar->apply(ws, ctx);
  }
  chain.apply(ws, ctx);
  const std::size_t n = top.empty() ? 0 : sampling::top_logprobs(ws, top);
  if (n_top != nullptr) *n_top = n;
  return chain.sample(ws, ctx);
}

/// The first token of request `r` from the logits of its prompt's last
/// token, as the engine would draw it (with `chain_of(r)`; a prefill
/// worker hands the result to `engine::submit_prefilled`).
/// @throws llmkit::error for a chain that does not parse or fails.
inline token_id sample_first_token(const generation_request& r, std::span<const float> logits) {
  const auto chain = chain_of(r);
  sampling::candidates ws;
  return sample_token(chain, r, r.prompt, logits, ws).token;
}

}  // namespace llmkit::serve
