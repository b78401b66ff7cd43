// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/hybrid_cache.hpp
/// One KV cache for a model whose layers keep different histories: the
/// global layers in a `Global` cache (every position: contiguous or paged),
/// the local (sliding-window) layers in a `Local` cache that keeps only the
/// window (`sliding_window_cache`). Gemma 2/3 (5 local layers of 6 in
/// Gemma 3) and gpt-oss (every other layer, window 128) only ever read the
/// last `window` positions in their local layers, so their memory stops
/// growing with the context there.
///
///     model layer l    ->  Global layer g  (local_layers[l] == 0)
///                          Local layer  j  (local_layers[l] != 0)
///     n_tokens(s)      =   positions appended (the Global cache's count)
///     n_chunks(s)      =   max of the two caches' chunk counts; a layer's
///                          chunks past its own cache's count are empty
///
/// Attention kernels read layers through `chunk(s, layer, head, i)` and skip
/// empty chunks, so the same kernels serve both kinds of layer; a local
/// layer needs a sliding-window mask at least as narrow as the Local
/// cache's window (the model's forward pass checks this). Every sequence
/// is a pair of sequences, one in each cache, added, forked, truncated and
/// freed together.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/block_pool.hpp"
#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/detail/checks.hpp"
#include "llmkit/kv/detail/sequence_table.hpp"
#include "llmkit/kv/kv_view.hpp"

namespace llmkit::kv {

namespace detail {
/// `block_size` of a hybrid cache: its Global cache's, when it has one.
template <class Global>
struct hybrid_block_size {};
template <class Global>
  requires requires { Global::block_size; }
struct hybrid_block_size<Global> {
  /// Tokens per block of the Global cache (the one a scheduler accounts).
  static constexpr std::size_t block_size = Global::block_size;
};
}  // namespace detail

/// See the file comment. Satisfies `kv_cache`; offers `pool()` and
/// `block_size` (of the Global cache) when the Global cache does, so that a
/// paged Global cache makes an engine cache (serve/engine_cache.hpp).
template <kv_cache Global, kv_cache Local>
  requires std::same_as<typename Global::storage_type, typename Local::storage_type>
class hybrid_cache : public detail::hybrid_block_size<Global> {
 public:
  using storage_type = typename Global::storage_type;
  using global_cache_type = Global;
  using local_cache_type = Local;

  /// `[shape.n_layers] local_layers`: non-zero marks a local layer (the
  /// form of model::llama_config::local_layers). The Global cache is built
  /// as `Global({n_global, n_kv_heads, head_dim}, global_options)`, the Local
  /// one likewise with the local layers.
  /// @throws llmkit::error when local_layers.size() differs from
  /// shape.n_layers, or marks no layer or every layer (use the Local or the
  /// Global cache alone then), or when a sub-cache rejects its options.
  template <class GlobalOptions, class LocalOptions>
  hybrid_cache(kv_shape shape, std::span<const std::uint8_t> local_layers, const GlobalOptions& global_options,
               const LocalOptions& local_options)
      : shape_(checked(shape, local_layers)),
        global_(kv_shape{count(local_layers, false), shape.n_kv_heads, shape.head_dim}, global_options),
        local_(kv_shape{count(local_layers, true), shape.n_kv_heads, shape.head_dim}, local_options),
        sequences_(static_cast<std::size_t>(std::numeric_limits<seq_id>::max())) {
    std::size_t g = 0, j = 0;
    for (std::uint8_t local : local_layers) layers_.push_back({local != 0, local != 0 ? j++ : g++});
  }

  /// The model's shape: every layer, global and local.
  kv_shape shape() const noexcept { return shape_; }
  /// True when layer l lives in the Local cache. @pre l < shape().n_layers
  bool is_local(std::size_t l) const noexcept { return layers_[l].local; }
  const Global& global_cache() const noexcept { return global_; }
  const Local& local_cache() const noexcept { return local_; }

  /// The block pool of a paged Global cache.
  const block_pool& pool() const noexcept
    requires requires(const Global& c) { c.pool(); }
  {
    return global_.pool();
  }

  /// Free blocks of the Global cache that grow(s, n) needs.
  std::size_t blocks_needed(seq_id s, std::size_t n) const
    requires requires(const Global& c, seq_id t, std::size_t m) { c.blocks_needed(t, m); }
  {
    return global_.blocks_needed(at(s, "blocks_needed").global, n);
  }

  /// Adds an empty sequence to both caches; nullopt when either is full.
  std::optional<seq_id> add_sequence() {
    const std::optional<seq_id> g = global_.add_sequence();
    if (!g) return std::nullopt;
    const std::optional<seq_id> l = local_.add_sequence();
    if (!l) {
      global_.free(*g);
      return std::nullopt;
    }
    return sequences_.insert({*g, *l});
  }

  /// Frees s in both caches. @throws llmkit::error for an unknown id.
  void free(seq_id s) {
    const pair p = at(s, "free");
    global_.free(p.global);
    local_.free(p.local);
    sequences_.erase(s);
  }

