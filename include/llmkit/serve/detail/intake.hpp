// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/intake.hpp
/// The side of an engine that any thread touches, under one mutex: the
/// admission of checked requests (handles, the queue and staging limits,
/// shutdown), the inbox of accepted ones and of cancellations the step
/// thread takes at each step, the submit-side counters, and the snapshot
/// of the step thread's stats that `engine::stats` and `idle` read.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/stats.hpp"

namespace llmkit::serve::detail {

/// An accepted request on its way to the step thread: sample 0's handle,
/// the request, its parsed chain, and for a prefilled request its
/// `[n_given] given` tokens, KV buffer and the staging blocks it holds.
struct submission {
  request_id handle;
  generation_request request;
  sampling::runtime_chain chain;
  std::vector<token_id> given = {};
  std::vector<std::byte> kv = {};
  std::int64_t staged_blocks = 0;
};

/// What the step thread takes from the intake at the start of a step, in
/// the order it handles them: submissions, cancellations, cancel-all.
struct intake_batch {
  std::vector<submission> submissions;
  std::vector<request_id> cancels;
  bool cancel_all = false;
};

/// The engine's shared state. All members may be called from any thread;
/// `take`, `wait_for_work`, `publish` and `release_staging` come from the
/// step thread.
class intake {
 public:
  /// @param max_queued  most requests waiting (inbox + the scheduler's queue)
  /// @param staging_capacity  blocks of the staging area (0 = none)
  intake(std::size_t max_queued, std::int64_t staging_capacity)
      : max_queued_(max_queued), staging_capacity_(staging_capacity) {}

  /// The admission both submit paths share. `checked` is the outcome of the
  /// caller-side checks (accepted, or invalid with its message), for a
  /// request of `n_samples` samples whose buffer takes `staging_blocks`
  /// staging blocks (0 unless prefilled). Answers `staging_full` when those
  /// blocks are not free now (then nothing is counted and no handle given);
  /// otherwise gives the request its handles and, when `checked` was
  /// accepted, rejects it when shutting down (`shutting_down`) or when the
  /// queue would exceed `max_queued` (`queue_full`), else queues
  /// `make(handle)` (a `submission`) and wakes the step thread. The caller
  /// sends a rejected request's finish events.
  template <class MakeSubmission>
  submit_result admit(submit_result checked, std::size_t n_samples, std::int64_t staging_blocks,
                      MakeSubmission&& make) {
    submit_result out = std::move(checked);
    {
      std::lock_guard lock(mutex_);
      if (out.accepted() && accepting_ && staging_used_ + staging_blocks > staging_capacity_) {
        ++n_rejected_staging_full_;
        out.status = submit_status::staging_full;
        out.message = "the staging area is full (" + std::to_string(staging_used_) + " of " +
                      std::to_string(staging_capacity_) + " blocks held; " + std::to_string(staging_blocks) +
                      " needed)";
        return out;
      }
      out.handle = next_handle_;
      next_handle_ += static_cast<request_id>(n_samples);
      n_submitted_ += n_samples;
      if (out.accepted()) {
        if (!accepting_) {
          out.status = submit_status::shutting_down;
          out.message = "the engine is shutting down";
        } else if (inbox_requests_ + published_.n_queued + n_samples > max_queued_) {
          out.status = submit_status::queue_full;
          out.message = "the queue is full (" + std::to_string(max_queued_) + " requests waiting)";
          n_rejected_queue_full_ += n_samples;
        }
      }
      if (out.accepted()) {
        staging_used_ += staging_blocks;
        inbox_requests_ += n_samples;
        inbox_.push_back(make(out.handle));
      } else {
        n_rejected_ += n_samples;
      }
    }
    if (out.accepted()) wake_.notify_all();
    return out;
  }

  /// Queues the cancellation of request `handle` for the next step.
  void cancel(request_id handle) {
    {
      std::lock_guard lock(mutex_);
      cancels_.push_back(handle);
    }
    wake_.notify_all();
  }

  /// Asks the next step to cancel every queued and live request.
  void cancel_all() {
    {
      std::lock_guard lock(mutex_);
      cancel_all_ = true;
    }
    wake_.notify_all();
  }

  /// From now on `admit` answers `shutting_down`.
  void stop_accepting() {
    std::lock_guard lock(mutex_);
    accepting_ = false;
  }

  /// Stops accepting and asks the step thread to end once no work is left
  /// (`wait_for_work`); with `cancel_everything`, also `cancel_all`.
  void request_stop(bool cancel_everything) {
    {
      std::lock_guard lock(mutex_);
      accepting_ = false;
      stop_requested_ = true;
      if (cancel_everything) cancel_all_ = true;
    }
    wake_.notify_all();
  }

  /// Clears a stop request (before a step thread starts).
  void clear_stop() {
    std::lock_guard lock(mutex_);
    stop_requested_ = false;
  }

  /// Takes the submissions and cancellations since the last call.
  intake_batch take() {
    intake_batch b;
    std::lock_guard lock(mutex_);
    b.submissions.swap(inbox_);
    inbox_requests_ = 0;
    b.cancels.swap(cancels_);
    b.cancel_all = cancel_all_;
    cancel_all_ = false;
    return b;
  }

  /// True when `take` would return nothing.
  bool empty() const {
    std::lock_guard lock(mutex_);
    return !has_work();
  }

  /// Sleeps until there is something to take, a stop request, or
  /// `steps_pending` (the scheduler holds requests: no wait). Returns false
  /// when the step thread should end: stop requested and nothing left.
  bool wait_for_work(bool steps_pending) {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return has_work() || stop_requested_ || steps_pending; });
    return !(stop_requested_ && !has_work() && !steps_pending);
  }

  /// Gives back the staging blocks of a request whose buffer left staging
  /// (imported, or the request ended).
  void release_staging(std::int64_t blocks) {
    std::lock_guard lock(mutex_);
    staging_used_ -= blocks;
  }

  /// Publishes the step thread's stats as of the end of a step; `busy`:
  /// the scheduler still holds requests. Wakes `wait_idle`.
  void publish(const engine_stats& s, bool busy) {
    {
      std::lock_guard lock(mutex_);
      published_ = s;
      published_busy_ = busy;
    }
    idle_cv_.notify_all();
  }

  /// The published stats with the submit-side counters and the queue
  /// depth since the last step.
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

  /// True when nothing is queued (inbox or cancellations) and the last
  /// step left the scheduler idle.
  bool idle() const {
    std::lock_guard lock(mutex_);
    return is_idle();
  }

  /// Waits until `idle()` or the timeout; returns idle().
  template <class Rep, class Period>
  bool wait_idle(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock lock(mutex_);
    return idle_cv_.wait_for(lock, timeout, [&] { return is_idle(); });
  }

 private:
  // Under mutex_.
  bool has_work() const { return !inbox_.empty() || !cancels_.empty() || cancel_all_; }
  bool is_idle() const { return inbox_.empty() && cancels_.empty() && !published_busy_; }

  const std::size_t max_queued_;
  const std::int64_t staging_capacity_;

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
};

}  // namespace llmkit::serve::detail
