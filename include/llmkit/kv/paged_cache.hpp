// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/paged_cache.hpp
/// A paged KV cache (vLLM's PagedAttention layout on the CPU): K/V memory is
/// a pool of fixed-size blocks of `BlockSize` tokens; each sequence owns a
/// block table. Forking shares every block (reference count + 1), and the
/// first write into a shared, partly filled block copies it (copy-on-write).
///
/// Layout of one block b (T = storage type):
///
///     [n_layers][2 (K, V)][n_kv_heads][BlockSize][head_dim] T
///     [n_layers][2 (K, V)][n_kv_heads][BlockSize] float        (int8 scales)
///
/// so one (layer, KV head) of a block is one run of BlockSize rows: a chunk.
/// A sequence of n tokens is ceil(n / BlockSize) chunks, chunk i holding
/// positions [i * BlockSize, min(n, (i + 1) * BlockSize)).

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/kv/block_pool.hpp"
#include "llmkit/kv/cache_usage.hpp"
#include "llmkit/kv/detail/cache_rows.hpp"
#include "llmkit/kv/detail/checks.hpp"
#include "llmkit/kv/detail/sequence_table.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/kv/storage.hpp"

namespace llmkit::kv {

/// Capacity of a paged cache.
struct paged_cache_options {
  std::size_t n_blocks = 0;                                            ///< blocks in the pool (> 0)
  std::size_t max_sequences = std::numeric_limits<std::int32_t>::max();  ///< live sequences at once (> 0)
};

/// Magic and version of the byte buffers of `export_sequence`.
inline constexpr std::array<char, 8> kv_export_magic = {'L', 'L', 'M', 'K', 'I', 'T', 'K', 'V'};
inline constexpr std::uint32_t kv_export_version = 1;

/// A block-paged KV cache with copy-on-write forks. Satisfies `kv_cache`.
/// All memory (`n_blocks * block_bytes()`) is allocated at construction.
template <kv_storage T, std::size_t BlockSize>
class paged_cache {
  static_assert(BlockSize > 0, "paged_cache: BlockSize must be > 0");

 public:
  using storage_type = T;
  /// Tokens per block.
  static constexpr std::size_t block_size = BlockSize;

  /// @throws llmkit::error when a shape field, n_blocks or max_sequences is 0.
  paged_cache(kv_shape shape, paged_cache_options options)
      : shape_(shape), pool_(options.n_blocks), sequences_(options.max_sequences) {
    detail::check_shape("paged_cache", shape);
    LLMKIT_CHECK(options.n_blocks > 0, "paged_cache: options.n_blocks must be > 0, got ", options.n_blocks);
    LLMKIT_CHECK(options.max_sequences > 0, "paged_cache: options.max_sequences must be > 0, got ",
                 options.max_sequences);
    LLMKIT_CHECK(options.n_blocks <= std::numeric_limits<std::size_t>::max() / block_elements() / sizeof(T),
                 "paged_cache: options.n_blocks ", options.n_blocks, " overflows the pool size");
    data_.resize(options.n_blocks * block_elements());
    if constexpr (has_row_scale_v<T>) scales_.resize(options.n_blocks * block_scale_elements());
  }

  kv_shape shape() const noexcept { return shape_; }
  /// The block bookkeeping (free/used/total, reference counts).
  const block_pool& pool() const noexcept { return pool_; }
  /// Bytes one token takes (K + V, all layers and heads, int8 scales).
  std::size_t bytes_per_token() const noexcept {
    return kv_bytes_per_token<T>(shape_.n_layers, shape_.n_kv_heads, shape_.head_dim);
  }
  /// Bytes of one block.
  std::size_t block_bytes() const noexcept { return BlockSize * bytes_per_token(); }

  /// Adds an empty sequence (no blocks); nullopt when max_sequences are live.
  std::optional<seq_id> add_sequence() { return sequences_.insert(sequence{}); }

