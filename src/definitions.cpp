// SPDX-License-Identifier: MIT
// llmkit's non-template functions (GGUF reader, weight loading, tokenizers,
// chat templates, run-time sampling chain, ...), compiled once for all of
// llmkit's in-tree binaries (see include/llmkit/core/config.hpp).
#include <llmkit/src.hpp>
