// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/engine.hpp
/// A serving engine: requests submitted from any thread run under the
/// continuous-batching scheduler (llmkit/sched) on one model, one paged KV
/// cache and one executor. Each step runs ONE forward pass over the packed
/// mix of prefill chunks and decode rows the scheduler planned, samples
/// every finished row with its request's own chain and Philox stream,
/// applies the stop rules (tokens, EOS, budget, text stop strings) and
/// streams the new pieces to each request's callback.
///
/// ```
/// kv::prefix_cache<float, 16> cache(model.kv_shape(), {.n_blocks = 1024});
/// thread_pool pool(2);
/// serve::engine eng(model, cache, pool, {.max_context = 512}, &tokenizer);
/// eng.start();                                  // or call eng.step() yourself
/// auto r = eng.submit({.prompt = ids, .sampling = "top_k(40);temperature(0.8);sample", .seed = 7,
///                      .stop = {.max_new_tokens = 64, .stop_strings = {"\n\n"}},
///                      .on_event = [](const serve::stream_event& e) { ... }});
/// if (r.status == serve::submit_status::queue_full) { /* answer 429 */ }
/// eng.cancel(r.handle);                         // from any thread
/// eng.stop();                                   // cancels what is left, joins
/// ```
///
/// A request whose prompt another worker prefilled (prefill/decode
/// disaggregation) comes in with `submit_prefilled`: its tokens so far and
/// its KV as an exported buffer, which waits in the staging area
/// (`engine_options::staging_blocks`) until the scheduler swaps it in, when
/// it is imported into the cache.
///
/// Guarantees:
/// - every submitted request receives exactly one finish event (stop,
///   length, cancelled or error), the last of its events; a request rejected
///   by `submit` receives it before `submit` returns;
/// - a request's tokens depend only on its prompt, chain, seed and stream,
///   not on what else runs, on chunking, preemption, prefix reuse, streaming
///   or the executor's threads (the model's products are batch invariant and
///   the draws counter-based), nor on whether its prompt was prefilled
///   elsewhere when its given tokens were drawn the same way (`sample_token`),
///   nor on speculative decoding (`generation_request::speculative`): a
///   drafting request's tokens are drawn from its verification rows with the
///   same chain, context and Philox step as without guesses, so greedy and
///   sampled requests alike get the very tokens they get without drafting
///   (the rows attend as one-token decodes: same logits, bit for bit, when
///   prompts were cut in the same pieces);
/// - a cancelled or finished request's KV blocks are free at the end of the
///   step that ends it.
///
/// The engine wires together pieces with one job each, in serve/detail/:
/// the checks a request passes at submit (validate.hpp), the shared,
/// mutex-guarded side that admits requests and takes cancellations from any
/// thread (intake.hpp), the requests the step thread holds and the samples
/// waiting to be forked (live_set.hpp), the staging area of prefilled
/// requests (staging.hpp), the parts of a step from plan to sampled tokens
/// (step.hpp), speculative decoding's guesses and their verification
/// (speculate.hpp), the events streamed to callbacks (output.hpp), and
/// beam-search requests, whose beams run as rows of the batch and fork
/// copy-on-write (beams.hpp, beam_group.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/model/tokenizer.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/sched/scheduler.hpp"
#include "llmkit/serve/detail/beams.hpp"
#include "llmkit/serve/detail/intake.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/detail/output.hpp"
#include "llmkit/serve/detail/speculate.hpp"
#include "llmkit/serve/detail/staging.hpp"
#include "llmkit/serve/detail/step.hpp"
#include "llmkit/serve/detail/validate.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/sample.hpp"
#include "llmkit/serve/stats.hpp"

