// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/matmul_blocks32_vnni.hpp
/// The 32-value block formats' (Q4_0, Q4_1, Q5_0, Q5_1) int8-activation
/// products with AVX-512 VNNI, the weights decoded in registers as they
/// stream in, at every token count. Activations are quantised per 32 values
/// (q8_activations::assign), as ggml multiplies these formats by Q8_0 / Q8_1.
///
/// Two blocks make one 64-value group: their 16 bytes of nibbles become 64
/// unsigned values in natural order (two loads, a shift, a shuffle, a mask;
/// Q5's fifth bits are one masked move from their 2 x 32 bits), then one
/// VPDPBUSD started from the activations' -offset * sum q, and the lane
/// arithmetic of matmul_blocks_q8.hpp: cvt(dot) * (d_w * d_x) into f32
/// lanes. Q4_1 / Q5_1's minimums add m * d_x * sum q per block. Each output
/// is accumulated in the same order whatever the batch or tile, so the
/// product is batch and thread invariant. Without VNNI the strip kernel
/// (matmul_blocks_q8.hpp) computes the same formula in scalar code. The
/// 32-value lookup formats (IQ4_NL, MXFP4) have their own kernel,
/// matmul_lookup4_vnni.hpp.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "llmkit/model/detail/matmul_blocks_q8.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

/// The 4-bit values of blocks a and b (b null: zeros) in natural order:
/// a's values 0-31 (low nibbles, then high), then b's.
inline __m512i pair_nibbles(const std::uint8_t* a, const std::uint8_t* b) noexcept {
  const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i vb = b != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)) : _mm_setzero_si128();
  const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(va), vb, 1);
  // [a, b, a >> 4, b >> 4] -> [a lo, a hi, b lo, b hi]
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1);
  return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
}

/// Q5's fifth bits (bit j of qh is value j's): 16 where set, in pair order.
inline __m512i pair_fifth_bits(const std::uint8_t (&qa)[4], const std::uint8_t* qb) noexcept {
  std::uint32_t ha, hb = 0;
  std::memcpy(&ha, qa, 4);
  if (qb != nullptr) std::memcpy(&hb, qb, 4);
  return _mm512_maskz_mov_epi8(__mmask64(ha) | (__mmask64(hb) << 32), _mm512_set1_epi8(0x10));
}

/// Lanes 0-7 a, lanes 8-15 b.
inline __m512 pair_lanes(float a, float b) noexcept {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

/// Register decoders over blocks p[0] and, when `two`, p[1]: `values` (64
/// unsigned values in natural order), `scales` (16 lane scales), `mins`
/// (lanes 0-1: the blocks' m_b of w = s * u - m_b).
template <class Block>
struct pair_block;

template <class Block>
  requires is_block32<Block>
struct pair_block<Block> {
  static __m512i values(const Block* p, bool two) noexcept {
    if constexpr (int8_form<Block>::has_fifth_bit)
      return _mm512_or_si512(pair_nibbles(p[0].qs, two ? p[1].qs : nullptr),
                             pair_fifth_bits(p[0].qh, two ? p[1].qh : nullptr));
    else
      return pair_nibbles(p[0].qs, two ? p[1].qs : nullptr);
  }
  static __m512 scales(const Block* p, bool two) noexcept {
    return pair_lanes(scale_f32(p[0].d), two ? scale_f32(p[1].d) : 0.0f);
  }
  static __m128 mins(const Block* p, bool two) noexcept
    requires(int8_form<Block>::has_mins)
  {
    return _mm_setr_ps(-scale_f32(p[0].m), two ? -scale_f32(p[1].m) : 0.0f, 0.0f, 0.0f);
  }
};

/// The formats pair_tile serves.
template <class Block>
inline constexpr bool is_pair_block = is_block32<Block>;

/// Tokens [t0, t0 + TN) x rows [o0, o0 + ON) over the whole row.
template <class Block, std::size_t TN, std::size_t ON>
inline void pair_tile(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                      bool accumulate, std::size_t t0, std::size_t o0) noexcept {
  using F = pair_block<Block>;
  constexpr int offset = int8_form<Block>::offset;
  constexpr bool has_mins = int8_form<Block>::has_mins;
  const std::size_t stride = xa.stride, row_bytes = w.row_bytes(), blocks = w.in / 32, pairs = (blocks + 1) / 2;
  const Block* rows[ON];
#pragma GCC unroll 16
  for (std::size_t b = 0; b < ON; ++b) rows[b] = reinterpret_cast<const Block*>(w.data + (o0 + b) * row_bytes);
  __m512 acc[TN][ON];
  [[maybe_unused]] __m128 macc[TN][ON];
#pragma GCC unroll 16
  for (std::size_t a = 0; a < TN; ++a)
#pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) {
      acc[a][b] = _mm512_setzero_ps();
      if constexpr (has_mins) macc[a][b] = _mm_setzero_ps();
    }
  // The tile's rows are contiguous: each step prefetches its share of them
  // matmul_prefetch_bytes ahead.
  const std::size_t step_bytes = (ON * row_bytes + pairs - 1) / pairs;
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(rows[0]) + matmul_prefetch_bytes;
  auto step = [&](std::size_t i, auto two_blocks) {
    constexpr bool two = decltype(two_blocks)::value;
    prefetch_lines_l2(ahead + i * step_bytes, step_bytes);
    __m512i u[ON];
    __m512 s[ON];
    [[maybe_unused]] __m128 mn[ON];
#pragma GCC unroll 16
    for (std::size_t b = 0; b < ON; ++b) {
      u[b] = F::values(rows[b] + 2 * i, two);
      s[b] = F::scales(rows[b] + 2 * i, two);
      if constexpr (has_mins) mn[b] = F::mins(rows[b] + 2 * i, two);
    }
#pragma GCC unroll 16
    for (std::size_t a = 0; a < TN; ++a) {
      const std::size_t t = t0 + a;
      const __m512i q = _mm512_load_si512(xa.row(t) + 64 * i);
      const __m512i start = offset != 0 ? _mm512_load_si512(xa.offset_sums.data() + t * stride / 4 + 16 * i)
                                        : _mm512_setzero_si512();
      const __m512 d = _mm512_load_ps(xa.pair_scales(t, i));
#pragma GCC unroll 16
      for (std::size_t b = 0; b < ON; ++b) {
        const __m512i dot = _mm512_dpbusd_epi32(start, u[b], q);
        acc[a][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s[b], d), acc[a][b]);
      }
      if constexpr (has_mins) {
        // block_sums has an entry for the padding block of an odd row (0).
        const __m128 xs = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xa.block_sums.data() + t * stride / 32 + 2 * i)));
