// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/detail/hadd16.hpp
/// Horizontal sums of many registers at once, each register reduced by the
/// same fixed tree whatever its slot (so a result does not depend on where
/// its register sat): `haddp16` / `haddi16` on AVX-512 (f32 / int32 lanes),
/// `haddi8` on AVX2 (int32 lanes). Used by the attention kernels and the
/// model's matmul.

#include "llmkit/simd/detail/intrinsics.hpp"

namespace llmkit::simd::detail {

#if defined(__AVX512F__)
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

}  // namespace llmkit::simd::detail
