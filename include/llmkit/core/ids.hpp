// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/ids.hpp
/// The id types every module shares: a token of the vocabulary and a
/// request of a serving engine.

#include <cstdint>

namespace llmkit {

/// A token of a model's vocabulary, in [0, vocab size); -1 where a slot has
/// no token (an absent special token, an unset result).
using token_id = std::int32_t;

/// Identifies a generation request for its whole life; unique per scheduler.
using request_id = std::int64_t;

}  // namespace llmkit
