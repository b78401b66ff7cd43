// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/simd/convert.hpp  Vectorised storage conversions.
///
/// - f32 <-> f16 and f32 <-> bf16: round to nearest even, inf kept, NaN kept
///   as (quiet, for f32 -> 16 bit) NaN; bit-identical to the scalar
///   conversions of llmkit/core/dtype.hpp, except that f16 -> f32 may quiet a
///   signalling NaN (the F16C / AVX-512 instruction does; sign and payload are
///   kept). On x86 the f16 conversions use VCVTPS2PH / VCVTPH2PS when the arch
///   has them (AVX-512F, or AVX2 compiled with F16C), else integer emulation.
/// - Q8_0 blocks (GGUF/ggml layout and semantics): per block of 32 values
///   d = amax / 127, q = round_half_away(x / d) computed as x * (1 / d), the
///   scale stored as f16(d); value = f32(scale) * q.
/// - int8 rows with one symmetric f32 scale (for KV caches): scale = amax / 127
///   (0 for an all-zero row), q = round_half_away(x * (1 / scale)).
/// Quantisers reject non-finite inputs with llmkit::error.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "llmkit/simd/detail/intrinsics.hpp"

#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/batch_ops.hpp"
#include "llmkit/simd/detail/x86_lanes.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::simd {

namespace detail {

/// f32 bit patterns -> f16 bit patterns (in int32 lanes), round to nearest even.
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> f32_to_f16_lanes(const xsimd::batch<float, Arch>& v) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  using batch = xsimd::batch<float, Arch>;
  const ibatch f = xsimd::bitwise_cast<ibatch>(v);
  const ibatch sign = (f >> 16) & ibatch(0x8000);
  const ibatch a = f & ibatch(0x7fffffff);
  // NaN keeps its top payload bits and is quieted; >= 2^16 overflows to inf.
  const ibatch special = xsimd::select(a > ibatch(0x7f800000), ibatch(0x7e00) | ((a >> 13) & ibatch(0x3ff)),
                                       ibatch(0x7c00));
  // Subnormal halves: adding 0.5f rounds to a multiple of 2^-24 (nearest even) in the FPU.
  const ibatch sub = xsimd::bitwise_cast<ibatch>(xsimd::bitwise_cast<batch>(a) + batch(0.5f)) - ibatch(0x3f000000);
  // Normal halves: rebias the exponent and round the 13 dropped bits to nearest even.
  const ibatch odd = (a >> 13) & ibatch(1);
  const ibatch normal = (a + ibatch(static_cast<std::int32_t>(0xc8000fffu)) + odd) >> 13;
  ibatch h = xsimd::select(a < ibatch(0x38800000), sub, normal);
  h = xsimd::select(a >= ibatch(0x47800000), special, h);
  return h | sign;
}

/// f16 bit patterns (in int32 lanes) -> f32, exact.
template <class Arch>
inline xsimd::batch<float, Arch> f16_lanes_to_f32(const xsimd::batch<std::int32_t, Arch>& h) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  using batch = xsimd::batch<float, Arch>;
  const ibatch sign = (h & ibatch(0x8000)) << 16;
  ibatch o = (h & ibatch(0x7fff)) << 13;
  const ibatch e = o & ibatch(0x0f800000);
  o = o + ibatch((127 - 15) << 23);
  const ibatch inf_nan = o + ibatch((128 - 16) << 23);
  // Zero / subnormal: give it exponent 2^-14 and subtract 2^-14 in the FPU (exact).
  const batch sub = xsimd::bitwise_cast<batch>(o + ibatch(1 << 23)) - xsimd::bitwise_cast<batch>(ibatch(113 << 23));
  o = xsimd::select(e == ibatch(0x0f800000), inf_nan, o);
  o = xsimd::select(e == ibatch(0), xsimd::bitwise_cast<ibatch>(sub), o);
  return xsimd::bitwise_cast<batch>(o | sign);
}

/// f32 -> bf16 bit patterns (in int32 lanes), round to nearest even, NaN
/// quieted; one overload per instruction set (`f32_to_bf16_lanes<Arch>(v, Arch{})`).
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> f32_to_bf16_lanes(const xsimd::batch<float, Arch>& v,
                                                          requires_arch<xsimd::generic>) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  const ibatch x = xsimd::bitwise_cast<ibatch>(v);
  const ibatch hi = (x >> 16) & ibatch(0xffff);
  const ibatch rounded = ((x + ibatch(0x7fff) + (hi & ibatch(1))) >> 16) & ibatch(0xffff);
  return xsimd::select((x & ibatch(0x7fffffff)) > ibatch(0x7f800000), hi | ibatch(0x40), rounded);
}

