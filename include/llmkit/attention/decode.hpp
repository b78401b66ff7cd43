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
#include <vector>

#include "llmkit/attention/detail/bind_job.hpp"
#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_job.hpp"
#include "llmkit/attention/detail/kernel_tables.hpp"
#include "llmkit/attention/detail/decode_merge.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/tuning.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

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
  /// `[n_heads]` learned attention-sink logits (gpt-oss `attn_sinks`), or
  /// empty for none: head h's softmax has one more term exp(sinks[h]) in
  /// its denominator, with no value row (the weight the sink takes is
  /// dropped). Finite.
  std::span<const float> sinks{};
  /// Keys per split-KV task: 0 chooses from the executor's concurrency (no
  /// split on one thread); otherwise contexts longer than this are split.
  std::size_t kv_split_tokens = 0;
  decode_workspace* workspace = nullptr;  ///< optional reusable memory
  /// int8 caches only (other storage types ignore it): round each query
  /// head to int8 before its dot products with the keys (one scale per
  /// head, its largest |value| / 127), as llama.cpp's q8_0 x q8_0 scores
  /// do. Faster where the CPU has AVX-512 VNNI and head_dim is 64, 128 or
  /// 256 (VPDPBUSD: half the multiply-adds of the int16 queries used
  /// otherwise); every other path computes the same rounded queries' scores.
  /// The cost is the queries' rounding, up to 1/254 of a head's largest
  /// value per element (docs/attention.md gives the tested error).
  bool int8_queries = false;
  /// bf16 caches only (other storage types ignore it): round each query
  /// (times the softmax scale) to bf16, to nearest even, before its dot
  /// products with the keys, as llama.cpp's bf16 dot products do. Faster
  /// where the CPU has AVX512_BF16 and head_dim is a multiple of 32
  /// (VDPBF16PS: the keys multiplied as stored, 32 per instruction, instead
  /// of converted to f32 16 at a time); every other path computes the same
  /// rounded queries' scores. The cost is the queries' rounding, up to 2^-9
  /// of each value (docs/attention.md gives the tested error).
  bool bf16_queries = false;
  /// bf16 caches only (other storage types ignore it): round each block's
  /// softmax probabilities to bf16, to nearest even, before they multiply
  /// the values. Faster where the CPU has AVX512_BF16 and head_dim is 64,
  /// 128 or 256 (VDPBF16PS: the values multiplied as stored, two rows per
  /// instruction, instead of converted to f32 16 at a time); every other
  /// path multiplies the same rounded probabilities in f32. The cost is the
  /// probabilities' rounding, up to 2^-9 of each (relative to the block's
  /// running max; the sums that normalise them are not rounded).
  bool bf16_probabilities = false;
  /// int8 caches only (other storage types ignore it): round each block's
  /// softmax probabilities (times the value rows' scales) to 8-bit levels,
  /// one step per block and head (the block's largest / 255), before they
  /// multiply the values. Faster where the CPU has AVX-512 VNNI and
  /// head_dim is 64, 128 or 256, or AVX-VNNI on an AVX2 build and head_dim
  /// a multiple of 16 (VPDPBUSD: four value rows per instruction, where the
  /// int16 probabilities used otherwise take two per VPDPWSSD); every other
  /// path multiplies the same rounded probabilities in f32. The cost is the
  /// probabilities' rounding, up to 1/510 of the block's largest per value
  /// (the sums that normalise them are not rounded; docs/attention.md gives
  /// the tested error).
  bool int8_probabilities = false;
  decode_tuning tuning{};  ///< speed only (attention/tuning.hpp)
};


/// Attention of one query token per sequence against its cache entry under
/// `mask` (the query sits at the sequence's last position). GQA: query head
/// hq reads KV head hq / (n_heads / n_kv_heads); each K/V row is read once
/// per group. Accumulates in f32 whatever the cache's storage type; a query
/// that sees no key gets a zero row (with or without a sink).
///
/// Tasks are (sequence, KV head, split) run through `exec`; see
/// `decode_params::kv_split_tokens`.
///
/// @pre q.size() == out.size() == seq_ids.size() * n_heads * head_dim; every
///      sequence holds >= 1 token; head_dim is one of supported_head_dims
///      (attention/head_dims.hpp). Violations throw llmkit::error (the
///      cache itself reports unknown sequences).
template <class Arch = simd::default_arch, kv::kv_readable Cache, mask_policy Mask = causal_mask,
          executor Exec = serial_executor>
void decode(const decode_params& p, const Cache& cache, const Mask& mask = {}, Exec&& exec = {}) {
  const std::size_t group = detail::check_heads("decode", p, cache);
  const kv::kv_shape shape = cache.shape();
  const std::size_t head_dim = shape.head_dim;
  const std::size_t n_seqs = p.seq_ids.size();
  detail::check_rows("decode", p, "n_seqs", n_seqs, head_dim);

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
  LLMKIT_CHECK(p.tuning.split_tasks_per_thread > 0, "decode: tuning.split_tasks_per_thread must be > 0, got ",
               p.tuning.split_tasks_per_thread);
  std::size_t split_rows = p.kv_split_tokens;
  if (split_rows == 0) {
    const std::size_t threads = exec.concurrency();
    const std::size_t target_tasks = p.tuning.split_tasks_per_thread * threads;
    if (threads <= 1 || n_seqs * shape.n_kv_heads >= target_tasks) {
      split_rows = std::numeric_limits<std::size_t>::max();
    } else {
      const std::size_t per_task = (total_rows * shape.n_kv_heads + target_tasks - 1) / target_tasks;
      split_rows = round_up(std::max<std::size_t>(per_task, p.tuning.min_split_tokens), 16);
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
  detail::bind_job(job, p, cache, mask);
  job.ws = &ws;
  job.group = group;
  job.n_kv_heads = shape.n_kv_heads;
  job.head_dim = head_dim;
  job.split_rows = split_rows;
  job.scale = detail::effective_scale(p.scale, head_dim);
  job.partial = detail::ensure(ws.partial, ws.task_first[n_seqs] * p.n_heads * (head_dim + 2));
  const auto run = detail::decode_kernel_table<Arch, T>::select(head_dim, detail::decode_head_batch(group));
  exec.parallel_for(ws.task_first[n_seqs] * shape.n_kv_heads, [&](std::size_t task) { run(job, task); });
  if (ws.task_first[n_seqs] > n_seqs)
    exec.parallel_for(n_seqs * shape.n_kv_heads, [&](std::size_t k) {
      detail::decode_merge(job, k / shape.n_kv_heads, k % shape.n_kv_heads);
    });
}

}  // namespace llmkit::attention

LLMKIT_SIMD_DIAGNOSTICS_END