namespace llmkit::serve {

/// What `engine::stop` does with requests that have not finished.
enum class shutdown_mode : std::uint8_t {
  cancel,  ///< end them at the next step (finish kind cancelled)
  drain,   ///< let them run to completion (no new ones are accepted)
};

/// A serving engine over `Model` (a `model::language_model` on `Cache` and
/// `Exec`), a paged KV cache and an executor, all owned by the caller and
/// used only by the engine's step thread while it lives.
///
/// Threads: `submit`, `cancel`, `cancel_all`, `stop_accepting`, `stats`,
/// `idle` and `wait_idle` may be called from any thread. Steps run either
/// on a thread the engine owns (`start` ... `stop`) or on the owner's
/// thread (`step`, `run_until_idle`), never both.
template <class Model, engine_cache Cache, executor Exec = serial_executor>
  requires model::language_model<Model, Cache, Exec>
class engine {
 public:
  /// @param tokenizer  optional; without it events carry no text and stop
  ///   strings are rejected. Must outlive the engine.
  /// @throws llmkit::error for options the cache cannot serve (a context of
  ///   `max_context` tokens must fit the pool; a staging area needs an
  ///   `importing_cache` and continuous batching) or an invalid policy.
  engine(Model& model, Cache& cache, Exec& exec, engine_options options = {},
         const model::tokenizer* tokenizer = nullptr)
      : model_(model),
        cache_(cache),
        exec_(exec),
        options_(std::move(options)),
        tokenizer_(tokenizer),
        limits_(limits_of(cache, options_)),
        sched_(limits_, policy_of(options_)),
        intake_(options_.max_queued, limits_.n_swap_blocks) {
    LLMKIT_CHECK(options_.max_queued >= 1, "engine_options: max_queued must be >= 1, got ", options_.max_queued);
    LLMKIT_CHECK(options_.staging_blocks >= 0, "engine_options: staging_blocks must be >= 0, got ",
                 options_.staging_blocks);
    if (options_.staging_blocks > 0) {
      LLMKIT_CHECK(importing_cache<Cache>, "engine_options: staging_blocks = ", options_.staging_blocks,
                   " needs a cache that imports KV buffers (serve::importing_cache); this one does not");
      // Request-level batching never swaps a request in: staged ones would wait forever.
      LLMKIT_CHECK(options_.policy.mode == sched::batching::continuous, "engine_options: staging_blocks = ",
                   options_.staging_blocks, " needs continuous batching (policy.mode)");
    }
    publish_stats();
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Cancels whatever has not finished (each gets its finish event) and
  /// joins the step thread.
  ~engine() { stop(shutdown_mode::cancel); }

  /// Queues a request; callable from any thread. Returns its handle and
  /// whether it was accepted. A rejected request (bad input, queue full,
  /// shutting down) gets its finish event (kind error) on this thread before
  /// `submit` returns; an accepted one gets its events from the step thread.
  submit_result submit(generation_request request) { return admit(request, nullptr); }

  /// Hands over a request prefilled by another worker (prefill/decode
  /// disaggregation); callable from any thread. `p.generated` are its
  /// tokens so far and `p.kv` the K/V of its context (prompt and all given
  /// tokens but the last) as exported by `kv::paged_cache::export_sequence`.
  ///
  /// The given tokens are streamed first, as token events with `prefilled`
  /// set, and checked against the stop rules as if sampled here: when one
  /// fires (EOS, a stop sequence or string, or `max_new_tokens` reached) the
  /// request finishes there, later given tokens are dropped and its KV is
  /// never imported. Otherwise the buffer waits in the staging area until
  /// the scheduler has blocks for it (first come, first served, before new
  /// requests), is imported into the cache and the request decodes on,
  /// drawing token i with its chain at step i of its own Philox stream: a
  /// seeded request whose given tokens were drawn that way too
  /// (`sample_token`) gets the tokens it would get submitted whole.
  ///
  /// Answers as `submit` does, plus `staging_full` when the buffer does not
  /// fit the staging area's free blocks now: then `p` is left untouched, no
  /// event is sent and the caller submits it again later (after a step).
  /// Otherwise `p` is moved from. `invalid` also covers an engine without a
  /// staging area, `n != 1`, given tokens outside the vocabulary, and a
  /// buffer larger than the whole staging area. A buffer that fails to
  /// import (corrupt, another shape or dtype, a token count that does not
  /// match the context) ends its request with an `error` finish; the others
  /// go on.
  submit_result submit_prefilled(prefilled_request& p)
    requires importing_cache<Cache>
  {
    return admit(p.request, &p);
  }

  /// Cancels request `handle` at the next step (its finish event, kind
  /// cancelled, carries the text so far; its KV blocks are freed then).
  /// Callable from any thread; a finished or unknown handle is ignored.
  void cancel(request_id handle) { intake_.cancel(handle); }

  /// Cancels every queued and running request at the next step.
  void cancel_all() { intake_.cancel_all(); }

  /// From now on `submit` rejects requests (`submit_status::shutting_down`);
  /// requests already accepted keep running.
  void stop_accepting() { intake_.stop_accepting(); }

  /// Runs one step on the calling thread: takes the submissions and
  /// cancellations since the last step, then (when any request is live)
  /// plans, runs one forward pass, samples and delivers. Returns false when
  /// there was nothing to compute.
  /// @pre no step thread is running (`start`), and not called from an
  /// event callback.
  bool step() {
    LLMKIT_CHECK(!thread_.joinable(), "engine::step: the engine's own step thread is running (start was called)");
    return step_once();
  }

  /// Calls `step` until no request is live or queued.
  void run_until_idle() {
    while (step() || !intake_.empty()) {
    }
  }

  /// Starts the engine's step thread, which steps whenever a request is
  /// live and sleeps otherwise. @throws llmkit::error when already started.
  void start() {
    LLMKIT_CHECK(!thread_.joinable(), "engine::start: already started");
    intake_.clear_stop();
    thread_ = std::thread([this] { loop(); });
  }

  /// Stops accepting requests, then cancels (shutdown_mode::cancel) or
  /// finishes (drain) every request, queued ones included, and joins the
  /// step thread; without one, steps on the calling thread until done.
  /// Every request has had its finish event when `stop` returns. The engine
  /// accepts nothing afterwards. Not from an event callback (it would wait
  /// for the very step that calls it).
  void stop(shutdown_mode mode = shutdown_mode::cancel) {
    intake_.request_stop(mode == shutdown_mode::cancel);
    if (thread_.joinable()) {
      thread_.join();
    } else {
      while (step_once() || !intake_.empty()) {
      }
    }
  }

  /// A snapshot of the counters and gauges; callable from any thread.
  engine_stats stats() const { return intake_.stats(); }

  /// True when no request is queued or live.
  bool idle() const { return intake_.idle(); }

  /// Waits until `idle()` (the step thread finished everything) or the
  /// timeout; returns idle().
  template <class Rep, class Period>
  bool wait_idle(std::chrono::duration<Rep, Period> timeout) const {
    return intake_.wait_idle(timeout);
  }

  const engine_options& options() const noexcept { return options_; }
  /// The block limits the scheduler plans with (from the cache and options).
  const sched::engine_limits& limits() const noexcept { return limits_; }

 private:
  using live_iterator = detail::live_map::iterator;
  enum class scheduled : bool { no, yes };

  static sched::engine_limits limits_of(const Cache& cache, const engine_options& o) {
    return {.max_context = o.max_context,
            .block_size = static_cast<std::int64_t>(Cache::block_size),
            .n_blocks = static_cast<std::int64_t>(cache.pool().n_total()),
            .n_swap_blocks = std::max<std::int64_t>(o.staging_blocks, 0)};
  }
  // Recompute only: the scheduler never plans a swap-out, so its swap space
  // holds nothing but staged buffers.
  static sched::policy policy_of(const engine_options& o) {
    sched::policy p = o.policy;
    p.preempt = sched::preemption::recompute;
    return p;
  }

  // --- Intake (caller's thread) ---

  // The admission of `submit` and `submit_prefilled` (`prefilled` set,
  // holding `request`): the checks and the chain's parse on this thread,
  // then the intake's limits; a rejected request gets its finish events here.
  submit_result admit(generation_request& request, prefilled_request* prefilled) {
    submit_result checked;
    std::optional<sampling::runtime_chain> chain;
    std::int64_t blocks = 0;
    try {
      if (prefilled != nullptr)
        blocks = detail::check_prefilled(*prefilled, model_.vocab_size(), options_, tokenizer_ != nullptr, limits_);
      else
        detail::check_request(request, model_.vocab_size(), options_, tokenizer_ != nullptr);
      if (request.beam) detail::check_beam(request, model_.vocab_size(), options_, limits_);
      LLMKIT_CHECK(detail::truncating_cache<Cache> || request.speculative.drafter == draft_source::none,
                   "speculative decoding needs a cache that truncates sequences; this one does not");
      LLMKIT_CHECK(!request.beam || request.speculative.drafter == draft_source::none,
                   "speculative decoding does not run with beam search (beam and speculative are both set)");
      chain = chain_of(request);
      detail::add_grammar_eos(request);
    } catch (const std::exception& e) {
      checked.status = submit_status::invalid;
      checked.message = e.what();
    }
    const std::size_t n = prefilled != nullptr ? 1 : std::max<std::size_t>(request.n, 1);
    submit_result out = intake_.admit(std::move(checked), n, blocks, [&](request_id handle) {
      detail::submission s{handle, std::move(request), std::move(*chain)};
      if (prefilled != nullptr) {
        s.given = std::move(prefilled->generated);
        s.kv = std::move(prefilled->kv);
        s.staged_blocks = blocks;
      }
      return s;
    });
    if (!out.accepted() && out.status != submit_status::staging_full) detail::send_rejection(request, out, n);
    return out;
  }

  // --- The step thread ---

  void loop() {
    while (intake_.wait_for_work(!sched_.idle())) step_once();
  }

  bool step_once() {
    detail::intake_batch in = intake_.take();
    for (detail::submission& s : in.submissions) enqueue(std::move(s));
    for (request_id h : in.cancels) cancel_now(h);
    if (in.cancel_all)
      for (request_id h : detail::sorted_handles(live_)) cancel_now(h);
    bool worked = false;
    if (!sched_.idle()) {
      try {
        run_step();
        worked = true;
      } catch (const std::exception& e) {
        fail_all(e.what());
      }
    }
    publish_stats();
    return worked;
  }

  // Hands sample 0 of a submission to the scheduler; samples 1 .. n - 1
  // wait beside it to be forked from its prompt.
  void enqueue(detail::submission s) {
    if (!s.given.empty()) return enqueue_prefilled(std::move(s));
    if (s.request.beam) return enqueue_beams(std::move(s));
    const std::size_t n = std::max<std::size_t>(s.request.n, 1);
    for (std::size_t i = 0; i < n; ++i) {
      const request_id h = s.handle + static_cast<request_id>(i);
      detail::live_request l = detail::new_live_request(s.request, s.chain);
      l.request.n = 1;
      l.request.stream = s.request.stream + i;
      l.index = i;
      if (i == 0) {
        for (std::size_t j = 1; j < n; ++j) l.pending_forks.push_back(s.handle + static_cast<request_id>(j));
        try {
          sched_.submit(detail::scheduler_request(h, l));
        } catch (const std::exception& e) {  // validated at submit; kept for safety
          for (std::size_t j = 0; j < n; ++j) {
            l.index = j;
            deliver_finish(s.handle + static_cast<request_id>(j), l, finish_kind::error, std::nullopt, e.what());
          }
          return;
        }
      } else {
        l.awaiting_fork = true;
      }
      live_.emplace(h, std::move(l));
    }
  }

  // A beam-search request: one scheduler request of beam.width sequences
  // (detail/beams.hpp), starting as its prompt alone.
  void enqueue_beams(detail::submission s) {
    detail::live_request l = detail::new_live_request(std::move(s.request), std::move(s.chain));
    l.beams.emplace(*l.request.beam, l.request.prompt, l.request.grammar);
    const auto it = live_.emplace(s.handle, std::move(l)).first;
    try {
      sched_.submit(detail::scheduler_request(s.handle, it->second));
    } catch (const std::exception& e) {  // validated at submit; kept for safety
      finish(it, finish_kind::error, std::nullopt, e.what());
    }
  }

  // Streams a prefilled request's given tokens (stop rules applied), then
  // hands it to the scheduler's staging area, where its buffer waits to be
  // swapped in.
  void enqueue_prefilled(detail::submission s) {
    detail::live_request l = detail::new_live_request(std::move(s.request), std::move(s.chain));
    l.kv = std::move(s.kv);
    l.staged_blocks = s.staged_blocks;
    const request_id h = s.handle;
    const auto it = live_.emplace(h, std::move(l)).first;
    for (std::size_t i = 0; i < s.given.size(); ++i) {
      detail::row_result r;
      r.sample.token = s.given[i];
      const auto by_tokens = it->second.request.stop.check(std::span<const token_id>(s.given).first(i + 1));
      if (!accept_token(it, r, by_tokens, scheduled::no, detail::origin::given)) return;
    }
    detail::live_request& staged = it->second;
    try {
      std::vector<token_id> generated(staged.context.begin() + static_cast<std::ptrdiff_t>(staged.n_prompt),
                                      staged.context.end());
      LLMKIT_CHECK(sched_.submit_prefilled(detail::scheduler_request(h, staged), std::move(generated)),
                   "engine: the scheduler's staging area has no room for a request the engine staged");
    } catch (const std::exception& e) {  // validated at submit; kept for safety
      finish(it, finish_kind::error, std::nullopt, e.what());
    }
  }

  // Imports the KV buffer of staged request `id`, which the plan swaps in.
  // When the buffer is corrupt, foreign or of the wrong length the request
  // ends with an error (and leaves the scheduler).
  void import_staged(request_id id) {
    const auto it = live_.find(id);
    LLMKIT_ASSERT(it != live_.end());
    detail::live_request& l = it->second;
    try {
      l.seq = detail::import_buffer(cache_, l);
    } catch (const std::exception& e) {
      sched_.cancel(id);
      finish(it, finish_kind::error, std::nullopt, std::string("importing the KV buffer: ") + e.what());
      return;
    }
    l.admitted = true;
    l.kv = {};
    unstage(l);
    ++stats_.n_imported;
  }

  // Gives back the staging blocks of a request whose buffer left staging.
  void unstage(detail::live_request& l) {
    if (l.staged_blocks == 0) return;
    intake_.release_staging(l.staged_blocks);
    l.staged_blocks = 0;
  }

  void cancel_now(request_id h) {
    const auto it = live_.find(h);
    if (it == live_.end()) return;
    sched_.cancel(h);
    finish(it, finish_kind::cancelled, finish_reason::cancelled);
  }

  void fail_all(const std::string& message) {
    for (request_id h : detail::sorted_handles(live_)) {
      sched_.cancel(h);
      finish(live_.find(h), finish_kind::error, std::nullopt, message);
    }
    // The failed step's plan was never completed: start from a fresh scheduler.
    sched_ = sched::scheduler(limits_, policy_of(options_));
  }

  void run_step() {
    detail::look_up_prefixes(cache_, sched_, live_, options_.reuse);
    const sched::step_plan& plan = sched_.next_step();
    LLMKIT_CHECK(plan.swapped_out.empty(),
                 "engine: the scheduler planned a swap-out; the engine preempts by recompute");
    for (const sched::block_move& m : plan.preempted) {
      detail::live_request& l = live_.at(m.id);
      detail::free_sequences(cache_, l);
      ++l.usage.n_preemptions;
      ++stats_.n_preemptions;
    }
    // A request whose import failed has ended (and left the scheduler); its
    // items are skipped and its sampled slot filled with a dummy token.
    for (const sched::block_move& m : plan.swapped_in) import_staged(m.id);
    detail::propose_drafts(plan, live_, options_, spec_);
    const std::vector<request_id> rows =
        detail::build_batch(plan, live_, cache_, options_.reuse, step_, stats_, spec_.drafts);
    detail::add_beam_rows(step_.beam_items, live_, cache_, options_.reuse, step_.batch, stats_,
                          step_.n_logits, step_.beam_groups);
    // Empty only when every item's request failed its import.
    const bool forward = step_.batch.n_tokens() > 0;
    matrix_view<const float> logits;
    if (forward) {
      logits = model_.forward(step_.batch.view(), cache_, exec_);
      ++stats_.n_steps;
    }
    detail::sample_rows(exec_, live_, rows, logits, step_);
    detail::verify_drafts(exec_, live_, rows, logits, step_, spec_);
    detail::truncate_rejected(cache_, live_, rows, step_, spec_, stats_);
    detail::commit_prefixes(cache_, plan, live_);
    const std::size_t kv_used = detail::held_blocks(cache_);
    if (options_.on_step) step_.plan_copy = plan;
    std::vector<detail::fork_job> forks = detail::fork_samples(cache_, live_, rows, logits, step_);

    detail::step_tokens(plan, rows, step_.results, spec_, spec_tokens_, spec_counts_);
    std::unordered_map<request_id, finish_reason> ended;
    for (const sched::finished_request& f : sched_.complete_step(spec_tokens_, spec_counts_))
      ended.emplace(f.id, f.reason);
    for (std::size_t k = 0; k < rows.size(); ++k) accept_row(rows[k], k, ended);
    for (detail::fork_job& job : forks) start_fork(job);
    for (const detail::beam_rows& b : step_.beam_groups) expand_beams(b, logits);
    if (options_.on_step && forward)
      options_.on_step(step_report{.plan = step_.plan_copy, .kv_blocks_used = kv_used});
  }

  // Streams the tokens sampled row k took (its draw, then the draws on its
  // kept guesses), one event each, until a stop rule ends the request.
  // `ended`: the requests the scheduler finished, which stopped at their
  // first token that fired a token rule (or at their last token).
  void accept_row(request_id id, std::size_t k, const std::unordered_map<request_id, finish_reason>& ended) {
    const auto it = live_.find(id);
    const auto end = ended.find(id);
    const std::size_t n = 1 + spec_.accepted[k];
    for (std::size_t j = 0; j < n; ++j) {
      detail::row_result& r = j == 0 ? step_.results[k] : spec_.extra[k][j - 1];
      if (end == ended.end()) {
        if (!accept_token(it, r, std::nullopt, scheduled::yes, detail::origin::sampled)) return;
        continue;
      }
      std::optional<finish_reason> why = j + 1 == n ? std::optional(end->second) : token_rule(it->second, r);
      if (!accept_token(it, r, why, scheduled::no, detail::origin::sampled)) return;
    }
  }

  // The token rule (EOS, stop sequence, budget) that the token of `r` fires
  // for request `l`, as the scheduler checks it.
  static std::optional<finish_reason> token_rule(detail::live_request& l, const detail::row_result& r) {
    if (!r.error.empty()) return std::nullopt;
    l.context.push_back(r.sample.token);
    const auto why = l.request.stop.check(std::span<const token_id>(l.context).subspan(l.n_prompt));
    l.context.pop_back();
    return why;
  }

  // A sample forked in this step takes its first token, then runs in the
  // scheduler on its forked blocks, or recomputes its context when
  // admitted if the scheduler has no room to run it now.
  void start_fork(detail::fork_job& job) {
    const auto it = live_.find(job.handle);
    LLMKIT_ASSERT(it != live_.end());
    detail::live_request& c = it->second;
    c.awaiting_fork = false;
    c.seq = job.seq;  // freed by finish() if the sample ends at once
    std::optional<finish_reason> by_tokens;
    if (job.row.error.empty()) by_tokens = c.request.stop.check(std::span<const token_id>(&job.row.sample.token, 1));
    if (!accept_token(it, job.row, by_tokens, scheduled::no, detail::origin::sampled)) return;
    const bool running = sched_.submit_forked(detail::scheduler_request(job.handle, c), {c.context.back()},
                                              c.seq ? static_cast<std::int64_t>(c.n_prompt) : 0);
    if (running) {
      c.admitted = true;
      c.usage.n_prompt_tokens_reused = c.n_prompt;
      stats_.n_prompt_tokens_reused += c.n_prompt;
    } else if (c.seq) {
      cache_.free(*c.seq);
      c.seq.reset();
    }
  }

  // Picks the next beams of beam request `b.id` from its rows of `logits`;
  // when the search is over, sends its hypotheses and ends it.
  void expand_beams(const detail::beam_rows& b, matrix_view<const float> logits) {
    const auto it = live_.find(b.id);
    if (it == live_.end()) return;
    detail::live_request& l = it->second;
    std::optional<std::vector<search::beam_hypothesis>> result;
    try {
      result = detail::expand_group(cache_, *l.beams, logits, b.first_row, std::max<std::size_t>(l.request.n, 1),
                                    l.request.stop);
    } catch (const std::exception& e) {
      sched_.cancel(b.id);
      finish(it, finish_kind::error, std::nullopt, e.what());
      return;
    }
    if (!result) return;
    sched_.cancel(b.id);  // still there unless the budget ended it
    detail::live_request done = std::move(l);
    live_.erase(it);
    detail::free_sequences(cache_, done);
    detail::send_hypotheses(b.id, done, *result, tokenizer_, stats_);
  }

  // Appends the token drawn in `r` to request `it`, streams its event, and
  // ends the request when a stop rule fired (`by_tokens`: the token rule the
  // scheduler or the caller checked; stop strings are checked here) or the
  // row failed. `in_scheduler`: the scheduler still holds the request (it is
  // cancelled there when it ends). Returns true when the request goes on.
  bool accept_token(live_iterator it, detail::row_result& r, std::optional<finish_reason> by_tokens,
                    scheduled in_scheduler, detail::origin from) {
    LLMKIT_ASSERT(it != live_.end());
    const request_id id = it->first;
    detail::live_request& l = it->second;
    auto end = [&](finish_kind kind, std::optional<finish_reason> reason, std::string error = {}) {
      if (in_scheduler == scheduled::yes) sched_.cancel(id);
      finish(it, kind, reason, std::move(error));
      return false;
    };
    if (!r.error.empty()) return end(finish_kind::error, std::nullopt, "sampling: " + r.error);
    bool stop_string = false;
    const stream_event e = detail::append_token(id, l, r, from, tokenizer_, stop_string);
    if (from == detail::origin::sampled) ++stats_.n_generated_tokens;
    std::optional<finish_reason> why = by_tokens;
    if (stop_string && (!why || *why == finish_reason::max_tokens)) why = finish_reason::stop_string;
    if (!detail::deliver(l.request, e)) return end(finish_kind::error, std::nullopt, "the event callback threw");
    if (why) return end(kind_of(*why), *why);
    return true;
  }

  void deliver_finish(request_id h, detail::live_request& l, finish_kind kind, std::optional<finish_reason> reason,
                      std::string error = {}) {
    ++stats_.n_finished[static_cast<std::size_t>(kind)];
    detail::deliver(l.request, detail::finish_event(h, l, kind, reason, std::move(error)));
  }

  // Ends a live request: frees its sequence and staging blocks, lets its
  // waiting samples run on their own, sends its finish event.
  void finish(live_iterator it, finish_kind kind, std::optional<finish_reason> reason, std::string error = {}) {
    detail::live_request l = std::move(it->second);
    const request_id h = it->first;
    live_.erase(it);
    if (options_.draft_model != nullptr && l.request.speculative.drafter == draft_source::model)
      options_.draft_model->release(h);
    detail::release_forks(live_, l, sched_);
    detail::free_sequences(cache_, l);
    unstage(l);
    if (!l.beams) return deliver_finish(h, l, kind, reason, std::move(error));
    for (std::size_t i = 0; i < std::max<std::size_t>(l.request.n, 1); ++i) {  // one finish per requested hypothesis
      l.index = i;
      deliver_finish(h + static_cast<request_id>(i), l, kind, reason, error);
    }
  }

  void publish_stats() {
    engine_stats s = stats_;
    const auto& st = sched_.state();
    s.n_queued = st.waiting.size() + st.swapped.size() + detail::n_awaiting_fork(live_);
    s.n_running = st.running.size();
    const kv::block_pool& pool = cache_.pool();
    s.kv_blocks_total = pool.n_total();
    s.kv_blocks_free = pool.n_free();
    s.kv_blocks_used = detail::held_blocks(cache_);
    s.kv_blocks_cached = s.kv_blocks_total - s.kv_blocks_free - s.kv_blocks_used;
    intake_.publish(s, !sched_.idle());
  }

  Model& model_;
  Cache& cache_;
  Exec& exec_;
  engine_options options_;
  const model::tokenizer* tokenizer_;
  sched::engine_limits limits_;

  // Step thread only.
  sched::scheduler sched_;
  detail::live_map live_;
  detail::step_buffers step_;
  detail::speculation_buffers spec_;
  std::vector<token_id> spec_tokens_;     // the step's tokens for complete_step
  std::vector<std::size_t> spec_counts_;  // and how many each sampling item took
  engine_stats stats_;  // counters of the step thread

  // Any thread.
  detail::intake intake_;
  std::thread thread_;
};

}  // namespace llmkit::serve
