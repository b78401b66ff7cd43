// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/load_f32.hpp
/// Stored K/V elements (f16, bf16, int8) converted to f32 on any arch, the
/// per-instruction-set loads being simd/'s (x86_lanes.hpp, convert.hpp):
/// - `vload_f32<Arch>`: one register of a stored row, the conversion fused
///   into the load (decode's fused loads);
/// - `row_to_f32_converted<Arch>`: a whole row, scaled for int8.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

/// vload_f32 of a 16-bit or int8 type on an xsimd arch: simd/'s widening
/// loads, one overload per instruction set there (f16: vcvtph2ps where the
/// arch has it; bf16: zero-extend and shift; int8: sign-extend), then one
/// conversion to f32. No arch goes through memory.
template <class Arch, class T>
inline vec<Arch> vload_f32_converted(const T* src) noexcept {
  if constexpr (std::is_same_v<T, f16>) {
    return simd::detail::load_f16_as_f32<Arch>(&src->bits, Arch{});
  } else if constexpr (std::is_same_v<T, bf16>) {
    return xsimd::bitwise_cast<vec<Arch>>(simd::detail::load_u16_as_i32<Arch>(&src->bits, Arch{}) << 16);
  } else {
    static_assert(std::is_same_v<T, std::int8_t>, "vload_f32: unsupported storage type");
    return xsimd::batch_cast<float>(simd::detail::load_i8_as_i32<Arch>(src, Arch{}));
  }
}

/// lanes<Arch> consecutive stored elements at `src` as one f32 register, the
/// conversion fused into the load (f16: vcvtph2ps; bf16: widen and shift;
/// int8: sign-extend and convert, the per-row scale left to the caller).
/// Decode kernels call this once per register of a K/V row and feed the
/// result to every query head of the GQA group, so no converted copy of the
/// row is ever written.
template <class Arch, class T>
inline vec<Arch> vload_f32(const T* src) noexcept {
  if constexpr (simd::is_scalar_v<Arch>) {
    if constexpr (std::is_same_v<T, float>) return scalar_vec(*src);
    else if constexpr (std::is_same_v<T, std::int8_t>) return scalar_vec(static_cast<float>(*src));
    else return scalar_vec(to_f32(*src));
  } else if constexpr (std::is_same_v<T, float>) {
    return vec<Arch>::load_unaligned(src);
  } else {
    return vload_f32_converted<Arch>(src);
  }
}

/// dst[0, n) = src[0, n) converted to f32, times `scale` for int8 (16-bit
/// and int8 storage types): vload_f32 a register at a time, then a scalar
/// tail.
template <class Arch, class T>
inline void row_to_f32_converted(const T* src, float scale, float* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    const vec<Arch> vscale(scale);
    for (; i + lanes<Arch> <= n; i += lanes<Arch>) {
      vec<Arch> x = vload_f32_converted<Arch>(src + i);
      if constexpr (std::is_same_v<T, std::int8_t>) x *= vscale;
      x.store_unaligned(dst + i);
    }
  }
  for (; i < n; ++i) {
    if constexpr (std::is_same_v<T, std::int8_t>) dst[i] = static_cast<float>(src[i]) * scale;
    else dst[i] = to_f32(src[i]);
  }
}

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
