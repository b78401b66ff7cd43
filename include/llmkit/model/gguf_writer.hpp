// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/gguf_writer.hpp
/// Writes GGUF (version 3 by default, or 2) files: metadata of every value
/// type, including arrays of strings and nested arrays, and tensors of the
/// types the reader supports. Used by the synthetic-model writer, the tests
/// and the fuzzer's seed corpus.
///
/// ```
/// gguf_writer w;
/// w.add("general.architecture", std::string_view("llama"));
/// w.add("llama.block_count", std::uint32_t{12});
/// w.add_tensor("output_norm.weight", ggml_type::f32, {768}, std::as_bytes(std::span(norm)));
/// w.write("model.gguf");
/// ```
///
/// A tensor may also be added as a fill function, called when the image is
/// emitted: `write` then holds one such tensor in memory at a time, so a
/// file larger than memory can be written.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"

namespace llmkit::model {

/// Builds a GGUF image in memory; `bytes()` or `write(path)` emit it.
class gguf_writer {
 public:
  /// @param version 2 or 3 (same layout on little-endian hosts)
  /// @param alignment tensor data alignment, a power of two; a value other
  /// than 32 is recorded as `general.alignment`
  explicit gguf_writer(std::uint32_t version = 3, std::uint32_t alignment = gguf_default_alignment);

  /// Adds a scalar (any of the 11 numeric types or bool) or a string.
  template <class T>
  void add(std::string_view key, T value) {
    put_string(meta_, key);
    put_value(meta_, value);
    ++n_kv_;
  }
  /// Adds an array of numbers or bools: `[values.size()] values`.
  template <class T>
    requires std::is_arithmetic_v<T>
  void add_array(std::string_view key, std::span<const T> values) {
    put_string(meta_, key);
    put<std::uint32_t>(meta_, std::uint32_t(gguf_type::array));
    put<std::uint32_t>(meta_, std::uint32_t(type_code<T>()));
    put<std::uint64_t>(meta_, values.size());
    for (const T& v : values) put_scalar(meta_, v);
    ++n_kv_;
  }
  /// Adds an array of strings.
  template <class S>
  void add_string_array(std::string_view key, std::span<const S> values) {
    put_string(meta_, key);
    put<std::uint32_t>(meta_, std::uint32_t(gguf_type::array));
    put<std::uint32_t>(meta_, std::uint32_t(gguf_type::string));
    put<std::uint64_t>(meta_, values.size());
    for (const auto& v : values) put_string(meta_, std::string_view(v));
    ++n_kv_;
  }
  /// Adds a value whose encoding (everything after the type code) the caller
  /// built: nested arrays, or deliberately malformed values in tests.
  void add_raw(std::string_view key, std::uint32_t type_code, std::span<const std::byte> encoded);

  /// Adds a tensor. `dims[0]` is the innermost dimension (ggml order);
  /// `data` holds exactly the tensor's bytes.
  void add_tensor(std::string_view name, ggml_type type, std::initializer_list<std::uint64_t> dims,
                  std::span<const std::byte> data) {
    add_tensor(name, type, std::span<const std::uint64_t>(dims.begin(), dims.size()), data);
  }
  void add_tensor(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims,
                  std::span<const std::byte> data);

  /// Writes a deferred tensor's bytes: `out` is exactly the tensor's size.
  using tensor_fill = std::function<void(std::span<std::byte> out)>;
  /// Adds a tensor whose bytes `fill` writes when the image is emitted (by
  /// `bytes()` or `write()`, each calling every fill once, in the order the
  /// tensors were added, so fills may share state such as a random stream).
  void add_tensor(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims, tensor_fill fill);

  /// The complete file image.
  std::vector<std::byte> bytes() const;

  /// Writes the image to `path` (replacing it), streaming the tensor data:
  /// a deferred tensor is filled into a buffer of its own size, written, and
  /// the buffer reused.
  void write(const std::string& path) const;

  /// Little-endian encoders, public so tests can build raw values.
  template <class V>
  static void put(std::vector<std::byte>& out, V v) {
    const auto at = out.size();
    out.resize(at + sizeof(V));
    std::memcpy(out.data() + at, &v, sizeof(V));
  }
  static void put_string(std::vector<std::byte>& out, std::string_view s) {
    put<std::uint64_t>(out, s.size());
    const auto at = out.size();
    out.resize(at + s.size());
    if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
  }

  /// The GGUF type code of a C++ scalar type.
  template <class T>
  static constexpr gguf_type type_code() {
    if constexpr (std::is_same_v<T, bool>) return gguf_type::boolean;
    else if constexpr (std::is_same_v<T, std::uint8_t>) return gguf_type::u8;
    else if constexpr (std::is_same_v<T, std::int8_t>) return gguf_type::i8;
    else if constexpr (std::is_same_v<T, std::uint16_t>) return gguf_type::u16;
    else if constexpr (std::is_same_v<T, std::int16_t>) return gguf_type::i16;
    else if constexpr (std::is_same_v<T, std::uint32_t>) return gguf_type::u32;
    else if constexpr (std::is_same_v<T, std::int32_t>) return gguf_type::i32;
    else if constexpr (std::is_same_v<T, float>) return gguf_type::f32;
    else if constexpr (std::is_same_v<T, std::uint64_t>) return gguf_type::u64;
    else if constexpr (std::is_same_v<T, std::int64_t>) return gguf_type::i64;
    else if constexpr (std::is_same_v<T, double>) return gguf_type::f64;
    else static_assert(sizeof(T) == 0, "gguf_writer: not a GGUF scalar type");
  }

 private:
  // Header, metadata, tensor infos and the padding before the data section.
  std::vector<std::byte> head() const;
  // Records a tensor's info at the next aligned offset of the data section.
  void add_info(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims, std::uint64_t bytes);

  // One tensor of the data section: its bytes, or the fill that makes them.
  struct tensor_data {
    std::uint64_t offset;  ///< from the start of the data section
    std::uint64_t size;
    std::vector<std::byte> bytes;  ///< empty when deferred
    tensor_fill fill;
  };

  template <class T>
  static void put_scalar(std::vector<std::byte>& out, T v) {
    if constexpr (std::is_same_v<T, bool>) put<std::uint8_t>(out, v ? 1 : 0);
    else put<T>(out, v);
  }
  template <class T>
  static void put_value(std::vector<std::byte>& out, T v) {
    if constexpr (std::is_convertible_v<T, std::string_view> && !std::is_arithmetic_v<T>) {
      put<std::uint32_t>(out, std::uint32_t(gguf_type::string));
      put_string(out, std::string_view(v));
    } else {
      put<std::uint32_t>(out, std::uint32_t(type_code<T>()));
      put_scalar(out, v);
    }
  }

  std::uint32_t version_;
  std::uint32_t alignment_;
  std::uint64_t n_kv_ = 0;
  std::uint64_t n_tensors_ = 0;
  std::vector<std::byte> meta_;
  std::vector<std::byte> infos_;
  std::vector<tensor_data> tensors_;
  std::uint64_t data_size_ = 0;  ///< the data section's size so far
};

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/gguf_writer.ipp"
#endif
