// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/openai_protocol.hpp
/// llmkit-server's OpenAI-compatible protocol, as pure functions with no
/// sockets and no model: request bodies of POST /v1/completions and
/// POST /v1/chat/completions parsed and range-checked into a typed request,
/// the sampling fields turned into llmkit's run-time chain string and the
/// stop fields into `llmkit::stop_criteria`, OpenAI-style error bodies, the
/// response and SSE chunk builders, and the Prometheus text of /metrics.
/// Compiled once (openai_protocol.cpp) for the server and its tests.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <llmkit/core/ids.hpp>
#include <llmkit/core/stop.hpp>
#include <llmkit/serve/request.hpp>

#include "server_metrics.hpp"
#include "tool_calls.hpp"

namespace llmkit_server {

using llmkit::token_id;
/// The serving engine's vocabulary (finish_kind, stream_event,
/// generation_request, submit_status): the server speaks it unchanged.
namespace serve = llmkit::serve;

// --- errors ------------------------------------------------------------------

/// An error answer: HTTP status and OpenAI's error object
/// `{"error": {"message", "type", "param", "code"}}`.
struct api_error {
  int status = 400;
  std::string message{};
  std::string type = "invalid_request_error";
  std::string param{};  ///< the offending field ("" when none); null in JSON
  std::string code{};   ///< a short machine-readable code ("" when none); null in JSON
};

/// 400: a field of the request body is missing, of the wrong type or out of range.
api_error invalid_request(std::string param, std::string message);
/// 401: `--api-key` is set and the request's bearer token is missing or wrong.
api_error unauthorized();
/// 404: no such route (`method` and `path` are quoted in the message).
api_error not_found(std::string_view method, std::string_view path);
/// 413: the body is larger than `max_bytes`.
api_error payload_too_large(std::size_t max_bytes);
/// 429: the request queue is full (the server sets Retry-After).
api_error queue_full(std::size_t max_queue);
/// 503: the server is shutting down.
api_error draining();
/// 500: an unexpected failure while serving (the text of the exception).
api_error internal_error(std::string_view what);

/// `{"error": {...}}` as JSON text.
std::string error_body(const api_error& e);

/// The answer to a request's Authorization header when the server was
/// started with `api_key` (empty: no key, every request passes): nullopt
/// when `authorization` is exactly "Bearer <api_key>", 401 otherwise.
std::optional<api_error> check_authorization(std::string_view authorization, std::string_view api_key);

// --- requests ------------------------------------------------------------------

/// Which API a request came through.
enum class api_kind : std::uint8_t {
  completions,       ///< POST /v1/completions
  chat_completions,  ///< POST /v1/chat/completions
};

/// One chat message (role "system", "user", "assistant" or "tool").
using chat_message = llmkit::chat::chat_turn;

/// What the server knows about its model when it checks a request.
struct model_limits {
  std::size_t n_ctx = 0;    ///< tokens the context holds (prompt + completion)
  std::size_t n_vocab = 0;  ///< valid token ids are [0, n_vocab)
};

/// Deepest nesting of arrays and objects a request body may have, the
/// body's own object counting as level 1. A deeper body is refused by a
/// scan of its raw text before it is parsed, so nothing recursive (a
/// serializer, a copy, an error message quoting the value) ever walks it.
inline constexpr std::size_t max_json_depth = 64;

/// Longest quotation of a request's value in an error message, in bytes;
/// longer values are cut (at a UTF-8 character boundary) and end in "...".
inline constexpr std::size_t max_quoted_bytes = 64;

/// Smallest temperature above 0 (0 is greedy): the chain divides logits by
/// it, so a logit grows at most 100-fold (vLLM's floor too).
inline constexpr double min_temperature = 0.01;
/// Smallest repetition penalty: a seen token's positive logit is divided by
/// it, so a logit grows at most 100-fold.
inline constexpr double min_repetition_penalty = 0.01;

/// The log-probability reported for a token the processed distribution
/// gives probability 0 (masked by top-k, a -100 bias, ...), and the floor
/// of every reported log-probability: OpenAI's value. Replies never carry
/// NaN or infinity.
inline constexpr float masked_logprob = -9999.0f;

/// Bounds on the grammars requests carry (`response_format`, `grammar`,
/// `json_schema`), so that compiling an adversarial one costs a 400 rather
/// than a hung or swollen server. Parsing checks the first five (GBNF size
/// and shape, schema conversion); the backend checks the rest when it
/// compiles (automaton positions, built ahead for the first
/// `warm_up_positions` of them, and later as generation reaches them: a
/// request that reaches a limit then ends with finish reason "error").
struct grammar_limits {
  std::size_t max_gbnf_bytes = 64 * 1024;  ///< GBNF text, as sent or as converted from a schema
  std::size_t max_rules = 2048;            ///< GBNF rules, helper rules of repetitions included
  std::size_t max_elements = 1u << 16;     ///< GBNF elements over all alternatives (repetitions expanded)
  std::size_t max_repetition = 1024;       ///< largest m or n of `{m,n}` (and of minLength, maxItems, ...)
  std::size_t max_nesting = 64;            ///< parentheses nested in one GBNF rule
  std::size_t max_schema_depth = 32;       ///< JSON Schema subschemas nested (through $ref too)
  std::size_t max_positions = 8192;        ///< automaton positions of one grammar (each 1 KiB and more)
  std::size_t max_stacks = 1024;           ///< parses alive at one position (ambiguity; an enum of k strings has k)
  std::size_t max_stack_depth = 128;       ///< rules nested at one position (memory grows with depth x ambiguity)
  std::size_t warm_up_positions = 512;     ///< positions built when compiled
};

/// What constrains a request's output: GBNF text (as sent in `grammar`, or
/// converted from a JSON Schema), and the field it came from (for errors).
struct grammar_request {
  std::string gbnf{};
  std::string param{};  ///< "response_format", "grammar" or "json_schema"
};

/// Ranges the parser enforces besides the model's own.
struct request_limits {
  std::size_t max_n = 16;             ///< `n`: 1..max_n completions per request
  std::size_t max_stop = 4;           ///< `stop`: at most this many strings (OpenAI's limit)
  std::size_t max_stop_bytes = 256;   ///< each stop string at most this long
  std::size_t max_logprobs = 5;       ///< completions `logprobs`: 0..max_logprobs
  std::size_t max_top_logprobs = 20;  ///< chat `top_logprobs`: 0..max_top_logprobs
  std::size_t max_logit_bias = 1024;  ///< entries of `logit_bias`
  std::size_t max_draft_tokens = 16;  ///< `speculative.n_max`: 1..max_draft_tokens
  grammar_limits grammar{};           ///< structured outputs
};

/// The sampling fields of a request, OpenAI's defaults where absent. Every
/// float is finite, and 0 or a normal float (a nonzero value below
/// FLT_MIN, 1.2e-38, in magnitude is refused rather than rounded).
struct sampling_params {
  float temperature = 1.0f;         ///< 0 (greedy) or [min_temperature, 2]
  float top_p = 1.0f;               ///< (0, 1]; 1 = off
  std::int64_t top_k = 0;           ///< >= 0; 0 = off, > n_vocab = n_vocab (llama.cpp extension)
  float min_p = 0.0f;               ///< [0, 1]; 0 = off (extension)
  float typical_p = 1.0f;           ///< (0, 1]; 1 = off (extension)
  float repetition_penalty = 1.0f;  ///< [min_repetition_penalty, 10]; 1 = off (extension)
  float frequency_penalty = 0.0f;   ///< [-2, 2]
  float presence_penalty = 0.0f;    ///< [-2, 2]
  std::int64_t penalty_last_n = 64; ///< >= -1; tokens the penalties look back on (-1: all; extension `repeat_last_n`)
  std::vector<std::pair<token_id, float>> logit_bias{};  ///< token -> bias in [-100, 100]
  std::optional<std::uint64_t> seed{};  ///< absent: the server picks one
};

/// vLLM's beam search: `use_beam_search: true`, `best_of` beams (default
/// `n`; the `n` best hypotheses are returned), `length_penalty`.
struct beam_params {
  std::size_t width = 1;        ///< `best_of`: n..max_n
  float length_penalty = 1.0f;  ///< [-10, 10]: a hypothesis of k tokens scores logprob / k^length_penalty
};

/// A parsed, range-checked request of either API.
struct generation_request {
  api_kind kind = api_kind::completions;
  /// Completions: the prompt text (when given as a string); empty otherwise.
  std::string prompt_text{};
  /// Completions: the prompt as token ids (when given as integers).
  std::vector<token_id> prompt_tokens{};
  bool prompt_is_tokens = false;
  /// Chat: the conversation, in order (content parts joined).
  std::vector<chat_message> messages{};
  /// `max_tokens` (chat also reads `max_completion_tokens`); absent: 16 for
  /// completions, the rest of the context for chat.
  std::optional<std::size_t> max_tokens{};
  sampling_params sampling{};
  std::vector<std::string> stop{};  ///< stop strings (each non-empty)
  std::size_t n = 1;                ///< completions per prompt
  bool stream = false;
  bool include_usage = false;       ///< stream_options.include_usage: a last chunk with `usage`
  /// Top alternatives per token to report; nullopt: no logprobs at all.
  /// Completions `logprobs: k`; chat `logprobs: true` with `top_logprobs: k`.
  std::optional<std::size_t> logprobs{};
  std::string model{};  ///< echoed back; not checked
  /// Beam search instead of sampling. Not streamed (a 400), and without
  /// sampling parameters (temperature 0 or absent), logprobs or stop strings.
  std::optional<beam_params> beam{};
  /// `speculative`: false opts out of the server's speculative decoding
  /// (`--draft`); absent: the server's choice. Tokens are the same either way.
  std::optional<bool> speculative{};
  /// `speculative.n_max` (llama-server's name): most guessed tokens per step.
  std::optional<std::size_t> speculative_n_max{};
  /// Chat: `chat_template_kwargs.enable_thinking` (vLLM's and llama-server's
  /// switch of Qwen3's thinking block); other keys of chat_template_kwargs
  /// than these two are ignored, as the built-in templates take no others.
  bool enable_thinking = true;
  /// Chat: gpt-oss's reasoning effort, "low", "medium" or "high"
  /// (`chat_template_kwargs.reasoning_effort`, or the top-level
  /// `reasoning_effort` of OpenAI's API; the former wins); empty: the
  /// template's default (medium). Other templates ignore it.
  std::string reasoning_effort{};
  /// Chat: `tools`, `tool_choice`, `parallel_tool_calls` (tool_calls.hpp);
  /// nullopt without tools.
  std::optional<tool_request> tools{};
  /// Structured output (`response_format` json_object / json_schema,
  /// llama-server's `grammar` and `json_schema`); nullopt: free text.
  std::optional<grammar_request> grammar{};
};

/// A request or the error that answers it.
using parse_result = std::variant<generation_request, api_error>;

/// Parses and checks a request body of `kind`. Never throws: malformed JSON,
/// nesting deeper than `max_json_depth`, a wrong type or an out-of-range
/// value is a 400 naming the field and quoting at most `max_quoted_bytes`
/// of the value.
parse_result parse_request(api_kind kind, std::string_view body, const model_limits& model,
                           const request_limits& limits = {});

/// The llmkit run-time chain (sampling/runtime_chain.hpp) for `p`:
/// penalties and logit bias first, then top-k, typical, top-p, min-p,
/// temperature and the draw ("greedy" at temperature 0). Parameters at
/// their neutral values are left out.
std::string chain_config(const sampling_params& p);

/// The completion budget: `max_tokens` when given, else 16 (completions) or
/// what the context leaves (chat). Checks that the prompt of `n_prompt`
/// tokens plus the budget fit in the context: a 400 otherwise.
std::variant<std::size_t, api_error> completion_budget(const generation_request& r, std::size_t n_prompt,
                                                       const model_limits& model);

/// The stop rules: `max_new_tokens`, the model's `eos_tokens`, the request's stop strings.
llmkit::stop_criteria stop_rules(const generation_request& r, std::size_t max_new_tokens,
                                 std::vector<token_id> eos_tokens);

// --- tokenizer routes ------------------------------------------------------------

/// POST /tokenize (llama-server's shape): `{"content": "text", "add_special":
/// false, "parse_special": ..., "with_pieces": false}`.
struct tokenize_request {
  std::string content{};
  bool add_special = false;  ///< BOS in front, when the model uses one
  /// Special-token texts (`</s>`) become control tokens; absent: as the
  /// server tokenizes prompts (text unless it runs with --parse-special).
  std::optional<bool> parse_special{};
  bool with_pieces = false;  ///< answer `{"id", "piece"}` objects instead of ids
};

/// POST /detokenize: `{"tokens": [ids]}`.
struct detokenize_request {
  std::vector<token_id> tokens{};  ///< each in [0, n_vocab)
};

/// Parses a /tokenize body (same checks as parse_request: depth pre-scan,
/// types, quotes cut). Never throws.
std::variant<tokenize_request, api_error> parse_tokenize_request(std::string_view body);
/// Parses a /detokenize body; an id outside the vocabulary is a 400 naming
/// `tokens[i]`. Never throws.
std::variant<detokenize_request, api_error> parse_detokenize_request(std::string_view body, const model_limits& model);

/// One token of a /tokenize answer with pieces: its id and its bytes.
struct token_with_piece {
  token_id id = -1;
  std::string piece{};  ///< the token's text, control tokens rendered ("<s>")
};

/// `{"tokens": [ids]}`.
std::string tokenize_response(const std::vector<token_id>& tokens);
/// `{"tokens": [{"id": n, "piece": "text"}]}`; a piece that is not valid
/// UTF-8 (part of a character) is its list of byte values, as llama-server does.
std::string tokenize_response(const std::vector<token_with_piece>& tokens);
/// `{"content": "text"}` (bytes that are not valid UTF-8 become U+FFFD).
std::string detokenize_response(std::string_view content);


/// One alternative token and its log-probability.
struct token_alternative {
  token_id token = -1;
  std::string text{};
  float logprob = 0.0f;
};

/// One generated piece of a choice: its text and, when asked, its token's
/// log-probability and the top alternatives.
struct token_piece {
  std::string text{};        ///< text released by this token (held-back text may come later)
  std::string token_text{};  ///< the token's own text (for logprobs)
  token_id token = -1;
  float logprob = 0.0f;
  std::vector<token_alternative> top{};
};

/// A finished choice.
struct choice_result {
  std::string text{};
  /// A reasoning model's thinking (chat): the message's `reasoning_content`,
  /// `text` then being the answer after it; nullopt: no such field.
  std::optional<std::string> reasoning{};
  std::vector<token_piece> pieces{};  ///< per token, when logprobs were asked for
  /// Chat with tools: the calls parsed from the answer (`text` is then the
  /// rest); the finish reason of a choice with calls is "tool_calls".
  std::vector<llmkit::chat::tool_call> tool_calls{};
  serve::finish_kind finish = serve::finish_kind::stop;  ///< its `finish_reason`: serve::to_string(finish)
};

/// Tokens a request used.
struct usage_counts {
  std::size_t prompt_tokens = 0;
  std::size_t completion_tokens = 0;
  /// Prompt tokens whose KV came from the prefix cache
  /// (`prompt_tokens_details.cached_tokens`).
  std::size_t cached_tokens = 0;
};

/// What every response of one request shares.
struct response_header {
  std::string id;       ///< "cmpl-..." or "chatcmpl-..."
  std::int64_t created; ///< Unix seconds
  std::string model;
};

/// The non-streamed answer: a "text_completion" or "chat.completion" object
/// with `choices` (index, text / message, logprobs, finish_reason) and `usage`.
/// `with_logprobs` selects the logprobs object (else null).
std::string completion_response(api_kind kind, const response_header& h, const std::vector<choice_result>& choices,
                                const usage_counts& usage, bool with_logprobs);

/// `data: <json>\n\n`: one server-sent event.
std::string sse_event(std::string_view json);
/// `data: [DONE]\n\n`: the end of every stream.
std::string sse_done();

/// The first chunk of a streamed chat choice: `delta: {"role": "assistant", "content": ""}`.
std::string chat_role_chunk(const response_header& h, std::size_t index);
/// A streamed piece of choice `index` (text_completion or chat.completion.chunk);
/// `piece.top` and `piece.logprob` are reported when `with_logprobs`.
std::string piece_chunk(api_kind kind, const response_header& h, std::size_t index, const token_piece& piece,
                        bool with_logprobs);
/// A streamed piece of a reasoning model's thinking: `delta: {"reasoning_content": text}`.
std::string reasoning_chunk(const response_header& h, std::size_t index, std::string_view text);

/// A reasoning model's streamed answer split as it arrives: when it opens
/// with `<think>`, the text up to `</think>` is reasoning (the `<think>` and
/// the newlines after it dropped) and the rest content (its leading
/// newlines dropped), as llmkit::model::split_reasoning splits a whole
/// answer, except that newlines just before `</think>` are already sent; an
/// answer that does not open with `<think>` is all content. Text that may be the
/// start of a marker is held back until the next piece (or finish()).
class reasoning_stream {
 public:
  struct parts {
    std::string reasoning{}, content{};
  };
  /// The next piece of generated text.
  parts feed(std::string_view text);
  /// What is held back, at the end of the answer.
  parts finish();

