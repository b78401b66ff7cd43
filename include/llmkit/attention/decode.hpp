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
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_kernels.hpp"
#include "llmkit/attention/detail/decode_queries.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/mask_ref.hpp"
#include "llmkit/attention/mask.hpp"
#include "llmkit/attention/tuning.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"
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

/// Heads per kernel pass for a GQA group of `group` heads: 1, 2 or 4 (a
/// group of 3 or more is padded to a multiple of 4 with zero queries).
constexpr std::size_t decode_head_batch(std::size_t group) { return group <= 2 ? group : 4; }

/// Rows the prefetching walker runs ahead of the reading one (0: none); the
/// kernels prefetch the rows it hands them inside their row loops, one line
/// per column step, the lines taken in address order (`prefetch_slot`).
template <class T>
std::size_t decode_prefetch_rows(std::size_t head_dim, const decode_tuning& tuning) {
  const std::size_t row_bytes = head_dim * sizeof(T);
  const std::size_t bytes = tuning.prefetch_bytes != decode_tuning::cpu_default
                                ? tuning.prefetch_bytes
                                : default_decode_prefetch_bytes(row_bytes);
  return bytes == 0 ? 0 : std::max<std::size_t>(1, (bytes + row_bytes / 2) / row_bytes);
}

/// One task: the rows [row_begin, row_end) of sequence i, KV head h, for
/// every query head of the group (batches of GB heads).
template <class Arch, std::size_t D, class T, std::size_t GB>
void decode_task(const decode_job<T>& job, std::size_t task) {
  using K = decode_kernels<Arch, D, T, GB>;
  constexpr std::size_t BT = K::block;
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  constexpr bool scaled = std::is_same_v<T, std::int8_t>;
  const decode_params& p = *job.params;
  const decode_workspace& ws = *job.ws;
  const std::size_t group = job.group;
  const std::size_t n_batches = (group + GB - 1) / GB;
  const std::size_t padded = n_batches * GB;
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
  float* o = ensure(s.b, padded * D);
  std::fill(o, o + padded * D, 0.0f);
  float* sc = ensure(s.c, padded * BT);
  float* alpha = ensure(s.d, padded);
  // A zero row of any storage type (all-zero bits are 0 in f32/f16/bf16/int8)
  // stands in for the missing rows of a short block; their bias is -inf.
  float* zero = ensure(s.e, D);
  std::fill(zero, zero + D, 0.0f);
  const T* zero_row = reinterpret_cast<const T*>(zero);
  using state = typename K::state;
  static_assert(sizeof(state) % sizeof(float) == 0 && alignof(state) <= buffer_alignment);
  float* state_memory = ensure(s.f, n_batches * sizeof(state) / sizeof(float));
  state* states = nullptr;
  for (std::size_t b = 0; b < n_batches; ++b) {
    state* st = ::new (static_cast<void*>(state_memory + b * sizeof(state) / sizeof(float))) state;
    st->reset();
    if (b == 0) states = st;
  }
  // The queries in every form this arch's kernels read (decode_queries.hpp).
  const decode_queries<Arch, D, T, GB> q(s, p.q.data() + (i * p.n_heads + h * group) * D, group, padded, job.scale,
                                          scaled && p.int8_queries, std::is_same_v<T, bf16> && p.bf16_queries);
  const float* qg[GB];
  float* og[GB];
  [[maybe_unused]] const bf16* qbg[GB];
  [[maybe_unused]] const std::int16_t* q16g[GB];
  [[maybe_unused]] const std::int8_t* q8g[GB];
  const bool round_p_to_bf16 = std::is_same_v<T, bf16> && p.bf16_probabilities;
  const bool round_p_to_u8 = scaled && p.int8_probabilities;
  // int8 keys on AMX (decode_kernels::scores_amx, same scores as
  // scores_int): each batch's int16 queries as tiles, then room for the
  // rows of one block (amx_stage).
  [[maybe_unused]] bool use_amx = false;
  [[maybe_unused]] std::int8_t* q_tiles = nullptr;
  [[maybe_unused]] std::int8_t* k_stage = nullptr;
#if LLMKIT_ATTENTION_AMX_INT8
  std::optional<tile_scope> tiles;
  if constexpr (K::amx_scores) {
    if (p.tuning.use_amx && amx_tiles_usable()) {
      use_amx = true;
      const std::size_t q_bytes = n_batches * K::amx_q_bytes;
      q_tiles = reinterpret_cast<std::int8_t*>(ensure(s.i, (q_bytes + BT * D) / sizeof(float)));
      k_stage = q_tiles + q_bytes;
      for (std::size_t b = 0; b < n_batches; ++b) {
        const std::int16_t* qb[GB];
        q.batch(q.i16, b, qb);
        K::amx_pack_q(qb, q_tiles + b * K::amx_q_bytes);
      }
      tiles.emplace(K::amx_config());
    }
  }
#endif

  alignas(64) float bias[BT];
  row_tile<T, BT> rt;
  row_walker<T> walker(job.source, p.seq_ids[i], p.layer, h, row_begin);
  // The rows pf_rows ahead of each block, prefetched by the kernels while
  // they work on it (rows past the end: the zero row, already in L1).
  const std::size_t pf_rows = decode_prefetch_rows<T>(D, p.tuning);
  std::size_t ahead_row = std::min(row_end, row_begin + pf_rows);
  row_walker<T> ahead(job.source, p.seq_ids[i], p.layer, h, ahead_row);
  row_tile<T, BT> pf;
  const T* const* pf_k = pf_rows > 0 ? pf.k : nullptr;
  const T* const* pf_v = pf_rows > 0 ? pf.v : nullptr;
  for (std::size_t row = row_begin; row < row_end; row += rt.n) {
    walker.next(rt, std::min(BT, row_end - row));
    if (rt.n == 0) break;
    if (pf_rows > 0) {
      pf.n = 0;
      if (ahead_row < row_end) ahead.next_pointers(pf, std::min(BT, row_end - ahead_row));
      ahead_row += pf.n;
      for (std::size_t j = pf.n; j < BT; ++j) pf.k[j] = pf.v[j] = zero_row;
    }
    const tile_visibility vis = job.mask.classify(q_pos, q_pos, rt.pos_min, rt.pos_max);
    if (vis == tile_visibility::hidden) continue;
    const bool short_block = rt.n < BT;
    for (std::size_t j = rt.n; j < BT; ++j) {
      rt.k[j] = rt.v[j] = zero_row;
      rt.k_scale[j] = rt.v_scale[j] = 0.0f;
    }
    const float* row_bias = nullptr;
    if (short_block || vis == tile_visibility::partial) {
      std::fill(bias, bias + BT, 0.0f);
      std::fill(bias + rt.n, bias + BT, ninf);
      if (vis == tile_visibility::partial) job.mask.apply(bias, 1, 1, 1, q_pos, rt.pos, rt.n);
      row_bias = bias;
    }
    if (use_amx)
      if constexpr (K::amx_scores) K::amx_stage(rt.k, k_stage);
    for (std::size_t b = 0; b < n_batches; ++b) {
      for (std::size_t g = 0; g < GB; ++g) og[g] = o + (b * GB + g) * D;
      q.batch(q.f32, b, qg);
      if constexpr (K::int16_queries) q.batch(q.i16, b, q16g);
      if constexpr (K::int8_queries) q.batch(q.i8, b, q8g);
      if constexpr (K::bf16_dot) q.batch(q.bf, b, qbg);
      float* sb = sc + b * GB * BT;
      // The first batch of heads prefetches (a GQA group of 8 runs two).
      const T* const* bk = b == 0 ? pf_k : nullptr;
      const T* const* bv = b == 0 ? pf_v : nullptr;
      if (use_amx) {  // only ever set where K::amx_scores
        if constexpr (K::amx_scores)
          K::scores_amx(q_tiles + b * K::amx_q_bytes, q.lane_scale + b * K::width, k_stage, sb, bk);
      } else if constexpr (K::int8_queries) {
        if (q.use_i8)
          K::template scores_int<std::int8_t>(q8g, q.lane_scale + b * K::width, q.lane_offset + b * K::width, rt.k, sb,
                                              bk);
        else
          K::template scores_int<std::int16_t>(q16g, q.lane_scale + b * K::width, nullptr, rt.k, sb, bk);
      } else if constexpr (K::int16_queries) {
        K::template scores_int<std::int16_t>(q16g, q.lane_scale + b * K::width, nullptr, rt.k, sb, bk);
      } else if constexpr (K::bf16_dot) {
        if (q.bf != nullptr)
          K::scores_bf16(qbg, rt.k, sb, bk);
        else
          K::scores(qg, rt.k, sb, bk);
      } else {
        K::scores(qg, rt.k, sb, bk);
      }
      if constexpr (K::int16_values) {  // int8 values: P.V in integers
        float p_scale[GB];
        if (K::u8_values && round_p_to_u8) {  // int8_probabilities: VPDPBUSD
          if constexpr (K::u8_values) {
            alignas(64) std::uint8_t p8[BT * GB];
            K::softmax(sb, states[b], row_bias, rt.k_scale, rt.v_scale, p.softcap, alpha + b * GB, nullptr, p_scale,
                       p8);
            K::accumulate_u8(og, alpha + b * GB, p8, p_scale, rt.v, bv);
          }
        } else {  // int16 probabilities
          alignas(64) std::int16_t p16[BT * GB];
          K::softmax(sb, states[b], row_bias, rt.k_scale, rt.v_scale, p.softcap, alpha + b * GB, p16, p_scale,
                     nullptr, round_p_to_u8 ? 255.0f : 32767.0f);
          K::accumulate_i16(og, alpha + b * GB, p16, p_scale, rt.v, bv);
        }
      } else {
        K::softmax(sb, states[b], row_bias, scaled ? rt.k_scale : nullptr, scaled ? rt.v_scale : nullptr, p.softcap,
                   alpha + b * GB);
        if (round_p_to_bf16) {  // bf16_probabilities: VDPBF16PS, or f32 on the rounded values
          alignas(64) bf16 pb[BT * GB];
          simd::convert<Arch>(std::span<const float>(sb, BT * GB), std::span<bf16>(pb));
          if constexpr (K::bf16_pv) {
            K::accumulate_bf16(og, alpha + b * GB, pb, rt.v, bv);
          } else {
            simd::convert<Arch>(std::span<const bf16>(pb), std::span<float>(sb, BT * GB));
            K::accumulate(og, alpha + b * GB, sb, rt.v, bv);
          }
        } else {
          if (round_p_to_u8) K::round_p_u8(sb);  // int8_probabilities: f32 on the rounded values
          K::accumulate(og, alpha + b * GB, sb, rt.v, bv);
        }
      }
    }
  }

  for (std::size_t g = 0; g < group; ++g) {
    const state& st = states[g / GB];
    const float m = st.max(g % GB), l = st.sum(g % GB);
    if (n_splits == 1) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* dst = p.out.data() + (i * p.n_heads + h * group + g) * D;
      for (std::size_t d = 0; d < D; ++d) dst[d] = o[g * D + d] * inv;
    } else {
      float* rec = job.partial + (task * group + g) * (D + 2);
      std::copy(o + g * D, o + (g + 1) * D, rec);
      rec[D] = m;
      rec[D + 1] = l;
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

/// The decode kernel of each (head dim, heads per pass) over storage type T
/// on Arch. A class with an out-of-line member so that one translation unit
/// can compile every kernel for a whole program (attention/kernels.hpp).
template <class Arch, class T>
struct decode_kernel_table {
  using task_fn = void (*)(const decode_job<T>&, std::size_t);
  /// @throws llmkit::error when head_dim is not one of supported_head_dims
  static task_fn select(std::size_t head_dim, std::size_t head_batch);
};

template <class Arch, class T>
typename decode_kernel_table<Arch, T>::task_fn decode_kernel_table<Arch, T>::select(std::size_t head_dim,
                                                                                    std::size_t head_batch) {
  return dispatch_head_dim(head_dim, [head_batch](auto d) -> task_fn {
    constexpr std::size_t D = decltype(d)::value;
    using A = arch_for_head_dim<Arch, D>;
    if (head_batch == 1) return &decode_task<A, D, T, 1>;
    if (head_batch == 2) return &decode_task<A, D, T, 2>;
    return &decode_task<A, D, T, 4>;
  });
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
///      sequence holds >= 1 token; head_dim is one of supported_head_dims
///      (attention/head_dims.hpp). Violations throw llmkit::error (the
///      cache itself reports unknown sequences).
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
  const auto run = detail::decode_kernel_table<Arch, T>::select(head_dim, detail::decode_head_batch(group));
  exec.parallel_for(ws.task_first[n_seqs] * shape.n_kv_heads, [&](std::size_t task) { run(job, task); });
  if (ws.task_first[n_seqs] > n_seqs)
    exec.parallel_for(n_seqs * shape.n_kv_heads, [&](std::size_t k) {
      detail::decode_merge(job, k / shape.n_kv_heads, k % shape.n_kv_heads);
    });
}

}  // namespace llmkit::attention

#if defined(LLMKIT_ATTENTION_EXTERN_KERNELS)
// The kernels for the default arch are compiled elsewhere (attention/kernels.hpp).
namespace llmkit::attention::detail {
extern template struct decode_kernel_table<simd::default_arch, float>;
extern template struct decode_kernel_table<simd::default_arch, f16>;
extern template struct decode_kernel_table<simd::default_arch, bf16>;
extern template struct decode_kernel_table<simd::default_arch, std::int8_t>;
}  // namespace llmkit::attention::detail
#endif

LLMKIT_SIMD_DIAGNOSTICS_END
