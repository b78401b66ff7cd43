// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/chat_template.hpp
/// Chat templates: a conversation (system / user / assistant messages) turned
/// into the prompt text a chat model was trained on.
///
/// GGUF files carry their template as Jinja source in
/// `tokenizer.chat_template`. llmkit runs no Jinja: like llama.cpp, it
/// recognises the template's family by distinctive substrings and formats
/// with a built-in formatter that writes what the family's reference
/// template renders under Hugging Face transformers (trim_blocks,
/// lstrip_blocks), byte for byte. Families:
///
/// - `llama3` (Llama 3): `<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>`
///   per message, then `<|start_header_id|>assistant<|end_header_id|>\n\n`;
/// - `llama3.1` (Llama 3.1 / 3.2 / 3.3): as llama3 after a system block that
///   is always written and opens with "Cutting Knowledge Date: December
///   2023\nToday Date: 26 Jul 2024\n\n";
/// - `chatml` (OpenHermes, Dolphin, ...): `<|im_start|>user\nHi<|im_end|>\n`
///   per message, then `<|im_start|>assistant\n`;
/// - `qwen2`, `qwen2.5`: chatml with a default system message ("You are a
///   helpful assistant." / "You are Qwen, created by Alibaba Cloud. You are a
///   helpful assistant.") when the conversation has none;
/// - `llama2` (Llama 2 chat): `<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]`,
///   answers ` A </s>`, later turns `<s>[INST] ...`;
/// - `mistral` (Mistral 7B Instruct v0.1 / v0.2 and Mixtral 8x7B, original
///   template): `<s>[INST] Hi [/INST]`, answers `A</s>`;
/// - `mistral-v1` (the same models, Mistral's later template):
///   `<s> [INST] S\n\nHi [/INST]`, answers ` A</s>`;
/// - `mistral-v3` (Mistral 7B Instruct v0.3): `<s>[INST] S\n\nHi[/INST]`, the
///   system message in the *last* user turn, answers ` A</s>`;
/// - `zephyr` (Zephyr, TinyLlama chat):
///   `<|system|>\nS</s>\n<|user|>\nHi</s>\n<|assistant|>\n`.
///
/// Content is written as given, except where the reference template trims
/// it (Python `str.strip`): every message of llama3/llama3.1, Llama 2's turns,
/// Mistral v3's answers. Roles are `system`, `user` and `assistant`. The
/// Llama 2 and Mistral templates take one optional system message first and
/// then strictly alternating user / assistant turns starting with user
/// (their Jinja raises otherwise, and so does `format`); the original
/// `mistral` template has no system role, so llmkit puts a system message
/// in the first user turn as `S\n\nHi`, as Mistral's later v1 template does.
/// These families have no assistant prefix: the prompt already ends with
/// `[/INST]`, and `generation_prompt` changes nothing.
///
/// **BOS.** The token id for BOS comes from the tokenizer
/// (`tokenizer::encode(text, {.add_bos = true})`), never from text: `format`
/// leaves out the BOS the template writes first (`leading_bos::omit`, the
/// default), so `encode(format(messages), {.add_bos = true, .parse_special =
/// true})` has exactly one BOS. `leading_bos::write` renders the template's
/// own BOS text, for comparing with a Jinja rendering or for encoding with
/// `parse_special` and add_bos off. BOS and EOS texts the template writes in
/// the middle (Llama 2's `<s>[INST]` of later turns, every `</s>`) are kept
/// as text: they become their control tokens when encoded with
/// `encode_options::parse_special`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "llmkit/core/error.hpp"
#include "llmkit/model/detail/python_strip.hpp"
#include "llmkit/model/gguf.hpp"

