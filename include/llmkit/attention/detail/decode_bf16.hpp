// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/decode_bf16.hpp
/// The bf16 products of decode with AVX512_BF16 (opt-in:
/// `decode_params::bf16_queries`, `bf16_probabilities`): VDPBF16PS on bf16
/// rows as stored, 32 products per instruction, for the scores
/// (`scores_bf16`) and for P.V (`accumulate_bf16`, two rows interleaved per
/// instruction). Elsewhere `bf16_dot` and `bf16_pv` are false.

#include <cstddef>
#include <type_traits>

#include "llmkit/attention/detail/decode_layout.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// Whether bf16 keys of head dim D are dotted in VDPBF16PS on an arch
/// (`decode_bf16_kernels::bf16_dot`): AVX-512 with BF16, which has no xsimd
/// tag of its own (hence the #if).
template <class T, std::size_t D>
constexpr bool bf16_dot_on(requires_arch<xsimd::generic>) noexcept {
  return false;
}
#if defined(__AVX512F__) && defined(__AVX512BF16__)
template <class T, std::size_t D>
constexpr bool bf16_dot_on(requires_arch<xsimd::avx512f>) noexcept {
  return std::is_same_v<T, bf16> && D % 32 == 0;
}
#endif

/// decode_layout plus the bf16 kernels (where the arch has them).
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_bf16_kernels : decode_layout<Arch, D, T, GB> {
  using layout = decode_layout<Arch, D, T, GB>;
  using layout::block, layout::passes, layout::width, layout::R;

  /// bf16 queries (`decode_params::bf16_queries`) against bf16 keys:
  /// VDPBF16PS multiplies a whole 64-byte key register (32 values) with a
  /// head's bf16 queries into 16 f32 sums, where scores()
  /// (decode_kernels.hpp) converts each 16 keys (two instructions) and
  /// spends one FMA per 16: per key register GB multiply-adds instead of
  /// 2 GB + 4 instructions. The products of two
  /// bf16 values are exact in f32, so only the sums' order differs from
  /// scores() given the same rounded queries.
  static constexpr bool bf16_dot = bf16_dot_on<T, D>(simd::kernel_arch<Arch>{});

  /// bf16 probabilities (`decode_params::bf16_probabilities`) and bf16
  /// values: P.V in VDPBF16PS like accumulate_int<std::int16_t> in VPDPWSSD, two rows
  /// interleaved per instruction (rows j and j + 1 per column) against the
  /// pair (p_j, p_j+1) of each head, so no value is converted to f32. The
  /// f32 sums are added to the output once per block.
  static constexpr bool bf16_pv = bf16_dot && D % 64 == 0 && block % 2 == 0;

#if defined(__AVX512F__) && defined(__AVX512BF16__)
  using layout::in_column_order;

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
      _mm512_storeu_ps(s + p * width, simd::detail::haddp16(acc));
    }
  }

  /// o[g] = alpha[g] * o[g] + sum_j pb(g, j) * v[j] for g < GB.
  /// @param pb [block * GB] bf16 probabilities, lane layout
  /// @param v [block] pointers to [D] bf16 rows
  /// @param pf [block] rows to prefetch meanwhile, or null
  static void accumulate_bf16(float* const* o, const float* alpha, const bf16* pb, const T* const* v,
                              const T* const* pf) noexcept
    requires bf16_pv
  {
    // Columns in passes of 64 (GB x 4 f32 accumulators of 16 columns).
    layout::template pv_passes<2, __m512>(
        pb,
        [&](std::size_t j, std::size_t c0, __m512i* x) {
          if (pf != nullptr)  // four lines per row pair (D / 32 per row in all)
            for (std::size_t t = 0; t < 4; ++t) prefetch_slot<D / 32, 64>(pf, (c0 / 64) * block * 2 + 2 * j + t);
#pragma GCC unroll 2
          for (std::size_t h = 0; h < 2; ++h) {
            const __m512i a = _mm512_loadu_si512(v[j] + c0 + h * 32);
            const __m512i b = _mm512_loadu_si512(v[j + 1] + c0 + h * 32);
            x[2 * h] = _mm512_unpacklo_epi16(a, b);
            x[2 * h + 1] = _mm512_unpackhi_epi16(a, b);
          }
        },
        [](__m512 acc, __m512i p, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)p); },
        [&](std::size_t g, std::size_t c0, const __m512* acc) {
          const __m512 a = _mm512_set1_ps(alpha[g]);
#pragma GCC unroll 2
          for (std::size_t h = 0; h < 2; ++h) {
            float* dst = o[g] + c0 + h * 32;
            __m512 sums[2];
            in_column_order(acc[2 * h], acc[2 * h + 1], sums);
#pragma GCC unroll 2
            for (std::size_t x = 0; x < 2; ++x)
              _mm512_storeu_ps(dst + 16 * x, _mm512_fmadd_ps(_mm512_loadu_ps(dst + 16 * x), a, sums[x]));
          }
        });
  }
#endif
};

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
