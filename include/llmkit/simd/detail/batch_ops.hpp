// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/batch_ops.hpp
/// Small register-level helpers shared by the simd kernels. Every helper is a
/// template over the arch tag, so translation units compiled with different
/// `-march` flags never share a non-template inline function (ODR hazard).

#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/simd/detail/intrinsics.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd::detail {

/// Largest lane of `v` (NaN lanes must have been handled by the caller).
template <class Arch>
inline float hmax(const xsimd::batch<float, Arch>& v) noexcept {
  alignas(64) float lanes[xsimd::batch<float, Arch>::size];
  v.store_aligned(lanes);
  float m = lanes[0];
  for (std::size_t i = 1; i < xsimd::batch<float, Arch>::size; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}

/// Generator for xsimd::make_batch_constant: swaps neighbouring lanes (0<->1, 2<->3, ...).
struct swap_pairs_index {
  static constexpr std::uint32_t get(std::size_t i, std::size_t) noexcept {
    return static_cast<std::uint32_t>(i ^ 1u);
  }
};

}  // namespace llmkit::simd::detail

LLMKIT_SIMD_DIAGNOSTICS_END
