// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/stats.hpp
/// Counters and gauges of a serving engine (what /metrics exports), read
/// from any thread with `engine::stats()`.

#include <array>
#include <cstddef>
#include <cstdint>

#include "llmkit/serve/request.hpp"

namespace llmkit::serve {

/// A snapshot of an engine. Gauges are as of the end of the last step (the
/// queue depth also counts submissions since); counters only grow.
struct engine_stats {
  // Gauges.
  std::size_t n_queued = 0;   ///< accepted requests not yet running (waiting or preempted)
  std::size_t n_running = 0;  ///< requests holding KV blocks
  std::size_t kv_blocks_total = 0;
  std::size_t kv_blocks_used = 0;    ///< blocks held by live sequences (shared blocks once)
  std::size_t kv_blocks_cached = 0;  ///< published prefix blocks no sequence holds (evicted on demand)
  std::size_t kv_blocks_free = 0;    ///< blocks on the free list
  /// Staging blocks held by prefilled requests not imported yet
  /// (`engine_options::staging_blocks` in all).
  std::size_t staging_blocks_used = 0;

  // Counters.
  std::uint64_t n_submitted = 0;  ///< submit calls, rejected ones included
  /// Finished requests by `finish_kind` (index `static_cast<std::size_t>(kind)`);
  /// rejected requests count as errors.
  std::array<std::uint64_t, 4> n_finished{};
  std::uint64_t n_rejected_queue_full = 0;
  /// `submit_prefilled` calls answered `staging_full` (not submitted: the
  /// caller retries).
  std::uint64_t n_rejected_staging_full = 0;
  /// Prefilled requests whose KV buffer was imported into the cache.
  std::uint64_t n_imported = 0;
  std::uint64_t n_steps = 0;        ///< steps that ran a forward pass
  std::uint64_t n_preemptions = 0;  ///< requests preempted (recompute)
  /// Tokens sampled by the engine (not the tokens given with prefilled requests).
  std::uint64_t n_generated_tokens = 0;
  /// Context tokens admitted from the prefix cache instead of being
  /// prefilled (first admissions and readmissions after preemption).
  std::uint64_t n_prompt_tokens_reused = 0;
  /// Tokens computed by prefill pieces (prompts and recomputed contexts).
  std::uint64_t n_prompt_tokens_prefilled = 0;
  /// Speculative decoding: guessed tokens verified, and those kept.
  std::uint64_t n_draft_tokens = 0;
  std::uint64_t n_draft_tokens_accepted = 0;

  std::uint64_t finished(finish_kind k) const noexcept { return n_finished[static_cast<std::size_t>(k)]; }
  std::uint64_t n_finished_total() const noexcept {
    return n_finished[0] + n_finished[1] + n_finished[2] + n_finished[3];
  }
};

}  // namespace llmkit::serve
