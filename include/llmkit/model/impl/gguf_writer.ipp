// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/gguf_writer.ipp
/// gguf_writer's tensors and file image (model/gguf_writer.hpp): compiled
/// inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"

namespace llmkit::model {

LLMKIT_DECL gguf_writer::gguf_writer(std::uint32_t version, std::uint32_t alignment)
    : version_(version), alignment_(alignment) {
  LLMKIT_CHECK(version == 2 || version == 3, "gguf_writer: version must be 2 or 3, got ", version);
  LLMKIT_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
               "gguf_writer: alignment must be a power of two, got ", alignment);
  if (alignment != gguf_default_alignment) add("general.alignment", alignment);
}

LLMKIT_DECL void gguf_writer::add_raw(std::string_view key, std::uint32_t type_code, std::span<const std::byte> encoded) {
  put_string(meta_, key);
  put<std::uint32_t>(meta_, type_code);
  meta_.insert(meta_.end(), encoded.begin(), encoded.end());
  ++n_kv_;
}

LLMKIT_DECL void gguf_writer::add_info(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims,
                                       std::uint64_t bytes) {
  LLMKIT_CHECK(!dims.empty() && dims.size() <= gguf_max_dims, "gguf_writer: tensor '", name, "' has ",
               dims.size(), " dims (must be 1..", gguf_max_dims, ")");
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  const std::size_t block = ggml_block_elements(type);
  LLMKIT_CHECK(dims[0] % block == 0, "gguf_writer: tensor '", name, "' row length ", dims[0],
               " is not a multiple of the block size ", block);
  const std::uint64_t expected = n / block * ggml_block_bytes(type);
  LLMKIT_CHECK(bytes == expected, "gguf_writer: tensor '", name, "' needs ", expected, " bytes, got ", bytes);
  data_size_ = (data_size_ + alignment_ - 1) / alignment_ * alignment_;
  put_string(infos_, name);
  put<std::uint32_t>(infos_, static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) put<std::uint64_t>(infos_, d);
  put<std::uint32_t>(infos_, std::uint32_t(type));
  put<std::uint64_t>(infos_, data_size_);
  tensors_.push_back({.offset = data_size_, .size = expected, .bytes = {}, .fill = {}});
  data_size_ += expected;
  ++n_tensors_;
}

LLMKIT_DECL void gguf_writer::add_tensor(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims,
                                         std::span<const std::byte> data) {
  add_info(name, type, dims, data.size());
  tensors_.back().bytes.assign(data.begin(), data.end());
}

LLMKIT_DECL void gguf_writer::add_tensor(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims,
                                         tensor_fill fill) {
  LLMKIT_CHECK(static_cast<bool>(fill), "gguf_writer: tensor '", name, "' has an empty fill function");
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  add_info(name, type, dims, n / ggml_block_elements(type) * ggml_block_bytes(type));
  tensors_.back().fill = std::move(fill);
}

LLMKIT_DECL std::vector<std::byte> gguf_writer::bytes() const {
  std::vector<std::byte> out = head();
  const std::size_t data_start = out.size();
  out.resize(data_start + data_size_);
  for (const tensor_data& t : tensors_) {
    const std::span<std::byte> dst(out.data() + data_start + t.offset, t.size);
    if (t.fill) t.fill(dst);
    else std::copy(t.bytes.begin(), t.bytes.end(), dst.begin());
  }
  return out;
}

LLMKIT_DECL void gguf_writer::write(const std::string& path) const {
  const auto h = head();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  LLMKIT_CHECK(f.good(), "gguf_writer: cannot open '", path, "' for writing");
  f.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size()));
  std::uint64_t at = 0;
  std::vector<std::byte> buffer;
  const char zeros[64] = {};
  for (const tensor_data& t : tensors_) {
    for (; at < t.offset; at += std::min<std::uint64_t>(sizeof zeros, t.offset - at))
      f.write(zeros, static_cast<std::streamsize>(std::min<std::uint64_t>(sizeof zeros, t.offset - at)));
    const std::byte* src = t.bytes.data();
    if (t.fill) {
      buffer.resize(t.size);
      t.fill(buffer);
      src = buffer.data();
    }
    f.write(reinterpret_cast<const char*>(src), static_cast<std::streamsize>(t.size));
    at += t.size;
  }
  LLMKIT_CHECK(f.good(), "gguf_writer: writing '", path, "' failed");
}

LLMKIT_DECL std::vector<std::byte> gguf_writer::head() const {
  std::vector<std::byte> out;
  put<std::uint32_t>(out, 0x46554747u);
  put<std::uint32_t>(out, version_);
  put<std::uint64_t>(out, n_tensors_);
  put<std::uint64_t>(out, n_kv_);
  out.insert(out.end(), meta_.begin(), meta_.end());
  out.insert(out.end(), infos_.begin(), infos_.end());
  if (n_tensors_ > 0)
    while (out.size() % alignment_) out.push_back(std::byte{0});
  return out;
}

}  // namespace llmkit::model
