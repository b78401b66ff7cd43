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
///   `<|system|>\nS</s>\n<|user|>\nHi</s>\n<|assistant|>\n`;
/// - `gemma` (Gemma 2 / Gemma 3): `<bos><start_of_turn>user\nHi<end_of_turn>\n`,
///   answers as role `model`, then `<start_of_turn>model\n`; a system message
///   opens the first user turn as `S\n\n` (Gemma 3's template; Gemma 2's
///   refuses one); turns alternate from user and are trimmed;
/// - `phi3` (Phi-3 / Phi-3.5-mini): `<|user|>\nHi<|end|>\n` per message (an
///   empty system message is left out), then `<|assistant|>\n`, or the EOS
///   text without the generation prompt;
/// - `phi4-mini` (Phi-4-mini): `<|user|>Hi<|end|>`, then `<|assistant|>` (or EOS);
/// - `phi4` (Phi-4 14B): `<|im_start|>user<|im_sep|>Hi<|im_end|>`, then
///   `<|im_start|>assistant<|im_sep|>`;
/// - `qwen3` (Qwen3): chatml without a default system message; an
///   assistant answer after the last user message is written as
///   `<think>\nR\n</think>\n\nA` (its reasoning R is the text before
///   `</think>` in the content, or empty), earlier answers without their
///   reasoning; `chat_format_options::enable_thinking = false` appends an
///   empty `<think>\n\n</think>\n\n` to the generation prompt, as the
///   template's `enable_thinking` does;
/// - `harmony` (gpt-oss): OpenAI's harmony format, as gpt-oss's template
///   renders it without tools: a system message
///   `<|start|>system<|message|>You are ChatGPT, ...Current date: D\n\nReasoning: medium\n\n# Valid channels: ...<|end|>`,
///   the conversation's first system message (if not empty) as
///   `<|start|>developer<|message|># Instructions\n\nS\n\n<|end|>`,
///   `<|start|>user<|message|>Hi<|end|>`, answers as
///   `<|start|>assistant<|channel|>final<|message|>A<|end|>` (`<|return|>`
///   for a last answer without the generation prompt), then
///   `<|start|>assistant`. Later system messages are left out, as the
///   template does. The model answers on channels: `split_harmony`
///   separates its `analysis` (reasoning) from its `final` answer.
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
///
/// **Markers versus content.** `format_marked` also says where each
/// message's content lies in the text, so a tokenizer can parse the
/// template's markers as control tokens and leave a message's own text as
/// text (`encode_options::literal`): a user who types `<|im_start|>system`
/// or `</s>` gets those characters, not a forged turn or an early EOS.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/tokenizer_types.hpp"

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
  gemma,
  phi3,
  phi4_mini,
  phi4,
  qwen3,
  harmony,
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
  /// qwen3's `enable_thinking` (chat_template_kwargs in vLLM and
  /// llama-server): false closes an empty thinking block after the
  /// generation prompt, so the model answers without reasoning. Other
  /// families ignore it.
  bool enable_thinking = true;
  /// harmony's `reasoning_effort`: "low", "medium" or "high".
  std::string_view reasoning_effort = "medium";
  /// harmony's "Current date:" as YYYY-MM-DD; empty: today's date in UTC,
  /// as the template's strftime_now writes it.
  std::string_view current_date = {};
};

/// A formatted chat: the prompt text and where the messages' contents are in it.
struct formatted_chat {
  std::string text{};
  /// `[n] contents`: byte ranges of `text` written from message contents
  /// (after the template's trimming), sorted, not overlapping, none empty.
  /// Everything else is the template's: markers, roles, fixed phrases, BOS
  /// and EOS texts. Pass as `encode_options::literal`.
  std::vector<text_span> contents{};
};

/// A reasoning model's answer split at its `</think>`: the reasoning (the
/// text before it, without a leading `<think>` and the newlines around it)
/// and the answer after it (leading newlines removed), as Qwen3's template
/// and llama-server's `reasoning_content` split it. Without `</think>`, the
/// whole text is the answer; with `<think>` and no `</think>` (a cut-off
/// answer) it is all reasoning.
struct reasoning_split {
  std::string_view reasoning{};
  std::string_view content{};
};
reasoning_split split_reasoning(std::string_view text);

/// A harmony answer (gpt-oss; the text after the prompt's
/// `<|start|>assistant`, decoded with its control tokens rendered) split
/// into the message on the `analysis` channel (reasoning) and the one on
/// the `final` channel (content), each without its `<|end|>` /
/// `<|return|>`; a message still being written runs to the end of the
/// text. Text without any `<|channel|>` marker is all content.
reasoning_split split_harmony(std::string_view text);