  /// Adds a sequence of `n_tokens` tokens whose rows are the given used
  /// blocks, in order (each gains a reference). This is how a prefix cache
  /// hands out cached blocks. nullopt when max_sequences are live.
  /// `[ceil(n_tokens / BlockSize)] blocks`
  /// @throws llmkit::error when the block count does not match n_tokens or a block is free.
  std::optional<seq_id> add_sequence_sharing(std::span<const block_id> blocks, std::size_t n_tokens) {
    LLMKIT_CHECK(blocks.size() == blocks_for(n_tokens), "add_sequence_sharing: ", blocks.size(),
                 " blocks given for n_tokens = ", n_tokens, ", which needs ", blocks_for(n_tokens));
    for (block_id b : blocks)
      LLMKIT_CHECK(b >= 0 && static_cast<std::size_t>(b) < pool_.n_total() && pool_.refcount(b) > 0,
                   "add_sequence_sharing: block ", b, " is not a used block");
    if (sequences_.full()) return std::nullopt;
    sequence seq;
    seq.n_tokens = n_tokens;
    seq.table.assign(blocks.begin(), blocks.end());
    for (block_id b : blocks) pool_.retain(b);
    return sequences_.insert(std::move(seq));
  }

  /// Adds a reference to a used block, held by the caller rather than a
  /// sequence (a prefix cache keeps its cached blocks alive this way); the
  /// block becomes read-only for sequences until release_block.
  /// @throws llmkit::error for a bad or free block.
  void retain_block(block_id b) { pool_.retain(b); }
  /// Drops a reference taken with retain_block; returns true when the block
  /// went back to the free list. @throws llmkit::error for a bad or free block.
  bool release_block(block_id b) { return pool_.release(b); }

  /// Frees the sequence: every block loses a reference, unshared ones return
  /// to the pool. @throws llmkit::error for an unknown id.
  void free(seq_id s) {
    sequence& seq = sequences_.at(s, "free");
    for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) pool_.release(*it);
    sequences_.erase(s);
  }

  /// A new sequence sharing all of s's blocks (reference count + 1 each):
  /// O(block table), no K/V is copied. nullopt when max_sequences are live.
  std::optional<seq_id> fork(seq_id s) {
    sequence copy = sequences_.at(s, "fork");
    if (sequences_.full()) return std::nullopt;
    for (block_id b : copy.table) pool_.retain(b);
    return sequences_.insert(std::move(copy));
  }

  /// Rolls s back to its first n_tokens tokens; blocks past them lose a
  /// reference. @throws llmkit::error when n_tokens > n_tokens(s).
  void truncate(seq_id s, std::size_t n_tokens) {
    sequence& seq = sequences_.at(s, "truncate");
    LLMKIT_CHECK(n_tokens <= seq.n_tokens, "truncate: n_tokens ", n_tokens, " exceeds the ", seq.n_tokens,
                 " tokens of sequence ", s);
    const std::size_t keep = blocks_for(n_tokens);
    while (seq.table.size() > keep) {
      pool_.release(seq.table.back());
      seq.table.pop_back();
    }
    seq.n_tokens = n_tokens;
  }

  bool contains(seq_id s) const noexcept { return sequences_.contains(s); }
  std::size_t n_sequences() const noexcept { return sequences_.size(); }
  std::size_t n_tokens(seq_id s) const { return sequences_.at(s, "n_tokens").n_tokens; }
  /// s's block table: `[ceil(n_tokens(s) / BlockSize)]` block ids.
  std::span<const block_id> block_table(seq_id s) const { return sequences_.at(s, "block_table").table; }

  /// Free blocks that grow(s, n) needs: new blocks, plus one when the last
  /// block is shared and partly filled (copy-on-write).
  std::size_t blocks_needed(seq_id s, std::size_t n) const {
    return blocks_needed(sequences_.at(s, "blocks_needed"), s, n, "blocks_needed");
  }

