// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/weights.hpp
/// Weight matrices kept in their storage type (f32, f16 or Q8_0) and the
/// product `y (+)= x * W^T` over them.
///
/// `weight_type` names the in-memory storage a model asks for: `native`
/// keeps each GGUF tensor's own type (F32, F16 and Q8_0 as they are; BF16 and
/// the 4-6-bit types are decoded to f32, exactly), the others convert at load
/// (f32 -> f16 rounds to nearest even; anything -> Q8_0 quantises per 32-value
/// block like ggml). Q8_0 rows
/// are stored as an int8 matrix plus one f32 scale per block (the f16 scale
/// of the file, widened exactly), so a native Q8_0 tensor keeps its exact
/// values.
///
/// `linear(exec, x, w, y)`: f32 matrices are kept in panels of 64 rows and
/// multiplied by an outer-product kernel (model/detail/matmul_panels.hpp);
/// f16 and Q8_0 ones are widened to f32 in registers by a register-tiled
/// dot-product kernel (model/detail/matmul.hpp). Either way a product for
/// one token reads each weight once, and rows are split across the executor
/// above ~2^16 multiply-adds. With `activation_type::q8_0` a Q8_0
/// matrix instead multiplies int8-quantised activations
/// (model/detail/matmul_q8.hpp: ggml's Q8_0 x Q8_0 product, VNNI).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/model/detail/matmul_kernels.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/convert.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model {

/// In-memory storage of a model's weight matrices.
enum class weight_type : std::uint8_t {
  native,  ///< each tensor's GGUF type (F32, F16, Q8_0); BF16, Q4_0 ... Q6_K become f32
  f32,     ///< 4 bytes per weight
  f16,     ///< 2 bytes per weight (IEEE half)
  q8_0,    ///< 1 byte per weight + one f32 scale per 32 (1.125 bytes per weight)
};

/// What a product does with its f32 activations. `f32`: multiplies them as
/// they are (the exact stored weights, f32 arithmetic). `q8_0`: when the
/// weights are Q8_0, quantises each 32-value block of an activation row to
/// int8 (scale amax / 127, like quantize_q8_0) and multiplies int8 by int8
/// (model/detail/matmul_q8.hpp); f32 and f16 weights ignore it. The int8
/// product does ~4x less arithmetic per weight, so a Q8_0 decode step runs at
/// the speed of reading its weights; it differs from the exact product by
/// the activations' rounding (at most half a block's scale per value).
enum class activation_type { f32, q8_0 };

/// Whether a product overwrites its output or adds to it.
enum class output_mode : std::uint8_t { overwrite, accumulate };

/// "native", "f32", "f16" or "q8_0".
constexpr std::string_view weight_type_name(weight_type t) noexcept {
  switch (t) {
    case weight_type::native: return "native";
    case weight_type::f32: return "f32";
    case weight_type::f16: return "f16";
    case weight_type::q8_0: return "q8_0";
  }
  return "?";
}

/// The storage a tensor of GGUF type `file_type` gets when `wanted` is asked
/// for a matrix of `cols` columns: native maps F32/F16/Q8_0 to themselves and
/// BF16 and the 4-6-bit types to f32 (their exact values); Q8_0 needs
/// cols % 32 == 0 and falls back to f32 otherwise (e.g. stories260K's
/// ffn_down with 172 columns).
constexpr weight_type resolve_weight_type(weight_type wanted, ggml_type file_type, std::size_t cols) noexcept {
  weight_type t = wanted;
  if (t == weight_type::native) {
    switch (file_type) {
      case ggml_type::f16: t = weight_type::f16; break;
      case ggml_type::q8_0: t = weight_type::q8_0; break;
      default: t = weight_type::f32; break;
    }
  }
  if (t == weight_type::q8_0 && cols % q8_block_size != 0) t = weight_type::f32;
  return t;
}

/// A row-major `[rows, cols]` weight matrix in one storage type.
class weight_matrix {
 public:
  weight_matrix() = default;

