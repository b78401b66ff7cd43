// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/token_mask.hpp
/// A set of allowed tokens, stored in whichever form is smallest.
///
/// A grammar position allows either few tokens (after `{"` only the keys'
/// prefixes) or nearly all of them (inside a string everything but a few
/// thousand tokens holding a quote or a control character). A list of the
/// allowed ids, a list of the forbidden ids, or a bitset: the smallest of the
/// three is also the cheapest to apply to a logits row (gather the allowed
/// entries, set the forbidden ones to -inf, or one pass over the row).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"

namespace llmkit::grammar {

/// A bitset over a vocabulary: `[ceil(n_vocab / 64)]` words, bit t of word
/// t / 64 set when token t is allowed.
using token_bitset = std::vector<std::uint64_t>;

inline bool test_bit(const token_bitset& b, token_id t) noexcept {
  return (b[static_cast<std::size_t>(t) >> 6] >> (static_cast<std::size_t>(t) & 63)) & 1u;
}
inline void set_bit(token_bitset& b, token_id t) noexcept {
  b[static_cast<std::size_t>(t) >> 6] |= std::uint64_t{1} << (static_cast<std::size_t>(t) & 63);
}

/// The allowed tokens of a vocabulary of `vocab_size()` (see the file comment).
class token_mask {
 public:
  /// How the set is stored.
  enum class form : std::uint8_t {
    allowed,    ///< `ids()`: the allowed tokens, ascending
    forbidden,  ///< `ids()`: the forbidden tokens, ascending
    bitset,     ///< `bits()`
  };

  token_mask() = default;

  /// From a bitset over `[n_vocab]` tokens: a list when it holds at most
  /// `list_max` ids (0: n_vocab / 32, where a list is smaller than the bits).
  static token_mask from_bitset(token_bitset bits, std::size_t n_vocab, std::size_t list_max = 0) {
    token_mask m;
    m.n_vocab_ = n_vocab;
    std::size_t n = 0;
    for (std::uint64_t w : bits) n += static_cast<std::size_t>(std::popcount(w));
    m.count_ = n;
    if (list_max == 0) list_max = n_vocab / 32;
    if (n <= list_max || n_vocab - n <= list_max) {
      const bool keep_set = n <= list_max;
      m.form_ = keep_set ? form::allowed : form::forbidden;
      m.ids_.reserve(keep_set ? n : n_vocab - n);
      for (std::size_t w = 0; w < bits.size(); ++w) {
        std::uint64_t x = keep_set ? bits[w] : ~bits[w];
        while (x) {
          const std::size_t t = w * 64 + static_cast<std::size_t>(std::countr_zero(x));
          if (t >= n_vocab) break;
          m.ids_.push_back(static_cast<token_id>(t));
          x &= x - 1;
        }
      }
    } else {
      m.form_ = form::bitset;
      m.bits_ = std::move(bits);
    }
    return m;
  }

  form storage() const noexcept { return form_; }
  /// `[n]` ids, ascending: the allowed ones (form::allowed) or the forbidden ones (form::forbidden).
  std::span<const token_id> ids() const noexcept { return ids_; }
  /// `[ceil(vocab_size() / 64)]` words (form::bitset only).
  const token_bitset& bits() const noexcept { return bits_; }
  std::size_t vocab_size() const noexcept { return n_vocab_; }
  /// Number of allowed tokens.
  std::size_t count() const noexcept { return count_; }

  bool contains(token_id t) const noexcept {
    switch (form_) {
      case form::bitset: return test_bit(bits_, t);
      case form::allowed: return std::binary_search(ids_.begin(), ids_.end(), t);
      case form::forbidden: return !std::binary_search(ids_.begin(), ids_.end(), t);
    }
    return false;
  }

  /// Sets the bits of the allowed tokens in `out` (`[ceil(vocab_size() / 64)]` words).
  void add_to(token_bitset& out) const {
    switch (form_) {
      case form::bitset:
        for (std::size_t w = 0; w < out.size(); ++w) out[w] |= bits_[w];
        break;
      case form::allowed:
        for (token_id t : ids_) set_bit(out, t);
        break;
      case form::forbidden: {
        token_bitset all = full(n_vocab_);
        for (token_id t : ids_) all[static_cast<std::size_t>(t) >> 6] &= ~(std::uint64_t{1} << (t & 63));
        for (std::size_t w = 0; w < out.size(); ++w) out[w] |= all[w];
        break;
      }
    }
  }
  token_bitset to_bitset() const {
    token_bitset b((n_vocab_ + 63) / 64, 0);
    add_to(b);
    return b;
  }

  /// This set plus `[m] extra` tokens (ascending, unique, each in [0, vocab)).
  token_mask with(std::span<const token_id> extra) const {
    if (extra.empty()) return *this;
    if (form_ == form::bitset) {
      token_bitset b = bits_;
      for (token_id t : extra) set_bit(b, t);
      return from_bitset(std::move(b), n_vocab_);
    }
    token_mask m;
    m.n_vocab_ = n_vocab_;
    m.form_ = form_;
    if (form_ == form::allowed) {
      std::set_union(ids_.begin(), ids_.end(), extra.begin(), extra.end(), std::back_inserter(m.ids_));
      m.count_ = m.ids_.size();
    } else {
      std::set_difference(ids_.begin(), ids_.end(), extra.begin(), extra.end(), std::back_inserter(m.ids_));
      m.count_ = n_vocab_ - m.ids_.size();
    }
    return m;
  }

  /// Bytes held (for the tables' memory figure).
  std::size_t memory_bytes() const noexcept {
    return ids_.capacity() * sizeof(token_id) + bits_.capacity() * sizeof(std::uint64_t);
  }

 private:
  static token_bitset full(std::size_t n) {
    token_bitset b((n + 63) / 64, ~std::uint64_t{0});
    if (n % 64) b.back() = (std::uint64_t{1} << (n % 64)) - 1;
    return b;
  }

  std::vector<token_id> ids_;
  token_bitset bits_;
  std::size_t n_vocab_ = 0;
  std::size_t count_ = 0;
  form form_ = form::allowed;
};

}  // namespace llmkit::grammar
