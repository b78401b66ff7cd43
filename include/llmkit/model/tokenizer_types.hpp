// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/tokenizer_types.hpp
/// What every tokenizer shares: token types, special ids and the options of
/// `encode` and `decode`.

#include <cstddef>
#include <cstdint>
#include <span>

#include "llmkit/core/ids.hpp"

namespace llmkit::model {

/// Token types as stored in `tokenizer.ggml.token_type`.
enum class token_type : std::int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

/// True for the types that plain text never produces: control tokens
/// (`<s>`, `<|eot_id|>`) and user-defined tokens; `encode` matches them
/// only with `encode_options::parse_special`.
constexpr bool is_special(token_type t) noexcept { return t == token_type::control || t == token_type::user_defined; }

/// A vocabulary's special ids; -1 when the vocabulary has none.
struct special_ids {
  token_id bos = -1;
  token_id eos = -1;
  token_id unk = -1;
};

/// The bytes `[offset, offset + length)` of a text.
struct text_span {
  std::size_t offset = 0;
  std::size_t length = 0;
  std::size_t end() const noexcept { return offset + length; }
  friend bool operator==(const text_span&, const text_span&) = default;
};

/// How `encode` treats its text.
struct encode_options {
  /// Prepend the BOS token (when the vocabulary has one). Pass
  /// `tok.add_bos_token()` to do what the model file asks.
  bool add_bos = false;
  /// Turn the text of special tokens (control and user-defined types, e.g.
  /// `<|eot_id|>`) into their ids; otherwise they are encoded as plain text.
  bool parse_special = false;
  /// With `parse_special`: `[n] literal` byte ranges of the text (sorted by
  /// offset, not overlapping) where special-token texts stay plain text, e.g.
  /// the message contents of a formatted chat (`chat_template::format_marked`),
  /// so only the template's own markers become control tokens. A special
  /// token whose text overlaps a literal range is not parsed; the text
  /// between parsed special tokens is encoded whole, as without ranges.
  std::span<const text_span> literal{};
};

/// How `decode` renders ids.
struct decode_options {
  /// Remove one leading space (SentencePiece's dummy prefix).
  bool strip_prefix_space = false;
  /// Render control tokens as their text (`<|eot_id|>`) instead of nothing.
  bool render_special = false;
};

}  // namespace llmkit::model
