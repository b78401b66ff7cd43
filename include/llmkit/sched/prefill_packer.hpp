// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sched/prefill_packer.hpp
/// The hook through which a policy prepacks the prefill pieces of a step
/// into rows of a fixed capacity, and its adapter to the bin-packers of
/// llmkit/pack (first-fit decreasing by default, as in the prepacking
/// paper).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/packers.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::sched {

/// Packs `[n] lengths` (each in [1, capacity]) into rows whose lengths sum to
/// at most `capacity`; returns `[n_rows][...]` indices into `lengths`, each
/// index exactly once.
using prefill_packer =
    std::function<std::vector<std::vector<std::size_t>>(std::span<const std::int64_t> lengths, std::int64_t capacity)>;

/// Packs with `which` packer of llmkit/pack. `[n] lengths` -> `[n_rows][...]`
/// indices, rows in the packer's bin order.
/// @throws llmkit::error for a length outside [1, capacity].
inline std::vector<std::vector<std::size_t>> pack_prefill(std::span<const std::int64_t> lengths, std::int64_t capacity,
                                                          pack::packer which = pack::packer::first_fit_decreasing) {
  for (std::size_t i = 0; i < lengths.size(); ++i)
    LLMKIT_CHECK(lengths[i] >= 1 && lengths[i] <= capacity, "pack_prefill: lengths[", i, "] = ", lengths[i],
                 " is outside [1, capacity = ", capacity, "]");
  const pack::packing packed =
      pack::pack_items(lengths, which, pack::pack_options{.capacity = static_cast<std::size_t>(capacity)});
  std::vector<std::vector<std::size_t>> rows(packed.n_bins());
  for (std::size_t b = 0; b < packed.n_bins(); ++b)
    for (const pack::piece& p : packed.bin(b)) rows[b].push_back(p.item);
  return rows;
}

/// A `prefill_packer` running `which` packer of llmkit/pack.
inline prefill_packer make_prefill_packer(pack::packer which) {
  return [which](std::span<const std::int64_t> lengths, std::int64_t capacity) {
    return pack_prefill(lengths, capacity, which);
  };
}

}  // namespace llmkit::sched
