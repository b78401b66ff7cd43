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
///   with one haddp per pass. The scores stay in that "lane layout"
///   (decode_layout.hpp), so the softmax runs on whole registers for all
///   heads of the batch at once (one exp per register, one for the rescale
///   factors) and the value kernel reads each probability at a
///   compile-time offset;
/// - the value kernel streams the block's rows through GB x H output
///   registers, the GB probabilities of a row held in registers (int8
///   values with VNNI: the probabilities rounded to int16 per block and
///   head, two rows multiplied per VPDPWSSD, `accumulate_int<std::int16_t>`; with
///   `int8_probabilities` rounded to uint8, four rows per VPDPBUSD,
///   `accumulate_int<std::uint8_t>`; bf16 values with bf16 probabilities: two rows per
///   VDPBF16PS, `accumulate_bf16`).
///
/// The kernels are one class per idea, each deriving from the one before,
/// so `decode_kernels<Arch, D, T, GB>` holds them all:
/// - decode_layout.hpp: block and pass shapes, the softmax state, the lane
///   layout's helpers;
/// - decode_bf16.hpp: the bf16 products (AVX512_BF16);
/// - decode_int8_avx512.hpp / decode_int8_avx2.hpp: the int8 kernels in
///   integers (`decode_int8_kernels` picks the arch's);
/// - this header: the f32 scores and P.V for every storage type and arch
///   (`scores`, `accumulate`) and the online softmax between them.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/attention/detail/decode_int8_avx2.hpp"
#include "llmkit/attention/detail/decode_int8_avx512.hpp"
#include "llmkit/attention/detail/kernel_simd.hpp"
#include "llmkit/attention/detail/kv_rows.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

#include "llmkit/simd/detail/intrinsics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// The int8 kernels of `Arch`: the class its tag's `decode_int8_kernels_of`
/// overload names (AVX-512's, or AVX2's, whose flags are all false on an
/// arch without AVX2).
template <class Arch, std::size_t D, class T, std::size_t GB>
using decode_int8_kernels = decltype(decode_int8_kernels_of<Arch, D, T, GB>(simd::kernel_arch<Arch>{}));

/// Kernels for head dim D over storage type T, GB query heads per pass.
template <class Arch, std::size_t D, class T, std::size_t GB>
struct decode_kernels : decode_int8_kernels<Arch, D, T, GB> {
  using layout = decode_layout<Arch, D, T, GB>;
  using int8 = decode_int8_kernels<Arch, D, T, GB>;
  using V = vec<Arch>;
  using state = typename layout::state;
  using layout::L, layout::block, layout::width, layout::R, layout::passes, layout::regs, layout::DV, layout::H;
  using layout::row_lanes;
  using int8::int16_values, int8::u8_values;

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

  /// m_new (lane layout) = per head, the larger of its running max m (lane
  /// layout) and the max over its R lanes of the block's scores' maxima mx
  /// ([regs] registers).
  static void running_max(const float* m, const V* mx, float* m_new, requires_arch<xsimd::generic>) noexcept {
    for (std::size_t b = 0; b < regs; ++b) vstore<Arch>(m_new + b * L, mx[b]);
    for (std::size_t g = 0; g < GB; ++g) {
      float mg = m[g * R];
      for (std::size_t r = 0; r < R; ++r) mg = std::max(mg, m_new[g * R + r]);
      for (std::size_t r = 0; r < R; ++r) m_new[g * R + r] = mg;
    }
  }

#if defined(__AVX2__)
  /// running_max where one AVX2 register holds a whole pass (width == L).
  static void running_max(const float* m, const V* mx, float* m_new, requires_arch<xsimd::avx2>) noexcept {
    if constexpr (width == L) vstore<Arch>(m_new, vmax<Arch>(vload<Arch>(m), layout::head_max(mx[0])));
    else running_max(m, mx, m_new, xsimd::generic{});
  }
#endif

#if defined(__AVX512F__)
  static void running_max(const float* m, const V* mx, float* m_new, requires_arch<xsimd::avx512f>) noexcept {
    vstore<Arch>(m_new, vmax<Arch>(vload<Arch>(m), layout::head_max(mx[0])));
  }
#endif

  /// The online-softmax step of one block: folds the block's scores into
  /// `st`, turns `s` into the probabilities the value kernel multiplies
  /// (times the int8 value scales when `v_scale` is set) and writes the
  /// factor each head's output must be rescaled by to `alpha` ([GB]).
  /// With `p16` set (int8 values with VNNI) the probabilities go to
  /// accumulate_int<std::int16_t> rounded to `p16_levels` levels in int16 (`quantize_p`)
  /// instead of back to `s`; with `p8` set (and u8_values), to
  /// accumulate_int<std::uint8_t> rounded to uint8 (`quantize_p_u8`).
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
    running_max(st.m, mx, m_new, simd::kernel_arch<Arch>{});
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
        if (p16 != nullptr) int8::quantize_p(r, p16, p_scale, p16_levels);
        if constexpr (u8_values)
          if (p8 != nullptr) int8::quantize_p_u8(r, p8, p_scale);
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
