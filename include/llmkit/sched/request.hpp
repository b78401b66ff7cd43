// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/request.hpp
/// A generation request as a serving engine receives it (prompt, sampling
/// chain, seed, stop criteria with the token limit, arrival time). The stop
/// rules are llmkit::stop_criteria (core/stop.hpp), shared with search.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"

namespace llmkit::sched {

/// One generation request.
struct request {
  request_id id = 0;
  /// `[n_prompt]` prompt token ids; at least one token.
  std::vector<token_id> prompt;
  /// The request's sampling chain as a configuration string (parsed by the
  /// engine, e.g. with llmkit/sampling); the scheduler never reads it.
  std::string sampling;
  /// Seed of the request's own random stream, so outputs do not depend on
  /// batching.
  std::uint64_t seed = 0;
  /// Stop rules: EOS tokens, stop sequences, the generated-token budget
  /// (`stop.max_new_tokens`), stop strings (checked by an engine that decodes
  /// text; the scheduler sees tokens only).
  stop_criteria stop{};
  /// Arrival time in seconds (any epoch); used for FCFS order and latency.
  double arrival_s = 0.0;
  /// KV sequences it runs as (`seq_record::width`): the beam width of a
  /// beam-search request, 1 otherwise. Only `scheduler::submit` reads it.
  std::int64_t width = 1;
  /// Draft tokens each decode may carry for speculative verification
  /// (`step_item::n_lookahead`); 0 = plain decodes.
  std::int64_t n_lookahead = 0;
};

/// Raises `llmkit::error` naming the field when `r` cannot be served by an
/// engine whose sequences hold at most `max_context` tokens
/// (prompt + generated).
inline void validate_request(const request& r, std::int64_t max_context) {
  LLMKIT_CHECK(!r.prompt.empty(), "request ", r.id, ": prompt is empty");
  r.stop.validate("request " + std::to_string(r.id));
  const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
  LLMKIT_CHECK(r.n_lookahead >= 0, "request ", r.id, ": n_lookahead must be >= 0, got ", r.n_lookahead);
  const std::size_t max_new = r.stop.max_new_tokens;
  LLMKIT_CHECK(max_context >= n_prompt && max_new <= static_cast<std::size_t>(max_context - n_prompt), "request ", r.id,
               ": prompt length ", n_prompt, " + max_new_tokens ", max_new, " exceeds the context of ", max_context,
               " tokens");
}

}  // namespace llmkit::sched
