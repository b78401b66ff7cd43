// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/kv_rows.hpp
/// Reading K/V rows out of any `kv_readable` cache in tiles:
/// - `row_tile<T, N>`: up to N raw rows (pointers, int8 scales, positions);
/// - `row_walker`: walks the chunks of one (sequence, layer, KV head) in
///   order and fills tiles, crossing chunk boundaries anywhere;
/// - `row_to_f32<Arch>`: converts one stored row (f32, f16, bf16, int8 with
///   scale) to f32 (the per-arch conversions are in load_f32.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/dtype.hpp"
#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/load_f32.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// Up to N consecutive rows of one (sequence, layer, KV head).
template <class T, std::size_t N>
struct row_tile {
  const T* k[N];
  const T* v[N];
  float k_scale[N];
  float v_scale[N];
  std::int32_t pos[N];
  std::size_t n = 0;
  std::int32_t pos_min = 0;
  std::int32_t pos_max = 0;
};

/// A cache seen through two function pointers: kernels are compiled once per
/// storage type, not once per cache type (one indirect call per chunk).
template <class T>
struct chunk_source {
  const void* cache = nullptr;
  std::size_t (*n_chunks_fn)(const void*, kv::seq_id) = nullptr;
  kv::kv_chunk<T> (*chunk_fn)(const void*, kv::seq_id, std::size_t, std::size_t, std::size_t) = nullptr;

  std::size_t n_chunks(kv::seq_id s) const { return n_chunks_fn(cache, s); }
  kv::kv_chunk<T> chunk(kv::seq_id s, std::size_t layer, std::size_t kv_head, std::size_t i) const {
    return chunk_fn(cache, s, layer, kv_head, i);
  }
};

template <class Cache>
chunk_source<typename Cache::storage_type> make_chunk_source(const Cache& cache) {
  chunk_source<typename Cache::storage_type> src;
  src.cache = &cache;
  src.n_chunks_fn = [](const void* c, kv::seq_id s) -> std::size_t {
    return static_cast<const Cache*>(c)->n_chunks(s);
  };
  src.chunk_fn = [](const void* c, kv::seq_id s, std::size_t layer, std::size_t head, std::size_t i) {
    return static_cast<const Cache*>(c)->chunk(s, layer, head, i);
  };
  return src;
}

