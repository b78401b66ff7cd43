// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/prefix_cache.hpp
/// Automatic prefix caching on top of `paged_cache` (vLLM's automatic
/// prefix caching, SGLang's radix cache at block granularity).
///
/// Every *full* block of a sequence whose token ids are known can be
/// published with `commit`: it is keyed by a hash of its BlockSize token ids
/// chained with its parent block's hash, so a key names the whole prefix up
/// to and including that block. The cache holds one reference on each
/// published block, which therefore outlives the sequences that made it.
/// `add_sequence(prompt)` walks the prompt block by block, reuses the longest
/// run of published blocks (each gains a reference; nothing is copied) and
/// reports how many prompt tokens the caller can skip. When `grow` needs
/// more blocks than are free, published blocks that no sequence references
/// are evicted, least recently used first (the tail of a prefix before its
/// head).
///
///     published:  [b0 "Once upon"]--[b1 " a time"]--[b2 ", there"]
///                         |
///                         +------[b3 " in a"]      (key of b1: h(h(root, b0), b1))
///     prompt "Once upon a time, in a land":  reuses b0, b1; prefills the rest.
///
/// Hash collisions are harmless: an entry also stores its parent key and
/// token ids, and a lookup only matches when both are equal.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/kv/block_pool.hpp"
#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/paged_cache.hpp"
#include "llmkit/kv/storage.hpp"

namespace llmkit::kv {

/// The default block key: 64-bit mix of the parent key and the token ids.
struct token_block_hash {
  /// `[BlockSize] tokens`
  std::uint64_t operator()(std::uint64_t parent, std::span<const token_id> tokens) const noexcept {
    std::uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (token_id t : tokens) {
      h ^= static_cast<std::uint32_t>(t);
      h *= 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31;
    }
    h ^= h >> 30;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  }
};

/// Capacity of a prefix cache.
struct prefix_cache_options {
  std::size_t n_blocks = 0;                                              ///< blocks in the pool (> 0)
  std::size_t max_sequences = std::numeric_limits<std::int32_t>::max();  ///< live sequences at once (> 0)
};

/// What `add_sequence(prompt)` found.
struct prefix_hit {
  seq_id seq = 0;                   ///< the new sequence, holding the reused tokens
  std::size_t n_cached_tokens = 0;  ///< prompt tokens already in the cache: prefill from here
};

/// Counters of a prefix cache.
struct prefix_cache_stats {
  std::size_t n_cached_blocks = 0;     ///< published blocks
  std::size_t n_evictable_blocks = 0;  ///< published blocks no sequence references
  std::size_t n_lookups = 0;           ///< add_sequence(prompt) calls
  std::size_t n_hit_tokens = 0;        ///< prompt tokens reused over all lookups
  std::size_t n_evicted_blocks = 0;    ///< blocks evicted so far
};

/// A paged cache whose full blocks are shared across sequences by content.
/// Satisfies `kv_cache`. `BlockHash` maps (parent key, `[BlockSize]` token
/// ids) to a 64-bit key.
template <kv_storage T, std::size_t BlockSize, class BlockHash = token_block_hash>
class prefix_cache {
 public:
  using storage_type = T;
  static constexpr std::size_t block_size = BlockSize;
  /// Parent key of a sequence's first block.
  static constexpr std::uint64_t root_key = 0x243f6a8885a308d3ull;

  /// @throws llmkit::error when a shape field, n_blocks or max_sequences is 0.
  prefix_cache(kv_shape shape, prefix_cache_options options, BlockHash hash = {})
      : paged_(shape, {.n_blocks = options.n_blocks, .max_sequences = options.max_sequences}),
        hash_(std::move(hash)),
        max_sequences_(options.max_sequences) {}

  kv_shape shape() const noexcept { return paged_.shape(); }
  const block_pool& pool() const noexcept { return paged_.pool(); }
  std::size_t bytes_per_token() const noexcept { return paged_.bytes_per_token(); }
  std::size_t block_bytes() const noexcept { return paged_.block_bytes(); }
  /// The underlying paged cache (read-only: sequence changes go through this class).
  const paged_cache<T, BlockSize>& paged() const noexcept { return paged_; }

