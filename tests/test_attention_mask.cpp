// SPDX-License-Identifier: MIT
// attention/mask.hpp: element visibility and conservative tile classifiers.
#include <llmkit/attention/mask.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

using namespace llmkit;
using namespace llmkit::attention;

namespace {

// Brute force: what classify() may answer for the rectangle.
template <class Mask>
void check_classifier(const Mask& mask, position lo, position hi, int trials, std::mt19937& rng,
                      bool expect_every_answer = true) {
  std::uniform_int_distribution<position> pick(lo, hi);
  std::uniform_int_distribution<position> width(0, 40);
  int seen[3] = {0, 0, 0};
  for (int t = 0; t < trials; ++t) {
    const position qf = pick(rng), ql = qf + width(rng), kf = pick(rng), kl = kf + width(rng);
    bool any = false, all = true;
    for (position q = qf; q <= ql; ++q)
      for (position k = kf; k <= kl; ++k) {
        const bool v = mask.visible(q, k);
        any = any || v;
        all = all && v;
      }
    const tile_visibility c = mask.classify(qf, ql, kf, kl);
    ++seen[static_cast<int>(c)];
    if (c == tile_visibility::full) REQUIRE(all);
    if (c == tile_visibility::hidden) REQUIRE(!any);
    // Exactness where a simple rule exists: the classifier never says
    // partial for a one-element tile.
    if (qf == ql && kf == kl) REQUIRE(c == (any ? tile_visibility::full : tile_visibility::hidden));
  }
  // A classifier that always answers partial would pass the checks above:
  // make sure every answer occurs over the random rectangles.
  if (expect_every_answer) {
    CHECK(seen[0] > 0);
    CHECK(seen[1] > 0);
    CHECK(seen[2] > 0);
  }
}

}  // namespace

TEST_CASE("mask policies satisfy the concept") {
  static_assert(mask_policy<no_mask>);
  static_assert(mask_policy<causal_mask>);
  static_assert(mask_policy<sliding_window_mask>);
  static_assert(mask_policy<prefix_lm_mask>);
  static_assert(mask_policy<packed_causal_mask>);
  auto pred = [](position q, position k) { return (q + k) % 3 != 0; };
  static_assert(mask_policy<decltype(custom_mask{pred})>);
  static_assert(!mask_policy<int>);
}

TEST_CASE("causal mask: element rule and classifier") {
  causal_mask m;
  REQUIRE(m.visible(5, 5));
  REQUIRE(m.visible(5, 0));
  REQUIRE_FALSE(m.visible(5, 6));
  REQUIRE(m.classify(10, 20, 0, 10) == tile_visibility::full);
  REQUIRE(m.classify(10, 20, 21, 30) == tile_visibility::hidden);
  REQUIRE(m.classify(10, 20, 11, 12) == tile_visibility::partial);
  std::mt19937 rng(1);
  check_classifier(m, 0, 100, 3000, rng);
}

TEST_CASE("sliding window mask with sinks") {
  sliding_window_mask m(4, 2);
  // q = 10 sees 7, 8, 9, 10 (window) and 0, 1 (sinks).
  std::vector<position> seen;
  for (position k = 0; k <= 12; ++k)
    if (m.visible(10, k)) seen.push_back(k);
  REQUIRE(seen == std::vector<position>{0, 1, 7, 8, 9, 10});
  std::mt19937 rng(2);
  check_classifier(m, 0, 60, 4000, rng);
  check_classifier(sliding_window_mask(16), 0, 200, 4000, rng);
  check_classifier(sliding_window_mask(1), 0, 50, 2000, rng, false);
  REQUIRE_THROWS_WITH(sliding_window_mask(0), "sliding_window_mask: window must be >= 1, got 0");
  REQUIRE_THROWS_WITH(sliding_window_mask(3, -1), "sliding_window_mask: sinks must be >= 0, got -1");
}

TEST_CASE("prefix-LM mask: bidirectional prompt, causal continuation") {
  prefix_lm_mask m(5);
  REQUIRE(m.visible(0, 4));   // prompt sees the whole prompt
  REQUIRE_FALSE(m.visible(0, 5));
  REQUIRE(m.visible(7, 3));
  REQUIRE(m.visible(7, 7));
  REQUIRE_FALSE(m.visible(7, 8));
  std::mt19937 rng(3);
  check_classifier(m, 0, 40, 4000, rng);
  check_classifier(prefix_lm_mask(0), 0, 40, 2000, rng);
  REQUIRE_THROWS_WITH(prefix_lm_mask(-3), "prefix_lm_mask: prefix_length must be >= 0, got -3");
}

TEST_CASE("packed causal mask is block-diagonal causal") {
  const std::vector<std::int32_t> cu{0, 3, 3, 7, 12};  // segments [0,3) [3,3) [3,7) [7,12)
  packed_causal_mask m(cu);
  for (position q = 0; q < 14; ++q)
    for (position k = 0; k < 14; ++k) {
      const int sq = q < 3 ? 0 : q < 7 ? 2 : 3;
      const int sk = k < 3 ? 0 : k < 7 ? 2 : 3;
      REQUIRE(m.visible(q, k) == (sq == sk && k <= q));
    }
  std::mt19937 rng(4);
  check_classifier(m, 0, 14, 3000, rng);
  std::vector<std::int32_t> many{0};
  for (int i = 0; i < 20; ++i) many.push_back(many.back() + 1 + static_cast<int>(rng() % 30));
  check_classifier(packed_causal_mask(many), 0, many.back(), 4000, rng);

  const std::vector<std::int32_t> ids{4, 4, 4, 9, 9, 9, 9, 1, 1, 1, 1, 1};
  const auto from_ids = packed_causal_mask::from_segment_ids(ids);
  for (position q = 0; q < 12; ++q)
    for (position k = 0; k < 12; ++k) REQUIRE(from_ids.visible(q, k) == m.visible(q, k));
  const std::vector<std::int32_t> broken{1, 1, 2, 1};
  REQUIRE_THROWS_WITH(packed_causal_mask::from_segment_ids(broken),
                      "packed_causal_mask: segment id 1 at position 3 is not contiguous");
  const std::vector<std::int32_t> bad{0, 4, 2};
  REQUIRE_THROWS_WITH(packed_causal_mask(bad), "packed_causal_mask: cu_seqlens[2] = 2 is below cu_seqlens[1] = 4");
  const std::vector<std::int32_t> bad0{1, 4};
  REQUIRE_THROWS_WITH(packed_causal_mask(bad0), "packed_causal_mask: cu_seqlens[0] must be 0, got 1");
}

TEST_CASE("custom mask: predicate with the default or a user classifier") {
  auto even = [](position q, position k) { return k <= q && (q - k) % 2 == 0; };
  custom_mask m{even};
  REQUIRE(m.visible(4, 2));
  REQUIRE_FALSE(m.visible(4, 3));
  REQUIRE(m.classify(0, 10, 0, 10) == tile_visibility::partial);
  custom_mask with_classifier{even, [](position qf, position ql, position kf, position kl) {
                                return kf > ql ? tile_visibility::hidden : tile_visibility::partial;
                              }};
  REQUIRE(with_classifier.classify(0, 3, 4, 9) == tile_visibility::hidden);
  no_mask none;
  REQUIRE(none.visible(0, 100));
  REQUIRE(none.classify(0, 1, 5, 9) == tile_visibility::full);
}
