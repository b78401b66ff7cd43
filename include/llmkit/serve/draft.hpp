// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/draft.hpp
/// Speculative decoding in the engine, per request: what a request asks
/// for (`speculation`), and the interface of a draft model that guesses
/// tokens for many requests at once (`batch_drafter`; a model in its own
/// KV cache is serve/model_draft.hpp).
///
/// Each step, a decode of a drafting request carries up to k guessed
/// tokens; the one batched forward scores its newest token and the guesses
/// (k + 1 logits rows) beside the other requests' rows; the engine draws
/// the request's tokens from those rows in order with its own chain and
/// Philox stream, exactly as plain decoding would, and keeps the guesses
/// while each equals the token drawn before it, plus the first drawn token
/// that differs (or the bonus token after the last guess). So every token
/// is the one the request draws without drafting, greedy or sampled: a
/// guess only saves the forward pass that would have computed it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llmkit/core/ids.hpp"

namespace llmkit::serve {

/// Where a request's guesses come from.
enum class draft_source : std::uint8_t {
  none,   ///< plain decoding
  ngram,  ///< prompt lookup in the request's own context (search/ngram_drafter.hpp), no model
  model,  ///< the engine's draft model (`engine_options::draft_model`)
};

/// A request's speculative decoding.
struct speculation {
  draft_source drafter = draft_source::none;
  /// k: most guessed tokens per step, in [1, engine_options::max_draft_tokens].
  std::size_t max_tokens = 4;
};

/// What a draft model is asked for one request in one step.
struct draft_job {
  request_id handle = 0;
  /// `[n_prompt + n_generated]` the request's context (prompt then tokens).
  std::span<const token_id> context;
  /// Most tokens to guess.
  std::size_t max_tokens = 0;
  /// Receives `[n <= max_tokens]` guesses (cleared by the caller).
  std::vector<token_id>* out = nullptr;
};

/// A drafter for many requests at once, called on the engine's step thread
/// only. It keeps what it likes per handle (a draft KV sequence, rolled
/// back to what still agrees with the context it is given) until
/// `release`.
class batch_drafter {
 public:
  virtual ~batch_drafter() = default;
  /// Fills every job's guesses (none is a valid answer). Must not throw:
  /// a drafter that cannot guess leaves `out` empty.
  virtual void propose(std::span<const draft_job> jobs) noexcept = 0;
  /// Drops what the drafter holds for `handle` (the request ended).
  virtual void release(request_id handle) noexcept = 0;
};

}  // namespace llmkit::serve
