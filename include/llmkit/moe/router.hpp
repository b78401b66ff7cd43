// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/moe/router.hpp
/// Mixture-of-experts routing: which k of a layer's experts each token uses,
/// and the weight each one's output gets. A router is a small policy value
/// (like the attention mask policies) that turns one token's router logits
/// `[n_expert]` into k expert ids and weights; `route` applies it to every
/// token of a batch.
///
/// ```
/// const moe::softmax_top_k qwen3{.renormalize = true};     // Qwen3-MoE, Mixtral: softmax, top-k, renormalised
/// const moe::top_k_softmax gpt_oss{};                      // gpt-oss: top-k logits, softmax over them
/// moe::route(qwen3, logits, 8, ids, weights);  // logits [n_tokens, n_expert] -> ids, weights [n_tokens, 8]
/// ```
///
/// Every policy is per token and deterministic: the experts of a token
/// depend on its own logits only (never on the batch), and equal scores
/// go to the lower expert id. Scores and weights are computed in double and
/// rounded once, so they do not depend on the instruction set either.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/views.hpp"

namespace llmkit::moe {

/// Expert index inside a layer.
using expert_id = std::int32_t;

/// A routing policy: for one token's `[n_expert] logits`, writes the k
/// chosen experts to `[k] ids` (best first) and their weights to `[k]
/// weights`, using `[n_expert] scratch`.
template <class R>
concept router_policy = std::copy_constructible<R> && requires(const R& r, std::span<const float> logits,
                                                               std::span<expert_id> ids, std::span<float> weights,
                                                               std::span<double> scratch) {
  r.route_token(logits, ids, weights, scratch);
};

namespace detail {

/// The k highest `[n] scores` (ties to the lower index), best first, into `[k] ids`.
inline void top_k_ids(std::span<const double> scores, std::span<expert_id> ids) {
  const std::size_t k = ids.size();
  // k is small (2 .. 32): a partial insertion keeps the k best in order.
  std::size_t filled = 0;
  for (std::size_t e = 0; e < scores.size(); ++e) {
    const double s = scores[e];
    if (filled == k && !(s > scores[static_cast<std::size_t>(ids[k - 1])])) continue;
    std::size_t at = filled < k ? filled++ : k - 1;
    while (at > 0 && s > scores[static_cast<std::size_t>(ids[at - 1])]) {
      ids[at] = ids[at - 1];
      --at;
    }
    ids[at] = static_cast<expert_id>(e);
  }
}

/// Softmax of `[n] x` into `[n] out`, in double.
inline void softmax(std::span<const double> x, std::span<double> out) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : x) m = std::max(m, v);
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += out[i] = std::exp(x[i] - m);
  for (double& v : out) v /= sum;
}

}  // namespace detail

/// Softmax over all experts, then the k most probable; their probabilities
/// are the weights, renormalised to sum to 1 when asked (Qwen3-MoE's and
/// Qwen2-MoE's `norm_topk_prob` / GGUF `expert_weights_norm`; Mixtral's
/// routing is the renormalised form). `scale` multiplies the weights after.
struct softmax_top_k {
  bool renormalize = true;
  float scale = 1.0f;

  void route_token(std::span<const float> logits, std::span<expert_id> ids, std::span<float> weights,
                   std::span<double> scratch) const {
    const std::size_t n = logits.size();
    std::vector<double> x(logits.begin(), logits.end());  // n is a layer's expert count: small
    detail::softmax(x, scratch.first(n));
    detail::top_k_ids(scratch.first(n), ids);
    double sum = 0.0;
    for (expert_id e : ids) sum += scratch[static_cast<std::size_t>(e)];
    const double norm = renormalize ? 1.0 / sum : 1.0;
    for (std::size_t j = 0; j < ids.size(); ++j)
      weights[j] = static_cast<float>(scratch[static_cast<std::size_t>(ids[j])] * norm * scale);
  }
};

