// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/gguf.hpp
/// Read-only GGUF reader (format versions 2 and 3).
///
/// `gguf_file::open(path)` memory-maps a file read-only; `gguf_file(bytes)`
/// parses a caller-owned byte span (tests, fuzzing, embedded models). The
/// header, every metadata key/value (all 13 value types, arrays nested up to
/// `gguf_max_array_depth`) and every tensor info are parsed and validated up
/// front: every count, length and offset is checked against the bytes that
/// remain before anything is allocated, so a hostile file can neither crash
/// the reader nor make it allocate more than a small multiple of its own size.
/// Any violation raises `llmkit::error` naming the field, its value and the
/// file offset.
///
/// Tensor data are not copied: `gguf_tensor::data` points into the mapping
/// (or the caller's span). Supported tensor types are F32, F16, BF16, Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 (block layouts in
/// model/quants.hpp); a file holding any other type is refused with an error
/// naming the tensor and the type.
///
/// Numeric arrays are kept as zero-copy views over the file bytes (read them
/// with `gguf_array::get<T>(i)`); string arrays as `std::string_view`s into
/// the file.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"

namespace llmkit::model {

namespace detail {
class mapped_file;  // model/detail/mapped_file.hpp; only open() needs it complete
}  // namespace detail

static_assert(std::endian::native == std::endian::little, "llmkit's GGUF reader assumes a little-endian host");

/// GGUF metadata value types (the numeric codes of the format).
enum class gguf_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

/// Printable name of a metadata value type ("u32", "string", ...), or "?"
/// for codes outside the format.
constexpr std::string_view gguf_type_name(std::uint32_t code) noexcept {
  constexpr std::array<std::string_view, 13> names{"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                   "bool", "string", "array", "u64", "i64", "f64"};
  return code < names.size() ? names[code] : std::string_view("?");
}

/// ggml tensor types that the reader accepts (their numeric codes in GGUF).
enum class ggml_type : std::uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, iq4_nl = 20, iq4_xs = 23, bf16 = 30,
  mxfp4 = 39,
};

/// True for the codes of ggml_type (the types the reader accepts).
constexpr bool is_supported_ggml_type(std::uint32_t code) noexcept {
  switch (code) {
    case 0: case 1: case 2: case 3: case 6: case 7: case 8: case 10: case 11: case 12: case 13: case 14: case 20: case 23:
    case 30: case 39:
      return true;
    default: return false;
  }
}

/// Printable name of any ggml tensor type code ("F32", "Q4_K", ...), or "?".
constexpr std::string_view ggml_type_name(std::uint32_t code) noexcept {
  constexpr std::array<std::string_view, 40> names{
      "F32",     "F16",    "Q4_0",   "Q4_1",    "Q4_2", "Q4_3", "Q5_0",  "Q5_1",    "Q8_0",  "Q8_1",
      "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",    "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL",  "IQ3_S",  "IQ2_S",  "IQ4_XS",  "I8",   "I16",  "I32",   "I64",     "F64",   "IQ1_M",
      "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8",
      "MXFP4"};
  return code < names.size() ? names[code] : std::string_view("?");
}

/// The llmkit dtype of a float or Q8_0 ggml type; the other quantised types
/// have none (they decode to f32) and give dtype::f32.
constexpr dtype to_dtype(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::f16: return dtype::f16;
    case ggml_type::bf16: return dtype::bf16;
    case ggml_type::q8_0: return dtype::q8_0;
    default: return dtype::f32;
  }
}

