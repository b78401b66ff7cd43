// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/self_draft.hpp
/// A draft model made from the target itself, as a GGUF image that any
/// GGUF Llama loader reads (`model::llama_model(model::gguf_file(bytes))`):
/// - its first `n_layers` layers (`<arch>.block_count` rewritten, later
///   `blk.N.*` tensors dropped; embedding, final norm and output kept):
///   the layer-skip / early-exit self-draft, cheaper by the dropped layers;
/// - and/or its 2-D weight matrices stored as Q8_0 (int8 with one f16 scale
///   per 32 values, round to nearest): the quantized self-draft.
/// Only `general.architecture`, `general.alignment` and the `<arch>.*`
/// scalar and string keys are copied (no tokenizer: the draft shares the
/// target's). Note that llmkit's reference Llama dequantizes Q8_0 to f32 at
/// load, so there the int8 draft has the int8 model's outputs but not its
/// speed.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"
#include "llmkit/model/quants.hpp"

namespace llmkit::search {

/// What to keep of the target.
struct self_draft_options {
  std::size_t n_layers = 0;    ///< layers kept, in [1, block_count]; 0 keeps all
  bool int8_weights = false;   ///< store 2-D weights whose rows are a multiple of 32 as Q8_0
};

/// The GGUF image of the self-draft of `target` (see the file comment).
/// @throws llmkit::error when the file has no architecture or block count,
/// or n_layers exceeds it.
std::vector<std::byte> self_draft_gguf(const model::gguf_file& target, const self_draft_options& options);

}  // namespace llmkit::search

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/search/impl/self_draft.ipp"
#endif
