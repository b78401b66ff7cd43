// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_kernels.hpp
/// The micro-kernels of decode attention: the query rows of a batch of GB
/// heads (1, 2 or 4) of one GQA group against a block of 16 stored K/V rows
/// (32 for int8 with VNNI, `block`), with the online softmax between them.
///
/// Decode is memory-bound, so the kernels spend as few instructions per
/// stored byte as they can:
/// - every register of a stored row is loaded once, converted to f32 in that
///   register (`vload_f32`) and multiplied there with the matching register
///   of every query head of the batch: no converted copy of a row, no second
///   read of it (int8 keys with VNNI: sign-extended to int16 and dotted with
///   int16 queries in integers, `scores_int`; bf16 keys with bf16 queries:
///   multiplied as stored, 32 values per VDPBF16PS, `scores_bf16`);
/// - the scores kernel keeps `acc_regs` (16, AVX2: 8) independent dot
///   products in flight (R = acc_regs / GB rows x GB heads) and folds them
///   with one haddp per pass. The
///   scores stay in that "lane layout" (below), so the softmax runs on whole
///   registers for all heads of the batch at once (one exp per register,
///   one for the rescale factors) and the value kernel reads each
///   probability at a compile-time offset;
/// - the value kernel streams the block's rows through GB x H output
///   registers, the GB probabilities of a row held in registers (int8
///   values with VNNI: the probabilities rounded to int16 per block and
///   head, two rows multiplied per VPDPWSSD, `accumulate_i16`; with
///   `int8_probabilities` rounded to uint8, four rows per VPDPBUSD,
///   `accumulate_u8`; bf16 values with bf16 probabilities: two rows per
///   VDPBF16PS, `accumulate_bf16`).
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
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/attention/detail/amx.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/kernel_simd.hpp"
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

