// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/top_k.hpp
/// Top-k: keeps exactly the k largest logits, ties broken by the lower token
/// id (so top_k(1) agrees with greedy). k = 0 disables it (as in llama.cpp
/// and Hugging Face); k >= the candidate count keeps everything (k is
/// clamped). No full sort: a threshold filter or radix select (see
/// detail/select.hpp), then a sort of the k survivors, which become a sparse,
/// sorted candidate set.

#include <cstddef>
#include <cstdint>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/detail/select.hpp"

namespace llmkit::sampling {

/// Keeps the `k` most probable tokens (0 = keep all).
struct top_k {
  std::int64_t k = 0;

  /// @throws llmkit::error if k < 0.
  void validate() const { LLMKIT_CHECK(k >= 0, "top_k: k must be >= 0, got ", k); }

  void apply(candidates& c, const sampling_context&) const {
    validate();
    if (k == 0 || static_cast<std::size_t>(k) >= c.size()) return;
    const std::size_t n_keep = static_cast<std::size_t>(k);
    const auto index = detail::top_k_indices(c, n_keep);
    auto& s = c.scratch();
    const auto values = c.values();
    if (c.is_dense() && n_keep * 8 > c.size()) {
      // Large k: mask the rest in place, the boundary being the k-th entry.
      const float v_k = values[index[n_keep - 1]];
      const token_id t_k = static_cast<token_id>(index[n_keep - 1]);
      c.retain([&](std::size_t i) { return values[i] > v_k || (values[i] == v_k && static_cast<token_id>(i) <= t_k); },
               n_keep);
      return;
    }
    detail::grow(s.tokens2, n_keep);
    detail::grow(s.weights, n_keep);
    for (std::size_t j = 0; j < n_keep; ++j) {
      s.tokens2[j] = c.token(index[j]);
      s.weights[j] = values[index[j]];
    }
    c.assign_sparse({s.tokens2.data(), n_keep}, {s.weights.data(), n_keep}, candidates::order::sorted);
  }
};

}  // namespace llmkit::sampling
