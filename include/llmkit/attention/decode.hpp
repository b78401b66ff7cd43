// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/decode.hpp
/// Decode attention: one new query token per sequence, for a batch of
/// sequences of different lengths, against the KV cache. Memory-bound: each
/// K/V row is read once for all query heads of its GQA group, and long
/// contexts are split across threads (split-KV), the partial results merged
/// with log-sum-exp.
///
/// @code
///   attention::decode({.q = q, .out = out, .seq_ids = ids, .layer = l, .n_heads = 32},
///                     cache, attention::causal_mask{}, pool);
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_kernels.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"

namespace llmkit::attention {

/// Reusable memory of `decode` (split-KV partial results). Pass one in
/// `decode_params::workspace` to control where it lives; otherwise each
/// calling thread keeps its own. Grow-only: a warm call does not allocate.
struct decode_workspace {
  aligned_vector<float> partial;        ///< [n_tasks, group, head_dim + 2] partial o, m, l
  std::vector<std::size_t> task_first;  ///< [n_seqs + 1] first task of each sequence
  std::vector<std::int32_t> last_pos;   ///< [n_seqs] query position of each sequence
  std::vector<std::size_t> n_rows;      ///< [n_seqs] cached tokens of each sequence
};

/// Arguments of `decode`. Sequence i's query is the token at the largest
/// position the cache holds for seq_ids[i] (its K/V row already stored).
struct decode_params {
  std::span<const float> q;             ///< [n_seqs, n_heads, head_dim] one query row per sequence
  std::span<float> out;                 ///< [n_seqs, n_heads, head_dim] results
  std::span<const kv::seq_id> seq_ids;  ///< [n_seqs] cache sequence of each query
  std::size_t layer = 0;                ///< layer whose K/V are read
  std::size_t n_heads = 0;              ///< query heads, a multiple of the cache's n_kv_heads
  float scale = 0.0f;                   ///< softmax scale; 0 means 1/sqrt(head_dim)
  float softcap = 0.0f;                 ///< logit soft-capping cap*tanh(s/cap); 0 disables
  /// Keys per split-KV task: 0 chooses from the executor's concurrency (no
  /// split on one thread); otherwise contexts longer than this are split.
  std::size_t kv_split_tokens = 0;
  decode_workspace* workspace = nullptr;  ///< optional reusable memory
};

namespace detail {

/// Everything a decode task needs; tasks are (split, KV head) pairs, the
/// splits of sequence i numbered [ws->task_first[i], ws->task_first[i + 1]).
template <class T>
struct decode_job {
  const decode_params* params = nullptr;
  chunk_source<T> source;
  mask_ref mask;
  decode_workspace* ws = nullptr;
  std::size_t group = 1;
  std::size_t n_kv_heads = 1;
  std::size_t head_dim = 0;
  std::size_t split_rows = 0;
  float scale = 1.0f;
  float* partial = nullptr;  // [n_tasks, group, head_dim + 2]
};

template <class Arch, std::size_t D, class T>
void decode_task(const decode_job<T>& job, std::size_t task) {
  using K = decode_kernels<Arch, D>;
  constexpr std::size_t L = K::L;
  constexpr std::size_t BT = K::block;
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const decode_params& p = *job.params;
  const decode_workspace& ws = *job.ws;
  const std::size_t group = job.group;
  const std::size_t flat = task / job.n_kv_heads;
  const std::size_t h = task % job.n_kv_heads;
  const std::size_t i = static_cast<std::size_t>(
      std::upper_bound(ws.task_first.begin(), ws.task_first.end(), flat) - ws.task_first.begin() - 1);
  const std::size_t split = flat - ws.task_first[i];
  const std::size_t n_splits = ws.task_first[i + 1] - ws.task_first[i];
  const std::size_t n_rows = ws.n_rows[i];
  const std::size_t row_begin = split * job.split_rows;
  const std::size_t row_end = n_splits == 1 ? n_rows : std::min(n_rows, row_begin + job.split_rows);
  const std::int32_t q_pos = ws.last_pos[i];

  scratch& s = scratch::local();
  float* qs = ensure(s.a, group * D);
  float* o = ensure(s.b, group * D);
  float* kf = ensure(s.c, BT * D);
  float* vf = ensure(s.d, BT * D);
  float* zero = ensure(s.e, D);
  float* sc = ensure(s.f, group * BT);
  float* mp = ensure(s.g, group);
  float* lp = ensure(s.h, group);
  std::fill(zero, zero + D, 0.0f);
  const float* qsrc = p.q.data() + (i * p.n_heads + h * group) * D;
  for (std::size_t x = 0; x < group * D; ++x) qs[x] = qsrc[x] * job.scale;
  std::fill(o, o + group * D, 0.0f);
  std::fill(mp, mp + group, ninf);  // running max and sum per query head
  std::fill(lp, lp + group, 0.0f);

  const float* kp[BT];
  const float* vp[BT];
  row_tile<T, BT> rt;
  row_walker<T> walker(job.source, p.seq_ids[i], p.layer, h, row_begin);
  for (std::size_t row = row_begin; row < row_end; row += rt.n) {
    walker.next(rt, std::min(BT, row_end - row));
    if (rt.n == 0) break;
    const tile_visibility vis = job.mask.classify(q_pos, q_pos, rt.pos_min, rt.pos_max);
    if (vis == tile_visibility::hidden) continue;
    tile_rows_f32<Arch>(rt, D, kf, vf, kp, vp);
    for (std::size_t j = rt.n; j < BT; ++j) kp[j] = vp[j] = zero;
    for (std::size_t g = 0; g < group; ++g) {
      float* sg = sc + g * BT;
      K::scores(qs + g * D, kp, sg);
      if (p.softcap > 0.0f) {
        const vec<Arch> c(p.softcap), inv(1.0f / p.softcap);
        for (std::size_t b = 0; b < BT; b += L) vstore<Arch>(sg + b, c * vtanh<Arch>(vload<Arch>(sg + b) * inv));
      }
      for (std::size_t j = rt.n; j < BT; ++j) sg[j] = ninf;
      if (vis == tile_visibility::partial) job.mask.apply(sg, 1, 1, 1, q_pos, rt.pos, rt.n);
      float tile_max = ninf;
      for (std::size_t j = 0; j < rt.n; ++j) tile_max = std::max(tile_max, sg[j]);
      const float m_new = std::max(mp[g], tile_max);
      const float shift = m_new == ninf ? 0.0f : m_new;
      const float alpha = std::exp(mp[g] - shift);
      vec<Arch> sum(0.0f);
      for (std::size_t b = 0; b < BT; b += L) {
        const vec<Arch> e = vexp<Arch>(vload<Arch>(sg + b) - vec<Arch>(shift));
        vstore<Arch>(sg + b, e);
        sum = sum + e;
      }
      mp[g] = m_new;
      lp[g] = lp[g] * alpha + vhadd<Arch>(sum);
      K::accumulate(o + g * D, alpha, sg, vp, rt.n);
    }
  }

  if (n_splits == 1) {
    for (std::size_t g = 0; g < group; ++g) {
      const float inv = lp[g] > 0.0f ? 1.0f / lp[g] : 0.0f;
      float* dst = p.out.data() + (i * p.n_heads + h * group + g) * D;
      for (std::size_t d = 0; d < D; ++d) dst[d] = o[g * D + d] * inv;
    }
  } else {
    for (std::size_t g = 0; g < group; ++g) {
      float* rec = job.partial + (task * group + g) * (D + 2);
      std::copy(o + g * D, o + (g + 1) * D, rec);
      rec[D] = mp[g];
      rec[D + 1] = lp[g];
    }
  }
}

/// Merges the split-KV partials of batch sequence i, KV head h:
/// o = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
template <class T>
void decode_merge(const decode_job<T>& job, std::size_t i, std::size_t h) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const decode_params& p = *job.params;
  const std::size_t D = job.head_dim, stride = D + 2, group = job.group;
  const std::size_t first = job.ws->task_first[i];
  const std::size_t n_splits = job.ws->task_first[i + 1] - first;
  if (n_splits == 1) return;
  for (std::size_t g = 0; g < group; ++g) {
    auto record = [&](std::size_t sp) { return job.partial + (((first + sp) * job.n_kv_heads + h) * group + g) * stride; };
    float m_all = ninf;
    for (std::size_t sp = 0; sp < n_splits; ++sp) m_all = std::max(m_all, record(sp)[D]);
    float* dst = p.out.data() + (i * p.n_heads + h * group + g) * D;
    std::fill(dst, dst + D, 0.0f);
    if (m_all == ninf) continue;  // no visible key at all: zeros
    float l_all = 0.0f;
    for (std::size_t sp = 0; sp < n_splits; ++sp) {
      const float* rec = record(sp);
      if (rec[D] == ninf) continue;
      const float w = std::exp(rec[D] - m_all);
      l_all += rec[D + 1] * w;
      for (std::size_t d = 0; d < D; ++d) dst[d] += rec[d] * w;
    }
    const float inv = 1.0f / l_all;
    for (std::size_t d = 0; d < D; ++d) dst[d] *= inv;
  }
}

}  // namespace detail

