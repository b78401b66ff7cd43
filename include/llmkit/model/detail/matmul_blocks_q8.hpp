// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_blocks_q8.hpp
/// Y = X * W^T (or Y += X * W^T) for W [out, in] in one of ggml's quantised
/// block formats (model/quants.hpp) with the activations X [n, in] rounded
/// to int8 (q8_activations): the integer products ggml runs for its 4-, 5-
/// and 6-bit formats.
///
/// Every format has an integer form: value j of a row is
///
///     w_j = s_l * (u_j - offset) - m_b,   l = j / 4, b = j / 32
///
/// with u_j an unsigned integer of 3 to 6 bits (IQ4_NL / IQ4_XS: their
/// non-linear level + 128, 8 bits), s_l the scale of the four
/// values of lane l (Q6_K has one per 16 values, Q4_K and Q5_K one per 32,
/// the 32-value formats their block scale; Q3_K one per 16), a per-format
/// offset (8, 16, 32, 4, 128 or 0) and a per-32-value minimum m_b (Q4_1, Q5_1, Q4_K, Q5_K; 0 for the
/// others). With x_j = d_b * q_j (q_j int8, d_b the activation block's
/// scale) the dot product of a row is
///
///     sum_l s_l * d_b * (sum_{j in l} u_j * q_j - offset * sum_{j in l} q_j)
///       - sum_b m_b * d_b * sum_{j in b} q_j
///
/// where each lane's bracket is exact in int32: one VPDPBUSD (unsigned u
/// times signed q, 64 values per instruction) started from the
/// activations' precomputed -offset * sum q (q8_activations::assign_sums).
/// The product differs from the exact one (matmul_blocks.hpp) only by the
/// activations' rounding, at most d_b / 2 per value.
///
/// This file holds the portable form: W decoded a strip of rows at a time
/// into the integer form (u as bytes, s per lane, m per block) in a
/// per-thread buffer, then a scalar loop over the lanes, each output summed
/// in one fixed order (so batch and thread invariant). With AVX-512 VNNI
/// every format runs a kernel that decodes in registers instead
/// (matmul_blocks32_vnni.hpp, matmul_kquants_vnni.hpp); the K-quants then
/// take activations per 256 values (q8_activations::assign_k), and so does
/// this form for them, with d_b the super-block's scale.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/model/detail/matmul.hpp"
#include "llmkit/model/detail/matmul_blocks.hpp"
#include "llmkit/model/detail/matmul_q8.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/model/tuning.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// The integer form of a block format: `decode(block, u, s, m)` writes
/// `[values] u`, `[values / 4] s` and (formats with minimums) `[values / 32] m`.
template <class Block>
struct int8_form;

/// Whether a block format has an int8-activation product here (an
/// int8_form): every block format but Q8_0 (which has matmul_q8.hpp).
template <class Block>
inline constexpr bool has_int8_product = requires { int8_form<Block>::offset; };

/// Q5_0 / Q5_1's values: nibble + 16 * bit j of qh.
inline void decode_5bit(const std::uint8_t (&qs)[16], const std::uint8_t (&qh_bytes)[4], std::uint8_t* __restrict u) noexcept {
  std::uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (std::size_t j = 0; j < 16; ++j) u[j] = static_cast<std::uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
  for (std::size_t j = 0; j < 16; ++j) u[j + 16] = static_cast<std::uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
}

/// The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1).
template <class Block>
inline constexpr bool is_block32 = std::is_same_v<Block, block_q4_0> || std::is_same_v<Block, block_q4_1> ||
                                   std::is_same_v<Block, block_q5_0> || std::is_same_v<Block, block_q5_1>;

/// The 32-value formats Q4_0, Q4_1, Q5_0, Q5_1: 4-bit values (plus a fifth
/// bit from qh in Q5), one scale d per block, and in the _1 formats a
/// minimum m instead of the offset (8 for Q4_0, 16 for Q5_0).
template <class Block>
  requires is_block32<Block>
struct int8_form<Block> {
  static constexpr bool has_mins = requires(const Block& b) { b.m; };
  static constexpr bool has_fifth_bit = requires(const Block& b) { b.qh; };
  static constexpr int offset = has_mins ? 0 : has_fifth_bit ? 16 : 8;
  static void decode(const Block& b, std::uint8_t* __restrict u, float* __restrict s, float* m) noexcept {
    if constexpr (has_fifth_bit) {
      decode_5bit(b.qs, b.qh, u);
    } else {
      for (std::size_t j = 0; j < 16; ++j) u[j] = b.qs[j] & 0xF;
      for (std::size_t j = 0; j < 16; ++j) u[j + 16] = b.qs[j] >> 4;
    }
    std::fill_n(s, 8, scale_f32(b.d));
    if constexpr (has_mins) m[0] = -scale_f32(b.m);
  }
};

