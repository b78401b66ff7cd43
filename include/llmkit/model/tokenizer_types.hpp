// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/tokenizer_types.hpp
/// What every tokenizer shares: token types, special ids and the options of
/// `encode` and `decode`.

#include <cstdint>

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

/// How `encode` treats its text.
struct encode_options {
  /// Prepend the BOS token (when the vocabulary has one). Pass
  /// `tok.add_bos_token()` to do what the model file asks.
  bool add_bos = false;
  /// Turn the text of special tokens (control and user-defined types, e.g.
  /// `<|eot_id|>`) into their ids; otherwise they are encoded as plain text.
  bool parse_special = false;
};

/// How `decode` renders ids.
struct decode_options {
  /// Remove one leading space (SentencePiece's dummy prefix).
  bool strip_prefix_space = false;
  /// Render control tokens as their text (`<|eot_id|>`) instead of nothing.
  bool render_special = false;
};

}  // namespace llmkit::model
