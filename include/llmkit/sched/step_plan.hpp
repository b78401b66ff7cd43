// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/step_plan.hpp
/// What one engine step computes: the output of a scheduling policy and the
/// input of the cost model and of the engine's forward pass.

#include <cstdint>
#include <vector>

#include "llmkit/sched/request.hpp"

namespace llmkit::sched {

/// How the prefill pieces of a step are laid out for the forward pass.
enum class prefill_layout {
  /// Concatenated without padding (varlen / ragged kernels).
  ragged,
  /// One row per prefill piece, every row padded to the longest piece of
  /// the step (dense batched prefill).
  padded,
  /// Prepacked: pieces bin-packed into rows of a fixed capacity, each piece
  /// its own causal block with positions restarting at its first position.
  packed,
};

/// Name of a layout ("ragged", "padded", "packed").
constexpr const char* to_string(prefill_layout l) noexcept {
  switch (l) {
    case prefill_layout::ragged: return "ragged";
    case prefill_layout::padded: return "padded";
    case prefill_layout::packed: return "packed";
  }
  return "?";
}

/// The tokens one sequence contributes to a step: positions
/// [first_pos, first_pos + n_tokens) of its context (prompt then generated
/// tokens). A decode is `n_tokens == 1` at the newest position.
struct step_item {
  request_id id = 0;
  std::int64_t first_pos = 0;
  std::int64_t n_tokens = 0;
  /// True when the piece ends at the newest token of the context, so the
  /// logits of its last token are sampled.
  bool samples = false;
  /// True for a prefill piece (part of the prompt, or of a context being
  /// recomputed after preemption), false for a single-token decode.
  bool is_prefill = false;
  /// Decodes only: draft tokens the engine may append to this item for
  /// speculative verification (positions after the newest token), their
  /// KV blocks and step slots reserved. The step computes 1 + the drafts
  /// actually appended; up to that many accepted ones are committed.
  std::int64_t n_lookahead = 0;
  friend constexpr bool operator==(const step_item&, const step_item&) = default;
};

/// A preemption or swap decided for this step, with the blocks it moves.
struct block_move {
  request_id id = 0;
  std::int64_t n_blocks = 0;
  friend constexpr bool operator==(const block_move&, const block_move&) = default;
};

/// One step of the engine, as decided by a policy.
///
/// Order of application (what `commit_step` does and what an engine must
/// do): preemptions and swap-outs, then swap-ins and admissions, then the
/// forward pass over `items`, then sampling for items with `samples`.
struct step_plan {
  /// `[n_items]` the sequences computed in this step; decodes first.
  std::vector<step_item> items;
  /// Requests moved from the waiting queue to running (their first piece is
  /// in `items`), with the blocks reserved for them up front (0 = blocks
  /// are allocated as the sequence grows).
  std::vector<block_move> admitted;
  /// Running requests preempted by recompute: their KV blocks are freed and
  /// they return to the front of the waiting queue.
  std::vector<block_move> preempted;
  /// Running requests whose KV blocks are copied to the swap space.
  std::vector<block_move> swapped_out;
  /// Swapped requests whose KV blocks are copied back to the device pool.
  std::vector<block_move> swapped_in;

  /// Layout of the prefill pieces.
  prefill_layout layout = prefill_layout::ragged;
  /// For `padded` and `packed`: `[n_rows][pieces]` indices into `items` of
  /// the prefill pieces of each row. Empty for `ragged`.
  std::vector<std::vector<std::size_t>> prefill_rows;
  /// For `padded` and `packed`: the length every row is computed at.
  std::int64_t row_length = 0;
  /// Request-level batching: the size of the batch formed in this step
  /// (0 otherwise); no request joins until the whole batch has finished.
  std::int64_t static_batch_size = 0;
  /// Idle batch slots computing a dummy token (request-level batching keeps
  /// a finished request's slot until the whole batch is done).
  std::int64_t n_idle_slots = 0;

  /// True when the step computes nothing.
  bool empty() const noexcept { return items.empty(); }

  /// Real tokens computed (sum of `n_tokens`).
  std::int64_t n_tokens() const noexcept {
    std::int64_t n = 0;
    for (const auto& it : items) n += it.n_tokens;
    return n;
  }

  /// Prefill tokens among `n_tokens()`.
  std::int64_t n_prefill_tokens() const noexcept {
    std::int64_t n = 0;
    for (const auto& it : items) n += it.is_prefill ? it.n_tokens : 0;
    return n;
  }

  /// Items whose logits are sampled (one new token each).
  std::int64_t n_samples() const noexcept {
    std::int64_t n = 0;
    for (const auto& it : items) n += it.samples ? 1 : 0;
    return n;
  }

  /// Lookahead slots reserved for draft tokens (sum of `n_lookahead`).
  std::int64_t n_lookahead_tokens() const noexcept {
    std::int64_t n = 0;
    for (const auto& it : items) n += it.n_lookahead;
    return n;
  }

  /// Token slots the forward pass computes, padding included: the prefill
  /// rows at `row_length` (or the real prefill tokens when ragged), plus the
  /// decodes and their lookahead slots, plus the idle slots.
  std::int64_t n_computed_tokens() const noexcept {
    const std::int64_t prefill = layout == prefill_layout::ragged
                                     ? n_prefill_tokens()
                                     : static_cast<std::int64_t>(prefill_rows.size()) * row_length;
    return prefill + (n_tokens() - n_prefill_tokens()) + n_lookahead_tokens() + n_idle_slots;
  }
};

}  // namespace llmkit::sched
