// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/harmony_tools.hpp
/// gpt-oss conversations with tools, rendered as gpt-oss's Jinja template
/// renders them (transformers' trim_blocks and lstrip_blocks; the reference
/// is tests/data/harmony-tools-rendered.json, from
/// scripts/harmony-oracle/render-tools.mjs):
///
/// - the system message names the commentary channel for calls
///   (model::harmony_system_message with `functions`);
/// - the developer message holds the system message's text under
///   `# Instructions`, then `# Tools` and the tools as a TypeScript-like
///   namespace: `// DESCRIPTION\ntype NAME = (_: {\n// PARAM DESCRIPTION\nparam?: TYPE, // default: D,\n}) => any;`
///   (`() => any;` without properties), the types derived from each
///   parameter's JSON Schema as the template derives them;
/// - an assistant call as `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`
///   (ARGS as Python's json.dumps writes the arguments object), after its
///   content or its reasoning (`chat_turn::reasoning`, the template's
///   `thinking`) as an analysis message unless a later assistant answer
///   without calls follows (the template keeps a call's reasoning only
///   until the answer it led to);
/// - an answer on the final channel, its reasoning dropped, except a last
///   answer written for training (no generation prompt), whose reasoning
///   precedes it as an analysis message;
/// - a result as `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"R"<|end|>`
///   (R as a JSON string, the template's `tojson`).
///
/// Where the template is lossy or refuses, llmkit is defined instead: a
/// call turn with both content and reasoning (the template raises) writes
/// the reasoning as analysis and the content as a commentary preamble; each
/// call of an assistant turn with several is written as its own message
/// (the template writes only the first); a result names the call its
/// `tool_call_id` answers (the template: the latest call); a tool without
/// a description has no comment line (the template raises).

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/chat/detail/render.hpp"
#include "llmkit/chat/tools.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/chat_template.hpp"