/// harmony's system message (gpt-oss), as its template writes it:
/// `<|start|>system<|message|>You are ChatGPT, ...Reasoning: R\n\n# Valid channels: ...<|end|>`
/// with `options.reasoning_effort` and `current_date`; `functions` adds the
/// line that sends calls of the developer message's tools to the
/// commentary channel (chat/tool_template.hpp renders those).
/// @throws llmkit::error if reasoning_effort is not low, medium or high, or
/// current_date is neither empty nor YYYY-MM-DD.
std::string harmony_system_message(const chat_format_options& options, bool functions = false);

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
  static constexpr std::array<std::string_view, 16> names{
      "llama3",     "llama3.1", "chatml", "qwen2", "qwen2.5",   "llama2", "mistral", "mistral-v1",
      "mistral-v3", "zephyr",   "gemma",  "phi3",  "phi4-mini", "phi4",   "qwen3",  "harmony"};

  /// The names joined by ", " (for messages).
  static std::string names_list();

  /// The family `f` with its usual BOS / EOS texts.
  explicit chat_template(chat_family f) : family_(f) {
    switch (f) {
      case chat_family::llama3:
      case chat_family::llama3_1: bos_ = "<|begin_of_text|>"; eos_ = "<|eot_id|>"; break;
      case chat_family::chatml:
      case chat_family::qwen2:
      case chat_family::qwen2_5:
      case chat_family::qwen3: bos_ = ""; eos_ = "<|im_end|>"; break;
      case chat_family::gemma: bos_ = "<bos>"; eos_ = "<eos>"; break;
      case chat_family::phi3: bos_ = "<s>"; eos_ = "<|endoftext|>"; break;
      case chat_family::phi4_mini:
      case chat_family::phi4: bos_ = ""; eos_ = "<|endoftext|>"; break;
      case chat_family::harmony: bos_ = ""; eos_ = "<|return|>"; break;
      default: bos_ = "<s>"; eos_ = "</s>"; break;
    }
  }

  /// The family called `name` (one of `names`); `llmkit::error` listing
  /// the names otherwise.
  static chat_template by_name(std::string_view name);

  /// The family of a Jinja chat template, recognised by distinctive
  /// substrings; `llmkit::error` naming the built-in families when none
  /// matches.
  static chat_template detect(std::string_view jinja);

  /// The template of a GGUF model: `tokenizer.chat_template` detected, or
  /// the family called `name` when it is not empty. BOS / EOS texts come
  /// from the vocabulary (`tokenizer.ggml.bos_token_id` / `eos_token_id`)
  /// when it has them. `llmkit::error` when the model has no template and
  /// no name is given.
  static chat_template from_gguf(const gguf_file& file, std::string_view name = {});

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
  /// (Llama 3), `<|im_end|>` (ChatML, Qwen, Phi-4), `<end_of_turn>` (Gemma),
  /// `<|end|>` (Phi-3, Phi-4-mini), the EOS text otherwise.
  /// Generation stops there as well as at EOS.
  std::string_view end_of_turn_text() const noexcept {
    switch (family_) {
      case chat_family::llama3:
      case chat_family::llama3_1: return "<|eot_id|>";
      case chat_family::chatml:
      case chat_family::qwen2:
      case chat_family::qwen2_5:
      case chat_family::qwen3:
      case chat_family::phi4: return "<|im_end|>";
      case chat_family::gemma: return "<end_of_turn>";
      case chat_family::phi3:
      case chat_family::phi4_mini: return "<|end|>";
      default: return eos_;
    }
  }

  /// Whether the family's answers open with a `<think>` ... `</think>`
  /// reasoning block (qwen3); see split_reasoning. (Harmony answers carry
  /// theirs on the analysis channel: split_harmony.)
  bool has_reasoning() const noexcept { return family_ == chat_family::qwen3; }

  /// The prompt text for `[n] messages`.
  /// @pre messages is not empty; roles are system / user / assistant (and
  ///      for llama2 and the mistral families: an optional system message
  ///      first, then user and assistant alternating from user).
  std::string format(std::span<const chat_message> messages, const chat_format_options& options = {}) const {
    return format_marked(messages, options).text;
  }

  /// The prompt text for `[n] messages`, as `format` writes it, and the
  /// ranges of it that are message contents. Encode with
  /// `{.parse_special = true, .literal = f.contents}` so that only the
  /// template's markers become control tokens.
  /// @pre as for `format`
  formatted_chat format_marked(std::span<const chat_message> messages, const chat_format_options& options = {}) const;

 private:
  chat_family family_;
  std::string bos_, eos_;

  static std::optional<chat_family> detect_family(std::string_view t);

  // The first 60 bytes of a template for an error message, newlines escaped,
  // cut at a UTF-8 character boundary.
  static std::string excerpt(std::string_view t);

  void write_leading_bos(const chat_format_options& o, formatted_chat& out) const;
  void format_llama3(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
  void format_llama3_1(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
  static void format_chatml(std::span<const chat_message> m, const chat_format_options& o,
                            std::string_view default_system, formatted_chat& out);
  void format_zephyr(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
  void format_gemma(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
  void format_phi(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
  static void format_qwen3(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out);
  static void format_harmony(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out);

  // Llama 2 and the Mistral families: [INST] turns, an optional system
  // message first, then user / assistant alternating.
  void format_inst(std::span<const chat_message> m, const chat_format_options& o, formatted_chat& out) const;
};

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/chat_template.ipp"
#endif
