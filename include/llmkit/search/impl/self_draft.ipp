// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/impl/self_draft.ipp
/// The self-draft writer (search/self_draft.hpp): compiled inline by the
/// header, or once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/gguf_writer.hpp"
#include "llmkit/model/quants.hpp"
#include "llmkit/search/self_draft.hpp"

namespace llmkit::search {

namespace detail {
/// Elements of a tensor as f32 (any type the GGUF reader accepts).
inline std::vector<float> tensor_as_f32(const model::gguf_tensor& t) {
  const std::size_t n = static_cast<std::size_t>(t.n_elements);
  std::vector<float> out(n);
  model::dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

/// f32 values (a multiple of 32) as Q8_0 blocks: scale = max|x| / 127, q = round(x / scale).
inline std::vector<std::byte> encode_q8_0(std::span<const float> values) {
  std::vector<std::byte> out(values.size() / q8_block_size * sizeof(block_q8_0));
  for (std::size_t blk = 0; blk < values.size() / q8_block_size; ++blk) {
    const float* x = values.data() + blk * q8_block_size;
    float amax = 0.0f;
    for (std::size_t j = 0; j < q8_block_size; ++j) amax = std::max(amax, std::fabs(x[j]));
    block_q8_0 q;
    q.scale = to_f16(amax / 127.0f);
    const float scale = to_f32(q.scale);
    for (std::size_t j = 0; j < q8_block_size; ++j)
      q.qs[j] = scale > 0.0f ? static_cast<std::int8_t>(std::clamp(std::lround(x[j] / scale), -127l, 127l)) : 0;
    std::memcpy(out.data() + blk * sizeof(block_q8_0), &q, sizeof q);
  }
  return out;
}

/// The layer index of a "blk.N.*" tensor name, or -1.
inline long block_index(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  long n = 0;
  std::size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? n : -1;
}
}  // namespace detail

LLMKIT_DECL std::vector<std::byte> self_draft_gguf(const model::gguf_file& target, const self_draft_options& options) {
  const auto arch = target.get<std::string_view>("general.architecture");
  const std::string prefix = std::string(arch) + ".";
  const std::string block_key = prefix + "block_count";
  const auto n_blocks = target.get<std::uint64_t>(block_key);
  const std::size_t keep = options.n_layers == 0 ? static_cast<std::size_t>(n_blocks) : options.n_layers;
  LLMKIT_CHECK(keep >= 1 && keep <= n_blocks, "self_draft_gguf: n_layers = ", options.n_layers, " is outside [1, ",
               n_blocks, "] (", block_key, ")");
  model::gguf_writer w(3, static_cast<std::uint32_t>(target.alignment()));
  w.add("general.architecture", arch);
  // Plain references, not a structured binding: clang before 16 cannot
  // capture a binding in the lambda below.
  for (const auto& entry : target.metadata()) {
    const auto& key = entry.first;
    const auto& value = entry.second;
    if (key.substr(0, prefix.size()) != prefix) continue;
    if (key == block_key) {
      w.add(key, static_cast<std::uint32_t>(keep));
      continue;
    }
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (!std::is_same_v<V, model::gguf_array>) w.add(key, v);
        },
        value);
  }
  for (const model::gguf_tensor& t : target.tensors()) {
    const long layer = detail::block_index(t.name);
    if (layer >= static_cast<long>(keep)) continue;
    const std::span<const std::uint64_t> dims(t.dims.data(), t.n_dims);
    const bool quantize = options.int8_weights && t.n_dims == 2 && t.dims[0] % q8_block_size == 0 &&
                          t.type != model::ggml_type::q8_0;
    if (quantize) {
      const std::vector<float> values = detail::tensor_as_f32(t);
      const std::vector<std::byte> q = detail::encode_q8_0(values);
      w.add_tensor(t.name, model::ggml_type::q8_0, dims, q);
    } else {
      w.add_tensor(t.name, t.type, dims, std::span<const std::byte>(t.data, static_cast<std::size_t>(t.n_bytes)));
    }
  }
  return w.bytes();
}

}  // namespace llmkit::search
