// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/harmony_stream.hpp
/// A harmony answer (gpt-oss) split while it streams. After the prompt's
/// `<|start|>assistant` the model writes messages
/// `<|channel|>C<|message|>BODY<|end|>`, the later ones opening with
/// `<|start|>assistant`, the last ending with `<|return|>` (or `<|call|>`
/// for a tool call). `harmony_stream` takes the answer's text piece by
/// piece, decoded with its control tokens rendered, and gives back the
/// bodies of the `analysis` channel as reasoning and of the `final`
/// channel as content, dropping the markers and the other channels'
/// bodies (`commentary`: tool calls). Text that may be the start of a
/// marker is held back until the next piece decides it. An answer that
/// does not open with a message header is all content, as split_harmony
/// (model/chat_template.hpp) splits a whole answer.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace llmkit::model {

class harmony_stream {
 public:
  /// Text for reasoning_content and for content.
  struct parts {
    std::string reasoning{}, content{};
  };

  /// The next piece of the answer.
  parts feed(std::string_view text) {
    parts out;
    buffer_ += text;
    run(out, false);
    return out;
  }

  /// What is held back, at the end of the answer: the rest of an open
  /// body, or an unfinished header of an answer without any message as
  /// content.
  parts finish() {
    parts out;
    run(out, true);
    if (state_ == state::header && !seen_message_) out.content += header_;
    header_.clear();
    return out;
  }

 private:
  enum class state { start, header, body, raw };
  static constexpr std::string_view message_ = "<|message|>";

  // Whether some suffix of `s` is a proper prefix of `marker` (text to hold back).
  static std::size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (std::size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
      if (marker.starts_with(s.substr(s.size() - n))) return n;
    return 0;
  }

  void emit(parts& out, std::string_view body) const {
    if (channel_ == "analysis") out.reasoning += body;
    else if (channel_ == "final") out.content += body;
  }

  void run(parts& out, bool at_end) {
    for (;;) {
      switch (state_) {
        case state::start: {  // the answer's first bytes decide: a header, or plain text
          constexpr std::string_view channel = "<|channel|>", start = "<|start|>";
          const std::string_view b = buffer_;
          if (b.starts_with(channel) || b.starts_with(start)) {
            state_ = state::header;
            continue;
          }
          if (!at_end && (channel.starts_with(b) || start.starts_with(b))) return;  // too short to tell
          state_ = state::raw;
          continue;
        }
        case state::raw:
          out.content += buffer_;
          buffer_.clear();
          return;
        case state::header: {
          header_ += buffer_;
          buffer_.clear();
          const std::size_t at = header_.find(message_);
          if (at == std::string::npos) return;
          const std::string_view h = std::string_view(header_).substr(0, at);
          const std::size_t c = h.find("<|channel|>");
          channel_ = c == std::string_view::npos ? std::string() : std::string(h.substr(c + 11));
          if (const std::size_t stop = channel_.find_first_of(" <"); stop != std::string::npos) channel_.resize(stop);
          buffer_ = header_.substr(at + message_.size());
          header_.clear();
          seen_message_ = true;
          state_ = state::body;
          continue;
        }
        case state::body: {
          std::size_t end = std::string::npos, len = 0;
          for (std::string_view m : {"<|end|>", "<|return|>", "<|call|>"})
            if (const std::size_t at = buffer_.find(m); at < end) end = at, len = m.size();
          if (end != std::string::npos) {
            emit(out, std::string_view(buffer_).substr(0, end));
            buffer_.erase(0, end + len);
            state_ = state::header;
            continue;
          }
          std::size_t hold = 0;
          if (!at_end)
            for (std::string_view m : {"<|end|>", "<|return|>", "<|call|>"})
              hold = std::max(hold, partial_suffix(buffer_, m));
          emit(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
          buffer_.erase(0, buffer_.size() - hold);
          return;
        }
      }
    }
  }

  state state_ = state::start;
  std::string buffer_{}, header_{}, channel_{};
  bool seen_message_ = false;
};

}  // namespace llmkit::model
