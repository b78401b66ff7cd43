// SPDX-License-Identifier: MIT
/// @file examples/server/tool_calls.cpp
/// tool_calls.hpp on nlohmann/json.

#include "tool_calls.hpp"

#include <llmkit/core/error.hpp>

#include "openai_protocol.hpp"

namespace llmkit_server {

namespace {
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

template <class J>
std::string dump(const J& j) {
  return j.dump(-1, ' ', false, J::error_handler_t::replace);
}
}  // namespace

std::optional<tool_request> parse_tool_request(std::string_view body_text) {
  const ordered_json body = ordered_json::parse(body_text.begin(), body_text.end(), nullptr, false);
  if (!body.is_object()) return std::nullopt;  // the protocol refuses it first
  tool_request r;
  if (body.contains("tools") && !body["tools"].is_null()) r.tools = llmkit::chat::parse_tools(body["tools"]);
  const bool has_choice = body.contains("tool_choice") && !body["tool_choice"].is_null();
  if (has_choice) r.choice = llmkit::chat::parse_tool_choice(body["tool_choice"], r.tools);
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    LLMKIT_CHECK(body["parallel_tool_calls"].is_boolean(), "parallel_tool_calls: must be a boolean");
    r.parallel = body["parallel_tool_calls"].get<bool>();
  }
  if (r.tools.empty()) {
    LLMKIT_CHECK(!has_choice || r.choice.mode == llmkit::chat::tool_choice_mode::none ||
                     r.choice.mode == llmkit::chat::tool_choice_mode::automatic,
                 "tool_choice: \"required\" needs 'tools'");
    return std::nullopt;
  }
  return r;
}

message_tool_fields parse_message_tool_fields(const json& m, const std::string& role, const std::string& where) {
  message_tool_fields out;
  if (role == "tool") {
    const auto it = m.find("tool_call_id");
    LLMKIT_CHECK(it != m.end() && it->is_string(), where, ".tool_call_id: a tool message needs the id (a string) "
                 "of the call it answers");
    out.tool_call_id = it->get<std::string>();
    return out;
  }
  const auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return out;
  LLMKIT_CHECK(role == "assistant", where, ".tool_calls: only assistant messages carry tool calls");
  LLMKIT_CHECK(it->is_array(), where, ".tool_calls: must be an array");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& c = (*it)[i];
    const std::string at = where + ".tool_calls[" + std::to_string(i) + "]";
    LLMKIT_CHECK(c.is_object(), at, ": must be an object");
    LLMKIT_CHECK(c.contains("function") && c["function"].is_object(), at, ".function: must be an object");
    const json& f = c["function"];
    LLMKIT_CHECK(f.contains("name") && f["name"].is_string(), at, ".function.name: must be a string");
    llmkit::chat::tool_call call;
    call.name = f["name"].get<std::string>();
    if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
    if (f.contains("arguments")) {
      const json& a = f["arguments"];
      LLMKIT_CHECK(a.is_string() || a.is_object(), at, ".function.arguments: must be a JSON string");
      call.arguments = a.is_string() ? a.get<std::string>() : dump(a);
      LLMKIT_CHECK(json::accept(call.arguments.empty() ? std::string("{}") : call.arguments), at,
                   ".function.arguments: is not valid JSON");
    }
    out.tool_calls.push_back(std::move(call));
  }
  return out;
}

ordered_json tool_calls_json(const std::vector<llmkit::chat::tool_call>& calls) {
  ordered_json list = ordered_json::array();
  for (const auto& c : calls) {
    ordered_json f;
    f["name"] = c.name;
    f["arguments"] = c.arguments;
    ordered_json j;
    j["id"] = c.id;
    j["type"] = "function";
    j["function"] = std::move(f);
    list.push_back(std::move(j));
  }
  return list;
}

std::string tool_call_chunk(const response_header& h, std::size_t index,
                            const std::vector<llmkit::chat::tool_call_delta>& calls) {
  ordered_json deltas = ordered_json::array();
  for (const auto& c : calls) {
    ordered_json d;
    d["index"] = c.index;
    ordered_json f;
    if (!c.name.empty()) {
      d["id"] = c.id;
      d["type"] = "function";
      f["name"] = c.name;
    }
    f["arguments"] = c.arguments;
    d["function"] = std::move(f);
    deltas.push_back(std::move(d));
  }
  ordered_json delta;
  delta["tool_calls"] = std::move(deltas);
  ordered_json choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  ordered_json j;
  j["id"] = h.id;
  j["object"] = "chat.completion.chunk";
  j["created"] = h.created;
  j["model"] = h.model;
  j["choices"] = ordered_json::array({std::move(choice)});
  return dump(j);
}

}  // namespace llmkit_server
