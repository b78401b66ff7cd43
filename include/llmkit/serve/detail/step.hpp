// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/step.hpp
/// The pieces of one engine step between the scheduler's plan and the
/// tokens it hands back: prefix look-ups before planning, a cache sequence
/// for each admitted request, the packed batch of the plan's items, the
/// sampling of every logits row (each on its own workspace and Philox
/// stream) and the samples forked from a prompt's row.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/kv/block_pool.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sched/scheduler.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/detail/output.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/sample.hpp"
#include "llmkit/serve/stats.hpp"

namespace llmkit::serve::detail {

/// What the steps reuse: the packed batch, one sampling workspace and
/// result per sampled row (`[n_rows]`), the logits row of each sampled
/// row's first position and its plan item (`[n_rows]`; a row with drafts
/// has more logits rows after it), and a copy of the plan for
/// `engine_options::on_step` (complete_step invalidates the plan).
struct step_buffers {
  model::batch_builder batch;
  std::vector<sched::step_item> beam_items;  ///< the plan's items of beam-search requests (beams.hpp)
  std::vector<beam_rows> beam_groups;        ///< their logits rows
  std::vector<sampling::candidates> workspaces;
  std::vector<row_result> results;
  std::vector<std::size_t> first_rows;
  std::vector<std::size_t> row_items;
  std::vector<token_id> segment;
  std::size_t n_logits = 0;  ///< logits rows of the requests build_batch packed (beam rows follow)
  sched::step_plan plan_copy;
};

/// A sample forked from its prompt's row in this step: its handle, its
/// forked sequence (nullopt when the cache had no room) and its first token.
struct fork_job {
  request_id handle;
  std::optional<kv::seq_id> seq;
  row_result row;
};

/// Blocks held by live sequences: the pool's used blocks but the published
/// prefix blocks nobody holds.
template <engine_cache Cache>
std::size_t held_blocks(const Cache& cache) {
  const kv::block_pool& pool = cache.pool();
  std::size_t cached = 0;
  if constexpr (prefix_reusing_cache<Cache>) cached = cache.stats().n_evictable_blocks;
  return pool.n_total() - pool.n_free() - cached;
}

/// Looks the first waiting requests (as many as one step may admit) up in
/// the prefix cache and tells the scheduler their cached prefix, so that
/// admission plans only the prefill past it. Nothing without prefix reuse.
template <engine_cache Cache>
void look_up_prefixes(const Cache& cache, sched::scheduler& sched, const live_map& live, prefix_reuse reuse) {
  if constexpr (prefix_reusing_cache<Cache>) {
    if (reuse == prefix_reuse::disabled) return;
    const auto& p = sched.get_policy();
    const std::size_t window = static_cast<std::size_t>(std::max(p.max_batch_seqs, p.length_window) + 1);
    const auto& waiting = sched.state().waiting;
    std::vector<std::pair<request_id, std::int64_t>> hits;
    for (std::size_t i = 0; i < waiting.size() && i < window; ++i) {
      const live_request& l = live.at(waiting[i].id);
      std::size_t n = l.beams ? std::numeric_limits<std::size_t>::max() : cache.match(l.context);
      if (l.beams)  // every beam's sequence starts at the same position
        for (const live_beam& b : l.beams->live) n = std::min(n, cache.match(b.context));
      hits.emplace_back(waiting[i].id, static_cast<std::int64_t>(n));
    }
    for (const auto& [id, n] : hits) sched.set_cached_prefix(id, n);
  }
}

/// A new cache sequence for `[n] context` holding its first `first_pos`
/// tokens (from the prefix cache when first_pos > 0), counted in `stats`.
/// @throws llmkit::error when the cache holds its maximum of sequences or
/// disagrees with the plan.
template <engine_cache Cache>
kv::seq_id open_context_sequence(Cache& cache, std::span<const token_id> context, std::int64_t first_pos,
                                 prefix_reuse reuse, engine_stats& stats) {
  std::optional<kv::seq_id> seq;
  const auto n_reused = static_cast<std::size_t>(first_pos);
  if constexpr (prefix_reusing_cache<Cache>) {
    if (reuse == prefix_reuse::enabled) {
      const auto hit = cache.add_sequence(context);
      LLMKIT_CHECK(hit.has_value(), "engine: the cache holds its maximum number of sequences");
      seq = hit->seq;
      LLMKIT_CHECK(hit->n_cached_tokens >= n_reused, "engine: the prefix cache found ", hit->n_cached_tokens,
                   " cached tokens, the plan expected ", n_reused);
      if (hit->n_cached_tokens > n_reused) cache.truncate(*seq, n_reused);
    }
  }
  if (!seq) {
    LLMKIT_CHECK(n_reused == 0, "engine: a plan starts at position ", n_reused, " without prefix reuse");
    seq = cache.add_sequence();
    LLMKIT_CHECK(seq.has_value(), "engine: the cache holds its maximum number of sequences");
  }
  stats.n_prompt_tokens_reused += n_reused;
  return *seq;
}

/// Gives admitted request `l` its cache sequence, holding its first
/// `first_pos` context tokens (from the prefix cache when first_pos > 0),
/// and counts them in `stats` (and in l's usage at its first admission).
/// @throws llmkit::error when the cache holds its maximum of sequences or
/// disagrees with the plan.
template <engine_cache Cache>
kv::seq_id open_sequence(Cache& cache, live_request& l, std::int64_t first_pos, prefix_reuse reuse,
                         engine_stats& stats) {
  const kv::seq_id seq = open_context_sequence(cache, l.context, first_pos, reuse, stats);
  if (!l.admitted) l.usage.n_prompt_tokens_reused = static_cast<std::size_t>(first_pos);
  l.admitted = true;
  l.seq = seq;
  return seq;
}

/// Packs the items of `plan` whose request is live into `batch`
/// (`buffers.batch`, cleared first), opening the sequences of newly
/// admitted requests, and returns `[n_rows]` the request of each sampled
/// row. A decode item i with guesses `drafts[i]` (`[n_items]`, or empty
/// for none) computes its newest token and the guesses, with the logits of
/// each, row by row as one-token decodes (`batch_builder::add_stepwise`).
/// Fills `buffers.first_rows`, `buffers.row_items` and `buffers.n_logits`
/// (the logits rows packed). Prefilled tokens are counted in `stats`. The
/// items of beam-search requests are left to `add_beam_rows` (beams.hpp),
/// listed in `buffers.beam_items`.
template <engine_cache Cache>
std::vector<request_id> build_batch(const sched::step_plan& plan, live_map& live, Cache& cache, prefix_reuse reuse,
                                    step_buffers& buffers, engine_stats& stats,
                                    std::span<const std::vector<token_id>> drafts = {}) {
  model::batch_builder& batch = buffers.batch;
  std::vector<sched::step_item>& beam_items = buffers.beam_items;
  batch.clear();
  beam_items.clear();
  buffers.first_rows.clear();
  buffers.row_items.clear();
  std::vector<request_id> rows;
  std::size_t n_logits = 0;
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    const sched::step_item& it = plan.items[i];
    if (!live.contains(it.id)) continue;
    live_request& l = live.at(it.id);
    if (l.beams) {  // packed after the others by add_beam_rows
      beam_items.push_back(it);
      continue;
    }
    const kv::seq_id seq = l.seq ? *l.seq : open_sequence(cache, l, it.first_pos, reuse, stats);
    LLMKIT_ASSERT(cache.n_tokens(seq) == static_cast<std::size_t>(it.first_pos));
    const auto tokens = std::span<const token_id>(l.context)
                            .subspan(static_cast<std::size_t>(it.first_pos), static_cast<std::size_t>(it.n_tokens));
    const std::size_t n_drafts = i < drafts.size() ? drafts[i].size() : 0;
    if (n_drafts == 0) {
      batch.add(seq, tokens, static_cast<std::int32_t>(it.first_pos),
                it.samples ? model::last_logits::keep : model::last_logits::skip);
    } else {
      LLMKIT_ASSERT(it.samples && !it.is_prefill && n_drafts <= static_cast<std::size_t>(it.n_lookahead));
      buffers.segment.assign(tokens.begin(), tokens.end());
      buffers.segment.insert(buffers.segment.end(), drafts[i].begin(), drafts[i].end());
      const auto first = static_cast<std::int32_t>(batch.n_tokens());
      batch.add_stepwise(seq, buffers.segment, static_cast<std::int32_t>(it.first_pos));
      for (std::size_t j = 0; j <= n_drafts; ++j) batch.request_logits(first + static_cast<std::int32_t>(j));
    }
    if (it.is_prefill) stats.n_prompt_tokens_prefilled += static_cast<std::uint64_t>(it.n_tokens);
    if (it.samples) {
      rows.push_back(it.id);
      buffers.first_rows.push_back(n_logits);
      buffers.row_items.push_back(i);
      n_logits += 1 + n_drafts;
    }
  }
  buffers.n_logits = n_logits;
  return rows;
}