 private:
  std::string held_{};
  bool opened_ = false;    // past a leading "<think>" (or text that is not one)
  bool thinking_ = true;   // before "</think>"
  bool reasoned_ = false;  // reasoning other than newlines has been sent
  bool answered_ = false;  // content other than newlines has been sent
};

/// The last chunk of choice `index`: empty text / delta and its finish_reason
/// ("tool_calls" instead of "stop" when `made_tool_calls`).
std::string finish_chunk(api_kind kind, const response_header& h, std::size_t index, serve::finish_kind finish,
                         bool made_tool_calls = false);
/// stream_options.include_usage: a chunk with empty `choices` and `usage`.
std::string usage_chunk(api_kind kind, const response_header& h, const usage_counts& usage);
/// An error in the middle of a stream (after the 200 was sent): `{"error": ...}`.
std::string stream_error_chunk(const api_error& e);

/// GET /v1/models: one model, `id`, owned by "llmkit".
std::string models_response(std::string_view model_id, std::int64_t created);
/// GET /health: `{"status": "ok" | "draining", ...}` with the queue and batch.
std::string health_response(bool is_draining, std::size_t queue_depth, std::size_t running);

// --- metrics ---------------------------------------------------------------------

/// Prometheus text exposition (version 0.0.4) of `s`.
std::string prometheus_text(const metrics_snapshot& s);

}  // namespace llmkit_server
