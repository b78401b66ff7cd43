// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/quants.hpp
/// ggml's quantised block formats as GGUF files store them (Q4_0, Q4_1,
/// Q5_0, Q5_1; the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K over 256-value
/// super-blocks; the non-linear IQ4_NL and IQ4_XS; MXFP4, the OCP
/// microscaling FP4 of gpt-oss's experts; Q8_0 is `block_q8_0` in
/// core/dtype.hpp), with the scalar decoding that defines each value and a
/// round-to-nearest encoder.
///
/// Decoding (`dequantize_block`) is exact in this sense: every value is
/// one f32 expression of the block's integers and f16 scales, evaluated as
/// written below, so every correct implementation (this scalar one, a SIMD
/// one, a test's oracle) gives the same bits. Where a value has the form
/// `a * q + b` it is one fused multiply-add, `fma(a, q, b)`:
///
/// | type | block | bytes | value j |
/// |---|---|---|---|
/// | Q4_0 | 32 | 18 | `d * (q_j - 8)`, q_j a nibble: low nibbles of qs[0..15] are j = 0..15, high nibbles j = 16..31 |
/// | Q4_1 | 32 | 20 | `fma(d, q_j, m)` |
/// | Q5_0 | 32 | 22 | `d * (q_j - 16)`, q_j = nibble + 16 * bit j of the 32-bit qh |
/// | Q5_1 | 32 | 24 | `fma(d, q_j, m)`, q_j as Q5_0 |
/// | Q4_K | 256 | 144 | `fma(d * sc_s, q_j, -(dmin * m_s))`, s = j / 32, 6-bit sc/m packed in scales[12] |
/// | Q5_K | 256 | 176 | as Q4_K with q_j = nibble + 16 * high bit from qh |
/// | Q6_K | 256 | 210 | `(d * sc_s) * (q_j - 32)`, s = j / 16, 8-bit signed sc, q_j 6 bits (4 in ql, 2 in qh) |
/// | Q2_K | 256 | 84 | `fma(d * sc_s, q_j, -(dmin * m_s))`, s = j / 16, 4-bit sc (low) and m (high nibble) of scales[s], q_j 2 bits |
/// | Q3_K | 256 | 110 | `(d * (sc_s - 32)) * (q_j - 4)`, s = j / 16, 6-bit sc packed in scales[12], q_j 2 bits + a high bit in hmask |
/// | IQ4_NL | 32 | 18 | `d * kvalues_iq4nl[q_j]`, q_j a nibble as Q4_0 |
/// | IQ4_XS | 256 | 136 | `(d * (ls_s - 32)) * kvalues_iq4nl[q_j]`, s = j / 32, 6-bit ls (4 in scales_l, 2 in scales_h), nibbles as IQ4_NL per 32 |
/// | MXFP4 | 32 | 17 | `d * kvalues_mxfp4[q_j]`, d = 2^(e - 128) from the E8M0 byte e (255, NaN, is refused), nibbles as Q4_0 |
///
/// K-quant nibble order: a super-block is 4 chunks of 64 values; chunk c
/// takes qs[32c .. 32c + 31], low nibbles for values 64c + 0..31, high
/// nibbles for 64c + 32..63 (Q5_K: the high bit of value 64c + i is bit 2c of
/// qh[i] for i < 32, bit 2c + 1 of qh[i - 32] for the rest). Q6_K: 2 halves
/// of 128; in half h, value 128h + 32r + l (r = 0..3, l = 0..31) has low 4
/// bits from ql[64h + l + 32 * (r % 2)] (low nibble for r < 2, high for r >= 2)
/// and high 2 bits at bit 2r of qh[32h + l].
///
/// Q2_K / Q3_K crumb order: 2 halves of 128; in half h, value 128h + 32r + l
/// (r = 0..3, l = 0..31) is bits 2r..2r+1 of qs[32h + l]; Q3_K's q_j adds
/// 4 times bit 4h + r of hmask[l] to them. Q3_K's scale s has its low 4 bits in
/// scales[s] (s < 8, low nibble) or scales[s - 8] (high nibble) and its high
/// 2 bits at bit 2 (s / 4) of scales[8 + s % 4].
/// The encoders (`quantize_block`) round to nearest with ggml's reference
/// scale rules for the 32-value types (Q4_0/Q5_0: d = the signed value of
/// largest magnitude / -8 or -16; Q4_1/Q5_1: d = (max - min) / 15 or 31,
/// m = min). For the K-quants they use a direct rule (each sub-block's
/// range, then its scale and min rounded to 6 or 8 bits against the
/// super-block's largest) rather than ggml's iterative search: files they
/// write are valid and decode exactly as above, with slightly larger
/// rounding error than llama-quantize's. Q2_K and Q3_K take the same kind of
/// direct rule per sub-block of 16; IQ4_NL / IQ4_XS scale each 32 values so
/// that the value of largest magnitude lands on the table's -127 and pick
/// the nearest table entry for each value. MXFP4 follows ggml's reference
/// encoder: e = floor(log2(amax)) - 2 + 127 (clamped to the byte's finite
/// range), then the nearest table entry.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/simd/detail/intrinsics.hpp"