namespace llmkit::model {

/// One message of a conversation.
struct chat_message {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;  ///< UTF-8 text
};

/// The built-in template families (see the file comment).
enum class chat_family : std::uint8_t {
  llama3,
  llama3_1,
  chatml,
  qwen2,
  qwen2_5,
  llama2,
  mistral,
  mistral_v1,
  mistral_v3,
  zephyr,
};

/// Whether the prompt ends with the assistant turn's opening (the Jinja
/// templates' `add_generation_prompt`).
enum class generation_prompt : std::uint8_t { add, omit };

/// Whether the BOS text the template writes first is part of the text.
enum class leading_bos : std::uint8_t {
  omit,   ///< left out: the tokenizer adds the BOS id (encode with add_bos)
  write,  ///< as the template renders it (encode with add_bos off)
};

/// Options of `chat_template::format`.
struct chat_format_options {
  generation_prompt prompt = generation_prompt::add;
  leading_bos bos = leading_bos::omit;
  /// llama3.1's "Today Date:" (the template's `date_string`; this default is
  /// what the template writes when the caller defines none).
  std::string_view date = "26 Jul 2024";
};

/// A built-in chat template: a family plus the BOS / EOS texts its
/// template writes (`bos_token`, `eos_token` in the Jinja source).
///
/// ```cpp
/// auto t = chat_template::from_gguf(file);             // detected from tokenizer.chat_template
/// auto z = chat_template::from_gguf(file, "zephyr");   // or chosen by name
/// std::vector<chat_message> chat{{"system", "Be brief."}, {"user", "Hi"}};
/// auto ids = tok.encode(t.format(chat), {.add_bos = tok.add_bos_token(), .parse_special = true});
/// ```
class chat_template {
 public:
  /// The names of the built-in families, in `chat_family` order.
  static constexpr std::array<std::string_view, 10> names{"llama3",  "llama3.1", "chatml",     "qwen2",      "qwen2.5",
                                                          "llama2",  "mistral",  "mistral-v1", "mistral-v3", "zephyr"};

  /// The names joined by ", " (for messages).
  static std::string names_list() {
    std::string out;
    for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
  }

  /// The family `f` with its usual BOS / EOS texts.
  explicit chat_template(chat_family f) : family_(f) {
    switch (f) {
      case chat_family::llama3:
      case chat_family::llama3_1: bos_ = "<|begin_of_text|>"; eos_ = "<|eot_id|>"; break;
      case chat_family::chatml:
      case chat_family::qwen2:
      case chat_family::qwen2_5: bos_ = ""; eos_ = "<|im_end|>"; break;
      default: bos_ = "<s>"; eos_ = "</s>"; break;
    }
  }

  /// The family called `name` (one of `names`); `llmkit::error` listing
  /// the names otherwise.
  static chat_template by_name(std::string_view name) {
    const auto it = std::find(names.begin(), names.end(), name);
    LLMKIT_CHECK(it != names.end(), "chat_template: no built-in template named '", name, "'; the built-in ones are ",
                 names_list());
    return chat_template(static_cast<chat_family>(it - names.begin()));
  }

  /// The family of a Jinja chat template, recognised by distinctive
  /// substrings; `llmkit::error` naming the built-in families when none
  /// matches.
  static chat_template detect(std::string_view jinja) {
    const auto family = detect_family(jinja);
    LLMKIT_CHECK(family.has_value(), "chat_template: tokenizer.chat_template '", excerpt(jinja),
                 "' is not one of the built-in families (", names_list(),
                 "); choose one of them by name to format chats for this model");
    return chat_template(*family);
  }

  /// The template of a GGUF model: `tokenizer.chat_template` detected, or
  /// the family called `name` when it is not empty. BOS / EOS texts come
  /// from the vocabulary (`tokenizer.ggml.bos_token_id` / `eos_token_id`)
  /// when it has them. `llmkit::error` when the model has no template and
  /// no name is given.
  static chat_template from_gguf(const gguf_file& file, std::string_view name = {}) {
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

  /// A copy whose template writes `bos` and `eos` for `bos_token` /
  /// `eos_token`.
  chat_template with_special_texts(std::string bos, std::string eos) const {
    chat_template t = *this;
    t.bos_ = std::move(bos);
    t.eos_ = std::move(eos);
    return t;
  }

  chat_family family() const noexcept { return family_; }
  std::string_view name() const noexcept { return names[static_cast<std::size_t>(family_)]; }
  std::string_view bos_text() const noexcept { return bos_; }
  std::string_view eos_text() const noexcept { return eos_; }

  /// The text of the token that ends an assistant turn: `<|eot_id|>`
  /// (Llama 3), `<|im_end|>` (ChatML, Qwen), the EOS text otherwise.
  /// Generation stops there as well as at EOS.
  std::string_view end_of_turn_text() const noexcept {
    switch (family_) {
      case chat_family::llama3:
      case chat_family::llama3_1: return "<|eot_id|>";
      case chat_family::chatml:
      case chat_family::qwen2:
      case chat_family::qwen2_5: return "<|im_end|>";
      default: return eos_;
    }
  }

  /// The prompt text for `[n] messages`.
  /// @pre messages is not empty; roles are system / user / assistant (and
  ///      for llama2 and the mistral families: an optional system message
  ///      first, then user and assistant alternating from user).
  std::string format(std::span<const chat_message> messages, const chat_format_options& options = {}) const {
    LLMKIT_CHECK(!messages.empty(), "chat_template ", name(), ": no messages to format");
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const auto& r = messages[i].role;
      LLMKIT_CHECK(r == "system" || r == "user" || r == "assistant", "chat_template ", name(), ": message ", i,
                   " has role '", r, "'; the roles are system, user and assistant");
    }
    std::string out;
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
    }
    return out;
  }

