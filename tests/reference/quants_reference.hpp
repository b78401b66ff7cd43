// SPDX-License-Identifier: MIT
#pragma once
// Oracle for model/quants.hpp: value i of a quantised tensor, read straight
// from the file's bytes at the offsets the ggml block layouts define (no
// block structs), in the f32 arithmetic that defines each type's value.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <llmkit/core/dtype.hpp>
#include <llmkit/model/gguf.hpp>

namespace llmkit::reference {

inline float f16_at(const std::byte* p) {
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return f16_bits_to_f32(b);
}
inline unsigned byte_at(const std::byte* p, std::size_t i) { return std::to_integer<unsigned>(p[i]); }

// Nibble of value j (0..31) of a 32-value block whose 16 bytes start at qs.
inline unsigned nibble32(const std::byte* qs, std::size_t j) {
  return j < 16 ? byte_at(qs, j) & 15 : byte_at(qs, j - 16) >> 4;
}
// 6-bit scale (which = 0) or min (which = 1) of sub-block s of a Q4_K/Q5_K
// block's 12 scale bytes.
inline unsigned k_field(const std::byte* sc, std::size_t s, int which) {
  if (s < 4) return byte_at(sc, s + 4 * which) & 63;
  const unsigned low4 = which == 0 ? byte_at(sc, s + 4) & 15 : byte_at(sc, s + 4) >> 4;
  const unsigned high2 = byte_at(sc, which == 0 ? s - 4 : s) >> 6;
  return low4 | (high2 << 4);
}

// ggml's kvalues_iq4nl, written out here rather than taken from the library.
inline constexpr int iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/// Value i of a tensor of quantised type t whose data start at `data`.
inline float quant_value(model::ggml_type t, const std::byte* data, std::size_t i) {
  using model::ggml_type;
  switch (t) {
    case ggml_type::q8_0: {
      const std::byte* b = data + (i / 32) * 34;
      return f16_at(b) * float(static_cast<std::int8_t>(byte_at(b, 2 + i % 32)));
    }
    case ggml_type::q4_0: {
      const std::byte* b = data + (i / 32) * 18;
      return f16_at(b) * float(int(nibble32(b + 2, i % 32)) - 8);
    }
    case ggml_type::q4_1: {
      const std::byte* b = data + (i / 32) * 20;
      return std::fma(f16_at(b), float(nibble32(b + 4, i % 32)), f16_at(b + 2));
    }
    case ggml_type::q5_0:
    case ggml_type::q5_1: {
      const bool with_min = t == ggml_type::q5_1;
      const std::size_t bytes = with_min ? 24 : 22, qh_at = with_min ? 4 : 2, j = i % 32;
      const std::byte* b = data + (i / 32) * bytes;
      const unsigned high = (byte_at(b, qh_at + j / 8) >> (j % 8)) & 1;
      const unsigned q = nibble32(b + qh_at + 4, j) | (high << 4);
      return with_min ? std::fma(f16_at(b), float(q), f16_at(b + 2)) : f16_at(b) * float(int(q) - 16);
    }
    case ggml_type::q4_k:
    case ggml_type::q5_k: {
      const bool five = t == ggml_type::q5_k;
      const std::byte* b = data + (i / 256) * (five ? 176 : 144);
      const std::size_t j = i % 256, s = j / 32, c = j / 64, l = j % 32;
      const std::byte* qs = b + (five ? 48 : 16);
      unsigned q = (j % 64) < 32 ? byte_at(qs, 32 * c + l) & 15 : byte_at(qs, 32 * c + l) >> 4;
      if (five) q |= ((byte_at(b + 16, l) >> (2 * c + ((j % 64) < 32 ? 0 : 1))) & 1) << 4;
      const float scale = f16_at(b) * float(k_field(b + 4, s, 0));
      const float min = f16_at(b + 2) * float(k_field(b + 4, s, 1));
      return std::fma(scale, float(q), -min);
    }
    case ggml_type::q6_k: {
      const std::byte* b = data + (i / 256) * 210;
      const std::size_t j = i % 256, h = j / 128, r = (j % 128) / 32, l = j % 32;
      const unsigned low_byte = byte_at(b, 64 * h + l + 32 * (r % 2));
      const unsigned low = r < 2 ? low_byte & 15 : low_byte >> 4;
      const unsigned high = (byte_at(b + 128, 32 * h + l) >> (2 * r)) & 3;
      const int q = int(low | (high << 4)) - 32;
      const float scale = f16_at(b + 208) * float(static_cast<std::int8_t>(byte_at(b + 192, j / 16)));
      return scale * float(q);
    }
    case ggml_type::q2_k:
    case ggml_type::q3_k: {
      // Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82.
      // Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108.
      const bool three = t == ggml_type::q3_k;
      const std::byte* b = data + (i / 256) * (three ? 110 : 84);
      const std::size_t j = i % 256, h = j / 128, r = (j % 128) / 32, l = j % 32, s = j / 16;
      const unsigned crumb = (byte_at(b + (three ? 32 : 16), 32 * h + l) >> (2 * r)) & 3;
      if (!three) {
        const unsigned sm = byte_at(b, s);
        return std::fma(f16_at(b + 80) * float(sm & 15), float(crumb), -(f16_at(b + 82) * float(sm >> 4)));
      }
      const unsigned high_bit = (byte_at(b, l) >> (4 * h + r)) & 1;
      const unsigned low4 = s < 8 ? byte_at(b + 96, s) & 15 : byte_at(b + 96, s - 8) >> 4;
      const unsigned high2 = (byte_at(b + 96, 8 + s % 4) >> (2 * (s / 4))) & 3;
      const int scale = int(low4 | (high2 << 4)) - 32;
      return (f16_at(b + 108) * float(scale)) * float(int(crumb + 4 * high_bit) - 4);
    }
    case ggml_type::iq4_nl: {
      const std::byte* b = data + (i / 32) * 18;
      return f16_at(b) * float(iq4nl_levels[nibble32(b + 2, i % 32)]);
    }
    case ggml_type::iq4_xs: {
      // d @0, scales_h (u16 LE) @2, scales_l[4] @4, qs[128] @8.
      const std::byte* b = data + (i / 256) * 136;
      const std::size_t j = i % 256, s = j / 32;
      const unsigned scales_h = byte_at(b, 2) | (byte_at(b, 3) << 8);
      const unsigned low4 = (byte_at(b + 4, s / 2) >> (4 * (s % 2))) & 15;
      const int scale = int(low4 | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
      return (f16_at(b) * float(scale)) * float(iq4nl_levels[nibble32(b + 8 + 16 * s, j % 32)]);
    }
    case ggml_type::mxfp4: {
      // e (E8M0) @0, qs[16] @1; value = E2M1(nibble) * 2^(e - 127), from the
      // OCP spec's bit fields rather than a table (exact in double).
      const std::byte* b = data + (i / 32) * 17;
      const unsigned q = nibble32(b + 1, i % 32), exponent = (q >> 1) & 3, mantissa = q & 1;
      const double e2m1 = exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, int(exponent) - 1);
      // The spec's -0 (nibble 8) decodes as +0, as ggml's table has it.
      const double v = q & 8 && mantissa + exponent != 0 ? -e2m1 : e2m1;
      return float(v * std::ldexp(1.0, int(byte_at(b, 0)) - 127));
    }
    default: return NAN;
  }
}

/// Rounds 256 activations to int8 q as assign_k does (scale amax / 127,
/// round half away from zero); returns the scale.
inline float round_k_activations(const float* xb, long (&q)[256]) {
  float amax = 0.0f;
  for (std::size_t j = 0; j < 256; ++j) amax = std::max(amax, std::abs(xb[j]));
  const float dx = amax / 127.0f, inv = dx != 0.0f ? 1.0f / dx : 0.0f;
  for (std::size_t j = 0; j < 256; ++j) q[j] = long(std::round(xb[j] * inv));
  return dx;
}

/// Value j (0..255) of a K-quant or IQ4_XS super-block at b as the signed
/// integer its sub-block scale multiplies (Q6_K: u - 32, Q3_K: crumb + 4 h - 4,
/// IQ4_XS: the level; Q2_K, Q4_K, Q5_K: u, their minimums apart).
inline long kquant_int_value(model::ggml_type t, const std::byte* b, std::size_t j) {
  using model::ggml_type;
  const std::size_t h = j / 128, r = (j % 128) / 32, l = j % 32;
  switch (t) {
    case ggml_type::q4_k:
    case ggml_type::q5_k: {
      const bool q5 = t == ggml_type::q5_k;
      const std::size_t s = j / 32, c = s / 2;  // byte l of chunk c, low nibble for even s
      unsigned u = byte_at(b + (q5 ? 48 : 16), 32 * c + l);
      u = s % 2 == 0 ? u & 15 : u >> 4;
      if (q5) u |= ((byte_at(b + 16, l) >> s) & 1) << 4;
      return long(u);
    }
    case ggml_type::q6_k: {
      const unsigned low_byte = byte_at(b, 64 * h + l + 32 * (r % 2));
      const unsigned low = r < 2 ? low_byte & 15 : low_byte >> 4;
      const unsigned high = (byte_at(b + 128, 32 * h + l) >> (2 * r)) & 3;
      return long(low | (high << 4)) - 32;
    }
    case ggml_type::q2_k: return long((byte_at(b + 16, 32 * h + l) >> (2 * r)) & 3);
    case ggml_type::q3_k:
      return long((byte_at(b + 32, 32 * h + l) >> (2 * r)) & 3) + 4 * long((byte_at(b, l) >> (4 * h + r)) & 1) - 4;
    default: return iq4nl_levels[nibble32(b + 8 + 16 * (j / 32), j % 32)];  // IQ4_XS
  }
}

/// Sub-block s's integer scale (which = 0; Q3_K's and IQ4_XS's less 32) or
/// minimum (which = 1; 0 for the formats without) of a super-block at b.
inline long kquant_int_scale(model::ggml_type t, const std::byte* b, std::size_t s, int which) {
  using model::ggml_type;
  switch (t) {
    case ggml_type::q4_k:
    case ggml_type::q5_k: return long(k_field(b + 4, s, which));
    case ggml_type::q6_k: return which == 0 ? long(static_cast<std::int8_t>(byte_at(b + 192, s))) : 0;
    case ggml_type::q2_k: return which == 0 ? long(byte_at(b, s) & 15) : long(byte_at(b, s) >> 4);
    case ggml_type::q3_k: {
      if (which != 0) return 0;
      const unsigned low4 = s < 8 ? byte_at(b + 96, s) & 15 : byte_at(b + 96, s - 8) >> 4;
      return long(low4 | (((byte_at(b + 96, 8 + s % 4) >> (2 * (s / 4))) & 3) << 4)) - 32;
    }
    default: {  // IQ4_XS
      if (which != 0) return 0;
      const unsigned scales_h = byte_at(b, 2) | (byte_at(b, 3) << 8);
      const unsigned low4 = (byte_at(b + 4, s / 2) >> (4 * (s % 2))) & 15;
      return long(low4 | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
    }
  }
}

/// `[n, rows]` = K-quant (Q2_K ... Q6_K) or IQ4_XS rows `[rows, cols]` (bytes
/// at w) times the activations `[n, cols] x` rounded to int8 per 256 values
/// (round_k_activations), in the f32 order every int8 kernel of these
/// formats follows: per super-block the exact integer sums
/// I = sum_s sc_s * sum_{j in s} v_j q_j and M = sum_s m_s * sum_{j in s} q_j
/// (kquant_int_value, kquant_int_scale), then y = fma(float(I), d * d_x, y)
/// and, for the formats with minimums (Q2_K, Q4_K, Q5_K),
/// y = fma(float(M), -(dmin * d_x), y), super-blocks ascending.
inline std::vector<float> kquant_product_f32(model::ggml_type t, const std::vector<float>& x, std::size_t n,
                                             std::size_t cols, const std::byte* w, std::size_t rows) {
  using model::ggml_type;
  const bool mins = t == ggml_type::q2_k || t == ggml_type::q4_k || t == ggml_type::q5_k;
  const std::size_t sub = t == ggml_type::q4_k || t == ggml_type::q5_k || t == ggml_type::iq4_xs ? 32 : 16;
  // Bytes per super-block and where d (dmin follows it) lies.
  std::size_t block_bytes = 136, d_at = 0;
  switch (t) {
    case ggml_type::q2_k: block_bytes = 84, d_at = 80; break;
    case ggml_type::q3_k: block_bytes = 110, d_at = 108; break;
    case ggml_type::q4_k: block_bytes = 144; break;
    case ggml_type::q5_k: block_bytes = 176; break;
    case ggml_type::q6_k: block_bytes = 210, d_at = 208; break;
    default: break;
  }
  const std::size_t units = cols / 256;
  std::vector<float> y(n * rows, 0.0f);
  for (std::size_t tok = 0; tok < n; ++tok)
    for (std::size_t i = 0; i < units; ++i) {
      long q[256];
      const float dx = round_k_activations(x.data() + tok * cols + 256 * i, q);
      for (std::size_t o = 0; o < rows; ++o) {
        const std::byte* b = w + (o * units + i) * block_bytes;
        long dot = 0, msum = 0;
        for (std::size_t s = 0; s < 256 / sub; ++s) {
          long part = 0, sum = 0;
          for (std::size_t j = sub * s; j < sub * s + sub; ++j) {
            part += kquant_int_value(t, b, j) * q[j];
            sum += q[j];
          }
          dot += kquant_int_scale(t, b, s, 0) * part;
          msum += kquant_int_scale(t, b, s, 1) * sum;
        }
        float& out = y[tok * rows + o];
        out = std::fma(float(dot), f16_at(b + d_at) * dx, out);
        if (mins) out = std::fma(float(msum), -(f16_at(b + d_at + 2) * dx), out);
      }
    }
  return y;
}

/// `[n, rows]` = Q4_0, IQ4_NL or MXFP4 rows `[rows, cols]` (bytes at w) times
/// the activations `[n, cols] x` rounded to int8 per 32 values (scale
/// amax / 127, round half away from zero), in the f32 order of these
/// formats' VNNI kernels: per block the exact integer dot of the levels
/// (Q4_0: nibble - 8; IQ4_NL: iq4nl_levels; MXFP4: twice the E2M1 value)
/// and q, then y = fma(float(dot), d_w * d_x, y), blocks ascending, with
/// d_w the f16 scale or MXFP4's 2^(e - 128).
inline std::vector<float> block32_product_f32(model::ggml_type t, const std::vector<float>& x, std::size_t n,
                                              std::size_t cols, const std::byte* w, std::size_t rows) {
  using model::ggml_type;
  const bool mxfp4 = t == ggml_type::mxfp4;
  const std::size_t block_bytes = mxfp4 ? 17 : 18, scale_bytes = mxfp4 ? 1 : 2, blocks = cols / 32;
  auto level = [&](const std::byte* b, std::size_t j) -> long {
    const unsigned q = nibble32(b + scale_bytes, j);
    if (t == ggml_type::q4_0) return long(q) - 8;
    if (t == ggml_type::iq4_nl) return iq4nl_levels[q];
    const unsigned exponent = (q >> 1) & 3, mantissa = q & 1;
    const long twice = exponent == 0 ? long(mantissa) : long(2 + mantissa) << (exponent - 1);
    return q & 8 ? -twice : twice;
  };
  std::vector<float> y(n * rows, 0.0f);
  for (std::size_t tok = 0; tok < n; ++tok)
    for (std::size_t i = 0; i < blocks; ++i) {
      const float* xb = x.data() + tok * cols + 32 * i;
      float amax = 0.0f;
      for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xb[j]));
      const float dx = amax / 127.0f, inv = dx != 0.0f ? 1.0f / dx : 0.0f;
      long q[32];
      for (std::size_t j = 0; j < 32; ++j) q[j] = long(std::round(xb[j] * inv));
      for (std::size_t o = 0; o < rows; ++o) {
        const std::byte* b = w + (o * blocks + i) * block_bytes;
        long dot = 0;
        for (std::size_t j = 0; j < 32; ++j) dot += level(b, j) * q[j];
        const float dw = mxfp4 ? float(std::ldexp(1.0, int(byte_at(b, 0)) - 128)) : f16_at(b);
        float& out = y[tok * rows + o];
        out = std::fma(float(dot), dw * dx, out);
      }
    }
  return y;
}

}  // namespace llmkit::reference
