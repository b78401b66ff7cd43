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
template <class Arch>
inline constexpr bool has_avx2 = [] {
  if constexpr (simd::is_scalar_v<Arch>) return false;
  else return std::is_base_of_v<xsimd::avx2, Arch>;
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
/// register; with 16 registers it would spill (`vheld`). Measured on Zen 5,
/// one thread, same process, alternating rounds (docs/attention-history.md,
/// session 18): queries held, f16 / bf16 decode +4.5-5 % from DRAM, int8
/// +2 %; f32 keys and values held too, +22 % in cache, unchanged from DRAM.
template <class R>
inline R in_register(R x) noexcept {
  static_assert(sizeof(R) == 64, "in_register: one 512-bit register");
#if defined(__GNUC__)
  asm("" : "+v"(x));
#endif
  return x;
}

/// The folding tree of haddp16 / haddi16 over 16 registers (lanes seen as
/// f32 or int32 bits; `add` is the lane-wise sum of that type).
template <class Add>
inline __m512 hadd16_tree(const __m512* r, Add add) noexcept {
  __m512 x[8], z[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a, b, a, b] partial sums
    x[i] = add(_mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]), _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: [a, b, c, d]
    z[i] = add(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
               _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w01 = add(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w23 = add(_mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return add(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
             _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/// 16 registers -> one register of their sums. xsimd 8.1's avx512 haddp
/// returns the sums in a permuted order (2<->4, 3<->5, 10<->12, 11<->13),
/// so llmkit folds them itself: pairs within 128-bit lanes, then across.
inline __m512 haddp16(const __m512* r) noexcept {
  return hadd16_tree(r, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

/// haddp16 for int32 lanes (wrapping adds): integer dot products are folded
/// before their one conversion to f32 instead of converted 16 times.
inline __m512i haddi16(const __m512i* r) noexcept {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
  return _mm512_castps_si512(hadd16_tree(f, [](__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }));
}
#endif

#if defined(__AVX2__)
/// haddi16 for AVX2: 8 registers of int32 lanes -> one register whose lane
/// a is the sum of r[a]'s lanes (pair sums within 128-bit halves, then the
/// halves added).
inline __m256i haddi8(const __m256i* r) noexcept {
  const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(r[0], r[1]), _mm256_hadd_epi32(r[2], r[3]));
  const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(r[4], r[5]), _mm256_hadd_epi32(r[6], r[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}
#endif

/// `x` held in a register (`in_register`) on AVX-512; `x` itself elsewhere.
template <class Arch>
inline vec<Arch> vheld(vec<Arch> x) noexcept {
#if defined(__AVX512F__)
  if constexpr (has_avx512<Arch>) return in_register(static_cast<__m512>(x));
#endif
  return x;
}

/// result[i] = sum of the lanes of rows[i], for i < lanes<Arch>.
template <class Arch>
inline vec<Arch> vhaddp(const vec<Arch>* rows) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) {
    return rows[0];
  } else {
#if defined(__AVX512F__)
    if constexpr (has_avx512<Arch>) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = rows[i];
      return haddp16(r);
    }
#endif
    return xsimd::haddp(rows);
  }
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
