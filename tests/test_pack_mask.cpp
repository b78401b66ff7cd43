// SPDX-License-Identifier: MIT
// pack/ x attention/: the attention mask policy of a packed row is
// attention::packed_causal_mask over the row's cu_seqlens (block-diagonal
// causal, no dense mask), and its tile classifier skips every tile that lies
// across prompts.
#include <llmkit/attention/mask.hpp>
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

using namespace llmkit;

TEST_CASE("a packed row's mask is packed_causal_mask(cu_seqlens), and cross-prompt tiles are hidden") {
  std::mt19937_64 rng(12);
  std::size_t total_hidden = 0, total_tiles = 0;
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<std::vector<std::int32_t>> prompts(1 + rng() % 12);
    for (auto& p : prompts) p.assign(1 + rng() % 40, 7);
    const auto batch = pack::build_packed_batch(
        prompts, pack::best_fit_decreasing(pack::prompt_lengths(prompts), {.capacity = 64, .split_oversized = true}));
    for (const auto& row : batch.rows) {
      const attention::packed_causal_mask mask(row.cu_seqlens);
      const auto n = static_cast<std::int32_t>(row.n_tokens());
      // Row index = position in the row's own numbering.
      for (std::int32_t q = 0; q < n; ++q)
        for (std::int32_t k = 0; k < n; ++k) REQUIRE(mask.visible(q, k) == row.visible(q, k));
      // Every 8x8 tile: hidden iff no pair is visible, full only if every pair is.
      constexpr std::int32_t tile = 8;
      std::size_t hidden = 0, tiles = 0;
      for (std::int32_t q0 = 0; q0 < n; q0 += tile)
        for (std::int32_t k0 = 0; k0 < n; k0 += tile) {
          const std::int32_t q1 = std::min(n, q0 + tile) - 1, k1 = std::min(n, k0 + tile) - 1;
          bool any = false, all = true;
          for (std::int32_t q = q0; q <= q1; ++q)
            for (std::int32_t k = k0; k <= k1; ++k) {
              any = any || row.visible(q, k);
              all = all && row.visible(q, k);
            }
          const auto c = mask.classify(q0, q1, k0, k1);
          if (c == attention::tile_visibility::hidden) REQUIRE_FALSE(any);
          if (c == attention::tile_visibility::full) REQUIRE(all);
          // A tile whose keys all end before the queries' segments start is skipped.
          if (!any && k1 < q0) REQUIRE(c == attention::tile_visibility::hidden);
          // Below the diagonal a hidden tile is a cross-prompt tile skipped.
          if (k1 < q0) {
            hidden += c == attention::tile_visibility::hidden;
            ++tiles;
          }
        }
      total_hidden += hidden;
      total_tiles += tiles;
    }
  }
  // Packed rows of several prompts do have cross-prompt tiles to skip.
  REQUIRE(total_hidden > 0);
  REQUIRE(total_hidden < total_tiles);
}
