// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/disaggregation.hpp
/// Prefill/decode disaggregation: a prefill worker runs prompts (e.g.
/// prepacked) up to their first token, ships each sequence's KV as one byte
/// buffer, and a decode worker imports it and generates the rest.
///
/// On a real engine the hand-off is the paged cache's
/// `export_sequence(seq) -> std::vector<std::byte>` on the prefill side (a
/// versioned, checksummed buffer; any transport) and, on the decode side,
/// `submit_prefilled` into the scheduler (the buffer waits in the staging
/// area, the swap space) and `import_sequence(buffer)` when the decode
/// scheduler's plan lists the request in `swapped_in`.
///
/// `simulate_disaggregated` runs both workers in virtual time with their own
/// clocks, cost models and policies, and a link of given bandwidth between
/// them.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/sched/cost_model.hpp"
#include "llmkit/sched/policy.hpp"
#include "llmkit/sched/simulator.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/sched/step_plan.hpp"
#include "llmkit/sched/trace.hpp"

namespace llmkit::sched {

/// The two workers of a disaggregated deployment and the link between them.
struct disaggregated_config {
  engine_limits prefill_limits;
  /// Requests finish on the prefill worker after their first token.
  policy prefill_policy{.layout = prefill_layout::packed};
  cost_model prefill_cost;
  /// `n_swap_blocks` is the staging area for received KV buffers.
  engine_limits decode_limits;
  policy decode_policy;
  cost_model decode_cost;
  /// Bytes/s of the KV hand-off link, and its latency per buffer.
  double link_bandwidth = 10e9;
  double link_latency_s = 0.0;
  /// Fixed bytes per buffer (header and checksum of `export_sequence`).
  double buffer_overhead_bytes = 64;
};

/// Serves `trace` on a prefill worker and a decode worker connected by a
/// KV link; every request generates its `n_output` tokens (the first on the
/// prefill worker). KV use in the result is the decode pool's.
/// @throws llmkit::error for invalid limits, policies, cost models or trace,
///   or a staging area smaller than one sequence.
inline run_result simulate_disaggregated(std::vector<trace_request> trace, const disaggregated_config& c,
                                         const run_options& options = {}) {
  sched_state sp = make_state(c.prefill_limits), sd = make_state(c.decode_limits);
  validate_policy(c.prefill_policy, c.prefill_limits);
  validate_policy(c.decode_policy, c.decode_limits);
  c.prefill_cost.validate();
  c.decode_cost.validate();
  LLMKIT_CHECK(c.link_bandwidth > 0 && c.link_latency_s >= 0, "disaggregated_config: link_bandwidth = ",
               c.link_bandwidth, " must be > 0 and link_latency_s = ", c.link_latency_s, " >= 0");
  const std::int64_t one_seq = blocks_for(c.decode_limits.max_context, c.decode_limits.block_size);
  LLMKIT_CHECK(c.decode_limits.n_swap_blocks >= one_seq, "disaggregated_config: decode_limits.n_swap_blocks = ",
               c.decode_limits.n_swap_blocks, " cannot stage one sequence of max_context (needs ", one_seq,
               " blocks)");
  detail::prepare_trace(trace);
  std::unordered_map<request_id, const trace_request*> by_id;
  for (const trace_request& r : trace) by_id[r.id] = &r;
  std::unordered_map<request_id, std::int64_t> remaining;  // tokens left on the decode worker

  struct handoff {
    double ready_s;
    request_id id;
  };
  std::vector<handoff> link;  // sorted by ready time
  detail::run_recorder rec(options.record_steps);
  constexpr double never = std::numeric_limits<double>::infinity();
  double tp = trace.empty() ? 0.0 : trace.front().arrival_s, td = tp;
  const double t0 = tp;
  double t_end = t0;
  std::size_t next = 0;
  while (true) {
    const double p_start = n_live(sp) > 0 ? tp : next < trace.size() ? std::max(tp, trace[next].arrival_s) : never;
    const double d_start = n_live(sd) > 0 ? td : !link.empty() ? std::max(td, link.front().ready_s) : never;
    if (p_start == never && d_start == never) break;
    if (p_start <= d_start) {
      tp = p_start;
      while (next < trace.size() && trace[next].arrival_s <= tp) {
        const trace_request& r = trace[next++];
        submit(sp, r.id, r.n_prompt, 1, r.arrival_s);
        rec.arrive(r);
      }
      const step_plan plan = plan_step(sp, c.prefill_policy);
      const double dur = c.prefill_cost(plan).time_s;
      const auto finished = commit_step(sp, plan);
      std::vector<seq_record> done;
      for (const seq_record& f : finished) {
        const trace_request& r = *by_id.at(f.id);
        if (r.n_output == 1) {
          done.push_back(f);
          continue;
        }
        const double bytes = static_cast<double>(r.n_prompt) * c.decode_cost.model.kv_bytes_per_token() +
                             c.buffer_overhead_bytes;
        const handoff h{tp + dur + c.link_latency_s + bytes / c.link_bandwidth, r.id};
        link.insert(std::upper_bound(link.begin(), link.end(), h,
                                     [](const handoff& a, const handoff& b) { return a.ready_s < b.ready_s; }),
                    h);
      }
      rec.step(plan, done, tp, dur, -1.0, 0);
      tp += dur;
      t_end = std::max(t_end, tp);
    } else {
      td = d_start;
      while (!link.empty() && link.front().ready_s <= td) {
        const trace_request& r = *by_id.at(link.front().id);
        if (!submit_prefilled(sd, r.id, r.n_prompt, r.max_new_tokens, 1, r.arrival_s)) break;  // staging full
        remaining[r.id] = r.n_output - 1;
        link.erase(link.begin());
      }
      if (n_live(sd) == 0) {  // staging full cannot happen with nothing live; wait for the next buffer
        td = link.empty() ? td : std::max(td, link.front().ready_s);
        continue;
      }
      const step_plan plan = plan_step(sd, c.decode_policy);
      step_outcome o{.duration_s = c.decode_cost(plan).time_s, .stopped = {}};
      for (const step_item& it : plan.items)
        if (it.samples && --remaining.at(it.id) == 0) o.stopped.push_back(it.id);
      const auto finished = commit_step(sd, plan, o.stopped);
      const std::int64_t used = detail::blocks_in_use(sd, finished);
      rec.step(plan, finished, td, o.duration_s,
               static_cast<double>(used) / static_cast<double>(c.decode_limits.n_blocks), used);
      td += o.duration_s;
      t_end = std::max(t_end, td);
    }
    if (options.on_progress) options.on_progress(rec.n_done(), static_cast<std::int64_t>(trace.size()));
    if (options.max_steps > 0 && rec.n_steps() >= options.max_steps) break;
  }
  return rec.summary(t0, t_end);
}

}  // namespace llmkit::sched
