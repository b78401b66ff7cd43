// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/grammar.hpp
/// The grammar module: GBNF grammars compiled to a lazily built byte
/// automaton, token masks over a vocabulary trie, and the logits processor
/// that applies them (docs/grammar.md). JSON Schema conversion is in
/// json_schema.hpp (it needs nlohmann/json, so it is not included here).

#include "llmkit/grammar/automaton.hpp"
#include "llmkit/grammar/gbnf.hpp"
#include "llmkit/grammar/processor.hpp"
#include "llmkit/grammar/token_masker.hpp"
#include "llmkit/grammar/vocabulary_trie.hpp"
