// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/backend.hpp
/// What llmkit-server needs from whatever runs the model: tokenization,
/// the chat template, and generation requests submitted with a stream
/// callback, cancelled by handle. The HTTP layer (server.cpp) knows nothing
/// else; a backend over a serving engine maps these one to one onto the
/// engine's submit / cancel / stats (names follow llmkit/serve/request.hpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <llmkit/core/error.hpp>
#include <llmkit/core/ids.hpp>
#include <llmkit/core/stop.hpp>
#include <llmkit/model/tokenizer_types.hpp>

#include "openai_protocol.hpp"

namespace llmkit_server {

/// Identifies a submitted request (unique per backend).
using llmkit::request_id;

/// One event of a request's stream: for each of its `n` samples, tokens,
/// then exactly one finish.
struct backend_event {
  enum class type : std::uint8_t { token, finish };
  type kind = type::token;
  std::size_t index = 0;  ///< which of the request's n samples (handle + index)
  /// Text delta: all of a request's deltas, concatenated, are its output
  /// text (UTF-8, never split inside a character, cut before a stop string);
  /// text that may begin a stop string is held back, so a delta may be empty
  /// and the finish event may carry the rest.
  std::string text{};
  // Token events.
  token_id token = -1;
  float logprob = 0.0f;  ///< of `token` under the processed distribution
  std::vector<std::pair<token_id, float>> top_logprobs{};  ///< most probable first
  // Finish events.
  finish_kind finish = finish_kind::stop;
  std::string error{};            ///< what went wrong (finish_kind::error)
  std::size_t n_prompt_tokens = 0;
  std::size_t n_generated_tokens = 0;
};

/// One generation: a prompt, its chain and seed, its stop rules, and how
/// many samples of it (OpenAI's `n`).
struct backend_request {
  std::vector<token_id> prompt;  ///< `[n_prompt]`, at least one token
  std::string sampling = "greedy";  ///< run-time chain string (chain_config)
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;  ///< second key of the random stream; sample i draws from stream + i
  llmkit::stop_criteria stop{};
  std::size_t top_logprobs = 0;  ///< alternatives per token event
  std::size_t n = 1;             ///< samples: handles handle .. handle + n - 1, events with index i
  /// Receives the events, on the backend's thread (a rejected request's
  /// finish events: on the caller's, inside `submit`); must not block or throw.
  std::function<void(const backend_event&)> on_event;
};

/// What `submit` did with a request.
enum class submit_status : std::uint8_t {
  accepted,       ///< events follow
  queue_full,     ///< 429
  invalid,        ///< 400 (e.g. a chain the library refuses)
  shutting_down,  ///< 503
};

/// The answer of `submit`. A rejected request has received its finish events
/// (finish_kind::error, one per sample) before `submit` returns.
struct submit_result {
  request_id handle = 0;  ///< of sample 0; sample i has handle + i
  submit_status status = submit_status::accepted;
  std::string message{};
};

/// Gauges /metrics and /health report.
struct backend_stats {
  std::size_t n_queued = 0;   ///< samples waiting
  std::size_t n_running = 0;  ///< samples running
  std::size_t kv_blocks_used = 0;
  std::size_t kv_blocks_free = 0;
};

/// The model as the HTTP layer sees it.
struct backend_model_info {
  std::string id;                     ///< reported by /v1/models and in every answer
  std::size_t n_ctx = 0;              ///< prompt + completion tokens per request
  std::size_t n_vocab = 0;
  std::vector<token_id> eos_tokens{}; ///< end every completion
};

/// A chat rendered to prompt text, and the tokens that end the assistant's turn.
struct chat_prompt {
  std::string text{};
  /// `[n] contents`: the byte ranges of `text` that are message contents
  /// (everything else is the template's), sorted, not overlapping.
  std::vector<llmkit::model::text_span> contents{};
  std::vector<token_id> end_of_turn{};
};

/// What special-token texts (`</s>`, `<|im_start|>`, `<|eot_id|>`) in a
/// request's own text become: a completion prompt given as a string, a chat
/// message's content. The chat template's own markers are control tokens
/// either way; stop strings are matched against generated text and never
/// tokenized.
enum class user_special_tokens : std::uint8_t {
  text,    ///< plain text: a user cannot end a prompt early or forge a chat turn (the default)
  parsed,  ///< control tokens, as if the template had written them (`--parse-special`: trusted callers only)
};

/// The interface llmkit-server drives. `submit`, `cancel`, `stats` may be
/// called from any thread. Its contract is llmkit::serve::engine's
/// (llmkit/serve/request.hpp): every accepted sample ends with exactly one
/// finish event, a rejected request gets its error finishes inside `submit`.
class backend {
 public:
  virtual ~backend() = default;
  virtual const backend_model_info& info() const = 0;
  /// A completion prompt's text to ids, BOS as the model asks; special-token
  /// texts in it stay text (see `user_special_tokens`).
  virtual std::vector<token_id> tokenize(std::string_view text) const = 0;
  /// A formatted chat to ids: the template's markers become control tokens,
  /// the message contents stay text (see `user_special_tokens`).
  virtual std::vector<token_id> tokenize_chat(const chat_prompt& chat) const = 0;
  /// The model's (or the configured) chat template applied to `messages`;
  /// nullopt when there is none.
  /// @throws llmkit::error when the template refuses the conversation
  ///         (e.g. Llama 2's turns must alternate user / assistant)
  virtual std::optional<chat_prompt> format_chat(const std::vector<chat_message>& messages) const = 0;
  /// The text of one token (for logprobs).
  virtual std::string token_text(token_id token) const = 0;
  virtual submit_result submit(backend_request request) = 0;
  /// Ends the request at the next step with finish_kind::cancelled (no-op
  /// when it has finished).
  virtual void cancel(request_id handle) = 0;
  /// Cancels every request, queued or running.
  virtual void cancel_all() = 0;
  virtual backend_stats stats() const = 0;
};

/// A checked request as the backend takes it (without its callback), and
/// its prompt length.
struct prepared_request {
  backend_request request;
  std::size_t n_prompt = 0;
};

/// Turns a parsed request into the backend's: the prompt tokenized (a chat
/// through the model's template, its end-of-turn token added to the EOS
/// set), the completion budget checked against the context, the sampling
/// chain and the stop rules. A 400 when the model has no chat template, the
/// template refuses the conversation, or the prompt and budget do not fit.
inline std::variant<prepared_request, api_error> prepare_request(const generation_request& r, const backend& model,
                                                                 std::uint64_t seed) {
  const backend_model_info& info = model.info();
  const model_limits limits{.n_ctx = info.n_ctx, .n_vocab = info.n_vocab};
  std::vector<token_id> prompt;
  std::vector<token_id> eos = info.eos_tokens;
  if (r.kind == api_kind::completions) {
    prompt = r.prompt_is_tokens ? r.prompt_tokens : model.tokenize(r.prompt_text);
  } else {
    std::optional<chat_prompt> chat;
    try {
      chat = model.format_chat(r.messages);
    } catch (const llmkit::error& e) {
      std::string what = e.what();
      if (what.size() > 300) what = what.substr(0, 300) + "...";
      return invalid_request("messages", "the chat template refuses these messages: " + what);
    }
    if (!chat)
      return invalid_request("messages", "the model has no chat template (tokenizer.chat_template); start "
                                         "llmkit-server with --chat-template NAME");
    prompt = model.tokenize_chat(*chat);
    eos.insert(eos.end(), chat->end_of_turn.begin(), chat->end_of_turn.end());
  }
  const auto budget = completion_budget(r, prompt.size(), limits);
  if (const auto* e = std::get_if<api_error>(&budget)) return *e;
  const std::size_t n_prompt = prompt.size();
  return prepared_request{.request = {.prompt = std::move(prompt),
                                      .sampling = chain_config(r.sampling),
                                      .seed = seed,
                                      .stop = stop_rules(r, std::get<std::size_t>(budget), std::move(eos)),
                                      .top_logprobs = r.logprobs.value_or(0),
                                      .n = r.n,
                                      .on_event = {}},
                          .n_prompt = n_prompt};
}

}  // namespace llmkit_server
