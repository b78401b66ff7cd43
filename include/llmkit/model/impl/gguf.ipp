// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/gguf.ipp
/// gguf_file's parser (model/gguf.hpp): compiled inline by the header, or
/// once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/detail/mapped_file.hpp"
#include "llmkit/model/gguf.hpp"

namespace llmkit::model {

LLMKIT_DECL gguf_file gguf_file::open(const std::string& path) {
  auto mapping = std::make_shared<detail::mapped_file>(path);
  gguf_file f;
  f.mapping_ = mapping;
  f.parse(mapping->bytes());
  return f;
}

LLMKIT_DECL gguf_file::gguf_file(std::span<const std::byte> bytes) { parse(bytes); }

LLMKIT_DECL void gguf_file::advise(const gguf_tensor& t, page_advice advice) const noexcept {
  if (!mapping_) return;
  detail::advise_pages({t.data, static_cast<std::size_t>(t.n_bytes)},
                       advice == page_advice::will_need ? detail::page_hint::will_need : detail::page_hint::dont_need);
}

LLMKIT_DECL void gguf_file::lock(const gguf_tensor& t) const {
  if (!mapping_) return;
  const int err = detail::lock_pages({t.data, static_cast<std::size_t>(t.n_bytes)});
  LLMKIT_CHECK(err == 0, "gguf: cannot lock tensor '", t.name, "' (", t.n_bytes, " bytes) in memory: ",
               std::strerror(err), err == ENOMEM || err == EPERM ? " (raise the locked-memory limit: ulimit -l)" : "");
}

LLMKIT_DECL const gguf_array& gguf_file::get_array(std::string_view key) const {
  const gguf_value* v = find(key);
  LLMKIT_CHECK(v != nullptr, "gguf: missing metadata key '", key, "'");
  LLMKIT_CHECK(v->index() == std::size_t(gguf_type::array), "gguf: metadata key '", key, "' has type ",
               gguf_type_name(std::uint32_t(v->index())), ", expected array");
  return std::get<gguf_array>(*v);
}

LLMKIT_DECL const gguf_tensor& gguf_file::tensor(std::string_view name) const {
  const gguf_tensor* t = find_tensor(name);
  LLMKIT_CHECK(t != nullptr, "gguf: missing tensor '", name, "'");
  return *t;
}

LLMKIT_DECL std::string gguf_file::value_suffix(const gguf_value& v) {
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
struct gguf_file::cursor {
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

LLMKIT_DECL std::size_t gguf_file::scalar_size(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
    default: return 0;
  }
}

LLMKIT_DECL gguf_type gguf_file::read_type(cursor& c, const char* what) {
  const std::size_t at = c.pos;
  const auto code = c.read<std::uint32_t>(what);
  LLMKIT_CHECK(code <= 12, "gguf: unknown metadata value type ", code, " for ", what, " at offset ", at);
  return static_cast<gguf_type>(code);
}

LLMKIT_DECL gguf_array gguf_file::read_array(cursor& c, std::size_t depth) {
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

LLMKIT_DECL gguf_value gguf_file::read_value(cursor& c, gguf_type t) {
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

LLMKIT_DECL void gguf_file::parse(std::span<const std::byte> bytes) {
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
                 "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, ",
                 "IQ4_NL, IQ4_XS");
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

LLMKIT_DECL std::string gguf_file::to_hex(std::uint32_t v) {
  constexpr char digits[] = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15u];
  return s;
}

}  // namespace llmkit::model
