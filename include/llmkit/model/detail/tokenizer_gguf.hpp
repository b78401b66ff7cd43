// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/tokenizer_gguf.hpp
/// GGUF keys every tokenizer reads the same way: token types and special ids.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model::detail {

/// `tokenizer.ggml.token_type` checked against `n_tokens` (all normal when
/// the key is absent).
inline std::vector<token_type> read_token_types(const gguf_file& file, std::size_t n_tokens) {
  std::vector<token_type> types(n_tokens, token_type::normal);
  if (!file.contains("tokenizer.ggml.token_type")) return types;
  const auto& t = file.get_array("tokenizer.ggml.token_type");
  LLMKIT_CHECK(t.size() == n_tokens, "tokenizer: tokenizer.ggml.token_type has ", t.size(), " entries for ",
               n_tokens, " tokens");
  for (std::size_t i = 0; i < n_tokens; ++i) {
    const auto v = t.get<std::int64_t>(i);
    LLMKIT_CHECK(v >= 0 && v <= 6, "tokenizer: token ", i, " has unknown type ", v);
    types[i] = static_cast<token_type>(v);
  }
  return types;
}

/// A special id from `key`: `fallback` when absent, -1 when out of range
/// (files write e.g. 0xffffffff for "none").
inline token_id read_special_id(const gguf_file& file, std::string_view key, std::int64_t n_tokens,
                                token_id fallback) {
  const auto v = file.get_optional<std::int64_t>(key);
  if (!v) return fallback;
  if (*v < 0 || *v >= n_tokens) return -1;
  return static_cast<token_id>(*v);
}

}  // namespace llmkit::model::detail
