// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/beams.hpp
/// Beam-search requests inside the engine (`generation_request::beam`).
///
/// A beam request is ONE scheduler request of `width` sequences
/// (`sched::seq_record::width`): admission reserves, and preemption frees,
/// the blocks of all its beams at once, so the beams always step together.
/// Each step packs one row per live beam after the other requests' rows
/// (`add_beam_rows`); after the forward pass `expand_group` picks the next
/// beams with `search::detail::expand_beams`, the very function of
/// `search::beam_search`: a beam chosen once keeps its sequence, one chosen
/// k times is forked k - 1 times (blocks shared copy-on-write), one chosen
/// by none is freed. A preempted group recomputes every beam's context
/// (each its own prefill) when it is admitted again. The scheduler counts
/// width x blocks of one context (forks share blocks, so the group holds at
/// most that), but one decode token and one sequence against the step's
/// token and sequence budgets.
///
/// Nothing streams while the search runs; `send_hypotheses` delivers the
/// n best hypotheses at its end as samples 0 .. n - 1.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/tokenizer.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/search/beam_search.hpp"
#include "llmkit/search/detail/row_select.hpp"
#include "llmkit/serve/detail/beam_group.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/detail/output.hpp"
#include "llmkit/serve/detail/step.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/stats.hpp"
#include "llmkit/serve/text_stream.hpp"

