// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/packing.hpp
/// The result of a bin-packer (`packing`), the placement of one item or item
/// chunk in it (`piece`), and the options every packer takes (`pack_options`).
///
/// A packing is stored flat (CSR): the pieces of bin b are
/// `pieces()[bin_offsets()[b] .. bin_offsets()[b + 1])`, so a packing of 10^6
/// items costs three allocations, not one per bin.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"

namespace llmkit::pack {

/// Options common to every packer.
struct pack_options {
  /// Bin capacity (e.g. a token budget per forward pass). 0 = the size of the
  /// largest item, as in the prepacking paper.
  std::size_t capacity = 0;
  /// What to do with an item larger than the capacity: false raises
  /// `llmkit::error` naming the item; true splits it into chunks (see `piece`).
  bool split_oversized = false;
};

/// One item, or one chunk of an item, placed in a bin: the elements
/// [offset, offset + size) of item `item` (for prompts: its tokens).
///
/// Chunking (`pack_options::split_oversized`): an item of size s > capacity C
/// becomes floor(s / C) chunks of exactly C, each alone in its own bin, and,
/// when C does not divide s, a last chunk of s mod C that is packed like any
/// item. Every packer puts the dedicated bins first, in (item, offset) order,
/// so processing bins in index order processes each item's chunks in offset
/// order (what chunked prefill needs: a chunk attends to the earlier ones).
struct piece {
  std::size_t item = 0;    ///< index of the item in the packer's input range
  std::size_t offset = 0;  ///< first element of the item in this piece
  std::size_t size = 0;    ///< elements in this piece
  friend constexpr bool operator==(const piece&, const piece&) = default;
};

/// Bins of pieces, with the numbers that judge a packing.
class packing {
 public:
  packing() = default;
  /// Assembles a packing from its parts (used by the packers).
  /// `[n_pieces] pieces` grouped by bin, `[n_bins + 1] bin_offsets`.
  packing(std::size_t capacity, std::size_t n_items, std::vector<piece> pieces, std::vector<std::size_t> bin_offsets)
      : capacity_(capacity), n_items_(n_items), pieces_(std::move(pieces)), bin_offsets_(std::move(bin_offsets)) {
    LLMKIT_CHECK(!bin_offsets_.empty() && bin_offsets_.front() == 0 && bin_offsets_.back() == pieces_.size(),
                 "packing: bin_offsets must run from 0 to the number of pieces ", pieces_.size());
    loads_.resize(n_bins());
    for (std::size_t b = 0; b < n_bins(); ++b) {
      LLMKIT_CHECK(bin_offsets_[b] <= bin_offsets_[b + 1], "packing: bin_offsets[", b + 1, "] = ",
                   bin_offsets_[b + 1], " is below bin_offsets[", b, "] = ", bin_offsets_[b]);
      std::size_t load = 0;
      for (const piece& p : bin(b)) load += p.size;
      LLMKIT_CHECK(load <= capacity_, "packing: bin ", b, " holds ", load, " > capacity ", capacity_);
      loads_[b] = load;
      total_size_ += load;
    }
  }

  /// Capacity of every bin.
  std::size_t capacity() const noexcept { return capacity_; }
  /// Number of items in the packer's input.
  std::size_t n_items() const noexcept { return n_items_; }
  /// Number of bins used.
  std::size_t n_bins() const noexcept { return bin_offsets_.empty() ? 0 : bin_offsets_.size() - 1; }
  /// The pieces of bin b, in the order the packer placed them.
  std::span<const piece> bin(std::size_t b) const {
    LLMKIT_CHECK(b < n_bins(), "packing::bin: b = ", b, " is out of range [0, ", n_bins(), ")");
    return std::span<const piece>(pieces_).subspan(bin_offsets_[b], bin_offsets_[b + 1] - bin_offsets_[b]);
  }
  /// Sum of the piece sizes in bin b.
  std::size_t load(std::size_t b) const {
    LLMKIT_CHECK(b < n_bins(), "packing::load: b = ", b, " is out of range [0, ", n_bins(), ")");
    return loads_[b];
  }
  /// `[n_pieces]` every piece, grouped by bin.
  std::span<const piece> pieces() const noexcept { return pieces_; }
  /// `[n_bins + 1]` start of each bin in `pieces()`.
  std::span<const std::size_t> bin_offsets() const noexcept { return bin_offsets_; }
  /// Sum of all item sizes.
  std::size_t total_size() const noexcept { return total_size_; }
  /// total_size / (n_bins * capacity): 1 means no space wasted (also for 0 bins).
  double fill_ratio() const noexcept {
    return n_bins() == 0 ? 1.0 : static_cast<double>(total_size_) / (static_cast<double>(n_bins()) * capacity_);
  }
  /// ceil(total_size / capacity): no packing can use fewer bins.
  std::size_t lower_bound() const noexcept {
    return capacity_ == 0 ? 0 : (total_size_ + capacity_ - 1) / capacity_;
  }

 private:
  std::size_t capacity_ = 0;
  std::size_t n_items_ = 0;
  std::vector<piece> pieces_;
  std::vector<std::size_t> bin_offsets_{0};
  std::vector<std::size_t> loads_;
  std::size_t total_size_ = 0;
};

}  // namespace llmkit::pack
