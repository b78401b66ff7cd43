// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_queries.hpp
/// The query rows of one decode task (the GQA group of one KV head of one
/// sequence) in every form the kernels of `decode_kernels<Arch, D, T, GB>`
/// read, written once per task into the thread's scratch
/// (`decode_queries`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "llmkit/attention/detail/common.hpp"
#include "llmkit/attention/detail/decode_kernels.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/convert.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// A task's `padded` query rows (its `group` heads, then zero rows up to
/// whole batches of GB heads; a padding head's results are dropped):
/// - `f32` ([padded, D]): q * scale, the rows every f32 kernel reads. With
///   `int8_queries` on a path that dots f32 they hold the int8-rounded
///   values; with `bf16_queries`, the bf16-rounded ones.
/// - `bf` ([padded, D], `bf16_queries` only): the same rows in bf16, for
///   `scores_bf16`.
/// - `i16` ([padded, D], where `K::int16_queries`): each head rounded to
///   int16 levels (its largest |value| / 32767 per step; / 127 with
///   `int8_queries`), for `scores_int<std::int16_t>` and AMX, and the steps
///   in the lane layout (`lane_scale`, [n_batches, width]).
/// - `i8` ([padded, D], `use_i8`: `int8_queries` where `K::int8_queries`):
///   the int8 levels as bytes, for `scores_int<std::int8_t>`, and the
///   offsets it takes off (`lane_offset`, [n_batches, width]: 128 x the
///   head's sum).
/// A head holding inf or NaN gets a NaN scale (so NaN scores, hence a zero
/// output as in f32) and zero levels, instead of converting inf or NaN to
/// an integer (undefined behaviour).
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_queries {
  using K = decode_kernels<Arch, D, T, GB>;

  float* f32 = nullptr;
  bf16* bf = nullptr;
  std::int16_t* i16 = nullptr;
  std::int8_t* i8 = nullptr;
  float* lane_scale = nullptr;
  std::int32_t* lane_offset = nullptr;
  bool use_i8 = false;

  /// @param src [group, D] the task's query rows, unscaled
  /// @param int8_queries round each head to int8 levels (int8 caches only)
  /// @param bf16_queries round each value to bf16 (bf16 caches only)
  decode_queries(decode_scratch& s, const float* src, std::size_t group, std::size_t padded, float scale,
                 bool int8_queries, bool bf16_queries) {
    const std::size_t n_batches = padded / GB;
    f32 = ensure(s.queries, padded * D);
    for (std::size_t x = 0; x < group * D; ++x) f32[x] = src[x] * scale;
    std::fill(f32 + group * D, f32 + padded * D, 0.0f);
    const float levels = int8_queries ? 127.0f : 32767.0f;
    if (int8_queries && !K::int16_queries) {  // f32 scores: the rounded values themselves
      for (std::size_t g = 0; g < group; ++g) {
        float* x = f32 + g * D;
        bool finite = true;
        const float amax = simd::detail::abs_max<Arch>(x, D, finite);
        if (!finite || amax == 0.0f) continue;  // NaN / inf: NaN scores and a zero output as without rounding
        const float step = amax / levels, inv = levels / amax;
        for (std::size_t d = 0; d < D; ++d) x[d] = std::nearbyint(x[d] * inv) * step;
      }
    }
    if (bf16_queries) {
      bf = ensure(s.bf16_queries, padded * D);
      simd::convert<Arch>(std::span<const float>(f32, padded * D), std::span<bf16>(bf, padded * D));
      simd::convert<Arch>(std::span<const bf16>(bf, padded * D), std::span<float>(f32, padded * D));
    }
    if constexpr (K::int16_queries) {
      use_i8 = K::int8_queries && int8_queries;
      i16 = ensure(s.int16_queries, padded * D);
      if constexpr (K::int8_queries) {
        i8 = ensure(s.int8_queries, padded * D);
        lane_offset = ensure(s.lane_offsets, n_batches * K::width);
      }
      lane_scale = ensure(s.lane_scales, n_batches * K::width);
      for (std::size_t g = 0; g < padded; ++g) round_head(g, levels);
    }
  }

  /// The first of batch b's GB rows of `rows` ([padded, D]), per head.
  template <class Q>
  static void batch(const Q* rows, std::size_t b, const Q* (&out)[GB]) noexcept {
    for (std::size_t g = 0; g < GB; ++g) out[g] = rows + (b * GB + g) * D;
  }

 private:
  /// Head g's int16 levels (and int8 ones where use_i8) and its lane-layout
  /// scale (and offset).
  void round_head(std::size_t g, float levels) noexcept {
    const float* x = f32 + g * D;
    bool finite = true;
    const float amax = simd::detail::abs_max<Arch>(x, D, finite);
    const float qscale = finite ? amax / levels : std::numeric_limits<float>::quiet_NaN();
    const float inv = finite && amax > 0.0f ? levels / amax : 0.0f;
    // nearbyint rounds as lrint does (|x * inv| <= levels, in range) but,
    // setting no errno, is inlined and vectorised (lrint is a libm call).
    std::int16_t* row = i16 + g * D;
    if (finite)
      for (std::size_t d = 0; d < D; ++d) row[d] = static_cast<std::int16_t>(std::nearbyint(x[d] * inv));
    else
      std::fill(row, row + D, std::int16_t{0});
    const std::size_t lane0 = (g / GB) * K::width + (g % GB) * K::R;
    for (std::size_t r = 0; r < K::R; ++r) lane_scale[lane0 + r] = qscale;
    if (use_i8) {
      std::int32_t sum = 0;
      for (std::size_t d = 0; d < D; ++d) {
        i8[g * D + d] = static_cast<std::int8_t>(row[d]);
        sum += row[d];
      }
      for (std::size_t r = 0; r < K::R; ++r) lane_offset[lane0 + r] = 128 * sum;
    }
  }
};

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
