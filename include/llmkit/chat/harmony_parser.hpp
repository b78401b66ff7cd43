// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/harmony_parser.hpp
/// A gpt-oss (harmony) answer split into reasoning, content and calls,
/// piece by piece as it streams. After the prompt's `<|start|>assistant`
/// the model writes messages `HEADER<|message|>BODY<|end|>`, the later ones
/// opening with `<|start|>assistant`; the header names the channel
/// (`<|channel|>analysis`) and, for a call, the recipient (` to=functions.N`,
/// before or after the channel, then ` <|constrain|>json` or ` json`); a
/// call's body ends with `<|call|>`, the answer's last with `<|return|>`.
///
/// - `analysis` bodies are reasoning, `final` bodies content; a
///   `commentary` body without recipient (a preamble the model means the
///   user to see) is content too;
/// - a body addressed to `functions.N` is a call of N: announced (index,
///   id, name) once its header is complete, its arguments streamed as
///   generated, whitespace around them dropped; bodies addressed to other
///   recipients (built-in tools) are dropped;
/// - an answer that does not open with a header is all content (as
///   model::split_harmony).
///
/// Text that may be the start of a marker is held back until the next
/// piece decides it. Calls are kept as generated: the channels leave no
/// doubt about what is a call, so a call whose arguments are not JSON (a
/// model not under a grammar) still comes back as a call, for the caller
/// to check.
///
/// ```cpp
/// chat::harmony_call_stream s(seed);
/// for (auto piece : pieces) {
///   auto d = s.feed(piece);   // d.reasoning, d.content, d.calls[i]: {index, id, name, arguments chunk}
/// }
/// auto last = s.finish();
/// ```

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/chat/tools.hpp"
#include "llmkit/model/harmony_stream.hpp"

namespace llmkit::chat {

/// See the file comment.
class harmony_call_stream {
 public:
  /// @param seed  of the call ids (make_tool_call_id)
  explicit harmony_call_stream(std::uint64_t seed = 0) : seed_(seed) {}

  /// The reasoning, content and call deltas that `text`, the next piece of
  /// the answer, makes known.
  answer_delta feed(std::string_view text) {
    answer_delta d;
    sink s{*this, d};
    reader_.feed(text, s);
    return d;
  }

  /// The rest, at the end of the answer: held-back text of an open body,
  /// or an unfinished header of an answer without any message as content.
  answer_delta finish() {
    answer_delta d;
    sink s{*this, d};
    reader_.finish(s);
    return d;
  }

  /// The calls so far, arguments as sent.
  const std::vector<tool_call>& calls() const noexcept { return calls_; }

 private:
  enum class target : std::uint8_t { reasoning, content, call, none };

  static constexpr std::string_view channel_marker_ = "<|channel|>";
  static constexpr std::string_view function_prefix_ = "functions.";

  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  // The word after `key` in a header: up to a space, a '<' or the end.
  static std::string_view word_after(std::string_view header, std::string_view key) {
    const std::size_t at = header.find(key);
    if (at == std::string_view::npos) return {};
    std::string_view w = header.substr(at + key.size());
    return w.substr(0, std::min(w.size(), w.find_first_of(" <")));
  }

  // A header was read: where its body goes.
  void open_message(answer_delta& d, std::string_view header) {
    const std::string_view channel = word_after(header, channel_marker_);
    const std::string_view recipient = word_after(header, "to=");
    args_started_ = false;
    held_space_.clear();
    if (recipient.starts_with(function_prefix_) && recipient.size() > function_prefix_.size()) {
      target_ = target::call;
      calls_.push_back({make_tool_call_id(seed_, calls_.size()), std::string(recipient.substr(function_prefix_.size())), {}});
      d.calls.push_back({calls_.size() - 1, calls_.back().id, calls_.back().name, {}});
    } else if (!recipient.empty() && recipient != "assistant" && recipient != "user") {
      target_ = target::none;  // a built-in tool's call
    } else if (channel == "analysis") {
      target_ = target::reasoning;
    } else if (channel == "final" || channel == "commentary") {
      target_ = target::content;
    } else {
      target_ = target::none;
    }
  }

  // Body text of the open message; `closing` when its end marker follows.
  void emit(answer_delta& d, std::string_view body, bool closing) {
    switch (target_) {
      case target::reasoning: d.reasoning += body; return;
      case target::content: d.content += body; return;
      case target::none: return;
      case target::call: break;
    }
    if (!args_started_) {
      while (!body.empty() && is_space(body.front())) body.remove_prefix(1);
      if (body.empty()) return;
      args_started_ = true;
    }
    // Trailing whitespace waits: it is sent only if more arguments follow.
    std::size_t keep = body.size();
    while (keep > 0 && is_space(body[keep - 1])) --keep;
    if (keep > 0) {
      const std::string chunk = held_space_ + std::string(body.substr(0, keep));
      held_space_.clear();
      calls_.back().arguments += chunk;
      if (!d.calls.empty() && d.calls.back().index == calls_.size() - 1) d.calls.back().arguments += chunk;
      else d.calls.push_back({calls_.size() - 1, {}, {}, chunk});
    }
    held_space_ += body.substr(keep);
    if (closing) held_space_.clear();
  }

  // What the reader reports, routed (model::harmony_reader's sink).
  struct sink {
    harmony_call_stream& self;
    answer_delta& d;
    void open(std::string_view header) { self.open_message(d, header); }
    void body(std::string_view text, bool closing) { self.emit(d, text, closing); }
    void raw(std::string_view text) { d.content += text; }
  };

  std::uint64_t seed_;
  model::harmony_reader reader_{};
  target target_ = target::none;
  std::string held_space_{};   // a call's trailing whitespace, sent if more arguments follow
  bool args_started_ = false;  // the open call's arguments have had text other than whitespace
  std::vector<tool_call> calls_{};
};

/// Splits a whole harmony answer as harmony_call_stream streams it.
inline parsed_answer parse_harmony_answer(std::string_view text, std::uint64_t seed = 0) {
  harmony_call_stream s(seed);
  answer_delta a = s.feed(text);
  answer_delta b = s.finish();
  return {.content = a.content + b.content, .calls = s.calls(), .reasoning = a.reasoning + b.reasoning};
}

}  // namespace llmkit::chat