/// Elements per storage block (32 for Q4_0 ... Q8_0, IQ4_NL and MXFP4, 256 for the K-quants and IQ4_XS,
/// else 1) and bytes per block.
constexpr std::size_t ggml_block_elements(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::q4_0: case ggml_type::q4_1: case ggml_type::q5_0: case ggml_type::q5_1: case ggml_type::q8_0:
    case ggml_type::iq4_nl: case ggml_type::mxfp4:
      return 32;
    case ggml_type::q2_k: case ggml_type::q3_k: case ggml_type::q4_k: case ggml_type::q5_k: case ggml_type::q6_k:
    case ggml_type::iq4_xs:
      return 256;
    default: return 1;
  }
}
constexpr std::size_t ggml_block_bytes(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::f32: return 4;
    case ggml_type::f16: return 2;
    case ggml_type::bf16: return 2;
    case ggml_type::q4_0: return 18;
    case ggml_type::q4_1: return 20;
    case ggml_type::q5_0: return 22;
    case ggml_type::q5_1: return 24;
    case ggml_type::q8_0: return sizeof(block_q8_0);
    case ggml_type::q2_k: return 84;
    case ggml_type::q3_k: return 110;
    case ggml_type::q4_k: return 144;
    case ggml_type::q5_k: return 176;
    case ggml_type::q6_k: return 210;
    case ggml_type::iq4_nl: return 18;
    case ggml_type::iq4_xs: return 136;
    case ggml_type::mxfp4: return 17;
  }
  return 0;
}

/// True for the quantised (block) types.
constexpr bool is_quantized(ggml_type t) noexcept { return ggml_block_elements(t) > 1; }

/// Deepest nesting of arrays the reader accepts (arrays of arrays of ...).
inline constexpr std::size_t gguf_max_array_depth = 8;
/// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
inline constexpr std::size_t gguf_max_dims = 4;
/// Alignment of tensor data when `general.alignment` is absent.
inline constexpr std::size_t gguf_default_alignment = 32;

/// A metadata array: `size()` elements of `type()`. Numeric and bool
/// elements are read from the file bytes on access; strings and nested
/// arrays are parsed up front.
class gguf_array {
 public:
  gguf_type type() const noexcept { return type_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  /// Element i of a numeric or bool array, converted to T.
  /// @pre i < size(); T must hold the element exactly (an integer element must
  /// fit T; f32/f64 elements convert only to floating-point T).
  template <class T>
  T get(std::size_t i) const;

  /// [size()] the elements of a string array.
  std::span<const std::string_view> strings() const {
    LLMKIT_CHECK(type_ == gguf_type::string, "gguf_array::strings: array holds ", gguf_type_name(std::uint32_t(type_)),
                 ", not string");
    return strings_;
  }
  /// [size()] the elements of an array of arrays.
  std::span<const gguf_array> arrays() const {
    LLMKIT_CHECK(type_ == gguf_type::array, "gguf_array::arrays: array holds ", gguf_type_name(std::uint32_t(type_)),
                 ", not array");
    return arrays_;
  }
  /// The raw little-endian bytes of a numeric or bool array.
  std::span<const std::byte> raw_bytes() const noexcept { return {data_, bytes_}; }

 private:
  friend class gguf_file;
  gguf_type type_ = gguf_type::u8;
  std::size_t size_ = 0;
  const std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<std::string_view> strings_;
  std::vector<gguf_array> arrays_;
};

/// One metadata value. The variant's index is the GGUF type code.
using gguf_value = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t,
                                float, bool, std::string_view, gguf_array, std::uint64_t, std::int64_t, double>;

/// The GGUF type of a value.
inline gguf_type type_of(const gguf_value& v) noexcept { return static_cast<gguf_type>(v.index()); }

namespace detail {
/// Converts a scalar metadata value to T, or returns nullopt when the type
/// does not convert exactly (wrong kind, integer out of range).
template <class T, class V>
std::optional<T> convert_scalar(V v) {
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<V, bool>) {
    if constexpr (std::is_same_v<T, V>) return v;
    else return std::nullopt;
  } else if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_integral_v<V>) {
      if (!std::in_range<T>(v)) return std::nullopt;
      return static_cast<T>(v);
    } else {
      return std::nullopt;
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if constexpr (std::is_arithmetic_v<V>) return static_cast<T>(v);
    else return std::nullopt;
  } else {
    return std::nullopt;
  }
}

