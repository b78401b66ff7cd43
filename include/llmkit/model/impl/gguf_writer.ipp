// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/gguf_writer.ipp
/// gguf_writer's tensors and file image (model/gguf_writer.hpp): compiled
/// inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

#include <cstddef>
#include <cstdint>
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

LLMKIT_DECL void gguf_writer::add_tensor(std::string_view name, ggml_type type, std::span<const std::uint64_t> dims,
                                         std::span<const std::byte> data) {
  LLMKIT_CHECK(!dims.empty() && dims.size() <= gguf_max_dims, "gguf_writer: tensor '", name, "' has ",
               dims.size(), " dims (must be 1..", gguf_max_dims, ")");
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  const std::size_t block = ggml_block_elements(type);
  LLMKIT_CHECK(dims[0] % block == 0, "gguf_writer: tensor '", name, "' row length ", dims[0],
               " is not a multiple of the block size ", block);
  const std::uint64_t expected = n / block * ggml_block_bytes(type);
  LLMKIT_CHECK(data.size() == expected, "gguf_writer: tensor '", name, "' needs ", expected, " bytes, got ",
               data.size());
  while (data_.size() % alignment_) data_.push_back(std::byte{0});
  put_string(infos_, name);
  put<std::uint32_t>(infos_, static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) put<std::uint64_t>(infos_, d);
  put<std::uint32_t>(infos_, std::uint32_t(type));
  put<std::uint64_t>(infos_, data_.size());
  data_.insert(data_.end(), data.begin(), data.end());
  ++n_tensors_;
}

LLMKIT_DECL std::vector<std::byte> gguf_writer::bytes() const {
  std::vector<std::byte> out = head();
  out.insert(out.end(), data_.begin(), data_.end());
  return out;
}

LLMKIT_DECL void gguf_writer::write(const std::string& path) const {
  const auto h = head();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  LLMKIT_CHECK(f.good(), "gguf_writer: cannot open '", path, "' for writing");
  f.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size()));
  f.write(reinterpret_cast<const char*>(data_.data()), static_cast<std::streamsize>(data_.size()));
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
