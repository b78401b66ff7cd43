// SPDX-License-Identifier: MIT
// llmkit/moe: routers against the double-precision reference (random shapes,
// ties, batch invariance, bad input).
#include <llmkit/moe/router.hpp>

#include "reference/moe_reference.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

using namespace llmkit;
using Catch::Matchers::Contains;

namespace {

struct routed_batch {
  std::vector<moe::expert_id> ids;
  std::vector<float> weights;
};

template <class R>
routed_batch run(const R& router, const std::vector<float>& logits, std::size_t n_tokens, std::size_t n_expert,
                 std::size_t k) {
  routed_batch out{std::vector<moe::expert_id>(n_tokens * k), std::vector<float>(n_tokens * k)};
  moe::route(router, matrix_view<const float>(logits.data(), n_tokens, n_expert),
             matrix_view<moe::expert_id>(out.ids.data(), n_tokens, k), matrix_view<float>(out.weights.data(), n_tokens, k));
  return out;
}

// Logits drawn from few values, so that equal scores are common.
std::vector<float> draw(std::mt19937& rng, std::size_t n, bool coarse) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::vector<float> v(n);
  for (float& x : v) x = coarse ? 0.5f * float(level(rng)) : d(rng);
  return v;
}

}  // namespace

TEST_CASE("moe: every router picks and weights the experts the reference does, ties to the lower id") {
  std::mt19937 rng(21);
  for (std::size_t n_expert : {1u, 2u, 8u, 32u, 128u}) {
    for (std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}, n_expert}) {
      if (k > n_expert) continue;
      for (bool coarse : {false, true}) {
        const std::size_t n_tokens = 5;
        const auto logits = draw(rng, n_tokens * n_expert, coarse);
        std::vector<float> bias = draw(rng, n_expert, false);
        for (float& b : bias) b *= 0.1f;
        for (int kind = 0; kind < 3; ++kind) {
          for (bool renorm : {true, false}) {
            if (kind == 1 && !renorm) continue;
            const float scale = kind == 1 ? 1.0f : 2.5f;
            routed_batch got;
            if (kind == 0) got = run(moe::softmax_top_k{.renormalize = renorm, .scale = scale}, logits, n_tokens, n_expert, k);
            if (kind == 1) got = run(moe::top_k_softmax{}, logits, n_tokens, n_expert, k);
            if (kind == 2)
              got = run(moe::sigmoid_top_k{.selection_bias = bias, .renormalize = renorm, .scale = scale}, logits,
                        n_tokens, n_expert, k);
            for (std::size_t t = 0; t < n_tokens; ++t) {
              INFO("experts " << n_expert << " k " << k << " kind " << kind << " renorm " << renorm << " coarse "
                              << coarse << " token " << t);
              const std::vector<float> row(logits.begin() + t * n_expert, logits.begin() + (t + 1) * n_expert);
              const auto want = reference::route_reference(row, k, kind, renorm, scale, kind == 2 ? bias : std::vector<float>{});
              for (std::size_t j = 0; j < k; ++j) {
                REQUIRE(got.ids[t * k + j] == want.ids[j]);
                REQUIRE(got.weights[t * k + j] == Approx(want.weights[j]).epsilon(1e-6).margin(1e-12));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("moe: a token's route does not depend on the batch it is in") {
  std::mt19937 rng(4);
  const std::size_t n_expert = 64, k = 8, n_tokens = 17;
  const auto logits = draw(rng, n_tokens * n_expert, true);
  const moe::softmax_top_k router{};
  const auto batch = run(router, logits, n_tokens, n_expert, k);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const std::vector<float> one(logits.begin() + t * n_expert, logits.begin() + (t + 1) * n_expert);
    const auto alone = run(router, one, 1, n_expert, k);
    for (std::size_t j = 0; j < k; ++j) {
      CHECK(alone.ids[j] == batch.ids[t * k + j]);
      CHECK(alone.weights[j] == batch.weights[t * k + j]);  // bit-identical
    }
  }
}

TEST_CASE("moe: routing refuses k outside [1, experts], mismatched shapes and non-finite logits") {
  std::vector<float> logits(2 * 4, 0.5f);
  std::vector<moe::expert_id> ids(2 * 5);
  std::vector<float> w(2 * 5);
  const matrix_view<const float> l(logits.data(), 2, 4);
  REQUIRE_THROWS_WITH(moe::route(moe::top_k_softmax{}, l, matrix_view<moe::expert_id>(ids.data(), 2, 5),
                                 matrix_view<float>(w.data(), 2, 5)),
                      Contains("k = 5") && Contains("has 4"));
  REQUIRE_THROWS_WITH(moe::route(moe::top_k_softmax{}, l, matrix_view<moe::expert_id>(ids.data(), 2, 0),
                                 matrix_view<float>(w.data(), 2, 0)),
                      Contains("k = 0"));
  REQUIRE_THROWS_WITH(moe::route(moe::top_k_softmax{}, l, matrix_view<moe::expert_id>(ids.data(), 2, 2),
                                 matrix_view<float>(w.data(), 1, 2)),
                      Contains("for 2 tokens"));
  logits[6] = NAN;
  REQUIRE_THROWS_WITH(moe::route(moe::softmax_top_k{}, l, matrix_view<moe::expert_id>(ids.data(), 2, 2),
                                 matrix_view<float>(w.data(), 2, 2)),
                      Contains("token 1, expert 2 is nan"));
  logits[6] = INFINITY;
  REQUIRE_THROWS_WITH(moe::route(moe::softmax_top_k{}, l, matrix_view<moe::expert_id>(ids.data(), 2, 2),
                                 matrix_view<float>(w.data(), 2, 2)),
                      Contains("is inf"));
  logits[6] = 0.0f;
  const std::vector<float> bias(3, 0.0f);
  REQUIRE_THROWS_WITH(moe::route(moe::sigmoid_top_k{.selection_bias = bias}, l,
                                 matrix_view<moe::expert_id>(ids.data(), 2, 2), matrix_view<float>(w.data(), 2, 2)),
                      Contains("selection_bias has 3 values for 4 experts"));
}
