// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/token_vocabulary.hpp
/// A vocabulary as grammar masks need it: its byte trie, each token's bytes
/// and its end-of-sequence ids.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/grammar/vocabulary_trie.hpp"
#include "llmkit/model/tokenizer.hpp"

namespace llmkit::grammar {

/// A vocabulary as masks need it: its trie, each token's bytes and its
/// end-of-sequence ids. Build once per vocabulary and share. Special
/// (control, user-defined), unknown and unused tokens get no bytes: no
/// grammar allows them; EOS ids are allowed where the grammar may end.
struct token_vocabulary {
  vocabulary_trie trie;
  std::vector<std::string> bytes;  ///< [n_vocab] bytes of each token (empty for special tokens)
  std::vector<token_id> eos;       ///< ids that end the output (allowed where the grammar may end)

  std::size_t size() const noexcept { return bytes.size(); }
  bool is_eos(token_id t) const noexcept { return std::find(eos.begin(), eos.end(), t) != eos.end(); }

  /// The byte before a named special token's text (see from_tokenizer).
  static constexpr char special_prefix = '\x01';

  /// From a tokenizer; `eos` defaults to the tokenizer's EOS id.
  /// `[k] named_specials`: texts of special tokens that grammars may name
  /// (harmony's `<|channel|>`, ...): such a token's bytes are
  /// `special_prefix` and its text, so a grammar allows it only where it
  /// writes `"\x01<|channel|>"`; no JSON string or whitespace rule matches
  /// a control byte.
  static std::shared_ptr<const token_vocabulary> from_tokenizer(const model::tokenizer& tok,
                                                                std::vector<token_id> eos = {},
                                                                std::span<const std::string_view> named_specials = {}) {
    auto v = std::make_shared<token_vocabulary>();
    const std::size_t n = tok.vocab_size();
    v->bytes.resize(n);
    std::vector<bool> excluded(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<token_id>(i);
      const model::token_type type = tok.type(id);
      excluded[i] = model::is_special(type) || type == model::token_type::unknown || type == model::token_type::unused;
      if (!excluded[i]) tok.decode_token(id, v->bytes[i]);
    }
    for (const std::string_view text : named_specials)
      if (const auto id = tok.find(text); id && model::is_special(tok.type(*id))) {
        excluded[static_cast<std::size_t>(*id)] = false;
        v->bytes[static_cast<std::size_t>(*id)] = special_prefix + std::string(text);
      }
    v->trie = vocabulary_trie(v->bytes, excluded);
    if (eos.empty() && tok.eos() >= 0) eos.push_back(tok.eos());
    for (token_id e : eos)
      LLMKIT_CHECK(e >= 0 && static_cast<std::size_t>(e) < n, "token_vocabulary: eos id ", e, " outside [0, ", n, ")");
    v->eos = std::move(eos);
    return v;
  }
};

}  // namespace llmkit::grammar
