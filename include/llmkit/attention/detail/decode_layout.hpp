// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_layout.hpp
/// What every decode micro-kernel shares (`decode_layout`): the block and
/// pass shapes for head dim D, storage type T and GB query heads per pass;
/// the running softmax state; and the helpers that move per-row values and
/// probabilities between the lane layout and the kernels' registers. The
/// kernels themselves derive from it: decode_bf16.hpp, decode_int8_avx512.hpp,
/// decode_int8_avx2.hpp, decode_kernels.hpp.
///
/// Lane layout of a block's scores `s` (`[block / R][width]` floats,
/// width = acc_regs): pass p = j / R holds, in lane a, head g = a / R and
/// row j = p * R + a % R. With width 16 (AVX-512, scalar):
///
///     GB = 4, R = 4:  s[p * 16 + g * 4 + r]   (row j = 4p + r)
///     GB = 2, R = 8:  s[p * 16 + g * 8 + r]   (row j = 8p + r)
///     GB = 1, R = 16: s[r]                    (row j = r)
///
/// With width 8 (AVX2) the same with R halved.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/attention/detail/amx.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// Largest divisor of n that is <= limit.
constexpr std::size_t largest_divisor_at_most(std::size_t n, std::size_t limit) {
  for (std::size_t c = limit; c > 1; --c)
    if (n % c == 0) return c;
  return 1;
}

