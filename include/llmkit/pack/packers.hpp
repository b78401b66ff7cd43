// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/packers.hpp
/// Run-time choice among the packers: `pack(items, packer::best_fit_decreasing, options, proj)`.

#include <array>
#include <cstddef>
#include <functional>
#include <string_view>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/best_fit.hpp"
#include "llmkit/pack/first_fit.hpp"
#include "llmkit/pack/next_fit.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// The bin-packing algorithms of this module.
enum class packer { first_fit_decreasing, best_fit_decreasing, next_fit, online_first_fit };

/// Every packer, for loops in tests and benchmarks.
inline constexpr std::array<packer, 4> all_packers = {packer::first_fit_decreasing, packer::best_fit_decreasing,
                                                      packer::next_fit, packer::online_first_fit};

/// Short name: "ffd", "bfd", "next_fit", "online_ff".
constexpr std::string_view packer_name(packer p) noexcept {
  switch (p) {
    case packer::first_fit_decreasing: return "ffd";
    case packer::best_fit_decreasing: return "bfd";
    case packer::next_fit: return "next_fit";
    case packer::online_first_fit: return "online_ff";
  }
  return "?";
}

/// The packer named `name` (as printed by `packer_name`).
/// @throws llmkit::error for an unknown name.
inline packer packer_from_name(std::string_view name) {
  for (packer p : all_packers)
    if (packer_name(p) == name) return p;
  ::llmkit::detail::throw_error("packer_from_name: unknown packer \"", name, "\" (ffd, bfd, next_fit, online_ff)");
}

/// Packs `items` with the packer `p`; see `first_fit_decreasing` for the parameters.
template <class R, class Proj = std::identity>
  requires sized_items<R, Proj>
packing pack_items(R&& items, packer p, const pack_options& options = {}, Proj proj = {}) {
  switch (p) {
    case packer::first_fit_decreasing: return first_fit_decreasing(items, options, proj);
    case packer::best_fit_decreasing: return best_fit_decreasing(items, options, proj);
    case packer::next_fit: return next_fit(items, options, proj);
    case packer::online_first_fit: return online_first_fit(items, options, proj);
  }
  ::llmkit::detail::throw_error("pack_items: invalid packer value ", static_cast<int>(p));
}

}  // namespace llmkit::pack
