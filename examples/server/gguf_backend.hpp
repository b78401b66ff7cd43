// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/gguf_backend.hpp
/// What every llmkit-server backend over a GGUF model shares: the file, its
/// tokenizer and chat template, behind `backend`'s tokenize, tokenize_chat,
/// format_chat and token_text. A backend derives from it and adds how the
/// model runs.

#include <llmkit/chat/tool_grammar.hpp>
#include <llmkit/chat/tool_template.hpp>
#include <llmkit/grammar/token_masker.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/model/chat_template.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama_config.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"

namespace llmkit_server {

/// A formatted chat's ids with `tok`: the template's markers (the text
/// outside `chat.contents`) parsed as special tokens, the message contents
/// as text unless `user` is `parsed`.
inline std::vector<token_id> encode_chat(const llmkit::model::tokenizer& tok, const chat_prompt& chat,
                                         user_special_tokens user) {
  return tok.encode(chat.text,
                    {.add_bos = tok.add_bos_token(),
                     .parse_special = true,
                     .literal = user == user_special_tokens::parsed ? std::span<const llmkit::model::text_span>()
                                                                    : std::span<const llmkit::model::text_span>(chat.contents)});
}

/// `messages` (and `[k] tools`) through `chat_template`, with the contents
/// marked and the end-of-turn token looked up in `tok`.
/// @throws llmkit::error when the template refuses the conversation
inline chat_prompt format_chat_prompt(const llmkit::model::tokenizer& tok, const llmkit::model::chat_template& t,
                                      const std::vector<chat_message>& messages, bool enable_thinking = true,
                                      std::span<const llmkit::chat::tool_definition> tools = {},
                                      std::string_view reasoning_effort = {}) {
  llmkit::model::chat_format_options o{.enable_thinking = enable_thinking};
  if (!reasoning_effort.empty()) o.reasoning_effort = reasoning_effort;
  llmkit::model::formatted_chat f = llmkit::chat::format_with_tools(t, messages, tools, o);
  chat_prompt p{.text = std::move(f.text), .contents = std::move(f.contents)};
  p.reasoning = t.has_reasoning() && enable_thinking;
  p.harmony = t.family() == llmkit::model::chat_family::harmony;
  if (const auto eot = tok.find(t.end_of_turn_text())) p.end_of_turn.push_back(*eot);
  // A harmony call ends the answer: the caller runs the tool.
  if (p.harmony)
    if (const auto call = tok.find("<|call|>")) p.end_of_turn.push_back(*call);
  return p;
}

/// See the file comment.
class gguf_backend : public backend {
 public:
  std::vector<token_id> tokenize(std::string_view text) const override {
    return tok_.encode(text, {.add_bos = tok_.add_bos_token(), .parse_special = user_ == user_special_tokens::parsed});
  }

  std::vector<token_id> tokenize_chat(const chat_prompt& chat) const override { return encode_chat(tok_, chat, user_); }

  std::optional<chat_prompt> format_chat(const std::vector<chat_message>& messages, bool enable_thinking,
                                         std::span<const llmkit::chat::tool_definition> tools,
                                         std::string_view reasoning_effort) const override {
    if (!template_) return std::nullopt;
    return format_chat_prompt(tok_, *template_, messages, enable_thinking, tools, reasoning_effort);
  }

  std::optional<llmkit::chat::tool_syntax> tool_syntax() const override {
    return template_ ? llmkit::chat::tool_syntax_of(template_->family()) : std::nullopt;
  }

  std::shared_ptr<const llmkit::grammar::token_vocabulary> grammar_vocabulary() const override {
    // Built on first use (a trie over the vocabulary), then shared by every request.
    std::call_once(vocab_once_, [&] {
      std::vector<token_id> ends{tok_.eos()};
      if (template_)
        if (const auto eot = tok_.find(template_->end_of_turn_text()); eot && *eot != tok_.eos()) ends.push_back(*eot);
      // harmony: a call ends the answer, and call grammars name the channel markers (chat/tool_grammar.hpp).
      const bool harmony = template_ && template_->family() == llmkit::model::chat_family::harmony;
      if (harmony)
        if (const auto call = tok_.find("<|call|>")) ends.push_back(*call);
      ends.erase(std::remove(ends.begin(), ends.end(), token_id{-1}), ends.end());
      vocab_ = llmkit::grammar::token_vocabulary::from_tokenizer(
          tok_, std::move(ends),
          harmony ? std::span<const std::string_view>(llmkit::chat::harmony_grammar_markers)
                  : std::span<const std::string_view>());
    });
    return vocab_;
  }

  std::optional<token_id> single_token(std::string_view text) const override { return tok_.find(text); }

  std::string token_text(token_id token) const override {
    std::string out;
    if (token >= 0 && static_cast<std::size_t>(token) < tok_.vocab_size()) tok_.decode_token(token, out);
    return out;
  }

  std::vector<token_id> encode(std::string_view text, bool add_special, bool parse_special) const override {
    return tok_.encode(text, {.add_bos = add_special && tok_.add_bos_token(), .parse_special = parse_special});
  }

  std::string decode(std::span<const token_id> ids) const override {
    return tok_.decode(ids, {.render_special = true});
  }

  std::shared_ptr<const llmkit::grammar::token_masker> compile_grammar(const std::string& gbnf,
                                                                       const grammar_limits& limits) const override {
    return llmkit::grammar::compile_cached(
        gbnf, grammar_vocabulary(),
        {.max_rules = limits.max_rules,
         .max_elements = limits.max_elements,
         .max_repetition = static_cast<std::uint32_t>(std::min<std::size_t>(limits.max_repetition, std::numeric_limits<std::uint32_t>::max())),
         .max_source_bytes = limits.max_gbnf_bytes,
         .max_nesting = limits.max_nesting},
        {.max_states = limits.max_positions, .max_stacks = limits.max_stacks, .max_stack_depth = limits.max_stack_depth},
        limits.warm_up_positions);
  }

 protected:
  /// Opens `model_path`; `chat_template` names a built-in template, or is
  /// empty for the model's own (none if the file has none); `user` says what
  /// special-token texts in prompts and message contents become.
  /// @throws llmkit::error for an unreadable file, tokenizer or template
  gguf_backend(const std::string& model_path, const std::string& chat_template, user_special_tokens user)
      : file_(llmkit::model::gguf_file::open(model_path)),
        tok_(llmkit::model::tokenizer::from_gguf(file_)),
        user_(user) {
    if (!chat_template.empty() || file_.contains("tokenizer.chat_template"))
      template_.emplace(llmkit::model::chat_template::from_gguf(file_, chat_template));
  }

  /// The model as /v1/models and the request checks see it: `n_ctx` tokens
  /// per request (0: the model's context length, never more).
  backend_model_info describe(const std::string& model_path, std::size_t n_ctx,
                              const llmkit::model::llama_config& c) const {
    backend_model_info i;
    i.id = std::filesystem::path(model_path).stem().string();
    i.n_ctx = n_ctx == 0 ? c.context_length : std::min(n_ctx, c.context_length);
    i.n_vocab = c.n_vocab;
    i.eos_tokens = {tok_.eos()};
    return i;
  }

  llmkit::model::gguf_file file_;
  llmkit::model::tokenizer tok_;
  std::optional<llmkit::model::chat_template> template_;
  user_special_tokens user_;
  // The vocabulary as grammars mask it, built by the first constrained request.
  mutable std::once_flag vocab_once_;
  mutable std::shared_ptr<const llmkit::grammar::token_vocabulary> vocab_;
};

}  // namespace llmkit_server