  /// Reserves n more token slots. Copies the last block first when it is
  /// shared and partly filled, so the new slots are private to s. Returns
  /// false, with nothing changed, when the pool has too few free blocks.
  bool grow(seq_id s, std::size_t n) {
    sequence& seq = sequences_.at(s, "grow");
    if (blocks_needed(seq, s, n, "grow") > pool_.n_free()) return false;
    if (needs_copy_on_write(seq, n)) {
      const block_id from = seq.table.back();
      const block_id to = *pool_.allocate();
      copy_rows(from, to, seq.n_tokens % BlockSize);
      pool_.release(from);
      seq.table.back() = to;
    }
    while (seq.table.size() < blocks_for(seq.n_tokens + n)) seq.table.push_back(*pool_.allocate());
    seq.n_tokens += n;
    return true;
  }

  /// Writes `[n_new, n_kv_heads, head_dim] k, v` (f32) into token slots
  /// [first_token, first_token + n_new) of layer `layer`, converting to T.
  /// @throws llmkit::error for an unknown id, a bad layer, sizes that are not
  /// whole rows, slots beyond n_tokens(s), slots in a block shared with
  /// another sequence or the prefix cache, or (int8) non-finite values;
  /// nothing is written then.
  void store(seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    const sequence& seq = sequences_.at(s, "store");
    const std::size_t n_new =
        detail::check_store(shape_, layer, k, v, has_row_scale_v<T>, s, first_token, seq.n_tokens);
    if (n_new == 0) return;
    for (std::size_t i = first_token / BlockSize; i <= (first_token + n_new - 1) / BlockSize; ++i)
      LLMKIT_CHECK(pool_.refcount(seq.table[i]) == 1, "store: token slot ", std::max(first_token, i * BlockSize),
                   " of sequence ", s, " lies in block ", seq.table[i], " shared by ", pool_.refcount(seq.table[i]),
                   " owners; only slots reserved by grow are writable");
    detail::store_rows<T>(shape_, BlockSize, layer, first_token, n_new, k.data(), v.data(), [&](std::size_t slot) {
      const auto b = static_cast<std::size_t>(seq.table[slot / BlockSize]);
      float* scales = has_row_scale_v<T> ? scales_.data() + b * block_scale_elements() : nullptr;
      return detail::slot_at(data_.data() + b * block_elements(), scales, slot % BlockSize, shape_.head_dim);
    });
  }

  /// ceil(n_tokens(s) / BlockSize).
  std::size_t n_chunks(seq_id s) const { return sequences_.at(s, "n_chunks").table.size(); }

  /// Block i of s for (layer, kv_head): positions [i * BlockSize, ...).
  kv_chunk<T> chunk(seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    const sequence& seq = sequences_.at(s, "chunk");
    detail::check_chunk(shape_, layer, kv_head, i, seq.table.size());
    const std::size_t b = static_cast<std::size_t>(seq.table[i]);
    const float* scales = has_row_scale_v<T> ? scales_.data() + b * block_scale_elements() : nullptr;
    return detail::run_chunk(data_.data() + b * block_elements(), scales, shape_, BlockSize, layer, kv_head, 0,
                             std::min(BlockSize, seq.n_tokens - i * BlockSize), i * BlockSize);
  }

  /// Memory and sequence statistics (see also pool().stats()).
  cache_usage usage() const {
    cache_usage u = detail::sequence_usage(sequences_, bytes_per_token());
    u.bytes_allocated = pool_.n_total() * block_bytes();
    u.bytes_in_use = pool_.n_used() * block_bytes();
    return u;
  }