namespace llmkit::serve::detail {

/// Checks the beam search of request `r` (`r.beam` set) against a model of
/// `vocab` tokens, the engine's options and block limits: width in [1,
/// min(max_beam_width, vocab)], `n` <= width, a finite length penalty, no
/// sampling (the "greedy" string, no chain value, no top_logprobs), no stop
/// strings, and width sequences of prompt + max_new_tokens - 1 tokens that
/// fit the KV pool.
/// @throws llmkit::error naming the field and its value.
inline void check_beam(const generation_request& r, std::size_t vocab, const engine_options& o,
                       const sched::engine_limits& limits) {
  const beam_options& b = *r.beam;
  LLMKIT_CHECK(b.width >= 1 && b.width <= o.max_beam_width, "beam.width = ", b.width,
               " is outside [1, max_beam_width = ", o.max_beam_width, "]");
  LLMKIT_CHECK(b.width <= vocab, "beam.width = ", b.width, " exceeds the vocabulary of ", vocab, " tokens");
  LLMKIT_CHECK(r.n <= b.width, "n = ", r.n, " exceeds beam.width = ", b.width,
               " (n is how many of the width hypotheses are returned)");
  LLMKIT_CHECK(std::isfinite(b.length_penalty), "beam.length_penalty must be finite, got ", b.length_penalty);
  LLMKIT_CHECK(!r.chain && r.sampling == "greedy",
               "beam search scores the model's own log-probabilities: sampling must be \"greedy\" (the default) and "
               "chain unset, got sampling = \"",
               r.sampling, "\"", r.chain ? " and a chain" : "");
  LLMKIT_CHECK(r.top_logprobs == 0, "top_logprobs = ", r.top_logprobs, " is not supported with beam search");
  LLMKIT_CHECK(r.stop.stop_strings.empty(),
               "stop strings are not supported with beam search (it ends hypotheses on tokens: eos_tokens, "
               "stop_sequences)");
  const auto longest = static_cast<std::int64_t>(r.prompt.size() + r.stop.max_new_tokens - 1);
  const std::int64_t need = static_cast<std::int64_t>(b.width) * sched::blocks_for(longest, limits.block_size);
  LLMKIT_CHECK(need <= limits.n_blocks, "beam.width = ", b.width, " sequences of up to ", longest, " tokens need ",
               need, " KV blocks, the cache holds ", limits.n_blocks);
}

/// Frees every cache sequence request `l` holds (its own, or its beams').
template <engine_cache Cache>
void free_sequences(Cache& cache, live_request& l) {
  if (l.seq) cache.free(*l.seq);
  l.seq.reset();
  if (l.beams)
    for (live_beam& b : l.beams->live) {
      if (b.seq) cache.free(*b.seq);
      b.seq.reset();
    }
}

/// Packs the items of beam-search requests (`items`, from `build_batch`)
/// into `batch` after its `n_rows` rows: one chunk of the item's positions
/// per live beam, opening the beams' sequences on admission. Fills `out`
/// with the logits rows of the items that sample.
template <engine_cache Cache>
void add_beam_rows(std::span<const sched::step_item> items, live_map& live, Cache& cache, prefix_reuse reuse,
                   model::batch_builder& batch, engine_stats& stats, std::size_t n_rows, std::vector<beam_rows>& out) {
  out.clear();
  for (const sched::step_item& it : items) {
    live_request& l = live.at(it.id);
    if (it.samples) out.push_back({it.id, n_rows});
    for (live_beam& b : l.beams->live) {
      if (!b.seq) {
        b.seq = open_context_sequence(cache, b.context, it.first_pos, reuse, stats);
        if (!l.admitted) l.usage.n_prompt_tokens_reused = static_cast<std::size_t>(it.first_pos);
      }
      LLMKIT_ASSERT(cache.n_tokens(*b.seq) == static_cast<std::size_t>(it.first_pos));
      batch.add(*b.seq,
                std::span<const token_id>(b.context)
                    .subspan(static_cast<std::size_t>(it.first_pos), static_cast<std::size_t>(it.n_tokens)),
                static_cast<std::int32_t>(it.first_pos),
                it.samples ? model::last_logits::keep : model::last_logits::skip);
      if (it.is_prefill) stats.n_prompt_tokens_prefilled += static_cast<std::uint64_t>(it.n_tokens);
      if (it.samples) ++n_rows;
    }
    l.admitted = true;
  }
}

/// Copies the rows `[first_row, first_row + n_live)` of `logits` into
/// `g.masked` with every token that beam's grammar position forbids at -inf.
/// @throws llmkit::error when the grammar allows a beam no token.
inline void mask_beam_rows(beam_group& g, matrix_view<const float> logits, std::size_t first_row) {
  const std::size_t n_live = g.live.size(), vocab = logits.cols();
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  g.masked.resize(n_live * vocab);
  for (std::size_t i = 0; i < n_live; ++i) {
    const auto bits = g.grammar->mask(g.live[i].grammar_state);
    const float* row = logits.row(first_row + i).data();
    float* out = g.masked.data() + i * vocab;
    bool any = false;
    for (std::size_t t = 0; t < vocab; ++t) {
      const bool ok = grammar::test_bit(*bits, static_cast<token_id>(t));
      out[t] = ok ? row[t] : neg_inf;
      any = any || ok;
    }
    LLMKIT_CHECK(any, "grammar: the grammar allows no token after ", g.live[i].context.size() - g.n_prompt,
                 " generated tokens (beam ", i, ")");
  }
}

/// Expands beam group `g` from its rows `[first_row, first_row + n_live)`
/// of `[n_rows, vocab] logits`, as `search::beam_search` does. Returns the
/// hypotheses (best first, at most `n`) when the search is over, nothing
/// when it goes on; then the next beams hold their sequences (forked or
/// freed in `cache`) and their new token, not computed yet.
/// @throws llmkit::error when a row has no finite logit or the cache has no
/// free sequence slot for a fork.
template <engine_cache Cache>
std::optional<std::vector<search::beam_hypothesis>> expand_group(Cache& cache, beam_group& g,
                                                                 matrix_view<const float> logits,
                                                                 std::size_t first_row, std::size_t n,
                                                                 const stop_criteria& stop) {
  const std::size_t n_live = g.live.size(), vocab = logits.cols(), B = g.options.width;
  const double alpha = g.options.length_penalty;
  if (g.grammar) mask_beam_rows(g, logits, first_row);
  auto row_of = [&](std::size_t i) {
    return g.grammar ? std::span<const float>(g.masked).subspan(i * vocab, vocab)
                     : std::span<const float>(logits.row(first_row + i).data(), vocab);
  };
  g.lse.resize(n_live);
  for (std::size_t i = 0; i < n_live; ++i) g.lse[i] = search::detail::log_sum_exp(row_of(i), "engine: beam search");
  search::detail::expand_beams(
      n_live, vocab, B, stop, alpha, row_of, g.lse, [&](std::size_t i) { return g.live[i].logprob; },
      [&](std::size_t i) { return std::span<const token_id>(g.live[i].context).subspan(g.n_prompt); }, g.buffers,
      g.picks, g.finished);
  if (g.grammar) {  // fewer allowed tokens than candidates: the rest scored -inf
    std::erase_if(g.picks, [](const search::detail::beam_pick& p) { return !std::isfinite(p.logprob); });
    std::erase_if(g.finished, [](const search::beam_hypothesis& h) { return !std::isfinite(h.logprob); });
  }
  for (search::beam_hypothesis& h : g.finished) g.done.add(std::move(h));
  ++g.n_steps;

  bool over = g.picks.empty();
  if (!over && g.n_steps >= stop.max_new_tokens) {
    for (const search::detail::beam_pick& p : g.picks) {
      const std::span<const token_id> parent = std::span<const token_id>(g.live[p.parent].context).subspan(g.n_prompt);
      std::vector<token_id> tokens(parent.begin(), parent.end());
      tokens.push_back(p.token);
      const double score = search::detail::length_normalised(p.logprob, tokens.size(), alpha);
      g.done.add({std::move(tokens), p.logprob, score, finish_reason::max_tokens});
    }
    over = true;
  }
  if (!over) over = search::detail::stops_early(g.options.stopping, g.done, g.picks.front().logprob, g.n_steps,
                                                stop.max_new_tokens, alpha);
  if (over) {
    std::vector<search::beam_hypothesis> out = g.done.take_sorted();
    if (out.size() > n) out.resize(n);
    return out;
  }

  // KV: a parent chosen once keeps its sequence, each further child forks it, the others are freed.
  g.n_children.assign(n_live, 0);
  for (const search::detail::beam_pick& p : g.picks) ++g.n_children[p.parent];
  for (std::size_t i = 0; i < n_live; ++i)
    if (g.n_children[i] == 0) {
      cache.free(*g.live[i].seq);
      g.live[i].seq.reset();
    }
  std::vector<live_beam> next(g.picks.size());
  for (std::size_t k = 0; k < g.picks.size(); ++k) {
    const search::detail::beam_pick& p = g.picks[k];
    live_beam& parent = g.live[p.parent];
    live_beam& child = next[k];
    child.context.reserve(parent.context.size() + 1);
    child.context = parent.context;
    child.context.push_back(p.token);
    child.logprob = p.logprob;
    if (g.grammar) child.grammar_state = g.grammar->advance(parent.grammar_state, p.token);
    if (--g.n_children[p.parent] == 0) {  // the last child takes the parent's sequence
      child.seq = parent.seq;
      parent.seq.reset();
    } else {
      child.seq = cache.fork(*parent.seq);
      LLMKIT_CHECK(child.seq.has_value(), "engine: beam search: the cache has no free sequence slot to fork beam ",
                   p.parent, " (beam.width ", B, ")");
    }
  }
  g.live = std::move(next);
  return std::nullopt;
}

/// Sends the result of beam request `l` (handle `h`, `n` samples): for
/// hypothesis i (best first) as sample i, its token events (text decoded
/// with `tokenizer` when given; no log-probabilities) then its finish event
/// (stop or length, with `beam_logprob` and `beam_score`). Samples without
/// a hypothesis (a vocabulary smaller than n) end with an error. Counts the
/// finishes and tokens in `stats`.
inline void send_hypotheses(request_id h, const live_request& l, std::span<const search::beam_hypothesis> hyps,
                            const model::tokenizer* tokenizer, engine_stats& stats) {
  const std::size_t n = std::max<std::size_t>(l.request.n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    stream_event fin;
    fin.handle = h + static_cast<request_id>(i);
    fin.index = i;
    fin.type = event_type::finish;
    fin.usage = l.usage;
    if (i >= hyps.size()) {
      fin.finish = finish_kind::error;
      fin.error = "beam search ended with " + std::to_string(hyps.size()) + " hypotheses, fewer than n = " +
                  std::to_string(n);
    } else {
      const search::beam_hypothesis& hyp = hyps[i];
      text_stream text;
      for (const token_id t : hyp.tokens) {
        stream_event e;
        e.handle = fin.handle;
        e.index = i;
        e.type = event_type::token;
        e.token = t;
        if (tokenizer != nullptr) e.text = text.push(*tokenizer, t, l.request.stop).text;
        deliver(l.request, e);
      }
      stats.n_generated_tokens += hyp.tokens.size();
      fin.finish = kind_of(hyp.reason);
      fin.reason = hyp.reason;
      fin.text = text.flush();
      fin.usage.n_generated_tokens = hyp.tokens.size();
      fin.beam_logprob = hyp.logprob;
      fin.beam_score = hyp.score;
    }
    ++stats.n_finished[static_cast<std::size_t>(fin.finish)];
    deliver(l.request, fin);
  }
}

}  // namespace llmkit::serve::detail
