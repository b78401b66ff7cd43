// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/storage.hpp
/// The element types a KV cache can store (f32, f16, bf16, int8 with one
/// f32 scale per token and head), their run-time names, and the row
/// encoders every cache uses on `store`: f32 rows in, storage rows out.
///
/// int8 is symmetric per row (simd::quantize_i8): scale = max|x| / 127,
/// q = round_half_away(x * (1 / scale)),
/// so the real value is q * scale (scale 0 for an all-zero row). A row that
/// holds NaN or infinity cannot be represented in int8; caches reject it
/// with `llmkit::error` before writing anything.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"

namespace llmkit::kv {

/// The storage types a cache accepts: float, f16, bf16, std::int8_t.
template <class T>
concept kv_storage = std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16> ||
                     std::is_same_v<T, std::int8_t>;

/// True when rows of T carry a per-(token, head) f32 scale (int8 only).
template <class T>
inline constexpr bool has_row_scale_v = std::is_same_v<T, std::int8_t>;

/// Run-time tag of a storage type (f32, f16, bf16, i8).
template <kv_storage T>
inline constexpr dtype storage_dtype_v = std::is_same_v<T, float>  ? dtype::f32
                                         : std::is_same_v<T, f16>  ? dtype::f16
                                         : std::is_same_v<T, bf16> ? dtype::bf16
                                                                   : dtype::i8;

/// Bytes one token occupies in a cache of this shape: K and V rows for every
/// layer and KV head, plus the two int8 scales per (layer, head).
template <kv_storage T>
constexpr std::size_t kv_bytes_per_token(std::size_t n_layers, std::size_t n_kv_heads, std::size_t head_dim) noexcept {
  return n_layers * 2 * n_kv_heads * (head_dim * sizeof(T) + (has_row_scale_v<T> ? sizeof(float) : 0));
}

/// Decodes element d of a stored row to f32 (`scale` is used for int8 only).
template <kv_storage T>
constexpr float decode_element(const T* row, std::size_t d, float scale) noexcept {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<float>(row[d]) * scale;
  else return to_f32(row[d]);
}

namespace detail {

/// Encodes `[n] src` into `[n] dst` with the simd/ conversion kernels;
/// returns the row scale (int8) or 1.
/// @pre for int8, every element of src is finite (checked by the caches first).
template <kv_storage T, class Arch = simd::default_arch>
inline float encode_row(const float* src, T* dst, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy_n(src, n, dst);
    return 1.0f;
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return simd::quantize_i8<Arch>(std::span<const float>(src, n), std::span<std::int8_t>(dst, n));
  } else {
    simd::convert<Arch>(std::span<const float>(src, n), std::span<T>(dst, n));
    return 1.0f;
  }
}

/// Prefetches the `[n]` storage row at `row` for writing, every cache line.
template <kv_storage T>
inline void prefetch_for_write(const T* row, std::size_t n) noexcept {
  const char* p = reinterpret_cast<const char*>(row);
  for (std::size_t offset = 0; offset < n * sizeof(T); offset += 64) __builtin_prefetch(p + offset, 1, 3);
}

}  // namespace detail
}  // namespace llmkit::kv
