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

#include "llmkit/attention/detail/bind_job.hpp"
#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/detail/prefill_job.hpp"
#include "llmkit/attention/detail/kernel_tables.hpp"
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
  /// `[n_heads]` attention-sink logits, or empty: see decode_params::sinks.
  std::span<const float> sinks{};
  prefill_tuning tuning{};                    ///< speed only (attention/tuning.hpp)
};


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
  const std::size_t group = detail::check_heads("prefill", p, cache);
  const std::size_t head_dim = cache.shape().head_dim;
  LLMKIT_CHECK(p.tuning.run_length > 0, "prefill: tuning.run_length must be > 0, got ", p.tuning.run_length);
  LLMKIT_CHECK(p.cu_seqlens.size() == p.seq_ids.size() + 1, "prefill: cu_seqlens.size() = ", p.cu_seqlens.size(),
               " must be seq_ids.size() + 1 = ", p.seq_ids.size() + 1);
  LLMKIT_CHECK(p.cu_seqlens[0] == 0, "prefill: cu_seqlens[0] must be 0, got ", p.cu_seqlens[0]);
  for (std::size_t i = 1; i < p.cu_seqlens.size(); ++i)
    LLMKIT_CHECK(p.cu_seqlens[i] >= p.cu_seqlens[i - 1], "prefill: cu_seqlens[", i, "] = ", p.cu_seqlens[i],
                 " is below cu_seqlens[", i - 1, "] = ", p.cu_seqlens[i - 1]);
  const auto n_tokens = static_cast<std::size_t>(p.cu_seqlens.back());
  detail::check_rows("prefill", p, "n_tokens", n_tokens, head_dim);
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
  detail::bind_job(job, p, cache, mask);
  detail::set_mask_hooks<Mask>(job);
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