/// The k highest logits, then a softmax over those k only (gpt-oss).
struct top_k_softmax {
  void route_token(std::span<const float> logits, std::span<expert_id> ids, std::span<float> weights,
                   std::span<double> scratch) const {
    const std::size_t n = logits.size(), k = ids.size();
    for (std::size_t e = 0; e < n; ++e) scratch[e] = logits[e];
    detail::top_k_ids(scratch.first(n), ids);
    std::vector<double> chosen(k), p(k);
    for (std::size_t j = 0; j < k; ++j) chosen[j] = scratch[static_cast<std::size_t>(ids[j])];
    detail::softmax(chosen, p);
    for (std::size_t j = 0; j < k; ++j) weights[j] = static_cast<float>(p[j]);
  }
};

/// Sigmoid scores; the k experts with the highest score plus a per-expert
/// selection bias are chosen (the bias only selects, as DeepSeek-V3's
/// `exp_probs_b`), and weighted by their unbiased scores, renormalised when
/// asked, times `scale` (DeepSeek's `routed_scaling_factor`).
struct sigmoid_top_k {
  /// `[n_expert]` selection bias, or empty for none; the caller keeps it alive.
  std::span<const float> selection_bias{};
  bool renormalize = true;
  float scale = 1.0f;

  void route_token(std::span<const float> logits, std::span<expert_id> ids, std::span<float> weights,
                   std::span<double> scratch) const {
    const std::size_t n = logits.size();
    LLMKIT_CHECK(selection_bias.empty() || selection_bias.size() == n, "moe::sigmoid_top_k: selection_bias has ",
                 selection_bias.size(), " values for ", n, " experts");
    std::vector<double> score(n);
    for (std::size_t e = 0; e < n; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
      scratch[e] = score[e] + (selection_bias.empty() ? 0.0 : static_cast<double>(selection_bias[e]));
    }
    detail::top_k_ids(scratch.first(n), ids);
    double sum = 0.0;
    for (expert_id e : ids) sum += score[static_cast<std::size_t>(e)];
    const double norm = renormalize && sum > 0.0 ? 1.0 / sum : 1.0;
    for (std::size_t j = 0; j < ids.size(); ++j)
      weights[j] = static_cast<float>(score[static_cast<std::size_t>(ids[j])] * norm * scale);
  }
};

/// Routes every token: `[n_tokens, n_expert] logits` -> `[n_tokens, k] ids`
/// (best first) and `[n_tokens, k] weights`, with k = ids.cols().
/// @throws llmkit::error naming the argument for k = 0 or k > n_expert,
/// mismatched shapes, or a logit that is not finite (token and expert named).
template <router_policy R>
void route(const R& router, matrix_view<const float> logits, matrix_view<expert_id> ids,
           matrix_view<float> weights) {
  const std::size_t n_tokens = logits.rows(), n_expert = logits.cols(), k = ids.cols();
  LLMKIT_CHECK(n_expert >= 1, "moe::route: no experts (logits have 0 columns)");
  LLMKIT_CHECK(k >= 1 && k <= n_expert, "moe::route: k = ", k, " experts per token, the layer has ", n_expert);
  LLMKIT_CHECK(ids.rows() == n_tokens && weights.rows() == n_tokens && weights.cols() == k, "moe::route: ids [",
               ids.rows(), ", ", ids.cols(), "] and weights [", weights.rows(), ", ", weights.cols(), "] for ",
               n_tokens, " tokens of k = ", k);
  std::vector<double> scratch(n_expert);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const std::span<const float> row = logits.row(t);
    for (std::size_t e = 0; e < n_expert; ++e)
      LLMKIT_CHECK(std::isfinite(row[e]), "moe::route: router logit of token ", t, ", expert ", e, " is ", row[e]);
    router.route_token(row, ids.row(t), weights.row(t), scratch);
  }
}

}  // namespace llmkit::moe