  /// s's K/V as one self-describing byte buffer, for moving a sequence to
  /// another cache (prefill/decode disaggregation). Layout, all integers in
  /// the host's byte order:
  ///
  ///     char[8]  magic "LLMKITKV"      u32 version (1)   u32 byte-order mark 0x01020304
  ///     u32 dtype (llmkit::dtype)      u32 block size of the exporter
  ///     u64 n_layers  u64 n_kv_heads  u64 head_dim  u64 n_tokens
  ///     T     rows  [n_layers][2][n_kv_heads][n_tokens][head_dim]
  ///     float scales[n_layers][2][n_kv_heads][n_tokens]            (int8 only)
  ///     u64 FNV-1a checksum of everything before it
  ///
  /// Rows are per token, so the importer may use another block size.
  std::vector<std::byte> export_sequence(seq_id s) const {
    const sequence& seq = sequences_.at(s, "export_sequence");
    const std::size_t n = seq.n_tokens;
    std::vector<std::byte> out(export_size(n));
    std::byte* p = out.data();
    auto put = [&p](const void* src, std::size_t bytes) {
      if (bytes) std::memcpy(p, src, bytes);
      p += bytes;
    };
    const std::uint32_t header32[4] = {kv_export_version, byte_order_mark, static_cast<std::uint32_t>(storage_dtype_v<T>),
                                       static_cast<std::uint32_t>(BlockSize)};
    const std::uint64_t header64[4] = {shape_.n_layers, shape_.n_kv_heads, shape_.head_dim, n};
    put(kv_export_magic.data(), kv_export_magic.size());
    put(header32, sizeof header32);
    put(header64, sizeof header64);
    const std::size_t d = shape_.head_dim;
    for (std::size_t run = 0; run < n_runs(); ++run)
      for (std::size_t i = 0; i < seq.table.size(); ++i) {
        const std::size_t rows = std::min(BlockSize, n - i * BlockSize);
        put(row_ptr(static_cast<std::size_t>(seq.table[i]), run, 0), rows * d * sizeof(T));
      }
    if constexpr (has_row_scale_v<T>)
      for (std::size_t run = 0; run < n_runs(); ++run)
        for (std::size_t i = 0; i < seq.table.size(); ++i) {
          const std::size_t rows = std::min(BlockSize, n - i * BlockSize);
          put(scales_.data() + static_cast<std::size_t>(seq.table[i]) * block_scale_elements() + run * BlockSize,
              rows * sizeof(float));
        }
    const std::uint64_t sum = checksum(std::span<const std::byte>(out.data(), static_cast<std::size_t>(p - out.data())));
    put(&sum, sizeof sum);
    LLMKIT_ASSERT(p == out.data() + out.size());
    return out;
  }

