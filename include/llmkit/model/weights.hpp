// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/weights.hpp
/// Weight matrices kept in their storage type (f32, f16, Q8_0 or one of
/// GGUF's 4-6-bit block formats) and the product `y (+)= x * W^T` over them.
///
/// `weight_type` names the in-memory storage a model asks for: `native`
/// keeps each GGUF tensor's own type (BF16 is widened to f32), the others
/// convert at load (f32 -> f16 rounds to nearest even; anything -> a block
/// type quantises like ggml, model/quants.hpp). Q8_0 rows are stored as an
/// int8 matrix plus one f32 scale per block (the f16 scale of the file,
/// widened exactly); Q4_0 ... Q6_K, Q2_K, Q3_K, IQ4_NL and IQ4_XS keep the
/// file's blocks byte for byte.
///
/// `linear(exec, x, w, y)`: f32 matrices are kept in panels of 64 rows and
/// multiplied by an outer-product kernel (model/detail/matmul_panels.hpp);
/// f16 and Q8_0 ones are widened to f32 in registers by a register-tiled
/// dot-product kernel (model/detail/matmul.hpp); the block types are decoded
/// a strip of rows at a time into that same kernel
/// (model/detail/matmul_blocks.hpp). Every product reads each weight once
/// per step and is exact over the stored values in f32 arithmetic; rows are
/// split across the executor above ~2^16 multiply-adds. With
/// `activation_type::q8_0` a Q8_0 matrix instead multiplies int8-quantised
/// activations (model/detail/matmul_q8.hpp: ggml's Q8_0 x Q8_0 product, VNNI).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/core/config.hpp"
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
  native,  ///< each tensor's GGUF type; BF16 becomes f32
  f32,     ///< 4 bytes per weight
  f16,     ///< 2 bytes per weight (IEEE half)
  q8_0,    ///< 1 byte per weight + one f32 scale per 32 (1.125 bytes per weight)
  q4_0,    ///< GGUF Q4_0 blocks (4.5 bits per weight)
  q4_1,    ///< GGUF Q4_1 blocks (5 bits per weight)
  q5_0,    ///< GGUF Q5_0 blocks (5.5 bits per weight)
  q5_1,    ///< GGUF Q5_1 blocks (6 bits per weight)
  q4_k,    ///< GGUF Q4_K blocks (4.5 bits per weight)
  q5_k,    ///< GGUF Q5_K blocks (5.5 bits per weight)
  q6_k,    ///< GGUF Q6_K blocks (6.5625 bits per weight)
  q2_k,    ///< GGUF Q2_K blocks (2.625 bits per weight)
  q3_k,    ///< GGUF Q3_K blocks (3.4375 bits per weight)
  iq4_nl,  ///< GGUF IQ4_NL blocks (4.5 bits per weight, non-linear levels)
  iq4_xs,  ///< GGUF IQ4_XS blocks (4.25 bits per weight, non-linear levels)
  mxfp4,   ///< GGUF MXFP4 blocks (4.25 bits per weight, FP4 E2M1 values, E8M0 scales)
};

/// The GGUF block type a weight_type stores as-is (Q4_0 ... MXFP4), or
/// ggml_type::f32 for the others (f32, f16 and Q8_0 have their own layouts).
constexpr ggml_type stored_block_type(weight_type t) noexcept {
  switch (t) {
    case weight_type::q4_0: return ggml_type::q4_0;
    case weight_type::q4_1: return ggml_type::q4_1;
    case weight_type::q5_0: return ggml_type::q5_0;
    case weight_type::q5_1: return ggml_type::q5_1;
    case weight_type::q4_k: return ggml_type::q4_k;
    case weight_type::q5_k: return ggml_type::q5_k;
    case weight_type::q6_k: return ggml_type::q6_k;
    case weight_type::q2_k: return ggml_type::q2_k;
    case weight_type::q3_k: return ggml_type::q3_k;
    case weight_type::iq4_nl: return ggml_type::iq4_nl;
    case weight_type::iq4_xs: return ggml_type::iq4_xs;
    case weight_type::mxfp4: return ggml_type::mxfp4;
    default: return ggml_type::f32;
  }
}

