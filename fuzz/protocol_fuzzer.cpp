// SPDX-License-Identifier: MIT
// libFuzzer target for llmkit-server's protocol (examples/server/
// openai_protocol.hpp) and the prompt a chat becomes. The first byte picks
// the API (even: /v1/completions, odd: /v1/chat/completions), the rest is
// the request body. Every input must give a checked request or a 4xx
// api_error with a short message, and never throw, crash or trip a
// sanitizer; an accepted request's sampling chain must be one the library
// takes, its numbers finite, and a chat's prompt must hold control tokens
// only where the template wrote markers, never inside a message's content.
// The body also goes through the /tokenize and /detokenize parsers and
// answers (a request or a 4xx; every answer JSON).
// Build: clang++-14 -std=c++20 -march=native -fsanitize=fuzzer,address,undefined
//   -Iinclude -Iexamples/server fuzz/protocol_fuzzer.cpp examples/server/openai_protocol.cpp examples/server/tool_calls.cpp
//   (tests/server_protocol.cmake does it in sanitizer builds).
#include <llmkit/model/chat_template.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/runtime_chain.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gguf_backend.hpp"
#include "openai_protocol.hpp"

namespace {

using namespace llmkit_server;
namespace lm = llmkit::model;

[[noreturn]] void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "protocol_fuzzer: %s %.*s\n", what, static_cast<int>(std::min<std::size_t>(detail.size(), 300)),
               detail.data());
  std::abort();
}

void check(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

// A SentencePiece vocabulary of the 256 byte tokens, a few words and the
// control tokens of the chat templates the fuzzer formats with.
const lm::tokenizer& vocab() {
  static const lm::tokenizer tok = [] {
    std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
    std::vector<lm::token_type> types{lm::token_type::unknown, lm::token_type::control, lm::token_type::control};
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      tokens.emplace_back(name);
      types.push_back(lm::token_type::byte);
    }
    for (const char* w : {"\xe2\x96\x81", "s", "/", "<", ">", "</", "s>", "im", "user", "system", "\n"}) {
      tokens.emplace_back(w);
      types.push_back(lm::token_type::normal);
    }
    for (const char* c : {"<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                          "[INST]", "[/INST]"}) {
      tokens.emplace_back(c);
      types.push_back(lm::token_type::control);
    }
    std::vector<float> scores(tokens.size(), -1.0f);
    return lm::tokenizer(tokens, scores, types, {.bos = 1, .eos = 2, .unk = 0}, false);
  }();
  return tok;
}

void check_error(const api_error& e) {
  check(e.status >= 400 && e.status < 500, "error status outside 4xx", e.message);
  check(!e.message.empty(), "empty error message");
  // A quoted value is cut to max_quoted_bytes; the rest of a message is ours.
  check(e.message.size() <= 600, "error message too long", e.message);
  check(e.param.size() <= 200, "error param too long", e.param);
  const auto body = nlohmann::json::parse(error_body(e), nullptr, false);
  check(!body.is_discarded() && body.contains("error"), "error body is not JSON", error_body(e));
}

void check_number(float x, const char* what) {
  check(std::isfinite(x) && (x == 0.0f || std::isnormal(x)), "sampling number not finite and normal", what);
}

// The chat through a template, tokenized with its contents literal: every
// control token must come from the template's text, none from a content.
void check_chat(const generation_request& r, std::uint8_t selector) {
  const auto& names = lm::chat_template::names;
  const lm::chat_template t = lm::chat_template::by_name(names[selector % names.size()]);
  std::optional<chat_prompt> p;
  try {
    p = format_chat_prompt(vocab(), t, r.messages, true,
                           r.tools ? std::span<const llmkit::chat::tool_definition>(r.tools->tools)
                                   : std::span<const llmkit::chat::tool_definition>(),
                           r.reasoning_effort);
  } catch (const llmkit::error&) {
    return;  // a conversation the template refuses (prepare_request answers 400)
  }
  std::size_t end = 0;
  for (const auto& s : p->contents) {
    check(s.length > 0 && s.offset >= end && s.end() <= p->text.size(), "content ranges not sorted or inside");
    end = s.end();
  }
  // Tools, calls and results are rendered by chat::format_with_tools, which has no unmarked twin.
  const bool with_tools = r.tools || std::any_of(r.messages.begin(), r.messages.end(), [](const chat_message& x) {
                            return x.role == "tool" || !x.tool_calls.empty();
                          });
  if (!with_tools) {
    std::vector<lm::chat_message> m;
    for (const auto& x : r.messages) m.push_back({x.role, x.content});
    check(p->text == t.format(m), "format_marked's text differs from format's");
  }
  // SentencePiece writes ' ' as U+2581 and decodes it back as ' ': a text
  // holding U+2581 itself does not round-trip byte for byte.
  if (p->text.find("\xe2\x96\x81") != std::string::npos) return;
  const auto ids = encode_chat(vocab(), *p, user_special_tokens::text);
  // Walk the ids over the text: control tokens (BOS aside) sit outside every content.
  std::size_t at = 0, next = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::string piece;
    vocab().decode_token(ids[i], piece, {.render_special = true});
    if (i == 0 && ids[i] == vocab().bos()) continue;  // add_bos, not in the text
    if (vocab().type(ids[i]) == lm::token_type::control) {
      while (next < p->contents.size() && p->contents[next].end() <= at) ++next;
      check(next == p->contents.size() || p->contents[next].offset >= at + piece.size(),
            "a control token inside a message's content", piece);
    }
    check(p->text.compare(at, piece.size(), piece) == 0, "ids do not spell the text", piece);
    at += piece.size();
  }
  check(at == p->text.size(), "ids do not spell the whole text");
}