  /// Adds a sequence holding the tokens of a buffer made by export_sequence
  /// (of a cache with the same shape and storage type; any block size).
  /// Returns nullopt, with nothing changed, when max_sequences are live or
  /// the pool has too few free blocks.
  /// @throws llmkit::error when the buffer is truncated, corrupt (magic,
  /// version, byte order, checksum) or made for another shape or dtype.
  std::optional<seq_id> import_sequence(std::span<const std::byte> buffer) {
    constexpr std::size_t header_bytes = export_header_bytes;
    LLMKIT_CHECK(buffer.size() >= header_bytes + sizeof(std::uint64_t), "import_sequence: buffer of ", buffer.size(),
                 " bytes is shorter than the ", header_bytes + sizeof(std::uint64_t), "-byte header");
    const std::byte* p = buffer.data();
    auto get = [&p](void* dst, std::size_t bytes) {
      std::memcpy(dst, p, bytes);
      p += bytes;
    };
    std::array<char, 8> magic{};
    std::uint32_t header32[4];
    std::uint64_t header64[4];
    get(magic.data(), magic.size());
    get(header32, sizeof header32);
    get(header64, sizeof header64);
    LLMKIT_CHECK(magic == kv_export_magic, "import_sequence: buffer does not start with the magic \"LLMKITKV\"");
    LLMKIT_CHECK(header32[0] == kv_export_version, "import_sequence: buffer version ", header32[0],
                 " is not the supported version ", kv_export_version);
    LLMKIT_CHECK(header32[1] == byte_order_mark, "import_sequence: buffer byte order mark ", header32[1],
                 " differs from this host's ", byte_order_mark, " (exported on another byte order)");
    LLMKIT_CHECK(header32[2] == static_cast<std::uint32_t>(storage_dtype_v<T>), "import_sequence: buffer dtype ",
                 header32[2] <= 4 ? dtype_name(static_cast<dtype>(header32[2])) : std::string_view("unknown"),
                 " (", header32[2], ") differs from the cache's ", dtype_name(storage_dtype_v<T>));
    const kv_shape shape{header64[0], header64[1], header64[2]};
    LLMKIT_CHECK(shape == shape_, "import_sequence: buffer shape (n_layers ", shape.n_layers, ", n_kv_heads ",
                 shape.n_kv_heads, ", head_dim ", shape.head_dim, ") differs from the cache's (", shape_.n_layers, ", ",
                 shape_.n_kv_heads, ", ", shape_.head_dim, ")");
    const std::uint64_t n = header64[3];
    const std::size_t max_n = (buffer.size() - header_bytes) / bytes_per_token() + 1;
    LLMKIT_CHECK(n < max_n && export_size(static_cast<std::size_t>(n)) == buffer.size(), "import_sequence: n_tokens ",
                 n, " does not match the buffer size ", buffer.size());
    std::uint64_t sum;
    std::memcpy(&sum, buffer.data() + buffer.size() - sizeof sum, sizeof sum);
    LLMKIT_CHECK(sum == checksum(buffer.first(buffer.size() - sizeof sum)),
                 "import_sequence: checksum mismatch (buffer corrupt)");

    if (sequences_.full() || blocks_for(n) > pool_.n_free()) return std::nullopt;
    const seq_id s = *add_sequence();
    const bool grown = grow(s, static_cast<std::size_t>(n));
    LLMKIT_ASSERT(grown);
    (void)grown;
    const sequence& seq = sequences_.at(s, "import_sequence");
    const std::size_t d = shape_.head_dim;
    for (std::size_t run = 0; run < n_runs(); ++run)
      for (std::size_t i = 0; i < seq.table.size(); ++i) {
        const std::size_t rows = std::min<std::size_t>(BlockSize, n - i * BlockSize);
        get(row_ptr(static_cast<std::size_t>(seq.table[i]), run, 0), rows * d * sizeof(T));
      }
    if constexpr (has_row_scale_v<T>)
      for (std::size_t run = 0; run < n_runs(); ++run)
        for (std::size_t i = 0; i < seq.table.size(); ++i) {
          const std::size_t rows = std::min<std::size_t>(BlockSize, n - i * BlockSize);
          get(scales_.data() + static_cast<std::size_t>(seq.table[i]) * block_scale_elements() + run * BlockSize,
              rows * sizeof(float));
        }
    return s;
  }

  /// The token count in the header of a buffer made by export_sequence,
  /// for sizing a pool before import_sequence (which checks the rest).
  /// @throws llmkit::error when the buffer is shorter than the header or
  /// does not start with the magic.
  static std::uint64_t exported_tokens(std::span<const std::byte> buffer) {
    LLMKIT_CHECK(buffer.size() >= export_header_bytes, "exported_tokens: buffer of ", buffer.size(),
                 " bytes is shorter than the ", export_header_bytes, "-byte header");
    LLMKIT_CHECK(std::memcmp(buffer.data(), kv_export_magic.data(), kv_export_magic.size()) == 0,
                 "exported_tokens: buffer does not start with the magic \"LLMKITKV\"");
    std::uint64_t n;
    std::memcpy(&n, buffer.data() + export_header_bytes - sizeof n, sizeof n);
    return n;
  }

 private:
  static constexpr std::uint32_t byte_order_mark = 0x01020304u;
  // magic, 4 u32 (version, byte order, dtype, block size), 4 u64 (shape, n_tokens).
  static constexpr std::size_t export_header_bytes =
      kv_export_magic.size() + 4 * sizeof(std::uint32_t) + 4 * sizeof(std::uint64_t);

