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
/// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (block layouts in
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

#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/detail/mapped_file.hpp"

namespace llmkit::model {

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
  q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30,
};

/// True for the codes of ggml_type (the types the reader accepts).
constexpr bool is_supported_ggml_type(std::uint32_t code) noexcept {
  switch (code) {
    case 0: case 1: case 2: case 3: case 6: case 7: case 8: case 12: case 13: case 14: case 30: return true;
    default: return false;
  }
}

/// Printable name of any ggml tensor type code ("F32", "Q4_K", ...), or "?".
constexpr std::string_view ggml_type_name(std::uint32_t code) noexcept {
  constexpr std::array<std::string_view, 39> names{
      "F32",     "F16",    "Q4_0",   "Q4_1",    "Q4_2", "Q4_3", "Q5_0",  "Q5_1",    "Q8_0",  "Q8_1",
      "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",    "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL",  "IQ3_S",  "IQ2_S",  "IQ4_XS",  "I8",   "I16",  "I32",   "I64",     "F64",   "IQ1_M",
      "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8"};
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

/// Elements per storage block (32 for Q4_0 ... Q8_0, 256 for the K-quants,
/// else 1) and bytes per block.
constexpr std::size_t ggml_block_elements(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::q4_0: case ggml_type::q4_1: case ggml_type::q5_0: case ggml_type::q5_1: case ggml_type::q8_0:
      return 32;
    case ggml_type::q4_k: case ggml_type::q5_k: case ggml_type::q6_k: return 256;
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
    case ggml_type::q4_k: return 144;
    case ggml_type::q5_k: return 176;
    case ggml_type::q6_k: return 210;
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

/// A parsed GGUF file. Move-only; views it hands out (strings, arrays,
/// tensor data) stay valid while it lives (and, for the span constructor,
/// while the caller's bytes live).
class gguf_file {
 public:
  /// Memory-maps `path` read-only and parses it.
  static gguf_file open(const std::string& path) {
    auto mapping = std::make_shared<detail::mapped_file>(path);
    gguf_file f;
    f.mapping_ = mapping;
    f.parse(mapping->bytes());
    return f;
  }

  /// Parses `[bytes.size()] bytes`, which the caller keeps alive.
  explicit gguf_file(std::span<const std::byte> bytes) { parse(bytes); }

  gguf_file(gguf_file&&) noexcept = default;
  gguf_file& operator=(gguf_file&&) noexcept = default;

  std::uint32_t version() const noexcept { return version_; }
  std::size_t alignment() const noexcept { return alignment_; }
  /// File offset of the tensor data section.
  std::size_t data_offset() const noexcept { return data_offset_; }
  /// The whole file.
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

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
  const gguf_array& get_array(std::string_view key) const {
    const gguf_value* v = find(key);
    LLMKIT_CHECK(v != nullptr, "gguf: missing metadata key '", key, "'");
    LLMKIT_CHECK(v->index() == std::size_t(gguf_type::array), "gguf: metadata key '", key, "' has type ",
                 gguf_type_name(std::uint32_t(v->index())), ", expected array");
    return std::get<gguf_array>(*v);
  }

  /// Every tensor in file order.
  std::span<const gguf_tensor> tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or null.
  const gguf_tensor* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// The tensor called `name`; `llmkit::error` when absent.
  const gguf_tensor& tensor(std::string_view name) const {
    const gguf_tensor* t = find_tensor(name);
    LLMKIT_CHECK(t != nullptr, "gguf: missing tensor '", name, "'");
    return *t;
  }

 private:
  gguf_file() = default;

  static std::string value_suffix(const gguf_value& v) {
    return std::visit(
        [](const auto& x) -> std::string {
          using V = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<V, bool>) return x ? " (true)" : " (false)";
          else if constexpr (std::is_arithmetic_v<V>) return " (" + std::to_string(x) + ")";
          else return "";
        },
        v);
  }

  // A bounds-checked little-endian cursor.
  struct cursor {
    std::span<const std::byte> bytes;
    std::size_t pos = 0;

    std::size_t remaining() const noexcept { return bytes.size() - pos; }
    void need(std::size_t n, const char* what) const {
      LLMKIT_CHECK(n <= remaining(), "gguf: truncated file: ", what, " needs ", n, " bytes at offset ", pos,
                   " but the file has ", bytes.size(), " bytes");
    }
    template <class V>
    V read(const char* what) {
      need(sizeof(V), what);
      V v = detail::load_le<V>(bytes.data() + pos);
      pos += sizeof(V);
      return v;
    }
    std::string_view read_string(const char* what) {
      const std::size_t at = pos;
      const auto n = read<std::uint64_t>(what);
      LLMKIT_CHECK(n <= remaining(), "gguf: ", what, " at offset ", at, " has length ", n, " beyond the ",
                   remaining(), " bytes left in the file");
      std::string_view s(reinterpret_cast<const char*>(bytes.data() + pos), static_cast<std::size_t>(n));
      pos += static_cast<std::size_t>(n);
      return s;
    }
  };

  static std::size_t scalar_size(gguf_type t) noexcept {
    switch (t) {
      case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
      case gguf_type::u16: case gguf_type::i16: return 2;
      case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
      case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
      default: return 0;
    }
  }

  static gguf_type read_type(cursor& c, const char* what) {
    const std::size_t at = c.pos;
    const auto code = c.read<std::uint32_t>(what);
    LLMKIT_CHECK(code <= 12, "gguf: unknown metadata value type ", code, " for ", what, " at offset ", at);
    return static_cast<gguf_type>(code);
  }

  static gguf_array read_array(cursor& c, std::size_t depth) {
    LLMKIT_CHECK(depth < gguf_max_array_depth, "gguf: metadata arrays nested deeper than ", gguf_max_array_depth,
                 " levels at offset ", c.pos);
    gguf_array a;
    a.type_ = read_type(c, "array element type");
    const std::size_t at = c.pos;
    const auto count = c.read<std::uint64_t>("array length");
    // Smallest encoding of one element: a scalar's size, a string's length
    // field, an array's type + length. Bounds the count before allocating.
    const std::size_t min_bytes = a.type_ == gguf_type::string  ? 8
                                  : a.type_ == gguf_type::array ? 12
                                                                : scalar_size(a.type_);
    LLMKIT_CHECK(count <= c.remaining() / min_bytes, "gguf: array at offset ", at, " claims ", count, " elements of ",
                 gguf_type_name(std::uint32_t(a.type_)), " but only ", c.remaining(), " bytes are left");
    a.size_ = static_cast<std::size_t>(count);
    if (a.type_ == gguf_type::string) {
      a.strings_.reserve(a.size_);
      for (std::size_t i = 0; i < a.size_; ++i) a.strings_.push_back(c.read_string("array string"));
    } else if (a.type_ == gguf_type::array) {
      a.arrays_.reserve(a.size_);
      for (std::size_t i = 0; i < a.size_; ++i) a.arrays_.push_back(read_array(c, depth + 1));
    } else {
      a.bytes_ = a.size_ * min_bytes;
      a.data_ = c.bytes.data() + c.pos;
      if (a.type_ == gguf_type::boolean)
        for (std::size_t i = 0; i < a.size_; ++i)
          LLMKIT_CHECK(std::to_integer<unsigned>(a.data_[i]) <= 1, "gguf: bool array element ", i, " at offset ",
                       c.pos + i, " is ", std::to_integer<unsigned>(a.data_[i]), ", not 0 or 1");
      c.pos += a.bytes_;
    }
    return a;
  }

  static gguf_value read_value(cursor& c, gguf_type t) {
    switch (t) {
      case gguf_type::u8: return c.read<std::uint8_t>("u8 value");
      case gguf_type::i8: return c.read<std::int8_t>("i8 value");
      case gguf_type::u16: return c.read<std::uint16_t>("u16 value");
      case gguf_type::i16: return c.read<std::int16_t>("i16 value");
      case gguf_type::u32: return c.read<std::uint32_t>("u32 value");
      case gguf_type::i32: return c.read<std::int32_t>("i32 value");
      case gguf_type::f32: return c.read<float>("f32 value");
      case gguf_type::boolean: {
        const std::size_t at = c.pos;
        const auto b = c.read<std::uint8_t>("bool value");
        LLMKIT_CHECK(b <= 1, "gguf: bool value at offset ", at, " is ", unsigned(b), ", not 0 or 1");
        return b != 0;
      }
      case gguf_type::string: return c.read_string("string value");
      case gguf_type::array: return read_array(c, 0);
      case gguf_type::u64: return c.read<std::uint64_t>("u64 value");
      case gguf_type::i64: return c.read<std::int64_t>("i64 value");
      case gguf_type::f64: return c.read<double>("f64 value");
    }
    return std::uint8_t{0};  // unreachable: read_type validated t
  }

  void parse(std::span<const std::byte> bytes) {
    bytes_ = bytes;
    cursor c{bytes};
    const auto magic = c.read<std::uint32_t>("magic");
    LLMKIT_CHECK(magic == 0x46554747u, "gguf: bad magic 0x", to_hex(magic), " (expected \"GGUF\")");
    version_ = c.read<std::uint32_t>("version");
    LLMKIT_CHECK(version_ == 2 || version_ == 3, "gguf: unsupported version ", version_, " (supported: 2, 3)");
    const auto n_tensors = c.read<std::uint64_t>("tensor count");
    const auto n_kv = c.read<std::uint64_t>("metadata count");
    // A key/value takes >= 13 bytes (key length, type, 1-byte value); a
    // tensor info >= 24 (name length, n_dims, type, offset).
    LLMKIT_CHECK(n_kv <= c.remaining() / 13, "gguf: metadata count ", n_kv, " is impossible for a file of ",
                 bytes.size(), " bytes");
    LLMKIT_CHECK(n_tensors <= c.remaining() / 24, "gguf: tensor count ", n_tensors, " is impossible for a file of ",
                 bytes.size(), " bytes");

    metadata_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::size_t at = c.pos;
      const std::string_view key = c.read_string("metadata key");
      const gguf_type t = read_type(c, "metadata value type");
      metadata_.emplace_back(key, read_value(c, t));
      LLMKIT_CHECK(key_index_.emplace(key, metadata_.size() - 1).second, "gguf: duplicate metadata key '", key,
                   "' at offset ", at);
    }

    alignment_ = gguf_default_alignment;
    if (const gguf_value* a = find("general.alignment")) {
      LLMKIT_CHECK(a->index() == std::size_t(gguf_type::u32), "gguf: general.alignment has type ",
                   gguf_type_name(std::uint32_t(a->index())), ", expected u32");
      const auto v = std::get<std::uint32_t>(*a);
      LLMKIT_CHECK(v != 0 && (v & (v - 1)) == 0, "gguf: general.alignment ", v, " is not a power of two");
      alignment_ = v;
    }

    tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      gguf_tensor t;
      t.name = c.read_string("tensor name");
      const std::size_t dims_at = c.pos;
      const auto n_dims = c.read<std::uint32_t>("tensor n_dims");
      LLMKIT_CHECK(n_dims >= 1 && n_dims <= gguf_max_dims, "gguf: tensor '", t.name, "' has n_dims ", n_dims,
                   " at offset ", dims_at, " (must be 1..", gguf_max_dims, ")");
      t.n_dims = n_dims;
      std::uint64_t n_elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto dim = c.read<std::uint64_t>("tensor dimension");
        LLMKIT_CHECK(dim >= 1 && dim <= (std::uint64_t{1} << 62) / n_elements, "gguf: tensor '", t.name,
                     "' dimension ", d, " = ", dim, " is zero or makes the element count overflow");
        t.dims[d] = dim;
        n_elements *= dim;
      }
      t.n_elements = n_elements;
      const std::size_t type_at = c.pos;
      const auto type_code = c.read<std::uint32_t>("tensor type");
      LLMKIT_CHECK(is_supported_ggml_type(type_code), "gguf: tensor '", t.name, "' has unsupported type ",
                   ggml_type_name(type_code), " (", type_code, ") at offset ", type_at,
                   "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
      t.type = static_cast<ggml_type>(type_code);
      const std::size_t block = ggml_block_elements(t.type);
      LLMKIT_CHECK(t.dims[0] % block == 0, "gguf: tensor '", t.name, "' of type ", ggml_type_name(type_code),
                   " has row length ", t.dims[0], ", not a multiple of its block size ", block);
      t.n_bytes = n_elements / block * ggml_block_bytes(t.type);
      t.offset = c.read<std::uint64_t>("tensor offset");
      LLMKIT_CHECK(t.offset % alignment_ == 0, "gguf: tensor '", t.name, "' offset ", t.offset,
                   " is not a multiple of the alignment ", alignment_);
      tensors_.push_back(t);
      LLMKIT_CHECK(tensor_index_.emplace(t.name, tensors_.size() - 1).second, "gguf: duplicate tensor name '",
                   t.name, "'");
    }

    // The data section starts at the next multiple of the alignment; a file
    // without tensors may end before it.
    const std::size_t pad = (alignment_ - c.pos % alignment_) % alignment_;
    data_offset_ = c.pos + pad;
    if (tensors_.empty()) data_offset_ = std::min(data_offset_, bytes.size());
    LLMKIT_CHECK(data_offset_ <= bytes.size(), "gguf: truncated file: data section starts at offset ", data_offset_,
                 " but the file has ", bytes.size(), " bytes");
    const std::uint64_t data_size = bytes.size() - data_offset_;
    for (auto& t : tensors_) {
      LLMKIT_CHECK(t.offset <= data_size && t.n_bytes <= data_size - t.offset, "gguf: tensor '", t.name,
                   "' data [", t.offset, ", +", t.n_bytes, ") runs past the end of the data section (", data_size,
                   " bytes)");
      t.data = bytes.data() + data_offset_ + t.offset;
    }
  }

  static std::string to_hex(std::uint32_t v) {
    constexpr char digits[] = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15u];
    return s;
  }

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
