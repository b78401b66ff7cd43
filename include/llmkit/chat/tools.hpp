// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/tools.hpp
/// Tool calling's vocabulary: OpenAI's `tools` (function definitions with a
/// JSON Schema for their parameters), `tool_choice`, the calls a model makes,
/// conversation turns that carry calls and results, and which call syntax a
/// chat-template family was trained on.
///
/// ```cpp
/// auto tools = chat::parse_tools(body["tools"]);           // parameters checked as JSON Schema
/// auto choice = chat::parse_tool_choice(body["tool_choice"], tools);
/// auto syntax = chat::tool_syntax_of(tmpl.family());      // nullopt: the family has no tool format
/// ```
///
/// Needs nlohmann/json (as grammar/json_schema.hpp does).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmkit/core/error.hpp"
#include "llmkit/grammar/json_schema.hpp"
#include "llmkit/model/chat_template.hpp"

namespace llmkit::chat {

using json = nlohmann::ordered_json;

/// One function the model may call (an entry of OpenAI's `tools` with
/// `"type": "function"`).
struct tool_definition {
  std::string name{};         ///< `function.name`: [A-Za-z0-9_-], 1..64 bytes (OpenAI's rule)
  std::string description{};  ///< `function.description` ("" when absent)
  /// `function.parameters`: a JSON Schema of the arguments object (when
  /// absent, the function takes no arguments: `{"type": "object",
  /// "properties": {}, "additionalProperties": false}`).
  json parameters = json{{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}};
  /// The `function` object as the caller wrote it, key order kept: what
  /// the chat templates render.
  json function = json::object();
};

/// OpenAI's `tool_choice`.
enum class tool_choice_mode : std::uint8_t {
  none,      ///< no call: plain text
  automatic, ///< `"auto"`: text or calls, as the model chooses
  required,  ///< at least one call, and only calls
  named,     ///< `{"type": "function", "function": {"name": N}}`: exactly a call of N
};

/// A `tool_choice` value.
struct tool_choice {
  tool_choice_mode mode = tool_choice_mode::automatic;
  std::string name{};  ///< the function, for `named`
};

/// A call the model made (OpenAI's `tool_calls[i]`).
struct tool_call {
  std::string id{};         ///< `id` ("call_..." or, for Mistral, 9 alphanumerics)
  std::string name{};       ///< `function.name`
  std::string arguments{};  ///< `function.arguments`: the arguments object as JSON text
};

/// A change to one call of a streamed answer.
struct tool_call_delta {
  std::size_t index = 0;  ///< the call's position in the answer
  std::string id{};       ///< set in the call's first delta only
  std::string name{};     ///< set in the call's first delta only
  std::string arguments{};  ///< the next chunk of the arguments' JSON text (may be empty)
};

/// What one piece of generated text adds to an answer.
struct answer_delta {
  std::string content{};
  std::vector<tool_call_delta> calls{};
  std::string reasoning{};  ///< harmony: the analysis channel's text
  bool empty() const noexcept { return content.empty() && calls.empty() && reasoning.empty(); }
};

/// A whole answer split into content and calls.
struct parsed_answer {
  std::string content{};
  std::vector<tool_call> calls{};
  std::string reasoning{};  ///< harmony: the analysis channel's text
};

/// A conversation turn with tool calling's extras: roles `system`, `user`,
/// `assistant` (with or without `tool_calls`) and `tool` (a result, naming
/// the call it answers).
struct chat_turn {
  std::string role{};
  std::string content{};
  std::vector<tool_call> tool_calls{};  ///< assistant turns: the calls it made
  std::string tool_call_id{};           ///< tool turns: the call answered
  /// Assistant turns: the reasoning that preceded the content (OpenAI-style
  /// servers' `reasoning_content`, gpt-oss's template's `thinking`); empty
  /// when not given. Only qwen3 and harmony write it, where their templates
  /// keep it (tool_template.hpp); other families drop it.
  std::string reasoning{};
};

/// How a family's models write calls.
enum class tool_syntax : std::uint8_t {
  /// Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>`
  /// blocks, one per call, separated by newlines.
  hermes,
  /// Llama 3.1: one bare `{"name": N, "parameters": {...}}` object (after
  /// `<|python_tag|>` or not).
  llama3_json,
  /// Mistral v0.3: `[TOOL_CALLS] [{"name": N, "arguments": {...}, "id": "abcdefghi"}, ...]`.
  mistral,
  /// gpt-oss (harmony): a commentary message addressed to the function,
  /// `<|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>`
  /// (the recipient may also precede `<|channel|>`), after any analysis.
  harmony,
};

/// The call syntax of `family`: hermes for chatml, qwen2, qwen2.5 and
/// qwen3; llama3_json for llama3.1; mistral for mistral-v3; harmony for
/// harmony (gpt-oss); nullopt for families whose templates have no tools.
inline std::optional<tool_syntax> tool_syntax_of(model::chat_family family) {
  using model::chat_family;
  switch (family) {
    case chat_family::chatml:
    case chat_family::qwen2:
    case chat_family::qwen2_5:
    case chat_family::qwen3: return tool_syntax::hermes;
    case chat_family::llama3_1: return tool_syntax::llama3_json;
    case chat_family::mistral_v3: return tool_syntax::mistral;
    case chat_family::harmony: return tool_syntax::harmony;
    default: return std::nullopt;
  }
}

/// Checks OpenAI's `tools` array: each entry `{"type": "function",
/// "function": {"name", "description"?, "parameters"?, "strict"?}}`, names
/// valid and distinct, parameters a JSON Schema of an object that
/// grammar::schema_to_gbnf accepts with `schema_options`.
/// @throws llmkit::error naming the entry (`tools[2].function.parameters: json schema: at #/...`).
inline std::vector<tool_definition> parse_tools(const json& tools, const grammar::json_schema_options& schema_options = {}) {
  LLMKIT_CHECK(tools.is_array(), "tools: must be an array, got ", tools.type_name());
  std::vector<tool_definition> out;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    LLMKIT_CHECK(t.is_object(), at, ": must be an object");
    LLMKIT_CHECK(t.contains("type") && t["type"] == "function", at, ".type: must be \"function\"");
    LLMKIT_CHECK(t.contains("function") && t["function"].is_object(), at, ".function: must be an object");
    const json& f = t["function"];
    tool_definition d;
    d.function = f;
    LLMKIT_CHECK(f.contains("name") && f["name"].is_string(), at, ".function.name: must be a string");
    d.name = f["name"].get<std::string>();
    LLMKIT_CHECK(!d.name.empty() && d.name.size() <= 64, at, ".function.name: must have 1 to 64 bytes, got '",
                 d.name.substr(0, 64), "'");
    for (const char c : d.name)
      LLMKIT_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-', at,
                   ".function.name: only letters, digits, '_' and '-' are allowed, got '", d.name, "'");
    for (const auto& e : out) LLMKIT_CHECK(e.name != d.name, at, ".function.name: '", d.name, "' is defined twice");
    if (f.contains("description")) {
      LLMKIT_CHECK(f["description"].is_string(), at, ".function.description: must be a string");
      d.description = f["description"].get<std::string>();
    }
    if (f.contains("parameters")) {
      const json& p = f["parameters"];
      LLMKIT_CHECK(p.is_object(), at, ".function.parameters: must be a JSON Schema object");
      LLMKIT_CHECK(!p.contains("type") || p["type"] == "object", at,
                   ".function.parameters: must describe an object (\"type\": \"object\")");
      d.parameters = p;
    }
    try {
      (void)grammar::schema_to_gbnf(d.parameters, schema_options);
    } catch (const llmkit::error& e) {
      ::llmkit::detail::throw_error(at, ".function.parameters: ", e.what());
    }
    out.push_back(std::move(d));
  }
  return out;
}

