// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/window_cache.hpp
/// KV caches for a model with local (sliding-window) layers: the global
/// layers keep every position (a contiguous or a paged cache), the local
/// ones a ring of the last `sliding_window` positions (kv::hybrid_cache of
/// a Global cache and a kv::sliding_window_cache). llama_model::forward
/// gives the same logits, bit for bit, as on a cache that keeps every
/// layer's history (the ring is aligned to the attention kernels' tiles);
/// memory of a long context falls by the local layers' share.
///
/// @code
///   auto cache = model::make_window_cache<float>(m.config(), {.max_tokens = 8192, .max_grow = 512});
///   const kv::seq_id s = *cache.add_sequence();
///   m.forward(batch, cache);  // prompt chunks of at most max_grow tokens
/// @endcode

#include <cstddef>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/contiguous_cache.hpp"
#include "llmkit/kv/hybrid_cache.hpp"
#include "llmkit/kv/paged_cache.hpp"
#include "llmkit/kv/sliding_window_cache.hpp"
#include "llmkit/kv/storage.hpp"
#include "llmkit/model/llama_config.hpp"

namespace llmkit::model {

/// Position multiple the local layers' ring starts its visible rows at: a
/// multiple of the attention kernels' key tile (prefill, 32 rows) and
/// decode block (16 or 32 rows), so that a local layer's keys fall into the
/// same tiles as in a full cache and its sums run in the same order.
inline constexpr std::size_t local_ring_align = 32;

/// Capacity of a window cache.
struct window_cache_options {
  std::size_t max_sequences = 1;  ///< live sequences at once (> 0)
  std::size_t max_tokens = 0;     ///< positions per sequence in the global layers (contiguous Global cache, > 0)
  std::size_t max_grow = 512;     ///< most tokens one forward() adds to a sequence (prefill chunk, > 0)
  std::size_t max_rollback = 0;   ///< tokens truncate may roll back (speculative decoding)
};

/// The ring options of `c`'s local layers: window `c.sliding_window`, no
/// sinks, aligned to local_ring_align. @throws llmkit::error when `c` has
/// no sliding window.
inline kv::sliding_window_options local_ring_options(const llama_config& c, std::size_t max_grow,
                                                     std::size_t max_sequences, std::size_t max_rollback = 0) {
  LLMKIT_CHECK(c.sliding_window > 0, "local_ring_options: the model has no sliding window (its layers are all global)");
  return {.window = c.sliding_window,
          .n_sink = 0,
          .max_grow = max_grow,
          .max_rollback = max_rollback,
          .max_sequences = max_sequences,
          .align = local_ring_align};
}

/// Global layers in a contiguous cache of `max_tokens` per sequence, local
/// layers in rings.
template <kv::kv_storage T>
using window_cache = kv::hybrid_cache<kv::contiguous_cache<T>, kv::sliding_window_cache<T>>;

/// Global layers in a paged cache (its pool is what an engine schedules),
/// local layers in one ring per sequence.
template <kv::kv_storage T, std::size_t BlockSize>
using paged_window_cache = kv::hybrid_cache<kv::paged_cache<T, BlockSize>, kv::sliding_window_cache<T>>;

/// A window_cache for the model of config `c`.
/// @throws llmkit::error when `c` has no local layer or no global one
/// (a single cache serves it then), or for a zero capacity.
template <kv::kv_storage T>
window_cache<T> make_window_cache(const llama_config& c, const window_cache_options& o) {
  return window_cache<T>(c.kv_shape(), c.local_layers,
                         kv::contiguous_cache_options{.max_sequences = o.max_sequences, .max_tokens = o.max_tokens},
                         local_ring_options(c, o.max_grow, o.max_sequences, o.max_rollback));
}

/// A paged_window_cache for the model of config `c`: `n_blocks` blocks of
/// the global layers; rings for up to `max_sequences` sequences, each grown
/// by at most `max_grow` tokens per forward() (an engine's step token
/// budget). @throws llmkit::error as make_window_cache.
template <kv::kv_storage T, std::size_t BlockSize>
paged_window_cache<T, BlockSize> make_paged_window_cache(const llama_config& c, std::size_t n_blocks,
                                                         std::size_t max_sequences, std::size_t max_grow,
                                                         std::size_t max_rollback = 0) {
  return paged_window_cache<T, BlockSize>(
      c.kv_shape(), c.local_layers, kv::paged_cache_options{.n_blocks = n_blocks, .max_sequences = max_sequences},
      local_ring_options(c, max_grow, max_sequences, max_rollback));
}

}  // namespace llmkit::model
