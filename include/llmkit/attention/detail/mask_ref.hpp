// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/mask_ref.hpp
/// A mask policy seen through two function pointers, so the tiled kernels
/// are compiled once per (arch, head_dim, storage type) and not once per
/// mask as well. The calls are per tile (classify) and per partial tile
/// (apply, whose element loop is compiled for the concrete mask), so the
/// indirection costs nothing measurable.

#include <cstddef>
#include <cstdint>
#include <limits>

#include "llmkit/attention/mask.hpp"

namespace llmkit::attention::detail {

struct mask_ref {
  const void* mask = nullptr;
  tile_visibility (*classify_fn)(const void*, position, position, position, position) = nullptr;
  /// st[j * ld + r] = -inf where !visible(q_first + r / group, k_pos[j]),
  /// for j < n_keys and r < n_rows.
  void (*apply_fn)(const void*, float* st, std::size_t ld, std::size_t n_rows, std::size_t group,
                   position q_first, const position* k_pos, std::size_t n_keys) = nullptr;

  tile_visibility classify(position q_first, position q_last, position k_first, position k_last) const {
    return classify_fn(mask, q_first, q_last, k_first, k_last);
  }
  void apply(float* st, std::size_t ld, std::size_t n_rows, std::size_t group, position q_first,
             const position* k_pos, std::size_t n_keys) const {
    apply_fn(mask, st, ld, n_rows, group, q_first, k_pos, n_keys);
  }
};

template <class Mask>
mask_ref make_mask_ref(const Mask& mask) {
  mask_ref m;
  m.mask = &mask;
  m.classify_fn = [](const void* p, position qf, position ql, position kf, position kl) {
    return static_cast<const Mask*>(p)->classify(qf, ql, kf, kl);
  };
  m.apply_fn = [](const void* p, float* st, std::size_t ld, std::size_t n_rows, std::size_t group, position q_first,
                  const position* k_pos, std::size_t n_keys) {
    const Mask& mk = *static_cast<const Mask*>(p);
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < n_keys; ++j)
      for (std::size_t r = 0; r < n_rows; ++r)
        if (!mk.visible(q_first + static_cast<position>(r / group), k_pos[j])) st[j * ld + r] = ninf;
  };
  return m;
}

}  // namespace llmkit::attention::detail
