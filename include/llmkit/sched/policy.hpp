// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/policy.hpp
/// Scheduling policies as one pure function of (state, policy) -> step plan:
/// `plan_step`. The policy struct selects request-level or continuous
/// (iteration-level) batching, chunked prefill under the per-step token
/// budget, the prefill layout (ragged, padded, prepacked), length-aware
/// batch formation, and preemption by recompute or swap when KV blocks run
/// out.
///
/// Guarantees of every plan (checked by the tests over random workloads):
/// - the step computes at most `max_step_tokens` token slots, padding
///   included (`step_plan::n_computed_tokens()`), and at most
///   `max_batch_seqs` sequences run;
/// - committing it never needs more blocks than are free (device or swap);
/// - no request is lost or duplicated: each live request is in exactly one
///   of waiting / running / swapped, and each sequence appears at most once
///   in `items`;
/// - progress: when any request is live, the plan is not empty (a single
///   request always fits, see `validate_policy`).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/sched/prefill_packer.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"

namespace llmkit::sched {

/// When a batch is formed.
enum class batching {
  /// Static: a batch runs until all its requests finish; new requests wait.
  /// Prompts are prefilled whole in one padded step and KV blocks are
  /// reserved for prompt + max_new_tokens at admission, so it never preempts.
  request_level,
  /// Iteration-level: the batch is re-formed every step; a step mixes
  /// single-token decodes and prefill pieces.
  continuous,
};

/// What happens to a request preempted because KV blocks ran out.
enum class preemption {
  /// Drop its KV; it returns to the front of the queue and prefills its
  /// whole context (prompt + generated tokens) again.
  recompute,
  /// Copy its blocks to the swap space (falls back to recompute when the
  /// swap space is full); it returns when device blocks are free again.
  swap,
};

/// A scheduling policy. Designated initialisers at call sites:
/// `policy{.mode = batching::continuous, .chunked_prefill = true}`.
struct policy {
  batching mode = batching::continuous;
  /// Most sequences computed in one step.
  std::int64_t max_batch_seqs = 32;
  /// Most token slots computed in one step, padding included.
  std::int64_t max_step_tokens = 2048;
  /// Split prefills into pieces that fit the step's remaining budget
  /// (continuous only). Without it a prefill runs whole.
  bool chunked_prefill = false;
  /// Layout of the prefill pieces (continuous; request-level is padded).
  prefill_layout layout = prefill_layout::ragged;
  /// Tokens per packed row (layout `packed`); 0 = the longest prefill
  /// piece of the step, as in the prepacking paper.
  std::int64_t row_capacity = 0;
  /// Length-aware formation: the next requests to admit after the head of
  /// the queue are taken from the first `length_window` waiting requests
  /// closest in prompt length to the head (0 = first come, first served).
  /// The head always goes first, so no request starves.
  std::int64_t length_window = 0;
  preemption preempt = preemption::recompute;
  /// Bin-packer for layout `packed`; empty = first-fit decreasing of
  /// llmkit/pack (`pack_prefill`).
  prefill_packer packer = {};
};

/// Raises `llmkit::error` naming the field when `p` cannot serve every
/// request the limits allow: the budget must hold one token (one whole
/// context when prefills are not chunked), etc.
inline void validate_policy(const policy& p, const engine_limits& limits) {
  LLMKIT_CHECK(p.max_step_tokens >= 1, "policy: max_step_tokens must be >= 1 token, got ", p.max_step_tokens);
  LLMKIT_CHECK(p.max_batch_seqs >= 1, "policy: max_batch_seqs must be >= 1, got ", p.max_batch_seqs);
  LLMKIT_CHECK(p.length_window >= 0, "policy: length_window must be >= 0, got ", p.length_window);
  LLMKIT_CHECK(p.row_capacity >= 0 && p.row_capacity <= p.max_step_tokens, "policy: row_capacity = ", p.row_capacity,
               " must be in [0, max_step_tokens = ", p.max_step_tokens, "]");
  const bool whole = p.mode == batching::request_level || !p.chunked_prefill;
  if (whole) {
    LLMKIT_CHECK(p.max_step_tokens >= limits.max_context, "policy: max_step_tokens = ", p.max_step_tokens,
                 " is below max_context = ", limits.max_context,
                 "; prefills run whole without chunked_prefill, so the budget must hold one context");
    if (p.mode == batching::continuous && p.layout == prefill_layout::packed && p.row_capacity > 0)
      LLMKIT_CHECK(p.row_capacity >= limits.max_context, "policy: row_capacity = ", p.row_capacity,
                   " is below max_context = ", limits.max_context, " without chunked_prefill");
  }
}

namespace detail {

/// Tracks the token slots of a step under construction for one layout.
class step_budget {
 public:
  /// `row_capacity`: packed row length, 0 = the longest piece.
  step_budget(prefill_layout layout, std::int64_t budget, std::int64_t row_capacity)
      : layout_(layout), budget_(budget), capacity_(row_capacity) {}

