// SPDX-License-Identifier: MIT
// attention::decode's fused-conversion kernels on the real caches: every
// storage type x head_dim 64/80/96/128/256 x GQA 1..8, lengths across the
// 16- and 32-row block boundaries, paged and contiguous, against the double-precision
// oracle (on the stored values), and paged == contiguous bit for bit.
#include <llmkit/attention/decode.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "attention_checks.hpp"
#include "reference/attention_reference.hpp"

using namespace llmkit;
using namespace llmkit::attention;

namespace {

using llmkit::test::uniform_values;

/// Largest |decode - oracle| over a batch of sequences with lengths `lens`,
/// for the contiguous and the paged cache; requires paged == contiguous.
template <class T>
double decode_error(std::size_t head_dim, std::size_t group, const std::vector<std::size_t>& lens,
                    std::size_t split, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const kv::kv_shape shape{1, 2, head_dim};
  const std::size_t n_heads = shape.n_kv_heads * group, row = n_heads * head_dim;
  kv::contiguous_cache<T> contiguous(shape, {lens.size(), 200});
  kv::paged_cache<T, 16> paged(shape, {64});
  std::vector<kv::seq_id> cids, pids;
  for (const std::size_t n : lens) {
    const kv::seq_id c = *contiguous.add_sequence(), p = *paged.add_sequence();
    REQUIRE(contiguous.grow(c, n));
    REQUIRE(paged.grow(p, n));
    const auto k = uniform_values(n * shape.n_kv_heads * head_dim, rng), v = uniform_values(k.size(), rng);
    contiguous.store(c, 0, 0, k, v);
    paged.store(p, 0, 0, k, v);
    cids.push_back(c);
    pids.push_back(p);
  }
  const auto q = uniform_values(lens.size() * row, rng);
  std::vector<float> a(q.size()), b(q.size());
  decode({.q = q, .out = a, .seq_ids = cids, .n_heads = n_heads, .kv_split_tokens = split}, contiguous);
  decode({.q = q, .out = b, .seq_ids = pids, .n_heads = n_heads, .kv_split_tokens = split}, paged);
  REQUIRE(a == b);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  auto causal = [](std::int32_t qp, std::int32_t kp) { return kp <= qp; };
  double err = 0.0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    const std::span<const float> qi(q.data() + i * row, row);
    const std::int32_t pos[1] = {static_cast<std::int32_t>(lens[i]) - 1};
    const auto ref = llmkit::test::reference_attention(contiguous, cids[i], 0, qi, pos, n_heads, scale, 0.0, causal);
    for (std::size_t x = 0; x < row; ++x) {
      REQUIRE(std::isfinite(a[i * row + x]));
      err = std::max(err, std::fabs(a[i * row + x] - ref[x]));
    }
  }
  return err;
}

template <class T>
void every_shape(std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (const std::size_t head_dim : llmkit::test::compiled_head_dims({64, 80, 96, 128, 256}))
    for (std::size_t group = 1; group <= 8; ++group) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      // Block boundaries (16, and 32 for int8 with VNNI) +- 1, a single row,
      // and longer sequences.
      const std::vector<std::size_t> lens{1, 15, 16, 17, 31, 32, 33, 63 + rng() % 3, 100 + rng() % 100};
      const std::size_t split = rng() % 2 ? 0 : 16 * (1 + rng() % 3) + rng() % 2;
      const double tolerance = std::is_same_v<T, std::int8_t> ? llmkit::test::attention_int8_decode_tolerance
                                                              : llmkit::test::attention_f32_tolerance;
      REQUIRE(decode_error<T>(head_dim, group, lens, split, static_cast<std::uint32_t>(rng())) < tolerance);
    }
}

}  // namespace

TEST_CASE("decode on real caches: f32, every head_dim and GQA ratio") { every_shape<float>(21); }
TEST_CASE("decode on real caches: f16, every head_dim and GQA ratio") { every_shape<f16>(22); }
TEST_CASE("decode on real caches: bf16, every head_dim and GQA ratio") { every_shape<bf16>(23); }
TEST_CASE("decode on real caches: int8, every head_dim and GQA ratio") { every_shape<std::int8_t>(24); }