template <class T>
std::optional<T> convert_value(const gguf_value& value) {
  return std::visit(
      [](const auto& v) -> std::optional<T> {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_arithmetic_v<V>) return convert_scalar<T>(v);
        else if constexpr (std::is_same_v<T, V>) return v;
        else return std::nullopt;
      },
      value);
}

template <class V>
V load_le(const std::byte* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
}  // namespace detail

template <class T>
T gguf_array::get(std::size_t i) const {
  LLMKIT_CHECK(i < size_, "gguf_array::get: index ", i, " out of range for ", size_, " elements");
  const std::byte* p = data_;
  std::optional<T> out;
  switch (type_) {
    case gguf_type::u8: out = detail::convert_scalar<T>(detail::load_le<std::uint8_t>(p + i)); break;
    case gguf_type::i8: out = detail::convert_scalar<T>(detail::load_le<std::int8_t>(p + i)); break;
    case gguf_type::u16: out = detail::convert_scalar<T>(detail::load_le<std::uint16_t>(p + 2 * i)); break;
    case gguf_type::i16: out = detail::convert_scalar<T>(detail::load_le<std::int16_t>(p + 2 * i)); break;
    case gguf_type::u32: out = detail::convert_scalar<T>(detail::load_le<std::uint32_t>(p + 4 * i)); break;
    case gguf_type::i32: out = detail::convert_scalar<T>(detail::load_le<std::int32_t>(p + 4 * i)); break;
    case gguf_type::f32: out = detail::convert_scalar<T>(detail::load_le<float>(p + 4 * i)); break;
    case gguf_type::boolean: out = detail::convert_scalar<T>(detail::load_le<std::uint8_t>(p + i) != 0); break;
    case gguf_type::u64: out = detail::convert_scalar<T>(detail::load_le<std::uint64_t>(p + 8 * i)); break;
    case gguf_type::i64: out = detail::convert_scalar<T>(detail::load_le<std::int64_t>(p + 8 * i)); break;
    case gguf_type::f64: out = detail::convert_scalar<T>(detail::load_le<double>(p + 8 * i)); break;
    default: break;
  }
  LLMKIT_CHECK(out.has_value(), "gguf_array::get: element ", i, " of a ", gguf_type_name(std::uint32_t(type_)),
               " array does not convert to the requested type");
  return *out;
}

/// One tensor of the file. `dims[0]` is the innermost (contiguous)
/// dimension, as in ggml: a `[rows, cols]` row-major matrix has
/// dims = {cols, rows}.
struct gguf_tensor {
  std::string_view name;
  ggml_type type = ggml_type::f32;
  std::size_t n_dims = 0;
  std::array<std::uint64_t, gguf_max_dims> dims{1, 1, 1, 1};  ///< unused dims are 1
  std::uint64_t offset = 0;      ///< from the start of the data section
  std::uint64_t n_elements = 0;
  std::uint64_t n_bytes = 0;
  const std::byte* data = nullptr;  ///< [n_bytes] into the file

  /// dims[0] (row length) and the product of the other dims (row count).
  std::uint64_t cols() const noexcept { return dims[0]; }
  std::uint64_t rows() const noexcept { return dims[1] * dims[2] * dims[3]; }
};

/// What `gguf_file::advise` tells the kernel about a tensor's mapped pages.
enum class page_advice : std::uint8_t {
  will_need,  ///< read ahead now (madvise MADV_WILLNEED)
  dont_need,  ///< drop them from this process's resident set; read again on the next access (MADV_DONTNEED)
};

/// A parsed GGUF file. Move-only; views it hands out (strings, arrays,
/// tensor data) stay valid while it lives (and, for the span constructor,
/// while the caller's bytes live). The tensor data of a file from `open`
/// also stays valid while a `mapping_owner()` handle lives.
class gguf_file {
 public:
  /// Memory-maps `path` read-only and parses it.
  static gguf_file open(const std::string& path);

