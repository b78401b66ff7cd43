// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/kv/detail/sequence_table.hpp
/// Maps `seq_id`s to per-sequence state: ids are dense indices, freed ids
/// are reused (smallest first), and unknown ids raise `llmkit::error`.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/kv/kv_view.hpp"

namespace llmkit::kv::detail {

template <class State>
class sequence_table {
 public:
  explicit sequence_table(std::size_t max_sequences) : max_sequences_(max_sequences) {}

  std::size_t max_sequences() const noexcept { return max_sequences_; }
  std::size_t size() const noexcept { return n_live_; }
  bool full() const noexcept { return n_live_ >= max_sequences_; }

  bool contains(seq_id s) const noexcept {
    return s >= 0 && static_cast<std::size_t>(s) < slots_.size() && slots_[static_cast<std::size_t>(s)].has_value();
  }

  /// The state of `s`; `what` names the calling function in the error.
  State& at(seq_id s, const char* what) {
    LLMKIT_CHECK(contains(s), what, ": unknown sequence id ", s);
    return *slots_[static_cast<std::size_t>(s)];
  }
  const State& at(seq_id s, const char* what) const {
    LLMKIT_CHECK(contains(s), what, ": unknown sequence id ", s);
    return *slots_[static_cast<std::size_t>(s)];
  }

  /// Inserts a state; nullopt when max_sequences are live.
  std::optional<seq_id> insert(State state) {
    if (full()) return std::nullopt;
    seq_id s;
    if (!free_ids_.empty()) {
      s = free_ids_.top();
      free_ids_.pop();
    } else {
      LLMKIT_CHECK(slots_.size() < static_cast<std::size_t>(std::numeric_limits<seq_id>::max()),
                   "sequence_table: too many sequences");
      s = static_cast<seq_id>(slots_.size());
      slots_.emplace_back();
    }
    slots_[static_cast<std::size_t>(s)].emplace(std::move(state));
    ++n_live_;
    return s;
  }

  void erase(seq_id s) {
    LLMKIT_ASSERT(contains(s));
    slots_[static_cast<std::size_t>(s)].reset();
    free_ids_.push(s);
    --n_live_;
  }

  /// Calls fn(seq_id, State&) for every live sequence.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i]) fn(static_cast<seq_id>(i), *slots_[i]);
  }

 private:
  std::size_t max_sequences_;
  std::vector<std::optional<State>> slots_;
  std::priority_queue<seq_id, std::vector<seq_id>, std::greater<>> free_ids_;
  std::size_t n_live_ = 0;
};

}  // namespace llmkit::kv::detail
