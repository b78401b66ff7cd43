// SPDX-License-Identifier: MIT
#pragma once

/// @file reference/simd_reference.hpp
/// Naive double-precision oracles of the simd kernels. Everything lives in an
/// unnamed namespace: the per-arch test translation units are compiled with
/// different -march flags and must not share inline non-template code.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "llmkit/core/dtype.hpp"

namespace llmkit::reference {
namespace {

double dot(std::span<const float> a, std::span<const float> b) {
  double acc = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

/// sum_i |a[i] * b[i]|: the scale of the rounding-error bound of a dot product.
double dot_abs(std::span<const float> a, std::span<const float> b) {
  double acc = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) acc += std::fabs(static_cast<double>(a[i]) * b[i]);
  return acc;
}

double sum(std::span<const float> x) {
  double acc = 0.0;
  for (float v : x) acc += v;
  return acc;
}

double sum_abs(std::span<const float> x) {
  double acc = 0.0;
  for (float v : x) acc += std::fabs(v);
  return acc;
}

/// NumPy semantics: NaN if any NaN; -inf when empty.
float max(std::span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) {
    if (std::isnan(v)) return v;
    if (v > m) m = v;
  }
  return m;
}

/// First index of the maximum, or of the first NaN.
std::size_t argmax(std::span<const float> x) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

/// softmax(x / t) in double.
std::vector<double> softmax(std::span<const float> x, double t = 1.0) {
  std::vector<double> out(x.size(), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (float v : x) m = std::max(m, static_cast<double>(v));
  if (x.empty() || m == -std::numeric_limits<double>::infinity()) return out;
  double s = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) s += out[i] = std::exp((x[i] - m) / t);
  for (double& v : out) v /= s;
  return out;
}

std::vector<double> log_softmax(std::span<const float> x, double t = 1.0) {
  std::vector<double> out(x.size(), -std::numeric_limits<double>::infinity());
  double m = -std::numeric_limits<double>::infinity();
  for (float v : x) m = std::max(m, static_cast<double>(v));
  if (x.empty() || m == -std::numeric_limits<double>::infinity()) return out;
  double s = 0.0;
  for (float v : x) s += std::exp((v - m) / t);
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = (x[i] - m) / t - std::log(s);
  return out;
}

std::vector<double> rmsnorm(std::span<const float> x, std::span<const float> w, double eps) {
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

/// RoPE of one token, [n_heads, head_dim] x, angles and rotation in double.
/// interleaved: pairs (2i, 2i+1); otherwise pairs (i, i + rotary_dim/2).
std::vector<double> rope(std::span<const float> x, std::size_t head_dim, std::size_t rotary_dim, bool interleaved,
                         double theta, double freq_scale, std::int64_t position) {
  std::vector<double> out(x.begin(), x.end());
  const std::size_t half = rotary_dim / 2;
  for (std::size_t h = 0; h < x.size() / head_dim; ++h) {
    for (std::size_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position) * freq_scale *
                           std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
      const std::size_t p = h * head_dim + (interleaved ? 2 * i : i);
      const std::size_t q = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
      const double a = x[p], b = x[q];
      out[p] = a * std::cos(angle) - b * std::sin(angle);
      out[q] = a * std::sin(angle) + b * std::cos(angle);
    }
  }
  return out;
}

/// ggml's quantize_row_q8_0_ref, verbatim in meaning: d = amax / 127 in f32,
/// id = 1/d, q = roundf(x * id), scale stored as f16(d).
std::vector<block_q8_0> quantize_q8_0(std::span<const float> x) {
  std::vector<block_q8_0> out(x.size() / q8_block_size);
  for (std::size_t b = 0; b < out.size(); ++b) {
    float amax = 0.0f;
    for (std::size_t j = 0; j < q8_block_size; ++j) amax = std::max(amax, std::fabs(x[b * q8_block_size + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].scale = to_f16(d);
    for (std::size_t j = 0; j < q8_block_size; ++j)
      out[b].qs[j] = static_cast<std::int8_t>(std::round(x[b * q8_block_size + j] * id));
  }
  return out;
}

}  // namespace
}  // namespace llmkit::reference