  /// Adds an empty sequence whose token ids will come through grow(s, tokens).
  /// nullopt when max_sequences are live.
  std::optional<seq_id> add_sequence() {
    auto s = paged_.add_sequence();
    if (s) states_[*s] = state{};
    return s;
  }

  /// Adds a sequence for `[n] prompt`, reusing the longest published prefix
  /// of whole blocks. At least one prompt token is always left to prefill
  /// (the model needs its logits), so at most floor((n - 1) / BlockSize)
  /// blocks are reused. The new sequence holds n_cached_tokens tokens; the
  /// caller grows it by prompt[n_cached_tokens:] and prefills those.
  /// nullopt when max_sequences are live.
  std::optional<prefix_hit> add_sequence(std::span<const token_id> prompt) {
    ++stats_.n_lookups;
    std::vector<block_id> blocks;
    std::vector<std::uint64_t> keys;
    walk(prompt, [&](std::uint64_t key, block_id b) {
      blocks.push_back(b);
      keys.push_back(key);
    });
    const std::size_t n_cached = blocks.size() * BlockSize;
    auto s = paged_.add_sequence_sharing(blocks, n_cached);
    if (!s) return std::nullopt;
    for (std::uint64_t key : keys) touch(key);
    state st;
    st.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n_cached));
    st.keys = std::move(keys);
    states_[*s] = std::move(st);
    stats_.n_hit_tokens += n_cached;
    return prefix_hit{*s, n_cached};
  }

  /// Prompt tokens `add_sequence(prompt)` would reuse right now (a multiple
  /// of BlockSize, at most `[n] prompt`'s n - 1), without adding a sequence
  /// or touching the LRU order: a scheduler asks it before admitting a
  /// request, to plan only the prefill of the rest.
  std::size_t match(std::span<const token_id> prompt) const {
    std::size_t n_blocks = 0;
    walk(prompt, [&](std::uint64_t, block_id) { ++n_blocks; });
    return n_blocks * BlockSize;
  }

  /// Frees s. Its published blocks stay cached (evictable once no sequence
  /// references them), its other blocks return to the pool.
  /// @throws llmkit::error for an unknown id.
  void free(seq_id s) {
    state& st = state_of(s, "free");
    // Tail blocks become least recent, so a prefix is evicted from its end.
    for (auto it = st.keys.rbegin(); it != st.keys.rend(); ++it) touch(*it);
    paged_.free(s);
    states_.erase(s);
  }

  /// Adds a sequence holding the K/V of a buffer made by
  /// `paged_cache::export_sequence` (see `paged_cache::import_sequence`),
  /// evicting unreferenced published blocks (LRU) when the free list is
  /// short. Its blocks are never published: their K/V were computed
  /// elsewhere, and the cache shares only what its own sequences stored.
  /// nullopt, with nothing evicted, when max_sequences are live; nullopt
  /// when even eviction cannot free enough blocks.
  /// @throws llmkit::error as `paged_cache::import_sequence` (truncated,
  /// corrupt or foreign buffer), with nothing changed.
  std::optional<seq_id> import_sequence(std::span<const std::byte> buffer) {
    auto s = paged_.import_sequence(buffer);  // validates the buffer first
    if (!s && paged_.n_sequences() < max_sequences_) {
      const std::uint64_t n = paged_cache<T, BlockSize>::exported_tokens(buffer);
      if (make_room(static_cast<std::size_t>((n + BlockSize - 1) / BlockSize))) s = paged_.import_sequence(buffer);
    }
    if (s) {
      state st;
      st.tracking = false;  // token ids unknown, from the first token on
      states_[*s] = std::move(st);
    }
    return s;
  }

  /// A new sequence sharing all of s's blocks (and its token ids); nullopt
  /// when max_sequences are live.
  std::optional<seq_id> fork(seq_id s) {
    state copy = state_of(s, "fork");
    auto child = paged_.fork(s);
    if (child) states_[*child] = std::move(copy);
    return child;
  }

  /// Rolls s back to its first n_tokens tokens (published blocks stay cached).
  /// @throws llmkit::error when n_tokens > n_tokens(s).
  void truncate(seq_id s, std::size_t n_tokens) {
    state& st = state_of(s, "truncate");
    paged_.truncate(s, n_tokens);
    if (n_tokens <= st.tokens.size()) {
      st.tokens.resize(n_tokens);
      st.tracking = true;  // every remaining token id is known again
    }
    st.keys.resize(std::min(st.keys.size(), n_tokens / BlockSize));
  }

  bool contains(seq_id s) const noexcept { return paged_.contains(s); }
  std::size_t n_sequences() const noexcept { return paged_.n_sequences(); }
  std::size_t n_tokens(seq_id s) const { return paged_.n_tokens(s); }
  std::span<const block_id> block_table(seq_id s) const { return paged_.block_table(s); }

  /// Reserves slots for `[n] tokens` and records their ids (needed to
  /// publish blocks). Evicts unreferenced published blocks (LRU) when the
  /// free list is short. Returns false, with no sequence changed and nothing
  /// evicted, when even eviction cannot free enough blocks.
  bool grow(seq_id s, std::span<const token_id> tokens) {
    state& st = state_of(s, "grow");
    if (!make_room(paged_.blocks_needed(s, tokens.size()))) return false;
    const bool grown = paged_.grow(s, tokens.size());
    LLMKIT_ASSERT(grown);
    (void)grown;
    if (st.tracking) st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
    return true;
  }

  /// Reserves n slots whose token ids are unknown: blocks from here on are
  /// never published (until a truncate back to known tokens). As grow(s, tokens) otherwise.
  bool grow(seq_id s, std::size_t n) {
    state& st = state_of(s, "grow");
    if (!make_room(paged_.blocks_needed(s, n))) return false;
    const bool grown = paged_.grow(s, n);
    LLMKIT_ASSERT(grown);
    (void)grown;
    if (n > 0) st.tracking = false;
    return true;
  }

  /// As paged_cache::store. Published blocks are read-only.
  void store(seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    paged_.store(s, layer, first_token, k, v);
  }

  /// Publishes s's full blocks whose token ids are known and that are not
  /// published yet. Call it once every layer of those tokens is stored (after
  /// each prefill chunk or decode step): a published block is read-only.
  /// @throws llmkit::error for an unknown id.
  void commit(seq_id s) {
    state& st = state_of(s, "commit");
    const std::size_t n_full = std::min(st.tokens.size(), paged_.n_tokens(s)) / BlockSize;
    const auto table = paged_.block_table(s);
    while (st.keys.size() < n_full) {
      const std::size_t i = st.keys.size();
      const std::uint64_t parent = i == 0 ? root_key : st.keys.back();
      const auto tokens = std::span<const token_id>(st.tokens).subspan(i * BlockSize, BlockSize);
      const std::uint64_t key = hash_(parent, tokens);
      const auto it = entries_.find(key);
      if (it != entries_.end()) {
        // Already published (by another sequence, or this block itself); a
        // different prefix under the same key is a collision: stop here.
        if (it->second.parent != parent || !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin()))
          return;
      } else if (!by_block_.contains(table[i])) {
        entry e{table[i], parent, std::vector<token_id>(tokens.begin(), tokens.end()), 0};
        paged_.retain_block(e.block);
        by_block_.emplace(e.block, key);
        entries_.emplace(key, std::move(e));
      }
      st.keys.push_back(key);
      touch(key);
    }
  }

  std::size_t n_chunks(seq_id s) const { return paged_.n_chunks(s); }
  kv_chunk<T> chunk(seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    return paged_.chunk(s, layer, kv_head, i);
  }

  /// Memory statistics of the underlying pool (cached blocks count as in use).
  cache_usage usage() const { return paged_.usage(); }

  /// Cache counters; n_evictable_blocks is counted on the spot (O(cached blocks)).
  prefix_cache_stats stats() const {
    prefix_cache_stats out = stats_;
    out.n_cached_blocks = entries_.size();
    out.n_evictable_blocks = 0;
    for (const auto& [key, e] : entries_) out.n_evictable_blocks += pool().refcount(e.block) == 1 ? 1 : 0;
    return out;
  }

  /// Evicts every published block that no sequence references.
  void evict_unreferenced() {
    std::vector<std::uint64_t> victims;
    for (const auto& [tick, key] : lru_)
      if (pool().refcount(entries_.at(key).block) == 1) victims.push_back(key);
    for (std::uint64_t key : victims) evict(key);
  }

 private:
  struct entry {
    block_id block;
    std::uint64_t parent;
    std::vector<token_id> tokens;
    std::uint64_t last_use;
  };
  struct state {
    std::vector<token_id> tokens;  // ids of the first tokens.size() tokens (a prefix of the sequence)
    std::vector<std::uint64_t> keys;   // keys of the first keys.size() full blocks (published or found)
    bool tracking = true;              // new token ids are recorded
  };

  state& state_of(seq_id s, const char* what) {
    const auto it = states_.find(s);
    LLMKIT_CHECK(it != states_.end(), what, ": unknown sequence id ", s);
    return it->second;
  }

  typename std::unordered_map<std::uint64_t, entry>::const_iterator find(std::uint64_t parent,
                                                                        std::span<const token_id> tokens) const {
    const auto it = entries_.find(hash_(parent, tokens));
    if (it == entries_.end() || it->second.parent != parent ||
        !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin()))
      return entries_.end();
    return it;
  }

  // Calls on_block(key, block) for each block of the longest published
  // prefix of `prompt`, leaving at least one token unmatched.
  template <class OnBlock>
  void walk(std::span<const token_id> prompt, OnBlock&& on_block) const {
    const std::size_t max_blocks = prompt.empty() ? 0 : (prompt.size() - 1) / BlockSize;
    std::uint64_t parent = root_key;
    for (std::size_t i = 0; i < max_blocks; ++i) {
      const auto it = find(parent, prompt.subspan(i * BlockSize, BlockSize));
      if (it == entries_.end()) return;
      on_block(it->first, it->second.block);
      parent = it->first;
    }
  }

  void touch(std::uint64_t key) {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return;  // a duplicate's key whose block was evicted
    entry& e = it->second;
    lru_.erase(e.last_use);
    e.last_use = ++tick_;
    lru_.emplace(e.last_use, key);
  }

  /// Evicts LRU unreferenced blocks until `needed` blocks are free; false
  /// (nothing evicted) when that is impossible.
  bool make_room(std::size_t needed) {
    if (needed <= pool().n_free()) return true;
    const std::size_t deficit = needed - pool().n_free();
    std::vector<std::uint64_t> victims;
    for (auto it = lru_.begin(); it != lru_.end() && victims.size() < deficit; ++it)
      if (pool().refcount(entries_.at(it->second).block) == 1) victims.push_back(it->second);
    if (victims.size() < deficit) return false;
    for (std::uint64_t key : victims) evict(key);
    return true;
  }

  void evict(std::uint64_t key) {
    const auto it = entries_.find(key);
    LLMKIT_ASSERT(it != entries_.end());
    const block_id b = it->second.block;
    lru_.erase(it->second.last_use);
    by_block_.erase(b);
    entries_.erase(it);
    const bool freed = paged_.release_block(b);
    LLMKIT_ASSERT(freed);
    (void)freed;
    ++stats_.n_evicted_blocks;
  }

  paged_cache<T, BlockSize> paged_;
  BlockHash hash_;
  std::size_t max_sequences_;
  std::unordered_map<seq_id, state> states_;
  std::unordered_map<std::uint64_t, entry> entries_;  // key -> published block
  std::unordered_map<block_id, std::uint64_t> by_block_;
  std::map<std::uint64_t, std::uint64_t> lru_;  // last use -> key
  std::uint64_t tick_ = 0;
  prefix_cache_stats stats_;
};

}  // namespace llmkit::kv
