// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/backend.hpp
/// What llmkit-server needs from whatever runs the model: tokenization,
/// the chat template, and generation requests submitted with a stream
/// callback, cancelled by handle. The HTTP layer (server.cpp) knows nothing
/// else. Requests, events and submit answers are llmkit::serve's own
/// (llmkit/serve/request.hpp), so a backend over a serving engine passes
/// them through unchanged.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <llmkit/chat/tool_grammar.hpp>
#include <llmkit/chat/tools.hpp>
#include <llmkit/core/error.hpp>
#include <llmkit/core/ids.hpp>
#include <llmkit/grammar/lazy_processor.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/grammar/token_masker.hpp>
#include <llmkit/core/stop.hpp>
#include <llmkit/model/tokenizer_types.hpp>
#include <llmkit/serve/request.hpp>

#include "openai_protocol.hpp"

namespace llmkit_server {

/// Identifies a submitted request (unique per backend).
using llmkit::request_id;

/// Gauges /metrics and /health report.
struct backend_stats {
  std::size_t n_queued = 0;   ///< samples waiting
  std::size_t n_running = 0;  ///< samples running
  std::size_t kv_blocks_used = 0;
  std::size_t kv_blocks_free = 0;
  /// Most bytes the KV cache held allocated after any step (the pool, and
  /// the rings of local layers); 0 when the backend does not count them.
  std::size_t kv_bytes_peak = 0;
};

/// The model as the HTTP layer sees it.
struct backend_model_info {
  std::string id;                     ///< reported by /v1/models and in every answer
  std::size_t n_ctx = 0;              ///< prompt + completion tokens per request
  std::size_t n_vocab = 0;
  std::vector<token_id> eos_tokens{}; ///< end every completion
  std::string kv_layout{};            ///< how the KV is kept, for the startup line (empty: not said)
};

/// A chat rendered to prompt text, and the tokens that end the assistant's turn.
struct chat_prompt {
  std::string text{};
  /// `[n] contents`: the byte ranges of `text` that are message contents
  /// (everything else is the template's), sorted, not overlapping.
  std::vector<llmkit::model::text_span> contents{};
  std::vector<token_id> end_of_turn{};
  /// Whether the answer opens with a thinking block (Qwen3 with thinking
  /// on): the server returns it as `reasoning_content`.
  bool reasoning = false;
  /// Whether the answer is in harmony's channels (gpt-oss): the analysis
  /// channel is returned as `reasoning_content`, the final one as content.
  bool harmony = false;
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
/// finish event, a rejected request gets its error finishes inside `submit`
/// (on the caller's thread), and events come on the backend's own thread
/// otherwise; `on_event` must not block or throw.
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
  /// `enable_thinking`: chat_template_kwargs.enable_thinking (Qwen3);
  /// `[k] tools`: the request's tools, rendered as the template's family
  /// does (llmkit/chat/tool_template.hpp); `reasoning_effort`: gpt-oss's
  /// (empty: the template's default).
  virtual std::optional<chat_prompt> format_chat(const std::vector<chat_message>& messages, bool enable_thinking,
                                                 std::span<const llmkit::chat::tool_definition> tools,
                                                 std::string_view reasoning_effort) const = 0;
  /// The call syntax of the chat template's family; nullopt when there is
  /// no template or its family has no tools.
  virtual std::optional<llmkit::chat::tool_syntax> tool_syntax() const { return std::nullopt; }
  /// The vocabulary grammars are compiled for (its ends: EOS and the
  /// template's end of turn); null when the backend takes no grammars.
  virtual std::shared_ptr<const llmkit::grammar::token_vocabulary> grammar_vocabulary() const { return nullptr; }
  /// The id of the one token whose text is `text` (a special token such as
  /// `<tool_call>`), if the vocabulary has one.
  virtual std::optional<token_id> single_token(std::string_view /*text*/) const { return std::nullopt; }
  /// The text of one token (for logprobs).
  virtual std::string token_text(token_id token) const = 0;
  /// POST /tokenize: `text` to ids, BOS in front only when `add_special`
  /// (and the model uses one), special-token texts as control tokens only
  /// when `parse_special`.
  virtual std::vector<token_id> encode(std::string_view text, bool add_special, bool parse_special) const = 0;
  /// POST /detokenize and /tokenize's pieces: the text (bytes) of
  /// `[n] ids`, control tokens rendered as their text ("<s>").
  /// @pre every id is in [0, info().n_vocab)
  virtual std::string decode(std::span<const token_id> ids) const = 0;
  /// Queues `request` (its `sampling` is a run-time chain string; its `n`
  /// samples have handles handle .. handle + n - 1 and events with index i).
  virtual serve::submit_result submit(serve::generation_request request) = 0;
  /// Ends the request at the next step with serve::finish_kind::cancelled
  /// (no-op when it has finished).
  virtual void cancel(request_id handle) = 0;
  /// Cancels every request, queued or running.
  virtual void cancel_all() = 0;
  virtual backend_stats stats() const = 0;
  /// The mask source of GBNF `gbnf` over the model's vocabulary, compiled
  /// under `limits` (cached by content across requests), its first
  /// positions built (`grammar_limits::warm_up_positions`); nullptr when
  /// this backend does not constrain output.
  /// @throws llmkit::error when the grammar exceeds a limit.
  virtual std::shared_ptr<const llmkit::grammar::token_masker> compile_grammar(const std::string& gbnf,
                                                                               const grammar_limits& limits) const {
    (void)gbnf;
    (void)limits;
    return nullptr;
  }
};

/// A checked request as the backend takes it (without its callback), and
/// its prompt length.
struct prepared_request {
  serve::generation_request request;
  std::size_t n_prompt = 0;
  bool reasoning = false;  ///< the answer opens with a thinking block (chat_prompt::reasoning)
  bool harmony = false;    ///< the answer is in harmony's channels (chat_prompt::harmony)
  /// Chat with tools that may be called: how the answer writes calls.
  std::optional<llmkit::chat::tool_syntax> tool_syntax{};
  /// Marker tokens the tokenizer decodes to no text (control tokens such as
  /// Mistral's `[TOOL_CALLS]`) with their text: the server writes it into
  /// the answer where they are drawn, so the call parser sees the marker.
  std::vector<std::pair<token_id, std::string>> silent_markers{};
};

/// A tools request's sampling chain and its silent markers (prepared_request).
struct tool_sampling {
  llmkit::sampling::runtime_chain chain;
  std::vector<std::pair<token_id, std::string>> silent_markers{};
};

/// The sampling chain of a chat request whose tools may be called with
/// tool_choice "auto": the lazy call grammar of `syntax`
/// (llmkit/chat/tool_grammar.hpp; from the opening marker on) first, then
/// the request's own chain. The engine takes it as
/// `serve::generation_request::chain`. A marker the vocabulary holds as one
/// special token triggers the lazy grammar as its text does; those that
/// decode to no text are returned as `silent_markers`. ("required" and
/// named choices constrain the whole answer: prepare_request gives their
/// grammar to the engine as the request's grammar instead.)
/// @throws llmkit::error when the tools' grammar cannot be compiled
inline tool_sampling tool_chain(const tool_request& tools, llmkit::chat::tool_syntax syntax,
                                                  const backend& model, const std::string& sampling) {
  namespace grammar = llmkit::grammar;
  const auto vocab = model.grammar_vocabulary();
  LLMKIT_CHECK(vocab != nullptr, "tools: this backend takes no grammars");
  const auto g = llmkit::chat::tool_call_grammar(syntax, tools.tools, tools.choice, tools.parallel);
  LLMKIT_ASSERT(g.has_value());
  const auto masker = grammar::compile_cached(g->gbnf, vocab);
  auto rest = llmkit::sampling::runtime_chain::parse(sampling);
  const bool greedy = rest.is_greedy();
  std::vector<llmkit::sampling::any_processor> chain;
  std::vector<std::pair<token_id, std::string>> silent;
  LLMKIT_ASSERT(!g->triggers.empty());  // "auto": the lazy grammar
  std::vector<std::pair<token_id, std::string>> markers;
  for (const auto& t : g->triggers)
    if (const auto id = model.single_token(t)) {
      markers.emplace_back(*id, t);
      if (model.token_text(*id).empty()) silent.emplace_back(*id, t);
    }
  chain.emplace_back(grammar::lazy_grammar_processor(masker, g->triggers, std::move(markers)));
  chain.emplace_back(std::move(rest));
  return {.chain = greedy ? llmkit::sampling::runtime_chain(std::move(chain), llmkit::sampling::greedy{})
                          : llmkit::sampling::runtime_chain(std::move(chain)),
          .silent_markers = std::move(silent)};
}

/// The engine's beam search for a parsed request's `beam` (nullopt: sampling).
inline std::optional<serve::beam_options> beam_of(const generation_request& r) {
  if (!r.beam) return std::nullopt;
  // Never stop before the budget while a beam can still win: vLLM's default (early_stopping=False).
  return serve::beam_options{.width = r.beam->width,
                             .length_penalty = r.beam->length_penalty,
                             .stopping = llmkit::search::early_stopping::when_no_better};
}

/// The compiled grammar of `r` (nullptr when it has none), or the 400 that
/// answers it: a grammar past one of `limits`, or a backend that does not
/// constrain output.
inline std::variant<std::shared_ptr<const llmkit::grammar::token_masker>, api_error> grammar_of(
    const generation_request& r, const backend& model, const grammar_limits& limits) {
  if (!r.grammar) return nullptr;
  try {
    auto m = model.compile_grammar(r.grammar->gbnf, limits);
    if (m == nullptr)
      return invalid_request(r.grammar->param, "structured output ('" + r.grammar->param +
                                                   "') needs the engine backend (--backend engine)");
    return m;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    return invalid_request(r.grammar->param, "'" + r.grammar->param + "' cannot be compiled: " + what);
  }
}

/// Turns a parsed request into the backend's: the prompt tokenized (a chat
/// through the model's template, its end-of-turn token added to the EOS
/// set), the completion budget checked against the context, the sampling
/// chain (or the beam search) and the stop rules, and speculative decoding:
/// the server's (`drafting`, from `--draft`) unless the request opts out
/// (`"speculative": false`) or searches beams, with its own
/// `speculative.n_max` if sent, and the request's grammar compiled by the
/// backend under `grammar`. A 400 when the model has no chat template,
/// the template refuses the conversation, the prompt and budget do not
/// fit, or the grammar exceeds a limit or cannot be served.
inline std::variant<prepared_request, api_error> prepare_request(const generation_request& r, const backend& model,
                                                                 std::uint64_t seed,
                                                                 const serve::speculation& drafting = {},
                                                                 const grammar_limits& grammar = {}) {
  const backend_model_info& info = model.info();
  const model_limits limits{.n_ctx = info.n_ctx, .n_vocab = info.n_vocab};
  std::vector<token_id> prompt;
  std::vector<token_id> eos = info.eos_tokens;
  bool reasoning = false, harmony = false;
  if (r.kind == api_kind::completions) {
    prompt = r.prompt_is_tokens ? r.prompt_tokens : model.tokenize(r.prompt_text);
  } else {
    if (r.tools && !model.tool_syntax())
      return invalid_request("tools", "the chat template has no tool-call format; start llmkit-server with "
                                      "--chat-template NAME, NAME one of chatml, qwen2, qwen2.5, qwen3, llama3.1, "
                                      "mistral-v3, harmony");
    std::optional<chat_prompt> chat;
    try {
      chat = model.format_chat(r.messages, r.enable_thinking,
                               r.tools ? std::span<const llmkit::chat::tool_definition>(r.tools->tools)
                                       : std::span<const llmkit::chat::tool_definition>(),
                               r.reasoning_effort);
    } catch (const llmkit::error& e) {
      std::string what = e.what();
      if (what.size() > 300) what = what.substr(0, 300) + "...";
      return invalid_request("messages", "the chat template refuses these messages: " + what);
    }
    if (!chat)
      return invalid_request("messages", "the model has no chat template (tokenizer.chat_template); start "
                                         "llmkit-server with --chat-template NAME");
    prompt = model.tokenize_chat(*chat);
    reasoning = chat->reasoning;
    harmony = chat->harmony;
    eos.insert(eos.end(), chat->end_of_turn.begin(), chat->end_of_turn.end());
  }
  const auto budget = completion_budget(r, prompt.size(), limits);
  if (const auto* e = std::get_if<api_error>(&budget)) return *e;
  const auto masker = grammar_of(r, model, grammar);
  if (const auto* e = std::get_if<api_error>(&masker)) return *e;
  const std::size_t n_prompt = prompt.size();
  std::optional<llmkit::chat::tool_syntax> syntax;
  std::optional<llmkit::sampling::runtime_chain> chain;
  std::vector<std::pair<token_id, std::string>> silent_markers;
  std::shared_ptr<const llmkit::grammar::token_masker> call_grammar;
  if (r.kind == api_kind::chat_completions && r.tools && r.tools->active()) {
    syntax = model.tool_syntax();
    const auto cut = [](const std::exception& e) {
      std::string what = e.what();
      return what.size() > 300 ? what.substr(0, 300) + "..." : what;
    };
    if (r.tools->choice.mode == llmkit::chat::tool_choice_mode::automatic) {
      if (r.beam) return invalid_request("tools", "tool_choice \"auto\" cannot be used with 'use_beam_search'");
      try {
        auto t = tool_chain(*r.tools, *syntax, model, chain_config(r.sampling));
        chain = std::move(t.chain);
        silent_markers = std::move(t.silent_markers);
      } catch (const llmkit::error& e) {
        return invalid_request("tools", "the tools' call grammar cannot be built: " + cut(e));
      }
    } else {
      // The whole answer is calls: the request's grammar, so that it composes with n > 1, beams and drafts
      // as a response grammar does.
      if (r.grammar)
        return invalid_request("tool_choice", "tool_choice \"required\" or a named function constrains the whole "
                                              "answer: it cannot be combined with '" + r.grammar->param + "'");
      try {
        const auto g = llmkit::chat::tool_call_grammar(*syntax, r.tools->tools, r.tools->choice, r.tools->parallel);
        LLMKIT_ASSERT(g.has_value());
        call_grammar = model.compile_grammar(g->gbnf, grammar);
      } catch (const std::exception& e) {
        return invalid_request("tools", "the tools' call grammar cannot be built: " + cut(e));
      }
      if (call_grammar == nullptr)
        return invalid_request("tools", "tool calls need the engine backend (--backend engine)");
    }
    reasoning = false;  // the answer is split into content and calls instead
  }
  if (harmony) {
    // Its markers are control tokens that decode to no text: the answer gets
    // their text, so that the channels can be told apart.
    for (std::string_view m : {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>",
                               "<|constrain|>"})
      if (const auto id = model.single_token(m); id && model.token_text(*id).empty())
        silent_markers.emplace_back(*id, std::string(m));
    // With tools, the tool stream splits the channels (llmkit/chat/harmony_parser.hpp).
    if (syntax) harmony = false;
  }
  return prepared_request{.request = {.prompt = std::move(prompt),
                                      .sampling = r.beam ? std::string("greedy") : chain_config(r.sampling),
                                      .chain = std::move(chain),
                                      .grammar = call_grammar ? call_grammar : std::get<0>(masker),
                                      .seed = seed,
                                      .stop = stop_rules(r, std::get<std::size_t>(budget), std::move(eos)),
                                      .top_logprobs = r.logprobs.value_or(0),
                                      .n = r.n,
                                      .beam = beam_of(r),
                                      .speculative = drafting.drafter != serve::draft_source::none &&
                                                             r.speculative.value_or(true) && !r.beam
                                                         ? serve::speculation{drafting.drafter,
                                                                              r.speculative_n_max.value_or(
                                                                                  drafting.max_tokens)}
                                                         : serve::speculation{},
                                      .on_event = {}},
                          .n_prompt = n_prompt,
                          .reasoning = reasoning,
                          .harmony = harmony,
                          .tool_syntax = syntax,
                          .silent_markers = std::move(silent_markers)};
}

}  // namespace llmkit_server