/// Kernels for head dim D over storage type T, GB query heads per pass.
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_kernels {
  using V = vec<Arch>;
  static constexpr std::size_t L = lanes<Arch>;
  /// int8 keys are dotted in integers (VPDPWSSD, `scores_int`) with the
  /// queries rounded to int16 (one scale per head, amax / 32767: a relative
  /// error of at most 2^-16 of the head's largest value, far below the int8
  /// keys' own rounding): each key register is sign-extended once (32
  /// values) and multiply-added for every head of the batch, with no int ->
  /// f32 conversion per key value.
  static constexpr bool vnni_int16 =
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
      std::is_same_v<T, std::int8_t> && has_avx512<Arch> && D % 32 == 0;
#else
      false;
#endif
  /// AVX2 has no VNNI: VPMADDWD multiplies 16 int16 pairs and sums each
  /// pair, and VPADDD adds them to the int32 accumulators (`scores_int`'s
  /// AVX2 overload): two instructions per 16 key values and head, where the
  /// f32 path spends two conversions per 8 values and an FMA per 8 values
  /// and head.
  static constexpr bool avx2_int16 =
#if defined(__AVX2__)
      std::is_same_v<T, std::int8_t> && has_avx2<Arch> && !has_avx512<Arch> && D % 16 == 0;
#else
      false;
#endif
  /// int8 keys dotted with int16 queries, on either path (decode.hpp rounds
  /// the queries and calls scores_int).
  static constexpr bool int16_queries = vnni_int16 || avx2_int16;
  /// AVX2 with a 256-bit VPDPWSSD: AVX-VNNI (VEX; Intel from Alder Lake,
  /// AMD from Zen 5) or, in an AVX-512 build, AVX-512 VL + VNNI. The AVX2
  /// int8 kernels then take one instruction per 16 products where VPMADDWD
  /// + VPADDD take two (`scores_int`, `accumulate_i16`).
  static constexpr bool avx2_vnni =
#if defined(__AVX2__) && (defined(__AVXVNNI__) || (defined(__AVX512VL__) && defined(__AVX512VNNI__)))
      avx2_int16;
#else
      false;
#endif
  /// Rows per block: 16, or 32 on the VNNI int16-query paths (AVX-512
  /// without AMX, whose tiles take 16 rows; AVX2 with AVX-VNNI). An int8
  /// block's dot products are cheap next to its softmax step and the
  /// per-block work around it, so twice the rows per step read 11-12 %
  /// faster from DRAM on Zen 5 with AVX-512 and 8-10 % with AVX-VNNI (f32 /
  /// f16 gained nothing; docs/attention-history.md).
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

  /// s (lane layout) = q[g] . k[j] for g < GB, j < block (every k[j]
  /// readable; int8 rows unscaled).
  /// @param q [GB] pointers to [D] f32 query rows
  /// @param k [block] pointers to [D] stored rows
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile (`prefetch_slot`: in address order), or null
  static void scores(const float* const* q, const T* const* k, float* s, const T* const* pf) noexcept {
    for (std::size_t p = 0; p < passes; ++p) {
      V acc[width];
#pragma GCC unroll 16
      for (std::size_t a = 0; a < width; ++a) acc[a] = V(0.0f);
      for (std::size_t c = 0; c < DV; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<DV, L * sizeof(T)>(pf, (p * DV + c) * R + r);
        V qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) qv[g] = vheld<Arch>(vload<Arch>(q[g] + c * L));
#pragma GCC unroll 16
        for (std::size_t r = 0; r < R; ++r) {
          const V kv = vheld<Arch>(vload_f32<Arch>(k[p * R + r] + c * L));
#pragma GCC unroll 4
          for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = vfma<Arch>(qv[g], kv, acc[g * R + r]);
        }
      }
#pragma GCC unroll 16
      for (std::size_t b = 0; b < regs; ++b) vstore<Arch>(s + p * width + b * L, vhaddp<Arch>(acc + b * L));
    }
  }

  /// Where 8-bit probabilities are grouped by row quads instead of held in
  /// the lane layout: where a pass holds fewer than 4 rows of a head (AVX2
  /// at GB = 4: R = 2), `quantize_p_u8` writes [block / 4][GB][4] bytes, the
  /// quad of head g's rows j .. j + 3 at (j / 4) * GB * 4 + g * 4.
  static constexpr bool p8_quads = R % 4 != 0;

  /// The probabilities of rows j .. j + 4 / sizeof(P) - 1 of head g (j a
  /// multiple of that count) as one 32-bit group: broadcast to every lane,
  /// the operand of a pass over interleaved rows (16-bit pairs from the
  /// lane layout: accumulate_i16, accumulate_bf16; 8-bit quads:
  /// accumulate_u8, from the lane layout or, where `p8_quads`, the quad
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
  /// x < N: one column pass of an integer P.V kernel (accumulate_i16 on
  /// either arch, accumulate_u8: its sums converted to f32, in column
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
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
  /// bf16 queries (`decode_params::bf16_queries`) against bf16 keys:
  /// VDPBF16PS multiplies a whole 64-byte key register (32 values) with a
  /// head's bf16 queries into 16 f32 sums, where scores() converts each 16
  /// keys (two instructions) and spends one FMA per 16: per key register
  /// GB multiply-adds instead of 2 GB + 4 instructions. The products of two
  /// bf16 values are exact in f32, so only the sums' order differs from
  /// scores() given the same rounded queries.
  static constexpr bool bf16_dot = std::is_same_v<T, bf16> && has_avx512<Arch> && D % 32 == 0;

  /// s (lane layout) = q[g] . k[j] for g < GB, j < block, like scores().
  /// @param q [GB] pointers to [D] bf16 query rows
  /// @param k [block] pointers to [D] bf16 rows
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void scores_bf16(const bf16* const* q, const T* const* k, float* s, const T* const* pf) noexcept
    requires bf16_dot
  {
    constexpr std::size_t steps = D / 32;
    for (std::size_t p = 0; p < passes; ++p) {
      __m512 acc[width];
#pragma GCC unroll 16
      for (std::size_t a = 0; a < width; ++a) acc[a] = _mm512_setzero_ps();
      for (std::size_t c = 0; c < steps; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<steps, 64>(pf, (p * steps + c) * R + r);
        __m512bh qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) qv[g] = (__m512bh)_mm512_loadu_si512(q[g] + c * 32);
#pragma GCC unroll 16
        for (std::size_t r = 0; r < R; ++r) {
          const __m512bh kv = (__m512bh)_mm512_loadu_si512(k[p * R + r] + c * 32);
#pragma GCC unroll 4
          for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = _mm512_dpbf16_ps(acc[g * R + r], kv, qv[g]);
        }
      }
      _mm512_storeu_ps(s + p * width, haddp16(acc));
    }
  }

  /// bf16 probabilities (`decode_params::bf16_probabilities`) and bf16
  /// values: P.V in VDPBF16PS like accumulate_i16 in VPDPWSSD, two rows
  /// interleaved per instruction (rows j and j + 1 per column) against the
  /// pair (p_j, p_j+1) of each head, so no value is converted to f32. The
  /// f32 sums are added to the output once per block.
  static constexpr bool bf16_pv = bf16_dot && D % 64 == 0 && block % 2 == 0;

  /// o[g] = alpha[g] * o[g] + sum_j pb(g, j) * v[j] for g < GB.
  /// @param pb [block * GB] bf16 probabilities, lane layout
  /// @param v [block] pointers to [D] bf16 rows
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void accumulate_bf16(float* const* o, const float* alpha, const bf16* pb, const T* const* v,
                              const T* const* pf) noexcept
    requires bf16_pv
  {
    // Columns in passes of 64 (GB x 4 accumulators of 16 columns).
    for (std::size_t c0 = 0; c0 < D; c0 += 64) {
      __m512 acc[GB][4];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
        for (std::size_t x = 0; x < 4; ++x) acc[g][x] = _mm512_setzero_ps();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += 2) {
        if (pf != nullptr)  // four lines per row pair (D / 32 per row in all)
          for (std::size_t t = 0; t < 4; ++t) prefetch_slot<D / 32, 64>(pf, (c0 / 64) * block * 2 + 2 * j + t);
        __m512bh pw[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) pw[g] = (__m512bh)row_group(pb, j, g);
#pragma GCC unroll 2
        for (std::size_t h = 0; h < 2; ++h) {
          const __m512i a = _mm512_loadu_si512(v[j] + c0 + h * 32);
          const __m512i b = _mm512_loadu_si512(v[j + 1] + c0 + h * 32);
          const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 4
          for (std::size_t g = 0; g < GB; ++g) {
            acc[g][2 * h] = _mm512_dpbf16_ps(acc[g][2 * h], lo, pw[g]);
            acc[g][2 * h + 1] = _mm512_dpbf16_ps(acc[g][2 * h + 1], hi, pw[g]);
          }
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        const __m512 a = _mm512_set1_ps(alpha[g]);
#pragma GCC unroll 2
        for (std::size_t h = 0; h < 2; ++h) {
          float* dst = o[g] + c0 + h * 32;
          __m512 sums[2];
          in_column_order(acc[g][2 * h], acc[g][2 * h + 1], sums);
#pragma GCC unroll 2
          for (std::size_t x = 0; x < 2; ++x)
            _mm512_storeu_ps(dst + 16 * x, _mm512_fmadd_ps(_mm512_loadu_ps(dst + 16 * x), a, sums[x]));
        }
      }
    }
  }
