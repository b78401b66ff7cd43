// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/vocabulary.hpp
/// What the SentencePiece and byte-level BPE tokenizers share: a vocabulary
/// (entries as stored, their types, the special ids, an index from stored
/// text to id) and the public queries on it, inherited by both tokenizers.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model::detail {

/// A tokenizer's vocabulary of n_vocab entries.
struct vocabulary {
  std::vector<std::string> tokens;  ///< `[n_vocab]` entries as stored
  std::vector<token_type> types;    ///< `[n_vocab]`
  special_ids ids;
  bool add_bos_token = false;                            ///< `tokenizer.ggml.add_bos_token`
  std::unordered_map<std::string_view, token_id> index;  ///< stored text -> id (views into `tokens`)
};

/// The vocabulary queries of tokenizer `Tokenizer` (a CRTP base): it hands
/// its `vocabulary` over with a `vocab()` member this base may call.
template <class Tokenizer>
class vocabulary_queries {
 public:
  std::size_t vocab_size() const noexcept { return vocab().tokens.size(); }
  token_id bos() const noexcept { return vocab().ids.bos; }
  token_id eos() const noexcept { return vocab().ids.eos; }
  token_id unk() const noexcept { return vocab().ids.unk; }
  /// Whether the model expects BOS in front of a prompt
  /// (`tokenizer.ggml.add_bos_token`; when absent, false for byte-level BPE
  /// and true for SentencePiece).
  bool add_bos_token() const noexcept { return vocab().add_bos_token; }

  /// The vocabulary entry of `id` as stored ("Ġthe", "<|eot_id|>" in
  /// byte-level BPE; with '▁', "<0x41>", "<s>" in SentencePiece).
  /// @throws llmkit::error for an id outside the vocabulary.
  std::string_view token_text(token_id id) const {
    check_id(id, "token_text");
    return vocab().tokens[static_cast<std::size_t>(id)];
  }
  /// The type of `id`. @throws llmkit::error for an id outside the vocabulary.
  token_type type(token_id id) const {
    check_id(id, "type");
    return vocab().types[static_cast<std::size_t>(id)];
  }
  /// The id of the vocabulary entry `text` (as stored), if any.
  std::optional<token_id> find(std::string_view text) const {
    const auto& index = vocab().index;
    auto it = index.find(text);
    if (it == index.end()) return std::nullopt;
    return it->second;
  }

 protected:
  /// @throws llmkit::error naming `what` when `id` is outside the vocabulary.
  void check_id(token_id id, const char* what) const {
    const std::size_t n = vocab().tokens.size();
    LLMKIT_CHECK(id >= 0 && static_cast<std::size_t>(id) < n, "tokenizer::", what, ": token id ", id,
                 " is outside the vocabulary of ", n, " tokens");
  }

 private:
  const vocabulary& vocab() const noexcept { return static_cast<const Tokenizer&>(*this).vocab(); }
};

}  // namespace llmkit::model::detail