  /// A new sequence holding s's rows in both caches (as each cache forks:
  /// shared copy-on-write blocks, or a copy of the ring); nullopt when
  /// either is full.
  std::optional<seq_id> fork(seq_id s) {
    const pair p = at(s, "fork");
    const std::optional<seq_id> g = global_.fork(p.global);
    if (!g) return std::nullopt;
    const std::optional<seq_id> l = local_.fork(p.local);
    if (!l) {
      global_.free(*g);
      return std::nullopt;
    }
    return sequences_.insert({*g, *l});
  }

  /// Rolls s back to its first n_tokens positions in both caches.
  /// @throws llmkit::error (nothing changed) when either cache refuses:
  /// n_tokens > n_tokens(s), or a ring that no longer holds the rows the
  /// next query needs.
  void truncate(seq_id s, std::size_t n_tokens)
    requires requires(Global& g, Local& l, seq_id t, std::size_t m) {
      g.truncate(t, m);
      l.truncate(t, m);
    }
  {
    const pair p = at(s, "truncate");
    local_.truncate(p.local, n_tokens);  // the one that may refuse a rollback: first
    global_.truncate(p.global, n_tokens);
  }

  bool contains(seq_id s) const noexcept { return sequences_.contains(s); }
  std::size_t n_sequences() const noexcept { return sequences_.size(); }
  /// Positions appended to s (the next token's position).
  std::size_t n_tokens(seq_id s) const { return global_.n_tokens(at(s, "n_tokens").global); }

  /// Reserves n more positions in both caches. Returns false, with nothing
  /// changed, when either has no room.
  bool grow(seq_id s, std::size_t n) {
    const pair p = at(s, "grow");
    const std::size_t before = global_.n_tokens(p.global);
    if (!global_.grow(p.global, n)) return false;
    bool grown = false;
    try {
      grown = local_.grow(p.local, n);
    } catch (...) {
      global_.truncate(p.global, before);
      throw;
    }
    if (!grown) global_.truncate(p.global, before);
    return grown;
  }

  /// Writes `[n_new, n_kv_heads, head_dim] k, v` (f32) of model layer
  /// `layer` for positions [first_token, first_token + n_new) into the
  /// cache that holds the layer. @throws llmkit::error as the caches' store.
  void store(seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    const pair p = at(s, "store");
    LLMKIT_CHECK(layer < shape_.n_layers, "store: layer ", layer, " is out of range [0, ", shape_.n_layers, ")");
    const layer_slot& w = layers_[layer];
    if (w.local)
      local_.store(p.local, w.index, first_token, k, v);
    else
      global_.store(p.global, w.index, first_token, k, v);
  }

  /// The larger of the two caches' chunk counts for s.
  std::size_t n_chunks(seq_id s) const {
    const pair p = at(s, "n_chunks");
    return std::max(global_.n_chunks(p.global), local_.n_chunks(p.local));
  }

  /// Chunk i of model layer `layer`: its cache's chunk i, or an empty chunk
  /// past that cache's count.
  kv_chunk<storage_type> chunk(seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    const pair p = at(s, "chunk");
    detail::check_chunk(shape_, layer, kv_head, i, n_chunks(s));
    const layer_slot& w = layers_[layer];
    if (w.local)
      return i < local_.n_chunks(p.local) ? local_.chunk(p.local, w.index, kv_head, i) : kv_chunk<storage_type>{};
    return i < global_.n_chunks(p.global) ? global_.chunk(p.global, w.index, kv_head, i) : kv_chunk<storage_type>{};
  }

  /// Both caches' statistics added up; n_sequences and n_tokens count each
  /// sequence once.
  cache_usage usage() const {
    const cache_usage g = global_.usage(), l = local_.usage();
    return {.n_sequences = g.n_sequences,
            .n_tokens = g.n_tokens,
            .bytes_allocated = g.bytes_allocated + l.bytes_allocated,
            .bytes_in_use = g.bytes_in_use + l.bytes_in_use,
            .token_bytes = g.token_bytes + l.token_bytes};
  }

 private:
  struct pair {
    seq_id global = 0, local = 0;
  };
  struct layer_slot {
    bool local = false;
    std::size_t index = 0;  // layer in its own cache
  };

  static std::size_t count(std::span<const std::uint8_t> local_layers, bool local) {
    return static_cast<std::size_t>(
        std::count_if(local_layers.begin(), local_layers.end(), [&](std::uint8_t x) { return (x != 0) == local; }));
  }
  static kv_shape checked(kv_shape shape, std::span<const std::uint8_t> local_layers) {
    detail::check_shape("hybrid_cache", shape);
    LLMKIT_CHECK(local_layers.size() == shape.n_layers, "hybrid_cache: local_layers.size() = ", local_layers.size(),
                 " differs from shape.n_layers = ", shape.n_layers);
    const std::size_t n_local = count(local_layers, true);
    LLMKIT_CHECK(n_local > 0 && n_local < shape.n_layers, "hybrid_cache: local_layers marks ", n_local, " of ",
                 shape.n_layers, " layers local; a hybrid needs both kinds (use one cache alone otherwise)");
    return shape;
  }
  const pair& at(seq_id s, const char* what) const { return sequences_.at(s, what); }

  kv_shape shape_;
  Global global_;
  Local local_;
  std::vector<layer_slot> layers_;  // [n_layers]
  detail::sequence_table<pair> sequences_;
};

}  // namespace llmkit::kv
