// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/scheduler.hpp
/// The stateful front end an engine drives: requests in (with their tokens
/// and stop criteria), one step plan out, sampled tokens back, finished
/// requests out. It holds a `sched_state` and calls the pure `plan_step` /
/// `commit_step`.
///
/// Engine loop:
/// @code
///   sched::scheduler s(limits, sched::policy{.chunked_prefill = true, .max_step_tokens = 512});
///   s.submit(req);
///   while (!s.idle()) {
///     const sched::step_plan& plan = s.next_step();
///     // apply plan.preempted / swapped_out / swapped_in to the KV cache,
///     // run the model over plan.items, sample one token per item with samples
///     for (auto& done : s.complete_step(sampled)) deliver(done);
///   }
/// @endcode

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/sched/policy.hpp"
#include "llmkit/sched/request.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"

namespace llmkit::sched {

/// A request that left the scheduler, with its generated tokens.
struct finished_request {
  request_id id = 0;
  /// `[n_generated]` tokens generated (possibly empty when cancelled early).
  std::vector<token_id> output;
  finish_reason reason = finish_reason::max_tokens;
};

/// Drives `plan_step` / `commit_step` over owned requests.
class scheduler {
 public:
  /// Raises `llmkit::error` for unusable limits or a policy that cannot serve
  /// them (see `make_state`, `validate_policy`).
  scheduler(const engine_limits& limits, policy p) : state_(make_state(limits)), policy_(std::move(p)) {
    validate_policy(policy_, limits);
  }

  /// Queues `r`. Raises `llmkit::error` (and changes nothing) for a
  /// duplicate id, an empty prompt, invalid stop criteria (zero
  /// max_new_tokens, an empty stop sequence), or a prompt that does not fit
  /// the context; other requests are unaffected.
  void submit(request r) {
    LLMKIT_CHECK(!state_.seen_ids.contains(r.id), "submit: duplicate request id ", r.id);
    validate_request(r, state_.limits.max_context);
    sched::submit(state_, r.id, static_cast<std::int64_t>(r.prompt.size()), static_cast<std::int64_t>(r.stop.max_new_tokens),
                  r.arrival_s, r.width);
    const request_id id = r.id;
    set_lookahead(id, r.n_lookahead);
    live_.emplace(id, entry{std::move(r), {}});
  }

  /// Takes over a request prefilled by another worker (disaggregation): its
  /// `[n_generated] generated` tokens so far (at least one) come with it and
  /// the KV of its prompt and of all generated tokens but the last arrives
  /// as an exported buffer, which the engine imports
  /// when a plan lists the request in `swapped_in`. Returns false, with
  /// nothing changed, when the staging area (`engine_limits::n_swap_blocks`)
  /// has no room yet. Raises `llmkit::error` as `submit` does, and when
  /// `generated` is empty or already reaches max_new_tokens.
  bool submit_prefilled(request r, std::vector<token_id> generated) {
    LLMKIT_CHECK(!state_.seen_ids.contains(r.id), "submit_prefilled: duplicate request id ", r.id);
    validate_request(r, state_.limits.max_context);
    const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
    if (!sched::submit_prefilled(state_, r.id, n_prompt, static_cast<std::int64_t>(r.stop.max_new_tokens),
                                 static_cast<std::int64_t>(generated.size()), r.arrival_s))
      return false;
    const request_id id = r.id;
    set_lookahead(id, r.n_lookahead);
    live_.emplace(id, entry{std::move(r), std::move(generated)});
    return true;
  }

  /// Adds a sample forked from another request's prefilled prompt: its
  /// `[n_generated] generated` tokens so far (at least one) come with it and
  /// the engine's cache holds its first `n_cached` context tokens (see
  /// `sched::submit_forked`: it runs at once when blocks and the batch
  /// allow, else waits to recompute). Returns true when it runs. Raises
  /// `llmkit::error` as `submit` does, and for bad counts.
  bool submit_forked(request r, std::vector<token_id> generated, std::int64_t n_cached) {
    LLMKIT_CHECK(!state_.seen_ids.contains(r.id), "submit_forked: duplicate request id ", r.id);
    LLMKIT_CHECK(!planned_, "submit_forked: a planned step is not complete yet");
    validate_request(r, state_.limits.max_context);
    const bool running = sched::submit_forked(
        state_, r.id, static_cast<std::int64_t>(r.prompt.size()), static_cast<std::int64_t>(r.stop.max_new_tokens),
        static_cast<std::int64_t>(generated.size()), n_cached,
        policy_.mode == batching::request_level ? 0 : policy_.max_batch_seqs, r.arrival_s);
    const request_id id = r.id;
    set_lookahead(id, r.n_lookahead);
    live_.emplace(id, entry{std::move(r), std::move(generated)});
    return running;
  }

  /// Cancels a live request: its blocks are free at once. Returns it with
  /// the tokens generated so far, or nothing when `id` is not live.
  std::optional<finished_request> cancel(request_id id) {
    if (!sched::cancel(state_, id)) return std::nullopt;
    auto it = live_.find(id);
    finished_request out{id, std::move(it->second.output), finish_reason::cancelled};
    live_.erase(it);
    return out;
  }