#if defined(__AVX512F__)
/// The same operations in AVX-512 intrinsics: logical shifts need no mask
/// and the NaN lanes are one masked move, where xsimd 8.1 emulates both.
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> f32_to_bf16_lanes(const xsimd::batch<float, Arch>& v,
                                                          requires_arch<xsimd::avx512f>) noexcept {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)),
                                       _mm512_and_si512(hi, _mm512_set1_epi32(1)));
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(sum, 16), nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
#endif

/// Largest |x[i]| of n values; sets `finite` false if any value is inf or
/// NaN (the value returned then is not to be used). The magnitudes are
/// compared as integers: the bit patterns of non-negative floats order like
/// their values, and every inf / NaN pattern lies above the largest finite
/// one, so one AND and one integer max per register (two chains) find both.
template <class Arch>
inline float abs_max(const float* x, std::size_t n, bool& finite) noexcept {
  constexpr std::int32_t magnitude = 0x7fffffff, inf_bits = 0x7f800000;
  std::int32_t bits = 0;
  std::size_t i = 0;
  if constexpr (!is_scalar_v<Arch>) {
    using batch = xsimd::batch<float, Arch>;
    using ibatch = xsimd::batch<std::int32_t, Arch>;
    constexpr std::size_t lanes = batch::size;
    const ibatch mask(magnitude);
    const auto mag = [&](std::size_t at) { return xsimd::bitwise_cast<ibatch>(batch::load_unaligned(x + at)) & mask; };
    ibatch m0(0), m1(0);
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      m0 = xsimd::max(m0, mag(i));
      m1 = xsimd::max(m1, mag(i + lanes));
    }
    if (i + lanes <= n) {
      m0 = xsimd::max(m0, mag(i));
      i += lanes;
    }
    bits = hmax<Arch>(xsimd::max(m0, m1), Arch{});
  }
  for (; i < n; ++i) bits = std::max(bits, std::bit_cast<std::int32_t>(x[i]) & magnitude);
  finite = bits < inf_bits;
  return std::bit_cast<float>(bits);
}

/// True when no x[i] (i < n) is inf or NaN (abs_max's test alone).
template <class Arch>
inline bool all_finite(const float* x, std::size_t n) noexcept {
  bool finite = true;
  abs_max<Arch>(x, n, finite);
  return finite;
}

/// round_half_away(v) as int32 for |v| <= 128: v + copysign(0.5 - 2^-25, v),
/// truncated. Exact there (checked against std::round for every float of
/// that range, docs/simd.md); two instructions and the conversion, where
/// xsimd::round took nine (AVX-512, GCC 12). `v` has two uses (its sign and the sum), so
/// GCC does not fuse the product that made it into the add, even under
/// -ffp-contract=fast (checked in quantize_i8's code with -std=gnu++20).
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> round_half_away_small(const xsimd::batch<float, Arch>& v) noexcept {
  using batch = xsimd::batch<float, Arch>;
  const batch sign(-0.0f), below_half(0.49999997f);
  return xsimd::batch_cast<std::int32_t>(v + ((v & sign) | below_half));
}

/// out[i] = round_half_away(x[i] * inv_scale) as int8 (|x[i] * inv_scale| <= 127.5 by construction).
template <class Arch>
inline void quantize_round(const float* x, std::size_t n, float inv_scale, std::int8_t* out) noexcept {
  std::size_t i = 0;
  if constexpr (!is_scalar_v<Arch>) {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch vs(inv_scale);
    for (; i + lanes <= n; i += lanes)
      store_i32_as_i8<Arch>(round_half_away_small<Arch>(batch::load_unaligned(x + i) * vs), out + i, Arch{});
  }
  for (; i < n; ++i) out[i] = static_cast<std::int8_t>(std::round(x[i] * inv_scale));
}

/// out[i] = scale * q[i].
template <class Arch>
inline void dequantize_scaled(const std::int8_t* q, std::size_t n, float scale, float* out) noexcept {
  std::size_t i = 0;
  if constexpr (!is_scalar_v<Arch>) {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t lanes = batch::size;
    const batch vs(scale);
    for (; i + lanes <= n; i += lanes)
      (xsimd::batch_cast<float>(load_i8_as_i32<Arch>(q + i, Arch{})) * vs).store_unaligned(out + i);
  }
  for (; i < n; ++i) out[i] = scale * static_cast<float>(q[i]);
}

/// v's lanes as f16 at p, one overload per instruction set
/// (`store_f32_as_f16<Arch>(v, p, Arch{})`): the hardware instruction where
/// the arch has one (AVX-512F; F16C next to AVX2), else this integer
/// emulation. As an overload of its own the emulation is not even
/// instantiated where the instruction exists (xsimd 8.1's integer select on
/// avx512bw does not compile under strict -std=c++20, only gnu++20).
template <class Arch>
inline void store_f32_as_f16(const xsimd::batch<float, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::generic>) noexcept {
  store_i32_as_u16<Arch>(f32_to_f16_lanes<Arch>(v), p, Arch{});
}

