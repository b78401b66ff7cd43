// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/staging.hpp
/// The staging area of prefilled requests (`engine::submit_prefilled`):
/// how many staging blocks a request's KV buffer takes while it waits, and
/// its import into the engine's cache when the scheduler swaps it in.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/sched/state.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/engine_cache.hpp"
#include "llmkit/serve/request.hpp"

namespace llmkit::serve::detail {

/// Staging blocks (of `block_size` tokens) of a prefilled request's buffer,
/// given its `[n_given] given` tokens: the context before its last given
/// token, or 0 when a token rule of `r.stop` ends it within the given
/// tokens (it never reaches the scheduler).
inline std::int64_t staged_blocks(const generation_request& r, std::span<const token_id> given,
                                  std::int64_t block_size) {
  for (std::size_t i = 1; i <= given.size(); ++i)
    if (r.stop.check(given.first(i))) return 0;
  return sched::blocks_for(static_cast<std::int64_t>(r.prompt.size() + given.size() - 1), block_size);
}

/// Imports the KV buffer of staged request `l` into `cache` as a new
/// sequence holding its context but the last token, and returns it.
/// @throws llmkit::error when the cache cannot import buffers or has no
/// room, or the buffer is corrupt, foreign or of another length (then the
/// cache holds nothing of it).
template <engine_cache Cache>
kv::seq_id import_buffer(Cache& cache, const live_request& l) {
  if constexpr (importing_cache<Cache>) {
    const std::optional<kv::seq_id> seq = cache.import_sequence(l.kv);
    LLMKIT_CHECK(seq.has_value(), "the cache has no room for the buffer (or holds its maximum of sequences)");
    const std::size_t expected = l.context.size() - 1;
    if (cache.n_tokens(*seq) != expected) {
      const std::size_t got = cache.n_tokens(*seq);
      cache.free(*seq);
      LLMKIT_CHECK(false, "the buffer holds ", got, " tokens, the request's context needs ", expected,
                   " (prompt + given tokens - 1)");
    }
    return *seq;
  } else {
    LLMKIT_CHECK(false, "the cache cannot import KV buffers");
    return {};
  }
}

}  // namespace llmkit::serve::detail
