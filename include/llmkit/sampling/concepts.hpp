// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/concepts.hpp
/// The two contracts of the sampling module.
///
/// - A `logits_processor` transforms a row's candidates in place:
///   `p.apply(candidates&, const sampling_context&)`. It may change logits,
///   remove tokens (to -inf, or by shrinking a sparse set) or reorder nothing
///   else; it must not allocate once the candidates' buffers have grown.
/// - A `sampler` picks one token from the candidates without changing them:
///   `s.sample(candidates&, const sampling_context&) -> sample_result`.

#include <concepts>
#include <cstdint>

#include "llmkit/core/ids.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::sampling {

/// A chosen token and its log-probability under the processed distribution
/// (softmax of the candidates' logits).
struct sample_result {
  token_id token = -1;
  float logprob = 0.0f;
  friend bool operator==(const sample_result&, const sample_result&) = default;
};

/// See the file comment.
template <class P>
concept logits_processor = requires(const P& p, candidates& c, const sampling_context& ctx) {
  p.apply(c, ctx);
};

/// See the file comment.
template <class S>
concept sampler = requires(const S& s, candidates& c, const sampling_context& ctx) {
  { s.sample(c, ctx) } -> std::same_as<sample_result>;
};

}  // namespace llmkit::sampling
