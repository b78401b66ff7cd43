// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_kernels.hpp
/// The micro-kernels of decode attention: one query row per head against a
/// block of `block` keys. Decode is memory-bound, so a K/V row is brought in
/// once and then reused from L1 by every query head of its GQA group; dot
/// products keep one accumulator per key (independent FMA chains) and fold
/// the `block` accumulators into one register of scores with haddp.

#include <cstddef>

#include "llmkit/attention/detail/vec.hpp"

namespace llmkit::attention::detail {

/// Largest divisor of n that is <= limit.
constexpr std::size_t largest_divisor_at_most(std::size_t n, std::size_t limit) {
  for (std::size_t c = limit; c > 1; --c)
    if (n % c == 0) return c;
  return 1;
}

template <class Arch, std::size_t D>
struct decode_kernels {
  using V = vec<Arch>;
  static constexpr std::size_t L = lanes<Arch>;
  static constexpr std::size_t block = 16;  ///< keys per block
  static_assert(D % L == 0, "decode_kernels: head_dim must be a multiple of the register width");
  static_assert(block % L == 0, "decode_kernels: the key block must fill whole registers");
  static constexpr std::size_t DV = D / L;
  static constexpr std::size_t score_chunk = largest_divisor_at_most(DV, 8);   // query registers held
  static constexpr std::size_t value_chunk = largest_divisor_at_most(DV, 16);  // output registers held

  /// scores[j] = sum_d q[d] * k[j][d] for j < block (every k[j] readable).
  static void scores(const float* q, const float* const* k, float* scores_out) noexcept {
    V acc[block];
    for (std::size_t j = 0; j < block; ++j) acc[j] = V(0.0f);
    for (std::size_t c0 = 0; c0 < DV; c0 += score_chunk) {
      V qv[score_chunk];
      for (std::size_t c = 0; c < score_chunk; ++c) qv[c] = vload<Arch>(q + (c0 + c) * L);
      for (std::size_t j = 0; j < block; ++j) {
        const float* kj = k[j] + c0 * L;
        for (std::size_t c = 0; c < score_chunk; ++c) acc[j] = vfma<Arch>(qv[c], vload<Arch>(kj + c * L), acc[j]);
      }
    }
    for (std::size_t b = 0; b < block / L; ++b) vstore<Arch>(scores_out + b * L, vhaddp<Arch>(acc + b * L));
  }

  /// o = alpha * o + sum_{j < n} p[j] * v[j].
  static void accumulate(float* o, float alpha, const float* p, const float* const* v, std::size_t n) noexcept {
    for (std::size_t c0 = 0; c0 < DV; c0 += value_chunk) {
      V acc[value_chunk];
      const V a(alpha);
      for (std::size_t c = 0; c < value_chunk; ++c) acc[c] = vload<Arch>(o + (c0 + c) * L) * a;
      for (std::size_t j = 0; j < n; ++j) {
        const V pj(p[j]);
        const float* vj = v[j] + c0 * L;
        for (std::size_t c = 0; c < value_chunk; ++c) acc[c] = vfma<Arch>(pj, vload<Arch>(vj + c * L), acc[c]);
      }
      for (std::size_t c = 0; c < value_chunk; ++c) vstore<Arch>(o + (c0 + c) * L, acc[c]);
    }
  }
};

}  // namespace llmkit::attention::detail
