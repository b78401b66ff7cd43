// SPDX-License-Identifier: MIT
#pragma once

/// @file tests/reference/kv_reference.hpp
/// Double-precision oracle for KV caches: a plain map from position to the
/// f32 rows that were stored, the tolerance each storage type is allowed,
/// and a reader that walks a cache's chunks and compares every visible row.

#include <llmkit/kv/kv_view.hpp>
#include <llmkit/kv/storage.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace kv_reference {

using llmkit::kv::kv_shape;
using llmkit::kv::seq_id;

/// What one sequence should hold: `[n_tokens][n_layers][n_kv_heads][head_dim]`
/// keys and values in double (the f32 inputs, exactly).
struct sequence {
  kv_shape shape;
  std::vector<std::vector<double>> k, v;  // [token] -> [n_layers * n_kv_heads * head_dim]

  std::size_t n_tokens() const { return k.size(); }
  void grow(std::size_t n) {
    const std::size_t row = shape.n_layers * shape.n_kv_heads * shape.head_dim;
    k.resize(k.size() + n, std::vector<double>(row, std::nan("")));
    v.resize(v.size() + n, std::vector<double>(row, std::nan("")));
  }
  void truncate(std::size_t n) {
    k.resize(n);
    v.resize(n);
  }
  /// Mirrors cache.store: `[n_new, n_kv_heads, head_dim] kin, vin`.
  void store(std::size_t layer, std::size_t first, const std::vector<float>& kin, const std::vector<float>& vin) {
    const std::size_t hd = shape.n_kv_heads * shape.head_dim;
    for (std::size_t t = 0; t < kin.size() / hd; ++t)
      for (std::size_t i = 0; i < hd; ++i) {
        k[first + t][layer * hd + i] = kin[t * hd + i];
        v[first + t][layer * hd + i] = vin[t * hd + i];
      }
  }
  const double* k_row(std::size_t pos, std::size_t layer, std::size_t head) const {
    return k[pos].data() + (layer * shape.n_kv_heads + head) * shape.head_dim;
  }
  const double* v_row(std::size_t pos, std::size_t layer, std::size_t head) const {
    return v[pos].data() + (layer * shape.n_kv_heads + head) * shape.head_dim;
  }
};

/// Largest |stored - exact| allowed for element x of a row whose largest
/// magnitude is amax: f32 exact; f16 half an ulp (2^-11 relative, 2^-25
/// absolute in the subnormal range); bf16 2^-8 relative; int8 half a
/// quantisation step amax / 254 (plus f32 rounding of the scale).
template <class T>
double tolerance(double x, double amax) {
  if constexpr (std::is_same_v<T, float>) return 0.0;
  else if constexpr (std::is_same_v<T, llmkit::f16>) return std::max(std::fabs(x) * 0x1p-11, 0x1p-25);
  else if constexpr (std::is_same_v<T, llmkit::bf16>) return std::fabs(x) * 0x1p-8;
  else return amax / 254.0 * (1.0 + 1e-5) + amax * 1e-6;
}

/// Random f32 rows `[n * row]` in [-2, 2] with a fixed generator.
inline std::vector<float> random_rows(std::mt19937& rng, std::size_t n, std::size_t row) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> out(n * row);
  for (auto& x : out) x = u(rng);
  return out;
}

/// Outcome of comparing a cache with the oracle.
struct comparison {
  bool ok = true;
  std::string message;  // first mismatch
  std::size_t rows_checked = 0;
};

/// Walks every chunk of (cache, s) and checks: chunk positions increase and
/// never repeat, the visible positions are exactly `expected_positions`,
/// and each K/V element is within tolerance<T> of the oracle.
template <class Cache>
comparison compare(const Cache& cache, seq_id s, const sequence& ref, const std::vector<std::size_t>& expected_positions) {
  using T = typename Cache::storage_type;
  comparison out;
  auto fail = [&](std::string why) {
    if (out.ok) out.message = std::move(why);
    out.ok = false;
  };
  const kv_shape shape = cache.shape();
  const std::size_t d = shape.head_dim;
  for (std::size_t layer = 0; layer < shape.n_layers; ++layer)
    for (std::size_t head = 0; head < shape.n_kv_heads; ++head) {
      std::vector<std::size_t> seen;
      for (std::size_t c = 0; c < cache.n_chunks(s); ++c) {
        const auto ch = cache.chunk(s, layer, head, c);
        if (ch.n_tokens == 0) fail("empty chunk " + std::to_string(c));
        if (ch.row_stride < d) fail("row_stride below head_dim");
        if ((ch.k_scale == nullptr) == llmkit::kv::has_row_scale_v<T>) fail("scale pointers do not match the dtype");
        for (std::size_t t = 0; t < ch.n_tokens; ++t) {
          const auto pos = static_cast<std::size_t>(ch.first_pos) + t;
          if (!seen.empty() && pos <= seen.back()) fail("positions not increasing at " + std::to_string(pos));
          seen.push_back(pos);
          if (pos >= ref.n_tokens()) {
            fail("position " + std::to_string(pos) + " beyond the oracle");
            continue;
          }
          for (int kv = 0; kv < 2; ++kv) {
            const T* row = (kv == 0 ? ch.k : ch.v) + t * ch.row_stride;
            const float scale = llmkit::kv::has_row_scale_v<T> ? (kv == 0 ? ch.k_scale : ch.v_scale)[t] : 1.0f;
            const double* want = kv == 0 ? ref.k_row(pos, layer, head) : ref.v_row(pos, layer, head);
            double amax = 0.0;
            for (std::size_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(want[i]));
            for (std::size_t i = 0; i < d; ++i) {
              const double got = llmkit::kv::decode_element(row, i, scale);
              if (!(std::fabs(got - want[i]) <= tolerance<T>(want[i], amax)))
                fail("layer " + std::to_string(layer) + " head " + std::to_string(head) + " pos " +
                     std::to_string(pos) + (kv == 0 ? " k[" : " v[") + std::to_string(i) + "] = " +
                     std::to_string(got) + ", want " + std::to_string(want[i]));
            }
          }
          ++out.rows_checked;
        }
      }
      if (seen != expected_positions)
        fail("visible positions differ at layer " + std::to_string(layer) + " head " + std::to_string(head) + ": got " +
             std::to_string(seen.size()) + " rows, want " + std::to_string(expected_positions.size()));
    }
  return out;
}

/// Positions [first, last).
inline std::vector<std::size_t> range(std::size_t first, std::size_t last) {
  std::vector<std::size_t> out;
  for (std::size_t p = first; p < last; ++p) out.push_back(p);
  return out;
}

}  // namespace kv_reference
