// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/sentencepiece_tokenizer.hpp
/// SentencePiece-BPE tokenizer as stored in GGUF metadata
/// (`tokenizer.ggml.model = "llama"`): tokens, scores and token types.
/// Most code uses it through `llmkit::model::tokenizer` (model/tokenizer.hpp).
///
/// Encoding follows SentencePiece / llama.cpp's SPM tokenizer:
/// 1. a space is prepended (the "dummy prefix", unless
///    `tokenizer.ggml.add_space_prefix` is false) and every ' ' becomes
///    U+2581 '▁';
/// 2. the text is split into UTF-8 characters;
/// 3. repeatedly, among all adjacent pairs whose concatenation is a
///    vocabulary token, the pair whose token has the highest score is merged
///    (the leftmost pair on ties);
/// 4. each remaining piece that is not in the vocabulary (an unknown
///    character) falls back to its UTF-8 bytes as `<0xXX>` tokens (or to the
///    unknown token when the vocabulary has no byte tokens).
/// With `encode_options::parse_special`, the text of control and
/// user-defined tokens (`<s>`) becomes their id first; the dummy prefix is
/// then added to the text at the start and after each special token, as
/// llama.cpp does.
///
/// Decoding maps '▁' back to ' ', byte tokens to their raw byte (so
/// multi-byte characters split over several byte tokens reassemble into
/// UTF-8) and control tokens (BOS, EOS, ...) to nothing.
///
/// Copies are cheap and share the (immutable) vocabulary.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/detail/special_tokens.hpp"
#include "llmkit/model/detail/vocabulary.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model {

/// A SentencePiece-BPE vocabulary with encode and decode.
class sentencepiece_tokenizer : public detail::vocabulary_queries<sentencepiece_tokenizer> {
 public:
  /// Builds a tokenizer from `[n_vocab] tokens`, `[n_vocab] scores` and
  /// `[n_vocab] types` (empty types = all normal). `add_bos_token` is what
  /// `add_bos_token()` reports (the file's `tokenizer.ggml.add_bos_token`).
  sentencepiece_tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<token_type> types,
                          special_ids ids, bool add_space_prefix = true, bool add_bos_token = true);

  /// Reads `tokenizer.ggml.*` from a GGUF file whose `tokenizer.ggml.model`
  /// is "llama".
  static sentencepiece_tokenizer from_gguf(const gguf_file& file);

  // vocab_size, bos, eos, unk, add_bos_token, token_text, type, find:
  // detail::vocabulary_queries.
  bool add_space_prefix() const noexcept { return data_->add_space_prefix; }
  float score(token_id id) const {
    check_id(id, "score");
    return data_->scores[static_cast<std::size_t>(id)];
  }

  /// Encodes UTF-8 `text` (see the file comment). Empty text gives no
  /// tokens (besides BOS). Invalid UTF-8 is encoded byte by byte.
  std::vector<token_id> encode(std::string_view text, encode_options options = {}) const;

  /// Appends the text of `id` to `out`: '▁' -> ' ', byte tokens -> their
  /// byte, control tokens -> nothing (their text with
  /// `options.render_special`).
  void decode_token(token_id id, std::string& out, decode_options options = {}) const;

  /// Decodes `[n] ids` into UTF-8 text.
  std::string decode(std::span<const token_id> ids, decode_options options = {}) const;

  /// U+2581, SentencePiece's visible space.
  static constexpr std::string_view space_marker = "\xe2\x96\x81";

 private:
  friend class detail::vocabulary_queries<sentencepiece_tokenizer>;

  struct data : detail::vocabulary {
    std::vector<float> scores;
    bool add_space_prefix = true;
    std::array<token_id, 256> byte_ids{};
    std::vector<int> byte_values;  // [n_vocab] byte of a byte token, else -1
    detail::special_token_matcher specials;
  };

  // Appends the tokens of `text` (no special tokens in it) to `out`.
  void encode_text(std::string_view text, bool dummy_prefix, std::vector<token_id>& out) const;

  const detail::vocabulary& vocab() const noexcept { return *data_; }

  static std::size_t utf8_length(unsigned char lead) noexcept {
    if (lead < 0x80) return 1;
    if ((lead & 0xe0) == 0xc0) return 2;
    if ((lead & 0xf0) == 0xe0) return 3;
    if ((lead & 0xf8) == 0xf0) return 4;
    return 1;  // continuation or invalid byte: on its own
  }

  static std::optional<int> parse_byte_token(std::string_view t);

  std::shared_ptr<const data> data_;
};

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/sentencepiece_tokenizer.ipp"
#endif