  /// Parses `[bytes.size()] bytes`, which the caller keeps alive.
  explicit gguf_file(std::span<const std::byte> bytes);

  gguf_file(gguf_file&&) noexcept = default;
  gguf_file& operator=(gguf_file&&) noexcept = default;

  std::uint32_t version() const noexcept { return version_; }
  std::size_t alignment() const noexcept { return alignment_; }
  /// File offset of the tensor data section.
  std::size_t data_offset() const noexcept { return data_offset_; }
  /// The whole file.
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

  /// True for a file from `open` (read-only, memory-mapped).
  bool is_mapped() const noexcept { return mapping_ != nullptr; }
  /// A handle that keeps the mapping, and so every tensor's `data`, valid
  /// after this object is gone (what a model using weights in place holds);
  /// null for the span constructor, whose bytes the caller owns.
  std::shared_ptr<const void> mapping_owner() const noexcept { return mapping_; }
  /// Advises the kernel about the whole pages inside tensor t's bytes (best
  /// effort, nothing for an unmapped file): read them ahead, or drop them
  /// from the resident set once the tensor has been copied.
  void advise(const gguf_tensor& t, page_advice advice) const noexcept;
  /// Locks the pages of tensor t's bytes in memory (mlock) for the mapping's
  /// lifetime; nothing for an unmapped file.
  /// @throws llmkit::error naming the tensor and the reason when the system
  /// refuses (e.g. RLIMIT_MEMLOCK, `ulimit -l`).
  void lock(const gguf_tensor& t) const;

  /// Every key/value in file order.
  std::span<const std::pair<std::string_view, gguf_value>> metadata() const noexcept { return metadata_; }
  /// The value of `key`, or null.
  const gguf_value* find(std::string_view key) const {
    auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
  }
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  /// The value of `key` converted to T (an arithmetic type, bool,
  /// std::string_view or gguf_array); nullopt when absent; `llmkit::error`
  /// when present with a type that does not convert exactly.
  template <class T>
  std::optional<T> get_optional(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return std::nullopt;
    auto out = detail::convert_value<T>(*v);
    LLMKIT_CHECK(out.has_value(), "gguf: metadata key '", key, "' has type ", gguf_type_name(std::uint32_t(v->index())),
                 value_suffix(*v), " which does not convert to the requested type");
    return out;
  }
  /// The value of `key` converted to T; `llmkit::error` when absent.
  template <class T>
  T get(std::string_view key) const {
    auto out = get_optional<T>(key);
    LLMKIT_CHECK(out.has_value(), "gguf: missing metadata key '", key, "'");
    return *std::move(out);
  }
  /// The array at `key`; `llmkit::error` when absent or not an array.
  const gguf_array& get_array(std::string_view key) const;

  /// Every tensor in file order.
  std::span<const gguf_tensor> tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or null.
  const gguf_tensor* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// The tensor called `name`; `llmkit::error` when absent.
  const gguf_tensor& tensor(std::string_view name) const;

 private:
  gguf_file() = default;

  // " (value)" after a scalar's type in an error message, else "".
  static std::string value_suffix(const gguf_value& v);

  // A bounds-checked little-endian cursor over the file.
  struct cursor;
  static std::size_t scalar_size(gguf_type t) noexcept;
  static gguf_type read_type(cursor& c, const char* what);
  static gguf_array read_array(cursor& c, std::size_t depth);
  static gguf_value read_value(cursor& c, gguf_type t);
  void parse(std::span<const std::byte> bytes);
  static std::string to_hex(std::uint32_t v);

  std::shared_ptr<const detail::mapped_file> mapping_;
  std::span<const std::byte> bytes_;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = gguf_default_alignment;
  std::size_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, gguf_value>> metadata_;
  std::unordered_map<std::string_view, std::size_t> key_index_;
  std::vector<gguf_tensor> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;
};

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/gguf.ipp"
#endif
