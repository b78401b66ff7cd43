// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/kernel_simd.hpp
/// Two vector helpers of the attention kernels (per-arch overloads on the
/// xsimd arch tag, `requires_arch`):
/// - `vexp_softmax<Arch>(x)`: e^x for the softmax arguments x <= 0 (scores
///   minus their running max; -inf for masked scores gives exactly 0), the
///   exponential of both the prefill and the decode softmax;
/// - `transpose16`: an in-register 16 x 16 float transpose (AVX-512), used
///   to lay a block of query rows out as columns once per query block.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/exp.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

template <class Arch>
inline vec<Arch> vexp_softmax(vec<Arch> x, requires_arch<xsimd::generic>) noexcept {
  // simd::exp's polynomial without its general cases. For x in [-87, 0],
  // n = round(x / ln 2) lies in [-126, 0], so 2^n is one normal scale
  // (simd::exp scales twice to reach subnormal results) and no NaN test is
  // needed (a NaN x fails `keep`; +inf gives NaN, as on AVX-512). Half of
  // simd::exp's instructions, on AVX2 decode's softmax chain.
  namespace sd = simd::detail;
  using V = vec<Arch>;
  using I = xsimd::batch<std::int32_t, Arch>;
  const auto keep = x >= V(-87.0f);
  const V xc = xsimd::max(x, V(-87.0f));
  const V t = xsimd::fma(xc, V(sd::exp_log2e), V(sd::exp_shifter));
  const V y = sd::exp_reduced<Arch>(xc, t - V(sd::exp_shifter));
  const I k = xsimd::bitwise_cast<I>(t) - I(std::bit_cast<std::int32_t>(sd::exp_shifter));
  return xsimd::select(keep, y * xsimd::bitwise_cast<V>((k + I(127)) << 23), V(0.0f));
}

#if defined(__AVX512F__)
template <class Arch>
inline vec<Arch> vexp_softmax(vec<Arch> x, requires_arch<xsimd::avx512f>) noexcept {
  namespace sd = simd::detail;
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(sd::exp_log2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 y = sd::exp_reduced<Arch>(vec<Arch>(xc), vec<Arch>(n));
  return _mm512_maskz_scalef_ps(keep, y, n);
}
#endif

/// e^x for x <= 0 or -inf, relative error <= 2e-7 (Cephes polynomial of
/// llmkit/simd/exp.hpp); x < -87 (where e^x nears the smallest normal
/// float) and -inf give exactly +0: a fully masked row must sum to 0, not to
/// a few subnormals, and no lane may underflow, since every underflowing
/// lane costs a microcode assist of ~100 cycles. On AVX-512 the scaling by
/// 2^n is one `vscalefps`, its lanes below -87 masked to zero (fewer
/// instructions than the general simd::exp, which must handle overflow, NaN
/// and subnormal rounding).
template <class Arch>
inline vec<Arch> vexp_softmax(vec<Arch> x) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) return scalar_vec(x.value >= -87.0f ? std::exp(x.value) : 0.0f);
  else return vexp_softmax<Arch>(x, Arch{});
}

#if defined(__AVX512F__)
/// Transposes the 16 x 16 matrix whose row i is r[i], in place: afterwards
/// r[c] holds column c. Three shuffle stages (within 128-bit lanes, then
/// across lanes twice), 64 shuffles in all.
inline void transpose16(__m512* r) noexcept {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
    t[8 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xDD);
  }
}
#endif

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
