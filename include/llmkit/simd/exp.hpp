// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/exp.hpp  Vectorised e^x on f32 vectors.
///
/// Method (Cephes expf with FMA): n = round(x * log2 e) by the 1.5 * 2^23
/// shifter trick, r = x - n ln 2 in two FMA steps (Cody-Waite), e^r by a
/// degree-5 minimax polynomial on |r| <= ln 2 / 2, then the result is scaled
/// by 2^n in two halves so subnormal results round correctly.
///
/// Accuracy: max relative error <= 2e-7 over [-87, 88] (tested against
/// double-precision `std::exp`). Special values: x < -104 (and -inf) gives
/// exactly +0, x > 88.7228 (the overflow point, and +inf) gives +inf, NaN gives
/// NaN. Between -104 and -87.34 the result is subnormal (absolute error below
/// the smallest subnormal).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <span>
#include <type_traits>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

namespace detail {

inline constexpr float exp_lo = -104.0f;  ///< below: result rounds to +0
inline constexpr float exp_hi = 89.0f;    ///< above: result overflows to +inf
inline constexpr float exp_log2e = 1.44269504088896341f;
inline constexpr float exp_shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
inline constexpr float exp_ln2_hi = 0.693359375f;  // few mantissa bits: n * ln2_hi is exact
inline constexpr float exp_ln2_lo = -2.12194440e-4f;
inline constexpr float exp_p0 = 1.9875691500e-4f;
inline constexpr float exp_p1 = 1.3981999507e-3f;
inline constexpr float exp_p2 = 8.3334519073e-3f;
inline constexpr float exp_p3 = 4.1665795894e-2f;
inline constexpr float exp_p4 = 1.6666665459e-1f;
inline constexpr float exp_p5 = 5.0000001201e-1f;

/// e^(x - n ln 2) for n = round(x log2 e) (an integer held in V): the core
/// every llmkit exponential shares (simd::exp and the attention softmax's
/// `vexp_softmax`); each caller computes n and scales the result by 2^n its
/// own way. r = x - n ln 2 in two FMA steps (Cody-Waite: n * ln2_hi is
/// exact), then 1 + r + r^2 p(r) with the degree-5 polynomial p, for
/// |r| <= ln 2 / 2. V is float or xsimd::batch<float, Arch>; Arch also
/// keeps the float instantiations of translation units built for
/// different archs apart (as for exp_scalar), and floats go through
/// std::fma, not a shared out-of-line xsimd::fma<float>.
template <class Arch, class V>
inline V exp_reduced(const V& x, const V& n) noexcept {
  const auto fma = [](const V& a, const V& b, const V& c) {
    if constexpr (std::is_same_v<V, float>) return std::fma(a, b, c);
    else return xsimd::fma(a, b, c);
  };
  V r = fma(n, V(-exp_ln2_hi), x);  // = fnma(n, ln2_hi, x): negating a constant is exact
  r = fma(n, V(-exp_ln2_lo), r);
  V p(exp_p0);
  p = fma(p, r, V(exp_p1));
  p = fma(p, r, V(exp_p2));
  p = fma(p, r, V(exp_p3));
  p = fma(p, r, V(exp_p4));
  p = fma(p, r, V(exp_p5));
  return fma(p, r * r, r) + V(1.0f);
}

/// e^x for one register of Arch (see the file comment for the contract).
template <class Arch>
inline xsimd::batch<float, Arch> exp_batch(const xsimd::batch<float, Arch>& x_in) noexcept {
  using batch = xsimd::batch<float, Arch>;
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  const batch x = xsimd::min(xsimd::max(x_in, batch(exp_lo)), batch(exp_hi));
  const batch t = xsimd::fma(x, batch(exp_log2e), batch(exp_shifter));
  const batch y = exp_reduced<Arch>(x, t - batch(exp_shifter));
  const ibatch k = xsimd::bitwise_cast<ibatch>(t) - ibatch(std::bit_cast<std::int32_t>(exp_shifter));
  const ibatch k1 = k >> 1;
  const ibatch k2 = k - k1;
  const batch s1 = xsimd::bitwise_cast<batch>((k1 + ibatch(127)) << 23);
  const batch s2 = xsimd::bitwise_cast<batch>((k2 + ibatch(127)) << 23);
  const batch result = (y * s1) * s2;
  return xsimd::select(xsimd::isnan(x_in), x_in, result);
}

/// e^x for one float with the same algorithm as exp_batch (templated on Arch
/// so that translation units built for different archs never share it).
template <class Arch>
inline float exp_scalar(float x_in) noexcept {
  if (x_in != x_in) return x_in;
  const float x = x_in < exp_lo ? exp_lo : (x_in > exp_hi ? exp_hi : x_in);
  const float t = std::fma(x, exp_log2e, exp_shifter);
  const float y = exp_reduced<Arch>(x, t - exp_shifter);
  const std::int32_t k = std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(exp_shifter);
  const std::int32_t k1 = k >> 1;
  const std::int32_t k2 = k - k1;
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(k1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(k2 + 127) << 23);
  return (y * s1) * s2;
}

}  // namespace detail

/// out[i] = e^in[i]; `in` and `out` may be the same array (not partly
/// overlapping). See the file comment for accuracy and special values.
/// @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void exp(std::span<const float> in, std::span<float> out) {
  LLMKIT_CHECK(in.size() == out.size(), "exp: in.size() = ", in.size(), " differs from out.size() = ", out.size());
  const std::size_t n = in.size();
  const float* src = in.data();
  float* dst = out.data();
  if constexpr (is_scalar_v<Arch>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = detail::exp_scalar<Arch>(src[i]);
  } else {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) detail::exp_batch<Arch>(batch::load_unaligned(src + i)).store_unaligned(dst + i);
    if (i < n) {  // the tail goes through one padded register: same results as the body
      alignas(64) float tail[lanes] = {};
      for (std::size_t j = 0; j < n - i; ++j) tail[j] = src[i + j];
      detail::exp_batch<Arch>(batch::load_aligned(tail)).store_aligned(tail);
      for (std::size_t j = 0; j < n - i; ++j) dst[i + j] = tail[j];
    }
  }
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