#else
  static constexpr bool bf16_dot = false;
  static constexpr bool bf16_pv = false;
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

  /// int8 queries (`decode_params::int8_queries`) against int8 keys: the
  /// same integer dot products in half the multiply-adds. VPDPBUSD
  /// multiplies unsigned by signed bytes, so each key register is offset to
  /// unsigned (k + 128: one XOR, shared by the GB heads) and the offset's
  /// share, 128 * sum_d q[g][d], is taken off each head's sums (`q_offset`).
  static constexpr bool int8_queries_512 = vnni_int16 && D % 64 == 0;

  /// s (lane layout) = q_scale(g) * (q[g] . k[j]) in int32, for g < GB,
  /// j < block (int8 rows unscaled, like scores()). Q = std::int16_t: each
  /// key register sign-extended to int16 (32 values per step, VPDPWSSD);
  /// Q = std::int8_t (int8_queries): offset to unsigned (64 values per
  /// step, VPDPBUSD). The int32 sums are exact either way, so int16 queries
  /// holding int8 values give the same scores as the int8 path.
  /// @param q [GB] pointers to [D] query rows
  /// @param q_scale [16] lane a: the scale of head a / R
  /// @param q_offset [16] lane a: 128 * sum_d q[a / R][d] (Q = int8 only)
  /// @param k [block] pointers to [D] int8 rows
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile, or null
  template <class Q>
  static void scores_int(const Q* const* q, const float* q_scale, const std::int32_t* q_offset, const T* const* k,
                         float* s, const T* const* pf) noexcept
    requires(std::is_same_v<Q, std::int16_t> && vnni_int16) || (std::is_same_v<Q, std::int8_t> && int8_queries_512)
  {
    constexpr bool bytes = std::is_same_v<Q, std::int8_t>;
    constexpr std::size_t step = bytes ? 64 : 32;  // key values per register
    const __m512 qs = _mm512_load_ps(q_scale);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (std::size_t p = 0; p < passes; ++p) {
      __m512i acc[width];
#pragma GCC unroll 16
      for (std::size_t a = 0; a < width; ++a) acc[a] = _mm512_setzero_si512();
      for (std::size_t c = 0; c < D / step; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<D / step, step>(pf, (p * (D / step) + c) * R + r);
        __m512i qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) qv[g] = in_register(_mm512_loadu_si512(q[g] + c * step));
#pragma GCC unroll 16
        for (std::size_t r = 0; r < R; ++r) {
          const T* row = k[p * R + r] + c * step;
          if constexpr (bytes) {
            const __m512i kv = _mm512_xor_si512(_mm512_loadu_si512(row), flip);
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = _mm512_dpbusd_epi32(acc[g * R + r], kv, qv[g]);
          } else {
            const __m512i kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = _mm512_dpwssd_epi32(acc[g * R + r], kv, qv[g]);
          }
        }
      }
      __m512i sums = haddi16(acc);
      if constexpr (bytes) sums = _mm512_sub_epi32(sums, _mm512_load_si512(q_offset));
      _mm512_store_ps(s + p * width, _mm512_mul_ps(_mm512_cvtepi32_ps(sums), qs));
    }
  }

#if LLMKIT_ATTENTION_AMX_INT8
  /// int8 keys on AMX: scores_int<int16_t>'s integer dot products, 16 rows x GB
  /// heads per tile instruction. The int16 queries are split into bytes
  /// (q = 256 hi + lo, hi signed, lo unsigned: TDPBSSD and TDPBUSD) so the
  /// int32 sums, and hence the scores, equal scores_int<int16_t>'s bit for bit.
  static constexpr bool amx_scores = vnni_int16 && D % 64 == 0;
  static constexpr std::size_t amx_chunks = D / 64;  ///< 64-byte K chunks (one A tile each)
  /// Bytes of one batch's query tiles (amx_pack_q): [amx_chunks][hi, lo][16][GB * 4].
  static constexpr std::size_t amx_q_bytes = amx_chunks * 2 * 16 * GB * 4;

  /// The tiles of scores_amx: tmm0 a 64-byte chunk of the 16 K rows (A),
  /// tmm1 / tmm2 the high / low query bytes (B, [16 groups of 4 dims][GB
  /// heads x 4]), tmm3 / tmm4 their int32 sums ([16 rows][GB]).
  static tile_config amx_config() noexcept {
    tile_config c;
    c.rows[0] = 16;
    c.bytes_per_row[0] = 64;
    for (int t = 1; t <= 4; ++t) {
      c.rows[t] = 16;
      c.bytes_per_row[t] = GB * 4;
    }
    return c;
  }

  /// Packs the GB int16 query rows of a batch as B tiles: chunk c, half x
  /// (0 high bytes, 1 low bytes), row r, column g * 4 + i holds byte x of
  /// q[g][64 c + 4 r + i].
  /// @param q [GB] pointers to [D] int16 query rows
  /// @param dst [amx_q_bytes]
  static void amx_pack_q(const std::int16_t* const* q, std::int8_t* dst) noexcept
    requires amx_scores
  {
    for (std::size_t c = 0; c < amx_chunks; ++c)
      for (std::size_t r = 0; r < 16; ++r)
        for (std::size_t g = 0; g < GB; ++g)
          for (std::size_t i = 0; i < 4; ++i) {
            const std::int16_t x = q[g][c * 64 + r * 4 + i];
            const std::size_t at = ((c * 2) * 16 + r) * GB * 4 + g * 4 + i;
            dst[at] = static_cast<std::int8_t>(x >> 8);                                    // signed high byte
            dst[at + 16 * GB * 4] = static_cast<std::int8_t>(static_cast<std::uint8_t>(x));  // unsigned low byte
          }
  }

  /// Copies a block's rows for scores_amx, with vector loads: a tile load
  /// straight from rows still on their way from DRAM stalls the core
  /// (measured: slower than the VNNI kernel; with the copy, faster).
  /// @param k [block] pointers to [D] int8 rows
  /// @param stage [block * D] the rows, contiguous
  static void amx_stage(const T* const* k, std::int8_t* stage) noexcept
    requires amx_scores
  {
    for (std::size_t j = 0; j < block; ++j) __builtin_memcpy(stage + j * D, k[j], D);
  }

  /// scores_int<int16_t> on AMX (the caller holds a tile_scope of amx_config()).
  /// @param qt [amx_q_bytes] the batch's query tiles (amx_pack_q)
  /// @param q_scale [16] lane a: the scale of head a / R
  /// @param stage [block * D] the block's int8 rows (amx_stage)
  /// @param s [block * GB] scores, lane layout
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void scores_amx(const std::int8_t* qt, const float* q_scale, const std::int8_t* stage, float* s,
                         const T* const* pf) noexcept
    requires amx_scores
  {
    _tile_zero(3);
    _tile_zero(4);
    for (std::size_t c = 0; c < amx_chunks; ++c) {
      if (pf != nullptr)
        for (std::size_t j = c * block / amx_chunks; j < (c + 1) * block / amx_chunks; ++j)
          prefetch_row<row_bytes>(pf[j]);
      const std::int8_t* hi = qt + c * 2 * 16 * GB * 4;
      _tile_loadd(0, stage + c * 64, D);
      _tile_loadd(1, hi, GB * 4);
      _tile_loadd(2, hi + 16 * GB * 4, GB * 4);
      _tile_dpbssd(3, 0, 1);
      _tile_dpbsud(4, 0, 2);
    }
    alignas(64) std::int32_t sum_hi[block * GB], sum_lo[block * GB];
    _tile_stored(3, sum_hi, GB * 4);
    _tile_stored(4, sum_lo, GB * 4);
    // [row][head] -> lane layout: lane g * R + r of pass p takes row p * R + r, head g.
    static constexpr auto lane_index = [] {
      std::array<std::int32_t, 16> x{};
      for (std::size_t g = 0; g < GB; ++g)
        for (std::size_t r = 0; r < R; ++r) x[g * R + r] = static_cast<std::int32_t>(r * GB + g);
      return x;
    }();
    const __m512i idx = _mm512_loadu_si512(lane_index.data());
    const __m512 qs = _mm512_load_ps(q_scale);
    for (std::size_t p = 0; p < passes; ++p) {
      const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sum_hi + p * 16), 8),
                                           _mm512_load_si512(sum_lo + p * 16));
      _mm512_store_ps(s + p * width, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(idx, sum)), qs));
    }
  }
