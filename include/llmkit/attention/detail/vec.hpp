// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/vec.hpp
/// The handful of vector operations the attention kernels use, on one type
/// `vec<Arch>`: `xsimd::batch<float, Arch>` for xsimd archs and a one-lane
/// `scalar_vec` for `simd::scalar`, so every kernel is written once and the
/// scalar instantiation is plain C++ (the partner of the test oracles).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/hadd16.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// One float in a "vector" of one lane.
struct scalar_vec {
  float value = 0.0f;
  static constexpr std::size_t size = 1;
  scalar_vec() = default;
  scalar_vec(float v) : value(v) {}  // NOLINT: broadcast, like xsimd::batch
  friend scalar_vec operator+(scalar_vec a, scalar_vec b) { return a.value + b.value; }
  friend scalar_vec operator-(scalar_vec a, scalar_vec b) { return a.value - b.value; }
  friend scalar_vec operator*(scalar_vec a, scalar_vec b) { return a.value * b.value; }
};

template <class Arch>
using vec = std::conditional_t<simd::is_scalar_v<Arch>, scalar_vec, xsimd::batch<float, Arch>>;

template <class Arch>
inline constexpr std::size_t lanes = vec<Arch>::size;

template <class Arch>
inline vec<Arch> vload(const float* p) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(*p);
  else return vec<Arch>::load_unaligned(p);
}
template <class Arch>
inline void vstore(float* p, vec<Arch> v) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) *p = v.value;
  else v.store_unaligned(p);
}
template <class Arch>
inline vec<Arch> vfma(vec<Arch> a, vec<Arch> b, vec<Arch> c) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) {
    // One rounding where the target has FMA, as in the vector paths; the
    // explicit call also keeps the compiler from contracting a*b+c in some
    // unrollings of a loop and not in others (results then change with the
    // trip count: 1-ulp differences between otherwise equal calls).
#if defined(FP_FAST_FMAF)
    return scalar_vec(std::fma(a.value, b.value, c.value));
#else
    return scalar_vec(a.value * b.value + c.value);
#endif
  } else {
    return xsimd::fma(a, b, c);
  }
}
template <class Arch>
inline vec<Arch> vmax(vec<Arch> a, vec<Arch> b) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(std::max(a.value, b.value));
  else return xsimd::max(a, b);
}
template <class Arch>
inline vec<Arch> vexp(vec<Arch> a) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(std::exp(a.value));
  else return xsimd::exp(a);
}
template <class Arch>
inline vec<Arch> vtanh(vec<Arch> a) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(std::tanh(a.value));
  else return xsimd::tanh(a);
}
/// m where m is finite, 0 where m == -inf: the safe softmax shift of a row
/// that has seen no visible key yet (exp(-inf - 0) == 0, never NaN).
template <class Arch>
inline vec<Arch> vfinite_or_zero(vec<Arch> m) noexcept {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(m.value == ninf ? 0.0f : m.value);
  else return xsimd::select(m == vec<Arch>(ninf), vec<Arch>(0.0f), m);
}
/// Sum of all lanes.
template <class Arch>
inline float vhadd(vec<Arch> v) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return v.value;
  else return xsimd::hadd(v);
}
template <class Arch>
inline constexpr bool has_avx512 = [] {
  if constexpr (simd::is_scalar_v<Arch>) return false;
  else return std::is_base_of_v<xsimd::avx512f, Arch>;
}();

#if defined(__AVX512F__)
/// Keeps `x` in a register for every instruction that reads it. GCC 12
/// otherwise folds the load that produced `x` into each of its users as a
/// memory operand: decode's scores kernels re-read each query register for
/// every key row (20 loads per 16 multiply-adds on f16 keys, more than two
/// 512-bit load pipes issue beside two FMA pipes on Zen 5), and each f32
/// key or value register for every head. The empty asm claims to change
/// the register, so the value is loaded once. Only for AVX-512, whose 32
/// registers hold the kernels' 16 accumulators, the queries and a key
/// register; with 16 registers it would spill (`vheld`).
template <class R>
inline R in_register(R x) noexcept {
  static_assert(sizeof(R) == 64, "in_register: one 512-bit register");
#if defined(__GNUC__)
  asm("" : "+v"(x));
#endif
  return x;
}

#endif

using simd::requires_arch;

template <class Arch>
inline vec<Arch> vheld(vec<Arch> x, requires_arch<xsimd::generic>) noexcept {
  return x;
}

template <class Arch>
inline vec<Arch> vhaddp(const vec<Arch>* rows, requires_arch<xsimd::generic>) noexcept {
  return xsimd::haddp(rows);
}

#if defined(__AVX512F__)
template <class Arch>
inline vec<Arch> vheld(vec<Arch> x, requires_arch<xsimd::avx512f>) noexcept {
  return in_register(static_cast<__m512>(x));
}

template <class Arch>
inline vec<Arch> vhaddp(const vec<Arch>* rows, requires_arch<xsimd::avx512f>) noexcept {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = rows[i];
  return simd::detail::haddp16(r);
}
#endif

/// `x` held in a register (`in_register`) on AVX-512; `x` itself elsewhere.
template <class Arch>
inline vec<Arch> vheld(vec<Arch> x) noexcept {
  return vheld<Arch>(x, simd::kernel_arch<Arch>{});
}

/// result[i] = sum of the lanes of rows[i], for i < lanes<Arch>.
template <class Arch>
inline vec<Arch> vhaddp(const vec<Arch>* rows) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return rows[0];
  else return vhaddp<Arch>(rows, Arch{});
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
