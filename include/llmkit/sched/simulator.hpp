// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/simulator.hpp
/// Runs a policy over a request trace in virtual time and reports what a
/// serving benchmark reports: throughput, time to first token (TTFT), time
/// per output token (TPOT), inter-token latency, KV pool use, preemptions.
///
/// `run_trace` is the serving loop; the step executor decides how long each
/// step takes and which requests stop. `simulate` plugs in the roofline cost
/// model and the trace's output lengths, so policies can be compared without
/// a model; an engine plugs in its forward pass and its measured step time.
/// Both are deterministic for deterministic executors.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/sched/cost_model.hpp"
#include "llmkit/sched/policy.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/sched/trace.hpp"

namespace llmkit::sched {

/// The q-quantile (q in [0, 1]) of `[n] values` by linear interpolation
/// between order statistics (numpy's default); 0 for no values.
/// @throws llmkit::error for q outside [0, 1].
inline double percentile(std::vector<double> values, double q) {
  LLMKIT_CHECK(q >= 0.0 && q <= 1.0, "percentile: q must be in [0, 1], got ", q);
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (pos - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

/// What an executor reports for one step.
struct step_outcome {
  /// Duration of the step in seconds (> 0 for a non-empty step).
  double duration_s = 0.0;
  /// Requests whose stop criteria fired on the token sampled in this step.
  std::vector<request_id> stopped;
};

/// Timeline of one request.
struct request_timing {
  request_id id = 0;
  double arrival_s = 0.0;
  double first_token_s = 0.0;
  double finish_s = 0.0;
  std::int64_t n_prompt = 0;
  std::int64_t n_output = 0;
  std::int64_t n_preemptions = 0;
  /// Time to first token.
  double ttft_s() const noexcept { return first_token_s - arrival_s; }
  /// Mean time per output token after the first (0 for one token).
  double tpot_s() const noexcept {
    return n_output > 1 ? (finish_s - first_token_s) / static_cast<double>(n_output - 1) : 0.0;
  }
};

/// One step of a run, for plots and cost-model checks.
struct step_record {
  double start_s = 0.0, duration_s = 0.0;
  std::int64_t n_tokens = 0, n_computed_tokens = 0, n_prefill_tokens = 0, n_decodes = 0, n_seqs = 0;
  std::int64_t blocks_used = 0;
};

/// Summary of a run.
struct run_result {
  std::int64_t requests_done = 0;
  std::int64_t generated_tokens = 0;
  std::int64_t prompt_tokens = 0;
  /// From the first arrival to the last finish.
  double makespan_s = 0.0;
  /// Generated tokens per second of makespan.
  double tokens_per_s = 0.0;
  /// Prompt plus generated tokens per second of makespan.
  double total_tokens_per_s = 0.0;
  double ttft_mean_s = 0, ttft_p50_s = 0, ttft_p99_s = 0, tpot_p50_s = 0, tpot_p99_s = 0;
  /// Gaps between consecutive tokens of a request, over all requests.
  double itl_p50_s = 0, itl_p99_s = 0;
  /// Device KV blocks in use as a fraction of the pool: time-weighted mean
  /// over busy steps, and peak.
  double kv_use_mean = 0, kv_use_peak = 0;
  std::int64_t n_steps = 0, n_preemptions = 0, n_swaps = 0;
  /// Token slots computed (padding included) / real tokens computed.
  double padding_overhead = 1.0;
  std::vector<request_timing> requests;
  /// Filled when `run_options::record_steps`.
  std::vector<step_record> steps;
};

/// Options of a run.
struct run_options {
  bool record_steps = false;
  /// Stop after this many steps (a guard for experiments; 0 = no limit).
  std::int64_t max_steps = 0;
  /// Called after every step with (requests finished, requests in the
  /// trace), e.g. to draw a progress bar.
  std::function<void(std::int64_t, std::int64_t)> on_progress = {};
};

namespace detail {

/// Collects the timeline of a run and summarises it (shared by the
/// single-engine and the disaggregated serving loops).
class run_recorder {
 public:
  explicit run_recorder(bool record_steps) : record_steps_(record_steps) {}

  void arrive(const trace_request& r) {
    timing_[r.id] = {.id = r.id, .arrival_s = r.arrival_s, .n_prompt = r.n_prompt};
    out_.prompt_tokens += r.n_prompt;
  }

  /// A step of `plan` ran over [start, start + duration); `finished` left
  /// the engine at its end; `kv_use` is the fraction of the pool in use
  /// (negative: not counted).
  void step(const step_plan& plan, std::span<const seq_record> finished, double start, double duration,
            double kv_use, std::int64_t blocks_used) {
    const double t = start + duration;
    if (kv_use >= 0) {
      kv_area_ += kv_use * duration;
      kv_time_ += duration;
      out_.kv_use_peak = std::max(out_.kv_use_peak, kv_use);
    }
    out_.n_preemptions += static_cast<std::int64_t>(plan.preempted.size() + plan.swapped_out.size());
    out_.n_swaps += static_cast<std::int64_t>(plan.swapped_out.size());
    computed_ += plan.n_computed_tokens();
    real_ += plan.n_tokens();
    std::int64_t n_decodes = 0;
    for (const step_item& it : plan.items) {
      n_decodes += it.is_prefill ? 0 : 1;
      if (it.samples) token(it.id, t);
    }
    for (const seq_record& f : finished) finish(f.id, t, f.n_preemptions);
    if (record_steps_)
      out_.steps.push_back({.start_s = start, .duration_s = duration, .n_tokens = plan.n_tokens(),
                            .n_computed_tokens = plan.n_computed_tokens(), .n_prefill_tokens = plan.n_prefill_tokens(),
                            .n_decodes = n_decodes, .n_seqs = static_cast<std::int64_t>(plan.items.size()),
                            .blocks_used = blocks_used});
    ++out_.n_steps;
  }

  void token(request_id id, double t) {
    request_timing& rt = timing_[id];
    if (rt.n_output == 0) rt.first_token_s = t;
    ++rt.n_output;
    ++out_.generated_tokens;
    if (auto lt = last_token_.find(id); lt != last_token_.end()) itl_.push_back(t - lt->second);
    last_token_[id] = t;
  }

  void finish(request_id id, double t, std::int64_t n_preemptions) {
    request_timing& rt = timing_[id];
    rt.finish_s = t;
    rt.n_preemptions += n_preemptions;
    out_.requests.push_back(rt);
    last_token_.erase(id);
  }

  std::int64_t n_done() const noexcept { return static_cast<std::int64_t>(out_.requests.size()); }
  std::int64_t n_steps() const noexcept { return out_.n_steps; }

  run_result summary(double t0, double t_end) {
    run_result out = std::move(out_);
    out.requests_done = static_cast<std::int64_t>(out.requests.size());
    out.makespan_s = t_end - t0;
    if (out.makespan_s > 0) {
      out.tokens_per_s = static_cast<double>(out.generated_tokens) / out.makespan_s;
      out.total_tokens_per_s = static_cast<double>(out.generated_tokens + out.prompt_tokens) / out.makespan_s;
    }
    std::vector<double> ttft, tpot;
    for (const request_timing& r : out.requests) {
      ttft.push_back(r.ttft_s());
      if (r.n_output > 1) tpot.push_back(r.tpot_s());
    }
    for (const double t : ttft) out.ttft_mean_s += t / static_cast<double>(ttft.size());
    out.ttft_p50_s = percentile(ttft, 0.5);
    out.ttft_p99_s = percentile(ttft, 0.99);
    out.tpot_p50_s = percentile(tpot, 0.5);
    out.tpot_p99_s = percentile(tpot, 0.99);
    out.itl_p50_s = percentile(itl_, 0.5);
    out.itl_p99_s = percentile(itl_, 0.99);
    out.kv_use_mean = kv_time_ > 0 ? kv_area_ / kv_time_ : 0.0;
    out.padding_overhead = real_ > 0 ? static_cast<double>(computed_) / static_cast<double>(real_) : 1.0;
    return out;
  }

 private:
  bool record_steps_;
  run_result out_;
  std::unordered_map<request_id, request_timing> timing_;
  std::unordered_map<request_id, double> last_token_;
  std::vector<double> itl_;
  double kv_area_ = 0, kv_time_ = 0;
  std::int64_t computed_ = 0, real_ = 0;
};

/// Sorts a trace by arrival and checks its output lengths.
inline void prepare_trace(std::vector<trace_request>& trace) {
  std::stable_sort(trace.begin(), trace.end(),
                   [](const trace_request& a, const trace_request& b) { return a.arrival_s < b.arrival_s; });
  for (const trace_request& r : trace)
    LLMKIT_CHECK(r.n_output >= 1 && r.n_output <= r.max_new_tokens, "trace: request ", r.id, ": n_output = ",
                 r.n_output, " is outside [1, max_new_tokens = ", r.max_new_tokens, "]");
}

/// Device blocks in use during a step that just committed (finished
/// requests still count).
inline std::int64_t blocks_in_use(const sched_state& s, std::span<const seq_record> finished) {
  std::int64_t used = s.limits.n_blocks - s.n_free_blocks;
  for (const seq_record& f : finished) used += f.n_blocks;
  return used;
}

}  // namespace detail

/// Serves `[n] trace` (any arrival order) under `p` with `limits`, in
/// virtual time: requests are submitted when the clock passes their arrival;
/// each step's plan goes to `execute(const step_plan&, const sched_state&)
/// -> step_outcome`, and the clock advances by its duration.
/// @throws llmkit::error for invalid limits, policy or trace (duplicate ids,
///   prompts that do not fit, n_output outside [1, max_new_tokens]).
template <class Execute>
run_result run_trace(std::vector<trace_request> trace, const engine_limits& limits, const policy& p, Execute&& execute,
                     const run_options& options = {}) {
  sched_state s = make_state(limits);
  validate_policy(p, limits);
  detail::prepare_trace(trace);
  detail::run_recorder rec(options.record_steps);
  double t = trace.empty() ? 0.0 : trace.front().arrival_s;
  const double t0 = t;
  std::size_t next = 0;
  while (next < trace.size() || n_live(s) > 0) {
    while (next < trace.size() && trace[next].arrival_s <= t) {
      const trace_request& r = trace[next++];
      submit(s, r.id, r.n_prompt, r.max_new_tokens, r.arrival_s);
      rec.arrive(r);
    }
    if (n_live(s) == 0) {
      t = trace[next].arrival_s;
      continue;
    }
    const step_plan plan = plan_step(s, p);
    const step_outcome o = execute(plan, std::as_const(s));
    LLMKIT_CHECK(o.duration_s >= 0 && std::isfinite(o.duration_s),
                 "run_trace: step duration must be finite and >= 0, got ", o.duration_s);
    const double start = t;
    t += o.duration_s;
    const auto finished = commit_step(s, plan, o.stopped);
    const std::int64_t used = detail::blocks_in_use(s, finished);
    rec.step(plan, finished, start, o.duration_s, static_cast<double>(used) / static_cast<double>(limits.n_blocks),
             used);
    if (options.on_progress) options.on_progress(rec.n_done(), static_cast<std::int64_t>(trace.size()));
    if (options.max_steps > 0 && rec.n_steps() >= options.max_steps) break;
  }
  return rec.summary(t0, t);
}

/// Simulates `trace` under `p`: every request generates exactly its
/// `n_output` tokens and each step takes `cm(plan).time_s`.
inline run_result simulate(const std::vector<trace_request>& trace, const engine_limits& limits, const policy& p,
                           const cost_model& cm, const run_options& options = {}) {
  cm.validate();
  std::unordered_map<request_id, std::int64_t> remaining;  // tokens still to generate
  for (const trace_request& r : trace) remaining[r.id] = r.n_output;
  return run_trace(
      trace, limits, p,
      [&](const step_plan& plan, const sched_state&) {
        step_outcome o{.duration_s = cm(plan).time_s, .stopped = {}};
        for (const step_item& it : plan.items)
          if (it.samples && --remaining.at(it.id) == 0) o.stopped.push_back(it.id);
        return o;
      },
      options);
}

}  // namespace llmkit::sched