#else
  static constexpr bool amx_scores = false;
#endif

  /// int8 values with AVX-512 VNNI (AVX2: `avx2_values`): the block's
  /// probabilities (times the value scales) rounded to int16, one scale per head and block (its largest
  /// probability / 32767), and P.V in integers: VPDPWSSD multiplies two
  /// rows at once (rows j and j + 1 interleaved per column) with the
  /// probability pair (p_j, p_j+1) of each head, so no int8 -> f32
  /// conversion is spent per value. The result is added to the f32 output
  /// once per block (rescaled by alpha like accumulate()).
  static constexpr bool vnni512_values = vnni_int16 && D % 64 == 0 && block % 2 == 0;

  /// acc + VPDPWSSD(a, b), computed in acc's register. GCC 12 compiles the
  /// intrinsic in accumulate_i16's loop as a copy of each accumulator to a
  /// new register before the instruction and back after it (two moves per
  /// dot product, and accumulators spilled to the stack); the asm names the
  /// accumulator as both input and output, so it stays where it is.
  static __m512i dpwssd(__m512i acc, __m512i a, __m512i b) noexcept {
#if defined(__GNUC__) && !defined(__clang__)
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
#else
    return _mm512_dpwssd_epi32(acc, a, b);
#endif
  }

  /// p16 (lane layout, [block * GB] int16) = round(p / p_scale[g]) with
  /// p_scale[g] = max_j p(g, j) / levels (0 for a head whose block is all
  /// 0; levels <= 32767).
  /// @param p [passes] registers of probabilities, lane layout (softmax)
  static void quantize_p(const __m512* p, std::int16_t* p16, float* p_scale, float levels) noexcept
    requires vnni512_values
  {
    const __m512 inv = p_levels(p, levels, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(p[ps], inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16 + ps * width), _mm512_cvtepi32_epi16(q));
    }
  }


  /// o[g] = alpha[g] * o[g] + p_scale[g] * sum_j p16(g, j) * v[j] for g < GB.
  /// @param p16 [block * GB] int16 probabilities, lane layout (quantize_p)
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void accumulate_i16(float* const* o, const float* alpha, const std::int16_t* p16, const float* p_scale,
                             const T* const* v, const T* const* pf) noexcept
    requires vnni512_values
  {
    // Columns in passes of 64 (GB x 4 int32 accumulators of 16 columns).
    for (std::size_t c0 = 0; c0 < D; c0 += 64) {
      __m512i acc[GB][4];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
        for (std::size_t x = 0; x < 4; ++x) acc[g][x] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += 2) {
        if (pf != nullptr) {  // two lines per row pair (D / 64 per row in all)
          prefetch_slot<D / 64, 64>(pf, (c0 / 64) * block + j);
          prefetch_slot<D / 64, 64>(pf, (c0 / 64) * block + j + 1);
        }
        __m512i pw[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) pw[g] = row_group(p16, j, g);
#pragma GCC unroll 2
        for (std::size_t h = 0; h < 2; ++h) {
          const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[j] + c0 + h * 32)));
          const __m512i b =
              _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[j + 1] + c0 + h * 32)));
          // Per 128-bit lane L: lo holds columns 8L .. 8L + 3, hi 8L + 4 .. 8L + 7 (as (row j, row j + 1) pairs).
          const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 4
          for (std::size_t g = 0; g < GB; ++g) {
            acc[g][2 * h] = dpwssd(acc[g][2 * h], lo, pw[g]);
            acc[g][2 * h + 1] = dpwssd(acc[g][2 * h + 1], hi, pw[g]);
          }
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        __m512 sums[4];
#pragma GCC unroll 2
        for (std::size_t h = 0; h < 2; ++h)
          in_column_order(_mm512_cvtepi32_ps(acc[g][2 * h]), _mm512_cvtepi32_ps(acc[g][2 * h + 1]), sums + 2 * h);
        add_pass<4>(o[g] + c0, sums, alpha[g], p_scale[g]);
      }
    }
  }

  /// int8 values with 8-bit probabilities (`decode_params::int8_probabilities`):
  /// VPDPBUSD multiplies four rows at once (rows j .. j + 3 interleaved per
  /// column) with each head's unsigned 8-bit probabilities (p_j .. p_j+3),
  /// 64 products per instruction: half the multiply-adds of
  /// accumulate_i16, and no sign extension of the rows (VPDPBUSD takes
  /// them as signed bytes). The four probabilities of a row quad are
  /// adjacent in the lane layout (`row_group`).
  static constexpr bool vnni512_u8_values = vnni512_values && block % 4 == 0;

  /// p8 (lane layout, [block * GB] uint8) = round(p / p_scale[g]) with
  /// p_scale[g] = max_j p(g, j) / 255 (0 for a head whose block is all 0).
  /// @param p [passes] registers of probabilities, lane layout (softmax)
  static void quantize_p_u8(const __m512* p, std::uint8_t* p8, float* p_scale) noexcept
    requires vnni512_u8_values
  {
    const __m512 inv = p_levels(p, 255.0f, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      // NaN * 0 converts to INT_MIN: the max with 0 keeps it a 0, as the
      // int16 path's truncation does; values above 255 saturate.
      const __m512i q = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(p[ps], inv)), _mm512_setzero_si512());
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p8 + ps * width), _mm512_cvtusepi32_epi8(q));
    }
  }

  /// o[g] = alpha[g] * o[g] + p_scale[g] * sum_j p8(g, j) * v[j] for g < GB.
  /// @param p8 [block * GB] uint8 probabilities, lane layout (quantize_p_u8)
  /// @param p_scale [GB] their steps
  /// @param v [block] pointers to [D] int8 rows (unscaled: the row scales are in p8)
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void accumulate_u8(float* const* o, const float* alpha, const std::uint8_t* p8, const float* p_scale,
                            const T* const* v, const T* const* pf) noexcept
    requires vnni512_u8_values
  {
    // Columns in passes of 64 (GB x 4 int32 accumulators of 16 columns).
    for (std::size_t c0 = 0; c0 < D; c0 += 64) {
      __m512i acc[GB][4];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
        for (std::size_t x = 0; x < 4; ++x) acc[g][x] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += 4) {
        if (pf != nullptr)  // one line per row (D / 64 per row in all)
#pragma GCC unroll 4
          for (std::size_t r = 0; r < 4; ++r) prefetch_slot<D / 64, 64>(pf, (c0 / 64) * block + j + r);
        __m512i pq[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) pq[g] = row_group(p8, j, g);
        __m512i r[4];
#pragma GCC unroll 4
        for (std::size_t x = 0; x < 4; ++x) r[x] = _mm512_loadu_si512(v[j + x] + c0);
        // Per 128-bit lane L: x[k] holds columns 16L + 4k .. 16L + 4k + 3,
        // each as the bytes of rows j .. j + 3.
        const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]), hi01 = _mm512_unpackhi_epi8(r[0], r[1]);
        const __m512i lo23 = _mm512_unpacklo_epi8(r[2], r[3]), hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
        const __m512i x[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                              _mm512_unpacklo_epi16(hi01, hi23), _mm512_unpackhi_epi16(hi01, hi23)};
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 4
          for (std::size_t k = 0; k < 4; ++k) acc[g][k] = dpbusd(acc[g][k], pq[g], x[k]);
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        __m512 sums[4];
        quad_column_order(acc[g], sums);
        add_pass<4>(o[g] + c0, sums, alpha[g], p_scale[g]);
      }
    }
  }

  /// acc + VPDPBUSD(a, b) (a unsigned bytes, b signed), in acc's register
  /// (as dpwssd).
  static __m512i dpbusd(__m512i acc, __m512i a, __m512i b) noexcept {
#if defined(__GNUC__) && !defined(__clang__)
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, a, b);
#endif
  }

  /// The int32 sums of accumulate_u8's four registers as f32 in column
  /// order: register k holds, per 128-bit lane L, columns 16L + 4k ..
  /// 16L + 4k + 3 (a 4 x 4 transpose of 128-bit blocks).
  /// @param cols [4] register x: columns 16x .. 16x + 15
  static void quad_column_order(const __m512i* acc, __m512* cols) noexcept {
    const __m512i i_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i_hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512 f[4];
    for (std::size_t k = 0; k < 4; ++k) f[k] = _mm512_cvtepi32_ps(acc[k]);
    // t: (k0 L0, k1 L0, k0 L1, k1 L1) / (k0 L2, k1 L2, k0 L3, k1 L3); u the same for k2, k3.
    const __m512 t0 = _mm512_permutex2var_ps(f[0], i_lo, f[1]), t1 = _mm512_permutex2var_ps(f[0], i_hi, f[1]);
    const __m512 u0 = _mm512_permutex2var_ps(f[2], i_lo, f[3]), u1 = _mm512_permutex2var_ps(f[2], i_hi, f[3]);
    cols[0] = _mm512_shuffle_f32x4(t0, u0, _MM_SHUFFLE(1, 0, 1, 0));
    cols[1] = _mm512_shuffle_f32x4(t0, u0, _MM_SHUFFLE(3, 2, 3, 2));
    cols[2] = _mm512_shuffle_f32x4(t1, u1, _MM_SHUFFLE(1, 0, 1, 0));
    cols[3] = _mm512_shuffle_f32x4(t1, u1, _MM_SHUFFLE(3, 2, 3, 2));
  }
