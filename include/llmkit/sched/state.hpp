// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/state.hpp
/// The scheduler's state: the waiting queue, the running batch, the swapped
/// requests and the KV block accounting, plus the transitions that change
/// it (submit, cancel, commit a step). Policies (`sched/policy.hpp`) read it
/// and never change it.
///
/// The scheduler counts blocks only; the engine's paged cache owns them.
/// With the same block size, every `grow` the engine performs for a
/// committed plan succeeds.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_set>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/sched/request.hpp"
#include "llmkit/sched/step_plan.hpp"

namespace llmkit::sched {

/// Blocks needed to hold `n_tokens` tokens: ceil(n_tokens / block_size).
constexpr std::int64_t blocks_for(std::int64_t n_tokens, std::int64_t block_size) noexcept {
  return (n_tokens + block_size - 1) / block_size;
}

/// What the engine can hold.
struct engine_limits {
  /// Most tokens one sequence may hold (prompt + generated).
  std::int64_t max_context = 2048;
  /// Tokens per KV block.
  std::int64_t block_size = 16;
  /// Blocks in the device KV pool.
  std::int64_t n_blocks = 1024;
  /// Blocks in the swap space (0 = no swapping: preemption recomputes).
  std::int64_t n_swap_blocks = 0;
};

/// One request as the scheduler sees it: lengths and progress.
///
/// The context is the prompt followed by the generated tokens. K/V exist for
/// its first `n_cached` tokens; a token is sampled when a step brings
/// `n_cached` up to `context()`. So a decode computes exactly the newest
/// token, and a request preempted by recompute (n_cached = 0) prefills its
/// whole context again.
struct seq_record {
  request_id id = 0;
  std::int64_t n_prompt = 0;
  std::int64_t max_new_tokens = 0;
  /// Tokens sampled so far.
  std::int64_t n_generated = 0;
  /// Tokens whose K/V are cached (on the device, or in swap when swapped).
  std::int64_t n_cached = 0;
  /// Blocks held (device blocks when running, swap blocks when swapped).
  std::int64_t n_blocks = 0;
  double arrival_s = 0.0;
  /// Times this request was preempted (recompute or swap).
  std::int64_t n_preemptions = 0;
  /// KV sequences the request runs as: a beam-search group of width B
  /// holds B sequences of its context, so every block count is B times
  /// that of one sequence (an upper bound: forks share blocks).
  std::int64_t width = 1;
  /// Lookahead slots: draft tokens a decode of this request may carry for
  /// speculative verification (0 = plain decodes). A policy reserves their
  /// blocks with the decode; `commit_step` keeps the accepted ones.
  std::int64_t n_lookahead = 0;

