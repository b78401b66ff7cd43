// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/request.hpp
/// A generation request as a serving engine receives it (prompt, sampling
/// chain, seed, stop criteria, token limit, arrival time) and the stop check
/// the engine applies after every sampled token.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"

namespace llmkit::sched {

/// When a request stops generating (besides `max_new_tokens`).
struct stop_criteria {
  /// Generation stops right after any of these tokens is sampled (e.g. EOS).
  std::vector<token_id> stop_tokens;
  /// Generation stops right after the output ends with any of these
  /// sequences. Each `[n_i]` sequence must be non-empty.
  std::vector<std::vector<token_id>> stop_sequences;
};

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
  stop_criteria stop;
  /// Upper bound on generated tokens; must be >= 1.
  std::int64_t max_new_tokens = 16;
  /// Arrival time in seconds (any epoch); used for FCFS order and latency.
  double arrival_s = 0.0;
};

/// Why a request stopped after its latest token.
enum class stop_reason { none, max_tokens, stop_token, stop_sequence, cancelled };

/// Name of a stop reason ("none", "max_tokens", ...).
constexpr const char* to_string(stop_reason r) noexcept {
  switch (r) {
    case stop_reason::none: return "none";
    case stop_reason::max_tokens: return "max_tokens";
    case stop_reason::stop_token: return "stop_token";
    case stop_reason::stop_sequence: return "stop_sequence";
    case stop_reason::cancelled: return "cancelled";
  }
  return "?";
}

/// Checks whether `r` must stop after its `[n_generated] generated` tokens
/// (the last one just sampled). Stop tokens win over stop sequences, which
/// win over the token limit.
inline stop_reason check_stop(const request& r, std::span<const token_id> generated) {
  if (generated.empty()) return stop_reason::none;
  const token_id last = generated.back();
  if (std::find(r.stop.stop_tokens.begin(), r.stop.stop_tokens.end(), last) != r.stop.stop_tokens.end())
    return stop_reason::stop_token;
  for (const auto& seq : r.stop.stop_sequences) {
    if (!seq.empty() && seq.size() <= generated.size() &&
        std::equal(seq.begin(), seq.end(), generated.end() - static_cast<std::ptrdiff_t>(seq.size())))
      return stop_reason::stop_sequence;
  }
  if (static_cast<std::int64_t>(generated.size()) >= r.max_new_tokens) return stop_reason::max_tokens;
  return stop_reason::none;
}

/// Raises `llmkit::error` naming the field when `r` cannot be served by an
/// engine whose sequences hold at most `max_context` tokens
/// (prompt + generated).
inline void validate_request(const request& r, std::int64_t max_context) {
  LLMKIT_CHECK(!r.prompt.empty(), "request ", r.id, ": prompt is empty");
  LLMKIT_CHECK(r.max_new_tokens >= 1, "request ", r.id, ": max_new_tokens must be >= 1, got ", r.max_new_tokens);
  const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
  LLMKIT_CHECK(n_prompt + r.max_new_tokens <= max_context, "request ", r.id, ": prompt length ", n_prompt,
               " + max_new_tokens ", r.max_new_tokens, " exceeds the context of ", max_context, " tokens");
  for (const auto& seq : r.stop.stop_sequences)
    LLMKIT_CHECK(!seq.empty(), "request ", r.id, ": stop_sequences holds an empty sequence");
}

}  // namespace llmkit::sched
