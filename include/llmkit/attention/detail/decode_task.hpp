// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_task.hpp
/// One decode task: the rows of one split of one sequence's context, one
/// KV head, every query head of its GQA group, block by block through the
/// kernels of `decode_kernels` with an online softmax (`decode_task`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <type_traits>

#include "llmkit/attention/detail/amx.hpp"
#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_job.hpp"
#include "llmkit/attention/detail/decode_kernels.hpp"
#include "llmkit/attention/detail/decode_queries.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/tuning.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/convert.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

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
  const auto& p = *job.params;  // decode_params
  const auto& ws = *job.ws;     // decode_workspace
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

  decode_scratch& s = decode_scratch::local();
  float* o = ensure(s.out, padded * D);
  std::fill(o, o + padded * D, 0.0f);
  float* sc = ensure(s.scores, padded * BT);
  float* alpha = ensure(s.alpha, padded);
  // A zero row of any storage type (all-zero bits are 0 in f32/f16/bf16/int8)
  // stands in for the missing rows of a short block; their bias is -inf.
  float* zero = ensure(s.zero_row, D);
  std::fill(zero, zero + D, 0.0f);
  const T* zero_row = reinterpret_cast<const T*>(zero);
  using state = typename K::state;
  static_assert(sizeof(state) % sizeof(float) == 0 && alignof(state) <= buffer_alignment);
  float* state_memory = ensure(s.states, n_batches * sizeof(state) / sizeof(float));
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
      q_tiles = ensure(s.amx_tiles, q_bytes + BT * D);
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
            K::accumulate_int(og, alpha + b * GB, p8, p_scale, rt.v, bv);
          }
        } else {  // int16 probabilities
          alignas(64) std::int16_t p16[BT * GB];
          K::softmax(sb, states[b], row_bias, rt.k_scale, rt.v_scale, p.softcap, alpha + b * GB, p16, p_scale,
                     nullptr, round_p_to_u8 ? 255.0f : 32767.0f);
          K::accumulate_int(og, alpha + b * GB, p16, p_scale, rt.v, bv);
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
      const float l_all = with_sink(l, m, p.sinks, h * group + g);
      const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
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

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