#else
  static constexpr bool vnni512_values = false;
  static constexpr bool int8_queries_512 = false;
  static constexpr bool amx_scores = false;
  static constexpr bool vnni512_u8_values = false;
#endif

#if defined(__AVX2__)
  /// int8 queries on AVX2 with VNNI (as `int8_queries_512`): VPDPBUSD on
  /// 32 key bytes offset to unsigned, twice the products of VPDPWSSD.
  static constexpr bool int8_queries_avx2 = avx2_vnni && D % 32 == 0;

  /// scores_int on AVX2 (`avx2_int16`): the same exact int32 dot products.
  /// Q = std::int16_t: 16 key values per step (each key register
  /// sign-extended once for the GB heads), VPMADDWD + VPADDD per head, or
  /// VPDPWSSD (`avx2_vnni`); Q = std::int8_t (`int8_queries_avx2`): 32 per
  /// step, offset to unsigned (one XOR), VPDPBUSD, the offset's share
  /// (`q_offset`) taken off after the fold.
  template <class Q>
  static void scores_int(const Q* const* q, const float* q_scale, const std::int32_t* q_offset, const T* const* k,
                         float* s, const T* const* pf) noexcept
    requires(std::is_same_v<Q, std::int16_t> && avx2_int16) || (std::is_same_v<Q, std::int8_t> && int8_queries_avx2)
  {
    static_assert(width == 8, "scores_int (AVX2): one register of 8 lanes per pass");
    constexpr bool bytes = std::is_same_v<Q, std::int8_t>;
    constexpr std::size_t step = bytes ? 32 : 16;  // key values per register
    const __m256 qs = _mm256_load_ps(q_scale);
    [[maybe_unused]] const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (std::size_t p = 0; p < passes; ++p) {
      __m256i acc[width];
#pragma GCC unroll 8
      for (std::size_t a = 0; a < width; ++a) acc[a] = _mm256_setzero_si256();
      // Not unrolled: GCC 12 unrolls the column steps fully, issues every
      // step's products first and spills them to the stack for the adds.
#pragma GCC unroll 1
      for (std::size_t c = 0; c < D / step; ++c) {
        if (pf != nullptr)
          for (std::size_t r = 0; r < R; ++r) prefetch_slot<D / step, step>(pf, (p * (D / step) + c) * R + r);
        __m256i qv[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g)
          qv[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[g] + c * step));
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) {
          const T* row = k[p * R + r] + c * step;
          if constexpr (bytes) {
            const __m256i kv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)), flip);
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) acc[g * R + r] = dpbusd(acc[g * R + r], kv, qv[g]);
          } else {
            const __m256i kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
#pragma GCC unroll 4
            for (std::size_t g = 0; g < GB; ++g) {
              if constexpr (avx2_vnni)
                acc[g * R + r] = dpwssd(acc[g * R + r], kv, qv[g]);
              else
                acc[g * R + r] = _mm256_add_epi32(acc[g * R + r], _mm256_madd_epi16(kv, qv[g]));
            }
          }
        }
      }
      __m256i sums = haddi8(acc);
      if constexpr (bytes) sums = _mm256_sub_epi32(sums, _mm256_load_si256(reinterpret_cast<const __m256i*>(q_offset)));
      _mm256_store_ps(s + p * width, _mm256_mul_ps(_mm256_cvtepi32_ps(sums), qs));
    }
  }

  /// acc + VPDPWSSD(a, b) on 256-bit registers (`avx2_vnni`), in acc's
  /// register (as the AVX-512 dpwssd). Without AVX-512 VL the instruction
  /// must take its VEX encoding (AVX-VNNI; the assembler's default for
  /// these operands is the EVEX one) and registers 0-15.
  static __m256i dpwssd(__m256i acc, __m256i a, __m256i b) noexcept
    requires avx2_vnni
  {
#if defined(__GNUC__) && !defined(__clang__)
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
#else
    asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
#endif
    return acc;
#elif defined(__AVX512VL__) && defined(__AVX512VNNI__)
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#endif
  }

  /// acc + VPDPBUSD(a, b) (a unsigned bytes, b signed) on 256-bit
  /// registers, as dpwssd above.
  static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) noexcept
    requires avx2_vnni
  {
#if defined(__GNUC__) && !defined(__clang__)
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
#else
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
#endif
    return acc;
#elif defined(__AVX512VL__) && defined(__AVX512VNNI__)
    return _mm256_dpbusd_epi32(acc, a, b);
#else
    return _mm256_dpbusd_avx_epi32(acc, a, b);
#endif
  }

  /// The int8 P.V in integers on AVX2 with VNNI (`avx2_vnni`), as on
  /// AVX-512 (`vnni512_values`): the probabilities rounded to int16 per
  /// head and block (`quantize_p`), two value rows interleaved per 256-bit
  /// VPDPWSSD (`accumulate_i16`). The f32 path (`accumulate`) spends two
  /// conversions per 8 values and an FMA per 8 values and head.
  static constexpr bool avx2_values = avx2_vnni && block % 2 == 0;

  /// round(p * inv) as int32, >= 0: NaN * 0 converts to INT_MIN, which the
  /// max with 0 keeps a 0, as the AVX-512 int16 path's truncation does (the
  /// signed or unsigned packs after it would saturate it).
  static __m256i rounded_levels(__m256 p, __m256 inv) noexcept {
    return _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(p, inv)), _mm256_setzero_si256());
  }

  /// quantize_p on AVX2: p16 (lane layout) = round(p / p_scale[g]).
  static void quantize_p(const __m256* p, std::int16_t* p16, float* p_scale, float levels) noexcept
    requires avx2_values
  {
    const __m256 inv = p_levels(p, levels, p_scale);
    for (std::size_t ps = 0; ps < passes; ++ps) {
      const __m256i q = rounded_levels(p[ps], inv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p16 + ps * width),
                       _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
  }

  /// accumulate_i16 on AVX2: o[g] = alpha[g] * o[g] + p_scale[g] * sum_j
  /// p16(g, j) * v[j], in passes of 16 columns (GB x 2 accumulators; each
  /// head's probability pair broadcast where it is used, so the 16
  /// registers hold the accumulators, a row pair and one pair of
  /// probabilities).
  static void accumulate_i16(float* const* o, const float* alpha, const std::int16_t* p16, const float* p_scale,
                             const T* const* v, const T* const* pf) noexcept
    requires avx2_values
  {
    for (std::size_t c0 = 0; c0 < D; c0 += 16) {
      __m256i acc[GB][2];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += 2) {
        if (pf != nullptr) {  // a 16-byte step of each row: a line in four
          prefetch_slot<D / 16, 16>(pf, (c0 / 16) * block + j);
          prefetch_slot<D / 16, 16>(pf, (c0 / 16) * block + j + 1);
        }
        const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v[j] + c0)));
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v[j + 1] + c0)));
        // Per 128-bit half H: lo holds columns 8H .. 8H + 3, hi 8H + 4 .. 8H + 7 (as (row j, row j + 1) pairs).
        const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) {
          const __m256i pw = _mm256_set1_epi32(row_group_bits(p16, j, g));
          acc[g][0] = dpwssd(acc[g][0], lo, pw);
          acc[g][1] = dpwssd(acc[g][1], hi, pw);
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        const __m256 lo = _mm256_cvtepi32_ps(acc[g][0]), hi = _mm256_cvtepi32_ps(acc[g][1]);
        const __m256 cols[2] = {_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31)};
        add_pass<2>(o[g] + c0, cols, alpha[g], p_scale[g]);
      }
    }
  }

  /// int8_probabilities on AVX2 with VNNI (as `vnni512_u8_values`): the
  /// probabilities rounded to uint8 and four value rows interleaved per
  /// 256-bit VPDPBUSD, where `accumulate_i16` takes two per VPDPWSSD on the
  /// same 255 levels (the int32 sums, hence the results, are equal).
  static constexpr bool avx2_u8_values = avx2_values && block % 4 == 0;

  /// quantize_p_u8 on AVX2: p8 = round(p / p_scale[g]) with p_scale[g] =
  /// max_j p(g, j) / 255, in the lane layout or, where `p8_quads`, by row
  /// quads (`row_group_bits`).
  static void quantize_p_u8(const __m256* p, std::uint8_t* p8, float* p_scale) noexcept
    requires avx2_u8_values
  {
    const __m256 inv = p_levels(p, 255.0f, p_scale);
    if constexpr (p8_quads) {
      static_assert(R == 2 && GB == 4 && passes % 2 == 0, "quantize_p_u8: quads from pass pairs of 2 rows x 4 heads");
      for (std::size_t ps = 0; ps < passes; ps += 2) {
        const __m256i a = rounded_levels(p[ps], inv), b = rounded_levels(p[ps + 1], inv);
        // Per 128-bit half H: head 2H's quad (rows of pass ps, then ps + 1)
        // in lo, head 2H + 1's in hi.
        const __m256i lo = _mm256_unpacklo_epi64(a, b), hi = _mm256_unpackhi_epi64(a, b);
        const __m256i w = _mm256_packus_epi32(lo, hi);  // half H: heads 2H, 2H + 1 (uint16)
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p8 + ps / 2 * GB * 4), _mm256_castsi256_si128(bytes));
      }
    } else {
      for (std::size_t ps = 0; ps < passes; ++ps) {
        const __m256i q = rounded_levels(p[ps], inv);
        const __m256i w = _mm256_packus_epi32(q, q);
        const __m256i bytes = _mm256_packus_epi16(w, w);  // half H: lanes 4H .. 4H + 3 in its first dword
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p8 + ps * width),
                         _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1)));
      }
    }
  }

  /// accumulate_u8 on AVX2: o[g] = alpha[g] * o[g] + p_scale[g] * sum_j
  /// p8(g, j) * v[j], in passes of 16 columns: four rows' 16 bytes
  /// interleaved by 128-bit unpacks into two registers of 8 columns (in
  /// column order), GB x 2 accumulators.
  static void accumulate_u8(float* const* o, const float* alpha, const std::uint8_t* p8, const float* p_scale,
                            const T* const* v, const T* const* pf) noexcept
    requires avx2_u8_values
  {
    for (std::size_t c0 = 0; c0 < D; c0 += 16) {
      __m256i acc[GB][2];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (std::size_t j = 0; j < block; j += 4) {
        __m128i r[4];
#pragma GCC unroll 4
        for (std::size_t x = 0; x < 4; ++x) {
          if (pf != nullptr) prefetch_slot<D / 16, 16>(pf, (c0 / 16) * block + j + x);  // a line in four
          r[x] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v[j + x] + c0));
        }
        const __m128i lo01 = _mm_unpacklo_epi8(r[0], r[1]), hi01 = _mm_unpackhi_epi8(r[0], r[1]);
        const __m128i lo23 = _mm_unpacklo_epi8(r[2], r[3]), hi23 = _mm_unpackhi_epi8(r[2], r[3]);
        // x[0]: columns c0 .. c0 + 7, x[1]: c0 + 8 .. c0 + 15, each as the bytes of rows j .. j + 3.
        const __m256i x[2] = {_mm256_set_m128i(_mm_unpackhi_epi16(lo01, lo23), _mm_unpacklo_epi16(lo01, lo23)),
                              _mm256_set_m128i(_mm_unpackhi_epi16(hi01, hi23), _mm_unpacklo_epi16(hi01, hi23))};
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) {
          const __m256i pq = _mm256_set1_epi32(row_group_bits(p8, j, g));
          acc[g][0] = dpbusd(acc[g][0], pq, x[0]);
          acc[g][1] = dpbusd(acc[g][1], pq, x[1]);
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        const __m256 cols[2] = {_mm256_cvtepi32_ps(acc[g][0]), _mm256_cvtepi32_ps(acc[g][1])};
        add_pass<2>(o[g] + c0, cols, alpha[g], p_scale[g]);
      }
    }
  }
