// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/kv_window.hpp
/// `--kv-window ring|full`, shared by llmkit-generate and llmkit-server:
/// where a model's local (sliding-window) layers keep their KV. `ring`
/// (the default) keeps only their window (model/window_cache.hpp), `full`
/// every position as the global layers do. The tokens are the same either
/// way; a ring's memory stops growing with the context in those layers.

#include <llmkit/model/llama_config.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace llmkit_examples {

/// The `--kv-window` choice.
enum class kv_window : std::uint8_t {
  ring,  ///< local layers in a ring of their window, when the model has local layers
  full,  ///< every layer keeps every position
};

/// `--kv-window` names, in the order of `kv_window`.
inline constexpr std::array<std::string_view, 2> kv_window_names{"ring", "full"};

/// The kv_window called `name`, or nullopt.
constexpr std::optional<kv_window> kv_window_of(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kv_window_names.size(); ++i)
    if (kv_window_names[i] == name) return static_cast<kv_window>(i);
  return std::nullopt;
}

/// How a model's layers are split under a `--kv-window` choice.
enum class kv_layout : std::uint8_t {
  full,         ///< one cache of every position (no local layer, or --kv-window full)
  hybrid,       ///< global layers in full, local ones in rings (model::window_cache)
  all_local,    ///< every layer local: one ring cache (kv::sliding_window_cache)
};

/// The layout `w` gives the model of config `c`.
inline kv_layout kv_layout_of(const llmkit::model::llama_config& c, kv_window w) noexcept {
  if (w == kv_window::full || c.sliding_window == 0) return kv_layout::full;
  const bool all_local = std::all_of(c.local_layers.begin(), c.local_layers.end(), [](std::uint8_t l) { return l != 0; });
  return all_local ? kv_layout::all_local : kv_layout::hybrid;
}

}  // namespace llmkit_examples
