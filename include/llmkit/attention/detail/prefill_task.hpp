// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/prefill_task.hpp
/// One prefill task: a block of query rows of one sequence and KV head
/// against that sequence's key tiles, flash-attention style, through the
/// kernels of `prefill_kernels` (`prefill_task`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/prefill_job.hpp"
#include "llmkit/attention/detail/prefill_kernels.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// Runs task `task` = (query tile, KV head); `next` (or SIZE_MAX) is the task
/// this thread runs after it, whose query rows are prefetched into L2 while
/// this one computes (as are this task's output rows, for writing), so the
/// Q and O streams of short prompts overlap the arithmetic.
template <class Arch, std::size_t D, class T>
void prefill_task(const prefill_job<T>& job, std::size_t task, std::size_t next) {
  using K = prefill_kernels<Arch, D>;
  constexpr std::size_t L = K::L;
  constexpr std::size_t KT = K::key_tile;
  const auto& p = *job.params;  // prefill_params
  const std::size_t group = job.group;
  const prefill_tile_desc tile = job.tiles[task % job.tiles.size()];
  const std::size_t h = task / job.tiles.size();
  const std::size_t rows = tile.n_tokens * group;
  const std::size_t qld = (rows + L - 1) / L * L;

  prefill_scratch& s = prefill_scratch::local();
  float* qt = ensure(s.queries, D * qld);
  float* o = ensure(s.out, rows * D);
  float* st = ensure(s.scores, KT * qld);
  float* m = ensure(s.max, qld);
  float* l = ensure(s.sum, qld);
  float* alpha = ensure(s.alpha, qld);
  float* kf = ensure(s.keys, KT * D);
  float* vf = ensure(s.values, KT * D);
  // Partial tiles: how many of the tile's keys (a prefix) each query token,
  // row and row register can see (see key_ends).
  if (s.key_counts.size() < tile.n_tokens + qld + qld / L) s.key_counts.resize(tile.n_tokens + qld + qld / L);
  std::uint32_t* key_end = s.key_counts.data();     // [n_tokens]
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
    //   causal masks) are dropped rather than computed and masked.
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
    K::finish_row(o + r * D, with_sink(l[r], m[r], p.sinks, h * group + r % group),
                  out + prefill_row_offset<D>(p, tile, h, group, r));
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
