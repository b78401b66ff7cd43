// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/server_metrics.hpp
/// What llmkit-server's /metrics reports: a fixed-bucket histogram (the
/// Prometheus kind: cumulative buckets with upper bounds, a sum and a
/// count), a snapshot of the counters and gauges, and the thread-safe
/// recorder the request handlers write to.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include <llmkit/serve/request.hpp>

namespace llmkit_server {

/// Observations counted into buckets with fixed upper bounds (seconds for
/// the latency histograms), plus their sum and count.
class fixed_histogram {
 public:
  /// `[n] upper_bounds`, strictly increasing and finite; an implicit +Inf
  /// bucket follows the last one.
  explicit fixed_histogram(std::span<const double> upper_bounds)
      : bounds_(upper_bounds.begin(), upper_bounds.end()), counts_(bounds_.size() + 1, 0) {}

  /// Counts `value` in the first bucket whose bound is >= value (NaN is ignored).
  void observe(double value) {
    if (std::isnan(value)) return;
    const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
    ++counts_[static_cast<std::size_t>(it - bounds_.begin())];
    sum_ += value;
    ++count_;
  }
  /// `[n] upper_bounds` as given (without +Inf).
  std::span<const double> upper_bounds() const noexcept { return bounds_; }
  /// Observations <= upper_bounds()[i]; i == upper_bounds().size() is +Inf (== count()).
  std::uint64_t cumulative(std::size_t i) const noexcept {
    std::uint64_t c = 0;
    for (std::size_t j = 0; j <= i && j < counts_.size(); ++j) c += counts_[j];
    return c;
  }
  double sum() const noexcept { return sum_; }
  std::uint64_t count() const noexcept { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// Bucket bounds, in seconds, of the time to first token.
inline constexpr std::array<double, 12> ttft_buckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
/// Bucket bounds, in seconds, of the time between two streamed tokens.
inline constexpr std::array<double, 11> inter_token_buckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                            0.05,   0.1,   0.25,   0.5,   1.0};

/// Everything /metrics shows at one moment.
struct metrics_snapshot {
  std::uint64_t finished_stop = 0;       ///< choices that ended with finish_reason "stop"
  std::uint64_t finished_length = 0;     ///< ... "length"
  std::uint64_t finished_cancelled = 0;  ///< cancelled (client gone, shutdown)
  std::uint64_t finished_error = 0;      ///< ended by a backend error
  std::uint64_t rejected = 0;            ///< requests answered with a 4xx/5xx error
  std::uint64_t prompt_tokens = 0;       ///< prompt tokens of admitted requests
  std::uint64_t generated_tokens = 0;    ///< tokens generated
  std::size_t queue_depth = 0;           ///< requests waiting for admission
  std::size_t running = 0;               ///< requests in the running batch
  std::size_t kv_blocks_used = 0;
  std::size_t kv_blocks_free = 0;
  fixed_histogram ttft{ttft_buckets};
  fixed_histogram inter_token{inter_token_buckets};
};

/// The request handlers' side of the metrics: counters and histograms under
/// one mutex (the gauges come from the backend when /metrics is read).
class metrics_recorder {
 public:
  void record_prompt(std::size_t n_tokens) {
    std::lock_guard lock(mutex_);
    s_.prompt_tokens += n_tokens;
  }
  void record_token() {
    std::lock_guard lock(mutex_);
    ++s_.generated_tokens;
  }
  void record_ttft(double seconds) {
    std::lock_guard lock(mutex_);
    s_.ttft.observe(seconds);
  }
  void record_inter_token(double seconds) {
    std::lock_guard lock(mutex_);
    s_.inter_token.observe(seconds);
  }
  void record_rejected() {
    std::lock_guard lock(mutex_);
    ++s_.rejected;
  }
  void record_finish(llmkit::serve::finish_kind k) {
    std::lock_guard lock(mutex_);
    switch (k) {
      case llmkit::serve::finish_kind::stop: ++s_.finished_stop; break;
      case llmkit::serve::finish_kind::length: ++s_.finished_length; break;
      case llmkit::serve::finish_kind::cancelled: ++s_.finished_cancelled; break;
      case llmkit::serve::finish_kind::error: ++s_.finished_error; break;
    }
  }
  /// A copy of the counters and histograms (gauges zero).
  metrics_snapshot snapshot() const {
    std::lock_guard lock(mutex_);
    return s_;
  }

 private:
  mutable std::mutex mutex_;
  metrics_snapshot s_;
};

}  // namespace llmkit_server
