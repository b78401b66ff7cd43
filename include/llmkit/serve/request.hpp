// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/request.hpp
/// What a client hands a serving engine (`generation_request`) and what the
/// engine streams back (`stream_event`): token pieces while the request
/// runs, then exactly one finish event. `prefilled_request` is a request
/// whose prompt another worker prefilled (prefill/decode disaggregation).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/sampling/logprobs.hpp"
#include "llmkit/sampling/runtime_chain.hpp"
#include "llmkit/search/early_stopping.hpp"
#include "llmkit/serve/draft.hpp"

namespace llmkit::serve {

/// How a request ended, in OpenAI's terms.
enum class finish_kind : std::uint8_t {
  stop,       ///< EOS, a stop sequence or a stop string
  length,     ///< `stop.max_new_tokens` tokens were generated
  cancelled,  ///< `engine::cancel`, or the engine shut down before it finished
  error,      ///< rejected at submit (bad input, queue full, shutting down) or failed while running
};

/// "stop", "length", "cancelled", "error".
constexpr std::string_view to_string(finish_kind k) noexcept {
  switch (k) {
    case finish_kind::stop: return "stop";
    case finish_kind::length: return "length";
    case finish_kind::cancelled: return "cancelled";
    case finish_kind::error: return "error";
  }
  return "?";
}

/// The kind of a stop rule's `finish_reason`.
constexpr finish_kind kind_of(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::eos:
    case finish_reason::stop_sequence:
    case finish_reason::stop_string: return finish_kind::stop;
    case finish_reason::max_tokens: return finish_kind::length;
    case finish_reason::cancelled: return finish_kind::cancelled;
  }
  return finish_kind::error;
}

/// Whether an event carries a token or ends the request.
enum class event_type : std::uint8_t {
  token,   ///< one generated token and the text it completes
  finish,  ///< the request ended; no event follows
};

/// Token counts of a request (OpenAI's `usage`).
struct request_usage {
  std::size_t n_prompt_tokens = 0, n_generated_tokens = 0;  ///< `prompt_tokens`, `completion_tokens`
  /// Prompt tokens whose K/V came from the prefix cache at the request's
  /// first admission (not prefilled).
  std::size_t n_prompt_tokens_reused = 0;
  /// Times the request was preempted (its context recomputed).
  std::size_t n_preemptions = 0;
};

/// One event of a request's stream, delivered to `generation_request::on_event`.
///
/// Text: the `text` fields of all events of a request, concatenated, are
/// the decoded generated tokens (UTF-8, never split inside a character),
/// cut before the first stop string when one fired. Text that may be the
/// start of a stop string, or an incomplete character, is held back until
/// the next tokens decide it (so a token event's text may be empty, and the
/// finish event may carry the rest).
struct stream_event {
  /// The request's id (sample 0's handle + index); never reused by one engine.
  request_id handle = 0;
  /// Which of the request's `n` samples (0 for n = 1).
  std::size_t index = 0;
  event_type type = event_type::token;
  /// Text delta (see above); empty when the engine has no tokenizer.
  std::string text;

  // Token events.
  token_id token = -1;
  /// Log-probability of `token` under the request's processed distribution
  /// (after its chain's processors, before the draw); 0 for a `prefilled`
  /// token.
  float logprob = 0.0f;
  /// `[min(top_logprobs, candidates)]` most probable tokens of that
  /// distribution, most probable first (`generation_request::top_logprobs`);
  /// empty for a `prefilled` token.
  std::vector<sampling::token_logprob> top_logprobs;
  /// True for a token handed in with `engine::submit_prefilled` (sampled by
  /// the prefill worker, whose distribution the engine never saw).
  bool prefilled = false;

  // Finish events.
  finish_kind finish = finish_kind::stop;
  /// The stop rule that fired (stop and length), `cancelled`, or nullopt
  /// for an error.
  std::optional<finish_reason> reason;
  /// What went wrong (error only).
  std::string error;
  request_usage usage;
  /// Beam search finish events (stop or length): the hypothesis' summed
  /// log-probability and its score, logprob / n^length_penalty (0 otherwise).
  double beam_logprob = 0.0;
  double beam_score = 0.0;
};

/// Beam search instead of sampling (`generation_request::beam`), as
/// `search::beam_search` runs it: each step expands every live beam by the
/// vocabulary, scores a candidate by its summed log-probability, and keeps
/// the `width` best; a hypothesis of n tokens that ended (EOS, stop
/// sequence, or the token budget) scores logprob / n^length_penalty.
struct beam_options {
  std::size_t width = 4;         ///< live beams B, in [1, engine_options::max_beam_width]
  float length_penalty = 1.0f;   ///< alpha (finite)
  search::early_stopping stopping = search::early_stopping::when_no_better;
};

