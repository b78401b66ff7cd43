// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/accumulate.hpp
/// The loop shared by the reductions (dot, sum, max, rmsnorm's sum of
/// squares): N independent vector accumulators, so consecutive steps do not
/// wait on each other's latency.

#include <cstddef>
#include <utility>

#include "llmkit/simd/detail/diagnostics.hpp"
#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd::detail {

/// Folds `[n]` elements into `acc` batch by batch: while N whole batches
/// remain, `acc[j] = step(acc[j], i + j * lanes)` for j = 0..N-1 (unrolled);
/// then `acc[0] = step(acc[0], i)` per remaining whole batch. Returns the
/// index of the first element left for the scalar tail (n % lanes of them).
/// `step(batch acc, std::size_t offset) -> batch` reads one batch at `offset`.
template <class Arch, std::size_t N, class Step>
inline std::size_t accumulate_batches(std::size_t n, xsimd::batch<float, Arch> (&acc)[N], Step&& step) {
  static_assert(N > 0, "accumulate_batches: N must be > 0");
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  std::size_t i = 0;
  [&]<std::size_t... J>(std::index_sequence<J...>) {
    for (; i + N * lanes <= n; i += N * lanes) ((acc[J] = step(acc[J], i + J * lanes)), ...);
  }(std::make_index_sequence<N>{});
  for (; i + lanes <= n; i += lanes) acc[0] = step(acc[0], i);
  return i;
}

/// Combines the N accumulators pairwise, as a balanced tree:
/// for N = 4, `op(op(acc[0], acc[1]), op(acc[2], acc[3]))`. @pre N is a power of 2.
template <class Arch, std::size_t N, class Op>
inline xsimd::batch<float, Arch> combine_pairwise(const xsimd::batch<float, Arch> (&acc)[N], Op&& op) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "combine_pairwise: N must be a power of 2");
  if constexpr (N == 1) {
    return acc[0];
  } else {
    xsimd::batch<float, Arch> half[N / 2];
    for (std::size_t j = 0; j < N / 2; ++j) half[j] = op(acc[2 * j], acc[2 * j + 1]);
    return combine_pairwise<Arch>(half, op);
  }
}

}  // namespace llmkit::simd::detail

LLMKIT_SIMD_DIAGNOSTICS_END
