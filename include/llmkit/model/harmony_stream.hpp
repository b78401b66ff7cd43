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
///
/// `harmony_reader` is the framing alone (headers, bodies, held-back
/// markers), for parsers that route bodies by more than their channel:
/// chat::harmony_call_stream reads tool calls with it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace llmkit::model {

/// The message framing of a harmony answer, piece by piece (see the file
/// comment). It tells a sink what it read:
/// - `sink.open(header)`: a message header, the text before `<|message|>`;
/// - `sink.body(text, closing)`: body text of the open message, `closing`
///   when the message's end marker (or the answer's end) follows it;
/// - `sink.raw(text)`: text outside any message (an answer without
///   headers, or an unfinished header at the end of one without messages).
class harmony_reader {
 public:
  /// Reads `text`, the next piece of the answer.
  template <class Sink>
  void feed(std::string_view text, Sink& sink) {
    buffer_ += text;
    run(sink, false);
  }

  /// Reads what is held back, at the end of the answer.
  template <class Sink>
  void finish(Sink& sink) {
    run(sink, true);
    if (state_ == state::header && !seen_message_) sink.raw(header_);
    header_.clear();
  }

 private:
  enum class state : std::uint8_t { start, header, body, raw };
  static constexpr std::string_view message_ = "<|message|>";
  static constexpr std::string_view ends_[3] = {"<|end|>", "<|return|>", "<|call|>"};

  // The length of the longest suffix of `s` that is a proper prefix of `marker`.
  static std::size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (std::size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
      if (marker.starts_with(s.substr(s.size() - n))) return n;
    return 0;
  }

  template <class Sink>
  void run(Sink& sink, bool at_end) {
    for (;;) {
      switch (state_) {
        case state::start: {  // the answer's first bytes decide: a header (channel, start or recipient), or plain text
          const std::string_view b = buffer_;
          bool header = false, maybe = false;
          for (std::string_view open : {std::string_view("<|channel|>"), std::string_view("<|start|>"),
                                        std::string_view(" to="), std::string_view("to=")}) {
            header = header || b.starts_with(open);
            maybe = maybe || open.starts_with(b);
          }
          if (header) state_ = state::header;
          else if (maybe && !at_end) return;  // too short to tell
          else state_ = state::raw;
          continue;
        }
        case state::raw:
          sink.raw(buffer_);
          buffer_.clear();
          return;
        case state::header: {
          header_ += buffer_;
          buffer_.clear();
          const std::size_t at = header_.find(message_);
          if (at == std::string::npos) return;
          buffer_ = header_.substr(at + message_.size());
          header_.resize(at);
          seen_message_ = true;
          sink.open(std::string_view(header_));
          header_.clear();
          state_ = state::body;
          continue;
        }
        case state::body: {
          std::size_t end = std::string::npos, len = 0;
          for (std::string_view m : ends_)
            if (const std::size_t at = buffer_.find(m); at < end) end = at, len = m.size();
          if (end != std::string::npos) {
            sink.body(std::string_view(buffer_).substr(0, end), true);
            buffer_.erase(0, end + len);
            state_ = state::header;
            continue;
          }
          std::size_t hold = 0;
          if (!at_end)
            for (std::string_view m : ends_) hold = std::max(hold, partial_suffix(buffer_, m));
          sink.body(std::string_view(buffer_).substr(0, buffer_.size() - hold), at_end);
          buffer_.erase(0, buffer_.size() - hold);
          return;
        }
      }
    }
  }

  state state_ = state::start;
  std::string buffer_{}, header_{};
  bool seen_message_ = false;
};

/// See the file comment.
class harmony_stream {
 public:
  /// Text for reasoning_content and for content.
  struct parts {
    std::string reasoning{}, content{};
  };

  /// The next piece of the answer.
  parts feed(std::string_view text) {
    parts out;
    sink s{channel_, out};
    reader_.feed(text, s);
    return out;
  }

  /// What is held back, at the end of the answer: the rest of an open
  /// body, or an unfinished header of an answer without any message as
  /// content.
  parts finish() {
    parts out;
    sink s{channel_, out};
    reader_.finish(s);
    return out;
  }

 private:
  // Analysis bodies to reasoning, final ones to content, others dropped.
  struct sink {
    std::string& channel;
    parts& out;
    void open(std::string_view header) {
      const std::size_t c = header.find("<|channel|>");
      channel = c == std::string_view::npos ? std::string() : std::string(header.substr(c + 11));
      if (const std::size_t stop = channel.find_first_of(" <"); stop != std::string::npos) channel.resize(stop);
    }
    void body(std::string_view text, bool) {
      if (channel == "analysis") out.reasoning += text;
      else if (channel == "final") out.content += text;
    }
    void raw(std::string_view text) { out.content += text; }
  };

  harmony_reader reader_;
  std::string channel_{};
};

}  // namespace llmkit::model
