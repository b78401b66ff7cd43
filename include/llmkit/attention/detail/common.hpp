// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/common.hpp
/// What the prefill and decode kernels share: their per-thread scratch and the
/// checks of the arguments every call takes.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmkit/attention/head_dims.hpp"
#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"

namespace llmkit::attention::detail {

/// The arch a kernel for head dim D runs on: Arch when D fills whole
/// registers, else the scalar path (tiny head dims only).
template <class Arch, std::size_t D>
using arch_for_head_dim = std::conditional_t<simd::is_scalar_v<Arch> || D % simd::float_lanes<Arch> == 0, Arch,
                                             simd::scalar>;

/// f32 copies of the stored K/V rows of one (prefill call, sequence, KV
/// head), kept by a thread across its consecutive tasks, so a 16-bit or
/// int8 key tile is converted once per thread and KV head rather than once
/// per query block (see memo_tile_rows_f32).
struct converted_tiles {
  std::uint64_t call = 0;  ///< prefill call id (0: empty)
  std::size_t seq = 0, head = 0;
  aligned_vector<float> k, v;        ///< [tile][row][D]
  std::vector<std::uint32_t> rows;  ///< rows converted so far, per key tile
};

/// Grow-only per-thread buffers of decode tasks: no allocation once warm.
/// D is the head dim, `padded` the GQA group rounded up to whole passes.
struct decode_scratch {
  aligned_vector<float> queries;               ///< [padded, D] q * scale (decode_queries::f32)
  aligned_vector<bf16> bf16_queries;           ///< [padded, D] (decode_queries::bf)
  aligned_vector<std::int16_t> int16_queries;  ///< [padded, D] (decode_queries::i16)
  aligned_vector<std::int8_t> int8_queries;    ///< [padded, D] (decode_queries::i8)
  aligned_vector<float> lane_scales;           ///< [n_passes, width] (decode_queries::lane_scale)
  aligned_vector<std::int32_t> lane_offsets;   ///< [n_passes, width] (decode_queries::lane_offset)
  aligned_vector<float> out;                   ///< [padded, D] unnormalised outputs
  aligned_vector<float> scores;                ///< [padded, block] scores, then probabilities
  aligned_vector<float> alpha;                 ///< [padded] rescale factors of the running sums
  aligned_vector<float> zero_row;              ///< [D] zeros: the missing rows of a short block
  aligned_vector<float> states;                ///< room for one softmax state per pass
  aligned_vector<std::int8_t> amx_tiles;       ///< AMX query tiles, then one block's staged keys
  static decode_scratch& local() {
    thread_local decode_scratch s;
    return s;
  }
};

/// Grow-only per-thread buffers of prefill tasks: no allocation once warm.
/// `rows` query rows per task, `qld` rounded up to whole registers, KT keys
/// per tile.
struct prefill_scratch {
  aligned_vector<float> queries;     ///< [D, qld] q * scale, transposed
  aligned_vector<float> out;         ///< [rows, D] unnormalised outputs
  aligned_vector<float> scores;      ///< [KT, qld] scores, then probabilities
  aligned_vector<float> max;         ///< [qld] running max per row
  aligned_vector<float> sum;         ///< [qld] running sum per row
  aligned_vector<float> alpha;       ///< [qld] rescale factors
  aligned_vector<float> keys;        ///< [KT, D] a key tile converted to f32
  aligned_vector<float> values;      ///< [KT, D] a value tile converted to f32
  std::vector<std::uint32_t> key_counts;  ///< visible keys per token, row and row register
  converted_tiles converted;
  static prefill_scratch& local() {
    thread_local prefill_scratch s;
    return s;
  }
};

/// Resizes `buffer` to at least n elements and returns its data.
template <class T>
T* ensure(aligned_vector<T>& buffer, std::size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

/// Checks the arguments decode and prefill share (`Params`: their
/// parameter structs): layer, heads, scale, softcap and sinks (none, or one
/// finite logit per query head). Returns the GQA group size.
template <class Params, class Cache>
std::size_t check_heads(const char* kernel, const Params& p, const Cache& cache) {
  const kv::kv_shape shape = cache.shape();
  LLMKIT_CHECK(p.layer < shape.n_layers, kernel, ": layer ", p.layer, " is out of range (n_layers = ", shape.n_layers,
               ")");
  LLMKIT_CHECK(shape.n_kv_heads > 0, kernel, ": the cache has n_kv_heads = 0");
  LLMKIT_CHECK(p.n_heads > 0 && p.n_heads % shape.n_kv_heads == 0, kernel, ": n_heads = ", p.n_heads,
               " is not a positive multiple of the cache's n_kv_heads = ", shape.n_kv_heads);
  LLMKIT_CHECK(std::isfinite(p.scale) && p.scale >= 0.0f, kernel, ": scale must be finite and >= 0, got ", p.scale);
  LLMKIT_CHECK(std::isfinite(p.softcap) && p.softcap >= 0.0f, kernel, ": softcap must be finite and >= 0, got ",
               p.softcap);
  LLMKIT_CHECK(p.sinks.empty() || p.sinks.size() == p.n_heads, kernel, ": sinks.size() = ", p.sinks.size(),
               " must be 0 or n_heads = ", p.n_heads);
  for (std::size_t h = 0; h < p.sinks.size(); ++h)
    LLMKIT_CHECK(std::isfinite(p.sinks[h]), kernel, ": sinks[", h, "] = ", p.sinks[h], " must be finite");
  return p.n_heads / shape.n_kv_heads;
}

/// Checks `[n_rows, n_heads, head_dim] q, out`; `rows` is n_rows's name in
/// the message (n_seqs for decode, n_tokens for prefill).
template <class Params>
void check_rows(const char* kernel, const Params& p, const char* rows, std::size_t n_rows, std::size_t head_dim) {
  const std::size_t expected = n_rows * p.n_heads * head_dim;
  LLMKIT_CHECK(p.q.size() == expected, kernel, ": q.size() = ", p.q.size(), " must be ", rows,
               " * n_heads * head_dim = ", n_rows, " * ", p.n_heads, " * ", head_dim, " = ", expected);
  LLMKIT_CHECK(p.out.size() == expected, kernel, ": out.size() = ", p.out.size(), " must be ", rows,
               " * n_heads * head_dim = ", expected);
}

/// The softmax denominator l of a row whose running max is m, with head
/// h's sink term exp(sink - m) added when the call has sinks. A row that
/// saw no key (m = -inf) keeps l = 0: its output is zeros either way.
inline float with_sink(float l, float m, std::span<const float> sinks, std::size_t h) noexcept {
  if (sinks.empty() || !(m > -std::numeric_limits<float>::infinity())) return l;
  return l + std::exp(sinks[h] - m);
}

/// The softmax scale of a call: `scale`, or 1/sqrt(head_dim) when 0.
inline float effective_scale(float scale, std::size_t head_dim) {
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace llmkit::attention::detail