/// Values per block of a storage type (1 for f32 and f16).
constexpr std::size_t weight_block_size(weight_type t) noexcept {
  return t == weight_type::q8_0 ? q8_block_size : ggml_block_elements(stored_block_type(t));
}

/// What a product does with its f32 activations. `f32`: multiplies them as
/// they are (the exact stored weights, f32 arithmetic). `q8_0`: when the
/// weights are quantised (Q8_0 and every block format),
/// quantises each 32-value block of an activation row to int8 (scale
/// amax / 127, like quantize_q8_0) and multiplies integers by int8
/// (model/detail/matmul_q8.hpp, matmul_blocks_q8.hpp); f32 and f16 weights
/// ignore it. The integer product does ~4x less arithmetic per weight, so a
/// decode step runs at the speed of reading its weights; it differs from the
/// exact product by the activations' rounding (at most half a block's scale
/// per value).
enum class activation_type { f32, q8_0 };

/// Whether a product overwrites its output or adds to it.
enum class output_mode : std::uint8_t { overwrite, accumulate };

/// "native", "f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
/// "q5_k", "q6_k", "q2_k", "q3_k", "iq4_nl", "iq4_xs" or "mxfp4".
constexpr std::string_view weight_type_name(weight_type t) noexcept {
  switch (t) {
    case weight_type::native: return "native";
    case weight_type::f32: return "f32";
    case weight_type::f16: return "f16";
    case weight_type::q8_0: return "q8_0";
    case weight_type::q4_0: return "q4_0";
    case weight_type::q4_1: return "q4_1";
    case weight_type::q5_0: return "q5_0";
    case weight_type::q5_1: return "q5_1";
    case weight_type::q4_k: return "q4_k";
    case weight_type::q5_k: return "q5_k";
    case weight_type::q6_k: return "q6_k";
    case weight_type::q2_k: return "q2_k";
    case weight_type::q3_k: return "q3_k";
    case weight_type::iq4_nl: return "iq4_nl";
    case weight_type::iq4_xs: return "iq4_xs";
    case weight_type::mxfp4: return "mxfp4";
  }
  return "?";
}

/// Every weight_type, in declaration order.
inline constexpr weight_type all_weight_types[] = {
    weight_type::native, weight_type::f32,  weight_type::f16,  weight_type::q8_0,
    weight_type::q4_0,   weight_type::q4_1, weight_type::q5_0, weight_type::q5_1,
    weight_type::q4_k,   weight_type::q5_k, weight_type::q6_k, weight_type::q2_k,
    weight_type::q3_k,   weight_type::iq4_nl, weight_type::iq4_xs, weight_type::mxfp4};

/// The weight_type named `name` (weight_type_name's names).
/// @throws llmkit::error naming the value and the valid names.
weight_type weight_type_from_name(std::string_view name);