 private:
  chat_family family_;
  std::string bos_, eos_;

  static std::optional<chat_family> detect_family(std::string_view t) {
    auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
    if (has("<|im_start|>")) {
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

  // The first 60 bytes of a template for an error message, newlines escaped,
  // cut at a UTF-8 character boundary.
  static std::string excerpt(std::string_view t) {
    std::size_t n = std::min<std::size_t>(t.size(), 60);
    while (n > 0 && n < t.size() && (static_cast<unsigned char>(t[n]) & 0xC0) == 0x80) --n;
    std::string out;
    for (char c : t.substr(0, n)) out += c == '\n' ? std::string("\\n") : std::string(1, c);
    return n < t.size() ? out + "..." : out;
  }

  static std::string strip(std::string_view s) { return std::string(detail::python_strip(s)); }

  void write_leading_bos(const chat_format_options& o, std::string& out) const {
    if (o.bos == leading_bos::write) out += bos_;
  }

  void format_llama3(std::span<const chat_message> m, const chat_format_options& o, std::string& out) const {
    write_leading_bos(o, out);
    for (const auto& msg : m)
      out += "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n" + strip(msg.content) + "<|eot_id|>";
    if (o.prompt == generation_prompt::add) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }

  void format_llama3_1(std::span<const chat_message> m, const chat_format_options& o, std::string& out) const {
    write_leading_bos(o, out);
    std::string system;
    if (m.front().role == "system") {
      system = strip(m.front().content);
      m = m.subspan(1);
    }
    out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ";
    out += o.date;
    out += "\n\n" + system + "<|eot_id|>";
    for (const auto& msg : m)
      out += "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n" + strip(msg.content) + "<|eot_id|>";
    if (o.prompt == generation_prompt::add) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }

  static void format_chatml(std::span<const chat_message> m, const chat_format_options& o,
                            std::string_view default_system, std::string& out) {
    if (!default_system.empty() && m.front().role != "system")
      out += "<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n";
    for (const auto& msg : m) out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    if (o.prompt == generation_prompt::add) out += "<|im_start|>assistant\n";
  }

  void format_zephyr(std::span<const chat_message> m, const chat_format_options& o, std::string& out) const {
    for (const auto& msg : m) out += "<|" + msg.role + "|>\n" + msg.content + eos_ + "\n";
    if (o.prompt == generation_prompt::add) out += "<|assistant|>\n";
  }

  // Llama 2 and the Mistral families: [INST] turns, an optional system
  // message first, then user / assistant alternating.
  void format_inst(std::span<const chat_message> m, const chat_format_options& o, std::string& out) const {
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
    const std::string sys = system ? std::string(*system) : std::string();
    if (family_ != chat_family::llama2) write_leading_bos(o, out);
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::string& content = m[i].content;
      const bool user = m[i].role == "user";
      switch (family_) {
        case chat_family::llama2:
          if (user) {
            if (i > 0 || o.bos == leading_bos::write) out += bos_;
            const std::string c = i == 0 && system ? "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + content : content;
            out += "[INST] " + strip(c) + " [/INST]";
          } else {
            out += " " + strip(content) + " " + eos_;
          }
          break;
        case chat_family::mistral:
          if (user) out += "[INST] " + (i == 0 && system ? sys + "\n\n" : std::string()) + content + " [/INST]";
          else out += content + eos_;
          break;
        case chat_family::mistral_v1:
          if (user) out += " [INST] " + (i == 0 && system ? sys + "\n\n" : std::string()) + content + " [/INST]";
          else out += " " + content + eos_;
          break;
        default:  // mistral_v3: the system message joins the last turn, when that is a user turn
          if (user) out += "[INST] " + (i + 1 == m.size() && system ? sys + "\n\n" : std::string()) + content + "[/INST]";
          else out += " " + strip(content) + eos_;
          break;
      }
    }
  }
};

}  // namespace llmkit::model
