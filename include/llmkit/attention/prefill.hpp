// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/prefill.hpp
/// Masked attention of a packed batch of query tokens against a KV cache
/// (prefill, chunked prefill, speculative verification), flash-attention
/// style: key tiles stream through an online softmax, no score matrix is
/// materialised, hidden tiles are skipped and fully visible tiles skip the
/// mask test.
///
/// Use from a model layer, after the layer stored the batch's new K/V rows:
/// @code
///   attention::prefill({.q = q, .out = out, .cu_seqlens = cu, .seq_ids = ids,
///                       .layer = l, .n_heads = 32}, cache, attention::causal_mask{}, pool);
/// @endcode

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/detail/prefill_kernels.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/tuning.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention {

/// Arguments of `prefill`. Sequence i of the batch owns query tokens
/// [cu_seqlens[i], cu_seqlens[i + 1]); they are the LAST n_i positions of
/// sequence seq_ids[i] in the cache (their K/V rows are already stored), so
/// query t of the sequence sits at position last_pos - (n_i - 1 - t), where
/// last_pos is the largest position the cache holds for that sequence.
struct prefill_params {
  std::span<const float> q;                   ///< [n_tokens, n_heads, head_dim] queries
  std::span<float> out;                       ///< [n_tokens, n_heads, head_dim] results
  std::span<const std::int32_t> cu_seqlens;   ///< [n_seqs + 1] token offsets, cu_seqlens[0] == 0
  std::span<const kv::seq_id> seq_ids;        ///< [n_seqs] cache sequence of each batch sequence
  std::size_t layer = 0;                      ///< layer whose K/V are read
  std::size_t n_heads = 0;                    ///< query heads, a multiple of the cache's n_kv_heads
  float scale = 0.0f;                         ///< softmax scale; 0 means 1/sqrt(head_dim)
  float softcap = 0.0f;                       ///< logit soft-capping cap*tanh(s/cap); 0 disables
  prefill_tuning tuning{};                    ///< speed only (attention/tuning.hpp)
};

namespace detail {

struct prefill_tile_desc {
  std::size_t seq;            // index into the batch
  std::size_t first_token;    // index of the tile's first token in the batch
  std::size_t n_tokens;       // tokens in the tile
  std::int32_t first_pos;     // position of its first token
};

/// Everything a prefill task needs; tasks are (tile, KV head) pairs, task
/// = h * tiles.size() + tile: head-major, so the tasks a thread runs one
/// after another read the same KV head's rows, which stay in its L2.
template <class T>
struct prefill_job {
  const prefill_params* params = nullptr;
  chunk_source<T> source;
  mask_ref mask;  // classify
  /// key_end[t] = 1 + the last j < n_keys with visible(q_first + t, k_pos[j])
  /// (0: none), for t < n_tokens.
  void (*key_ends)(const void*, std::size_t n_tokens, position q_first, const position* k_pos, std::size_t n_keys,
                   std::uint32_t* key_end) = nullptr;
  /// st[j * ld + t * group + g] = -inf where !visible(q_first + t, k_pos[j]),
  /// for j < n_keys, t < n_tokens, g < group (key_end from key_ends: no
  /// mask test past it).
  void (*apply_mask)(const void*, float* st, std::size_t ld, std::size_t n_tokens, std::size_t group,
                     position q_first, const position* k_pos, std::size_t n_keys,
                     const std::uint32_t* key_end) = nullptr;
  std::uint64_t call = 0;  ///< distinct per prefill() call (keys the converted-tile memo)
  std::size_t group = 1;
  std::size_t n_kv_heads = 1;
  float scale = 1.0f;
  std::vector<prefill_tile_desc> tiles;
};

/// Query tokens per task: about `query_rows` query rows (tokens x the heads
/// sharing one KV head) per block.
inline std::size_t prefill_tile_tokens(std::size_t group, std::size_t query_rows) {
  return std::max<std::size_t>(1, query_rows / group);
}

/// Query row r of (tile, KV head h) is token tile.first_token + r / group,
/// head h * group + r % group: the heads of one token that share KV head h
/// are adjacent in q and out.
template <std::size_t D>
inline std::size_t prefill_row_offset(const prefill_params& p, const prefill_tile_desc& tile, std::size_t h,
                                      std::size_t group, std::size_t r) noexcept {
  return ((tile.first_token + r / group) * p.n_heads + h * group + r % group) * D;
}

/// Counts prefill() calls: the ids key the per-thread converted-tile memo,
/// which every call and instantiation shares, so the counter is atomic.
inline std::atomic<std::uint64_t> prefill_calls{0};

/// Runs task `task` = (query tile, KV head); `next` (or SIZE_MAX) is the task
/// this thread runs after it, whose query rows are prefetched into L2 while
/// this one computes (as are this task's output rows, for writing), so the
/// Q and O streams of short prompts overlap the arithmetic.
template <class Arch, std::size_t D, class T>
void prefill_task(const prefill_job<T>& job, std::size_t task, std::size_t next) {
  using K = prefill_kernels<Arch, D>;
  constexpr std::size_t L = K::L;
  constexpr std::size_t KT = K::key_tile;
  const prefill_params& p = *job.params;
  const std::size_t group = job.group;
  const prefill_tile_desc tile = job.tiles[task % job.tiles.size()];
  const std::size_t h = task / job.tiles.size();
  const std::size_t rows = tile.n_tokens * group;
  const std::size_t qld = (rows + L - 1) / L * L;

  scratch& s = scratch::local();
  float* qt = ensure(s.a, D * qld);
  float* o = ensure(s.b, rows * D);
  float* st = ensure(s.c, KT * qld);
  float* m = ensure(s.d, qld);
  float* l = ensure(s.e, qld);
  float* alpha = ensure(s.f, qld);
  float* kf = ensure(s.g, KT * D);
  float* vf = ensure(s.h, KT * D);
  // Partial tiles: how many of the tile's keys (a prefix) each query token,
  // row and row register can see (see key_ends).
  if (s.counts.size() < tile.n_tokens + qld + qld / L) s.counts.resize(tile.n_tokens + qld + qld / L);
  std::uint32_t* key_end = s.counts.data();     // [n_tokens]
  std::uint32_t* row_keys = key_end + tile.n_tokens;  // [qld]
  std::uint32_t* rv_keys = row_keys + qld;            // [qld / L]

  const float* q = p.q.data();
  K::load_q([&](std::size_t r) { return q + prefill_row_offset<D>(p, tile, h, group, r); }, rows, job.scale, qt, qld);
  std::fill(o, o + rows * D, 0.0f);
  std::fill(m, m + qld, -std::numeric_limits<float>::infinity());
  std::fill(l, l + qld, 0.0f);

  // Prefetches, spread over the key tiles: this task's out rows (for
  // writing) and the next task's q rows, a few rows per key tile.
  float* out = p.out.data();
  const bool has_next = next < job.tiles.size() * job.n_kv_heads;
  const prefill_tile_desc next_tile = has_next ? job.tiles[next % job.tiles.size()] : tile;
  const std::size_t next_h = has_next ? next / job.tiles.size() : h;
  const std::size_t next_rows = has_next ? next_tile.n_tokens * group : 0;
  std::size_t out_prefetched = 0, q_prefetched = 0;
  auto prefetch_out = [&](std::size_t n_rows) {
    for (std::size_t i = 0; i < n_rows && out_prefetched < rows; ++i, ++out_prefetched) {
      const float* row = out + prefill_row_offset<D>(p, tile, h, group, out_prefetched);
      for (std::size_t d = 0; d < D; d += 16) __builtin_prefetch(row + d, 1, 3);
    }
  };
  auto prefetch_q = [&](std::size_t n_rows) {
    for (std::size_t i = 0; i < n_rows && q_prefetched < next_rows; ++i, ++q_prefetched) {
      const float* row = q + prefill_row_offset<D>(p, next_tile, next_h, group, q_prefetched);
      for (std::size_t d = 0; d < D; d += 16) __builtin_prefetch(row + d, 0, 2);
    }
  };

  const std::int32_t q_first = tile.first_pos;
  const std::int32_t q_last = tile.first_pos + static_cast<std::int32_t>(tile.n_tokens) - 1;
  const float* vp[KT];
  row_tile<T, KT> rt;
  row_walker<T> walker(job.source, p.seq_ids[tile.seq], p.layer, h, 0);
  for (std::size_t tile_index = 0;; ++tile_index) {
    walker.next(rt, KT);
    if (rt.n == 0) break;
    const tile_visibility vis = job.mask.classify(q_first, q_last, rt.pos_min, rt.pos_max);
    if (vis == tile_visibility::hidden) continue;
    // A partial tile is cut down to what its query block sees, from one
    // pass over the mask: key_end[t] = 1 + the last of the tile's keys that
    // token t sees (0: none).
    // - Keys past every token's key_end (the far side of the diagonal under
    //   causal masks) are dropped rather than computed and masked: a causal
    //   4 x 128-token packed batch does 10% less.
    // - The query rows of tokens that see none of the tile's keys (tokens
    //   before the diagonal when the query block straddles the tile's start,
    //   e.g. after a cached prefix of 16k + 8 tokens; tokens past a sliding
    //   window) are skipped at both ends of the block: that leaves their
    //   state exactly as a row of -inf scores would (alpha = 1, p = 0). The
    //   kept rows [r0, r1) are whole registers.
    // - The kernels stop at the last key each row (register) can see: the
    //   far side of the diagonal is neither dotted nor multiplied by 0 (whole
    //   blocks of 12 / 8 / 4 keys x 2 row registers in the scores, 6 rows in
    //   the values; what they skip, apply_mask sets to -inf).
    prefetch_out(8);
    prefetch_q(8);
    std::size_t r0 = 0, r1 = qld;
    const std::uint32_t* kept_row_keys = nullptr;
    const std::uint32_t* kept_rv_keys = nullptr;
    if (vis == tile_visibility::partial) {
      job.key_ends(job.mask.mask, tile.n_tokens, q_first, rt.pos, rt.n, key_end);
      std::size_t t0 = 0, t1 = tile.n_tokens;
      while (t0 < t1 && key_end[t0] == 0) ++t0;
      while (t1 > t0 && key_end[t1 - 1] == 0) --t1;
      if (t0 == t1) continue;  // classify was conservative: nothing to do
      rt.n = *std::max_element(key_end + t0, key_end + t1);
      r0 = t0 * group / L * L;
      r1 = std::min(qld, (t1 * group + L - 1) / L * L);
      std::fill(row_keys + r0, row_keys + r1, 0u);  // padding rows see nothing
      for (std::size_t r = r0; r < std::min(rows, r1); ++r) row_keys[r] = key_end[r / group];
      for (std::size_t rv = r0 / L; rv < r1 / L; ++rv)
        rv_keys[rv] = *std::max_element(row_keys + rv * L, row_keys + (rv + 1) * L);
      kept_row_keys = row_keys + r0;
      kept_rv_keys = rv_keys + r0 / L;
    }
    const std::size_t n_rv_kept = (r1 - r0) / L;
    // 16-bit and int8 tiles of prompts up to memo_rows tokens: converted
    // once per thread and KV head (the memo's K and V fit in L2).
    const std::size_t memo_rows = std::max<std::size_t>(KT, (p.tuning.memo_bytes / (D * sizeof(float))) / KT * KT);
    const float* keys = nullptr;
    if constexpr (!std::is_same_v<T, float>)
      keys = memo_tile_rows_f32<Arch>(s.converted, job.call, tile.seq, h, tile_index, memo_rows, rt, D, vp);
    if (keys == nullptr) keys = tile_rows_f32<Arch>(rt, D, kf, vf, vp);
    K::scores(qt + r0, qld, n_rv_kept, keys, rt.n, st + r0, kept_rv_keys);
    if (p.softcap > 0.0f) K::soft_cap(st + r0, qld, n_rv_kept, rt.n, p.softcap);
    if (vis == tile_visibility::partial)
      job.apply_mask(job.mask.mask, st, qld, tile.n_tokens, group, q_first, rt.pos, rt.n, key_end);
    K::softmax_update(st + r0, qld, n_rv_kept, rt.n, m + r0, l + r0, alpha + r0);
    K::accumulate(o + r0 * D, std::min(rows, r1) - r0, alpha + r0, st + r0, qld, vp, rt.n, kept_row_keys);
  }
  prefetch_q(next_rows);  // whatever the key tiles did not cover
  for (std::size_t r = 0; r < rows; ++r)
    K::finish_row(o + r * D, l[r], out + prefill_row_offset<D>(p, tile, h, group, r));
}

/// The prefill kernel of each head dim over storage type T on Arch (see
/// decode_kernel_table: one translation unit can compile them all).
template <class Arch, class T>
struct prefill_kernel_table {
  using task_fn = void (*)(const prefill_job<T>&, std::size_t, std::size_t);
  /// @throws llmkit::error when head_dim is not one of supported_head_dims
  static task_fn select(std::size_t head_dim);
};

template <class Arch, class T>
typename prefill_kernel_table<Arch, T>::task_fn prefill_kernel_table<Arch, T>::select(std::size_t head_dim) {
  return dispatch_head_dim(head_dim, [](auto d) -> task_fn {
    constexpr std::size_t D = decltype(d)::value;
    return &prefill_task<arch_for_head_dim<Arch, D>, D, T>;
  });
}

}  // namespace detail

/// Attention of every query token of a packed batch against its sequence's
/// cached keys and values, under `mask` (positions as described at
/// `prefill_params`). GQA: query head h reads KV head h / (n_heads /
/// n_kv_heads). Accumulates in f32 whatever the cache's storage type. A
/// query that sees no key gets a zero output row.
///
/// Work is split into (query block, KV head) tasks run through `exec`; each
/// thread uses its own grow-only scratch, so a warm call allocates only the
/// small task list.
///
/// @pre q.size() == out.size() == cu_seqlens.back() * n_heads * head_dim;
///      seq_ids.size() + 1 == cu_seqlens.size(); each sequence holds at least
///      as many tokens as it has queries; head_dim is one of
///      supported_head_dims (attention/head_dims.hpp). Violations throw
///      llmkit::error (the cache itself reports unknown sequences).
template <class Arch = simd::default_arch, kv::kv_readable Cache, mask_policy Mask = causal_mask,
          executor Exec = serial_executor>
void prefill(const prefill_params& p, const Cache& cache, const Mask& mask = {}, Exec&& exec = {}) {
  const std::size_t group = detail::check_heads("prefill", cache, p.layer, p.n_heads, p.scale, p.softcap);
  const std::size_t head_dim = cache.shape().head_dim;
  LLMKIT_CHECK(p.tuning.run_length > 0, "prefill: tuning.run_length must be > 0, got ", p.tuning.run_length);
  LLMKIT_CHECK(p.cu_seqlens.size() == p.seq_ids.size() + 1, "prefill: cu_seqlens.size() = ", p.cu_seqlens.size(),
               " must be seq_ids.size() + 1 = ", p.seq_ids.size() + 1);
  LLMKIT_CHECK(p.cu_seqlens[0] == 0, "prefill: cu_seqlens[0] must be 0, got ", p.cu_seqlens[0]);
  for (std::size_t i = 1; i < p.cu_seqlens.size(); ++i)
    LLMKIT_CHECK(p.cu_seqlens[i] >= p.cu_seqlens[i - 1], "prefill: cu_seqlens[", i, "] = ", p.cu_seqlens[i],
                 " is below cu_seqlens[", i - 1, "] = ", p.cu_seqlens[i - 1]);
  const auto n_tokens = static_cast<std::size_t>(p.cu_seqlens.back());
  const std::size_t expected = n_tokens * p.n_heads * head_dim;
  LLMKIT_CHECK(p.q.size() == expected, "prefill: q.size() = ", p.q.size(), " must be n_tokens * n_heads * head_dim = ",
               n_tokens, " * ", p.n_heads, " * ", head_dim, " = ", expected);
  LLMKIT_CHECK(p.out.size() == expected, "prefill: out.size() = ", p.out.size(),
               " must be n_tokens * n_heads * head_dim = ", expected);
  std::vector<std::int32_t> last_pos(p.seq_ids.size());
  for (std::size_t i = 0; i < p.seq_ids.size(); ++i) {
    const auto n_q = static_cast<std::size_t>(p.cu_seqlens[i + 1] - p.cu_seqlens[i]);
    const std::size_t n_cached = cache.n_tokens(p.seq_ids[i]);
    LLMKIT_CHECK(n_q <= n_cached, "prefill: sequence ", p.seq_ids[i], " (batch index ", i, ") has ", n_q,
                 " queries but only ", n_cached, " cached tokens; store the new K/V rows first");
    last_pos[i] = n_q > 0 ? detail::last_position(cache, p.seq_ids[i]) : 0;
  }
  if (n_tokens == 0) return;

  using T = typename Cache::storage_type;
  detail::prefill_job<T> job;
  job.params = &p;
  job.source = detail::make_chunk_source(cache);
  job.mask = detail::make_mask_ref(mask);
  job.apply_mask = [](const void* m, float* st, std::size_t ld, std::size_t n_q, std::size_t g, position q_first,
                      const position* k_pos, std::size_t n_keys, const std::uint32_t* key_end) {
    const Mask& mk = *static_cast<const Mask*>(m);
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    for (std::size_t t = 0; t < n_q; ++t)
      for (std::size_t j = 0; j < n_keys; ++j)
        if (j >= key_end[t] || !mk.visible(q_first + static_cast<position>(t), k_pos[j]))
          std::fill_n(st + j * ld + t * g, g, ninf);
  };
  job.key_ends = [](const void* m, std::size_t n_q, position q_first, const position* k_pos, std::size_t n_keys,
                    std::uint32_t* key_end) {
    const Mask& mk = *static_cast<const Mask*>(m);
    for (std::size_t t = 0; t < n_q; ++t) {
      std::size_t end = n_keys;
      while (end > 0 && !mk.visible(q_first + static_cast<position>(t), k_pos[end - 1])) --end;
      key_end[t] = static_cast<std::uint32_t>(end);
    }
  };
  job.call = detail::prefill_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  job.group = group;
  job.n_kv_heads = p.n_heads / group;
  job.scale = detail::effective_scale(p.scale, head_dim);
  const std::size_t tile_tokens = detail::prefill_tile_tokens(group, p.tuning.query_rows);
  for (std::size_t i = 0; i + 1 < p.cu_seqlens.size(); ++i) {
    const auto first = static_cast<std::size_t>(p.cu_seqlens[i]);
    const auto n_q = static_cast<std::size_t>(p.cu_seqlens[i + 1]) - first;
    const std::int32_t pos0 = last_pos[i] - static_cast<std::int32_t>(n_q) + 1;
    for (std::size_t t = 0; t < n_q; t += tile_tokens)
      job.tiles.push_back({i, first + t, std::min(tile_tokens, n_q - t), pos0 + static_cast<std::int32_t>(t)});
  }
  const auto run = detail::prefill_kernel_table<Arch, T>::select(head_dim);
  // Runs of consecutive tasks per executor call (prefill_tuning::run_length).
  const std::size_t n_tasks = job.tiles.size() * job.n_kv_heads;
  const std::size_t run_length = p.tuning.run_length;
  exec.parallel_for((n_tasks + run_length - 1) / run_length, [&](std::size_t chunk) {
    const std::size_t end = std::min(n_tasks, (chunk + 1) * run_length);
    for (std::size_t task = chunk * run_length; task < end; ++task)
      run(job, task, task + 1 < end ? task + 1 : std::numeric_limits<std::size_t>::max());
  });
}

}  // namespace llmkit::attention

LLMKIT_SIMD_DIAGNOSTICS_END

#if defined(LLMKIT_ATTENTION_EXTERN_KERNELS)
// The kernels for the default arch are compiled elsewhere (attention/kernels.hpp).
namespace llmkit::attention::detail {
extern template struct prefill_kernel_table<simd::default_arch, float>;
extern template struct prefill_kernel_table<simd::default_arch, f16>;
extern template struct prefill_kernel_table<simd::default_arch, bf16>;
extern template struct prefill_kernel_table<simd::default_arch, std::int8_t>;
}  // namespace llmkit::attention::detail
#endif