  struct sequence {
    std::size_t n_tokens = 0;
    std::vector<block_id> table;
  };

  static constexpr std::size_t blocks_for(std::size_t n_tokens) noexcept { return (n_tokens + BlockSize - 1) / BlockSize; }

  std::size_t blocks_needed(const sequence& seq, seq_id s, std::size_t n, const char* what) const {
    LLMKIT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()) - seq.n_tokens, what,
                 ": n = ", n, " overflows the position range of sequence ", s);
    return blocks_for(seq.n_tokens + n) - seq.table.size() + (needs_copy_on_write(seq, n) ? 1 : 0);
  }

  bool needs_copy_on_write(const sequence& seq, std::size_t n) const {
    return n > 0 && seq.n_tokens % BlockSize != 0 && pool_.refcount(seq.table.back()) > 1;
  }

  std::size_t n_runs() const noexcept { return detail::n_runs(shape_); }
  std::size_t block_elements() const noexcept { return n_runs() * BlockSize * shape_.head_dim; }
  std::size_t block_scale_elements() const noexcept { return n_runs() * BlockSize; }
  T* row_ptr(std::size_t b, std::size_t run, std::size_t r) noexcept {
    return data_.data() + b * block_elements() + (run * BlockSize + r) * shape_.head_dim;
  }
  const T* row_ptr(std::size_t b, std::size_t run, std::size_t r) const noexcept {
    return data_.data() + b * block_elements() + (run * BlockSize + r) * shape_.head_dim;
  }

  /// Copies the first n_rows rows of every run (and their scales) from block `from` to `to`.
  void copy_rows(block_id from, block_id to, std::size_t n_rows) {
    const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
    for (std::size_t run = 0; run < n_runs(); ++run) {
      std::copy_n(row_ptr(f, run, 0), n_rows * shape_.head_dim, row_ptr(t, run, 0));
      if constexpr (has_row_scale_v<T>)
        std::copy_n(scales_.data() + f * block_scale_elements() + run * BlockSize, n_rows,
                    scales_.data() + t * block_scale_elements() + run * BlockSize);
    }
  }

  std::size_t export_size(std::size_t n_tokens) const noexcept {
    return kv_export_magic.size() + 4 * sizeof(std::uint32_t) + 4 * sizeof(std::uint64_t) +
           n_tokens * bytes_per_token() + sizeof(std::uint64_t);
  }

  /// 64-bit checksum: four independent multiply-xor lanes over 8-byte words
  /// (several GB/s), then the tail bytes; detects corruption, not tampering.
  static std::uint64_t checksum(std::span<const std::byte> bytes) noexcept {
    constexpr std::uint64_t prime = 0x100000001b3ull;
    std::uint64_t lane[4] = {0xcbf29ce484222325ull, 0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull};
    std::size_t i = 0;
    for (; i + 32 <= bytes.size(); i += 32)
      for (int l = 0; l < 4; ++l) {
        std::uint64_t w;
        std::memcpy(&w, bytes.data() + i + 8 * l, 8);
        lane[l] = std::rotl((lane[l] ^ w) * prime, 29);
      }
    std::uint64_t h = lane[0] ^ std::rotl(lane[1], 16) ^ std::rotl(lane[2], 32) ^ std::rotl(lane[3], 48);
    for (; i < bytes.size(); ++i) h = (h ^ static_cast<std::uint64_t>(bytes[i])) * prime;
    return (h ^ (h >> 31)) * 0xd6e8feb86659fd93ull ^ bytes.size();
  }

  kv_shape shape_;
  block_pool pool_;
  detail::sequence_table<sequence> sequences_;
  aligned_vector<T> data_;        // [n_blocks][n_layers][2][n_kv_heads][BlockSize][head_dim]
  aligned_vector<float> scales_;  // [n_blocks][n_layers][2][n_kv_heads][BlockSize] (int8 only)
};

}  // namespace llmkit::kv
