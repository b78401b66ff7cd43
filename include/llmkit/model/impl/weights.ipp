// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/weights.ipp
/// weight_matrix's storage conversions and loading (model/weights.hpp):
/// compiled inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/model/weights.hpp"
#include "llmkit/simd/convert.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model {

LLMKIT_DECL weight_type weight_type_from_name(std::string_view name) {
  for (const weight_type t : all_weight_types)
    if (weight_type_name(t) == name) return t;
  LLMKIT_CHECK(false, "weight type '", name, "' is not one of native, f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, ",
               "q5_k, q6_k, q2_k, q3_k, iq4_nl, iq4_xs, mxfp4");
  return weight_type::native;
}

LLMKIT_DECL weight_matrix::weight_matrix(weight_type type, std::size_t rows, std::size_t cols)
    : type_(type), rows_(rows), cols_(cols) {
  LLMKIT_CHECK(type != weight_type::native, "weight_matrix: type must be a storage type, not native");
  LLMKIT_CHECK(cols % weight_block_size(type) == 0, "weight_matrix: ", weight_type_name(type), " needs cols (",
               cols, ") to be a multiple of ", weight_block_size(type));
  const std::size_t n = rows * cols;
  switch (type) {
    case weight_type::f32: f32_.assign(detail::panel_storage_size(rows, cols), 0.0f); break;
    case weight_type::f16: f16_.assign(n, 0); break;
    case weight_type::q8_0:
      q_.assign(n, 0);
      scales_.assign(n / q8_block_size, 0.0f);
      break;
    default: blocks_.assign(rows * row_bytes(), std::byte{0}); break;
  }
}

LLMKIT_DECL weight_matrix weight_matrix::in_place(const gguf_tensor& t, std::shared_ptr<const void> owner) {
  const auto cols = static_cast<std::size_t>(t.cols());
  const weight_type type = resolve_weight_type(weight_type::native, t.type, cols);
  LLMKIT_CHECK(keeps_file_layout(type, t.type), "weight_matrix::in_place: tensor '", t.name, "' (",
               ggml_type_name(std::uint32_t(t.type)), ", ", cols, " columns) is stored as ", weight_type_name(type),
               ", not in the file's layout");
  LLMKIT_CHECK(owner != nullptr, "weight_matrix::in_place: tensor '", t.name, "' needs the owner of its mapping");
  weight_matrix m;
  m.type_ = type;
  m.rows_ = static_cast<std::size_t>(t.rows());
  m.cols_ = cols;
  if (m.is_block_type())
    for (std::size_t r = 0; r < m.rows_; ++r) check_scales(t, t.data + r * m.row_bytes());
  m.view_ = t.data;
  m.owner_ = std::move(owner);
  return m;
}

LLMKIT_DECL void weight_matrix::set_row(std::size_t r, std::span<const float> values) {
  LLMKIT_CHECK(!is_in_place(), "weight_matrix::set_row: the matrix is a read-only view of a file's tensor");
  LLMKIT_CHECK(r < rows_ && values.size() == cols_, "weight_matrix::set_row: row ", r, " of ", rows_, ", ",
               values.size(), " values for ", cols_, " columns");
  const std::size_t o = r * cols_;
  switch (type_) {
    case weight_type::f32: store_f32_row(r, values.data()); break;
    case weight_type::f16:
      for (std::size_t k = 0; k < cols_; ++k) f16_[o + k] = f32_to_f16_bits(values[k]);
      break;
    case weight_type::q8_0: {
      std::vector<block_q8_0> blocks(cols_ / q8_block_size);
      simd::quantize_q8_0(values, std::span<block_q8_0>(blocks));
      set_row_q8_0(r, blocks.data());
      break;
    }
    default:
      quantize_row(stored_block_type(type_), values.data(), blocks_.data() + r * row_bytes(), cols_);
      break;
  }
}

