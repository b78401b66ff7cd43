// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/detail/render.hpp
/// What the tool-aware templates share: JSON as Python's json.dumps writes
/// it, and writing a prompt's markup and content (formatted_chat).

#include <cstddef>
#include <string>
#include <string_view>

#include "llmkit/chat/tools.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/chat_template.hpp"

namespace llmkit::chat {

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it;
/// `indent` > 0 as `json.dumps(value, indent=indent)` (separators `,` and
/// `: `, one element per line).
inline std::string python_json(const json& value, int indent = 0, int depth = 0) {
  const bool container = value.is_object() || value.is_array();
  if (!container) return value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (value.empty()) return value.is_object() ? "{}" : "[]";
  const std::string nl = indent > 0 ? "\n" + std::string(static_cast<std::size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close_nl = indent > 0 ? "\n" + std::string(static_cast<std::size_t>(indent * depth), ' ') : "";
  const std::string sep = indent > 0 ? "," : ", ";
  std::string out(1, value.is_object() ? '{' : '[');
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    out += first ? "" : sep;
    out += nl;
    first = false;
    if (value.is_object()) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ": ";
    out += python_json(*it, indent, depth + 1);
  }
  return out + close_nl + (value.is_object() ? '}' : ']');
}

namespace detail {

inline void markup(model::formatted_chat& out, std::string_view s) { out.text += s; }
inline void content(model::formatted_chat& out, std::string_view s) {
  if (s.empty()) return;
  if (!out.contents.empty() && out.contents.back().end() == out.text.size()) out.contents.back().length += s.size();
  else out.contents.push_back({.offset = out.text.size(), .length = s.size()});
  out.text += s;
}

// A call's arguments as the JSON value the templates render.
inline json call_arguments(const tool_call& c, std::size_t turn, std::size_t index) {
  try {
    return json::parse(c.arguments.empty() ? std::string_view("{}") : std::string_view(c.arguments));
  } catch (const json::exception&) {
    ::llmkit::detail::throw_error("messages[", turn, "].tool_calls[", index, "].function.arguments: not valid JSON");
  }
}

}  // namespace detail

}  // namespace llmkit::chat