#else
  static constexpr bool int8_queries_avx2 = false;
  static constexpr bool avx2_values = false;
  static constexpr bool avx2_u8_values = false;
#endif

  /// The probabilities rounded to int16 and P.V in integers (VPDPWSSD), on
  /// AVX-512 or AVX2 (`quantize_p`, `accumulate_i16`).
  static constexpr bool int16_values = vnni512_values || avx2_values;
  /// int8_probabilities as uint8 and P.V in VPDPBUSD (`quantize_p_u8`,
  /// `accumulate_u8`), on AVX-512 or AVX2.
  static constexpr bool u8_values = vnni512_u8_values || avx2_u8_values;
  /// int8 queries dotted as bytes (VPDPBUSD, `scores_int<std::int8_t>`), on
  /// AVX-512 or AVX2.
  static constexpr bool int8_queries = int8_queries_512 || int8_queries_avx2;

  /// Register b of pass p of a per-row array x ([block]) spread to the lane
  /// layout: lane a gets x[p * R + a % R].
  static V row_lanes(const float* x, std::size_t p, std::size_t b) noexcept {
#if defined(__AVX512F__)
    if constexpr (has_avx512<Arch>) {
      if constexpr (R == 16) return _mm512_loadu_ps(x + p * 16);
      else if constexpr (R == 8) return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(x + p * 8))));
      else return _mm512_broadcast_f32x4(_mm_loadu_ps(x + p * 4));
    }