LLMKIT_DECL void weight_matrix::row(std::size_t r, std::span<float> out) const {
  LLMKIT_CHECK(r < rows_ && out.size() == cols_, "weight_matrix::row: row ", r, " of ", rows_, ", ", out.size(),
               " outputs for ", cols_, " columns");
  const std::size_t o = r * cols_;
  switch (type_) {
    case weight_type::f32:
      for (std::size_t k = 0; k < cols_; ++k) out[k] = f32_[detail::panel_index(r, k, cols_)];
      break;
    case weight_type::f16:
      for (std::size_t k = 0; k < cols_; ++k) out[k] = f16_bits_to_f32(f16_data()[o + k]);
      break;
    case weight_type::q8_0:
      for (std::size_t b = 0; b < cols_ / q8_block_size; ++b)
        for (std::size_t j = 0; j < q8_block_size; ++j)
          out[b * q8_block_size + j] = scales_[o / q8_block_size + b] * float(q_[o + b * q8_block_size + j]);
      break;
    default: dequantize_row(stored_block_type(type_), block_data() + r * row_bytes(), out.data(), cols_); break;
  }
}

LLMKIT_DECL void weight_matrix::copy_from(const gguf_tensor& src, std::size_t first_row) {
  LLMKIT_CHECK(!is_in_place(), "weight_matrix::copy_from: the matrix is a read-only view of a file's tensor");
  const std::size_t n_rows = static_cast<std::size_t>(src.rows());
  LLMKIT_CHECK(src.cols() == cols_ && first_row + n_rows <= rows_, "weight_matrix::copy_from: tensor '", src.name,
               "' [", src.rows(), ", ", src.cols(), "] does not fit rows [", first_row, ", ", first_row + n_rows,
               ") of a [", rows_, ", ", cols_, "] matrix");
  const std::size_t n = n_rows * cols_;
  if (type_ == weight_type::f32 && src.type == ggml_type::f32) {
    std::vector<float> tmp(cols_);
    for (std::size_t r = 0; r < n_rows; ++r) {
      std::memcpy(tmp.data(), src.data + r * cols_ * sizeof(float), cols_ * sizeof(float));
      store_f32_row(first_row + r, tmp.data());
    }
    return;
  }
  if (type_ == weight_type::f16 && src.type == ggml_type::f16) {
    std::memcpy(f16_.data() + first_row * cols_, src.data, n * sizeof(std::uint16_t));
    return;
  }
  const std::size_t row_bytes = cols_ / ggml_block_elements(src.type) * ggml_block_bytes(src.type);
  if (is_block_type() && src.type == stored_block_type(type_)) {
    for (std::size_t r = 0; r < n_rows; ++r) check_scales(src, src.data + r * row_bytes);
    std::memcpy(blocks_.data() + first_row * row_bytes, src.data, n_rows * row_bytes);
    return;
  }
  std::vector<block_q8_0> blocks;
  if (type_ == weight_type::q8_0 && src.type == ggml_type::q8_0) {
    blocks.resize(cols_ / q8_block_size);
    for (std::size_t r = 0; r < n_rows; ++r) {
      std::memcpy(blocks.data(), src.data + r * row_bytes, row_bytes);
      set_row_q8_0(first_row + r, blocks.data());
    }
    return;
  }
  std::vector<float> tmp(cols_);
  for (std::size_t r = 0; r < n_rows; ++r) {
    decode_row(src, src.data + r * row_bytes, tmp.data());
    set_row(first_row + r, tmp);
  }
}

LLMKIT_DECL void weight_matrix::decode_row(const gguf_tensor& t, const std::byte* p, float* out) {
  if (is_quantized(t.type)) check_scales(t, p);
  dequantize_row(t.type, p, out, static_cast<std::size_t>(t.cols()));
}

LLMKIT_DECL void weight_matrix::check_scales(const gguf_tensor& t, const std::byte* row) {
  const std::size_t k = ggml_block_elements(t.type), bb = ggml_block_bytes(t.type);
  for (std::size_t b = 0; b < static_cast<std::size_t>(t.cols()) / k; ++b)
    LLMKIT_CHECK(block_scales_finite(t.type, row + b * bb), "weight_matrix: tensor '", t.name, "' (",
                 ggml_type_name(std::uint32_t(t.type)), ") has a non-finite scale in the block of column ", b * k,
                 " at byte ", (row - t.data) + std::ptrdiff_t(b * bb));
}

}  // namespace llmkit::model

LLMKIT_SIMD_DIAGNOSTICS_END