/// batch::size f16 values at p as f32, exact (the hardware instruction may
/// quiet a signalling NaN); one overload per instruction set, as
/// store_f32_as_f16.
template <class Arch>
inline xsimd::batch<float, Arch> load_f16_as_f32(const std::uint16_t* p, requires_arch<xsimd::generic>) noexcept {
  return f16_lanes_to_f32<Arch>(load_u16_as_i32<Arch>(p, Arch{}));
}

#if defined(__AVX2__) && defined(__F16C__)
template <class Arch>
inline void store_f32_as_f16(const xsimd::batch<float, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::avx2>) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <class Arch>
inline xsimd::batch<float, Arch> load_f16_as_f32(const std::uint16_t* p, requires_arch<xsimd::avx2>) noexcept {
  return xsimd::batch<float, Arch>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#endif

#if defined(__AVX512F__)
template <class Arch>
inline void store_f32_as_f16(const xsimd::batch<float, Arch>& v, std::uint16_t* p,
                             requires_arch<xsimd::avx512f>) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <class Arch>
inline xsimd::batch<float, Arch> load_f16_as_f32(const std::uint16_t* p, requires_arch<xsimd::avx512f>) noexcept {
  return xsimd::batch<float, Arch>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
#endif

/// Q8_0 block kernels: exactly 32 values, so the vector loops need no tail.
template <class Arch>
inline float block_abs_max(const float* x, bool& finite) noexcept {
  return abs_max<Arch>(x, q8_block_size, finite);
}

/// quantize_round's loop with the block's constant length, so the compiler
/// sees a loop without a tail (GCC 12 does not inline quantize_round here).
template <class Arch>
inline void block_quantize(const float* x, float inv_scale, std::int8_t* out) noexcept {
  if constexpr (is_scalar_v<Arch> || q8_block_size % float_lanes<Arch> != 0) {
    quantize_round<Arch>(x, q8_block_size, inv_scale, out);
  } else {
    using batch = xsimd::batch<float, Arch>;
    const batch vs(inv_scale);
    for (std::size_t i = 0; i < q8_block_size; i += batch::size)
      store_i32_as_i8<Arch>(round_half_away_small<Arch>(batch::load_unaligned(x + i) * vs), out + i, Arch{});
  }
}

template <class Arch>
inline void block_dequantize(const std::int8_t* q, float scale, float* out) noexcept {
  if constexpr (is_scalar_v<Arch> || q8_block_size % float_lanes<Arch> != 0) {
    dequantize_scaled<Arch>(q, q8_block_size, scale, out);
  } else {
    using batch = xsimd::batch<float, Arch>;
    const batch vs(scale);
    for (std::size_t i = 0; i < q8_block_size; i += batch::size)
      (xsimd::batch_cast<float>(load_i8_as_i32<Arch>(q + i, Arch{})) * vs).store_unaligned(out + i);
  }
}

}  // namespace detail

namespace detail {

/// The loop every element-wise conversion shares: checks the sizes, runs
/// `vector_step(Arch{}, in_ptr, out_ptr)` (a generic lambda taking the arch
/// as its first argument, so that its body is never instantiated for the
/// scalar arch) on whole batches of Arch's float lane count
/// (skipped for the scalar arch), then `out[i] = scalar_step(in[i])` on the
/// tail.
template <class Arch, class In, class Out, class VectorStep, class ScalarStep>
inline void convert_elementwise(std::span<const In> in, std::span<Out> out, VectorStep vector_step,
                                ScalarStep scalar_step) {
  LLMKIT_CHECK(in.size() == out.size(), "convert: in.size() = ", in.size(), " differs from out.size() = ",
               out.size());
  const std::size_t n = in.size();
  std::size_t i = 0;
  if constexpr (!is_scalar_v<Arch>) {
    constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
    for (; i + lanes <= n; i += lanes) vector_step(Arch{}, in.data() + i, out.data() + i);
  }
  for (; i < n; ++i) out[i] = scalar_step(in[i]);
}

}  // namespace detail

/// out[i] = f16(in[i]), round to nearest even. @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void convert(std::span<const float> in, std::span<f16> out) {
  detail::convert_elementwise<Arch>(
      in, out,
      [](auto arch, const float* x, f16* y) {
        using A = decltype(arch);
        detail::store_f32_as_f16<A>(xsimd::batch<float, A>::load_unaligned(x), &y->bits, arch);
      },
      [](float x) { return to_f16(x); });
}

