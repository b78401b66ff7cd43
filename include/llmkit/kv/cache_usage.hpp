// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/cache_usage.hpp
/// The memory and sequence statistics every cache reports through `usage()`.

#include <cstddef>

namespace llmkit::kv {

/// A snapshot of what a cache holds. Bytes count K and V rows and int8
/// scales of every layer and KV head.
struct cache_usage {
  std::size_t n_sequences = 0;      ///< live sequences
  std::size_t n_tokens = 0;         ///< sum of n_tokens over live sequences (shared tokens counted per sequence)
  std::size_t bytes_allocated = 0;  ///< memory the cache holds right now (a paged pool counts every block)
  std::size_t bytes_in_use = 0;     ///< memory backing live sequences (reserved rows or used blocks, shared once)
  std::size_t token_bytes = 0;      ///< n_tokens * bytes_per_token: what the tokens need without slack or sharing
};

}  // namespace llmkit::kv
