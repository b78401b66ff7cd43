// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/beam_group.hpp
/// What an engine keeps of a beam-search request between steps: its live
/// beams (each a KV sequence of the cache and a context), the finished
/// hypotheses kept so far, and the buffers one expansion reuses. The
/// engine hooks that drive it are in beams.hpp.

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/search/beam_search.hpp"
#include "llmkit/serve/request.hpp"

namespace llmkit::serve::detail {

/// One live beam: its sequence in the cache (while the request holds KV),
/// its `[n_prompt + n_generated]` context, its summed log-probability and
/// its grammar position (when the request has a grammar).
struct live_beam {
  std::optional<kv::seq_id> seq;
  std::vector<token_id> context;
  double logprob = 0.0;
  grammar::state_id grammar_state = 0;
};

/// The search state of a beam-search request. All live beams have the
/// same length: the scheduler sees the group as one request of `width`
/// sequences (`sched::seq_record::width`).
struct beam_group {
  beam_group(const beam_options& o, const std::vector<token_id>& prompt,
             std::shared_ptr<const grammar::token_masker> g = nullptr)
      : options(o), grammar(std::move(g)), n_prompt(prompt.size()), done(o.width) {
    live.push_back({std::nullopt, prompt, 0.0, grammar ? grammar->grammar_automaton().start() : 0});
  }

  beam_options options;
  /// The request's grammar: each beam's row is masked by its position
  /// before the expansion (nullptr = none).
  std::shared_ptr<const grammar::token_masker> grammar;
  std::size_t n_prompt;
  std::vector<live_beam> live;  ///< `[n_live]`: the prompt alone until its logits are expanded
  search::detail::hypothesis_set done;
  std::size_t n_steps = 0;  ///< expansions so far (tokens of each live beam)

  // Reused by every expansion.
  std::vector<double> lse;
  search::detail::expansion_buffers buffers;
  std::vector<search::detail::beam_pick> picks;
  std::vector<search::beam_hypothesis> finished;
  std::vector<std::size_t> n_children;
  std::vector<float> masked;  ///< `[n_live, vocab]` grammar-masked rows
};

/// The logits rows of a beam-search request in one step: rows
/// `[first_row, first_row + n_live)` of the forward pass, one per live beam.
struct beam_rows {
  request_id id;
  std::size_t first_row;
};

}  // namespace llmkit::serve::detail