void check_request(const generation_request& r, std::uint8_t selector) {
  const sampling_params& s = r.sampling;
  for (const float x : {s.temperature, s.top_p, s.min_p, s.typical_p, s.repetition_penalty, s.frequency_penalty,
                        s.presence_penalty})
    check_number(x, "a sampling field");
  for (const auto& [token, bias] : s.logit_bias) check_number(bias, "logit_bias");
  const std::string chain = chain_config(s);
  try {
    (void)llmkit::sampling::runtime_chain::parse(chain);
  } catch (const llmkit::error& e) {
    fail("accepted request's chain refused:", std::string(chain) + " / " + e.what());
  }
  const model_limits model{.n_ctx = 512, .n_vocab = 1000};
  const auto budget = completion_budget(r, 1 + r.prompt_tokens.size() % 600, model);
  if (const auto* e = std::get_if<api_error>(&budget)) check_error(*e);
  else stop_rules(r, std::get<std::size_t>(budget), {2}).validate("protocol_fuzzer");
  // The answer echoes client text (the model name) and carries any bytes.
  const response_header h{.id = "cmpl-1", .created = 1, .model = r.model};
  const std::string text = r.kind == api_kind::completions ? r.prompt_text : std::string(r.model);
  const token_piece piece{.text = text, .token_text = text, .token = 3, .logprob = -INFINITY, .top = {{4, text, NAN}}};
  const std::vector<choice_result> choices{{.text = text, .pieces = {piece}, .finish = serve::finish_kind::stop}};
  const std::string reply = completion_response(r.kind, h, choices, {1, 1}, true);
  const auto parsed = nlohmann::json::parse(reply, nullptr, false);
  check(!parsed.is_discarded(), "reply is not JSON", reply);
  // nlohmann writes NaN and infinity as null; this reply has no null field.
  const auto no_null = [](const auto& self, const nlohmann::json& v) -> bool {
    if (v.is_null()) return false;
    if (v.is_structured())
      for (const auto& x : v)
        if (!self(self, x)) return false;
    return true;
  };
  check(no_null(no_null, parsed), "a reply with null (NaN or infinity)", reply);
  if (r.kind == api_kind::chat_completions) check_chat(r, selector);
}

// The same body as a /tokenize and a /detokenize request: a request or a
// 4xx, and every answer JSON (pieces and text carry any bytes).
void check_tokenizer_routes(std::string_view body) {
  const auto t = parse_tokenize_request(body);
  if (const auto* e = std::get_if<api_error>(&t)) {
    check_error(*e);
  } else {
    const tokenize_request& r = std::get<tokenize_request>(t);
    const auto ids = vocab().encode(r.content, {.add_bos = r.add_special, .parse_special = r.parse_special.value_or(false)});
    std::vector<token_with_piece> pieces;
    for (const llmkit::token_id id : ids) {
      std::string piece;
      vocab().decode_token(id, piece, {.render_special = true});
      pieces.push_back({.id = id, .piece = std::move(piece)});
    }
    for (const std::string& reply : {tokenize_response(ids), tokenize_response(pieces)})
      check(!nlohmann::json::parse(reply, nullptr, false).is_discarded(), "a /tokenize reply is not JSON", reply);
  }
  const auto d = parse_detokenize_request(body, {.n_ctx = 512, .n_vocab = vocab().vocab_size()});
  if (const auto* e = std::get_if<api_error>(&d)) {
    check_error(*e);
  } else {
    const std::string reply = detokenize_response(vocab().decode(std::get<detokenize_request>(d).tokens, {.render_special = true}));
    check(!nlohmann::json::parse(reply, nullptr, false).is_discarded(), "a /detokenize reply is not JSON", reply);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const api_kind kind = data[0] % 2 == 0 ? api_kind::completions : api_kind::chat_completions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  parse_result result;
  try {
    result = parse_request(kind, body, {.n_ctx = 512, .n_vocab = 1000});
  } catch (...) {
    fail("parse_request threw");
  }
  try {
    if (const auto* e = std::get_if<api_error>(&result)) check_error(*e);
    else check_request(std::get<generation_request>(result), data[0] / 2);
  } catch (const std::exception& e) {
    fail("an exception after parsing:", e.what());
  }
  try {
    check_tokenizer_routes(body);
  } catch (const std::exception& e) {
    fail("an exception in /tokenize or /detokenize:", e.what());
  }
  return 0;
}
