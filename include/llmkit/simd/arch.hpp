// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/arch.hpp
/// Compile-time choice of the SIMD instruction set.
///
/// Every kernel is a template over an arch tag `Arch`:
/// - `llmkit::simd::scalar`: plain C++ loops; always available, the partner
///   of the double-precision test oracles;
/// - any xsimd 8.1 arch tag (`xsimd::sse4_2`, `xsimd::avx2`, `xsimd::fma3<xsimd::avx2>`,
///   `xsimd::avx512bw`, ...) that the translation unit is compiled for.
///
/// `default_arch` is the best arch the compiler targets (xsimd's choice from
/// `-march`), or what the macro `LLMKIT_SIMD_ARCH` names when it is defined
/// (e.g. `-DLLMKIT_SIMD_ARCH=llmkit::simd::scalar`). A single call overrides
/// it with an explicit template argument: `simd::dot<xsimd::avx2>(a, b)`.

#include <cstddef>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"

namespace llmkit::simd {

/// The portable, non-vector arch.
struct scalar {
  static constexpr const char* name() noexcept { return "scalar"; }
  static constexpr bool available() noexcept { return true; }
  static constexpr unsigned alignment() noexcept { return alignof(float); }
};

#if defined(LLMKIT_SIMD_ARCH)
using default_arch = LLMKIT_SIMD_ARCH;
#else
using default_arch = xsimd::default_arch;
#endif

/// True for `simd::scalar`, false for xsimd arch tags.
template <class Arch>
inline constexpr bool is_scalar_v = std::is_same_v<Arch, scalar>;

/// A kernel's overload for one instruction set, as xsimd's kernels take it
/// (`f(..., requires_arch<xsimd::avx2>)`): an arch calls the overload of its
/// most derived tag, `xsimd::generic` is the fallback.
template <class A>
using requires_arch = xsimd::kernel::requires_arch<A>;

/// The xsimd tag that picks Arch's overload of such a kernel: Arch itself,
/// `xsimd::generic` for `scalar` (call `f(..., kernel_arch<Arch>{})`).
template <class Arch>
using kernel_arch = std::conditional_t<std::is_same_v<Arch, scalar>, xsimd::generic, Arch>;

/// Lanes of float per register of Arch (1 for scalar).
template <class Arch>
inline constexpr std::size_t float_lanes = [] {
  if constexpr (is_scalar_v<Arch>) return std::size_t{1};
  else return std::size_t{xsimd::batch<float, Arch>::size};
}();

/// The arch's printable name ("avx512bw", "fma3+avx2", "scalar", ...).
template <class Arch>
constexpr const char* arch_name() noexcept {
  return Arch::name();
}

}  // namespace llmkit::simd
