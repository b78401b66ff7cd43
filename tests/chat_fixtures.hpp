// SPDX-License-Identifier: MIT
#pragma once

// Tool definitions shared by the chat tests and bench_chat.

namespace llmkit::test {

/// Five tools of varied shapes (enums, nested objects, arrays, integer
/// bounds, $defs), as an OpenAI `tools` array.
inline constexpr const char* five_tools_json = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
     "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["a", "b"]}}},
  {"type": "function", "function": {"name": "send_mail", "parameters": {"type": "object",
     "properties": {"to": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 2},
       "urgent": {"type": "boolean"}}, "required": ["to", "urgent"]}}},
  {"type": "function", "function": {"name": "move", "parameters": {"type": "object",
     "properties": {"to": {"$ref": "#/$defs/point"}}, "required": ["to"],
     "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
       "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"]}}}}},
  {"type": "function", "function": {"name": "ping"}}
])";

}  // namespace llmkit::test