/// out[i] = bf16(in[i]), round to nearest even. @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void convert(std::span<const float> in, std::span<bf16> out) {
  detail::convert_elementwise<Arch>(
      in, out,
      [](auto arch, const float* x, bf16* y) {
        using A = decltype(arch);
        detail::store_i32_as_u16<A>(detail::f32_to_bf16_lanes<A>(xsimd::batch<float, A>::load_unaligned(x), arch),
                                    &y->bits, arch);
      },
      [](float x) { return to_bf16(x); });
}

/// out[i] = f32(in[i]) (exact). @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void convert(std::span<const f16> in, std::span<float> out) {
  detail::convert_elementwise<Arch>(
      in, out,
      [](auto arch, const f16* x, float* y) {
        using A = decltype(arch);
        detail::load_f16_as_f32<A>(&x->bits, arch).store_unaligned(y);
      },
      [](f16 x) { return to_f32(x); });
}

/// out[i] = f32(in[i]) (exact). @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void convert(std::span<const bf16> in, std::span<float> out) {
  detail::convert_elementwise<Arch>(
      in, out,
      [](auto arch, const bf16* x, float* y) {
        using A = decltype(arch);
        const auto bits = detail::load_u16_as_i32<A>(&x->bits, arch) << 16;
        xsimd::bitwise_cast<xsimd::batch<float, A>>(bits).store_unaligned(y);
      },
      [](bf16 x) { return to_f32(x); });
}

/// Quantises to GGUF Q8_0 blocks (see the file comment for the rounding).
/// @pre in.size() % 32 == 0; out.size() == in.size() / 32; every in[i] finite
/// ([n] in, [n / 32] out)
template <class Arch = default_arch>
void quantize_q8_0(std::span<const float> in, std::span<block_q8_0> out) {
  LLMKIT_CHECK(in.size() % q8_block_size == 0, "quantize_q8_0: in.size() = ", in.size(),
               " is not a multiple of the block size 32");
  LLMKIT_CHECK(out.size() == in.size() / q8_block_size, "quantize_q8_0: out.size() = ", out.size(),
               " differs from in.size() / 32 = ", in.size() / q8_block_size);
  for (std::size_t b = 0; b < out.size(); ++b) {
    const float* x = in.data() + b * q8_block_size;
    bool finite = true;
    const float amax = detail::block_abs_max<Arch>(x, finite);
    LLMKIT_CHECK(finite, "quantize_q8_0: block ", b, " (in[", b * q8_block_size, ", ", (b + 1) * q8_block_size,
                 ")) holds a non-finite value");
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].scale = to_f16(d);
    detail::block_quantize<Arch>(x, id, out[b].qs);
  }
}

/// Expands Q8_0 blocks: out[32 b + j] = f32(in[b].scale) * in[b].qs[j].
/// @pre out.size() == in.size() * 32  ([n_blocks] in, [n_blocks * 32] out)
template <class Arch = default_arch>
void dequantize_q8_0(std::span<const block_q8_0> in, std::span<float> out) {
  LLMKIT_CHECK(out.size() == in.size() * q8_block_size, "dequantize_q8_0: out.size() = ", out.size(),
               " differs from in.size() * 32 = ", in.size() * q8_block_size);
  for (std::size_t b = 0; b < in.size(); ++b)
    detail::block_dequantize<Arch>(in[b].qs, to_f32(in[b].scale), out.data() + b * q8_block_size);
}

/// Symmetric int8 quantisation of one row; returns its scale (amax / 127, or 0
/// for an all-zero row) so that in[i] ~= scale * out[i].
/// @pre in.size() == out.size(); every in[i] finite  ([n] in, [n] out)
template <class Arch = default_arch>
float quantize_i8(std::span<const float> in, std::span<std::int8_t> out) {
  LLMKIT_CHECK(in.size() == out.size(), "quantize_i8: in.size() = ", in.size(), " differs from out.size() = ",
               out.size());
  bool finite = true;
  const float amax = detail::abs_max<Arch>(in.data(), in.size(), finite);
  LLMKIT_CHECK(finite, "quantize_i8: in holds a non-finite value");
  const float scale = amax / 127.0f;
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  detail::quantize_round<Arch>(in.data(), in.size(), inv, out.data());
  return scale;
}

/// out[i] = scale * in[i].  @pre in.size() == out.size()  ([n] in, [n] out)
template <class Arch = default_arch>
void dequantize_i8(std::span<const std::int8_t> in, float scale, std::span<float> out) {
  LLMKIT_CHECK(in.size() == out.size(), "dequantize_i8: in.size() = ", in.size(), " differs from out.size() = ",
               out.size());
  detail::dequantize_scaled<Arch>(in.data(), in.size(), scale, out.data());
}

}  // namespace llmkit::simd

LLMKIT_SIMD_DIAGNOSTICS_END