  /// Zero matrix of the given storage.
  /// @throws llmkit::error for `native`, or Q8_0 with cols % 32 != 0.
  weight_matrix(weight_type type, std::size_t rows, std::size_t cols) : type_(type), rows_(rows), cols_(cols) {
    LLMKIT_CHECK(type != weight_type::native, "weight_matrix: type must be f32, f16 or q8_0, not native");
    LLMKIT_CHECK(type != weight_type::q8_0 || cols % q8_block_size == 0, "weight_matrix: q8_0 needs cols (", cols,
                 ") to be a multiple of 32");
    const std::size_t n = rows * cols;
    switch (type) {
      case weight_type::f32: f32_.assign(detail::panel_storage_size(rows, cols), 0.0f); break;
      case weight_type::f16: f16_.assign(n, 0); break;
      case weight_type::q8_0:
        q_.assign(n, 0);
        scales_.assign(n / q8_block_size, 0.0f);
        break;
      case weight_type::native: break;
    }
  }

  weight_type type() const noexcept { return type_; }
  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  /// Bytes the whole matrix occupies (= bytes one product reads).
  std::size_t bytes() const noexcept {
    return f32_.size() * sizeof(float) + f16_.size() * sizeof(std::uint16_t) + q_.size() + scales_.size() * sizeof(float);
  }

  /// Stores row r from f32 values (rounded or quantised to the storage).
  /// @pre values.size() == cols(); for Q8_0, every value finite
  void set_row(std::size_t r, std::span<const float> values) {
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
      case weight_type::native: break;
    }
  }

  /// Stores row r from `cols / 32` GGUF Q8_0 blocks, exactly. @pre type() == q8_0
  void set_row_q8_0(std::size_t r, const block_q8_0* blocks) noexcept {
    const std::size_t nb = cols_ / q8_block_size;
    for (std::size_t b = 0; b < nb; ++b) {
      std::memcpy(q_.data() + r * cols_ + b * q8_block_size, blocks[b].qs, q8_block_size);
      scales_[r * nb + b] = to_f32(blocks[b].scale);
    }
  }

  /// Decodes row r to f32 (exact for every storage). ([cols] out)
  void row(std::size_t r, std::span<float> out) const {
    LLMKIT_CHECK(r < rows_ && out.size() == cols_, "weight_matrix::row: row ", r, " of ", rows_, ", ", out.size(),
                 " outputs for ", cols_, " columns");
    const std::size_t o = r * cols_;
    switch (type_) {
      case weight_type::f32:
        for (std::size_t k = 0; k < cols_; ++k) out[k] = f32_[detail::panel_index(r, k, cols_)];
        break;
      case weight_type::f16:
        for (std::size_t k = 0; k < cols_; ++k) out[k] = f16_bits_to_f32(f16_[o + k]);
        break;
      case weight_type::q8_0:
        for (std::size_t b = 0; b < cols_ / q8_block_size; ++b)
          for (std::size_t j = 0; j < q8_block_size; ++j)
            out[b * q8_block_size + j] = scales_[o / q8_block_size + b] * float(q_[o + b * q8_block_size + j]);
        break;
      case weight_type::native: break;
    }
  }

  /// Copies `src` (a GGUF tensor of `cols()` columns) into rows
  /// [first_row, first_row + src rows): bit-exact when the file type is the
  /// storage type, else through f32.
  void copy_from(const gguf_tensor& src, std::size_t first_row) {
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

  /// Raw storage: the pointer of the active type, others are null. f32 is
  /// packed in panels of 64 rows (element (o, k) at
  /// detail::panel_index(o, k, cols()); model/detail/matmul_panels.hpp);
  /// f16, int8 and the Q8_0 scales are row-major.
  const float* f32_data() const noexcept { return f32_.empty() ? nullptr : f32_.data(); }
  const std::uint16_t* f16_data() const noexcept { return f16_.empty() ? nullptr : f16_.data(); }
  const std::int8_t* q8_data() const noexcept { return q_.empty() ? nullptr : q_.data(); }
  const float* q8_scales() const noexcept { return scales_.empty() ? nullptr : scales_.data(); }

  /// Calls fn(accessor) with the storage's kernel accessor
  /// (detail::f32_panels, f16_weights or q8_weights).
  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    switch (type_) {
      case weight_type::f16: return fn(detail::f16_weights{f16_.data(), cols_});
      case weight_type::q8_0: return fn(detail::q8_weights{q_.data(), scales_.data(), cols_});
      default: return fn(detail::f32_panels{f32_.data(), cols_});
    }
  }

 private:
  // Row of a GGUF tensor to f32; a quantised row must decode to finite
  // values (a NaN or Inf scale would poison every product it enters).
  static void decode_row(const gguf_tensor& t, const std::byte* p, float* out) {
    const std::size_t cols = static_cast<std::size_t>(t.cols());
    dequantize_row(t.type, p, out, cols);
    if (is_quantized(t.type))
      for (std::size_t i = 0; i < cols; ++i)
        LLMKIT_CHECK(std::isfinite(out[i]), "weight_matrix: tensor '", t.name, "' (",
                     ggml_type_name(std::uint32_t(t.type)), ") has a non-finite scale in the block of column ", i,
                     " at byte ", (p - t.data) + std::ptrdiff_t(i / ggml_block_elements(t.type) * ggml_block_bytes(t.type)));
  }

  // Row r of f32 values into the panel layout.
  void store_f32_row(std::size_t r, const float* values) noexcept {
    float* dst = f32_.data() + detail::panel_index(r, 0, cols_);
    for (std::size_t k = 0; k < cols_; ++k) dst[k * detail::matmul_panel_rows] = values[k];
  }

  weight_type type_ = weight_type::f32;
  std::size_t rows_ = 0, cols_ = 0;
  aligned_vector<float> f32_;
  aligned_vector<std::uint16_t> f16_;
  aligned_vector<std::int8_t> q_;
  aligned_vector<float> scales_;
};