/// Q4_K / Q5_K (qh not null): sub-block s has scale d * sc_s and minimum
/// dmin * m_s.
inline void decode_k_affine(f16 d_bits, f16 dmin_bits, const std::uint8_t (&scales)[12], const std::uint8_t* qs,
                            const std::uint8_t* qh, std::uint8_t* __restrict u, float* __restrict s,
                            float* __restrict m) noexcept {
  const float d = scale_f32(d_bits), dmin = scale_f32(dmin_bits);
  for (std::size_t c = 0; c < 4; ++c) {
    std::uint8_t sc0, m0, sc1, m1;
    k_scale_min(scales, 2 * c, sc0, m0);
    k_scale_min(scales, 2 * c + 1, sc1, m1);
    std::fill_n(s + 16 * c, 8, d * float(sc0));
    std::fill_n(s + 16 * c + 8, 8, d * float(sc1));
    m[2 * c] = dmin * float(m0);
    m[2 * c + 1] = dmin * float(m1);
    const std::uint8_t* q = qs + 32 * c;
    std::uint8_t* lo = u + 64 * c;
    std::uint8_t* hi = lo + 32;
    if (qh == nullptr) {
      for (std::size_t l = 0; l < 32; ++l) lo[l] = q[l] & 0xF;
      for (std::size_t l = 0; l < 32; ++l) hi[l] = q[l] >> 4;
    } else {
      for (std::size_t l = 0; l < 32; ++l) lo[l] = static_cast<std::uint8_t>((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4));
      for (std::size_t l = 0; l < 32; ++l) hi[l] = static_cast<std::uint8_t>((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
    }
  }
}

template <>
struct int8_form<block_q4_k> {
  static constexpr int offset = 0;
  static constexpr bool has_mins = true;
  static void decode(const block_q4_k& b, std::uint8_t* __restrict u, float* __restrict s, float* m) noexcept {
    decode_k_affine(b.d, b.dmin, b.scales, b.qs, nullptr, u, s, m);
  }
};

template <>
struct int8_form<block_q5_k> {
  static constexpr int offset = 0;
  static constexpr bool has_mins = true;
  static void decode(const block_q5_k& b, std::uint8_t* __restrict u, float* __restrict s, float* m) noexcept {
    decode_k_affine(b.d, b.dmin, b.scales, b.qs, b.qh, u, s, m);
  }
};

/// s[4 i .. 4 i + 3] = d * sub_scale(i) for i < 16: a super-block's 16
/// sub-blocks of 16 values (Q6_K, Q3_K), one scale per 4 values in s.
template <class SubScale>
inline void fill_scales16(float* __restrict s, float d, SubScale sub_scale) noexcept {
  for (std::size_t i = 0; i < 16; ++i) std::fill_n(s + 4 * i, 4, d * float(sub_scale(i)));
}

template <>
struct int8_form<block_q6_k> {
  static constexpr int offset = 32;
  static constexpr bool has_mins = false;
  static void decode(const block_q6_k& b, std::uint8_t* __restrict u, float* __restrict s, float*) noexcept {
    fill_scales16(s, scale_f32(b.d), [&](std::size_t i) { return b.scales[i]; });
    for (std::size_t h = 0; h < 2; ++h) {
      const std::uint8_t* ql = b.ql + 64 * h;
      const std::uint8_t* qh = b.qh + 32 * h;
      std::uint8_t* y = u + 128 * h;
      for (std::size_t l = 0; l < 32; ++l) y[l] = static_cast<std::uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
      for (std::size_t l = 0; l < 32; ++l) y[l + 32] = static_cast<std::uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      for (std::size_t l = 0; l < 32; ++l) y[l + 64] = static_cast<std::uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      for (std::size_t l = 0; l < 32; ++l) y[l + 96] = static_cast<std::uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
};

/// Q3_K: u = the 2-bit crumb + 4 * its hmask bit, offset 4, scale d * (sc - 32) per 16 values.
template <>
struct int8_form<block_q3_k> {
  static constexpr int offset = 4;
  static constexpr bool has_mins = false;
  static void decode(const block_q3_k& b, std::uint8_t* __restrict u, float* __restrict s, float*) noexcept {
    fill_scales16(s, scale_f32(b.d), [&](std::size_t i) { return int(q3_k_scale(b.scales, i)) - 32; });
    for (std::size_t j = 0; j < qk_k; ++j) {
      const std::size_t h = j / 128, r = (j % 128) / 32, l = j % 32;
      u[j] = static_cast<std::uint8_t>(((b.qs[32 * h + l] >> (2 * r)) & 3) | (((b.hmask[l] >> (4 * h + r)) & 1) << 2));
    }
  }
};

/// kvalues_iq4nl + 128 (1..241): IQ4_NL / IQ4_XS values as unsigned bytes with offset 128.
inline constexpr std::uint8_t iq4nl_biased[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static_assert(iq4nl_biased[0] == kvalues_iq4nl[0] + 128 && iq4nl_biased[15] == kvalues_iq4nl[15] + 128);

/// A 32-value block of 4-bit indices into a 16-level table and one scale d
/// (IQ4_NL, MXFP4): u = `biased`[index] (the level + 128), offset 128.
template <class Block, const std::uint8_t (&biased)[16]>
struct int8_table4_form {
  static constexpr int offset = 128;
  static constexpr bool has_mins = false;
  static void decode(const Block& b, std::uint8_t* __restrict u, float* __restrict s, float*) noexcept {
    for (std::size_t j = 0; j < 16; ++j) u[j] = biased[b.qs[j] & 0xF];
    for (std::size_t j = 0; j < 16; ++j) u[j + 16] = biased[b.qs[j] >> 4];
    std::fill_n(s, 8, scale_f32(b.d));
  }
};

/// IQ4_NL: u = level + 128, the block's scale d.
template <>
struct int8_form<block_iq4_nl> : int8_table4_form<block_iq4_nl, iq4nl_biased> {};

/// kvalues_mxfp4 + 128 (116..140): MXFP4's values as unsigned bytes with offset 128.
inline constexpr std::uint8_t mxfp4_biased[16] = {128, 129, 130, 131, 132, 134, 136, 140,
                                                  128, 127, 126, 125, 124, 122, 120, 116};
static_assert(mxfp4_biased[7] == kvalues_mxfp4[7] + 128 && mxfp4_biased[15] == kvalues_mxfp4[15] + 128);

/// MXFP4: u = level + 128, the block's scale 2^(e - 128).
template <>
struct int8_form<block_mxfp4> : int8_table4_form<block_mxfp4, mxfp4_biased> {};

/// IQ4_XS: u = level + 128, offset 128, scale d * (ls - 32) per 32 values.
template <>
struct int8_form<block_iq4_xs> {
  static constexpr int offset = 128;
  static constexpr bool has_mins = false;
  static void decode(const block_iq4_xs& b, std::uint8_t* __restrict u, float* __restrict s, float*) noexcept {
    const float d = scale_f32(b.d);
    for (std::size_t i = 0; i < 8; ++i) {
      std::fill_n(s + 8 * i, 8, d * float(int(iq4_xs_scale(b, i)) - 32));
      for (std::size_t j = 0; j < 16; ++j) u[32 * i + j] = iq4nl_biased[b.qs[16 * i + j] & 0xF];
      for (std::size_t j = 0; j < 16; ++j) u[32 * i + j + 16] = iq4nl_biased[b.qs[16 * i + j] >> 4];
    }
  }
};

/// Q2_K: u = the 2-bit crumb, offset 0, scale d * sc and minimum dmin * m
/// per 16 values (its minimums are per 16, not 32: min_values).
template <>
struct int8_form<block_q2_k> {
  static constexpr int offset = 0;
  static constexpr bool has_mins = true;
  static constexpr std::size_t min_values = 16;
  static void decode(const block_q2_k& b, std::uint8_t* __restrict u, float* __restrict s, float* m) noexcept {
    const float d = scale_f32(b.d), dmin = scale_f32(b.dmin);
    for (std::size_t i = 0; i < 16; ++i) {
      std::fill_n(s + 4 * i, 4, d * float(b.scales[i] & 0xF));
      m[i] = dmin * float(b.scales[i] >> 4);
    }
    for (std::size_t j = 0; j < qk_k; ++j) u[j] = (b.qs[32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3;
  }
};

/// Values per minimum of a format with minimums (32, Q2_K's 16).
template <class Block>
inline constexpr std::size_t min_values = 32;
template <>
inline constexpr std::size_t min_values<block_q2_k> = 16;

/// A strip of W's rows [o_base, o_base + rows) in integer form, row stride
/// `stride` values (in rounded up to 64; the padding is u = 0, s = 0, m = 0).
struct int8_strip {
  const std::uint8_t* u;  ///< [rows, stride]
  const float* s;         ///< [rows, stride / 4]
  const float* m;         ///< [rows, stride / min_values] (formats with minimums)
  std::size_t stride;
  std::size_t o_base;
  int offset;
  bool has_mins;
  std::size_t min_values;  ///< values per minimum: 32, or 16 (Q2_K, over activations per 256)
};

/// The per-thread buffers a strip is decoded into.
struct int8_strip_buffer {
  aligned_vector<std::uint8_t> u;
  aligned_vector<float> s, m;
};

/// Decodes rows [o, o + rows) of w into buf. @pre in % block values == 0
template <class Block>
int8_strip decode_int8_strip(const block_weights& w, std::size_t o, std::size_t rows, std::size_t stride,
                             int8_strip_buffer& buf) {
  using form = int8_form<Block>;
  constexpr std::size_t k = block_values<Block>;
  if (buf.u.size() < rows * stride) buf.u.resize(rows * stride);
  if (buf.s.size() < rows * stride / 4) buf.s.resize(rows * stride / 4);
  constexpr std::size_t mv = min_values<Block>;
  if (buf.m.size() < rows * stride / mv) buf.m.resize(rows * stride / mv);
  const std::size_t blocks = w.in / k, row_bytes = w.row_bytes();
  for (std::size_t r = 0; r < rows; ++r) {
    const auto* src = reinterpret_cast<const Block*>(w.data + (o + r) * row_bytes);
    prefetch_lines_l2(reinterpret_cast<std::uintptr_t>(src) + matmul_prefetch_bytes, row_bytes);
    std::uint8_t* u = buf.u.data() + r * stride;
    float* s = buf.s.data() + r * stride / 4;
    float* m = buf.m.data() + r * stride / mv;
    for (std::size_t b = 0; b < blocks; ++b) form::decode(src[b], u + b * k, s + b * k / 4, m + b * k / mv);
    std::fill(u + w.in, u + stride, std::uint8_t{0});
    std::fill(s + w.in / 4, s + stride / 4, 0.0f);
    std::fill(m + (form::has_mins ? w.in / mv : 0), m + stride / mv, 0.0f);
  }
  return {buf.u.data(), buf.s.data(), buf.m.data(), stride, o, form::offset, form::has_mins, mv};
}

#if defined(__AVX__)
/// The sum of 8 lanes through one fixed tree.
inline float reduce8(__m256 v) noexcept {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#endif

/// sum_b m[b] * block_sums[b] over a row's blocks, in a fixed order, one
/// overload per instruction set: here blocks ascending.
inline float int8_min_dot(const float* m, const float* block_sums, std::size_t n_blocks,
                          simd::requires_arch<xsimd::generic>) noexcept {
  float sum = 0.0f;
  for (std::size_t b = 0; b < n_blocks; ++b) sum = std::fma(m[b], block_sums[b], sum);
  return sum;
}

#if defined(__AVX512F__) && defined(__AVX512VL__)
/// 8 lanes over chunks of 8 blocks (the last one masked), then reduce8.
inline float int8_min_dot(const float* m, const float* block_sums, std::size_t n_blocks,
                          simd::requires_arch<xsimd::avx512f>) noexcept {
  __m256 acc = _mm256_setzero_ps();
  std::size_t b = 0;
  for (; b + 8 <= n_blocks; b += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + b), _mm256_loadu_ps(block_sums + b), acc);
  if (b < n_blocks) {
    const __mmask8 k = static_cast<__mmask8>((1u << (n_blocks - b)) - 1);
    acc = _mm256_fmadd_ps(_mm256_maskz_loadu_ps(k, m + b), _mm256_maskz_loadu_ps(k, block_sums + b), acc);
  }
  return reduce8(acc);
}
#endif

/// Every strip row for every token, lanes ascending (the scalar form of the
/// lane arithmetic the VNNI kernels run). It serves every arch without a
/// kernel of its own and is not told which, so the minimums' sum takes the
/// build's best instruction set (xsimd::default_arch).
inline void int8_strip_product(const q8_activations& xa, const int8_strip& w, std::size_t rows, float* y,
                               std::size_t y_stride, bool accumulate) noexcept {
  const std::size_t stride = w.stride;
  for (std::size_t t = 0; t < xa.n; ++t) {
    const std::int8_t* q = xa.row(t);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::uint8_t* u = w.u + r * stride;
      const float* s = w.s + r * stride / 4;
      float v = 0.0f;
      for (std::size_t l = 0; l < stride / 4; ++l) {
        int dot = 0;
        for (std::size_t i = 4 * l; i < 4 * l + 4; ++i) dot += (int(u[i]) - w.offset) * int(q[i]);
        v = std::fma(float(dot), s[l] * xa.pair_scales(t, l / 16)[l % 16], v);
      }
      if (w.has_mins && w.min_values == 32) {
        v -= int8_min_dot(w.m + r * stride / 32, xa.block_sums.data() + t * stride / 32, stride / 32,
                          xsimd::default_arch{});
      } else if (w.has_mins) {  // per 16 over activations per 256: their int16 sums times the super-block's scale
        const float* m = w.m + r * stride / 16;
        float mv = 0.0f;
        for (std::size_t j = 0; j < stride / 16; ++j)
          mv = std::fma(m[j], xa.k_scale(t, j / 16) * float(xa.sums16[t * stride / 16 + j]), mv);
        v -= mv;
      }
      float& out = y[t * y_stride + w.o_base + r];
      out = accumulate ? out + v : v;
    }
  }
}

/// Runs `tile.template operator()<TN, ON>(t0, o0)` over tokens [0, n) x rows
/// [row_first, row_last) in the register-decoding kernels' tile shapes: one
/// token in 1 x 4 tiles, two in 2 x 2, more in 4 x Wide tiles (and their
/// edges), each tile's rows staying in L1 while the token tiles pass over
/// them.
template <std::size_t Wide, class Tile>
void for_each_int8_tile(std::size_t n, std::size_t row_first, std::size_t row_last, Tile&& tile) {
  auto rows = [&]<std::size_t TN, std::size_t ON>(std::size_t t) {
    std::size_t o = row_first;
    for (; o + ON <= row_last; o += ON) tile.template operator()<TN, ON>(t, o);
    for (; o < row_last; ++o) tile.template operator()<TN, 1>(t, o);
  };
  if (n == 1) return rows.template operator()<1, 4>(0);
  if (n == 2) return rows.template operator()<2, 2>(0);
  auto tokens = [&]<std::size_t ON>(std::size_t o) {
    std::size_t t = 0;
    for (; t + 4 <= n; t += 4) tile.template operator()<4, ON>(t, o);
    switch (n - t) {
      case 3: tile.template operator()<3, ON>(t, o); break;
      case 2: tile.template operator()<2, ON>(t, o); break;
      case 1: tile.template operator()<1, ON>(t, o); break;
      default: break;
    }
  };
  std::size_t o = row_first;
  for (; o + Wide <= row_last; o += Wide) tokens.template operator()<Wide>(o);
  for (; o < row_last; ++o) tokens.template operator()<1>(o);
}

/// Rows [row_first, row_last) of `[n, out] y (+)= xa * W^T`.
/// @pre xa.assign_sums(int8_form<Block>::offset) was called
template <class Block>
void matmul_blocks_q8_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                           bool accumulate, std::size_t row_first, std::size_t row_last) {
  const std::size_t strip_bytes = xa.n <= matmul_stream_max_tokens ? int8_strip_bytes_streaming : int8_strip_bytes_prefill;
  const std::size_t strip_rows = std::max<std::size_t>(1, strip_bytes / xa.stride);
  thread_local int8_strip_buffer buffer;
  for (std::size_t o = row_first; o < row_last; o += strip_rows) {
    const std::size_t rows = std::min(strip_rows, row_last - o);
    const int8_strip strip = decode_int8_strip<Block>(w, o, rows, xa.stride, buffer);
    int8_strip_product(xa, strip, rows, y, y_stride, accumulate);
  }
}

/// Rows [row_first, row_last) of the int8 product on an arch: one overload
/// per xsimd tag, each next to its kernel (matmul_blocks_avx2.hpp,
/// matmul_blocks32_vnni.hpp, matmul_kquants_vnni.hpp); this strip kernel is
/// the fallback. @pre xa.assign_sums(int8_form<Block>::offset) was called
template <class Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::generic>) {
  matmul_blocks_q8_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last);
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