#endif
#if defined(__AVX2__)
    if constexpr (has_avx2<Arch> && !has_avx512<Arch> && width == L) {
      if constexpr (R == 8) return _mm256_loadu_ps(x + p * 8);
      else if constexpr (R == 4) return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + p * 4));
      else return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + p * 2)));
    }
#endif
    alignas(64) float t[L];
    for (std::size_t i = 0; i < L; ++i) t[i] = x[p * R + (b * L + i) % R];
    return vload<Arch>(t);
  }

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

  /// The online-softmax step of one block: folds the block's scores into
  /// `st`, turns `s` into the probabilities the value kernel multiplies
  /// (times the int8 value scales when `v_scale` is set) and writes the
  /// factor each head's output must be rescaled by to `alpha` ([GB]).
  /// With `p16` set (int8 values with VNNI) the probabilities go to
  /// accumulate_i16 rounded to `p16_levels` levels in int16 (`quantize_p`)
  /// instead of back to `s`; with `p8` set (and u8_values), to
  /// accumulate_u8 rounded to uint8 (`quantize_p_u8`).
  /// @param bias [block] 0 or -inf per row, or null when every row counts
  /// @param k_scale, v_scale [block] int8 row scales, or null
  /// @param p16, p_scale [block * GB] int16 probabilities and [GB] their
  ///        scales, or null
  /// @param p8 [block * GB] uint8 probabilities (scales in p_scale), or null
  /// @param p16_levels 32767, or 255 for int8_probabilities without u8_values
  static void softmax(float* s, state& st, const float* bias, const float* k_scale, const float* v_scale,
                      float softcap, float* alpha, std::int16_t* p16 = nullptr, float* p_scale = nullptr,
                      std::uint8_t* p8 = nullptr, float p16_levels = 32767.0f) noexcept {
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    V mx[regs];
    for (std::size_t b = 0; b < regs; ++b) mx[b] = V(ninf);
    for (std::size_t p = 0; p < passes; ++p)
      for (std::size_t b = 0; b < regs; ++b) {
        float* sp = s + p * width + b * L;
        V x = vload<Arch>(sp);
        if (k_scale != nullptr) x = x * row_lanes(k_scale, p, b);
        if (softcap > 0.0f) x = V(softcap) * vtanh<Arch>(x * V(1.0f / softcap));
        if (bias != nullptr) x = x + row_lanes(bias, p, b);
        vstore<Arch>(sp, x);
        mx[b] = vmax<Arch>(mx[b], x);
      }
    // Per head: the max over its R lanes (and the running max), written
    // back to all of them.
    alignas(64) float m_new[width];
#if defined(__AVX512F__)
    if constexpr (has_avx512<Arch>) {
      vstore<Arch>(m_new, vmax<Arch>(vload<Arch>(st.m), head_max(mx[0])));
    } else
#endif
#if defined(__AVX2__)
    if constexpr (has_avx2<Arch> && !has_avx512<Arch> && width == L) {
      vstore<Arch>(m_new, vmax<Arch>(vload<Arch>(st.m), head_max(mx[0])));
    } else
#endif
    {
      for (std::size_t b = 0; b < regs; ++b) vstore<Arch>(m_new + b * L, mx[b]);
      for (std::size_t g = 0; g < GB; ++g) {
        float m = st.m[g * R];
        for (std::size_t r = 0; r < R; ++r) m = std::max(m, m_new[g * R + r]);
        for (std::size_t r = 0; r < R; ++r) m_new[g * R + r] = m;
      }
    }
    alignas(64) float a_lane[width];
    V shift[regs], sum[regs];
    for (std::size_t b = 0; b < regs; ++b) {
      const V m = vload<Arch>(m_new + b * L);
      shift[b] = vfinite_or_zero<Arch>(m);  // a head that has seen nothing yet: exp(-inf - 0) = 0
      vstore<Arch>(a_lane + b * L, vexp_softmax<Arch>(vload<Arch>(st.m + b * L) - shift[b]));
      vstore<Arch>(st.m + b * L, m);
      sum[b] = V(0.0f);
    }
    V probs[passes * regs];
    for (std::size_t p = 0; p < passes; ++p)
      for (std::size_t b = 0; b < regs; ++b) {
        float* sp = s + p * width + b * L;
        const V e = vexp_softmax<Arch>(vload<Arch>(sp) - shift[b]);
        sum[b] = sum[b] + e;
        probs[p * regs + b] = v_scale != nullptr ? e * row_lanes(v_scale, p, b) : e;
      }
    if constexpr (int16_values) {
      if (p16 != nullptr || p8 != nullptr) {
        typename V::register_type r[passes];
        for (std::size_t p = 0; p < passes; ++p) r[p] = probs[p];
        if (p16 != nullptr) quantize_p(r, p16, p_scale, p16_levels);
        if constexpr (u8_values)
          if (p8 != nullptr) quantize_p_u8(r, p8, p_scale);
      }
    }
    if (p16 == nullptr && p8 == nullptr)
      for (std::size_t x = 0; x < passes * regs; ++x) vstore<Arch>(s + x * L, probs[x]);
    for (std::size_t b = 0; b < regs; ++b)
      vstore<Arch>(st.l + b * L, vload<Arch>(st.l + b * L) * vload<Arch>(a_lane + b * L) + sum[b]);
    for (std::size_t g = 0; g < GB; ++g) alpha[g] = a_lane[g * R];
  }

  /// The probabilities `s` (lane layout, [block * GB]) rounded to the
  /// levels quantize_p_u8 gives them, in f32: the paths without u8_values
  /// multiply the values by the same probabilities
  /// (`decode_params::int8_probabilities`).
  static void round_p_u8(float* s) noexcept {
    for (std::size_t g = 0; g < GB; ++g) {
      float m = 0.0f;
      for (std::size_t p = 0; p < passes; ++p)
        for (std::size_t r = 0; r < R; ++r) m = std::max(m, s[p * width + g * R + r]);
      const float inv = m > 0.0f ? 255.0f / m : 0.0f, step = m * (1.0f / 255.0f);
      for (std::size_t p = 0; p < passes; ++p)
        for (std::size_t r = 0; r < R; ++r) {
          float& x = s[p * width + g * R + r];
          x = std::nearbyint(x * inv) * step;
        }
    }
  }

  /// o[g] = alpha[g] * o[g] + sum_{j < block} p(g, j) * v[j] for g < GB,
  /// p in the lane layout (every v[j] readable).
  /// @param o [GB] pointers to [D] f32 output rows
  /// @param p [block * GB] probabilities, lane layout
  /// @param v [block] pointers to [D] stored rows
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void accumulate(float* const* o, const float* alpha, const float* p, const T* const* v,
                         const T* const* pf) noexcept {
    for (std::size_t c0 = 0; c0 < DV; c0 += H) {
      V acc[GB * H];
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g) {
        const V a(alpha[g]);
#pragma GCC unroll 16
        for (std::size_t c = 0; c < H; ++c) acc[g * H + c] = vload<Arch>(o[g] + (c0 + c) * L) * a;
      }
#pragma GCC unroll 4
      for (std::size_t j = 0; j < block; ++j) {
        const float* pj = p + (j / R) * width + j % R;
        V pg[GB];
#pragma GCC unroll 4
        for (std::size_t g = 0; g < GB; ++g) pg[g] = V(pj[g * R]);
#pragma GCC unroll 16
        for (std::size_t c = 0; c < H; ++c) {
          if (pf != nullptr) prefetch_slot<DV, L * sizeof(T)>(pf, ((c0 / H) * block + j) * H + c);
          const V vv = vheld<Arch>(vload_f32<Arch>(v[j] + (c0 + c) * L));
#pragma GCC unroll 4
          for (std::size_t g = 0; g < GB; ++g) acc[g * H + c] = vfma<Arch>(pg[g], vv, acc[g * H + c]);
        }
      }
#pragma GCC unroll 4
      for (std::size_t g = 0; g < GB; ++g)
#pragma GCC unroll 16
        for (std::size_t c = 0; c < H; ++c) vstore<Arch>(o[g] + (c0 + c) * L, acc[g * H + c]);
    }
  }
};

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