  std::int64_t computed() const { return decodes_ + prefill_slots(pieces_, longest_); }
  bool decode_fits(std::int64_t slots = 1) const { return computed() + slots <= budget_; }
  /// A decode with `slots` token slots (1 + its lookahead).
  void add_decode(std::int64_t slots = 1) noexcept { decodes_ += slots; }

  /// Tokens of a prefill piece that wants `want` tokens and can be cut
  /// (`chunked`) or not: the largest n <= want that fits, 0 when none does
  /// (or when the whole `want` does not fit and cutting is not allowed).
  std::int64_t fit(std::int64_t want, bool chunked) const {
    if (fits(want)) return want;
    if (!chunked) return 0;
    std::int64_t lo = 0, hi = want - 1;  // largest fitting n by bisection
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
  void add_piece(std::int64_t n) {
    pieces_.push_back(n);
    longest_ = std::max(longest_, n);
  }
  /// Row length of the packed layout.
  std::int64_t row_length() const noexcept { return capacity_ > 0 ? capacity_ : longest_; }

 private:
  bool fits(std::int64_t n) const {
    if (n < 1) return false;
    if (layout_ == prefill_layout::packed && capacity_ > 0 && n > capacity_) return false;
    std::vector<std::int64_t> with(pieces_);
    with.push_back(n);
    return decodes_ + prefill_slots(with, std::max(longest_, n)) <= budget_;
  }
  std::int64_t prefill_slots(const std::vector<std::int64_t>& pieces, std::int64_t longest) const {
    std::int64_t sum = 0;
    for (std::int64_t l : pieces) sum += l;
    switch (layout_) {
      case prefill_layout::ragged: return sum;
      case prefill_layout::padded: return static_cast<std::int64_t>(pieces.size()) * longest;
      case prefill_layout::packed: {
        if (pieces.empty()) return 0;
        const std::int64_t cap = capacity_ > 0 ? capacity_ : longest;
        return static_cast<std::int64_t>(pack_prefill(pieces, cap).size()) * cap;
      }
    }
    return 0;
  }

  prefill_layout layout_;
  std::int64_t budget_, capacity_;
  std::int64_t decodes_ = 0, longest_ = 0;
  std::vector<std::int64_t> pieces_;
};

/// Waiting-queue indices in the order admission considers them.
inline std::vector<std::size_t> admission_order(const std::vector<seq_record>& waiting, std::int64_t length_window) {
  std::vector<std::size_t> order(waiting.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (length_window > 1 && waiting.size() > 2) {
    const auto end = std::min<std::size_t>(waiting.size(), static_cast<std::size_t>(length_window));
    const std::int64_t head = waiting[0].context();
    std::stable_sort(order.begin() + 1, order.begin() + static_cast<std::ptrdiff_t>(end), [&](std::size_t a, std::size_t b) {
      return std::llabs(waiting[a].context() - head) < std::llabs(waiting[b].context() - head);
    });
  }
  return order;
}

inline bool is_decode(const seq_record& r) noexcept { return r.pending() == 1 && r.n_generated > 0; }

/// Lays out the prefill pieces of `plan` into rows.
inline void layout_prefill(step_plan& plan, const policy& p, const step_budget& b) {
  std::vector<std::size_t> pieces;
  for (std::size_t i = 0; i < plan.items.size(); ++i)
    if (plan.items[i].is_prefill) pieces.push_back(i);
  plan.prefill_rows.clear();
  plan.row_length = 0;
  if (pieces.empty() || plan.layout == prefill_layout::ragged) return;
  if (plan.layout == prefill_layout::padded) {
    for (std::size_t i : pieces) {
      plan.prefill_rows.push_back({i});
      plan.row_length = std::max(plan.row_length, plan.items[i].n_tokens);
    }
    return;
  }
  const std::int64_t capacity = b.row_length();
  std::vector<std::int64_t> lengths;
  for (std::size_t i : pieces) lengths.push_back(plan.items[i].n_tokens);
  auto rows = pack_prefill(lengths, capacity);  // what the budget was computed with
  if (p.packer) {
    // A user packer is checked, and used unless it needs more rows.
    auto user = p.packer(lengths, capacity);
    std::vector<int> seen(pieces.size(), 0);
    for (const auto& row : user) {
      std::int64_t load = 0;
      for (std::size_t k : row) {
        LLMKIT_CHECK(k < pieces.size() && seen[k]++ == 0, "policy.packer: returned piece index ", k,
                     " out of range or twice (", pieces.size(), " pieces)");
        load += lengths[k];
      }
      LLMKIT_CHECK(load <= capacity, "policy.packer: a row holds ", load, " tokens > capacity ", capacity);
    }
    LLMKIT_CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }),
                 "policy.packer: some piece was not packed");
    if (user.size() <= rows.size()) rows = std::move(user);
  }
  for (auto& row : rows) {
    for (std::size_t& k : row) k = pieces[k];
    plan.prefill_rows.push_back(std::move(row));
  }
  plan.row_length = capacity;
}

inline step_plan plan_request_level(const sched_state& s, const policy& p) {
  step_plan plan;
  plan.layout = prefill_layout::padded;
  if (!s.running.empty()) {  // the batch in flight decodes; nobody joins
    for (const seq_record& r : s.running) {
      LLMKIT_ASSERT(r.pending() == 1 && r.blocks(r.n_cached + 1, s.limits.block_size) <= r.n_blocks);
      plan.items.push_back({.id = r.id, .first_pos = r.n_cached, .n_tokens = 1, .samples = true, .is_prefill = false});
    }
    plan.n_idle_slots = std::max<std::int64_t>(0, s.static_batch_size - static_cast<std::int64_t>(s.running.size()));
    return plan;
  }
  std::int64_t free = s.n_free_blocks, longest = 0, n = 0;
  for (std::size_t i : admission_order(s.waiting, p.length_window)) {
    const seq_record& r = s.waiting[i];
    const std::int64_t l = std::max(longest, r.pending());
    const std::int64_t reserve = r.blocks(r.max_cached(), s.limits.block_size);
    if (n == p.max_batch_seqs || (n + 1) * l > p.max_step_tokens || reserve > free) break;
    longest = l;
    ++n;
    free -= reserve;
    plan.admitted.push_back({r.id, reserve});
    plan.items.push_back({.id = r.id, .first_pos = r.n_cached, .n_tokens = r.pending(), .samples = true, .is_prefill = true});
  }
  plan.static_batch_size = n;
  for (std::size_t i = 0; i < plan.items.size(); ++i) plan.prefill_rows.push_back({i});
  plan.row_length = longest;
  return plan;
}

inline step_plan plan_continuous(const sched_state& s, const policy& p) {
  step_plan plan;
  plan.layout = p.layout;
  const std::int64_t bs = s.limits.block_size;
  step_budget budget(p.layout, p.max_step_tokens, p.row_capacity);
  std::int64_t free = s.n_free_blocks, free_swap = s.n_free_swap_blocks;
  const std::size_t n_run = s.running.size();
  std::vector<char> scheduled(n_run, 0), removed(n_run, 0);
  std::int64_t n_seqs = 0;
  bool any_preempted = false;

  // Tokens to compute for r in this step (0 = it does not fit).
  auto piece = [&](const seq_record& r) -> std::int64_t {
    if (is_decode(r)) return budget.decode_fits() ? 1 : 0;
    return budget.fit(r.pending(), p.chunked_prefill);
  };
  // Lookahead slots a decode of r gets: its own, within its budget of new
  // tokens (the last draft is followed by the model's own token), the
  // step's slots and the free blocks beyond its decode (never a preemption).
  auto extra_blocks = [&](const seq_record& r, std::int64_t la) {
    return std::max<std::int64_t>(
        0, r.blocks(r.n_cached + 1 + la, bs) - std::max(r.n_blocks, r.blocks(r.n_cached + 1, bs)));
  };
  auto lookahead = [&](const seq_record& r) -> std::int64_t {
    std::int64_t la = std::min(r.n_lookahead, r.max_new_tokens - r.n_generated - 1);
    while (la > 0 && (!budget.decode_fits(1 + la) || extra_blocks(r, la) > free)) --la;
    return std::max<std::int64_t>(la, 0);
  };
  auto add_item = [&](const seq_record& r, std::int64_t n, std::int64_t la = 0) {
    const bool decode = is_decode(r);
    if (decode)
      budget.add_decode(1 + la);
    else
      budget.add_piece(n);
    plan.items.push_back({.id = r.id, .first_pos = r.n_cached, .n_tokens = n, .samples = r.n_cached + n == r.context(),
                          .is_prefill = !decode, .n_lookahead = la});
    ++n_seqs;
  };

  // 1. Running requests by priority: decodes, then unfinished prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 0; i < n_run; ++i) {
      const seq_record& r = s.running[i];
      if (scheduled[i] || removed[i] || is_decode(r) != (pass == 0)) continue;
      if (n_seqs == p.max_batch_seqs) break;
      const std::int64_t n = piece(r);
      if (n == 0) continue;
      const std::int64_t need = r.blocks(r.n_cached + n, bs) - r.n_blocks;
      while (need > free) {  // preempt the lowest-priority unscheduled request, possibly r itself
        std::size_t v = n_run;
        while (v-- > 0)
          if (!scheduled[v] && !removed[v]) break;
        const seq_record& victim = s.running[v];
        if (p.preempt == preemption::swap && victim.n_blocks <= free_swap) {
          plan.swapped_out.push_back({victim.id, victim.n_blocks});
          free_swap -= victim.n_blocks;
        } else {
          plan.preempted.push_back({victim.id, victim.n_blocks});
        }
        free += victim.n_blocks;
        removed[v] = 1;
        any_preempted = true;
        if (v == i) break;
      }
      if (removed[i]) continue;
      free -= std::max<std::int64_t>(need, 0);
      const std::int64_t la = is_decode(r) && r.n_lookahead > 0 ? lookahead(r) : 0;
      free -= extra_blocks(r, la);
      scheduled[i] = 1;
      add_item(r, n, la);
    }
  }
  // 2. Swapped requests come back first come, first served; 3. then new
  // ones, but only while nobody had to be preempted in this step and nobody
  // is still swapped out (so that swapped requests do not starve).
  if (!any_preempted) {
    std::int64_t n_running = static_cast<std::int64_t>(n_run);
    bool blocked = false;
    for (const seq_record& r : s.swapped) {
      if (n_running == p.max_batch_seqs) {
        blocked = true;
        break;
      }
      const std::int64_t n = piece(r);
      const std::int64_t need = r.n_blocks + r.blocks(r.n_cached + n, bs) - r.n_blocks;
      if (n == 0 || need > free) {
        blocked = true;
        break;
      }
      free -= need;
      plan.swapped_in.push_back({r.id, r.n_blocks});
      ++n_running;
      add_item(r, n);
    }
    if (!blocked) {
      for (std::size_t i : admission_order(s.waiting, p.length_window)) {
        const seq_record& r = s.waiting[i];
        if (n_running == p.max_batch_seqs) break;
        const std::int64_t n = piece(r);
        const std::int64_t need = r.blocks(r.n_cached + n, bs);
        if (n == 0 || need > free) break;
        free -= need;
        plan.admitted.push_back({r.id, 0});
        ++n_running;
        add_item(r, n);
      }
    }
  }
  layout_prefill(plan, p, budget);
  return plan;
}

}  // namespace detail

/// The next step for state `s` under policy `p`; `s` is not changed.
/// Apply it with `commit_step` once the engine has run it.
/// @pre `validate_policy(p, s.limits)` passed.
inline step_plan plan_step(const sched_state& s, const policy& p) {
  return p.mode == batching::request_level ? detail::plan_request_level(s, p) : detail::plan_continuous(s, p);
}

}  // namespace llmkit::sched