/// Publishes the blocks the step filled for the plan's live requests.
template <engine_cache Cache>
void commit_prefixes(Cache& cache, const sched::step_plan& plan, const live_map& live) {
  if constexpr (prefix_reusing_cache<Cache>) {
    for (const sched::step_item& it : plan.items)
      if (const auto l = live.find(it.id); l != live.end()) {
        if (!l->second.beams) cache.commit(*l->second.seq);
        else
          for (const live_beam& b : l->second.beams->live) cache.commit(*b.seq);
      }
  }
}

/// Processes `[vocab] row` with l's chain in workspace `ws` and draws the
/// token that follows `[n_prompt + n] context` (l's context, or l's context
/// and guesses) into `out` (or the chain's error).
inline void sample_into(const live_request& l, std::span<const token_id> context, std::span<const float> row,
                        sampling::candidates& ws, row_result& out) {
  out.error.clear();
  out.top.clear();
  try {
    out.top.resize(l.request.top_logprobs);
    std::size_t n_top = 0;
    out.sample = sample_token(l.chain, l.request, context, row, ws, out.top, &n_top, l.grammar ? &*l.grammar : nullptr);
    out.top.resize(n_top);
  } catch (const std::exception& e) {
    out.error = e.what();
    out.sample = {};
  }
}

