// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/chat_template.ipp
/// chat_template's detection and formatters (model/chat_template.hpp):
/// compiled inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/chat_template.hpp"
#include "llmkit/model/detail/python_strip.hpp"
#include "llmkit/model/gguf.hpp"

namespace llmkit::model {

namespace detail {

// Whose text a piece of a formatted chat is.
enum class chat_text_kind : std::uint8_t { markup, content };

// Appends template text (markers, roles, fixed phrases).
inline void append_markup(formatted_chat& out, std::string_view s) { out.text += s; }

// Appends a message's content and records its range.
inline void append_content(formatted_chat& out, std::string_view s) {
  if (s.empty()) return;
  if (!out.contents.empty() && out.contents.back().end() == out.text.size()) out.contents.back().length += s.size();
  else out.contents.push_back({.offset = out.text.size(), .length = s.size()});
  out.text += s;
}

// One piece of text to strip together with its neighbours.
struct chat_piece {
  std::string_view text;
  chat_text_kind kind;
};

// Appends Python's str.strip of the pieces joined (as a template strips
// "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content), each piece keeping
// its kind.
inline void append_stripped(formatted_chat& out, std::initializer_list<chat_piece> pieces) {
  std::string joined;
  for (const auto& p : pieces) joined += p.text;
  const std::string_view kept = python_strip(joined);
  const auto first = static_cast<std::size_t>(kept.data() - joined.data());
  const std::size_t last = first + kept.size();
  std::size_t at = 0;
  for (const auto& p : pieces) {
    const std::size_t begin = std::max(at, first), end = std::min(at + p.text.size(), last);
    at += p.text.size();
    if (begin >= end) continue;
    const std::string_view part = std::string_view(joined).substr(begin, end - begin);
    if (p.kind == chat_text_kind::content) append_content(out, part);
    else append_markup(out, part);
  }
}

}  // namespace detail

LLMKIT_DECL std::string chat_template::names_list() {
  std::string out;
  for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

LLMKIT_DECL chat_template chat_template::by_name(std::string_view name) {
  const auto it = std::find(names.begin(), names.end(), name);
  LLMKIT_CHECK(it != names.end(), "chat_template: no built-in template named '", name, "'; the built-in ones are ",
               names_list());
  return chat_template(static_cast<chat_family>(it - names.begin()));
}

LLMKIT_DECL chat_template chat_template::detect(std::string_view jinja) {
  const auto family = detect_family(jinja);
  LLMKIT_CHECK(family.has_value(), "chat_template: tokenizer.chat_template '", excerpt(jinja),
               "' is not one of the built-in families (", names_list(),
               "); choose one of them by name to format chats for this model");
  return chat_template(*family);
}

LLMKIT_DECL chat_template chat_template::from_gguf(const gguf_file& file, std::string_view name) {
  std::optional<chat_template> t;
  if (!name.empty()) {
    t = by_name(name);
  } else {
    const auto jinja = file.get_optional<std::string_view>("tokenizer.chat_template");
    LLMKIT_CHECK(jinja.has_value(), "chat_template: the model has no tokenizer.chat_template; choose a built-in "
                 "template by name (", names_list(), ")");
    t = detect(*jinja);
  }
  if (!file.contains("tokenizer.ggml.tokens")) return *t;
  const auto tokens = file.get_array("tokenizer.ggml.tokens").strings();
  auto text_of = [&](const char* key) -> std::optional<std::string> {
    const auto id = file.get_optional<std::int64_t>(key);
    if (!id) return std::nullopt;
    LLMKIT_CHECK(*id >= 0 && static_cast<std::uint64_t>(*id) < tokens.size(), "chat_template: ", key, " = ", *id,
                 " is outside the vocabulary of ", tokens.size(), " tokens");
    return std::string(tokens[static_cast<std::size_t>(*id)]);
  };
  auto bos = text_of("tokenizer.ggml.bos_token_id");
  auto eos = text_of("tokenizer.ggml.eos_token_id");
  return t->with_special_texts(bos ? std::move(*bos) : t->bos_, eos ? std::move(*eos) : t->eos_);
}

LLMKIT_DECL formatted_chat chat_template::format_marked(std::span<const chat_message> messages,
                                                     const chat_format_options& options) const {
  LLMKIT_CHECK(!messages.empty(), "chat_template ", name(), ": no messages to format");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    LLMKIT_CHECK(r == "system" || r == "user" || r == "assistant", "chat_template ", name(), ": message ", i,
                 " has role '", r, "'; the roles are system, user and assistant");
  }
  formatted_chat out;
  switch (family_) {
    case chat_family::llama3: format_llama3(messages, options, out); break;
    case chat_family::llama3_1: format_llama3_1(messages, options, out); break;
    case chat_family::chatml: format_chatml(messages, options, {}, out); break;
    case chat_family::qwen2: format_chatml(messages, options, "You are a helpful assistant.", out); break;
    case chat_family::qwen2_5:
      format_chatml(messages, options, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", out);
      break;
    case chat_family::llama2:
    case chat_family::mistral:
    case chat_family::mistral_v1:
    case chat_family::mistral_v3: format_inst(messages, options, out); break;
    case chat_family::zephyr: format_zephyr(messages, options, out); break;
    case chat_family::gemma: format_gemma(messages, options, out); break;
    case chat_family::phi3:
    case chat_family::phi4_mini:
    case chat_family::phi4: format_phi(messages, options, out); break;
    case chat_family::qwen3: format_qwen3(messages, options, out); break;
    case chat_family::harmony: format_harmony(messages, options, out); break;
  }
  return out;
}

LLMKIT_DECL std::optional<chat_family> chat_template::detect_family(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<start_of_turn>")) return chat_family::gemma;
  if (has("<|channel|>") && has("<|start|>")) return chat_family::harmony;
  if (has("<|im_sep|>")) return chat_family::phi4;
  if (has("<|end|>") && has("'<|' + message['role'] + '|>'")) return chat_family::phi4_mini;
  if (has("<|user|>") && has("<|end|>")) return chat_family::phi3;
  if (has("<|im_start|>")) {
    if (has("<think>") && has("enable_thinking")) return chat_family::qwen3;
    if (has("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")) return chat_family::qwen2_5;
    if (has("You are a helpful assistant.")) return chat_family::qwen2;
    return chat_family::chatml;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>"))
    return has("Cutting Knowledge Date") ? chat_family::llama3_1 : chat_family::llama3;
  if (has("[INST]")) {
    if (has("<<SYS>>")) return chat_family::llama2;
    // Mistral's v3 template (tools, system in the last turn, "[INST] " then content then "[/INST]").
    if (has("[AVAILABLE_TOOLS]")) return has("\"[INST] \"") ? std::optional(chat_family::mistral_v3) : std::nullopt;
    if (has("' [INST] '")) return chat_family::mistral_v1;
    if (has("'[INST] ' + message['content'] + ' [/INST]'")) return chat_family::mistral;
    return std::nullopt;
  }
  // Zephyr writes each turn as '<|role|>\n' + content + eos_token; Phi-3 (<|end|>) differs.
  if (has("<|user|>") && has("<|assistant|>") && has("eos_token") && !has("<|end|>")) return chat_family::zephyr;
  return std::nullopt;
}

LLMKIT_DECL std::string chat_template::excerpt(std::string_view t) {
  std::size_t n = std::min<std::size_t>(t.size(), 60);
  while (n > 0 && n < t.size() && (static_cast<unsigned char>(t[n]) & 0xC0) == 0x80) --n;
  std::string out;
  for (char c : t.substr(0, n)) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return n < t.size() ? out + "..." : out;
}

LLMKIT_DECL void chat_template::write_leading_bos(const chat_format_options& o, formatted_chat& out) const {
  if (o.bos == leading_bos::write) detail::append_markup(out, bos_);
}

LLMKIT_DECL void chat_template::format_llama3(std::span<const chat_message> m, const chat_format_options& o,
                                              formatted_chat& out) const {
  using namespace detail;
  write_leading_bos(o, out);
  for (const auto& msg : m) {
    append_markup(out, "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n");
    append_content(out, python_strip(msg.content));
    append_markup(out, "<|eot_id|>");
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

LLMKIT_DECL void chat_template::format_llama3_1(std::span<const chat_message> m, const chat_format_options& o,
                                                formatted_chat& out) const {
  using namespace detail;
  write_leading_bos(o, out);
  std::string_view system;
  if (m.front().role == "system") {
    system = python_strip(m.front().content);
    m = m.subspan(1);
  }
  append_markup(out, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
  append_markup(out, o.date);
  append_markup(out, "\n\n");
  append_content(out, system);
  append_markup(out, "<|eot_id|>");
  for (const auto& msg : m) {
    append_markup(out, "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n");
    append_content(out, python_strip(msg.content));
    append_markup(out, "<|eot_id|>");
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

LLMKIT_DECL void chat_template::format_chatml(std::span<const chat_message> m, const chat_format_options& o,
                                              std::string_view default_system, formatted_chat& out) {
  using namespace detail;
  if (!default_system.empty() && m.front().role != "system")
    append_markup(out, "<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n");
  for (const auto& msg : m) {
    append_markup(out, "<|im_start|>" + msg.role + "\n");
    append_content(out, msg.content);
    append_markup(out, "<|im_end|>\n");
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<|im_start|>assistant\n");
}

LLMKIT_DECL void chat_template::format_zephyr(std::span<const chat_message> m, const chat_format_options& o,
                                              formatted_chat& out) const {
  using namespace detail;
  for (const auto& msg : m) {
    append_markup(out, "<|" + msg.role + "|>\n");
    append_content(out, msg.content);
    append_markup(out, eos_ + "\n");
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<|assistant|>\n");
}

LLMKIT_DECL void chat_template::format_inst(std::span<const chat_message> m, const chat_format_options& o,
                                            formatted_chat& out) const {
  using namespace detail;
  std::optional<std::string_view> system;
  if (m.front().role == "system") {
    system = m.front().content;
    m = m.subspan(1);
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    LLMKIT_CHECK(m[i].role != "system", "chat_template ", name(), ": message ", i + (system ? 1 : 0),
                 " is a system message; only the first message may be one");
    const bool user = m[i].role == "user";
    LLMKIT_CHECK(user == (i % 2 == 0), "chat_template ", name(), ": after the optional system message the roles must "
                 "alternate user / assistant / user / ..., but message ", i + (system ? 1 : 0), " is '", m[i].role,
                 "'");
  }
  const std::string_view sys = system ? *system : std::string_view();
  if (family_ != chat_family::llama2) write_leading_bos(o, out);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::string_view content = m[i].content;
    const bool user = m[i].role == "user";
    // The system message goes into the first user turn (the last for mistral-v3).
    const bool with_system = system && (family_ == chat_family::mistral_v3 ? i + 1 == m.size() : i == 0);
    switch (family_) {
      case chat_family::llama2:
        if (user) {
          if (i > 0 || o.bos == leading_bos::write) append_markup(out, bos_);
          append_markup(out, "[INST] ");
          if (with_system)
            append_stripped(out, {{"<<SYS>>\n", chat_text_kind::markup},
                                  {sys, chat_text_kind::content},
                                  {"\n<</SYS>>\n\n", chat_text_kind::markup},
                                  {content, chat_text_kind::content}});
          else
            append_content(out, python_strip(content));
          append_markup(out, " [/INST]");
        } else {
          append_markup(out, " ");
          append_content(out, python_strip(content));
          append_markup(out, " " + eos_);
        }
        break;
      case chat_family::mistral:
      case chat_family::mistral_v1:
        if (user) {
          append_markup(out, family_ == chat_family::mistral ? "[INST] " : " [INST] ");
          if (with_system) {
            append_content(out, sys);
            append_markup(out, "\n\n");
          }
          append_content(out, content);
          append_markup(out, " [/INST]");
        } else {
          if (family_ == chat_family::mistral_v1) append_markup(out, " ");
          append_content(out, content);
          append_markup(out, eos_);
        }
        break;
      default:  // mistral_v3: the system message joins the last turn, when that is a user turn
        if (user) {
          append_markup(out, "[INST] ");
          if (with_system) {
            append_content(out, sys);
            append_markup(out, "\n\n");
          }
          append_content(out, content);
          append_markup(out, "[/INST]");
        } else {
          append_markup(out, " ");
          append_content(out, python_strip(content));
          append_markup(out, eos_);
        }
        break;
    }
  }
}

LLMKIT_DECL reasoning_split split_reasoning(std::string_view text) {
  auto strip_newlines = [](std::string_view s, bool front, bool back) {
    while (front && !s.empty() && s.front() == '\n') s.remove_prefix(1);
    while (back && !s.empty() && s.back() == '\n') s.remove_suffix(1);
    return s;
  };
  const std::size_t close = text.find("</think>");
  if (close == std::string_view::npos) {
    const std::string_view t = strip_newlines(text, true, false);
    if (t.starts_with("<think>")) return {.reasoning = strip_newlines(t.substr(7), true, true), .content = {}};
    return {.reasoning = {}, .content = text};
  }
  std::string_view reasoning = text.substr(0, close);
  if (const std::size_t open = reasoning.rfind("<think>"); open != std::string_view::npos)
    reasoning = reasoning.substr(open + 7);
  const std::size_t after = text.rfind("</think>") + 8;
  return {.reasoning = strip_newlines(reasoning, true, true), .content = strip_newlines(text.substr(after), true, false)};
}

LLMKIT_DECL void chat_template::format_gemma(std::span<const chat_message> m, const chat_format_options& o,
                                             formatted_chat& out) const {
  using namespace detail;
  std::optional<std::string_view> system;
  if (m.front().role == "system") {
    system = m.front().content;
    m = m.subspan(1);
  }
  for (std::size_t i = 0; i < m.size(); ++i)
    LLMKIT_CHECK((m[i].role == "user") == (i % 2 == 0) && m[i].role != "system", "chat_template gemma: after the "
                 "optional system message the roles must alternate user / assistant / user / ..., but message ",
                 i + (system ? 1 : 0), " is '", m[i].role, "'");
  write_leading_bos(o, out);
  for (std::size_t i = 0; i < m.size(); ++i) {
    append_markup(out, m[i].role == "assistant" ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
    if (i == 0 && system) {  // not trimmed: the template adds it before the trimmed content
      append_content(out, *system);
      append_markup(out, "\n\n");
    }
    append_content(out, python_strip(m[i].content));
    append_markup(out, "<end_of_turn>\n");
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<start_of_turn>model\n");
}

LLMKIT_DECL void chat_template::format_phi(std::span<const chat_message> m, const chat_format_options& o,
                                           formatted_chat& out) const {
  using namespace detail;
  for (const auto& msg : m) {
    switch (family_) {
      case chat_family::phi3:
        if (msg.role == "system" && msg.content.empty()) continue;
        append_markup(out, "<|" + msg.role + "|>\n");
        append_content(out, msg.content);
        append_markup(out, "<|end|>\n");
        break;
      case chat_family::phi4_mini:
        append_markup(out, "<|" + msg.role + "|>");
        append_content(out, msg.content);
        append_markup(out, "<|end|>");
        break;
      default:  // phi4
        append_markup(out, "<|im_start|>" + msg.role + "<|im_sep|>");
        append_content(out, msg.content);
        append_markup(out, "<|im_end|>");
        break;
    }
  }
  const bool add = o.prompt == generation_prompt::add;
  switch (family_) {
    case chat_family::phi3: append_markup(out, add ? std::string("<|assistant|>\n") : eos_); break;
    case chat_family::phi4_mini: append_markup(out, add ? std::string("<|assistant|>") : eos_); break;
    default:
      if (add) append_markup(out, "<|im_start|>assistant<|im_sep|>");
      break;
  }
}

LLMKIT_DECL void chat_template::format_qwen3(std::span<const chat_message> m, const chat_format_options& o,
                                             formatted_chat& out) {
  using namespace detail;
  // Answers after the last user message keep their reasoning; earlier ones lose it.
  std::size_t last_query = m.size() - 1;
  for (std::size_t i = m.size(); i-- > 0;)
    if (m[i].role == "user" &&
        !(m[i].content.starts_with("<tool_response>") && m[i].content.ends_with("</tool_response>"))) {
      last_query = i;
      break;
    }
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role != "assistant") {
      append_markup(out, "<|im_start|>" + msg.role + "\n");
      append_content(out, msg.content);
      append_markup(out, "<|im_end|>\n");
      continue;
    }
    std::string_view content = msg.content, reasoning;
    if (content.find("</think>") != std::string_view::npos) {
      const std::size_t close = content.find("</think>");
      reasoning = content.substr(0, close);
      if (const std::size_t open = reasoning.rfind("<think>"); open != std::string_view::npos)
        reasoning = reasoning.substr(open + 7);
      while (!reasoning.empty() && reasoning.back() == '\n') reasoning.remove_suffix(1);
      while (!reasoning.empty() && reasoning.front() == '\n') reasoning.remove_prefix(1);
      content = content.substr(content.rfind("</think>") + 8);
      while (!content.empty() && content.front() == '\n') content.remove_prefix(1);
    }
    append_markup(out, "<|im_start|>assistant\n");
    if (i > last_query && (i + 1 == m.size() || !reasoning.empty())) {
      append_markup(out, "<think>\n");
      append_content(out, reasoning);
      append_markup(out, "\n</think>\n\n");
    }
    append_content(out, content);
    append_markup(out, "<|im_end|>\n");
  }
  if (o.prompt == generation_prompt::add) {
    append_markup(out, "<|im_start|>assistant\n");
    if (!o.enable_thinking) append_markup(out, "<think>\n\n</think>\n\n");
  }
}

LLMKIT_DECL std::string harmony_system_message(const chat_format_options& o, bool functions) {
  const std::string_view effort = o.reasoning_effort;
  LLMKIT_CHECK(effort == "low" || effort == "medium" || effort == "high",
               "chat_template harmony: reasoning_effort is '", effort, "'; it is low, medium or high");
  const std::string_view d = o.current_date;
  const auto digits = [&](std::size_t from, std::size_t n) {
    return std::all_of(d.begin() + static_cast<std::ptrdiff_t>(from), d.begin() + static_cast<std::ptrdiff_t>(from + n),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  LLMKIT_CHECK(d.empty() || (d.size() == 10 && digits(0, 4) && d[4] == '-' && digits(5, 2) && d[7] == '-' && digits(8, 2)),
               "chat_template harmony: current_date is '", d, "'; it is YYYY-MM-DD (or empty for today)");
  std::string date(d);
  if (date.empty()) {
    const std::chrono::year_month_day today{std::chrono::floor<std::chrono::days>(std::chrono::system_clock::now())};
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04d-%02u-%02u", static_cast<int>(today.year()),
                  static_cast<unsigned>(today.month()), static_cast<unsigned>(today.day()));
    date = buf;
  }
  return "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
         "Knowledge cutoff: 2024-06\nCurrent date: " + date + "\n\nReasoning: " + std::string(effort) +
         "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message." +
         (functions ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "") + "<|end|>";
}

LLMKIT_DECL void chat_template::format_harmony(std::span<const chat_message> m, const chat_format_options& o,
                                               formatted_chat& out) {
  using namespace detail;
  append_markup(out, harmony_system_message(o));
  std::size_t first = 0;
  if (m.front().role == "system") {
    first = 1;
    if (!m.front().content.empty()) {
      append_markup(out, "<|start|>developer<|message|># Instructions\n\n");
      append_content(out, m.front().content);
      append_markup(out, "\n\n<|end|>");
    }
  }
  for (std::size_t i = first; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role == "user") {
      append_markup(out, "<|start|>user<|message|>");
      append_content(out, msg.content);
      append_markup(out, "<|end|>");
    } else if (msg.role == "assistant") {
      append_markup(out, "<|start|>assistant<|channel|>final<|message|>");
      append_content(out, msg.content);
      // <|return|> ends generation; only a last answer written for training ends with it.
      append_markup(out, i + 1 == m.size() && o.prompt == generation_prompt::omit ? "<|return|>" : "<|end|>");
    }  // a later system message: the template writes nothing
  }
  if (o.prompt == generation_prompt::add) append_markup(out, "<|start|>assistant");
}

LLMKIT_DECL reasoning_split split_harmony(std::string_view text) {
  // The body of the message on `channel`: after its <|message|>, up to its <|end|>, <|return|>, <|call|> or the end.
  const auto message = [&](std::string_view channel) -> std::optional<std::string_view> {
    const std::string marker = "<|channel|>" + std::string(channel) + "<|message|>";
    const std::size_t at = text.find(marker);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view body = text.substr(at + marker.size());
    std::size_t end = body.size();
    for (std::string_view stop : {"<|end|>", "<|return|>", "<|call|>"}) end = std::min(end, body.find(stop));
    return body.substr(0, end);
  };
  if (text.find("<|channel|>") == std::string_view::npos) return {.reasoning = {}, .content = text};
  return {.reasoning = message("analysis").value_or(std::string_view{}),
          .content = message("final").value_or(std::string_view{})};
}

}  // namespace llmkit::model
