// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/speculate.hpp
/// Speculative decoding inside an engine step (serve/draft.hpp): the
/// guesses of each drafting decode before the batch is built, their
/// verification on the forward's logits (the request's own draws, row by
/// row, while they agree), the rollback of the rejected guesses' K/V, and
/// the tokens each sampling item took, for `scheduler::complete_step`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/search/ngram_drafter.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/detail/output.hpp"
#include "llmkit/serve/detail/step.hpp"
#include "llmkit/serve/draft.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/stats.hpp"

namespace llmkit::serve::detail {

/// A cache whose sequences can be cut back (the rejected guesses' K/V).
template <class C>
concept truncating_cache = engine_cache<C> && requires(C& c, kv::seq_id s, std::size_t n) { c.truncate(s, n); };

/// What speculation reuses across steps: the guesses of each plan item
/// (`[n_items]`), and per sampled row (`[n_rows]`) the draws on its guesses'
/// rows and how many guesses it kept.
struct speculation_buffers {
  std::vector<std::vector<token_id>> drafts;
  std::vector<std::vector<row_result>> extra;
  std::vector<std::size_t> accepted;
  std::vector<draft_job> jobs;
};

/// Decodes of `plan` that sample (the rows drafting could lengthen).
inline std::size_t n_decodes(const sched::step_plan& plan) {
  return static_cast<std::size_t>(
      std::count_if(plan.items.begin(), plan.items.end(), [](const sched::step_item& it) { return !it.is_prefill; }));
}

/// Cuts `[k] draft`, guesses after request `l`'s context, before the first
/// guess l's grammar forbids (no masked draw can take it: its row would be
/// wasted) and after the first EOS (the grammar follows no token past it).
inline void cut_to_grammar(const live_request& l, std::vector<token_id>& draft) {
  const grammar::grammar_processor& g = *l.grammar;
  std::size_t k = 0;
  try {
    grammar::state_id s = g.sync({.history = l.context, .n_prompt = l.n_prompt});
    for (; k < draft.size(); ++k) {
      if (k > 0 && g.masker().vocabulary().is_eos(draft[k - 1])) break;
      s = g.masker().advance(s, draft[k]);
      if (s == grammar::dead_state) break;
    }
  } catch (const std::exception&) {  // the request's own row reports the grammar's error
    k = 0;
  }
  draft.resize(k);
}

/// Fills `b.drafts` with the guesses of each decode item of `plan` whose
/// request drafts (`speculation::drafter`), at most its lookahead and the
/// request's k: prompt lookup here, draft-model jobs in one batched call of
/// `options.draft_model`. Prompt lookup drafts only in steps of at most
/// `options.max_drafting_decodes` decodes, the draft model in steps of at
/// most `options.max_model_drafting_decodes` (past them the batch is
/// compute-bound: the extra rows, and draft forwards, cost more than they
/// save).
inline void propose_drafts(const sched::step_plan& plan, const live_map& live, const engine_options& options,
                           speculation_buffers& b) {
  b.drafts.resize(plan.items.size());
  for (auto& d : b.drafts) d.clear();
  b.jobs.clear();
  if (plan.n_lookahead_tokens() == 0) return;
  const std::size_t decodes = n_decodes(plan);
  const bool lookup = decodes <= options.max_drafting_decodes;
  const bool model = decodes <= options.max_model_drafting_decodes && options.draft_model != nullptr;
  if (!lookup && !model) return;
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    const sched::step_item& it = plan.items[i];
    if (it.n_lookahead == 0 || it.is_prefill || !it.samples) continue;
    const auto l = live.find(it.id);
    if (l == live.end()) continue;
    const speculation& s = l->second.request.speculative;
    const std::size_t k = std::min(static_cast<std::size_t>(it.n_lookahead), s.max_tokens);
    if (s.drafter == draft_source::ngram && lookup) {
      search::draft d;
      search::ngram_drafter{}.propose({.history = l->second.context, .n_prompt = l->second.n_prompt, .max_tokens = k},
                                      d);
      b.drafts[i] = std::move(d.tokens);
    } else if (s.drafter == draft_source::model && model) {
      b.jobs.push_back({.handle = it.id, .context = l->second.context, .max_tokens = k, .out = &b.drafts[i]});
    }
  }
  if (!b.jobs.empty()) options.draft_model->propose(b.jobs);
  for (std::size_t i = 0; i < plan.items.size(); ++i) {  // a drafter must not overstep its job
    if (b.drafts[i].size() > static_cast<std::size_t>(plan.items[i].n_lookahead))
      b.drafts[i].resize(static_cast<std::size_t>(plan.items[i].n_lookahead));
    if (b.drafts[i].empty()) continue;
    if (const auto l = live.find(plan.items[i].id); l != live.end() && l->second.grammar)
      cut_to_grammar(l->second, b.drafts[i]);
  }
}