/// `sample_into` for l's next token.
inline void sample_into(const live_request& l, std::span<const float> row, sampling::candidates& ws,
                        row_result& out) {
  sample_into(l, l.context, row, ws, out);
}

/// Samples the logits row `buffers.first_rows[k]` for request `rows[k]` into
/// `buffers.results[k]`, rows split over `exec`'s threads. Every row has its
/// own workspace and Philox stream: a draw does not depend on the row's
/// place in the batch or on the thread.
template <executor Exec>
void sample_rows(Exec& exec, const live_map& live, std::span<const request_id> rows,
                 matrix_view<const float> logits, step_buffers& buffers) {
  buffers.results.resize(rows.size());
  if (buffers.workspaces.size() < rows.size()) buffers.workspaces.resize(rows.size());
  exec.parallel_for(rows.size(), [&](std::size_t k) {
    sample_into(live.at(rows[k]), logits.row(buffers.first_rows[k]), buffers.workspaces[k], buffers.results[k]);
  });
}

/// Samples 1 .. n - 1 of a prompt whose logits were just sampled for the
/// first time (sampled row k of `logits`, request `rows[k]`) draw
/// from the same row and fork its sequence's blocks copy-on-write. Clears
/// the prompts' pending forks; returns the forked samples, to be started
/// after the step's own tokens.
template <engine_cache Cache>
std::vector<fork_job> fork_samples(Cache& cache, live_map& live, std::span<const request_id> rows,
                                   matrix_view<const float> logits, step_buffers& buffers) {
  std::vector<fork_job> forks;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    live_request& l = live.at(rows[k]);
    if (l.pending_forks.empty() || l.context.size() != l.n_prompt) continue;
    for (request_id h : l.pending_forks) {
      const auto c = live.find(h);
      if (c == live.end()) continue;
      fork_job job{h, cache.fork(*l.seq), {}};
      if (buffers.workspaces.empty()) buffers.workspaces.resize(1);
      sample_into(c->second, logits.row(buffers.first_rows[k]), buffers.workspaces[0], job.row);
      forks.push_back(std::move(job));
    }
    l.pending_forks.clear();
  }
  return forks;
}

}  // namespace llmkit::serve::detail
