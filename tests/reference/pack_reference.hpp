// SPDX-License-Identifier: MIT
#pragma once

/// @file tests/reference/pack_reference.hpp
/// Naive oracles for the bin-packers: O(n * bins) linear scans of the bins
/// with the same tie rules as llmkit's packers, an exhaustive search for the
/// optimal number of bins on small instances, and a checker of the packing
/// invariants.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <llmkit/pack/packing.hpp>

namespace pack_reference {

/// Item indices by decreasing size, ties by increasing index.
inline std::vector<std::size_t> decreasing(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
  return order;
}

/// Bins as lists of item indices, in placement order.
using bins_t = std::vector<std::vector<std::size_t>>;

/// First fit by scanning every bin from the first.
inline bins_t first_fit(const std::vector<std::size_t>& sizes, const std::vector<std::size_t>& order, std::size_t capacity) {
  bins_t bins;
  std::vector<std::size_t> room;
  for (std::size_t i : order) {
    std::size_t b = 0;
    while (b < bins.size() && room[b] < sizes[i]) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      room.push_back(capacity);
    }
    bins[b].push_back(i);
    room[b] -= sizes[i];
  }
  return bins;
}

/// Best fit by scanning every bin: least room that fits, ties to the lowest bin.
inline bins_t best_fit(const std::vector<std::size_t>& sizes, const std::vector<std::size_t>& order, std::size_t capacity) {
  bins_t bins;
  std::vector<std::size_t> room;
  for (std::size_t i : order) {
    std::size_t best = bins.size();
    for (std::size_t b = 0; b < bins.size(); ++b)
      if (room[b] >= sizes[i] && (best == bins.size() || room[b] < room[best])) best = b;
    if (best == bins.size()) {
      bins.emplace_back();
      room.push_back(capacity);
    }
    bins[best].push_back(i);
    room[best] -= sizes[i];
  }
  return bins;
}

/// Next fit in input order.
inline bins_t next_fit(const std::vector<std::size_t>& sizes, std::size_t capacity) {
  bins_t bins;
  std::size_t room = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (bins.empty() || room < sizes[i]) {
      bins.emplace_back();
      room = capacity;
    }
    bins.back().push_back(i);
    room -= sizes[i];
  }
  return bins;
}

/// The fewest bins any packing can use, by exhaustive search (small n only).
inline std::size_t optimal_bins(const std::vector<std::size_t>& sizes, std::size_t capacity) {
  const auto order = decreasing(sizes);
  std::size_t best = sizes.size();
  std::vector<std::size_t> room;
  auto search = [&](auto&& self, std::size_t k) -> void {
    if (room.size() >= best) return;
    if (k == order.size()) {
      best = room.size();
      return;
    }
    const std::size_t s = sizes[order[k]];
    for (std::size_t b = 0; b < room.size(); ++b) {
      if (room[b] < s) continue;
      room[b] -= s;
      self(self, k + 1);
      room[b] += s;
    }
    room.push_back(capacity - s);
    self(self, k + 1);
    room.pop_back();
  };
  search(search, 0);
  return best;
}

/// The packing's bins as item lists (for comparison with the oracles).
inline bins_t items_of(const llmkit::pack::packing& p) {
  bins_t bins(p.n_bins());
  for (std::size_t b = 0; b < p.n_bins(); ++b)
    for (const auto& piece : p.bin(b)) bins[b].push_back(piece.item);
  return bins;
}

/// Returns an empty string when `p` is a valid packing of `sizes`: every
/// element of every item in exactly one piece, pieces of an item in offset
/// order in bins of non-decreasing index, no bin over capacity, loads and
/// totals right; else a description of the first violation.
inline std::string check_packing(const llmkit::pack::packing& p, const std::vector<std::size_t>& sizes) {
  if (p.n_items() != sizes.size()) return "n_items differs";
  std::vector<std::size_t> covered(sizes.size(), 0), last_bin(sizes.size(), 0);
  std::size_t total = 0;
  for (std::size_t b = 0; b < p.n_bins(); ++b) {
    std::size_t load = 0;
    if (p.bin(b).empty()) return "empty bin " + std::to_string(b);
    for (const auto& piece : p.bin(b)) {
      if (piece.item >= sizes.size()) return "item out of range";
      if (piece.offset != covered[piece.item]) return "piece out of order for item " + std::to_string(piece.item);
      if (piece.offset > 0 && last_bin[piece.item] >= b) return "chunk in an earlier bin, item " + std::to_string(piece.item);
      if (piece.size == 0 && sizes[piece.item] != 0) return "empty piece";
      covered[piece.item] += piece.size;
      last_bin[piece.item] = b;
      load += piece.size;
    }
    if (load > p.capacity()) return "bin " + std::to_string(b) + " over capacity";
    if (load != p.load(b)) return "load(" + std::to_string(b) + ") wrong";
    total += load;
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (covered[i] != sizes[i]) return "item " + std::to_string(i) + " covered " + std::to_string(covered[i]);
  // A size-0 item is still placed exactly once.
  std::vector<int> seen(sizes.size(), 0);
  for (const auto& piece : p.pieces())
    if (piece.offset == 0) ++seen[piece.item];
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (seen[i] != 1) return "item " + std::to_string(i) + " starts " + std::to_string(seen[i]) + " times";
  if (total != p.total_size()) return "total_size wrong";
  return {};
}

}  // namespace pack_reference