/// Prefetches the `Bytes` bytes at `row` into L1, one cache line at a time.
/// The AMX scores kernel calls it for a few rows per 64-byte chunk, so the
/// prefetches are spread over the block's compute instead of issued in one
/// burst (a burst fills the line fill buffers and the loads behind it
/// wait). The other kernels spread them further, a line per column step
/// (`prefetch_line_at`, in address order: `prefetch_slot`).
template <std::size_t Bytes>
inline void prefetch_row(const void* row) noexcept {
  const char* c = static_cast<const char*>(row);
#pragma GCC unroll 8
  for (std::size_t b = 0; b < Bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

/// Prefetches into L1 the cache line at byte `offset` of `row` when the
/// offset starts one. A decode kernel calls it (through `prefetch_slot`)
/// once in each column step of its row loops, for a line of the rows
/// pf_rows ahead, so the prefetches come one line at a time among the
/// FMAs: issued a row or a pass at a time (`prefetch_row`), they come in
/// bursts that wait for line fill buffers and hold back the loads behind
/// them.
inline void prefetch_line_at(const void* row, std::size_t offset) noexcept {
  if (offset % 64 == 0) __builtin_prefetch(static_cast<const char*>(row) + offset, 0, 3);
}

/// Prefetches slot `slot` of a block's prefetch rows `rows`, the slots taken
/// in address order. A decode kernel visits each (row, column step) of its
/// block once, in its own loop order (column steps outer, rows inner), and
/// numbers its prefetches in that order; slot n is the row n / Steps at
/// step n % Steps (Steps column steps of StepBytes per row), so the lines
/// are prefetched row after row, in the order they lie in memory, while the
/// kernel's loads stride across the rows. The same lines are prefetched, at
/// the same rate, as by prefetching each visit's own (row, step), but in
/// the order the hardware prefetcher follows (an ascending run of misses,
/// not a stride across rows).
template <std::size_t Steps, std::size_t StepBytes, class T>
inline void prefetch_slot(const T* const* rows, std::size_t slot) noexcept {
  prefetch_line_at(rows[slot / Steps], slot % Steps * StepBytes);
}

/// Walks the rows of (seq, layer, kv_head) chunk by chunk.
template <class T>
class row_walker {
 public:
  /// Starts at row `first_row` (in chunk order) of the sequence.
  row_walker(const chunk_source<T>& cache, kv::seq_id seq, std::size_t layer, std::size_t kv_head,
             std::size_t first_row)
      : cache_(cache), seq_(seq), layer_(layer), kv_head_(kv_head), n_chunks_(cache.n_chunks(seq)) {
    load_chunk();
    while (first_row > 0 && chunk_index_ < n_chunks_) {
      const std::size_t take = std::min(first_row, chunk_.n_tokens - offset_);
      offset_ += take;
      first_row -= take;
      if (offset_ == chunk_.n_tokens) next_chunk();
    }
  }

  /// Fills `tile` with the next min(max_rows, N) rows (fewer only at the end).
  template <std::size_t N>
  void next(row_tile<T, N>& tile, std::size_t max_rows) {
    tile.n = 0;
    tile.pos_min = std::numeric_limits<std::int32_t>::max();
    tile.pos_max = std::numeric_limits<std::int32_t>::min();
    max_rows = std::min(max_rows, N);
    while (tile.n < max_rows && chunk_index_ < n_chunks_) {
      const std::size_t take = std::min(max_rows - tile.n, chunk_.n_tokens - offset_);
      fill_pointers(tile, take);
      if (chunk_.k_scale != nullptr) {
        std::copy(chunk_.k_scale + offset_, chunk_.k_scale + offset_ + take, tile.k_scale + tile.n);
        std::copy(chunk_.v_scale + offset_, chunk_.v_scale + offset_ + take, tile.v_scale + tile.n);
      } else {
        std::fill(tile.k_scale + tile.n, tile.k_scale + tile.n + take, 1.0f);
        std::fill(tile.v_scale + tile.n, tile.v_scale + tile.n + take, 1.0f);
      }
      const std::int32_t pos0 = chunk_.first_pos + static_cast<std::int32_t>(offset_);
      for (std::size_t t = 0; t < take; ++t) tile.pos[tile.n + t] = pos0 + static_cast<std::int32_t>(t);
      if (take > 0) {
        // Rows of a chunk have increasing positions.
        tile.pos_min = std::min(tile.pos_min, tile.pos[tile.n]);
        tile.pos_max = std::max(tile.pos_max, tile.pos[tile.n + take - 1]);
      }
      tile.n += take;
      advance(take);
    }
  }

  /// Like next(), but only the row pointers (`tile.k`, `tile.v`, `tile.n`)
  /// and without reading the rows or their scales: the prefetching walker,
  /// started some rows ahead of the reading one, hands the kernels the rows
  /// to prefetch while they work on the current block (`prefetch_row`).
  /// The int8 scales of those rows are prefetched here.
  template <std::size_t N>
  void next_pointers(row_tile<T, N>& tile, std::size_t max_rows) {
    tile.n = 0;
    max_rows = std::min(max_rows, N);
    while (tile.n < max_rows && chunk_index_ < n_chunks_) {
      const std::size_t take = std::min(max_rows - tile.n, chunk_.n_tokens - offset_);
      fill_pointers(tile, take);
      if (chunk_.k_scale != nullptr && take > 0) {
        __builtin_prefetch(chunk_.k_scale + offset_ + take - 1, 0, 3);
        __builtin_prefetch(chunk_.v_scale + offset_ + take - 1, 0, 3);
      }
      tile.n += take;
      advance(take);
    }
  }

 private:
  /// tile.k / tile.v [tile.n, tile.n + take) = the current chunk's next
  /// `take` rows (one loop per array, so that each vectorises).
  template <std::size_t N>
  void fill_pointers(row_tile<T, N>& tile, std::size_t take) const {
    const T* k = chunk_.k + offset_ * chunk_.row_stride;
    const T* v = chunk_.v + offset_ * chunk_.row_stride;
    for (std::size_t t = 0; t < take; ++t) tile.k[tile.n + t] = k + t * chunk_.row_stride;
    for (std::size_t t = 0; t < take; ++t) tile.v[tile.n + t] = v + t * chunk_.row_stride;
  }
  /// Moves past `take` rows of the current chunk (to the next chunk at its end).
  void advance(std::size_t take) {
    offset_ += take;
    if (offset_ == chunk_.n_tokens) next_chunk();
  }
  void load_chunk() {
    // Empty chunks are skipped so offset_ < chunk_.n_tokens while rows remain.
    while (chunk_index_ < n_chunks_) {
      chunk_ = cache_.chunk(seq_, layer_, kv_head_, chunk_index_);
      if (chunk_.n_tokens > 0) return;
      ++chunk_index_;
    }
  }
  void next_chunk() {
    ++chunk_index_;
    offset_ = 0;
    load_chunk();
  }

  const chunk_source<T>& cache_;
  kv::seq_id seq_;
  std::size_t layer_;
  std::size_t kv_head_;
  std::size_t n_chunks_;
  std::size_t chunk_index_ = 0;
  std::size_t offset_ = 0;
  kv::kv_chunk<T> chunk_{};
};

/// Largest position stored for `seq` (chunks of layer 0, KV head 0), or
/// INT32_MIN when the sequence holds no rows.
template <class Cache>
std::int32_t last_position(const Cache& cache, kv::seq_id seq) {
  std::int32_t last = std::numeric_limits<std::int32_t>::min();
  const std::size_t n = cache.n_chunks(seq);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = cache.chunk(seq, 0, 0, i);
    if (c.n_tokens > 0) last = std::max(last, c.first_pos + static_cast<std::int32_t>(c.n_tokens) - 1);
  }
  return last;
}

/// dst[0, n) = src[0, n) * scale converted to f32 (the scale matters only
/// for int8 storage).
template <class Arch, class T>
inline void row_to_f32(const T* src, float scale, float* dst, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + n, dst);
  } else {
    row_to_f32_converted<Arch>(src, scale, dst, n);
  }
}

