// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/engine_cache.hpp
/// What a serving engine needs from its KV cache: a block-paged cache
/// (sequences added and freed, a block pool the scheduler's accounting
/// mirrors), optionally prefix reuse (`kv::prefix_cache`), and optionally
/// sequences imported from another cache (both).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "llmkit/core/ids.hpp"
#include "llmkit/kv/block_pool.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/prefix_cache.hpp"

namespace llmkit::serve {

/// A paged KV cache an engine can schedule (`kv::paged_cache`,
/// `kv::prefix_cache`): `block_size` tokens per block, a `pool()` of
/// blocks, sequences added empty, forked (blocks shared copy-on-write, for
/// n > 1 samples of a prompt) and freed.
template <class C>
concept engine_cache = kv::kv_cache<C> && requires(C& c, const C& cc, kv::seq_id s) {
  { C::block_size } -> std::convertible_to<std::size_t>;
  { cc.pool() } -> std::convertible_to<const kv::block_pool&>;
  { c.add_sequence() } -> std::same_as<std::optional<kv::seq_id>>;
  { c.fork(s) } -> std::same_as<std::optional<kv::seq_id>>;
  c.free(s);
};

/// An engine cache that shares published prompt blocks across sequences
/// (`kv::prefix_cache`): looked up with `match` before admission, handed
/// out by `add_sequence(context)`, published by `commit` after each step.
template <class C>
concept prefix_reusing_cache =
    engine_cache<C> && kv::token_tracking_cache<C> &&
    requires(C& c, const C& cc, kv::seq_id s, std::size_t n, std::span<const token_id> tokens) {
      { c.add_sequence(tokens) } -> std::same_as<std::optional<kv::prefix_hit>>;
      { cc.match(tokens) } -> std::convertible_to<std::size_t>;
      c.commit(s);
      c.truncate(s, n);
      { cc.stats() } -> std::convertible_to<kv::prefix_cache_stats>;
    };

/// An engine cache that adds a sequence from a byte buffer exported by
/// another cache of the same shape (`kv::paged_cache::import_sequence`,
/// `kv::prefix_cache::import_sequence`): nullopt when it has no room,
/// `llmkit::error` for a corrupt or foreign buffer. `engine::submit_prefilled`
/// needs it.
template <class C>
concept importing_cache = engine_cache<C> && requires(C& c, std::span<const std::byte> buffer) {
  { c.import_sequence(buffer) } -> std::same_as<std::optional<kv::seq_id>>;
};

}  // namespace llmkit::serve