/// Whether int8 keys of head dim D are dotted with int16 queries in 512-bit
/// VPDPWSSD on an arch (`decode_layout::vnni_int16`): AVX-512 with BW and
/// VNNI, which have no xsimd tag of their own (hence the #if).
template <class T, std::size_t D>
constexpr bool vnni_int16_on(requires_arch<xsimd::generic>) noexcept {
  return false;
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
template <class T, std::size_t D>
constexpr bool vnni_int16_on(requires_arch<xsimd::avx512f>) noexcept {
  return std::is_same_v<T, std::int8_t> && D % 32 == 0;
}
#endif

/// Whether they are dotted in 256-bit registers (`decode_layout::avx2_int16`):
/// AVX2's tags only, so not AVX-512's (xsimd's avx512f does not derive from
/// avx2), which take vnni_int16_on's path or the f32 one.
template <class T, std::size_t D>
constexpr bool avx2_int16_on(requires_arch<xsimd::generic>) noexcept {
  return false;
}
#if defined(__AVX2__)
template <class T, std::size_t D>
constexpr bool avx2_int16_on(requires_arch<xsimd::avx2>) noexcept {
  return std::is_same_v<T, std::int8_t> && D % 16 == 0;
}
#endif

/// The shapes and shared helpers of the decode kernels for head dim D over
/// storage type T, GB query heads per pass.
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_layout {
  using V = vec<Arch>;
  static constexpr std::size_t L = lanes<Arch>;
  /// int8 keys are dotted in integers (VPDPWSSD, `scores_int`) with the
  /// queries rounded to int16 (one scale per head, amax / 32767: a relative
  /// error of at most 2^-16 of the head's largest value, far below the int8
  /// keys' own rounding): each key register is sign-extended once (32
  /// values) and multiply-added for every head of the batch, with no int ->
  /// f32 conversion per key value.
  static constexpr bool vnni_int16 = vnni_int16_on<T, D>(simd::kernel_arch<Arch>{});
  /// AVX2 has no VNNI: VPMADDWD multiplies 16 int16 pairs and sums each
  /// pair, and VPADDD adds them to the int32 accumulators (`scores_int`'s
  /// AVX2 overload): two instructions per 16 key values and head, where the
  /// f32 path spends two conversions per 8 values and an FMA per 8 values
  /// and head.
  static constexpr bool avx2_int16 = avx2_int16_on<T, D>(simd::kernel_arch<Arch>{});
  /// int8 keys dotted with int16 queries, on either path (decode.hpp rounds
  /// the queries and calls scores_int).
  static constexpr bool int16_queries = vnni_int16 || avx2_int16;
  /// AVX2 with a 256-bit VPDPWSSD: AVX-VNNI (VEX; Intel from Alder Lake,
  /// AMD from Zen 5) or, in an AVX-512 build, AVX-512 VL + VNNI. The AVX2
  /// int8 kernels then take one instruction per 16 products where VPMADDWD
  /// + VPADDD take two (`scores_int`, `accumulate_int<std::int16_t>`).
  static constexpr bool avx2_vnni =
#if defined(__AVX2__) && (defined(__AVXVNNI__) || (defined(__AVX512VL__) && defined(__AVX512VNNI__)))
      avx2_int16;
#else
      false;
#endif
  /// Rows per block: 16, or 32 on the VNNI int16-query paths (AVX-512
  /// without AMX, whose tiles take 16 rows; AVX2 with AVX-VNNI). An int8
  /// block's dot products are cheap next to its softmax step and the
  /// per-block work around it, so twice the rows share that work (f32 and
  /// f16 blocks, whose products cost more, gain nothing from it).
  static constexpr std::size_t block = (vnni_int16 && !LLMKIT_ATTENTION_AMX_INT8) || avx2_vnni ? 32 : 16;
  /// Accumulator registers a kernel keeps in flight: 16 of AVX-512's 32
  /// registers; 8 of AVX2's 16, so the queries (or probabilities) and a
  /// row register fit beside them (16 spilled two accumulators to the
  /// stack in every column step of the scores, and P.V's 16 spilled more).
  /// 8 independent FMAs still cover two FMA pipes of 4 cycles' latency.
  static constexpr std::size_t acc_regs = has_avx512<Arch> || simd::is_scalar_v<Arch> ? 16 : 8;
  static constexpr std::size_t width = acc_regs;  ///< lanes of one pass (dot products in flight)
  static constexpr std::size_t R = width / GB;      ///< rows per pass
  static constexpr std::size_t passes = block / R;  ///< passes per block
  static constexpr std::size_t regs = width / L;    ///< registers per pass
  static_assert(GB == 1 || GB == 2 || GB == 4, "decode_kernels: GB must be 1, 2 or 4");
  static_assert(D % L == 0, "decode_kernels: head_dim must be a multiple of the register width");
  static_assert(width % L == 0, "decode_kernels: a pass must fill whole registers");
  static constexpr std::size_t DV = D / L;
  /// Output registers per head in one value pass (GB x H <= acc_regs).
  static constexpr std::size_t H = largest_divisor_at_most(DV, acc_regs / GB);
  static constexpr std::size_t row_bytes = D * sizeof(T);  ///< one stored K or V row

  /// Running softmax state of the GB heads, per lane (head a / R).
  struct state {
    alignas(64) float m[width];  ///< running max (same in the R lanes of a head)
    alignas(64) float l[width];  ///< running sum, split over the R lanes of a head
    void reset() {
      std::fill(m, m + width, -std::numeric_limits<float>::infinity());
      std::fill(l, l + width, 0.0f);
    }
    float max(std::size_t g) const { return m[g * R]; }
    float sum(std::size_t g) const {
      float s = 0.0f;
      for (std::size_t r = 0; r < R; ++r) s += l[g * R + r];
      return s;
    }
  };

  /// Where 8-bit probabilities are grouped by row quads instead of held in
  /// the lane layout: where a pass holds fewer than 4 rows of a head (AVX2
  /// at GB = 4: R = 2), `quantize_p_u8` writes [block / 4][GB][4] bytes, the
  /// quad of head g's rows j .. j + 3 at (j / 4) * GB * 4 + g * 4.
  static constexpr bool p8_quads = R % 4 != 0;

  /// The probabilities of rows j .. j + 4 / sizeof(P) - 1 of head g (j a
  /// multiple of that count) as one 32-bit group: broadcast to every lane,
  /// the operand of a pass over interleaved rows (16-bit pairs from the
  /// lane layout: accumulate_int<std::int16_t>, accumulate_bf16; 8-bit quads:
  /// accumulate_int<std::uint8_t>, from the lane layout or, where `p8_quads`, the quad
  /// layout).
  template <class P>
  static std::int32_t row_group_bits(const P* p, std::size_t j, std::size_t g) noexcept {
    static_assert(sizeof(P) == 1 || sizeof(P) == 2);
    static_assert(sizeof(P) == 1 || R % 2 == 0, "row_group: a pair's rows must share a pass");
    const std::size_t at = sizeof(P) == 1 && p8_quads ? (j / 4) * GB * 4 + g * 4 : (j / R) * width + g * R + j % R;
    std::int32_t group;
    __builtin_memcpy(&group, p + at, sizeof group);
    return group;
  }

  /// The step of each head's probabilities rounded to `levels` levels
  /// (quantize_p, quantize_p_u8; one register holds a pass): writes
  /// p_scale[g] = max_j p(g, j) / levels and returns levels / max in each
  /// lane of head g (0 where the max is not > 0: all-zero blocks, NaN).
  /// @param p [passes] registers of probabilities, lane layout
  template <class Reg>
  static V p_levels(const Reg* p, float levels, float* p_scale) noexcept {
    V mx(0.0f);
    for (std::size_t ps = 0; ps < passes; ++ps) mx = vmax<Arch>(mx, V(p[ps]));
    const V m(head_max(static_cast<Reg>(mx)));
    alignas(64) float sc[width];
    vstore<Arch>(sc, m * V(1.0f / levels));
    for (std::size_t g = 0; g < GB; ++g) p_scale[g] = sc[g * R];
    return xsimd::select(m > V(0.0f), V(levels) / m, V(0.0f));
  }

  /// dst[L x .. L x + L - 1] = alpha * dst[..] + p_scale * sums[x] for
  /// x < N: one column pass of an integer P.V kernel (accumulate_int<std::int16_t> on
  /// either arch, accumulate_int<std::uint8_t>: its sums converted to f32, in column
  /// order) added to the f32 output.
  template <std::size_t N, class Reg>
  static void add_pass(float* dst, const Reg* sums, float alpha, float p_scale) noexcept {
    const V a(alpha), ps(p_scale);
#pragma GCC unroll 4
    for (std::size_t x = 0; x < N; ++x)
      vstore<Arch>(dst + L * x, vfma<Arch>(V(sums[x]), ps, vload<Arch>(dst + L * x) * a));
  }

#if defined(__AVX512F__)
  /// row_group_bits broadcast to the 16 lanes of a register.
  template <class P>
  static __m512i row_group(const P* p, std::size_t j, std::size_t g) noexcept {
    return _mm512_set1_epi32(row_group_bits(p, j, g));
  }

  /// The sums of 32 columns of a pass over interleaved rows back in column
  /// order: per 128-bit lane L, `lo` holds columns 8L .. 8L + 3 and `hi`
  /// 8L + 4 .. 8L + 7 (the lanes of unpacklo / unpackhi_epi16).
  /// @param cols [2] register x: columns 16x .. 16x + 15
  static void in_column_order(__m512 lo, __m512 hi, __m512* cols) noexcept {
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    cols[0] = _mm512_permutex2var_ps(lo, lo_idx, hi);
    cols[1] = _mm512_permutex2var_ps(lo, hi_idx, hi);
  }

  /// The column passes of the AVX-512 P.V kernels on interleaved rows
  /// (accumulate_int, accumulate_bf16): per 64 columns from c0, GB x 4
  /// accumulators of type Acc from zero; per group of Rows rows from j,
  /// `load(j, c0, x)` prefetches and writes the group's rows, interleaved per
  /// column, as [4] registers x, and head g's accumulator k takes
  /// `dot(acc, row_group(p, j, g), x[k])`; then `finish(g, c0, acc[g])` adds
  /// head g's [4] sums to its output.
  /// @param p [block * GB] probabilities, lane layout
  template <std::size_t Rows, class Acc, class P, class Load, class Dot, class Finish>
  static void pv_passes(const P* p, Load load, Dot dot, Finish finish) noexcept {
    for (std::size_t c0 = 0; c0 < D; c0 += 64) {
      Acc acc[GB][4];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
        for (std::size_t k = 0; k < 4; ++k) acc[g][k] = Acc{};
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += Rows) {
        __m512i pw[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) pw[g] = row_group(p, j, g);
        __m512i x[4];
        load(j, c0, x);
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
          for (std::size_t k = 0; k < 4; ++k) acc[g][k] = dot(acc[g][k], pw[g], x[k]);
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) finish(g, c0, acc[g]);
    }
  }
#endif

  /// Register b of pass p of a per-row array x ([block]) spread to the lane
  /// layout: lane a gets x[p * R + a % R].
  static V row_lanes(const float* x, std::size_t p, std::size_t b) noexcept {
    return row_lanes(x, p, b, simd::kernel_arch<Arch>{});
  }

  static V row_lanes(const float* x, std::size_t p, std::size_t b, requires_arch<xsimd::generic>) noexcept {
    alignas(64) float t[L];
    for (std::size_t i = 0; i < L; ++i) t[i] = x[p * R + (b * L + i) % R];
    return vload<Arch>(t);
  }

#if defined(__AVX2__)
  /// row_lanes where one AVX2 register holds a whole pass (width == L).
  static V row_lanes(const float* x, std::size_t p, std::size_t b, requires_arch<xsimd::avx2>) noexcept {
    if constexpr (width == L) {
      if constexpr (R == 8) return _mm256_loadu_ps(x + p * 8);
      else if constexpr (R == 4) return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + p * 4));
      else return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + p * 2)));
    } else {
      return row_lanes(x, p, b, xsimd::generic{});
    }
  }
