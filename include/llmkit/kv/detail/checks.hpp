// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/detail/checks.hpp
/// Argument checks shared by every cache, so they all word errors alike.

#include <cmath>
#include <cstdint>
#include <cstddef>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/kv_view.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"

namespace llmkit::kv::detail {

/// Validates a cache shape at construction.
inline void check_shape(const char* what, const kv_shape& shape) {
  LLMKIT_CHECK(shape.n_layers > 0, what, ": shape.n_layers must be > 0, got ", shape.n_layers);
  LLMKIT_CHECK(shape.n_kv_heads > 0, what, ": shape.n_kv_heads must be > 0, got ", shape.n_kv_heads);
  LLMKIT_CHECK(shape.head_dim > 0, what, ": shape.head_dim must be > 0, got ", shape.head_dim);
}

/// Validates the arguments of a `store` into sequence `s`, which holds
/// `n_tokens` slots, and returns the number of token rows n_new
/// (`[n_new, n_kv_heads, head_dim] k, v`): the slots [first_token,
/// first_token + n_new) must lie within them (grow reserves them). With
/// `need_finite` (int8) a
/// NaN or infinity is rejected before anything is written: one vector pass
/// over k and v (`simd::detail::all_finite`, as GCC does not vectorise a
/// scalar bit test), and a scalar one only to name the bad element.
template <class Arch = simd::default_arch>
std::size_t check_store(const kv_shape& shape, std::size_t layer, std::span<const float> k, std::span<const float> v,
                        bool need_finite, seq_id s, std::size_t first_token, std::size_t n_tokens) {
  LLMKIT_CHECK(layer < shape.n_layers, "store: layer ", layer, " is out of range [0, ", shape.n_layers, ")");
  const std::size_t row = shape.n_kv_heads * shape.head_dim;
  LLMKIT_CHECK(k.size() % row == 0, "store: k.size() = ", k.size(), " is not a multiple of n_kv_heads * head_dim = ",
               row);
  LLMKIT_CHECK(v.size() == k.size(), "store: v.size() = ", v.size(), " differs from k.size() = ", k.size());
  const std::size_t n_new = k.size() / row;
  LLMKIT_CHECK(first_token <= n_tokens && n_new <= n_tokens - first_token, "store: token slots [", first_token, ", ",
               first_token + n_new, ") exceed n_tokens = ", n_tokens, " of sequence ", s, " (grow first)");
  if (need_finite && !(simd::detail::all_finite<Arch>(k.data(), k.size()) &&
                       simd::detail::all_finite<Arch>(v.data(), v.size()))) {
    for (std::size_t i = 0; i < k.size(); ++i)
      LLMKIT_CHECK(std::isfinite(k[i]), "store: k[", i, "] = ", k[i], " is not finite (int8 storage cannot hold it)");
    for (std::size_t i = 0; i < v.size(); ++i)
      LLMKIT_CHECK(std::isfinite(v[i]), "store: v[", i, "] = ", v[i], " is not finite (int8 storage cannot hold it)");
  }
  return n_new;
}

/// Validates the (layer, kv_head, chunk index) of a `chunk` call.
inline void check_chunk(const kv_shape& shape, std::size_t layer, std::size_t kv_head, std::size_t i,
                        std::size_t n_chunks) {
  LLMKIT_CHECK(layer < shape.n_layers, "chunk: layer ", layer, " is out of range [0, ", shape.n_layers, ")");
  LLMKIT_CHECK(kv_head < shape.n_kv_heads, "chunk: kv_head ", kv_head, " is out of range [0, ", shape.n_kv_heads, ")");
  LLMKIT_CHECK(i < n_chunks, "chunk: chunk index ", i, " is out of range [0, ", n_chunks, ")");
}

}  // namespace llmkit::kv::detail