namespace llmkit::chat {

namespace detail {

// Jinja's truth value of a JSON value.
inline bool jinja_true(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v != 0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

inline const json& member(const json& o, const char* key) {
  static const json null_value;
  if (!o.is_object()) return null_value;
  const auto it = o.find(key);
  return it == o.end() ? null_value : *it;
}

// A value as Jinja's string concatenation writes it (strings unquoted).
inline std::string jinja_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return v.dump();
}

// The template's `render_typescript_type` macro. Its whitespace is the
// template's own: a nested object's property types follow "\n" and 16
// spaces, a oneOf variant's default 20 spaces.
inline std::string typescript_type(const json& spec) {
  const json& type = member(spec, "type");
  const bool nullable = jinja_true(member(spec, "nullable"));
  if (type == "array") {
    const json& items = member(spec, "items");
    std::string t;
    if (jinja_true(items)) {
      const json& item_type = member(items, "type");
      if (item_type == "string") t = "string[]";
      else if (item_type == "number" || item_type == "integer") t = "number[]";
      else if (item_type == "boolean") t = "boolean[]";
      else {
        const std::string inner = typescript_type(items);
        // Counted in characters, as Jinja's length is.
        const auto chars = std::count_if(inner.begin(), inner.end(), [](char c) { return (c & 0xC0) != 0x80; });
        t = inner == "object | object" || chars > 50 ? "any[]" : inner + "[]";
      }
    } else {
      t = "any[]";
    }
    return nullable ? t + " | null" : t;
  }
  if (type.is_array() && !type.empty()) {
    std::string t;
    for (std::size_t i = 0; i < type.size(); ++i) t += (i ? " | " : "") + jinja_text(type[i]);
    return t;
  }
  if (const json& one_of = member(spec, "oneOf"); jinja_true(one_of)) {
    // The template's test for object variants sets a variable inside its
    // loop, which Jinja scopes to the loop: every variant is written.
    std::string t;
    const std::size_t n = one_of.is_array() ? one_of.size() : 0;
    for (std::size_t i = 0; i < n; ++i) {
      const json& v = one_of[i];
      t += typescript_type(v);
      if (const json& d = member(v, "description"); jinja_true(d)) t += "// " + jinja_text(d);
      if (v.is_object() && v.contains("default")) t += "                    // default: " + python_json(v["default"]);
      if (i + 1 < n) t += " | \n";
    }
    return t;
  }
  if (type == "string") {
    if (const json& e = member(spec, "enum"); jinja_true(e)) {
      std::string t = "\"";
      for (std::size_t i = 0; i < e.size(); ++i) t += (i ? "\" | \"" : "") + jinja_text(e[i]);
      return t + "\"";
    }
    return nullable ? "string | null" : "string";
  }
  if (type == "number" || type == "integer") return "number";
  if (type == "boolean") return "boolean";
  if (type == "object") {
    const json& props = member(spec, "properties");
    if (!jinja_true(props) || !props.is_object()) return "object";
    const json& required = member(spec, "required");
    std::string t = "{\n";
    std::size_t k = 0;
    for (auto it = props.begin(); it != props.end(); ++it, ++k) {
      const bool req = required.is_array() && std::find(required.begin(), required.end(), it.key()) != required.end();
      t += it.key() + (req ? "" : "?") + ": \n                " + typescript_type(*it);
      if (k + 1 < props.size()) t += ", ";
    }
    return t + "}";
  }
  return "any";
}

}  // namespace detail

/// `[k] tools` as the developer message's namespace block (the template's
/// `render_tool_namespace("functions", tools)`): `## functions\n\nnamespace
/// functions {\n\n` ... `} // namespace functions`.
inline std::string harmony_tool_namespace(std::span<const tool_definition> tools) {
  using detail::jinja_text;
  using detail::jinja_true;
  using detail::member;
  std::string t = "## functions\n\nnamespace functions {\n\n";
  for (const tool_definition& tool : tools) {
    if (const json& d = member(tool.function, "description"); !d.is_null()) t += "// " + jinja_text(d) + "\n";
    t += "type " + tool.name + " = ";
    const json& params = member(tool.function, "parameters");
    const json& props = member(params, "properties");
    if (!jinja_true(params) || !jinja_true(props) || !props.is_object()) {
      t += "() => any;\n\n";
      continue;
    }
    const json& required = member(params, "required");
    t += "(_: {\n";
    for (auto it = props.begin(); it != props.end(); ++it) {
      const json& p = *it;
      if (const json& d = member(p, "description"); jinja_true(d)) t += "// " + jinja_text(d) + "\n";
      const bool req = required.is_array() && std::find(required.begin(), required.end(), it.key()) != required.end();
      t += it.key() + (req ? "" : "?") + ": " + detail::typescript_type(p);
      if (p.is_object() && p.contains("default")) {
        const json& d = p["default"];
        if (jinja_true(member(p, "enum"))) t += ", // default: " + jinja_text(d);
        else if (jinja_true(member(p, "oneOf"))) t += "// default: " + jinja_text(d);
        else t += ", // default: " + python_json(d);
      }
      t += ",\n";
    }
    t += "}) => any;\n\n";
  }
  return t + "} // namespace functions";
}

namespace detail {

/// An assistant message of `channel` holding `text`.
inline void harmony_message(model::formatted_chat& out, std::string_view channel, std::string_view text) {
  markup(out, "<|start|>assistant<|channel|>" + std::string(channel) + "<|message|>");
  content(out, text);
  markup(out, "<|end|>");
}

/// The harmony rendering of `[n] m` with `[k] tools` (see the file comment).
inline void format_harmony_tools(std::span<const chat_turn> m, std::span<const tool_definition> tools,
                                 const model::chat_format_options& o, model::formatted_chat& out) {
  markup(out, model::harmony_system_message(o, !tools.empty()));
  std::size_t first = 0;
  std::string_view instructions;
  if (!m.empty() && m[0].role == "system") {
    instructions = m[0].content;
    first = 1;
  }
  if (!instructions.empty() || !tools.empty()) {
    markup(out, "<|start|>developer<|message|>");
    if (!instructions.empty()) {
      markup(out, "# Instructions\n\n");
      content(out, instructions);
      markup(out, "\n\n");
    }
    if (!tools.empty()) {
      markup(out, "# Tools\n\n");
      content(out, harmony_tool_namespace(tools));
    }
    markup(out, "<|end|>");
  }
  std::vector<const tool_call*> calls;  // the calls so far, for the results' names
  const tool_call* last_call = nullptr;  // reset by an answer, as the template's last_tool_call
  for (std::size_t i = first; i < m.size(); ++i) {
    const chat_turn& msg = m[i];
    if (msg.role == "user") {
      markup(out, "<|start|>user<|message|>");
      content(out, msg.content);
      markup(out, "<|end|>");
    } else if (msg.role == "assistant" && !msg.tool_calls.empty()) {
      const bool answered_later = std::any_of(m.begin() + static_cast<std::ptrdiff_t>(i) + 1, m.end(), [](const chat_turn& t) {
        return t.role == "assistant" && t.tool_calls.empty();
      });
      if (!answered_later) {
        // The template's analysis message before a call: the content, or the reasoning.
        if (!msg.reasoning.empty()) harmony_message(out, "analysis", msg.reasoning);
        if (!msg.content.empty())
          harmony_message(out, msg.reasoning.empty() ? "analysis" : "commentary", msg.content);
      }
      for (std::size_t k = 0; k < msg.tool_calls.size(); ++k) {
        const tool_call& c = msg.tool_calls[k];
        markup(out, "<|start|>assistant to=functions.");
        content(out, c.name);
        markup(out, "<|channel|>commentary json<|message|>");
        content(out, python_json(call_arguments(c, i, k)));
        markup(out, "<|call|>");
        calls.push_back(&c);
        last_call = &c;
      }
    } else if (msg.role == "assistant") {
      // <|return|> ends generation; only a last answer written for training ends with it (and keeps its reasoning).
      const bool training = i + 1 == m.size() && o.prompt == model::generation_prompt::omit;
      if (training && !msg.reasoning.empty()) harmony_message(out, "analysis", msg.reasoning);
      markup(out, "<|start|>assistant<|channel|>final<|message|>");
      content(out, msg.content);
      markup(out, training ? "<|return|>" : "<|end|>");
      last_call = nullptr;
    } else if (msg.role == "tool") {
      const auto it = std::find_if(calls.rbegin(), calls.rend(), [&](const tool_call* c) {
        return !msg.tool_call_id.empty() && c->id == msg.tool_call_id;
      });
      const tool_call* answered = it != calls.rend() ? *it : last_call;
      LLMKIT_CHECK(answered != nullptr, "messages[", i,
                   "]: a tool result needs an earlier assistant tool call (harmony names the function it answers)");
      markup(out, "<|start|>functions.");
      content(out, answered->name);
      markup(out, " to=assistant<|channel|>commentary<|message|>");
      content(out, python_json(json(msg.content)));
      markup(out, "<|end|>");
    }  // a later system message: the template writes nothing
  }
  if (o.prompt == model::generation_prompt::add) markup(out, "<|start|>assistant");
}

}  // namespace detail

}  // namespace llmkit::chat