/// Attention of one query token per sequence against its cache entry under
/// `mask` (the query sits at the sequence's last position). GQA: query head
/// hq reads KV head hq / (n_heads / n_kv_heads); each K/V row is read once
/// per group. Accumulates in f32 whatever the cache's storage type; a query
/// that sees no key gets a zero row.
///
/// Tasks are (sequence, KV head, split) run through `exec`; see
/// `decode_params::kv_split_tokens`.
///
/// @pre q.size() == out.size() == seq_ids.size() * n_heads * head_dim; every
///      sequence holds >= 1 token; head_dim is one of 8 16 32 64 80 96 112
///      128 256. Violations throw llmkit::error (the cache itself reports
///      unknown sequences).
template <class Arch = simd::default_arch, kv::kv_readable Cache, mask_policy Mask = causal_mask,
          executor Exec = serial_executor>
void decode(const decode_params& p, const Cache& cache, const Mask& mask = {}, Exec&& exec = {}) {
  const std::size_t group = detail::check_heads("decode", cache, p.layer, p.n_heads, p.scale, p.softcap);
  const kv::kv_shape shape = cache.shape();
  const std::size_t head_dim = shape.head_dim;
  const std::size_t n_seqs = p.seq_ids.size();
  const std::size_t expected = n_seqs * p.n_heads * head_dim;
  LLMKIT_CHECK(p.q.size() == expected, "decode: q.size() = ", p.q.size(), " must be n_seqs * n_heads * head_dim = ",
               n_seqs, " * ", p.n_heads, " * ", head_dim, " = ", expected);
  LLMKIT_CHECK(p.out.size() == expected, "decode: out.size() = ", p.out.size(),
               " must be n_seqs * n_heads * head_dim = ", expected);

  thread_local decode_workspace own;
  decode_workspace& ws = p.workspace ? *p.workspace : own;
  ws.task_first.assign(n_seqs + 1, 0);
  ws.last_pos.assign(n_seqs, 0);
  ws.n_rows.assign(n_seqs, 0);
  std::size_t total_rows = 0;
  for (std::size_t i = 0; i < n_seqs; ++i) {
    const std::size_t n = cache.n_tokens(p.seq_ids[i]);
    LLMKIT_CHECK(n > 0, "decode: sequence ", p.seq_ids[i], " (batch index ", i,
                 ") holds no tokens; store the query token's K/V first");
    ws.last_pos[i] = detail::last_position(cache, p.seq_ids[i]);
    ws.n_rows[i] = n;
    total_rows += n;
  }
  std::size_t split_rows = p.kv_split_tokens;
  if (split_rows == 0) {
    const std::size_t threads = exec.concurrency();
    const std::size_t target_tasks = 4 * threads;
    if (threads <= 1 || n_seqs * shape.n_kv_heads >= target_tasks) {
      split_rows = std::numeric_limits<std::size_t>::max();
    } else {
      const std::size_t per_task = (total_rows * shape.n_kv_heads + target_tasks - 1) / target_tasks;
      split_rows = round_up(std::max<std::size_t>(per_task, 512), 16);
    }
  }
  for (std::size_t i = 0; i < n_seqs; ++i) {
    const std::size_t n = ws.n_rows[i];
    const std::size_t n_splits = split_rows >= n ? 1 : (n + split_rows - 1) / split_rows;
    ws.task_first[i + 1] = ws.task_first[i] + n_splits;
  }
  if (n_seqs == 0) return;

  using T = typename Cache::storage_type;
  detail::decode_job<T> job;
  job.params = &p;
  job.source = detail::make_chunk_source(cache);
  job.mask = detail::make_mask_ref(mask);
  job.ws = &ws;
  job.group = group;
  job.n_kv_heads = shape.n_kv_heads;
  job.head_dim = head_dim;
  job.split_rows = split_rows;
  job.scale = detail::effective_scale(p.scale, head_dim);
  job.partial = detail::ensure(ws.partial, ws.task_first[n_seqs] * p.n_heads * (head_dim + 2));
  using task_fn = void (*)(const detail::decode_job<T>&, std::size_t);
  const task_fn run = detail::dispatch_head_dim(head_dim, [](auto d) -> task_fn {
    constexpr std::size_t D = decltype(d)::value;
    return &detail::decode_task<detail::arch_for_head_dim<Arch, D>, D, T>;
  });
  exec.parallel_for(ws.task_first[n_seqs] * shape.n_kv_heads, [&](std::size_t task) { run(job, task); });
  if (ws.task_first[n_seqs] > n_seqs)
    exec.parallel_for(n_seqs * shape.n_kv_heads, [&](std::size_t k) {
      detail::decode_merge(job, k / shape.n_kv_heads, k % shape.n_kv_heads);
    });
}

}  // namespace llmkit::attention