  /// Prompt plus generated tokens.
  constexpr std::int64_t context() const noexcept { return n_prompt + n_generated; }
  /// Tokens to compute before the next token can be sampled.
  constexpr std::int64_t pending() const noexcept { return context() - n_cached; }
  /// Most tokens this request ever caches: the last sampled token is never
  /// computed.
  constexpr std::int64_t max_cached() const noexcept { return n_prompt + max_new_tokens - 1; }
  /// Blocks for `n_tokens` tokens in each of the request's `width` sequences.
  constexpr std::int64_t blocks(std::int64_t n_tokens, std::int64_t block_size) const noexcept {
    return width * blocks_for(n_tokens, block_size);
  }
};

/// The scheduler state. Plain data: copy it to explore "what if".
struct sched_state {
  engine_limits limits;
  /// Device blocks not held by a running request.
  std::int64_t n_free_blocks = 0;
  /// Swap blocks not held by a swapped request.
  std::int64_t n_free_swap_blocks = 0;
  /// First come, first served; requests preempted by recompute go back to
  /// the front.
  std::vector<seq_record> waiting;
  /// In admission order: the first is the oldest and the last to be
  /// preempted.
  std::vector<seq_record> running;
  /// Swapped out, in the order they were swapped (first in, first back).
  std::vector<seq_record> swapped;
  /// Request-level batching: slots of the batch in flight (0 when none).
  std::int64_t static_batch_size = 0;
  /// Every id ever submitted (duplicates are rejected).
  std::unordered_set<request_id> seen_ids;
};

/// An empty state for an engine with these limits.
/// Raises `llmkit::error` when the limits are unusable (a single request of
/// `max_context` tokens must fit in the device pool).
inline sched_state make_state(const engine_limits& limits) {
  LLMKIT_CHECK(limits.max_context >= 2, "engine_limits: max_context must be >= 2, got ", limits.max_context);
  LLMKIT_CHECK(limits.block_size >= 1, "engine_limits: block_size must be >= 1, got ", limits.block_size);
  LLMKIT_CHECK(limits.n_swap_blocks >= 0, "engine_limits: n_swap_blocks must be >= 0, got ", limits.n_swap_blocks);
  LLMKIT_CHECK(limits.n_blocks >= blocks_for(limits.max_context, limits.block_size), "engine_limits: n_blocks = ",
               limits.n_blocks, " cannot hold one sequence of max_context = ", limits.max_context, " tokens (needs ",
               blocks_for(limits.max_context, limits.block_size), " blocks of ", limits.block_size, ")");
  sched_state s;
  s.limits = limits;
  s.n_free_blocks = limits.n_blocks;
  s.n_free_swap_blocks = limits.n_swap_blocks;
  return s;
}

namespace detail {
/// The checks `submit`, `submit_prefilled` and `submit_forked` (`who`, for
/// the messages) share: a new id, a non-empty prompt, a budget of at least
/// one token when nothing is sampled yet (`n_generated` nullopt) or else
/// `n_generated` in [1, max_new_tokens), prompt + max_new_tokens within
/// `limits.max_context`.
inline void check_new_request(const sched_state& s, const char* who, request_id id, std::int64_t n_prompt,
                              std::int64_t max_new_tokens, std::optional<std::int64_t> n_generated) {
  LLMKIT_CHECK(!s.seen_ids.contains(id), who, ": duplicate request id ", id);
  LLMKIT_CHECK(n_prompt >= 1, who, ": request ", id, ": prompt is empty");
  if (!n_generated)
    LLMKIT_CHECK(max_new_tokens >= 1, "request ", id, ": max_new_tokens must be >= 1, got ", max_new_tokens);
  LLMKIT_CHECK(n_prompt + max_new_tokens <= s.limits.max_context, "request ", id, ": prompt length ", n_prompt,
               " + max_new_tokens ", max_new_tokens, " exceeds the context of ", s.limits.max_context, " tokens");
  if (n_generated)
    LLMKIT_CHECK(*n_generated >= 1 && *n_generated < max_new_tokens, who, ": request ", id, ": n_generated = ",
                 *n_generated, " is outside [1, max_new_tokens = ", max_new_tokens, ")");
}
}  // namespace detail

/// Adds a request of `n_prompt` prompt tokens to the back of the waiting
/// queue. Raises `llmkit::error` (and changes nothing) for a duplicate id,
/// an empty prompt, `max_new_tokens < 1`, or prompt + max_new_tokens above
/// `limits.max_context`.
/// `width` > 1: a beam-search group of that many sequences (see
/// `seq_record::width`), which must fit the pool at its longest.
inline void submit(sched_state& s, request_id id, std::int64_t n_prompt, std::int64_t max_new_tokens,
                   double arrival_s = 0.0, std::int64_t width = 1) {
  detail::check_new_request(s, "submit", id, n_prompt, max_new_tokens, std::nullopt);
  const seq_record r{.id = id, .n_prompt = n_prompt, .max_new_tokens = max_new_tokens, .arrival_s = arrival_s,
                     .width = width};
  LLMKIT_CHECK(width >= 1, "submit: request ", id, ": width must be >= 1, got ", width);
  LLMKIT_CHECK(r.blocks(r.max_cached(), s.limits.block_size) <= s.limits.n_blocks, "submit: request ", id,
               ": width ", width, " x ", r.max_cached(), " tokens needs ", r.blocks(r.max_cached(), s.limits.block_size),
               " blocks, the pool holds ", s.limits.n_blocks);
  s.seen_ids.insert(id);
  s.waiting.push_back(r);
}

/// Hands a request prefilled elsewhere (prefill/decode disaggregation) to
/// this scheduler: its `n_prompt` prompt tokens are cached in an exported KV
/// buffer and its first `n_generated` tokens are sampled. It waits with the
/// swapped requests (its buffer counts against the swap space, the staging
/// area of received KV) and is swapped in, that is imported into the device
/// pool, first come first served when blocks are free. Returns false, with
/// nothing changed, when the staging area has no room yet (back-pressure:
/// the sender keeps the buffer and retries). Raises `llmkit::error` as
/// `submit` does, and when `n_generated` is not in [1, max_new_tokens).
inline bool submit_prefilled(sched_state& s, request_id id, std::int64_t n_prompt, std::int64_t max_new_tokens,
                             std::int64_t n_generated = 1, double arrival_s = 0.0) {
  detail::check_new_request(s, "submit_prefilled", id, n_prompt, max_new_tokens, n_generated);
  seq_record r{.id = id, .n_prompt = n_prompt, .max_new_tokens = max_new_tokens, .n_generated = n_generated,
               .arrival_s = arrival_s};
  r.n_cached = r.context() - 1;
  r.n_blocks = blocks_for(r.n_cached, s.limits.block_size);
  if (r.n_blocks > s.n_free_swap_blocks) return false;
  s.seen_ids.insert(id);
  s.n_free_swap_blocks -= r.n_blocks;
  s.swapped.push_back(r);
  return true;
}

namespace detail {
inline std::optional<seq_record> take(std::vector<seq_record>& list, request_id id) {
  const auto it = std::find_if(list.begin(), list.end(), [&](const seq_record& r) { return r.id == id; });
  if (it == list.end()) return std::nullopt;
  seq_record r = *it;
  list.erase(it);
  return r;
}
inline seq_record* find(std::vector<seq_record>& list, request_id id) {
  const auto it = std::find_if(list.begin(), list.end(), [&](const seq_record& r) { return r.id == id; });
  return it == list.end() ? nullptr : &*it;
}
}  // namespace detail

/// Removes request `id` wherever it is and frees its blocks. Returns its
/// record, or nothing when it is not live (unknown, finished or already
/// cancelled). A plan computed before the cancellation can still be
/// committed: its items for `id` are ignored.
inline std::optional<seq_record> cancel(sched_state& s, request_id id) {
  if (auto r = detail::take(s.waiting, id)) return r;
  if (auto r = detail::take(s.running, id)) {
    s.n_free_blocks += r->n_blocks;
    if (s.running.empty()) s.static_batch_size = 0;
    return r;
  }
  if (auto r = detail::take(s.swapped, id)) {
    s.n_free_swap_blocks += r->n_blocks;
    return r;
  }
  return std::nullopt;
}

/// Adds a request that already has `n_generated` sampled tokens and whose
/// first `n_cached` context tokens the engine's cache holds in a sequence of
/// its own (a sample forked from another request's prefilled prompt, which
/// shares its blocks copy-on-write). It joins the running requests when
/// `n_cached > 0`, `blocks_for(n_cached)` blocks are free and fewer than
/// `max_running` requests run; otherwise it waits at the front of the queue
/// to recompute its context (n_cached = 0), as a preempted request does.
/// Returns true when it runs. Raises `llmkit::error` as `submit` does, and
/// when `n_generated` is outside [1, max_new_tokens) or `n_cached` outside
/// [0, n_prompt + n_generated).
inline bool submit_forked(sched_state& s, request_id id, std::int64_t n_prompt, std::int64_t max_new_tokens,
                          std::int64_t n_generated, std::int64_t n_cached, std::int64_t max_running,
                          double arrival_s = 0.0) {
  detail::check_new_request(s, "submit_forked", id, n_prompt, max_new_tokens, n_generated);
  LLMKIT_CHECK(n_cached >= 0 && n_cached < n_prompt + n_generated, "submit_forked: request ", id, ": n_cached = ",
               n_cached, " is outside [0, context = ", n_prompt + n_generated, ")");
  seq_record r{.id = id, .n_prompt = n_prompt, .max_new_tokens = max_new_tokens, .n_generated = n_generated,
               .arrival_s = arrival_s};
  s.seen_ids.insert(id);
  const std::int64_t blocks = blocks_for(n_cached, s.limits.block_size);
  if (n_cached > 0 && blocks <= s.n_free_blocks && static_cast<std::int64_t>(s.running.size()) < max_running &&
      s.static_batch_size == 0) {
    r.n_cached = n_cached;
    r.n_blocks = blocks;
    s.n_free_blocks -= blocks;
    s.running.push_back(r);
    return true;
  }
  s.waiting.insert(s.waiting.begin(), r);
  return false;
}

/// Marks the first `n_cached` tokens of waiting request `id`'s context as
/// already cached (a prefix cache holds them), so that its admission plans
/// only the prefill of the rest, from position `n_cached`. Call it before
/// `plan_step`, with what the cache will hand out at admission. Returns
/// false, with nothing changed, when `id` is not waiting (unknown, running,
/// swapped or finished). Raises `llmkit::error` when `n_cached` is outside
/// [0, context): one token is always left to compute, for its logits.
inline bool set_cached_prefix(sched_state& s, request_id id, std::int64_t n_cached) {
  seq_record* r = detail::find(s.waiting, id);
  if (r == nullptr) return false;
  LLMKIT_CHECK(n_cached >= 0 && n_cached < r->context(), "set_cached_prefix: request ", id, ": n_cached = ", n_cached,
               " is outside [0, context = ", r->context(), ")");
  r->n_cached = n_cached;
  return true;
}

/// Number of live requests (waiting, running or swapped).
inline std::size_t n_live(const sched_state& s) noexcept {
  return s.waiting.size() + s.running.size() + s.swapped.size();
}

/// Applies a plan made by a policy from this very state (cancellations in
/// between are allowed) after the engine ran it: preemptions and swaps,
/// admissions, K/V growth of every item, and one sampled token per item with
/// `samples`, plus `[n_samples] n_accepted[k]` accepted draft tokens for the
/// k-th sampling item (empty = none; at most its `n_lookahead`): their K/V
/// are cached and they count as generated. A request finishes when it
/// reaches `max_new_tokens` or when its id is in `[n] stopped` (the
/// engine's stop criteria fired on the last token it took). Returns the
/// finished requests' records; their blocks are free.
inline std::vector<seq_record> commit_step(sched_state& s, const step_plan& plan,
                                           std::span<const request_id> stopped = {},
                                           std::span<const std::int64_t> n_accepted = {}) {
  const std::int64_t bs = s.limits.block_size;
  for (const block_move& m : plan.preempted) {
    if (auto r = detail::take(s.running, m.id)) {
      LLMKIT_ASSERT(r->n_blocks == m.n_blocks);
      s.n_free_blocks += r->n_blocks;
      r->n_blocks = 0;
      r->n_cached = 0;
      ++r->n_preemptions;
      s.waiting.insert(s.waiting.begin(), *r);
    }
  }
  for (const block_move& m : plan.swapped_out) {
    if (auto r = detail::take(s.running, m.id)) {
      LLMKIT_ASSERT(r->n_blocks == m.n_blocks);
      s.n_free_blocks += r->n_blocks;
      s.n_free_swap_blocks -= r->n_blocks;
      LLMKIT_ASSERT(s.n_free_swap_blocks >= 0);
      ++r->n_preemptions;
      s.swapped.push_back(*r);
    }
  }
  for (const block_move& m : plan.swapped_in) {
    if (auto r = detail::take(s.swapped, m.id)) {
      s.n_free_swap_blocks += r->n_blocks;
      s.n_free_blocks -= r->n_blocks;
      s.running.push_back(*r);
    }
  }
  for (const block_move& m : plan.admitted) {
    if (auto r = detail::take(s.waiting, m.id)) {
      r->n_blocks = m.n_blocks;
      s.n_free_blocks -= m.n_blocks;
      s.running.push_back(*r);
    }
  }
  if (plan.static_batch_size > 0) s.static_batch_size = plan.static_batch_size;

  std::vector<seq_record> finished;
  std::size_t k = 0;  // index of the sampling item
  for (const step_item& it : plan.items) {
    const std::int64_t extra = it.samples && k < n_accepted.size() ? n_accepted[k] : 0;
    if (it.samples) ++k;
    seq_record* r = detail::find(s.running, it.id);
    if (r == nullptr) continue;  // cancelled after planning
    LLMKIT_ASSERT(it.first_pos == r->n_cached && it.n_tokens >= 1 && r->n_cached + it.n_tokens <= r->context());
    LLMKIT_ASSERT(extra >= 0 && extra <= it.n_lookahead);
    r->n_cached += it.n_tokens + extra;
    r->n_generated += extra;
    const std::int64_t need = r->blocks(r->n_cached, bs) - r->n_blocks;
    if (need > 0) {
      s.n_free_blocks -= need;
      r->n_blocks += need;
    }
    LLMKIT_ASSERT(s.n_free_blocks >= 0);
    if (!it.samples) continue;
    LLMKIT_ASSERT(r->n_cached == r->context());
    ++r->n_generated;
    const bool stop = std::find(stopped.begin(), stopped.end(), it.id) != stopped.end();
    if (stop || r->n_generated >= r->max_new_tokens) finished.push_back(*r);
  }
  for (const seq_record& f : finished) {
    auto r = detail::take(s.running, f.id);
    s.n_free_blocks += r->n_blocks;
  }
  if (s.running.empty()) s.static_batch_size = 0;
  return finished;
}

}  // namespace llmkit::sched
