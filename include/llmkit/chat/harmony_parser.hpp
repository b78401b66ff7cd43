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
    buffer_ += text;
    run(d, false);
    return d;
  }

  /// The rest, at the end of the answer: held-back text of an open body,
  /// or an unfinished header of an answer without any message as content.
  answer_delta finish() {
    answer_delta d;
    run(d, true);
    if (state_ == state::header && !seen_message_) d.content += header_;
    header_.clear();
    return d;
  }

  /// The calls so far, arguments as sent.
  const std::vector<tool_call>& calls() const noexcept { return calls_; }

 private:
  enum class state : std::uint8_t { start, header, body, raw };
  enum class sink : std::uint8_t { reasoning, content, call, none };

  static constexpr std::string_view message_ = "<|message|>";
  static constexpr std::string_view channel_marker_ = "<|channel|>";
  static constexpr std::string_view function_prefix_ = "functions.";
  static constexpr std::string_view ends_[3] = {"<|end|>", "<|return|>", "<|call|>"};

  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  // The length of the longest suffix of `s` that is a proper prefix of `marker`.
  static std::size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (std::size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
      if (marker.starts_with(s.substr(s.size() - n))) return n;
    return 0;
  }

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
    seen_message_ = true;
    args_started_ = false;
    held_space_.clear();
    if (recipient.starts_with(function_prefix_) && recipient.size() > function_prefix_.size()) {
      sink_ = sink::call;
      calls_.push_back({make_tool_call_id(seed_, calls_.size()), std::string(recipient.substr(function_prefix_.size())), {}});
      d.calls.push_back({calls_.size() - 1, calls_.back().id, calls_.back().name, {}});
    } else if (!recipient.empty() && recipient != "assistant" && recipient != "user") {
      sink_ = sink::none;  // a built-in tool's call
    } else if (channel == "analysis") {
      sink_ = sink::reasoning;
    } else if (channel == "final" || channel == "commentary") {
      sink_ = sink::content;
    } else {
      sink_ = sink::none;
    }
  }

  // Body text of the open message; `closing` when its end marker follows.
  void emit(answer_delta& d, std::string_view body, bool closing) {
    switch (sink_) {
      case sink::reasoning: d.reasoning += body; return;
      case sink::content: d.content += body; return;
      case sink::none: return;
      case sink::call: break;
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

  void run(answer_delta& d, bool at_end) {
    for (;;) {
      switch (state_) {
        case state::start: {  // the answer's first bytes decide: a header, or plain text
          const std::string_view b = buffer_;
          bool header = false, maybe = false;
          for (std::string_view open : {channel_marker_, std::string_view("<|start|>"), std::string_view(" to="),
                                        std::string_view("to=")}) {
            header = header || b.starts_with(open);
            maybe = maybe || open.starts_with(b);
          }
          if (header) state_ = state::header;
          else if (maybe && !at_end) return;  // too short to tell
          else state_ = state::raw;
          continue;
        }
        case state::raw:
          d.content += buffer_;
          buffer_.clear();
          return;
        case state::header: {
          header_ += buffer_;
          buffer_.clear();
          const std::size_t at = header_.find(message_);
          if (at == std::string::npos) return;
          buffer_ = header_.substr(at + message_.size());
          header_.resize(at);
          open_message(d, header_);
          header_.clear();
          state_ = state::body;
          continue;
        }
        case state::body: {
          std::size_t end = std::string::npos, len = 0;
          for (std::string_view m : ends_)
            if (const std::size_t at = buffer_.find(m); at < end) end = at, len = m.size();
          if (end != std::string::npos) {
            emit(d, std::string_view(buffer_).substr(0, end), true);
            buffer_.erase(0, end + len);
            state_ = state::header;
            continue;
          }
          std::size_t hold = 0;
          if (!at_end)
            for (std::string_view m : ends_) hold = std::max(hold, partial_suffix(buffer_, m));
          emit(d, std::string_view(buffer_).substr(0, buffer_.size() - hold), at_end);
          buffer_.erase(0, buffer_.size() - hold);
          return;
        }
      }
    }
  }

  std::uint64_t seed_;
  state state_ = state::start;
  sink sink_ = sink::none;
  std::string buffer_{}, header_{};
  std::string held_space_{};   // a call's trailing whitespace, sent if more arguments follow
  bool args_started_ = false;  // the open call's arguments have had text other than whitespace
  bool seen_message_ = false;
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
