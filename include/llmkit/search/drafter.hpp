// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/drafter.hpp
/// The contract between speculative decoding and the thing that guesses
/// tokens (a draft model, n-gram lookup, a user's own heuristic).
///
/// Every round, `speculative_generate` asks the drafter for at most k tokens
/// that continue the request's committed history. A drafter returns:
/// - `tokens`: the guesses, 0..k of them (0 means "no idea": the round is a
///   plain decoding step);
/// - `probs`: for stochastic verification, the distribution q each guess was
///   drawn from (`[n, vocab]`, row j the distribution of token j given the
///   history and guesses 0..j-1), or empty when the guesses are
///   deterministic (q is then one-hot on each guess). Rejection sampling
///   makes the output follow the target exactly whatever q is, provided q is
///   the distribution the guess really came from.
///
/// A drafter keeps whatever state it likes between rounds (a draft model
/// keeps its KV cache and rolls it back to the part of the history it
/// still agrees with); `reset()` drops it before a new request.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "llmkit/core/ids.hpp"

namespace llmkit::search {

/// What the drafter is asked for in one round.
struct draft_request {
  std::span<const token_id> history{};  ///< [n_prompt + n_generated] committed tokens
  std::size_t n_prompt = 0;                 ///< leading prompt tokens of history
  std::size_t max_tokens = 0;               ///< k: propose at most this many
  bool sample = false;                      ///< stochastic verification: draw guesses from q and report q
  std::uint64_t seed = 0;                   ///< the request's seed, for the drafter's own draws
  std::uint64_t request_id = 0;             ///< the request's id
  std::uint64_t round = 0;                  ///< round number (0, 1, ...): a fresh RNG counter per round
};

/// The drafter's answer.
struct draft {
  std::vector<token_id> tokens;  ///< [n <= max_tokens] guessed tokens
  std::vector<double> probs;         ///< [n, vocab] q rows, or empty for deterministic guesses
  void clear() noexcept {
    tokens.clear();
    probs.clear();
  }
};

/// See the file comment.
template <class D>
concept drafter = requires(D& d, const draft_request& r, draft& out) {
  d.propose(r, out);
  d.reset();
  { d.name() } -> std::convertible_to<std::string_view>;
};

/// Key salt that separates a drafter's random stream from the verifier's.
inline constexpr std::uint64_t draft_stream_salt = 0x9e3779b97f4a7c15ull;

}  // namespace llmkit::search
