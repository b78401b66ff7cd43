// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/dtype.hpp
/// Storage types: IEEE half (`f16`), bfloat16 (`bf16`) and GGUF's Q8_0 block
/// (`block_q8_0`: 32 int8 values with one f16 scale), their scalar
/// conversions to and from f32, and the `dtype` tag that names them at run
/// time. Vectorised conversions live in llmkit/simd/convert.hpp; the scalar
/// ones here are their reference and fall-back.
///
/// Rounding is to nearest, ties to even; infinities and NaNs are kept (NaN
/// stays NaN, quieted), values beyond the f16 range become +-inf.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llmkit {

/// IEEE 754 binary16, stored as its bit pattern.
struct f16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(f16, f16) = default;
};

/// bfloat16 (the top half of an f32), stored as its bit pattern.
struct bf16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(bf16, bf16) = default;
};

/// Values per Q8_0 block (GGUF/ggml layout).
inline constexpr std::size_t q8_block_size = 32;

/// One Q8_0 block as stored in GGUF files: value[i] = scale * qs[i].
struct block_q8_0 {
  f16 scale;
  std::int8_t qs[q8_block_size];
};
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must match the GGUF layout");

/// Run-time name of a storage type.
enum class dtype : std::uint8_t { f32, f16, bf16, q8_0, i8 };

/// Printable name of a dtype ("f32", "f16", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::q8_0: return "q8_0";
    case dtype::i8: return "i8";
  }
  return "?";
}

/// f32 -> f16 bits, round to nearest even; NaN -> quiet NaN, overflow -> inf.
constexpr std::uint16_t f32_to_f16_bits(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  if (a >= 0x38800000u) {  // a normal half (>= 2^-14)
    const std::uint32_t mantissa = a & 0x7fffffu;
    const std::uint32_t exponent = (a >> 23) - 127 + 15;
    std::uint32_t h = (exponent << 10) | (mantissa >> 13);
    const std::uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
    return static_cast<std::uint16_t>(sign | h);
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25 ties to 0)
  // Subnormal half: units of 2^-24.
  const std::uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - (a >> 23);  // 14..24
  std::uint32_t h = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// f16 bits -> f32 (exact).
constexpr float f16_bits_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/// f32 -> bf16 bits, round to nearest even; NaN -> quiet NaN.
constexpr std::uint16_t f32_to_bf16_bits(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// bf16 bits -> f32 (exact).
constexpr float bf16_bits_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

constexpr f16 to_f16(float v) noexcept { return f16{f32_to_f16_bits(v)}; }
constexpr bf16 to_bf16(float v) noexcept { return bf16{f32_to_bf16_bits(v)}; }
constexpr float to_f32(f16 v) noexcept { return f16_bits_to_f32(v.bits); }
constexpr float to_f32(bf16 v) noexcept { return bf16_bits_to_f32(v.bits); }
constexpr float to_f32(float v) noexcept { return v; }

}  // namespace llmkit