#endif

#if defined(__AVX512F__)
  static V row_lanes(const float* x, std::size_t p, std::size_t b, requires_arch<xsimd::avx512f>) noexcept {
    if constexpr (R == 16) return _mm512_loadu_ps(x + p * 16);
    else if constexpr (R == 8) return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(x + p * 8))));
    else return _mm512_broadcast_f32x4(_mm_loadu_ps(x + p * 4));
  }
#endif

#if defined(__AVX512F__)
  /// Lane a of the result: the max of x over the R lanes of head a / R (one
  /// register holds a whole pass on AVX-512), by swapping halves of ever
  /// smaller lane groups.
  static __m512 head_max(__m512 x) noexcept {
    if constexpr (R >= 16) x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));  // 256-bit halves
    if constexpr (R >= 8) x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));   // 128-bit lanes
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));                                // 64-bit pairs
    return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));                             // neighbours
  }
#endif
#if defined(__AVX2__)
  /// head_max for AVX2, whose one register holds a whole pass (width 8).
  static __m256 head_max(__m256 x) noexcept {
    if constexpr (R >= 8) x = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 0x01));  // 128-bit halves
    if constexpr (R >= 4) x = _mm256_max_ps(x, _mm256_permute_ps(x, 0x4E));         // 64-bit pairs
    return _mm256_max_ps(x, _mm256_permute_ps(x, 0xB1));                             // neighbours
  }
#endif
};

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
