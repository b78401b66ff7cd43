// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/tool_calls.hpp
/// llmkit-server's tool calling on /v1/chat/completions, on llmkit/chat/:
/// the request fields `tools`, `tool_choice` and `parallel_tool_calls`, the
/// messages' `tool_calls` and `tool_call_id`, and the JSON of calls in an
/// answer and in a streamed chunk (OpenAI's shapes). openai_protocol.cpp
/// calls these while it reads a chat request and writes its answer.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <llmkit/chat/tool_parser.hpp>
#include <llmkit/chat/tools.hpp>

namespace llmkit_server {

struct response_header;

/// A chat request's tools.
struct tool_request {
  std::vector<llmkit::chat::tool_definition> tools{};
  llmkit::chat::tool_choice choice{};  ///< "auto" when absent (OpenAI's default with tools)
  bool parallel = true;                ///< `parallel_tool_calls`
  /// Whether the answer may hold calls: tools are given and tool_choice is not "none".
  bool active() const noexcept { return !tools.empty() && choice.mode != llmkit::chat::tool_choice_mode::none; }
};

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request body
/// (its JSON text: the tools' key order is kept for the template); nullopt
/// when `tools` is absent or empty and tool_choice is absent or "none" or "auto".
/// @throws llmkit::error whose message starts with the field
/// (`tools[1].function.parameters: json schema: at #/...`).
std::optional<tool_request> parse_tool_request(std::string_view body_text);

/// A message's `tool_calls` (assistant) or `tool_call_id` (tool).
struct message_tool_fields {
  std::vector<llmkit::chat::tool_call> tool_calls{};
  std::string tool_call_id{};
};

/// Reads `message`'s tool fields for role `role`; `where` is "messages[i]".
/// @throws llmkit::error whose message starts with the field.
message_tool_fields parse_message_tool_fields(const nlohmann::json& message, const std::string& role,
                                              const std::string& where);

/// `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
nlohmann::ordered_json tool_calls_json(const std::vector<llmkit::chat::tool_call>& calls);

/// A chat.completion.chunk of choice `index` whose delta holds `calls`:
/// a call's first delta with its id, type and name (arguments ""), later
/// ones with an arguments chunk, as OpenAI streams them.
std::string tool_call_chunk(const response_header& h, std::size_t index,
                            const std::vector<llmkit::chat::tool_call_delta>& calls);

}  // namespace llmkit_server
