// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/tool_template.hpp
/// Conversations with tools rendered as each family's reference template
/// renders them under Hugging Face transformers (as llama.cpp's Jinja engine
/// does too): the tool definitions, assistant turns with `tool_calls` and
/// `tool` results.
///
/// - hermes (chatml, qwen2, qwen2.5, qwen3): a system turn holding the
///   system message (qwen2.5: or its default), then `# Tools` and the tools
///   one JSON per line inside `<tools></tools>`, and the instruction to
///   answer with `<tool_call>` blocks; an assistant turn's calls follow its
///   content as `\n<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`
///   (qwen3: no newline before the first call when the content is empty);
///   consecutive tool results share one `user` turn as
///   `\n<tool_response>\nR\n</tool_response>`. Qwen3 answers after the
///   last user query open with `<think>\nR\n</think>\n\n` (R: the turn's
///   reasoning, or its text before `</think>`; the last answer always),
///   earlier ones lose their reasoning, as the template writes them.
/// - llama3.1: "Environment: ipython" in the system block, the tools (JSON
///   indented by 4) in the first user message after Meta's instruction; a
///   call as `{"name": N, "parameters": A}` (one per turn, as the template
///   requires); a result as an `ipython` turn holding the content as a JSON
///   string (the template's `tojson` of a string).
/// - mistral-v3: `[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]` before the last
///   user turn, the system message in that turn only when it ends the
///   conversation (as the template's `loop.last`); calls as `[TOOL_CALLS] [{"name": N, "arguments": A, "id":
///   I}]</s>`; results as `[TOOL_RESULTS] {"content": R, "call_id":
///   I}[/TOOL_RESULTS]`; call ids must be 9 letters or digits.
/// - harmony (gpt-oss): the tools as a TypeScript namespace in the
///   developer message, calls and results on the commentary channel
///   (harmony_tools.hpp).
///
/// JSON is written as Python's `json.dumps` writes it (`", "` and `": "`
/// separators, UTF-8 unescaped), since that is what the templates' `tojson`
/// produced for training. Call arguments are parsed and re-serialized that
/// way. Message contents, tool definitions and call JSON are marked as
/// content (`formatted_chat::contents`): only the template's own markers
/// become control tokens.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/chat/detail/render.hpp"
#include "llmkit/chat/harmony_tools.hpp"
#include "llmkit/chat/tools.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/chat_template.hpp"
#include "llmkit/model/detail/python_strip.hpp"

