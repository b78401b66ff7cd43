// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/detail/successor_set.hpp
/// A set of integers in [0, universe) with insert, erase and "smallest
/// member >= x" in O(log_64 universe): a hierarchy of 64-bit words, a bit per
/// member at level 0 and a bit per non-empty word above.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace llmkit::pack::detail {

class successor_set {
 public:
  explicit successor_set(std::size_t universe) {
    std::size_t n = universe == 0 ? 1 : universe;
    do {
      n = (n + 63) / 64;
      levels_.emplace_back(n, 0);
    } while (n > 1);
  }

  void insert(std::size_t x) {
    for (auto& level : levels_) {
      const bool was_empty = level[x / 64] == 0;
      level[x / 64] |= std::uint64_t{1} << (x % 64);
      if (!was_empty) return;
      x /= 64;
    }
  }
  void erase(std::size_t x) {
    for (auto& level : levels_) {
      level[x / 64] &= ~(std::uint64_t{1} << (x % 64));
      if (level[x / 64] != 0) return;
      x /= 64;
    }
  }
  bool contains(std::size_t x) const noexcept { return (levels_[0][x / 64] >> (x % 64)) & 1u; }

  /// The smallest member >= x, if any.
  std::optional<std::size_t> successor(std::size_t x) const {
    std::size_t depth = 0;
    // Climb while the rest of the current word holds nothing at or after x.
    for (;; ++depth) {
      if (depth == levels_.size()) return std::nullopt;
      const auto& level = levels_[depth];
      if (x / 64 >= level.size()) return std::nullopt;
      const std::uint64_t rest = level[x / 64] & (~std::uint64_t{0} << (x % 64));
      if (rest != 0) {
        x = x / 64 * 64 + static_cast<std::size_t>(std::countr_zero(rest));
        break;
      }
      x = x / 64 + 1;
    }
    // Descend to the first member under the found bit.
    while (depth > 0) {
      --depth;
      x = x * 64 + static_cast<std::size_t>(std::countr_zero(levels_[depth][x]));
    }
    return x;
  }

 private:
  std::vector<std::vector<std::uint64_t>> levels_;
};

}  // namespace llmkit::pack::detail