/// A generation request.
struct generation_request {
  /// `[n_prompt]` prompt token ids (each < the model's vocabulary; at least
  /// one).
  std::vector<token_id> prompt;
  /// The sampling chain as a configuration string
  /// (sampling/runtime_chain.hpp), e.g. "top_k(40);temperature(0.8);sample".
  std::string sampling = "greedy";
  /// The sampling chain as a value, used instead of `sampling` when set: a
  /// chain built in code, which may hold the caller's own processors (any
  /// `sampling::logits_processor`, type-erased once by
  /// `sampling::any_processor`). The engine applies it on its step thread to
  /// this request's rows only; its n samples share the processors, so a
  /// processor keeps no mutable state of its own (what it needs of the
  /// request comes in `sampling_context`: seed, step, history).
  std::optional<sampling::runtime_chain> chain{};
  /// A grammar the output must follow (structured outputs), compiled for
  /// the model's vocabulary (`grammar::compile_cached`; share it between
  /// requests). The engine keeps one grammar position per sample and per
  /// beam, and masks every token that cannot continue it before the chain
  /// (or the beam expansion) sees the logits: drafted guesses are cut at
  /// the first token it forbids, and a beam's position forks with it. The
  /// grammar vocabulary's EOS ids join `stop.eos_tokens`, so the request
  /// ends where EOS is drawn, which the mask allows exactly where the
  /// grammar may end. A step where the grammar allows no token ends the
  /// request with an `error` finish naming it. nullptr = unconstrained.
  std::shared_ptr<const grammar::token_masker> grammar{};
  /// Seed of the request's own Philox stream: the draw of step t is a pure
  /// function of (seed, stream, t), whatever else runs in the batch.
  std::uint64_t seed = 0;
  /// Second key of the random stream (e.g. the index of one of n samples of
  /// a prompt), so that equal seeds can still draw independent streams.
  std::uint64_t stream = 0;
  /// EOS tokens, stop sequences, stop strings (need a tokenizer), and the
  /// token budget `max_new_tokens`.
  stop_criteria stop{};
  /// Alternatives listed in each token event (0 = none).
  std::size_t top_logprobs = 0;
  /// Samples of this prompt (OpenAI's `n`): n requests, sample i with
  /// handle `submit_result::handle + i` and stream `stream + i`, each with
  /// its own events and finish. The prompt is prefilled once; when its last
  /// token's logits are sampled, samples 1 .. n - 1 draw their first token
  /// from the same row and fork its KV blocks copy-on-write.
  std::size_t n = 1;
  /// Beam search (see `beam_options`) instead of sampling: the request runs
  /// as `beam->width` sequences in the batch, forked copy-on-write, and its
  /// result is the `n` best hypotheses (n <= width). Nothing streams while
  /// it runs: when it ends, hypothesis i (best score first) is sent as
  /// sample i (handle `submit_result::handle + i`): its token events, then
  /// its finish event with `beam_logprob` and `beam_score`. Needs the
  /// default "greedy" sampling string, no chain value, `top_logprobs` 0 and
  /// no stop strings; `engine::cancel` takes sample 0's handle.
  std::optional<beam_options> beam{};
  /// Speculative decoding (serve/draft.hpp): guesses verified in the same
  /// batched forward; the tokens are those drawn without it.
  speculation speculative{};
  /// Receives every event of the request, on the engine's step thread (or
  /// on the caller's thread for a request rejected by `submit`). Must not
  /// block for long (it stalls the batch) and must not throw (an exception
  /// ends the request with an error). May call `submit` and `cancel`.
  std::function<void(const stream_event&)> on_event;
};

/// A request whose prompt another worker prefilled (prefill/decode
/// disaggregation), for `engine::submit_prefilled`: the request, the tokens
/// that worker sampled, and the K/V of its context as one exported buffer.
struct prefilled_request {
  /// The request as it would be submitted whole (`n` must be 1).
  generation_request request;
  /// `[n_given]` tokens sampled so far by the prefill worker (at least the
  /// first), each inside the vocabulary. For the engine to continue a
  /// seeded request exactly, token i must be drawn as the engine would:
  /// the request's chain with `sampling_context{.seed, .request_id =
  /// stream, .step = i}` (`serve::sample_token` does that).
  std::vector<token_id> generated;
  /// K/V of the prompt and of all given tokens but the last (n_prompt +
  /// n_given - 1 tokens): a buffer of `kv::paged_cache::export_sequence`
  /// made with the engine cache's shape and storage type.
  std::vector<std::byte> kv;
};

/// What `submit` did with a request.
enum class submit_status : std::uint8_t {
  accepted,       ///< queued; events follow on `on_event`
  queue_full,     ///< `engine_options::max_queued` requests wait already (HTTP 429)
  invalid,        ///< bad prompt, stop rules, sampling chain or length (HTTP 400)
  shutting_down,  ///< `stop` was called (HTTP 503)
  /// `submit_prefilled` only: the staging area has no room for the KV buffer
  /// yet. Nothing was taken and no event is sent: submit the same request
  /// again after the engine has stepped (back-pressure).
  staging_full,
};

/// The answer of `submit`. A rejected request has received its finish event
/// (kind `error`; one per sample) before `submit` returns, except after
/// `staging_full`, which leaves the request with the caller.
struct submit_result {
  /// Handle of sample 0; sample i of `n` has `handle + i` (0 after
  /// `staging_full`: no handle was given).
  request_id handle = 0;
  submit_status status = submit_status::accepted;
  /// Why it was rejected (empty when accepted).
  std::string message;
  bool accepted() const noexcept { return status == submit_status::accepted; }
};

}  // namespace llmkit::serve
