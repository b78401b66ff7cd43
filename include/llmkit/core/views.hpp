// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/views.hpp
/// Non-owning views used across llmkit's interfaces:
/// - 1-D: `std::span<T>`;
/// - 2-D: `matrix_view<T>`, rows of `cols` elements `row_stride` apart;
/// - ragged: `ragged_view<T>`, variable-length rows concatenated and
///   delimited by `cu_seqlens` (row i is [cu_seqlens[i], cu_seqlens[i+1])).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "llmkit/core/error.hpp"

namespace llmkit {

/// A row-major 2-D view: `rows` rows of `cols` elements, consecutive rows
/// `row_stride` elements apart (row_stride >= cols).
template <class T>
class matrix_view {
 public:
  using element_type = T;

  constexpr matrix_view() = default;
  /// @pre `data` holds at least (rows - 1) * row_stride + cols elements.
  constexpr matrix_view(T* data, std::size_t rows, std::size_t cols, std::size_t row_stride)
      : data_(data), rows_(rows), cols_(cols), row_stride_(row_stride) {
    LLMKIT_CHECK(row_stride >= cols || rows <= 1, "matrix_view: row_stride ", row_stride,
                 " is smaller than cols ", cols);
  }
  /// A dense view (row_stride == cols).
  constexpr matrix_view(T* data, std::size_t rows, std::size_t cols) : matrix_view(data, rows, cols, cols) {}
  /// Views of T convert to views of const T.
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr matrix_view(const matrix_view<U>& other)
      : data_(other.data()), rows_(other.rows()), cols_(other.cols()), row_stride_(other.row_stride()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t rows() const noexcept { return rows_; }
  constexpr std::size_t cols() const noexcept { return cols_; }
  constexpr std::size_t row_stride() const noexcept { return row_stride_; }
  constexpr bool empty() const noexcept { return rows_ == 0 || cols_ == 0; }

  /// Element (r, c), unchecked.
  constexpr T& operator()(std::size_t r, std::size_t c) const noexcept { return data_[r * row_stride_ + c]; }
  /// Row r as a span of `cols` elements, unchecked.
  constexpr std::span<T> row(std::size_t r) const noexcept { return {data_ + r * row_stride_, cols_}; }
  /// Rows [first, first + count).
  constexpr matrix_view sub_rows(std::size_t first, std::size_t count) const {
    LLMKIT_CHECK(first + count <= rows_, "matrix_view::sub_rows: rows [", first, ", ", first + count,
                 ") exceed ", rows_, " rows");
    return matrix_view(data_ + first * row_stride_, count, cols_, row_stride_);
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t row_stride_ = 0;
};

/// Variable-length rows stored back to back.
/// `[n_rows + 1] cu_seqlens` (cumulative lengths, cu_seqlens[0] == 0),
/// `[cu_seqlens[n_rows]] data`.
template <class T>
class ragged_view {
 public:
  constexpr ragged_view() = default;
  /// Validates that cu_seqlens starts at 0, never decreases and ends within data.
  ragged_view(std::span<T> data, std::span<const std::int32_t> cu_seqlens) : data_(data), cu_seqlens_(cu_seqlens) {
    LLMKIT_CHECK(!cu_seqlens.empty(), "ragged_view: cu_seqlens must hold n_rows + 1 >= 1 offsets");
    LLMKIT_CHECK(cu_seqlens[0] == 0, "ragged_view: cu_seqlens[0] must be 0, got ", cu_seqlens[0]);
    for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
      LLMKIT_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1], "ragged_view: cu_seqlens[", i, "] = ", cu_seqlens[i],
                   " is below cu_seqlens[", i - 1, "] = ", cu_seqlens[i - 1]);
    LLMKIT_CHECK(static_cast<std::size_t>(cu_seqlens.back()) <= data.size(), "ragged_view: cu_seqlens.back() = ",
                 cu_seqlens.back(), " exceeds data size ", data.size());
  }

  std::size_t size() const noexcept { return cu_seqlens_.empty() ? 0 : cu_seqlens_.size() - 1; }
  std::span<T> operator[](std::size_t i) const noexcept {
    return data_.subspan(static_cast<std::size_t>(cu_seqlens_[i]),
                         static_cast<std::size_t>(cu_seqlens_[i + 1] - cu_seqlens_[i]));
  }
  std::span<T> data() const noexcept { return data_; }
  std::span<const std::int32_t> cu_seqlens() const noexcept { return cu_seqlens_; }

 private:
  std::span<T> data_;
  std::span<const std::int32_t> cu_seqlens_;
};

}  // namespace llmkit
