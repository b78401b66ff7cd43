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
///   elsewhere when its given tokens were drawn the same way (`sample_token`);
/// - a cancelled or finished request's KV blocks are free at the end of the
///   step that ends it.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
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
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/model/tokenizer.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/logprobs.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/sched/scheduler.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/options.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/sample.hpp"
#include "llmkit/serve/stats.hpp"
#include "llmkit/serve/text_stream.hpp"

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
        sched_(limits_, policy_of(options_)) {
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
  submit_result submit(generation_request request) {
    submit_result out;
    std::optional<sampling::runtime_chain> chain;
    try {
      validate(request);
      chain = sampling::runtime_chain::parse(request.sampling);
    } catch (const std::exception& e) {
      out.status = submit_status::invalid;
      out.message = e.what();
    }
    const std::size_t n = std::max<std::size_t>(request.n, 1);
    {
      std::lock_guard lock(mutex_);
      out.handle = next_handle_;
      next_handle_ += static_cast<request_id>(n);
      n_submitted_ += n;
      if (out.status == submit_status::accepted) {
        if (!accepting_) {
          out.status = submit_status::shutting_down;
          out.message = "the engine is shutting down";
        } else if (inbox_requests_ + published_.n_queued + n > options_.max_queued) {
          out.status = submit_status::queue_full;
          out.message = "the queue is full (" + std::to_string(options_.max_queued) + " requests waiting)";
          n_rejected_queue_full_ += n;
        }
      }
      if (out.status == submit_status::accepted) {
        inbox_requests_ += n;
        inbox_.push_back({out.handle, std::move(request), std::move(*chain)});
      } else {
        n_rejected_ += n;
      }
    }
    if (out.status == submit_status::accepted)
      wake_.notify_all();
    else
      send_rejection(request, out, n);
    return out;
  }

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
    submit_result out;
    std::optional<sampling::runtime_chain> chain;
    std::int64_t blocks = 0;
    try {
      LLMKIT_CHECK(limits_.n_swap_blocks > 0,
                   "submit_prefilled: the engine has no staging area (engine_options::staging_blocks = 0)");
      validate(p.request);
      LLMKIT_CHECK(p.request.n == 1, "submit_prefilled: n = ", p.request.n, " (a prefilled request is one sample)");
      LLMKIT_CHECK(!p.generated.empty(), "submit_prefilled: no generated token (the first one comes with the request)");
      const std::size_t vocab = model_.vocab_size();
      for (std::size_t i = 0; i < p.generated.size(); ++i)
        LLMKIT_CHECK(p.generated[i] >= 0 && static_cast<std::size_t>(p.generated[i]) < vocab, "generated[", i,
                     "] = ", p.generated[i], " is outside the vocabulary of ", vocab, " tokens");
      blocks = staged_blocks(p.request, p.generated);
      LLMKIT_CHECK(blocks <= limits_.n_swap_blocks, "submit_prefilled: the KV of ",
                   p.request.prompt.size() + p.generated.size() - 1, " tokens needs ", blocks,
                   " staging blocks, the staging area holds ", limits_.n_swap_blocks);
      chain = sampling::runtime_chain::parse(p.request.sampling);
    } catch (const std::exception& e) {
      out.status = submit_status::invalid;
      out.message = e.what();
    }
    {
      std::lock_guard lock(mutex_);
      if (out.status == submit_status::accepted && accepting_ && staging_used_ + blocks > limits_.n_swap_blocks) {
        ++n_rejected_staging_full_;
        out.status = submit_status::staging_full;
        out.message = "the staging area is full (" + std::to_string(staging_used_) + " of " +
                      std::to_string(limits_.n_swap_blocks) + " blocks held; " + std::to_string(blocks) + " needed)";
        return out;
      }
      out.handle = next_handle_++;
      ++n_submitted_;
      if (out.status == submit_status::accepted) {
        if (!accepting_) {
          out.status = submit_status::shutting_down;
          out.message = "the engine is shutting down";
        } else if (inbox_requests_ + published_.n_queued + 1 > options_.max_queued) {
          out.status = submit_status::queue_full;
          out.message = "the queue is full (" + std::to_string(options_.max_queued) + " requests waiting)";
          ++n_rejected_queue_full_;
        }
      }
      if (out.status == submit_status::accepted) {
        staging_used_ += blocks;
        ++inbox_requests_;
        inbox_.push_back({out.handle, std::move(p.request), std::move(*chain), std::move(p.generated),
                          std::move(p.kv), blocks});
      } else {
        ++n_rejected_;
      }
    }
    if (out.status == submit_status::accepted)
      wake_.notify_all();
    else
      send_rejection(p.request, out, 1);
    return out;
  }

  /// Cancels request `handle` at the next step (its finish event, kind
  /// cancelled, carries the text so far; its KV blocks are freed then).
  /// Callable from any thread; a finished or unknown handle is ignored.
  void cancel(request_id handle) {
    {
      std::lock_guard lock(mutex_);
      cancels_.push_back(handle);
    }
    wake_.notify_all();
  }

  /// Cancels every queued and running request at the next step.
  void cancel_all() {
    {
      std::lock_guard lock(mutex_);
      cancel_all_ = true;
    }
    wake_.notify_all();
  }

  /// From now on `submit` rejects requests (`submit_status::shutting_down`);
  /// requests already accepted keep running.
  void stop_accepting() {
    std::lock_guard lock(mutex_);
    accepting_ = false;
  }

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
    while (step() || !inbox_empty()) {
    }
  }

  /// Starts the engine's step thread, which steps whenever a request is
  /// live and sleeps otherwise. @throws llmkit::error when already started.
  void start() {
    LLMKIT_CHECK(!thread_.joinable(), "engine::start: already started");
    {
      std::lock_guard lock(mutex_);
      stop_requested_ = false;
    }
    thread_ = std::thread([this] { loop(); });
  }

  /// Stops accepting requests, then cancels (shutdown_mode::cancel) or
  /// finishes (drain) every request, queued ones included, and joins the
  /// step thread; without one, steps on the calling thread until done.
  /// Every request has had its finish event when `stop` returns. The engine
  /// accepts nothing afterwards. Not from an event callback (it would wait
  /// for the very step that calls it).
  void stop(shutdown_mode mode = shutdown_mode::cancel) {
    {
      std::lock_guard lock(mutex_);
      accepting_ = false;
      stop_requested_ = true;
      if (mode == shutdown_mode::cancel) cancel_all_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
      thread_.join();
    } else {
      while (step_once() || !inbox_empty()) {
      }
    }
  }

  /// A snapshot of the counters and gauges; callable from any thread.
  engine_stats stats() const {
    std::lock_guard lock(mutex_);
    engine_stats s = published_;
    s.n_queued += inbox_requests_;
    s.n_submitted = n_submitted_;
    s.n_rejected_queue_full = n_rejected_queue_full_;
    s.n_rejected_staging_full = n_rejected_staging_full_;
    s.staging_blocks_used = static_cast<std::size_t>(staging_used_);
    s.n_finished[static_cast<std::size_t>(finish_kind::error)] += n_rejected_;
    return s;
  }

  /// True when no request is queued or live.
  bool idle() const {
    std::lock_guard lock(mutex_);
    return inbox_.empty() && cancels_.empty() && !published_busy_;
  }

  /// Waits until `idle()` (the step thread finished everything) or the
  /// timeout; returns idle().
  template <class Rep, class Period>
  bool wait_idle(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock lock(mutex_);
    return idle_cv_.wait_for(lock, timeout, [&] { return inbox_.empty() && cancels_.empty() && !published_busy_; });
  }

  const engine_options& options() const noexcept { return options_; }
  /// The block limits the scheduler plans with (from the cache and options).
  const sched::engine_limits& limits() const noexcept { return limits_; }

 private:
  struct submission {
    request_id handle;
    generation_request request;
    sampling::runtime_chain chain;
    // A prefilled request's given tokens, KV buffer and staging blocks.
    std::vector<token_id> given = {};
    std::vector<std::byte> kv = {};
    std::int64_t staged_blocks = 0;
  };
  // A request the scheduler owns, with what the engine keeps beside it.
  struct live_request {
    generation_request request;
    sampling::runtime_chain chain;
    std::vector<token_id> context;  // prompt then generated tokens
    std::size_t n_prompt = 0;
    std::optional<kv::seq_id> seq;  // while it holds KV (running)
    text_stream text;
    request_usage usage;
    bool admitted = false;
    std::size_t index = 0;                      // sample index of an n > 1 request
    std::vector<request_id> pending_forks;  // samples to fork when the prompt's logits are sampled
    bool awaiting_fork = false;                 // a sample not yet in the scheduler
    std::vector<std::byte> kv;                  // a prefilled request's buffer until imported
    std::int64_t staged_blocks = 0;             // staging blocks it holds until then
  };

  // The sampled row of one item.
  struct row_result {
    sampling::sample_result sample;
    std::vector<sampling::token_logprob> top;
    std::string error;
  };
  // A sample forked from its prompt's row in this step.
  struct fork_job {
    request_id handle;
    std::optional<kv::seq_id> seq;
    row_result row;
  };

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

  // Staging blocks of a prefilled request's buffer: the context before its
  // last given token, or 0 when a token rule ends it within the given
  // tokens (it never reaches the scheduler).
  std::int64_t staged_blocks(const generation_request& r, std::span<const token_id> given) const {
    for (std::size_t i = 1; i <= given.size(); ++i)
      if (r.stop.check(given.first(i))) return 0;
    return sched::blocks_for(static_cast<std::int64_t>(r.prompt.size() + given.size() - 1), limits_.block_size);
  }

  // The finish events of a request rejected by submit (n samples).
  static void send_rejection(const generation_request& request, const submit_result& out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      stream_event e;
      e.handle = out.handle + static_cast<request_id>(i);
      e.index = i;
      e.type = event_type::finish;
      e.finish = finish_kind::error;
      e.error = out.message;
      e.usage.n_prompt_tokens = request.prompt.size();
      if (request.on_event) {
        try {
          request.on_event(e);
        } catch (...) {  // the request is over either way
        }
      }
    }
  }

  void validate(const generation_request& r) const {
    LLMKIT_CHECK(!r.prompt.empty(), "prompt is empty");
    const std::size_t vocab = model_.vocab_size();
    for (std::size_t i = 0; i < r.prompt.size(); ++i)
      LLMKIT_CHECK(r.prompt[i] >= 0 && static_cast<std::size_t>(r.prompt[i]) < vocab, "prompt[", i, "] = ",
                   r.prompt[i], " is outside the vocabulary of ", vocab, " tokens");
    r.stop.validate("stop");
    const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
    LLMKIT_CHECK(n_prompt < options_.max_context &&
                     r.stop.max_new_tokens <= static_cast<std::size_t>(options_.max_context - n_prompt),
                 "prompt length ", n_prompt, " + max_new_tokens ", r.stop.max_new_tokens, " exceeds the context of ",
                 options_.max_context, " tokens");
    LLMKIT_CHECK(r.stop.stop_strings.empty() || tokenizer_ != nullptr,
                 "stop strings need a tokenizer; the engine has none");
    LLMKIT_CHECK(r.top_logprobs <= vocab, "top_logprobs = ", r.top_logprobs, " exceeds the vocabulary of ", vocab,
                 " tokens");
    LLMKIT_CHECK(r.n >= 1 && r.n <= options_.max_queued, "n = ", r.n, " is outside [1, max_queued = ",
                 options_.max_queued, "]");
  }

  bool inbox_empty() const {
    std::lock_guard lock(mutex_);
    return inbox_.empty() && cancels_.empty() && !cancel_all_;
  }

  void loop() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] {
          return !inbox_.empty() || !cancels_.empty() || cancel_all_ || stop_requested_ || !sched_.idle();
        });
        if (stop_requested_ && inbox_.empty() && cancels_.empty() && !cancel_all_ && sched_.idle()) return;
      }
      step_once();
    }
  }

  bool step_once() {
    std::vector<submission> incoming;
    std::vector<request_id> cancels;
    bool cancel_everything = false;
    {
      std::lock_guard lock(mutex_);
      incoming.swap(inbox_);
      inbox_requests_ = 0;
      cancels.swap(cancels_);
      cancel_everything = cancel_all_;
      cancel_all_ = false;
    }
    for (submission& s : incoming) enqueue(std::move(s));
    for (request_id h : cancels) cancel_now(h);
    if (cancel_everything) {
      std::vector<request_id> all;
      for (const auto& [h, r] : live_) all.push_back(h);
      std::sort(all.begin(), all.end());
      for (request_id h : all) cancel_now(h);
    }
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
  void enqueue(submission s) {
    if (!s.given.empty()) return enqueue_prefilled(std::move(s));
    const std::size_t n = std::max<std::size_t>(s.request.n, 1);
    for (std::size_t i = 0; i < n; ++i) {
      const request_id h = s.handle + static_cast<request_id>(i);
      live_request l;
      l.n_prompt = s.request.prompt.size();
      l.context = s.request.prompt;
      l.usage.n_prompt_tokens = l.n_prompt;
      l.chain = s.chain;
      l.request = s.request;
      l.request.n = 1;
      l.request.stream = s.request.stream + i;
      l.index = i;
      if (i == 0) {
        for (std::size_t j = 1; j < n; ++j) l.pending_forks.push_back(s.handle + static_cast<request_id>(j));
        try {
          sched_.submit(scheduler_request(h, l));
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

  // Streams a prefilled request's given tokens (stop rules applied), then
  // hands it to the scheduler's staging area, where its buffer waits to be
  // swapped in.
  void enqueue_prefilled(submission s) {
    live_request l;
    l.n_prompt = s.request.prompt.size();
    l.context = s.request.prompt;
    l.usage.n_prompt_tokens = l.n_prompt;
    l.chain = std::move(s.chain);
    l.request = std::move(s.request);
    l.kv = std::move(s.kv);
    l.staged_blocks = s.staged_blocks;
    const request_id h = s.handle;
    const auto it = live_.emplace(h, std::move(l)).first;
    for (std::size_t i = 0; i < s.given.size(); ++i) {
      row_result r;
      r.sample.token = s.given[i];
      const auto by_tokens = it->second.request.stop.check(std::span<const token_id>(s.given).first(i + 1));
      if (!accept_token(it, r, by_tokens, scheduled::no, origin::given)) return;
    }
    live_request& staged = it->second;
    try {
      std::vector<token_id> generated(staged.context.begin() + static_cast<std::ptrdiff_t>(staged.n_prompt),
                                      staged.context.end());
      LLMKIT_CHECK(sched_.submit_prefilled(scheduler_request(h, staged), std::move(generated)),
                   "engine: the scheduler's staging area has no room for a request the engine staged");
    } catch (const std::exception& e) {  // validated at submit; kept for safety
      finish(it, finish_kind::error, std::nullopt, e.what());
    }
  }

  // Imports the KV buffer of staged request `id`, which the plan swaps in.
  // False (the request ended with an error, and left the scheduler) when
  // the buffer is corrupt, foreign or of the wrong length.
  bool import_staged(request_id id) {
    const auto it = live_.find(id);
    LLMKIT_ASSERT(it != live_.end());
    live_request& l = it->second;
    try {
      if constexpr (importing_cache<Cache>) {
        const std::optional<kv::seq_id> seq = cache_.import_sequence(l.kv);
        LLMKIT_CHECK(seq.has_value(), "the cache has no room for the buffer (or holds its maximum of sequences)");
        const std::size_t expected = l.context.size() - 1;
        if (cache_.n_tokens(*seq) != expected) {
          const std::size_t got = cache_.n_tokens(*seq);
          cache_.free(*seq);
          LLMKIT_CHECK(false, "the buffer holds ", got, " tokens, the request's context needs ", expected,
                       " (prompt + given tokens - 1)");
        }
        l.seq = seq;
      } else {
        LLMKIT_CHECK(false, "the cache cannot import KV buffers");
      }
    } catch (const std::exception& e) {
      sched_.cancel(id);
      finish(it, finish_kind::error, std::nullopt, std::string("importing the KV buffer: ") + e.what());
      return false;
    }
    l.admitted = true;
    l.kv = {};
    unstage(l);
    ++stats_.n_imported;
    return true;
  }

  // Gives back the staging blocks of a request whose buffer left staging.
  void unstage(live_request& l) {
    if (l.staged_blocks == 0) return;
    std::lock_guard lock(mutex_);
    staging_used_ -= l.staged_blocks;
    l.staged_blocks = 0;
  }

  static sched::request scheduler_request(request_id h, const live_request& l) {
    sched::request r;
    r.id = h;
    r.prompt = l.request.prompt;
    r.stop = l.request.stop;
    return r;
  }

  // Sample 0 ended before its prompt's logits were sampled: its samples run
  // as requests of their own (prefix reuse still shares the prompt).
  void release_forks(live_request& l) {
    for (request_id h : l.pending_forks) {
      const auto it = live_.find(h);
      if (it == live_.end()) continue;
      it->second.awaiting_fork = false;
      sched_.submit(scheduler_request(h, it->second));
    }
    l.pending_forks.clear();
  }

  void cancel_now(request_id h) {
    const auto it = live_.find(h);
    if (it == live_.end()) return;
    sched_.cancel(h);
    finish(it, finish_kind::cancelled, finish_reason::cancelled);
  }

  void fail_all(const std::string& message) {
    std::vector<request_id> all;
    for (const auto& [h, r] : live_) all.push_back(h);
    std::sort(all.begin(), all.end());
    for (request_id h : all) {
      sched_.cancel(h);
      finish(live_.find(h), finish_kind::error, std::nullopt, message);
    }
    // The failed step's plan was never completed: start from a fresh scheduler.
    sched_ = sched::scheduler(limits_, policy_of(options_));
  }

  // Looks the waiting requests up in the prefix cache, so that admission
  // plans only the prefill past their cached prefix.
  void plan_prefix_reuse() {
    if constexpr (prefix_reusing_cache<Cache>) {
      if (options_.reuse == prefix_reuse::disabled) return;
      const auto& p = sched_.get_policy();
      const std::size_t window = static_cast<std::size_t>(std::max(p.max_batch_seqs, p.length_window) + 1);
      const auto& waiting = sched_.state().waiting;
      std::vector<std::pair<request_id, std::int64_t>> hits;
      for (std::size_t i = 0; i < waiting.size() && i < window; ++i) {
        const live_request& l = live_.at(waiting[i].id);
        hits.emplace_back(waiting[i].id, static_cast<std::int64_t>(cache_.match(l.context)));
      }
      for (const auto& [id, n] : hits) sched_.set_cached_prefix(id, n);
    }
  }

  // Gives an admitted request its cache sequence, holding its first
  // `first_pos` context tokens (from the prefix cache when first_pos > 0).
  kv::seq_id open_sequence(live_request& l, std::int64_t first_pos) {
    std::optional<kv::seq_id> seq;
    const auto n_reused = static_cast<std::size_t>(first_pos);
    if constexpr (prefix_reusing_cache<Cache>) {
      if (options_.reuse == prefix_reuse::enabled) {
        const auto hit = cache_.add_sequence(std::span<const token_id>(l.context));
        LLMKIT_CHECK(hit.has_value(), "engine: the cache holds its maximum number of sequences");
        seq = hit->seq;
        LLMKIT_CHECK(hit->n_cached_tokens >= n_reused, "engine: the prefix cache found ", hit->n_cached_tokens,
                     " cached tokens, the plan expected ", n_reused);
        if (hit->n_cached_tokens > n_reused) cache_.truncate(*seq, n_reused);
      }
    }
    if (!seq) {
      LLMKIT_CHECK(n_reused == 0, "engine: a plan starts at position ", n_reused, " without prefix reuse");
      seq = cache_.add_sequence();
      LLMKIT_CHECK(seq.has_value(), "engine: the cache holds its maximum number of sequences");
    }
    stats_.n_prompt_tokens_reused += n_reused;
    if (!l.admitted) l.usage.n_prompt_tokens_reused = n_reused;
    l.admitted = true;
    l.seq = seq;
    return *seq;
  }

  void run_step() {
    plan_prefix_reuse();
    const sched::step_plan& plan = sched_.next_step();
    LLMKIT_CHECK(plan.swapped_out.empty(),
                 "engine: the scheduler planned a swap-out; the engine preempts by recompute");
    for (const sched::block_move& m : plan.preempted) {
      live_request& l = live_.at(m.id);
      if (l.seq) cache_.free(*l.seq);
      l.seq.reset();
      ++l.usage.n_preemptions;
      ++stats_.n_preemptions;
    }
    // A request whose import failed has ended (and left the scheduler); its
    // items are skipped and its sampled slot filled with a dummy token.
    for (const sched::block_move& m : plan.swapped_in) import_staged(m.id);
    batch_.clear();
    std::vector<request_id> rows;  // the request of each logits row
    for (const sched::step_item& it : plan.items) {
      if (!live_.contains(it.id)) continue;
      live_request& l = live_.at(it.id);
      const kv::seq_id seq = l.seq ? *l.seq : open_sequence(l, it.first_pos);
      LLMKIT_ASSERT(cache_.n_tokens(seq) == static_cast<std::size_t>(it.first_pos));
      batch_.add(seq,
                 std::span<const token_id>(l.context)
                     .subspan(static_cast<std::size_t>(it.first_pos), static_cast<std::size_t>(it.n_tokens)),
                 static_cast<std::int32_t>(it.first_pos),
                 it.samples ? model::last_logits::keep : model::last_logits::skip);
      if (it.is_prefill) stats_.n_prompt_tokens_prefilled += static_cast<std::uint64_t>(it.n_tokens);
      if (it.samples) rows.push_back(it.id);
    }
    // Empty only when every item's request failed its import.
    const bool forward = batch_.n_tokens() > 0;
    matrix_view<const float> logits;
    if (forward) {
      logits = model_.forward(batch_.view(), cache_, exec_);
      ++stats_.n_steps;
    }
    if constexpr (prefix_reusing_cache<Cache>) {
      for (const sched::step_item& it : plan.items)
        if (const auto l = live_.find(it.id); l != live_.end()) cache_.commit(*l->second.seq);
    }
    const std::size_t kv_used = kv_blocks_used();
    // The plan is invalidated by complete_step; the report needs it after.
    if (options_.on_step) plan_copy_ = plan;

    // Every row on its own workspace and Philox stream: the draw does not
    // depend on the row's place in the batch or on the thread.
    results_.resize(rows.size());
    if (workspaces_.size() < rows.size()) workspaces_.resize(rows.size());
    exec_.parallel_for(rows.size(), [&](std::size_t k) {
      sample_into(live_.at(rows[k]), logits.row(k), workspaces_[k], results_[k]);
    });

    // Samples 1 .. n - 1 of a prompt whose logits were just sampled for the
    // first time draw from the same row and share its blocks.
    std::vector<fork_job> forks;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      live_request& l = live_.at(rows[k]);
      if (l.pending_forks.empty() || l.context.size() != l.n_prompt) continue;
      for (request_id h : l.pending_forks) {
        const auto c = live_.find(h);
        if (c == live_.end()) continue;
        fork_job job{h, cache_.fork(*l.seq), {}};
        if (workspaces_.empty()) workspaces_.resize(1);
        sample_into(c->second, logits.row(k), workspaces_[0], job.row);
        forks.push_back(std::move(job));
      }
      l.pending_forks.clear();
    }

    std::vector<token_id> sampled;  // one per sampling item of the plan, in order
    for (std::size_t k = 0; const sched::step_item& it : plan.items) {
      if (!it.samples) continue;
      if (k < rows.size() && rows[k] == it.id) {
        sampled.push_back(results_[k].error.empty() ? results_[k].sample.token : 0);
        ++k;
      } else {
        sampled.push_back(0);  // a request that ended before the forward pass
      }
    }
    std::unordered_map<request_id, finish_reason> ended;
    for (const sched::finished_request& f : sched_.complete_step(sampled)) ended.emplace(f.id, f.reason);

    for (std::size_t k = 0; k < rows.size(); ++k) {
      const request_id id = rows[k];
      const auto it = ended.find(id);
      if (it == ended.end())
        accept_token(live_.find(id), results_[k], std::nullopt, scheduled::yes, origin::sampled);
      else
        accept_token(live_.find(id), results_[k], it->second, scheduled::no, origin::sampled);
    }

    for (fork_job& job : forks) {
      const auto it = live_.find(job.handle);
      LLMKIT_ASSERT(it != live_.end());
      live_request& c = it->second;
      c.awaiting_fork = false;
      c.seq = job.seq;  // freed by finish() if the sample ends at once
      std::optional<finish_reason> by_tokens;
      if (job.row.error.empty()) by_tokens = c.request.stop.check(std::span<const token_id>(&job.row.sample.token, 1));
      if (!accept_token(it, job.row, by_tokens, scheduled::no, origin::sampled)) continue;
      const bool running = sched_.submit_forked(scheduler_request(job.handle, c), {c.context.back()},
                                                c.seq ? static_cast<std::int64_t>(c.n_prompt) : 0);
      if (running) {
        c.admitted = true;
        c.usage.n_prompt_tokens_reused = c.n_prompt;
        stats_.n_prompt_tokens_reused += c.n_prompt;
      } else if (c.seq) {  // no room to run now: it recomputes its context when admitted
        cache_.free(*c.seq);
        c.seq.reset();
      }
    }
    if (options_.on_step && forward) options_.on_step(step_report{.plan = plan_copy_, .kv_blocks_used = kv_used});
  }

  // Processes `[vocab] row` with l's chain and draws its next token.
  static void sample_into(const live_request& l, std::span<const float> row, sampling::candidates& ws,
                          row_result& out) {
    out.error.clear();
    out.top.clear();
    try {
      out.top.resize(l.request.top_logprobs);
      std::size_t n_top = 0;
      out.sample = sample_token(l.chain, l.request, l.context, row, ws, out.top, &n_top);
      out.top.resize(n_top);
    } catch (const std::exception& e) {
      out.error = e.what();
      out.sample = {};
    }
  }

  enum class scheduled : bool { no, yes };
  // Whether a token was sampled by the engine or given with a prefilled request.
  enum class origin : bool { sampled, given };

  // Appends the token drawn in `r` to request `it`, streams its event, and
  // ends the request when a stop rule fired (`by_tokens`: the token rule the
  // scheduler or the caller checked; stop strings are checked here) or the
  // row failed. `in_scheduler`: the scheduler still holds the request (it is
  // cancelled there when it ends). Returns true when the request goes on.
  bool accept_token(typename std::unordered_map<request_id, live_request>::iterator it, row_result& r,
                    std::optional<finish_reason> by_tokens, scheduled in_scheduler, origin from) {
    LLMKIT_ASSERT(it != live_.end());
    const request_id id = it->first;
    live_request& l = it->second;
    auto end = [&](finish_kind kind, std::optional<finish_reason> reason, std::string error = {}) {
      if (in_scheduler == scheduled::yes) sched_.cancel(id);
      finish(it, kind, reason, std::move(error));
      return false;
    };
    if (!r.error.empty()) return end(finish_kind::error, std::nullopt, "sampling: " + r.error);
    const token_id token = r.sample.token;
    l.context.push_back(token);
    ++l.usage.n_generated_tokens;
    if (from == origin::sampled) ++stats_.n_generated_tokens;
    stream_event e;
    e.handle = id;
    e.index = l.index;
    e.type = event_type::token;
    e.prefilled = from == origin::given;
    e.token = token;
    e.logprob = r.sample.logprob;
    e.top_logprobs = std::move(r.top);
    bool stop_string = false;
    if (tokenizer_ != nullptr) {
      text_stream::delta d = l.text.push(*tokenizer_, token, l.request.stop);
      e.text = std::move(d.text);
      stop_string = d.stop_string;
    }
    std::optional<finish_reason> why = by_tokens;
    if (stop_string && (!why || *why == finish_reason::max_tokens)) why = finish_reason::stop_string;
    if (!deliver(l, e)) return end(finish_kind::error, std::nullopt, "the event callback threw");
    if (why) return end(kind_of(*why), *why);
    return true;
  }

  // Blocks held by live sequences: the pool's used blocks but the published
  // prefix blocks nobody holds.
  std::size_t kv_blocks_used() const {
    const kv::block_pool& pool = cache_.pool();
    std::size_t cached = 0;
    if constexpr (prefix_reusing_cache<Cache>) cached = cache_.stats().n_evictable_blocks;
    return pool.n_total() - pool.n_free() - cached;
  }

  // Calls the request's callback; false when it threw.
  static bool deliver(const live_request& l, const stream_event& e) {
    if (!l.request.on_event) return true;
    try {
      l.request.on_event(e);
      return true;
    } catch (...) {
      return false;
    }
  }

  void deliver_finish(request_id h, live_request& l, finish_kind kind, std::optional<finish_reason> reason,
                      std::string error = {}) {
    stream_event e;
    e.handle = h;
    e.index = l.index;
    e.type = event_type::finish;
    e.finish = kind;
    e.reason = reason;
    e.error = std::move(error);
    if (kind != finish_kind::error && reason != finish_reason::stop_string) e.text = l.text.flush();
    e.usage = l.usage;
    ++stats_.n_finished[static_cast<std::size_t>(kind)];
    deliver(l, e);
  }

  // Ends a live request: frees its sequence, sends its finish event.
  void finish(typename std::unordered_map<request_id, live_request>::iterator it, finish_kind kind,
              std::optional<finish_reason> reason, std::string error = {}) {
    live_request l = std::move(it->second);
    const request_id h = it->first;
    live_.erase(it);
    release_forks(l);
    if (l.seq) cache_.free(*l.seq);
    l.seq.reset();
    unstage(l);
    deliver_finish(h, l, kind, reason, std::move(error));
  }

  void publish_stats() {
    engine_stats s = stats_;
    const auto& st = sched_.state();
    s.n_queued = st.waiting.size() + st.swapped.size();
    for (const auto& [h, l] : live_) s.n_queued += l.awaiting_fork ? 1 : 0;
    s.n_running = st.running.size();
    const kv::block_pool& pool = cache_.pool();
    s.kv_blocks_total = pool.n_total();
    s.kv_blocks_free = pool.n_free();
    s.kv_blocks_used = kv_blocks_used();
    s.kv_blocks_cached = s.kv_blocks_total - s.kv_blocks_free - s.kv_blocks_used;
    {
      std::lock_guard lock(mutex_);
      published_ = s;
      published_busy_ = !sched_.idle();
    }
    idle_cv_.notify_all();
  }

  Model& model_;
  Cache& cache_;
  Exec& exec_;
  engine_options options_;
  const model::tokenizer* tokenizer_;
  sched::engine_limits limits_;

  // Step thread only.
  sched::scheduler sched_;
  std::unordered_map<request_id, live_request> live_;
  model::batch_builder batch_;
  std::vector<sampling::candidates> workspaces_;
  std::vector<row_result> results_;
  sched::step_plan plan_copy_;  // for on_step
  engine_stats stats_;  // counters of the step thread

  // Shared, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  mutable std::condition_variable idle_cv_;
  std::vector<submission> inbox_;
  std::size_t inbox_requests_ = 0;  // samples in inbox_
  std::vector<request_id> cancels_;
  bool cancel_all_ = false;
  bool accepting_ = true;
  bool stop_requested_ = false;
  request_id next_handle_ = 1;
  std::uint64_t n_submitted_ = 0, n_rejected_ = 0, n_rejected_queue_full_ = 0, n_rejected_staging_full_ = 0;
  std::int64_t staging_used_ = 0;  // staging blocks of accepted prefilled requests not imported yet
  engine_stats published_;
  bool published_busy_ = false;

  std::thread thread_;
};

}  // namespace llmkit::serve