/// Checks OpenAI's `tool_choice`: `"none"`, `"auto"`, `"required"` or
/// `{"type": "function", "function": {"name": N}}` with N one of `tools`.
/// @throws llmkit::error naming the value (an unknown function lists the defined ones).
inline tool_choice parse_tool_choice(const json& choice, std::span<const tool_definition> tools) {
  if (choice.is_string()) {
    const auto s = choice.get<std::string>();
    if (s == "none") return {tool_choice_mode::none};
    if (s == "auto") return {tool_choice_mode::automatic};
    if (s == "required") return {tool_choice_mode::required};
    ::llmkit::detail::throw_error("tool_choice: must be \"none\", \"auto\", \"required\" or a function, got \"",
                                  s.substr(0, 64), "\"");
  }
  LLMKIT_CHECK(choice.is_object() && choice.contains("function") && choice["function"].is_object() &&
                   choice["function"].contains("name") && choice["function"]["name"].is_string(),
               "tool_choice: must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  const auto name = choice["function"]["name"].get<std::string>();
  std::string known;
  for (const auto& t : tools) {
    if (t.name == name) return {tool_choice_mode::named, name};
    known += (known.empty() ? "" : ", ") + t.name;
  }
  ::llmkit::detail::throw_error("tool_choice: function '", name.substr(0, 64), "' is not in tools (",
                                known.empty() ? std::string("none defined") : known, ")");
}

/// A call id of 9 letters and digits (the length Mistral's template
/// requires; OpenAI clients take any string) from `seed` and the call's
/// `index` in the answer: distinct calls of an answer get distinct ids.
inline std::string make_tool_call_id(std::uint64_t seed, std::size_t index) {
  static constexpr std::string_view digits = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uint64_t x = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  std::string id(9, 'a');
  for (char& c : id) {
    c = digits[x % digits.size()];
    x /= digits.size();
  }
  return id;
}

}  // namespace llmkit::chat