  /// Tells the scheduler that the first `n_cached` context tokens of waiting
  /// request `id` are in the KV cache already (prefix reuse); see
  /// `sched::set_cached_prefix`. False when `id` is not waiting.
  bool set_cached_prefix(request_id id, std::int64_t n_cached) {
    LLMKIT_CHECK(!planned_, "set_cached_prefix: a planned step is not complete yet");
    return sched::set_cached_prefix(state_, id, n_cached);
  }

  /// Plans the next step. The plan stays valid until `complete_step`.
  const step_plan& next_step() {
    plan_ = plan_step(state_, policy_);
    planned_ = true;
    return plan_;
  }

  /// Reports the step's results: `[plan.n_samples()] sampled`, one token per
  /// item with `samples`, in item order (tokens of requests cancelled in the
  /// meantime are ignored). Returns the requests that finished; each
  /// request's token stop rules (`request::stop`) are checked after its
  /// token (stop strings need the text: the engine checks those and cancels).
  std::vector<finished_request> complete_step(std::span<const token_id> sampled) {
    return complete_step(sampled, {});
  }

  /// Reports a step whose sampling items took a variable number of tokens
  /// (speculative decoding): `[plan.n_samples()] n_tokens[k]` tokens for the
  /// k-th sampling item, in [1, 1 + its `n_lookahead`] (the accepted drafts
  /// and the model's own token), concatenated in item order in `tokens`.
  /// The token stop rules are applied token by token: a request that stops
  /// keeps its tokens up to the one that fired, the rest are dropped.
  /// Empty `n_tokens` means one token per item.
  std::vector<finished_request> complete_step(std::span<const token_id> tokens,
                                              std::span<const std::size_t> n_tokens) {
    LLMKIT_CHECK(planned_, "complete_step: no step was planned (call next_step first)");
    const auto n_samples = static_cast<std::size_t>(plan_.n_samples());
    LLMKIT_CHECK(n_tokens.empty() || n_tokens.size() == n_samples, "complete_step: n_tokens has ", n_tokens.size(),
                 " counts, the plan samples ", n_samples, " items");
    std::size_t total = n_tokens.empty() ? n_samples : 0;
    for (std::size_t k = 0; k < n_tokens.size(); ++k) total += n_tokens[k];
    LLMKIT_CHECK(tokens.size() == total, "complete_step: sampled has ", tokens.size(), " tokens, the plan samples ",
                 total);
    for (std::size_t k = 0, i = 0; const step_item& it : plan_.items) {
      if (!it.samples) continue;
      const std::size_t n = n_tokens.empty() ? 1 : n_tokens[k];
      LLMKIT_CHECK(n >= 1 && n <= static_cast<std::size_t>(1 + it.n_lookahead), "complete_step: sampling item ", i,
                   " (request ", it.id, ") took ", n, " tokens, outside [1, 1 + n_lookahead = ", 1 + it.n_lookahead,
                   "]");
      ++k;
      ++i;
    }
    planned_ = false;
    std::vector<request_id> stopped;
    std::vector<std::pair<request_id, finish_reason>> reasons;
    std::vector<std::int64_t> accepted;  // draft tokens taken, per sampling item
    std::size_t k = 0, first = 0;
    for (const step_item& it : plan_.items) {
      if (!it.samples) continue;
      const std::size_t n = n_tokens.empty() ? 1 : n_tokens[k];
      const std::span<const token_id> mine = tokens.subspan(first, n);
      first += n;
      ++k;
      accepted.push_back(0);
      auto e = live_.find(it.id);
      if (e == live_.end()) continue;
      for (std::size_t j = 0; j < n; ++j) {
        e->second.output.push_back(mine[j]);
        accepted.back() = static_cast<std::int64_t>(j);
        if (const auto why = e->second.req.stop.check(e->second.output)) {
          stopped.push_back(it.id);
          reasons.emplace_back(it.id, *why);
          break;
        }
      }
    }
    std::vector<finished_request> done;
    for (const seq_record& f : commit_step(state_, plan_, stopped, accepted)) {
      auto e = live_.find(f.id);
      finish_reason why = finish_reason::max_tokens;
      for (const auto& [id, r] : reasons)
        if (id == f.id) why = r;
      done.push_back({f.id, std::move(e->second.output), why});
      live_.erase(e);
    }
    return done;
  }

  /// The request with id `id`; raises `llmkit::error` when it is not live.
  const request& get(request_id id) const {
    const auto it = live_.find(id);
    LLMKIT_CHECK(it != live_.end(), "scheduler::get: request id ", id, " is not live");
    return it->second.req;
  }
  /// `[n_generated]` tokens generated so far by live request `id`.
  std::span<const token_id> output(request_id id) const {
    const auto it = live_.find(id);
    LLMKIT_CHECK(it != live_.end(), "scheduler::output: request id ", id, " is not live");
    return it->second.output;
  }
  /// True when no request is waiting, running or swapped.
  bool idle() const noexcept { return n_live(state_) == 0; }
  const sched_state& state() const noexcept { return state_; }
  const policy& get_policy() const noexcept { return policy_; }

 private:
  struct entry {
    request req;
    std::vector<token_id> output;
  };
  void set_lookahead(request_id id, std::int64_t n) {
    for (auto* list : {&state_.waiting, &state_.running, &state_.swapped})
      if (seq_record* r = detail::find(*list, id)) r->n_lookahead = n;
  }
  sched_state state_;
  policy policy_;
  std::unordered_map<request_id, entry> live_;
  step_plan plan_;
  bool planned_ = false;
};

}  // namespace llmkit::sched