namespace llmkit::model {

/// Values per K-quant super-block.
inline constexpr std::size_t qk_k = 256;

/// Q4_0: 32 values, one f16 scale, 4-bit values offset by 8.
struct block_q4_0 {
  f16 d;
  std::uint8_t qs[16];
};
/// Q4_1: 32 values, f16 scale and minimum, 4-bit values.
struct block_q4_1 {
  f16 d, m;
  std::uint8_t qs[16];
};
/// Q5_0: 32 values, one f16 scale, 5-bit values offset by 16 (fifth bits in qh).
struct block_q5_0 {
  f16 d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// Q5_1: 32 values, f16 scale and minimum, 5-bit values.
struct block_q5_1 {
  f16 d, m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// Q4_K: 256 values in 8 sub-blocks of 32 with 6-bit scales and mins.
struct block_q4_k {
  f16 d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[qk_k / 2];
};
/// Q5_K: Q4_K plus a fifth bit per value.
struct block_q5_k {
  f16 d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[qk_k / 8];
  std::uint8_t qs[qk_k / 2];
};
/// Q6_K: 256 values in 16 sub-blocks of 16 with int8 scales, 6-bit values offset by 32.
struct block_q6_k {
  std::uint8_t ql[qk_k / 2];
  std::uint8_t qh[qk_k / 4];
  std::int8_t scales[qk_k / 16];
  f16 d;
};
/// Q2_K: 256 values in 16 sub-blocks of 16 with 4-bit scales and mins, 2-bit values.
struct block_q2_k {
  std::uint8_t scales[qk_k / 16];
  std::uint8_t qs[qk_k / 4];
  f16 d, dmin;
};
/// Q3_K: 256 values in 16 sub-blocks of 16 with 6-bit scales offset by 32,
/// 3-bit values offset by 4 (the third bits in hmask).
struct block_q3_k {
  std::uint8_t hmask[qk_k / 8];
  std::uint8_t qs[qk_k / 4];
  std::uint8_t scales[12];
  f16 d;
};
/// IQ4_NL: 32 values, one f16 scale, 4-bit indices into kvalues_iq4nl.
struct block_iq4_nl {
  f16 d;
  std::uint8_t qs[16];
};
/// IQ4_XS: 256 values in 8 sub-blocks of 32 with 6-bit scales offset by
/// 32, 4-bit indices into kvalues_iq4nl.
struct block_iq4_xs {
  f16 d;
  std::uint16_t scales_h;
  std::uint8_t scales_l[qk_k / 64];
  std::uint8_t qs[qk_k / 2];
};
/// An E8M0 scale byte: the power of two 2^(bits - 127) of OCP's
/// microscaling formats (bits 255 is NaN).
struct e8m0 {
  std::uint8_t bits;
};
/// MXFP4: 32 FP4 (E2M1) values, indices into kvalues_mxfp4, and one E8M0
/// scale. Named `d` like the other formats' scales so the block kernels
/// read it through the same `scale_f32`.
struct block_mxfp4 {
  e8m0 d;
  std::uint8_t qs[16];
};
/// The 16 E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)
/// doubled to integers, as ggml's kvalues_mxfp4; the block scale is halved
/// to match (2^(e - 128)).
inline constexpr std::int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/// The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr std::int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
static_assert(sizeof(block_q2_k) == 84 && sizeof(block_q3_k) == 110 && sizeof(block_iq4_nl) == 18 &&
                  sizeof(block_iq4_xs) == 136 && sizeof(block_mxfp4) == 17,
              "block layouts must match GGUF");
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
                  sizeof(block_q5_1) == 24 && sizeof(block_q4_k) == 144 && sizeof(block_q5_k) == 176 &&
                  sizeof(block_q6_k) == 210,
              "block layouts must match GGUF");

/// Values per block of each format.
template <class Block>
inline constexpr std::size_t block_values = qk_k;
template <>
inline constexpr std::size_t block_values<block_q4_0> = 32;
template <>
inline constexpr std::size_t block_values<block_q4_1> = 32;
template <>
inline constexpr std::size_t block_values<block_q5_0> = 32;
template <>
inline constexpr std::size_t block_values<block_q5_1> = 32;
template <>
inline constexpr std::size_t block_values<block_q8_0> = q8_block_size;
template <>
inline constexpr std::size_t block_values<block_iq4_nl> = 32;
template <>
inline constexpr std::size_t block_values<block_mxfp4> = 32;

/// Sub-block s (0..7) scale and min of a Q4_K / Q5_K block: 6 bits each,
/// s < 4 in the low 6 bits of scales[s] and scales[s + 4], the others split
/// between a nibble of scales[s + 4] and the top 2 bits of scales[s - 4] /
/// scales[s].
constexpr void k_scale_min(const std::uint8_t (&scales)[12], std::size_t s, std::uint8_t& sc, std::uint8_t& m) noexcept {
  if (s < 4) {
    sc = scales[s] & 63;
    m = scales[s + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

/// Sub-block s (0..15) scale of a Q3_K block, 0..63 (the value's scale is
/// d * (sc - 32)): low 4 bits from a nibble of scales[s % 8], high 2 bits
/// from scales[8 + s % 4].
constexpr std::uint8_t q3_k_scale(const std::uint8_t (&scales)[12], std::size_t s) noexcept {
  const unsigned low = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
  const unsigned high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return static_cast<std::uint8_t>(low | (high << 4));
}

/// Sub-block s (0..7) scale of an IQ4_XS block, 0..63 (the value's scale
/// is d * (ls - 32)).
constexpr std::uint8_t iq4_xs_scale(const block_iq4_xs& b, std::size_t s) noexcept {
  const unsigned low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
  const unsigned high = (b.scales_h >> (2 * s)) & 3;
  return static_cast<std::uint8_t>(low | (high << 4));
}

namespace detail {
/// A block's f16 scale as f32: the F16C instruction where the target has it
/// (the same value as to_f32 for every finite scale and infinity).
inline float scale_f32(f16 h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return to_f32(h);
#endif
}
/// An MXFP4 block's scale as f32: 2^(bits - 128), the E8M0 value halved
/// for kvalues_mxfp4's doubled levels (bits 0 and 1 are subnormal). Exact.
constexpr float scale_f32(e8m0 e) noexcept {
  return e.bits < 2 ? std::bit_cast<float>(std::uint32_t{0x00200000u} << e.bits)
                    : std::bit_cast<float>(std::uint32_t(e.bits - 1) << 23);
}
}  // namespace detail

/// Decodes one block. ([block_values<Block>] out)
inline void dequantize_block(const block_q8_0& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.scale);
  for (std::size_t j = 0; j < 32; ++j) out[j] = d * float(b.qs[j]);
}
// The 32-value formats decode their low and high nibbles in two loops of
// 16 contiguous outputs each, which the compiler turns into vector code.
inline void dequantize_block(const block_q4_0& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  for (std::size_t j = 0; j < 16; ++j) out[j] = d * float(int(b.qs[j] & 0xF) - 8);
  for (std::size_t j = 0; j < 16; ++j) out[j + 16] = d * float(int(b.qs[j] >> 4) - 8);
}
inline void dequantize_block(const block_q4_1& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d), m = detail::scale_f32(b.m);
  for (std::size_t j = 0; j < 16; ++j) out[j] = std::fma(d, float(b.qs[j] & 0xF), m);
  for (std::size_t j = 0; j < 16; ++j) out[j + 16] = std::fma(d, float(b.qs[j] >> 4), m);
}
inline void dequantize_block(const block_q5_0& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (std::size_t j = 0; j < 16; ++j) out[j] = d * float(int((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
  for (std::size_t j = 0; j < 16; ++j)
    out[j + 16] = d * float(int((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
}
inline void dequantize_block(const block_q5_1& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d), m = detail::scale_f32(b.m);
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (std::size_t j = 0; j < 16; ++j) out[j] = std::fma(d, float((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)), m);
  for (std::size_t j = 0; j < 16; ++j)
    out[j + 16] = std::fma(d, float((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)), m);
}
namespace detail {
/// Q4_K and Q5_K: 4 chunks of 64 values, each with two sub-block scales and
/// mins; Q5_K (qh not null) adds each value's fifth bit from qh.
inline void dequantize_k_affine(f16 d_bits, f16 dmin_bits, const std::uint8_t (&scales)[12], const std::uint8_t* qs,
                                const std::uint8_t* qh, float* __restrict out) noexcept {
  const float d = scale_f32(d_bits), dmin = scale_f32(dmin_bits);
  for (std::size_t c = 0; c < 4; ++c) {
    std::uint8_t sc0, m0, sc1, m1;
    k_scale_min(scales, 2 * c, sc0, m0);
    k_scale_min(scales, 2 * c + 1, sc1, m1);
    const float d0 = d * float(sc0), n0 = -(dmin * float(m0)), d1 = d * float(sc1), n1 = -(dmin * float(m1));
    for (std::size_t l = 0; l < 32; ++l) {
      const int lo = (qs[32 * c + l] & 0xF) | (qh ? ((qh[l] >> (2 * c)) & 1) << 4 : 0);
      const int hi = (qs[32 * c + l] >> 4) | (qh ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0);
      out[64 * c + l] = std::fma(d0, float(lo), n0);
      out[64 * c + 32 + l] = std::fma(d1, float(hi), n1);
    }
  }
}
}  // namespace detail
inline void dequantize_block(const block_q4_k& b, float* __restrict out) noexcept {
  detail::dequantize_k_affine(b.d, b.dmin, b.scales, b.qs, nullptr, out);
}
inline void dequantize_block(const block_q5_k& b, float* __restrict out) noexcept {
  detail::dequantize_k_affine(b.d, b.dmin, b.scales, b.qs, b.qh, out);
}
inline void dequantize_block(const block_q6_k& b, float* __restrict out) noexcept {
  // Loops of 16 values with one scale each, so that they vectorise.
  const float d = detail::scale_f32(b.d);
  for (std::size_t h = 0; h < 2; ++h) {
    const std::uint8_t* ql = b.ql + 64 * h;
    const std::uint8_t* qh = b.qh + 32 * h;
    const std::int8_t* sc = b.scales + 8 * h;
    float* y = out + 128 * h;
    for (std::size_t g = 0; g < 2; ++g) {
      const float s0 = d * float(sc[g]), s1 = d * float(sc[g + 2]), s2 = d * float(sc[g + 4]), s3 = d * float(sc[g + 6]);
      for (std::size_t l = 16 * g; l < 16 * g + 16; ++l) {
        y[l] = s0 * float(int((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
        y[l + 32] = s1 * float(int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        y[l + 64] = s2 * float(int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        y[l + 96] = s3 * float(int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
  }
}
// Q2_K and Q3_K: loops of 16 values with one scale each (sub-block 8h + 2r
// + g for values 128h + 32r + 16g + 0..15), so that they vectorise.
inline void dequantize_block(const block_q2_k& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d), dmin = detail::scale_f32(b.dmin);
  for (std::size_t s = 0; s < 16; ++s) {
    const std::size_t h = s / 8, r = (s % 8) / 2, first = 16 * (s % 2);
    const float ds = d * float(b.scales[s] & 0xF), ms = -(dmin * float(b.scales[s] >> 4));
    const std::uint8_t* q = b.qs + 32 * h + first;
    float* y = out + 128 * h + 32 * r + first;
    for (std::size_t l = 0; l < 16; ++l) y[l] = std::fma(ds, float((q[l] >> (2 * r)) & 3), ms);
  }
}
inline void dequantize_block(const block_q3_k& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  for (std::size_t s = 0; s < 16; ++s) {
    const std::size_t h = s / 8, r = (s % 8) / 2, first = 16 * (s % 2);
    const float ds = d * float(int(q3_k_scale(b.scales, s)) - 32);
    const std::uint8_t* q = b.qs + 32 * h + first;
    const std::uint8_t* hm = b.hmask + first;
    float* y = out + 128 * h + 32 * r + first;
    for (std::size_t l = 0; l < 16; ++l)
      y[l] = ds * float(int((q[l] >> (2 * r)) & 3) - ((hm[l] >> (4 * h + r)) & 1 ? 0 : 4));
  }
}
inline void dequantize_block(const block_iq4_nl& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  for (std::size_t j = 0; j < 16; ++j) out[j] = d * float(kvalues_iq4nl[b.qs[j] & 0xF]);
  for (std::size_t j = 0; j < 16; ++j) out[j + 16] = d * float(kvalues_iq4nl[b.qs[j] >> 4]);
}
inline void dequantize_block(const block_mxfp4& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  for (std::size_t j = 0; j < 16; ++j) out[j] = d * float(kvalues_mxfp4[b.qs[j] & 0xF]);
  for (std::size_t j = 0; j < 16; ++j) out[j + 16] = d * float(kvalues_mxfp4[b.qs[j] >> 4]);
}
inline void dequantize_block(const block_iq4_xs& b, float* __restrict out) noexcept {
  const float d = detail::scale_f32(b.d);
  for (std::size_t s = 0; s < 8; ++s) {
    const float ds = d * float(int(iq4_xs_scale(b, s)) - 32);
    const std::uint8_t* q = b.qs + 16 * s;
    float* y = out + 32 * s;
    for (std::size_t j = 0; j < 16; ++j) y[j] = ds * float(kvalues_iq4nl[q[j] & 0xF]);
    for (std::size_t j = 0; j < 16; ++j) y[j + 16] = ds * float(kvalues_iq4nl[q[j] >> 4]);
  }
}

namespace detail {
/// Rounds to the nearest integer in [lo, hi] (ties away from zero).
inline int round_clamp(float v, int lo, int hi) noexcept {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}
/// The signed value of largest magnitude (the first on ties).
inline float signed_amax(const float* x, std::size_t n) noexcept {
  // The magnitude is kept beside the value: clang 19.1 at -O3 with SSE4.2 or
  // later mis-selects when fabs(best) is recomputed from `best` in the
  // compare (tests/test_model_quants.cpp's Q4_0 rounding bound caught it).
  float best = 0.0f, best_magnitude = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float magnitude = std::fabs(x[i]);
    if (magnitude > best_magnitude) {
      best_magnitude = magnitude;
      best = x[i];
    }
  }
  return best;
}
/// 4- or 5-bit symmetric block (Q4_0, Q5_0): d = amax / -half, q = round(x / d) + half.
inline void quantize_symmetric(const float* x, int half, f16& d_out, int* q) noexcept {
  const float max = signed_amax(x, 32);
  const float d = max / float(-half), id = d != 0.0f ? 1.0f / d : 0.0f;
  d_out = f16{f32_to_f16_bits(d)};
  for (std::size_t j = 0; j < 32; ++j) q[j] = round_clamp(x[j] * id + float(half), 0, 2 * half - 1);
}
/// 4- or 5-bit block with a minimum (Q4_1, Q5_1): d = (max - min) / levels, q = round((x - min) / d).
inline void quantize_affine(const float* x, int levels, f16& d_out, f16& m_out, int* q) noexcept {
  const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
  const float d = (hi - lo) / float(levels), id = d != 0.0f ? 1.0f / d : 0.0f;
  d_out = f16{f32_to_f16_bits(d)};
  m_out = f16{f32_to_f16_bits(lo)};
  for (std::size_t j = 0; j < 32; ++j) q[j] = round_clamp((x[j] - lo) * id, 0, levels);
}
/// 32 five-bit values into Q5_0 / Q5_1's nibbles and 32 fifth bits.
inline void pack_5bit(const int (&q)[32], std::uint8_t (&qs)[16], std::uint8_t (&qh_out)[4]) noexcept {
  std::uint32_t qh = 0;
  for (std::size_t j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= std::uint32_t(q[j] >> 4) << j;
    qh |= std::uint32_t(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}
/// The 6-bit scales and mins of 8 sub-blocks packed as k_scale_min reads them.
inline void pack_k_scales(const std::uint8_t (&sc)[8], const std::uint8_t (&m)[8], std::uint8_t (&out)[12]) noexcept {
  for (std::size_t s = 0; s < 4; ++s) {
    out[s] = static_cast<std::uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    out[s + 4] = static_cast<std::uint8_t>((m[s] & 63) | ((m[s + 4] >> 4) << 6));
    out[s + 8] = static_cast<std::uint8_t>((sc[s + 4] & 0xF) | ((m[s + 4] & 0xF) << 4));
  }
}
/// Q4_K / Q5_K: per sub-block of 32 the range [min(0, lo), hi] over `levels`,
/// then the scales and mins in 6 bits against the largest of each.
inline void quantize_k_affine(const float* x, int levels, f16& d_out, f16& dmin_out, std::uint8_t (&scales)[12],
                              int* q) noexcept {
  float scale[8], minv[8];
  for (std::size_t s = 0; s < 8; ++s) {
    const float* xs = x + 32 * s;
    const float lo = std::min(0.0f, *std::min_element(xs, xs + 32)), hi = *std::max_element(xs, xs + 32);
    scale[s] = (hi - lo) / float(levels);
    minv[s] = -lo;
  }
  const float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(minv, minv + 8);
  const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  d_out = f16{f32_to_f16_bits(d)};
  dmin_out = f16{f32_to_f16_bits(dmin)};
  const float dd = to_f32(d_out), dm = to_f32(dmin_out);
  std::uint8_t sc[8], m[8];
  for (std::size_t s = 0; s < 8; ++s) {
    sc[s] = static_cast<std::uint8_t>(dd != 0.0f ? round_clamp(scale[s] / dd, 0, 63) : 0);
    m[s] = static_cast<std::uint8_t>(dm != 0.0f ? round_clamp(minv[s] / dm, 0, 63) : 0);
  }
  pack_k_scales(sc, m, scales);
  for (std::size_t s = 0; s < 8; ++s) {
    const float ds = dd * float(sc[s]), ms = dm * float(m[s]);
    for (std::size_t l = 0; l < 32; ++l)
      q[32 * s + l] = ds != 0.0f ? round_clamp((x[32 * s + l] + ms) / ds, 0, levels) : 0;
  }
}
/// The index of the kvalues_iq4nl level nearest to v (the lower on ties).
inline std::uint8_t nearest_iq4nl(float v) noexcept {
  std::size_t best = 0;
  for (std::size_t i = 1; i < 16; ++i)
    if (std::fabs(v - float(kvalues_iq4nl[i])) < std::fabs(v - float(kvalues_iq4nl[best]))) best = i;
  return static_cast<std::uint8_t>(best);
}
/// 32 values with scale d into IQ4_NL nibbles (low nibbles j = 0..15, high 16..31).
inline void quantize_iq4_32(const float* x, float d, std::uint8_t* qs) noexcept {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::uint8_t q[32];
  for (std::size_t j = 0; j < 32; ++j) q[j] = nearest_iq4nl(x[j] * id);
  for (std::size_t j = 0; j < 16; ++j) qs[j] = static_cast<std::uint8_t>(q[j] | (q[j + 16] << 4));
}
/// Q2_K / Q3_K crumb j (0..255, 2 bits) into qs in the crumb order of the file comment.
inline void put_crumb(std::uint8_t* qs, std::size_t j, int q) noexcept {
  const std::size_t h = j / 128, r = (j % 128) / 32, l = j % 32;
  qs[32 * h + l] = static_cast<std::uint8_t>(qs[32 * h + l] | ((q & 3) << (2 * r)));
}
}  // namespace detail

/// Encodes 32 (or 256 for the K-quants) values, rounding to nearest (see
/// the file comment for the scale rules). ([block_values<Block>] x)
inline void quantize_block(const float* x, block_q4_0& b) noexcept {
  int q[32];
  detail::quantize_symmetric(x, 8, b.d, q);
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(q[j] | (q[j + 16] << 4));
}
inline void quantize_block(const float* x, block_q4_1& b) noexcept {
  int q[32];
  detail::quantize_affine(x, 15, b.d, b.m, q);
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(q[j] | (q[j + 16] << 4));
}
inline void quantize_block(const float* x, block_q5_0& b) noexcept {
  int q[32];
  detail::quantize_symmetric(x, 16, b.d, q);
  detail::pack_5bit(q, b.qs, b.qh);
}
inline void quantize_block(const float* x, block_q5_1& b) noexcept {
  int q[32];
  detail::quantize_affine(x, 31, b.d, b.m, q);
  detail::pack_5bit(q, b.qs, b.qh);
}
inline void quantize_block(const float* x, block_q4_k& b) noexcept {
  int q[qk_k];
  detail::quantize_k_affine(x, 15, b.d, b.dmin, b.scales, q);
  for (std::size_t c = 0; c < 4; ++c)
    for (std::size_t l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<std::uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}
inline void quantize_block(const float* x, block_q5_k& b) noexcept {
  int q[qk_k];
  detail::quantize_k_affine(x, 31, b.d, b.dmin, b.scales, q);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (std::size_t c = 0; c < 4; ++c)
    for (std::size_t l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b.qs[32 * c + l] = static_cast<std::uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      b.qh[l] = static_cast<std::uint8_t>(b.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}
inline void quantize_block(const float* x, block_q6_k& b) noexcept {
  // Per sub-block of 16: scale = signed amax / -32; the scales in int8
  // against the largest magnitude (d = max / -128).
  float scale[16];
  for (std::size_t s = 0; s < 16; ++s) scale[s] = detail::signed_amax(x + 16 * s, 16) / -32.0f;
  const float max_scale = detail::signed_amax(scale, 16);
  const float d = max_scale / -128.0f;
  b.d = f16{f32_to_f16_bits(d)};
  const float dd = to_f32(b.d);
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (std::size_t s = 0; s < 16; ++s)
    b.scales[s] = static_cast<std::int8_t>(dd != 0.0f ? detail::round_clamp(scale[s] / dd, -128, 127) : 0);
  for (std::size_t j = 0; j < qk_k; ++j) {
    const float ds = dd * float(b.scales[j / 16]);
    const int q = (ds != 0.0f ? detail::round_clamp(x[j] / ds, -32, 31) : 0) + 32;
    const std::size_t h = j / 128, r = (j % 128) / 32, l = j % 32;
    std::uint8_t& low = b.ql[64 * h + l + 32 * (r % 2)];
    low = static_cast<std::uint8_t>(low | (r < 2 ? (q & 0xF) : (q & 0xF) << 4));
    b.qh[32 * h + l] = static_cast<std::uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * r)));
  }
}
inline void quantize_block(const float* x, block_q2_k& b) noexcept {
  // Per sub-block of 16: the range [min(0, lo), hi] over 3 steps; scales
  // and mins in 4 bits against the largest of each (as quantize_k_affine).
  float scale[16], minv[16];
  for (std::size_t s = 0; s < 16; ++s) {
    const float* xs = x + 16 * s;
    const float lo = std::min(0.0f, *std::min_element(xs, xs + 16)), hi = *std::max_element(xs, xs + 16);
    scale[s] = (hi - lo) / 3.0f;
    minv[s] = -lo;
  }
  b.d = f16{f32_to_f16_bits(*std::max_element(scale, scale + 16) / 15.0f)};
  b.dmin = f16{f32_to_f16_bits(*std::max_element(minv, minv + 16) / 15.0f)};
  const float dd = to_f32(b.d), dm = to_f32(b.dmin);
  std::memset(b.qs, 0, sizeof(b.qs));
  for (std::size_t s = 0; s < 16; ++s) {
    const int sc = dd != 0.0f ? detail::round_clamp(scale[s] / dd, 0, 15) : 0;
    const int m = dm != 0.0f ? detail::round_clamp(minv[s] / dm, 0, 15) : 0;
    b.scales[s] = static_cast<std::uint8_t>(sc | (m << 4));
    const float ds = dd * float(sc), ms = dm * float(m);
    for (std::size_t l = 0; l < 16; ++l)
      detail::put_crumb(b.qs, 16 * s + l, ds != 0.0f ? detail::round_clamp((x[16 * s + l] + ms) / ds, 0, 3) : 0);
  }
}
inline void quantize_block(const float* x, block_q3_k& b) noexcept {
  // Per sub-block of 16: scale = signed amax / -4; the scales in 6 bits
  // against the largest magnitude (d = max / -32), as Q6_K does in 8.
  float scale[16];
  for (std::size_t s = 0; s < 16; ++s) scale[s] = detail::signed_amax(x + 16 * s, 16) / -4.0f;
  b.d = f16{f32_to_f16_bits(detail::signed_amax(scale, 16) / -32.0f)};
  const float dd = to_f32(b.d);
  std::memset(b.hmask, 0, sizeof(b.hmask));
  std::memset(b.qs, 0, sizeof(b.qs));
  std::memset(b.scales, 0, sizeof(b.scales));
  for (std::size_t s = 0; s < 16; ++s) {
    const int sc = dd != 0.0f ? detail::round_clamp(scale[s] / dd, -32, 31) : 0;
    const unsigned u = unsigned(sc + 32);
    b.scales[s % 8] = static_cast<std::uint8_t>(b.scales[s % 8] | ((u & 0xF) << (s < 8 ? 0 : 4)));
    b.scales[8 + s % 4] = static_cast<std::uint8_t>(b.scales[8 + s % 4] | ((u >> 4) << (2 * (s / 4))));
    const float ds = dd * float(sc);
    for (std::size_t l = 0; l < 16; ++l) {
      const std::size_t j = 16 * s + l;
      const int q = (ds != 0.0f ? detail::round_clamp(x[j] / ds, -4, 3) : 0) + 4;
      detail::put_crumb(b.qs, j, q);
      const std::size_t h = j / 128, r = (j % 128) / 32;
      b.hmask[j % 32] = static_cast<std::uint8_t>(b.hmask[j % 32] | ((q >> 2) << (4 * h + r)));
    }
  }
}
inline void quantize_block(const float* x, block_iq4_nl& b) noexcept {
  b.d = f16{f32_to_f16_bits(detail::signed_amax(x, 32) / float(kvalues_iq4nl[0]))};
  detail::quantize_iq4_32(x, to_f32(b.d), b.qs);
}
inline void quantize_block(const float* x, block_iq4_xs& b) noexcept {
  // Per sub-block of 32: scale = signed amax / -127; the scales in 6 bits
  // against the largest magnitude (d = max / -32).
  float scale[8];
  for (std::size_t s = 0; s < 8; ++s) scale[s] = detail::signed_amax(x + 32 * s, 32) / float(kvalues_iq4nl[0]);
  b.d = f16{f32_to_f16_bits(detail::signed_amax(scale, 8) / -32.0f)};
  const float dd = to_f32(b.d);
  b.scales_h = 0;
  std::memset(b.scales_l, 0, sizeof(b.scales_l));
  for (std::size_t s = 0; s < 8; ++s) {
    const int ls = dd != 0.0f ? detail::round_clamp(scale[s] / dd, -32, 31) : 0;
    const unsigned u = unsigned(ls + 32);
    b.scales_l[s / 2] = static_cast<std::uint8_t>(b.scales_l[s / 2] | ((u & 0xF) << (4 * (s % 2))));
    b.scales_h = static_cast<std::uint16_t>(b.scales_h | ((u >> 4) << (2 * s)));
    detail::quantize_iq4_32(x + 32 * s, dd * float(ls), b.qs + 16 * s);
  }
}
inline void quantize_block(const float* x, block_mxfp4& b) noexcept {
  float amax = 0.0f;
  for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  // ggml's reference rule: amax / d lands in [8, 16), by the table's top
  // levels 8 and 12 (magnitudes above 12 d clip to it).
  const int e = amax > 0.0f && std::isfinite(amax) ? int(std::floor(std::log2(amax))) - 2 + 127 : 0;
  b.d = e8m0{static_cast<std::uint8_t>(std::clamp(e, 0, 254))};
  const float d = detail::scale_f32(b.d);
  auto nearest = [d](float v) {
    int best = 0;
    float best_err = std::fabs(float(kvalues_mxfp4[0]) * d - v);
    for (int i = 1; i < 16; ++i) {
      const float err = std::fabs(float(kvalues_mxfp4[i]) * d - v);
      if (err < best_err) best = i, best_err = err;
    }
    return best;
  };
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(nearest(x[j]) | (nearest(x[j + 16]) << 4));
}
inline void quantize_block(const float* x, block_q8_0& b) noexcept {
  float amax = 0.0f;
  for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  b.scale = f16{f32_to_f16_bits(d)};
  for (std::size_t j = 0; j < 32; ++j) b.qs[j] = static_cast<std::int8_t>(detail::round_clamp(x[j] * id, -127, 127));
}

/// Calls fn(Block{}) with the block struct of a quantised type (Q8_0
/// included). @pre is_quantized(t)
template <class Fn>
decltype(auto) visit_block(ggml_type t, Fn&& fn) {
  switch (t) {
    case ggml_type::q4_0: return fn(block_q4_0{});
    case ggml_type::q4_1: return fn(block_q4_1{});
    case ggml_type::q5_0: return fn(block_q5_0{});
    case ggml_type::q5_1: return fn(block_q5_1{});
    case ggml_type::q4_k: return fn(block_q4_k{});
    case ggml_type::q5_k: return fn(block_q5_k{});
    case ggml_type::q6_k: return fn(block_q6_k{});
    case ggml_type::q2_k: return fn(block_q2_k{});
    case ggml_type::q3_k: return fn(block_q3_k{});
    case ggml_type::iq4_nl: return fn(block_iq4_nl{});
    case ggml_type::iq4_xs: return fn(block_iq4_xs{});
    case ggml_type::mxfp4: return fn(block_mxfp4{});
    default: return fn(block_q8_0{});
  }
}

/// True when the scales of the block of quantised type t at p (the f16 d,
/// and m / dmin where the format has one; MXFP4's E8M0 byte) are finite.
inline bool block_scales_finite(ggml_type t, const std::byte* p) noexcept {
  auto finite_at = [p](std::size_t at) {
    std::uint16_t b;
    std::memcpy(&b, p + at, 2);
    return (b & 0x7C00u) != 0x7C00u;
  };
  switch (t) {
    case ggml_type::q4_1: case ggml_type::q5_1: case ggml_type::q4_k: case ggml_type::q5_k:
      return finite_at(0) && finite_at(2);
    case ggml_type::q6_k: return finite_at(offsetof(block_q6_k, d));
    case ggml_type::q2_k: return finite_at(offsetof(block_q2_k, d)) && finite_at(offsetof(block_q2_k, dmin));
    case ggml_type::q3_k: return finite_at(offsetof(block_q3_k, d));
    case ggml_type::mxfp4: return std::to_integer<unsigned>(p[0]) != 255u;
    default: return finite_at(0);
  }
}

/// Decodes `n` values stored as `type` at p (a whole number of blocks;
/// F32, F16 and BF16 too) into `[n] out`.
void dequantize_row(ggml_type type, const std::byte* p, float* out, std::size_t n);

/// Encodes `[n] x` as `type` into `out` (n / block values * block bytes
/// bytes; F32, F16 and BF16 round to nearest even).
void quantize_row(ggml_type type, const float* x, std::byte* out, std::size_t n);

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/quants.ipp"
#endif
