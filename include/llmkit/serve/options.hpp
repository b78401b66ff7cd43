// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/options.hpp
/// The knobs of a serving engine: context length, scheduling policy,
/// admission limits, prefix reuse, the staging area of prefilled requests.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "llmkit/sched/policy.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/serve/draft.hpp"

namespace llmkit::serve {

/// Whether requests sharing a prompt prefix reuse its cached K/V (with a
/// cache that offers it, `kv::prefix_cache`; other caches never reuse).
enum class prefix_reuse : std::uint8_t {
  enabled,   ///< look every admitted context up in the prefix cache
  disabled,  ///< always prefill whole contexts (e.g. to compare)
};

/// What the engine reports after each step that ran a forward pass (for
/// traces, cost-model fits and replay tools).
struct step_report {
  /// The step's plan: items (prefill pieces and decodes), admissions,
  /// preemptions, layout. Valid during the call only.
  const sched::step_plan& plan;
  /// KV blocks held by live sequences right after the forward pass (before
  /// the requests that finished in this step released theirs).
  std::size_t kv_blocks_used = 0;
};

/// Options of `engine`. Designated initialisers at call sites:
/// `engine_options{.max_context = 1024, .max_queued = 64}`.
struct engine_options {
  /// Most tokens of one sequence (prompt + max_new_tokens); a longer request
  /// is rejected at submit.
  std::int64_t max_context = 2048;
  /// How steps are formed. `policy.max_batch_seqs` is the most requests
  /// running at once; `preempt` is always recompute (the engine never swaps
  /// a running request out: its swap space is only the staging area below).
  sched::policy policy{.max_batch_seqs = 32, .max_step_tokens = 512, .chunked_prefill = true};
  /// Most requests waiting for admission (submitted, not yet running);
  /// `submit` answers `submit_status::queue_full` beyond it.
  std::size_t max_queued = 1024;
  /// Widest beam search a request may ask for (`beam_options::width`).
  std::size_t max_beam_width = 16;
  prefix_reuse reuse = prefix_reuse::enabled;
  /// KV blocks (of the cache's block size) that the buffers of requests
  /// handed in with `engine::submit_prefilled` may take while they wait to be
  /// imported: the scheduler's swap space. A buffer of n tokens takes
  /// ceil(n / block_size) blocks; `submit_prefilled` answers
  /// `submit_status::staging_full` when they are taken. 0 = no staging:
  /// `submit_prefilled` is refused (`invalid`). Needs a cache that imports
  /// (`importing_cache`: `kv::paged_cache`, `kv::prefix_cache`) and
  /// continuous batching.
  std::int64_t staging_blocks = 0;
  /// Called on the step thread at the end of every step that ran a forward
  /// pass, after that step's events (empty = nothing).
  std::function<void(const step_report&)> on_step = {};
  /// The draft model of requests with `speculation::drafter` = model
  /// (caller-owned, outlives the engine; nullptr = none: such requests are
  /// rejected at submit).
  batch_drafter* draft_model = nullptr;
  /// Most guesses a request may ask for per step (`speculation::max_tokens`).
  std::size_t max_draft_tokens = 16;
  /// Prompt lookup is off in a step with more decodes than this: past it
  /// the batch is compute-bound and verifying guesses costs about what they
  /// save (the guesses themselves cost nothing).
  std::size_t max_drafting_decodes = 8;
  /// Drafting from `draft_model` is off in a step with more decodes than
  /// this. Each guess then costs a draft forward too: with the int8
  /// self-draft (about 0.74 of a target decode) drafting paid only with one
  /// decode per step (docs/serving.md, "Speculative decoding figures"); a
  /// draft many times cheaper than the target may raise it.
  std::size_t max_model_drafting_decodes = 1;
};

}  // namespace llmkit::serve