#pragma GCC unroll 16
        for (std::size_t b = 0; b < ON; ++b) macc[a][b] = _mm_fmadd_ps(mn[b], xs, macc[a][b]);
      }
    }
  };
  for (std::size_t i = 0; i < blocks / 2; ++i) step(i, std::true_type{});
  if (blocks % 2 != 0) step(blocks / 2, std::false_type{});
  float sums[TN][ON];
  reduce_tile16(acc, sums);
  for (std::size_t a = 0; a < TN; ++a)
    for (std::size_t b = 0; b < ON; ++b) {
      float v = sums[a][b];
      if constexpr (has_mins) v -= _mm_cvtss_f32(_mm_add_ss(macc[a][b], _mm_movehdup_ps(macc[a][b])));
      float& out = y[(t0 + a) * y_stride + o0 + b];
      out = accumulate ? out + v : v;
    }
}

/// Rows [row_first, row_last) for every token: one token in tiles of 4
/// rows, two in 2 x 2, more in 4 x 4 tiles (4 x 2 with minimums), each
/// tile's rows staying in L1 while the token tiles pass over them.
template <class Block>
void matmul_blocks32_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                          bool accumulate, std::size_t row_first, std::size_t row_last) noexcept {
  // 4 x 4 tiles where no minimums take registers.
  constexpr std::size_t wide = int8_form<Block>::has_mins ? 2 : 4;
  for_each_int8_tile<wide>(xa.n, row_first, row_last, [&]<std::size_t TN, std::size_t ON>(std::size_t t, std::size_t o) {
    pair_tile<Block, TN, ON>(xa, w, y, y_stride, accumulate, t, o);
  });
}

/// int8_block_rows for the 32-value formats on AVX-512 VNNI (xsimd has no VNNI tag:
/// avx512bw stands for it where the build enables VNNI; without, avx512bw
/// falls back to the avx512f overload).
template <class Block>
  requires is_pair_block<Block>
void int8_block_rows(const q8_activations& xa, const block_weights& w, float* y, std::size_t y_stride,
                     bool accumulate, std::size_t row_first, std::size_t row_last,
                     simd::requires_arch<xsimd::avx512bw>) noexcept {
  matmul_blocks32_rows<Block>(xa, w, y, y_stride, accumulate, row_first, row_last);
}
#endif

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