namespace llmkit::chat {

namespace detail {

inline void check_roles(std::span<const chat_turn> turns) {
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const auto& r = turns[i].role;
    LLMKIT_CHECK(r == "system" || r == "user" || r == "assistant" || r == "tool", "messages[", i, "].role: '",
                 r.substr(0, 32), "' is not system, user, assistant or tool");
    LLMKIT_CHECK(r == "assistant" || turns[i].tool_calls.empty(), "messages[", i,
                 "]: only assistant messages carry tool_calls");
    LLMKIT_CHECK(r == "assistant" || turns[i].reasoning.empty(), "messages[", i,
                 "]: only assistant messages carry reasoning");
  }
}

/// Index of qwen3's last user query: the last user turn that is not a
/// wrapped tool response (the template's `ns.last_query_index`), or the
/// last turn when there is none. Answers after it keep their reasoning.
inline std::size_t qwen3_last_query(std::span<const chat_turn> m) {
  for (std::size_t i = m.size(); i-- > 0;)
    if (m[i].role == "user" &&
        !(m[i].content.starts_with("<tool_response>") && m[i].content.ends_with("</tool_response>")))
      return i;
  return m.empty() ? 0 : m.size() - 1;
}

/// A qwen3 answer's reasoning and content as its template takes them: the
/// turn's reasoning when given (the content then unsplit), else the
/// content split at `</think>` when it has one.
inline model::reasoning_split qwen3_answer(const chat_turn& msg) {
  if (!msg.reasoning.empty()) return {.reasoning = msg.reasoning, .content = msg.content};
  if (msg.content.find("</think>") == std::string::npos) return {.reasoning = {}, .content = msg.content};
  return model::split_reasoning(msg.content);
}

inline void format_hermes(const model::chat_template& t, std::span<const chat_turn> m,
                          std::span<const tool_definition> tools, const model::chat_format_options& o,
                          model::formatted_chat& out) {
  using model::chat_family;
  const bool qwen3 = t.family() == chat_family::qwen3;
  const std::size_t last_query = qwen3 ? qwen3_last_query(m) : 0;
  std::size_t first = 0;
  std::string_view default_system;
  if (t.family() == chat_family::qwen2_5) default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  if (t.family() == chat_family::qwen2) default_system = "You are a helpful assistant.";
  if (!tools.empty()) {
    markup(out, "<|im_start|>system\n");
    if (!m.empty() && m[0].role == "system") {
      content(out, m[0].content);
      markup(out, "\n\n");
      first = 1;
    } else if (!default_system.empty()) {
      markup(out, default_system);
      markup(out, "\n\n");
    }
    markup(out,
           "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
           "function signatures within <tools></tools> XML tags:\n<tools>");
    for (const auto& tool : tools) {
      markup(out, "\n");
      content(out, python_json(json{{"type", "function"}, {"function", tool.function}}));
    }
    markup(out,
           "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (!default_system.empty() && (m.empty() || m[0].role != "system")) {
    markup(out, "<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n");
  }
  for (std::size_t i = first; i < m.size(); ++i) {
    const chat_turn& msg = m[i];
    if (msg.role == "tool") {
      if (i == 0 || m[i - 1].role != "tool") markup(out, "<|im_start|>user");
      markup(out, "\n<tool_response>\n");
      content(out, msg.content);
      markup(out, "\n</tool_response>");
      if (i + 1 == m.size() || m[i + 1].role != "tool") markup(out, "<|im_end|>\n");
      continue;
    }
    std::string_view text = msg.content, shown = msg.content;  // shown: what is written of the text
    if (qwen3 && msg.role == "assistant") {
      const model::reasoning_split a = qwen3_answer(msg);
      text = shown = a.content;
      markup(out, "<|im_start|>assistant\n");
      // The template's think block: the current turn's answers (after the last query) keep their reasoning.
      if (i > last_query && (i + 1 == m.size() || !a.reasoning.empty())) {
        std::string_view r = a.reasoning;
        while (!r.empty() && r.front() == '\n') r.remove_prefix(1);
        while (!r.empty() && r.back() == '\n') r.remove_suffix(1);
        while (!shown.empty() && shown.front() == '\n') shown.remove_prefix(1);
        markup(out, "<think>\n");
        content(out, r);
        markup(out, "\n</think>\n\n");
      }
    } else if (msg.role != "assistant" || msg.tool_calls.empty()) {
      markup(out, "<|im_start|>" + msg.role + "\n");
    } else {
      markup(out, "<|im_start|>assistant");
    }
    if (msg.role != "assistant" || msg.tool_calls.empty()) {
      content(out, shown);
      markup(out, "<|im_end|>\n");
      continue;
    }
    if (!text.empty()) {
      if (!qwen3) markup(out, "\n");
      content(out, shown);
    }
    for (std::size_t k = 0; k < msg.tool_calls.size(); ++k) {
      const tool_call& c = msg.tool_calls[k];
      if (!qwen3 || k > 0 || !text.empty()) markup(out, "\n");
      markup(out, "<tool_call>\n");
      content(out, "{\"name\": \"" + c.name + "\", \"arguments\": " + python_json(call_arguments(c, i, k)) + "}");
      markup(out, "\n</tool_call>");
    }
    markup(out, "<|im_end|>\n");
  }
  if (o.prompt == model::generation_prompt::add) {
    markup(out, "<|im_start|>assistant\n");
    if (qwen3 && !o.enable_thinking) markup(out, "<think>\n\n</think>\n\n");
  }
}

/// The leading system message of a conversation (empty when its first turn
/// is not one) and the index of the turn after it.
struct leading_system {
  std::string_view system;
  std::size_t first = 0;
};

/// Writes the BOS when `o` asks for it and splits off `[n] m`'s leading
/// system message, which llama3.1 and mistral-v3 place elsewhere.
inline leading_system begin_conversation(const model::chat_template& t, std::span<const chat_turn> m,
                                         const model::chat_format_options& o, model::formatted_chat& out) {
  if (o.bos == model::leading_bos::write) markup(out, t.bos_text());
  if (!m.empty() && m[0].role == "system") return {m[0].content, 1};
  return {};
}

inline void format_llama3_1(const model::chat_template& t, std::span<const chat_turn> m,
                            std::span<const tool_definition> tools, const model::chat_format_options& o,
                            model::formatted_chat& out) {
  using model::detail::python_strip;
  auto [system, first] = begin_conversation(t, m, o, out);
  system = python_strip(system);
  markup(out, "<|start_header_id|>system<|end_header_id|>\n\n");
  if (!tools.empty()) markup(out, "Environment: ipython\n");
  markup(out, "Cutting Knowledge Date: December 2023\nToday Date: " + std::string(o.date) + "\n\n");
  content(out, system);
  markup(out, "<|eot_id|>");
  if (!tools.empty()) {
    LLMKIT_CHECK(first < m.size() && m[first].role == "user", "messages: llama3.1 writes the tools into the first "
                 "user message, and there is none where the conversation starts");
    markup(out, "<|start_header_id|>user<|end_header_id|>\n\n");
    markup(out,
           "Given the following functions, please respond with a JSON for a function call with its proper "
           "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
           "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
    for (const auto& tool : tools) {
      content(out, python_json(json{{"type", "function"}, {"function", tool.function}}, 4));
      markup(out, "\n\n");
    }
    content(out, python_strip(m[first].content));
    markup(out, "<|eot_id|>");
    ++first;
  }
  for (std::size_t i = first; i < m.size(); ++i) {
    const chat_turn& msg = m[i];
    if (msg.role == "tool") {
      markup(out, "<|start_header_id|>ipython<|end_header_id|>\n\n");
      content(out, python_json(json(msg.content)));
      markup(out, "<|eot_id|>");
    } else if (!msg.tool_calls.empty()) {
      LLMKIT_CHECK(msg.tool_calls.size() == 1, "messages[", i, "].tool_calls: llama3.1 takes one call per turn, got ",
                   msg.tool_calls.size());
      const tool_call& c = msg.tool_calls[0];
      markup(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
      content(out, "{\"name\": \"" + c.name + "\", \"parameters\": " + python_json(call_arguments(c, i, 0)) + "}");
      markup(out, "<|eot_id|>");
    } else {
      markup(out, "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n");
      content(out, python_strip(msg.content));
      markup(out, "<|eot_id|>");
    }
  }
  if (o.prompt == model::generation_prompt::add) markup(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

inline void check_mistral_id(std::string_view id, std::size_t turn, std::string_view field) {
  bool ok = id.size() == 9;
  for (const char c : id) ok = ok && std::isalnum(static_cast<unsigned char>(c));
  LLMKIT_CHECK(ok, "messages[", turn, "].", field, ": mistral-v3 needs call ids of 9 letters or digits, got '",
               id.substr(0, 32), "'");
}

inline void format_mistral_v3(const model::chat_template& t, std::span<const chat_turn> m,
                              std::span<const tool_definition> tools, const model::chat_format_options& o,
                              model::formatted_chat& out) {
  using model::detail::python_strip;
  const auto [system, first] = begin_conversation(t, m, o, out);
  std::size_t last_user = m.size();
  for (std::size_t i = first; i < m.size(); ++i)
    if (m[i].role == "user") last_user = i;
  for (std::size_t i = first; i < m.size(); ++i) {
    const chat_turn& msg = m[i];
    if (msg.role == "user") {
      if (!tools.empty() && i == last_user) {
        markup(out, "[AVAILABLE_TOOLS] [");
        for (std::size_t k = 0; k < tools.size(); ++k) {
          std::string s = "{\"type\": \"function\", \"function\": {";
          bool first_key = true;
          for (auto it = tools[k].function.begin(); it != tools[k].function.end(); ++it) {
            if (it.key() == "return") continue;
            s += first_key ? "" : ", ";
            first_key = false;
            // The template writes string values between quotes unescaped.
            s += '"';
            s += it.key();
            s += "\": ";
            if (it->is_string()) {
              s += '"';
              s += it->get_ref<const std::string&>();
              s += '"';
            } else {
              s += python_json(*it);
            }
          }
          content(out, s + "}}");
          markup(out, k + 1 < tools.size() ? ", " : "]");
        }
        markup(out, "[/AVAILABLE_TOOLS]");
      }
      markup(out, "[INST] ");
      if (i + 1 == m.size() && first == 1) {
        content(out, system);
        markup(out, "\n\n");
      }
      content(out, msg.content);
      markup(out, "[/INST]");
    } else if (msg.role == "assistant" && !msg.tool_calls.empty()) {
      markup(out, "[TOOL_CALLS] [");
      for (std::size_t k = 0; k < msg.tool_calls.size(); ++k) {
        const tool_call& c = msg.tool_calls[k];
        check_mistral_id(c.id, i, "tool_calls[" + std::to_string(k) + "].id");
        content(out, "{\"name\": " + python_json(json(c.name)) + ", \"arguments\": " +
                         python_json(call_arguments(c, i, k)) + ", \"id\": \"" + c.id + "\"}");
        markup(out, k + 1 < msg.tool_calls.size() ? ", " : "]");
      }
      markup(out, t.eos_text());
    } else if (msg.role == "assistant") {
      markup(out, " ");
      content(out, python_strip(msg.content));
      markup(out, t.eos_text());
    } else if (msg.role == "tool") {
      check_mistral_id(msg.tool_call_id, i, "tool_call_id");
      markup(out, "[TOOL_RESULTS] {\"content\": ");
      content(out, msg.content);
      markup(out, ", \"call_id\": \"" + msg.tool_call_id + "\"}[/TOOL_RESULTS]");
    } else {
      ::llmkit::detail::throw_error("messages[", i, "]: mistral-v3 takes a system message only first");
    }
  }
}

}  // namespace detail

/// The prompt for `[n] turns` with `[k] tools` offered (k may be 0: the
/// conversation may still hold calls and results), in `tmpl`'s family (see
/// the file comment). A conversation without tools, calls or results is
/// rendered by `tmpl.format_marked` unchanged.
/// @throws llmkit::error if the family has no tool format (tool_syntax_of),
/// a role is unknown, a call's arguments are not JSON, or the family's
/// template refuses the conversation (llama3.1: several calls in a turn;
/// mistral-v3: call ids not of 9 letters or digits).
inline model::formatted_chat format_with_tools(const model::chat_template& tmpl, std::span<const chat_turn> turns,
                                               std::span<const tool_definition> tools,
                                               const model::chat_format_options& options = {}) {
  detail::check_roles(turns);
  // qwen3 and harmony may keep an answer's reasoning, which the plain templates' messages do not carry.
  const bool keeps_reasoning =
      tmpl.family() == model::chat_family::qwen3 || tmpl.family() == model::chat_family::harmony;
  bool plain = tools.empty();
  for (const auto& t : turns)
    plain = plain && t.role != "tool" && t.tool_calls.empty() && (t.reasoning.empty() || !keeps_reasoning);
  if (plain) {
    std::vector<model::chat_message> messages;
    for (const auto& t : turns) messages.push_back({t.role, t.content});
    return tmpl.format_marked(messages, options);
  }
  const auto syntax = tool_syntax_of(tmpl.family());
  LLMKIT_CHECK(syntax.has_value(), "chat template '", tmpl.name(),
               "' has no tool-call format (the ones with tools: chatml, qwen2, qwen2.5, qwen3, llama3.1, mistral-v3, "
               "harmony)");
  model::formatted_chat out;
  switch (*syntax) {
    case tool_syntax::hermes: detail::format_hermes(tmpl, turns, tools, options, out); break;
    case tool_syntax::llama3_json: detail::format_llama3_1(tmpl, turns, tools, options, out); break;
    case tool_syntax::mistral: detail::format_mistral_v3(tmpl, turns, tools, options, out); break;
    case tool_syntax::harmony: detail::format_harmony_tools(turns, tools, options, out); break;
  }
  return out;
}

}  // namespace llmkit::chat
