// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/token_vocabulary.hpp
/// A vocabulary as grammar masks need it: its byte trie, each token's bytes
/// and its end-of-sequence ids.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
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

  /// From a tokenizer; `eos` defaults to the tokenizer's EOS id.
  static std::shared_ptr<const token_vocabulary> from_tokenizer(const model::tokenizer& tok,
                                                                std::vector<token_id> eos = {}) {
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
    v->trie = vocabulary_trie(v->bytes, excluded);
    if (eos.empty() && tok.eos() >= 0) eos.push_back(tok.eos());
    for (token_id e : eos)
      LLMKIT_CHECK(e >= 0 && static_cast<std::size_t>(e) < n, "token_vocabulary: eos id ", e, " outside [0, ", n, ")");
    v->eos = std::move(eos);
    return v;
  }
};

}  // namespace llmkit::grammar