/// Verifies the guesses of every sampled row k (request `rows[k]`, guesses
/// `b.drafts[s.row_items[k]]`, drawn token on the first row in
/// `s.results[k]`): while the token drawn from a row equals the next guess,
/// the guess is kept and the row after it is drawn, with the request's
/// chain, its context plus the kept guesses and its stream at that step,
/// into `b.extra[k]`. `b.accepted[k]` counts the kept guesses. Rows are
/// split over `exec`'s threads; each request's draws are sequential.
template <executor Exec>
void verify_drafts(Exec& exec, const live_map& live, std::span<const request_id> rows,
                   matrix_view<const float> logits, step_buffers& s, speculation_buffers& b) {
  b.extra.resize(rows.size());
  b.accepted.assign(rows.size(), 0);
  exec.parallel_for(rows.size(), [&](std::size_t k) {
    b.extra[k].clear();
    const std::vector<token_id>& d = b.drafts[s.row_items[k]];
    if (d.empty()) return;
    const live_request& l = live.at(rows[k]);
    std::vector<token_id> context(l.context);  // the context each row would have
    const row_result* last = &s.results[k];
    for (std::size_t j = 0; j < d.size(); ++j) {
      if (!last->error.empty() || last->sample.token != d[j]) break;
      context.push_back(d[j]);
      row_result& r = b.extra[k].emplace_back();
      sample_into(l, context, logits.row(s.first_rows[k] + j + 1), s.workspaces[k], r);
      ++b.accepted[k];
      last = &r;
    }
  });
}

/// Cuts the K/V of the guesses row k did not keep: the request's sequence
/// holds its context up to the last kept guess. Counts the guesses in
/// `stats`.
template <engine_cache Cache>
void truncate_rejected(Cache& cache, const live_map& live, std::span<const request_id> rows, const step_buffers& s,
                       const speculation_buffers& b, engine_stats& stats) {
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::size_t n = b.drafts[s.row_items[k]].size();
    if (n == 0) continue;
    stats.n_draft_tokens += n;
    stats.n_draft_tokens_accepted += b.accepted[k];
    if (b.accepted[k] == n) continue;
    const live_request& l = live.at(rows[k]);
    if constexpr (truncating_cache<Cache>) {
      cache.truncate(*l.seq, cache.n_tokens(*l.seq) - (n - b.accepted[k]));
    } else {
      LLMKIT_CHECK(false, "engine: guesses were verified on a cache that cannot truncate");
    }
  }
}

/// The tokens of every sampling item of `plan`, concatenated in item order,
/// and `[plan.n_samples()]` how many each took, for
/// `scheduler::complete_step`: row k's drawn token and its kept guesses'
/// draws for request `rows[k]` (0 for a failed draw), one 0 for a request
/// that ended before the forward pass.
inline void step_tokens(const sched::step_plan& plan, std::span<const request_id> rows,
                        std::span<const row_result> results, const speculation_buffers& b,
                        std::vector<token_id>& tokens, std::vector<std::size_t>& counts) {
  tokens.clear();
  counts.clear();
  auto token_of = [](const row_result& r) { return r.error.empty() ? r.sample.token : token_id{0}; };
  for (std::size_t k = 0; const sched::step_item& it : plan.items) {
    if (!it.samples) continue;
    if (k < rows.size() && rows[k] == it.id) {
      tokens.push_back(token_of(results[k]));
      for (std::size_t j = 0; j < b.accepted[k]; ++j) tokens.push_back(token_of(b.extra[k][j]));
      counts.push_back(1 + b.accepted[k]);
      ++k;
    } else {
      tokens.push_back(0);
      counts.push_back(1);
    }
  }
}

}  // namespace llmkit::serve::detail