/// The storage a tensor of GGUF type `file_type` gets when `wanted` is asked
/// for a matrix of `cols` columns: native maps every type to itself and BF16
/// to f32; a block type needs cols to be a multiple of its block (32 or 256)
/// and falls back to f32 otherwise (e.g. stories260K's ffn_down with 172
/// columns asked for as Q8_0).
constexpr weight_type resolve_weight_type(weight_type wanted, ggml_type file_type, std::size_t cols) noexcept {
  weight_type t = wanted;
  if (t == weight_type::native) {
    switch (file_type) {
      case ggml_type::f16: t = weight_type::f16; break;
      case ggml_type::q8_0: t = weight_type::q8_0; break;
      case ggml_type::q4_0: t = weight_type::q4_0; break;
      case ggml_type::q4_1: t = weight_type::q4_1; break;
      case ggml_type::q5_0: t = weight_type::q5_0; break;
      case ggml_type::q5_1: t = weight_type::q5_1; break;
      case ggml_type::q4_k: t = weight_type::q4_k; break;
      case ggml_type::q5_k: t = weight_type::q5_k; break;
      case ggml_type::q6_k: t = weight_type::q6_k; break;
      case ggml_type::q2_k: t = weight_type::q2_k; break;
      case ggml_type::q3_k: t = weight_type::q3_k; break;
      case ggml_type::iq4_nl: t = weight_type::iq4_nl; break;
      case ggml_type::iq4_xs: t = weight_type::iq4_xs; break;
      case ggml_type::mxfp4: t = weight_type::mxfp4; break;
      default: t = weight_type::f32; break;
    }
  }
  if (cols % weight_block_size(t) != 0) t = weight_type::f32;
  return t;
}

/// True when storage `type` keeps a tensor of GGUF type `file_type` in the
/// file's own layout, so a matrix can use the file's bytes where they lie
/// (weight_matrix::in_place): F16 as f16, and each block type (Q4_0 ...
/// Q6_K) as itself. F32 (packed into panels) and Q8_0 (scales and int8
/// apart) are rearranged at load.
constexpr bool keeps_file_layout(weight_type type, ggml_type file_type) noexcept {
  if (type == weight_type::f16) return file_type == ggml_type::f16;
  return stored_block_type(type) != ggml_type::f32 && stored_block_type(type) == file_type;
}

/// A row-major `[rows, cols]` weight matrix in one storage type: its own
/// copy, or (in_place) a read-only view of a mapped file's tensor.
class weight_matrix {
 public:
  weight_matrix() = default;

  /// A read-only matrix over tensor `t`'s bytes where they lie, copying
  /// nothing: `type` = resolve_weight_type(native, t.type, cols) must keep
  /// the file's layout (keeps_file_layout), and `owner` (gguf_file::
  /// mapping_owner) keeps the bytes valid for the matrix's lifetime. The
  /// block scales are checked as a copy checks them.
  /// @throws llmkit::error for a type that does not keep the file's
  /// layout, a null owner, or a non-finite block scale (naming the tensor).
  static weight_matrix in_place(const gguf_tensor& t, std::shared_ptr<const void> owner);
  /// True for a view of a file's bytes (in_place); such a matrix is read-only.
  bool is_in_place() const noexcept { return owner_ != nullptr; }

  /// Zero matrix of the given storage.
  /// @throws llmkit::error for `native`, or a block type whose block size
  /// does not divide cols.
  weight_matrix(weight_type type, std::size_t rows, std::size_t cols);

  weight_type type() const noexcept { return type_; }
  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  /// Bytes the whole matrix occupies (= bytes one product reads).
  std::size_t bytes() const noexcept {
    if (is_in_place()) return rows_ * (is_block_type() ? row_bytes() : cols_ * sizeof(std::uint16_t));
    return f32_.size() * sizeof(float) + f16_.size() * sizeof(std::uint16_t) + q_.size() +
           scales_.size() * sizeof(float) + blocks_.size();
  }

  /// Stores row r from f32 values (rounded or quantised to the storage).
  /// @pre values.size() == cols(); for Q8_0, every value finite
  void set_row(std::size_t r, std::span<const float> values);

  /// Stores row r from `cols / 32` GGUF Q8_0 blocks, exactly. @pre type() == q8_0
  void set_row_q8_0(std::size_t r, const block_q8_0* blocks) noexcept {
    const std::size_t nb = cols_ / q8_block_size;
    for (std::size_t b = 0; b < nb; ++b) {
      std::memcpy(q_.data() + r * cols_ + b * q8_block_size, blocks[b].qs, q8_block_size);
      scales_[r * nb + b] = to_f32(blocks[b].scale);
    }
  }

