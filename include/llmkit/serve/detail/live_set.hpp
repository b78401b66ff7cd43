// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/live_set.hpp
/// The requests an engine's step thread holds between their submission and
/// their finish (`live_request`, keyed by handle in a `live_map`), how one
/// becomes a scheduler request, and the samples 1 .. n - 1 of an n > 1
/// request that wait beside sample 0 to be forked from its prompt.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/processor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/sched/scheduler.hpp"
#include "llmkit/serve/detail/beam_group.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/text_stream.hpp"

namespace llmkit::serve::detail {

/// A request the engine holds (the scheduler owns its place in the
/// queue or the batch), with what the engine keeps beside it.
struct live_request {
  generation_request request;
  sampling::runtime_chain chain;
  /// The grammar position of this sample (`request.grammar` set, no beams).
  std::optional<grammar::grammar_processor> grammar;
  std::vector<token_id> context;  ///< `[n_prompt + n_generated]` prompt then generated tokens
  std::size_t n_prompt = 0;
  std::optional<kv::seq_id> seq;  ///< while it holds KV (running)
  text_stream text;
  request_usage usage;
  bool admitted = false;                  ///< has had a cache sequence once
  std::size_t index = 0;                  ///< sample index of an n > 1 request
  std::vector<request_id> pending_forks;  ///< samples to fork when the prompt's logits are sampled
  bool awaiting_fork = false;             ///< a sample not yet in the scheduler
  std::vector<std::byte> kv;              ///< a prefilled request's buffer until imported
  std::int64_t staged_blocks = 0;         ///< staging blocks it holds until then
  /// A beam-search request's beams (then `seq` stays empty, `context` is
  /// the prompt, and `n` samples are its n best hypotheses).
  std::optional<beam_group> beams;
};

/// The live requests by handle.
using live_map = std::unordered_map<request_id, live_request>;

/// A live request for `request` drawn with `chain`: its prompt is its
/// context, nothing generated yet.
inline live_request new_live_request(generation_request request, sampling::runtime_chain chain) {
  live_request l;
  l.n_prompt = request.prompt.size();
  l.context = request.prompt;
  l.usage.n_prompt_tokens = l.n_prompt;
  l.chain = std::move(chain);
  if (request.grammar && !request.beam) l.grammar.emplace(request.grammar);
  l.request = std::move(request);
  return l;
}

/// What the scheduler is told of live request `l` (handle `h`): its prompt
/// and stop rules (a beam search's budget only, and its width).
inline sched::request scheduler_request(request_id h, const live_request& l) {
  sched::request r;
  r.id = h;
  r.prompt = l.request.prompt;
  r.stop = l.request.stop;
  if (l.beams) {  // the search ends hypotheses itself; the scheduler counts the budget and the beams' blocks
    r.stop = {.max_new_tokens = l.request.stop.max_new_tokens};
    r.width = static_cast<std::int64_t>(l.beams->options.width);
  }
  if (l.request.speculative.drafter != draft_source::none)
    r.n_lookahead = static_cast<std::int64_t>(l.request.speculative.max_tokens);
  return r;
}

/// The handles of `live`, ascending (the order in which a step ends them
/// all, so that events do not depend on the map's layout).
inline std::vector<request_id> sorted_handles(const live_map& live) {
  std::vector<request_id> all;
  all.reserve(live.size());
  for (const auto& [h, r] : live) all.push_back(h);
  std::sort(all.begin(), all.end());
  return all;
}

/// Samples waiting to be forked (counted as queued).
inline std::size_t n_awaiting_fork(const live_map& live) {
  std::size_t n = 0;
  for (const auto& [h, l] : live) n += l.awaiting_fork ? 1 : 0;
  return n;
}

/// Sample 0 (`l`, already out of `live`) ended before its prompt's logits
/// were sampled: its waiting samples go to the scheduler as requests of
/// their own (prefix reuse still shares the prompt).
inline void release_forks(live_map& live, live_request& l, sched::scheduler& sched) {
  for (request_id h : l.pending_forks) {
    const auto it = live.find(h);
    if (it == live.end()) continue;
    it->second.awaiting_fork = false;
    sched.submit(scheduler_request(h, it->second));
  }
  l.pending_forks.clear();
}

}  // namespace llmkit::serve::detail
