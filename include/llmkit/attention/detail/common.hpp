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

/// Checks the arguments both kernels share and returns the GQA group size.
template <class Cache>
std::size_t check_heads(const char* kernel, const Cache& cache, std::size_t layer, std::size_t n_heads,
                        float scale, float softcap) {
  const kv::kv_shape shape = cache.shape();
  LLMKIT_CHECK(layer < shape.n_layers, kernel, ": layer ", layer, " is out of range (n_layers = ", shape.n_layers,
               ")");
  LLMKIT_CHECK(shape.n_kv_heads > 0, kernel, ": the cache has n_kv_heads = 0");
  LLMKIT_CHECK(n_heads > 0 && n_heads % shape.n_kv_heads == 0, kernel, ": n_heads = ", n_heads,
               " is not a positive multiple of the cache's n_kv_heads = ", shape.n_kv_heads);
  LLMKIT_CHECK(std::isfinite(scale) && scale >= 0.0f, kernel, ": scale must be finite and >= 0, got ", scale);
  LLMKIT_CHECK(std::isfinite(softcap) && softcap >= 0.0f, kernel, ": softcap must be finite and >= 0, got ",
               softcap);
  return n_heads / shape.n_kv_heads;
}

/// Checks a call's attention sinks: none, or one finite logit per query head.
inline void check_sinks(const char* kernel, std::span<const float> sinks, std::size_t n_heads) {
  LLMKIT_CHECK(sinks.empty() || sinks.size() == n_heads, kernel, ": sinks.size() = ", sinks.size(),
               " must be 0 or n_heads = ", n_heads);
  for (std::size_t h = 0; h < sinks.size(); ++h)
    LLMKIT_CHECK(std::isfinite(sinks[h]), kernel, ": sinks[", h, "] = ", sinks[h], " must be finite");
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