  /// Decodes row r to f32 (exact for every storage). ([cols] out)
  void row(std::size_t r, std::span<float> out) const;

  /// Copies `src` (a GGUF tensor of `cols()` columns) into rows
  /// [first_row, first_row + src rows): bit-exact when the file type is the
  /// storage type, else through f32.
  void copy_from(const gguf_tensor& src, std::size_t first_row);

  /// Raw storage: the pointer of the active type, others are null. f32 is
  /// packed in panels of 64 rows (element (o, k) at
  /// detail::panel_index(o, k, cols()); model/detail/matmul_panels.hpp);
  /// f16, int8 and the Q8_0 scales are row-major.
  const float* f32_data() const noexcept { return f32_.empty() ? nullptr : f32_.data(); }
  const std::uint16_t* f16_data() const noexcept {
    if (type_ == weight_type::f16 && is_in_place()) return reinterpret_cast<const std::uint16_t*>(view_);
    return f16_.empty() ? nullptr : f16_.data();
  }
  const std::int8_t* q8_data() const noexcept { return q_.empty() ? nullptr : q_.data(); }
  const float* q8_scales() const noexcept { return scales_.empty() ? nullptr : scales_.data(); }
  /// GGUF blocks of a block type (Q4_0 ... Q6_K), row-major: row r at
  /// `block_data() + r * row_bytes()`.
  const std::byte* block_data() const noexcept {
    if (is_block_type() && is_in_place()) return view_;
    return blocks_.empty() ? nullptr : blocks_.data();
  }
  /// Bytes per row of a block type.
  std::size_t row_bytes() const noexcept {
    const ggml_type b = stored_block_type(type_);
    return cols_ / ggml_block_elements(b) * ggml_block_bytes(b);
  }

  /// Calls fn(accessor) with the storage's kernel accessor
  /// (detail::f32_panels, f16_weights, q8_weights or block_weights).
  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    if (is_block_type()) return fn(detail::block_weights{stored_block_type(type_), block_data(), cols_});
    switch (type_) {
      case weight_type::f16: return fn(detail::f16_weights{f16_data(), cols_});
      case weight_type::q8_0: return fn(detail::q8_weights{q_.data(), scales_.data(), cols_});
      default: return fn(detail::f32_panels{f32_.data(), cols_});
    }
  }

 private:
  // Row of a GGUF tensor to f32; a quantised row's scales must be finite.
  static void decode_row(const gguf_tensor& t, const std::byte* p, float* out);
  // A NaN or Inf scale would poison every product its block enters.
  static void check_scales(const gguf_tensor& t, const std::byte* row);
  bool is_block_type() const noexcept { return stored_block_type(type_) != ggml_type::f32; }

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
  aligned_vector<std::byte> blocks_;
  // In place: the file's bytes (f16 or blocks, row-major) and what keeps them mapped.
  const std::byte* view_ = nullptr;
  std::shared_ptr<const void> owner_;
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
  if (activations == activation_type::q8_0 && stored_block_type(w.type()) != ggml_type::f32)
    return matmul_blocks_q8<Arch>(exec, x, n, block_weights{stored_block_type(w.type()), w.block_data(), w.cols()},
                                  w.rows(), y, y_stride, accumulate, scratch);
  w.visit([&](const auto& acc) { matmul<Arch>(exec, x, n, w.cols(), acc, w.rows(), y, y_stride, accumulate); });
}
}  // namespace detail

/// `[n, rows] y (row stride y_stride) = (or +=, output_mode::accumulate)
/// [n, cols] x * ([rows, cols] w)^T` in f32 arithmetic over the exact stored weights, rows split across `exec`
/// for large products. Batch invariant (each output is one dot product
/// summed in a fixed order whatever n, the tile or the thread).
/// `activations`: see activation_type (q8_0 changes the product of Q8_0
/// and of the block formats only; it is batch invariant too).
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

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/weights.ipp"
#endif
