// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/context.hpp
/// What a processor or sampler knows about the request it works for.
///
/// `history` is the prompt followed by the tokens generated so far (oldest
/// first); the first `n_prompt` entries are the prompt. Penalties and n-gram
/// bans look at the whole history (prompt included, as llama.cpp and Hugging
/// Face do) restricted to their own window; `min_length` counts only the
/// generated part. The random draw of a step is a pure function of
/// (seed, request_id, step) (see rng.hpp), so results never depend on the
/// batch or thread a row runs in.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/rng.hpp"

namespace llmkit::sampling {

/// Read-only per-step view of one request (cheap to copy).
struct sampling_context {
  /// User seed of the request.
  std::uint64_t seed = 0;
  /// Request id; two requests with the same seed but different ids draw
  /// independent streams.
  std::uint64_t request_id = 0;
  /// Decoding step (0 for the first generated token); the RNG counter.
  std::uint64_t step = 0;
  /// `[n_prompt + n_generated] history`: prompt then generated tokens.
  std::span<const token_id> history{};
  /// How many leading entries of `history` are the prompt.
  std::size_t n_prompt = 0;

  /// Tokens generated so far (history minus prompt; 0 if n_prompt > size).
  std::size_t n_generated() const noexcept { return history.size() > n_prompt ? history.size() - n_prompt : 0; }
  /// Uniform draw `draw` of this step, in [0, 1).
  double uniform(std::uint32_t draw = 0) const noexcept { return philox_uniform(seed, request_id, step, draw); }
};

/// Owning per-request sampling state for search strategies and schedulers:
/// keeps the history, and advances the step as tokens are accepted.
class sampling_state {
 public:
  sampling_state() = default;
  /// @param prompt  `[n_prompt] prompt` token ids.
  sampling_state(std::uint64_t seed, std::uint64_t request_id, std::span<const token_id> prompt = {})
      : seed_(seed), request_id_(request_id), tokens_(prompt.begin(), prompt.end()), n_prompt_(prompt.size()) {}

  /// The view processors and samplers take for the current step.
  sampling_context context() const noexcept {
    return {.seed = seed_, .request_id = request_id_, .step = step_, .history = tokens_, .n_prompt = n_prompt_};
  }
  /// Appends the token chosen at this step and moves to the next step.
  void accept(token_id token) {
    LLMKIT_CHECK(token >= 0, "sampling_state::accept: token must be >= 0, got ", token);
    tokens_.push_back(token);
    ++step_;
  }
  std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t request_id() const noexcept { return request_id_; }
  std::uint64_t step() const noexcept { return step_; }
  /// `[n_prompt + n_generated]` prompt then generated tokens.
  std::span<const token_id> history() const noexcept { return tokens_; }
  std::size_t n_prompt() const noexcept { return n_prompt_; }

 private:
  std::uint64_t seed_ = 0;
  std::uint64_t request_id_ = 0;
  std::uint64_t step_ = 0;
  std::vector<token_id> tokens_;
  std::size_t n_prompt_ = 0;
};

}  // namespace llmkit::sampling
