// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/trace.hpp
/// Request traces for simulation and load generation: arrival time, prompt
/// length and output length per request; a generator with Poisson arrivals
/// and prompt/output lengths from llmkit/pack's length distributions.

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/length_distribution.hpp"
#include "llmkit/sched/request.hpp"

namespace llmkit::sched {

/// One request of a trace. The request generates exactly `n_output` tokens
/// (its stop criteria fire there) unless `max_new_tokens` is smaller.
struct trace_request {
  request_id id = 0;
  double arrival_s = 0.0;
  std::int64_t n_prompt = 1;
  std::int64_t n_output = 1;
  /// The limit the client asked for (>= n_output); what request-level
  /// batching must reserve KV blocks for.
  std::int64_t max_new_tokens = 1;
};

/// A synthetic workload.
struct workload {
  std::int64_t n_requests = 64;
  /// Poisson arrival rate in requests/s; 0 = every request arrives at t = 0.
  double rate = 0.0;
  pack::length_distribution prompt_lengths = {.shape = pack::length_shape::uniform, .min_length = 16, .max_length = 256};
  pack::length_distribution output_lengths = {.shape = pack::length_shape::uniform, .min_length = 8, .max_length = 128};
  /// Limit every request asks for; 0 = `output_lengths.max_length`.
  std::int64_t max_new_tokens = 0;
  std::uint64_t seed = 1;
};

/// Draws a trace of `w.n_requests` requests with ids 0, 1, ... in arrival
/// order. Same workload and seed, same trace (with the same standard
/// library). @throws llmkit::error for a negative rate or request count, or
/// invalid length distributions.
inline std::vector<trace_request> make_trace(const workload& w) {
  LLMKIT_CHECK(w.n_requests >= 0, "make_trace: n_requests must be >= 0, got ", w.n_requests);
  LLMKIT_CHECK(w.rate >= 0, "make_trace: rate must be >= 0 requests/s, got ", w.rate);
  const auto n = static_cast<std::size_t>(w.n_requests);
  const auto prompts = pack::sample_lengths(w.prompt_lengths, n, w.seed);
  const auto outputs = pack::sample_lengths(w.output_lengths, n, w.seed ^ 0x9e3779b97f4a7c15ull);
  const std::int64_t cap =
      w.max_new_tokens > 0 ? w.max_new_tokens : static_cast<std::int64_t>(w.output_lengths.max_length);
  std::mt19937_64 rng(w.seed + 0x632be59bd9b4e019ull);
  std::exponential_distribution<double> gap(w.rate > 0 ? w.rate : 1.0);
  std::vector<trace_request> trace(n);
  double t = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (w.rate > 0 && i > 0) t += gap(rng);
    const auto out = std::min<std::int64_t>(static_cast<std::int64_t>(outputs[i]), cap);
    trace[i] = {.id = static_cast<request_id>(i), .arrival_s = t, .n_prompt = static_cast<std::int64_t>(prompts[i]),
                .n_output = out, .max_new_tokens = cap};
  }
  return trace;
}

}  // namespace llmkit::sched
