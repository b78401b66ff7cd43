// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/head_dims.hpp
/// The head dims the attention kernels are compiled for.
///
/// Each kernel is a template over the head dim (its loops unroll over whole
/// registers), so every listed head dim costs compile time and code size in
/// every translation unit that calls prefill or decode. An engine that only
/// runs a few models can list just theirs before including llmkit:
///
///     -DLLMKIT_ATTENTION_HEAD_DIMS=64,128
///
/// A head dim outside the list is refused with an `llmkit::error` naming the
/// value and the list (a configuration macro: docs/getting-started.md).

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <utility>

#include "llmkit/core/dispatch.hpp"

#ifndef LLMKIT_ATTENTION_HEAD_DIMS
#define LLMKIT_ATTENTION_HEAD_DIMS 8, 16, 32, 64, 80, 96, 112, 128, 256
#endif

namespace llmkit::attention {

/// The head dims prefill and decode accept, ascending.
inline constexpr auto supported_head_dims = std::to_array<std::size_t>({LLMKIT_ATTENTION_HEAD_DIMS});

/// Whether prefill and decode accept `head_dim`.
constexpr bool supports_head_dim(std::size_t head_dim) noexcept {
  return std::ranges::find(supported_head_dims, head_dim) != supported_head_dims.end();
}

/// The list as text, "8 16 ... 256", for error messages.
inline const std::string& supported_head_dims_text() {
  static const std::string text = [] {
    std::string s;
    for (const std::size_t d : supported_head_dims) {
      if (!s.empty()) s += ' ';
      s += std::to_string(d);
    }
    return s;
  }();
  return text;
}

namespace detail {

template <class Fn, std::size_t... I>
decltype(auto) dispatch_head_dim(std::size_t head_dim, Fn&& fn, std::index_sequence<I...>) {
  static const std::string what = "head_dim (supported: " + supported_head_dims_text() + ")";
  return llmkit::dispatch<supported_head_dims[I]...>(head_dim, std::forward<Fn>(fn), what.c_str());
}

/// Calls fn(std::integral_constant<std::size_t, D>{}) for D == head_dim, one
/// of `supported_head_dims`, else throws llmkit::error naming `head_dim`.
template <class Fn>
decltype(auto) dispatch_head_dim(std::size_t head_dim, Fn&& fn) {
  return dispatch_head_dim(head_dim, std::forward<Fn>(fn), std::make_index_sequence<supported_head_dims.size()>{});
}

}  // namespace detail
}  // namespace llmkit::attention
