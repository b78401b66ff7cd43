// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/tokenizer.ipp
/// tokenizer::from_gguf (model/tokenizer.hpp): compiled inline by the
/// header, or once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <string_view>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/bpe_tokenizer.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/sentencepiece_tokenizer.hpp"
#include "llmkit/model/tokenizer.hpp"

namespace llmkit::model {

LLMKIT_DECL tokenizer tokenizer::from_gguf(const gguf_file& file) {
  const auto model = file.get<std::string_view>("tokenizer.ggml.model");
  if (model == "llama") return sentencepiece_tokenizer::from_gguf(file);
  if (model == "gpt2") return bpe_tokenizer::from_gguf(file);
  ::llmkit::detail::throw_error("tokenizer: tokenizer.ggml.model is '", model,
                                "'; supported: 'llama' (SentencePiece BPE), 'gpt2' (byte-level BPE)");
}

}  // namespace llmkit::model
