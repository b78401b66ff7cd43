// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/chain.hpp
/// Compiled processor chains: a variadic template that applies processors
/// in the order given, with no virtual calls. Passes are fused through the
/// shared `candidates`: the row's maximum is computed once (while NaNs are
/// replaced) and kept by every processor that cannot move it, and after the
/// first small truncation (top-k, ...) every later step touches only the
/// survivors.
///
/// ```
/// const processor_chain chain{penalties{.repeat = 1.1f}, top_k{40}, top_p{0.95f}, temperature{0.8f}};
/// candidates ws;  // per thread, reused
/// sample_result r = sample_row(logits_row, state.context(), chain, categorical{}, ws);
/// ```
///
/// The entry points take a row either mutable (`std::span<float>`: processed
/// in place, no copy) or read-only (`std::span<const float>`, e.g. a row of
/// the `matrix_view<const float>` a model's forward returns: copied into the
/// workspace, the caller's row untouched). Both give the same tokens.

#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::sampling {

/// Applies `Processors...` in order; itself a `logits_processor`.
template <logits_processor... Processors>
class processor_chain {
 public:
  constexpr processor_chain() = default;
  constexpr explicit processor_chain(Processors... processors)
    requires(sizeof...(Processors) > 0)
      : processors_(std::move(processors)...) {}

  void apply(candidates& c, const sampling_context& ctx) const {
    std::apply([&](const auto&... p) { (p.apply(c, ctx), ...); }, processors_);
  }

  /// The processors, in order.
  const std::tuple<Processors...>& processors() const noexcept { return processors_; }

 private:
  std::tuple<Processors...> processors_;
};

template <class... Processors>
processor_chain(Processors...) -> processor_chain<Processors...>;

/// Processes `[vocab] logits` (in place) with `chain` and draws a token with
/// `pick`, using `workspace` for every buffer.
/// @throws llmkit::error for an empty row, +inf logits, or when every logit is
/// -inf/NaN before or after processing.
template <logits_processor Chain, sampler Sampler>
sample_result sample_row(std::span<float> logits, const sampling_context& ctx, const Chain& chain,
                         const Sampler& pick, candidates& workspace) {
  workspace.reset(logits);
  chain.apply(workspace, ctx);
  return pick.sample(workspace, ctx);
}

/// sample_row() on a read-only `[vocab] logits` row, copied into `workspace`.
template <logits_processor Chain, sampler Sampler>
sample_result sample_row(std::span<const float> logits, const sampling_context& ctx, const Chain& chain,
                         const Sampler& pick, candidates& workspace) {
  workspace.reset_copy(logits);
  chain.apply(workspace, ctx);
  return pick.sample(workspace, ctx);
}

/// A mutable contiguous row that is not a span (e.g. `std::vector<float>&`)
/// takes the in-place path; without this the two span overloads would be
/// ambiguous for it.
template <class Row, logits_processor Chain, sampler Sampler>
  requires(!std::is_same_v<std::remove_cvref_t<Row>, std::span<float>> &&
           !std::is_same_v<std::remove_cvref_t<Row>, std::span<const float>> &&
           std::is_convertible_v<Row&, std::span<float>>)
sample_result sample_row(Row& logits, const sampling_context& ctx, const Chain& chain, const Sampler& pick,
                         candidates& workspace) {
  return sample_row(std::span<float>(logits), ctx, chain, pick, workspace);
}

/// Processes `[vocab] logits` in place: afterwards removed tokens are -inf.
template <logits_processor Chain>
void process_row(std::span<float> logits, const sampling_context& ctx, const Chain& chain, candidates& workspace) {
  workspace.reset(logits);
  chain.apply(workspace, ctx);
  workspace.to_logits(logits);
}

/// Processes a read-only `[vocab] logits` row (copied into `workspace`) and
/// writes the result to `[vocab] out`: removed tokens are -inf.
/// @throws llmkit::error as sample_row() does, or when out.size() differs
/// from logits.size().
template <logits_processor Chain>
void process_row(std::span<const float> logits, const sampling_context& ctx, const Chain& chain,
                 candidates& workspace, std::span<float> out) {
  workspace.reset_copy(logits);
  chain.apply(workspace, ctx);
  workspace.to_logits(out);
}

}  // namespace llmkit::sampling