/// The f32 rows of a tile. Returns the keys as one `[rt.n, d]` f32 block:
/// the cache's own rows when they are f32 and adjacent in memory (a
/// contiguous cache, a paged block), else copied (converted to f32, scaled
/// for int8) into the scratch `kf`. `vp[j]` points at value row j: the
/// cache's own row for f32 storage, else a row converted into the scratch
/// `vf` (`[rt.n, d]`).
template <class Arch, class T, std::size_t N>
inline const float* tile_rows_f32(const row_tile<T, N>& rt, std::size_t d, float* kf, float* vf,
                                  const float** vp) noexcept {
  bool adjacent = std::is_same_v<T, float>;
  for (std::size_t j = 0; j < rt.n; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      vp[j] = rt.v[j];
      adjacent = adjacent && rt.k[j] == rt.k[0] + j * d;
    } else {
      row_to_f32<Arch>(rt.k[j], rt.k_scale[j], kf + j * d, d);
      row_to_f32<Arch>(rt.v[j], rt.v_scale[j], vf + j * d, d);
      vp[j] = vf + j * d;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (adjacent) return rt.k[0];
    for (std::size_t j = 0; j < rt.n; ++j) std::copy(rt.k[j], rt.k[j] + d, kf + j * d);
  }
  return kf;
}

/// tile_rows_f32 for 16-bit and int8 storage through the thread's memo:
/// key tile `tile_index` (the walker's tiles of N rows, counted from the
/// sequence's first row) of (call, seq, head) is converted once into
/// `memo` and read from there by later tasks; rows a later task needs
/// beyond those converted (a tile trimmed at a diagonal) are added. Returns
/// null, converting nothing, for tiles past the memo's `max_rows` rows:
/// the caller converts those per task.
template <class Arch, class T, std::size_t N>
inline const float* memo_tile_rows_f32(converted_tiles& memo, std::uint64_t call, std::size_t seq,
                                       std::size_t head, std::size_t tile_index, std::size_t max_rows,
                                       const row_tile<T, N>& rt, std::size_t d, const float** vp) {
  static_assert(!std::is_same_v<T, float>, "memo_tile_rows_f32: f32 rows are read in place");
  const std::size_t n_tiles = max_rows / N;
  if (tile_index >= n_tiles) return nullptr;
  if (memo.call != call || memo.seq != seq || memo.head != head) {
    memo.call = call;
    memo.seq = seq;
    memo.head = head;
    if (memo.k.size() < n_tiles * N * d) {
      memo.k.resize(n_tiles * N * d);
      memo.v.resize(n_tiles * N * d);
    }
    memo.rows.assign(n_tiles, 0);
  }
  float* kf = memo.k.data() + tile_index * N * d;
  float* vf = memo.v.data() + tile_index * N * d;
  for (std::size_t j = memo.rows[tile_index]; j < rt.n; ++j) {
    row_to_f32<Arch>(rt.k[j], rt.k_scale[j], kf + j * d, d);
    row_to_f32<Arch>(rt.v[j], rt.v_scale[j], vf + j * d, d);
  }
  memo.rows[tile_index] = std::max<std::uint32_t>(memo.rows[tile_index], static_cast<std::uint32_t>(rt.n));
  for (std::size_t j = 0; j < rt.n; ++j) vp[j] = vf + j * d;
  return kf;
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