namespace detail {
/// linear() without its checks, quantising activations (when asked) into
/// the caller's scratch.
template <class Arch = simd::default_arch, class Exec>
void linear(Exec& exec, const float* x, std::size_t n, const weight_matrix& w, float* y, std::size_t y_stride,
            bool accumulate, activation_type activations, q8_activations& scratch) {
  if (activations == activation_type::q8_0 && w.type() == weight_type::q8_0)
    return matmul_q8<Arch>(exec, x, n, w.cols(), q8_weights{w.q8_data(), w.q8_scales(), w.cols()}, w.rows(), y,
                           y_stride, accumulate, scratch);
  w.visit([&](const auto& acc) { matmul<Arch>(exec, x, n, w.cols(), acc, w.rows(), y, y_stride, accumulate); });
}
}  // namespace detail

/// `[n, rows] y (row stride y_stride) = (or +=, output_mode::accumulate)
/// [n, cols] x * ([rows, cols] w)^T` in f32 arithmetic over the exact stored weights, rows split across `exec`
/// for large products. Batch invariant (each output is one dot product
/// summed in a fixed order whatever n, the tile or the thread).
/// `activations`: see activation_type (q8_0 changes the product of Q8_0
/// weights only; it is batch invariant too).
/// @throws llmkit::error if x.size() is not n * cols, y_stride < rows, or y is too small.
template <class Arch = simd::default_arch, executor Exec>
void linear(Exec& exec, std::span<const float> x, std::size_t n, const weight_matrix& w, std::span<float> y,
            std::size_t y_stride, output_mode mode = output_mode::overwrite,
            activation_type activations = activation_type::f32) {
  LLMKIT_CHECK(x.size() == n * w.cols(), "linear: x.size() = ", x.size(), " must be n * cols = ", n, " * ", w.cols());
  LLMKIT_CHECK(y_stride >= w.rows(), "linear: y_stride = ", y_stride, " is less than the ", w.rows(), " rows of w");
  LLMKIT_CHECK(n == 0 || y.size() >= (n - 1) * y_stride + w.rows(), "linear: y.size() = ", y.size(),
               " is too small for ", n, " rows of stride ", y_stride);
  detail::q8_activations scratch;
  detail::linear<Arch>(exec, x.data(), n, w, y.data(), y_stride, mode == output_mode::accumulate, activations,
                       scratch);
}

}  // namespace llmkit::model

LLMKIT_SIMD_DIAGNOSTICS_END
