// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/text_stream.hpp
/// Incremental detokenization with stop strings: a request's generated
/// tokens go in one at a time, text deltas come out that never split a
/// UTF-8 character, never show a stop string or anything after it, and
/// hold back a tail that might begin one until the next tokens decide.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/model/tokenizer.hpp"

namespace llmkit::serve {

/// Bytes at the end of `text` that form an incomplete UTF-8 character (0
/// when it ends on a character boundary, or with an invalid byte: those are
/// passed through rather than held forever).
constexpr std::size_t incomplete_utf8_tail(std::string_view text) noexcept {
  const std::size_t n = text.size();
  for (std::size_t k = 1; k <= 4 && k <= n; ++k) {
    const auto c = static_cast<unsigned char>(text[n - k]);
    if ((c & 0xC0u) == 0x80u) continue;  // continuation byte: look further back
    const std::size_t len = c < 0x80u ? 1 : (c & 0xE0u) == 0xC0u ? 2 : (c & 0xF0u) == 0xE0u ? 3 : (c & 0xF8u) == 0xF0u ? 4 : 1;
    return len > k ? k : 0;
  }
  return 0;
}

/// The text of one request's generated tokens, delivered as deltas.
class text_stream {
 public:
  /// The outcome of `push`.
  struct delta {
    std::string text;          ///< newly deliverable text (may be empty)
    bool stop_string = false;  ///< a stop string is complete: the stream is over
  };

  /// Decodes `token` (tokenizer.decode_token, raw bytes: SentencePiece's
  /// leading space is kept) and returns the text now safe to deliver under
  /// `stop`'s stop strings.
  delta push(const model::tokenizer& tok, token_id token, const stop_criteria& stop) {
    const std::size_t before = text_.size();
    tok.decode_token(token, text_);
    return advance(text_.size() - before, stop);
  }

  /// As push, for text already decoded (tests, other detokenizers).
  delta push_text(std::string_view piece, const stop_criteria& stop) {
    text_ += piece;
    return advance(piece.size(), stop);
  }

  /// Everything decoded and not yet delivered (at the end of a request that
  /// no stop string ended: held-back text is final then).
  std::string flush() {
    if (stopped_) return {};
    std::string out = text_.substr(emitted_);
    emitted_ = text_.size();
    return out;
  }

  /// All text decoded so far (stop strings included).
  const std::string& text() const noexcept { return text_; }
  /// Bytes delivered so far.
  std::size_t n_delivered() const noexcept { return emitted_; }

 private:
  delta advance(std::size_t n_new, const stop_criteria& stop) {
    delta out;
    if (stopped_) return out;
    if (const auto at = stop.find_stop_string(text_, n_new)) {
      stopped_ = true;
      out.stop_string = true;
      if (*at > emitted_) out.text = text_.substr(emitted_, *at - emitted_);
      emitted_ = std::max(emitted_, *at);
      return out;
    }
    std::size_t end = text_.size() - stop.partial_stop_length(text_);
    end -= incomplete_utf8_tail(std::string_view(text_).substr(0, end));
    if (end > emitted_) {
      out.text = text_.substr(emitted_, end - emitted_);
      emitted_ = end;
    }
    return out;
  }

  std::string text_;
  std::size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace llmkit::serve
