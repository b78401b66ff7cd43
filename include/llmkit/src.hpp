// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/src.hpp
/// The definitions of llmkit's non-template functions, for programs built
/// with LLMKIT_SEPARATE_COMPILATION (see core/config.hpp): include this
/// header in exactly one source file of the program.

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#error "<llmkit/src.hpp> is for programs that define LLMKIT_SEPARATE_COMPILATION in every file; without it the headers define everything inline"
#endif

#include "llmkit/model/impl/bpe_tokenizer.ipp"
#include "llmkit/model/impl/chat_template.ipp"
#include "llmkit/model/impl/gguf.ipp"
#include "llmkit/model/impl/gguf_writer.ipp"
#include "llmkit/model/impl/llama.ipp"
#include "llmkit/model/impl/llama_config.ipp"
#include "llmkit/model/impl/quants.ipp"
#include "llmkit/model/impl/sentencepiece_tokenizer.ipp"
#include "llmkit/model/impl/synthetic.ipp"
#include "llmkit/model/impl/tokenizer.ipp"
#include "llmkit/model/impl/weights.ipp"
#include "llmkit/sampling/impl/runtime_chain.ipp"
#include "llmkit/search/impl/self_draft.ipp"
