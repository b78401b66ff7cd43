// SPDX-License-Identifier: MIT
// attention kernels on the real caches: paged equals contiguous, bit for bit,
// and both match the oracle; forks read their parent's rows.
#include <llmkit/attention/decode.hpp>
#include <llmkit/attention/prefill.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/attention_reference.hpp"

using namespace llmkit;
using namespace llmkit::attention;

namespace {

using llmkit::test::uniform_values;

template <class T>
void paged_equals_contiguous(std::uint32_t seed) {
  std::mt19937 rng(seed);
  const kv::kv_shape shape{2, 2, 64};
  const std::size_t group = 3, n_heads = shape.n_kv_heads * group, row = n_heads * shape.head_dim;
  const std::vector<std::size_t> lens{1, 15, 16, 17, 200, 333};
  kv::contiguous_cache<T> contiguous(shape, {lens.size(), 400});
  kv::paged_cache<T, 16> paged(shape, {64});
  std::vector<kv::seq_id> cids, pids;
  std::vector<std::size_t> n_q;
  std::vector<std::int32_t> cu{0};
  for (const std::size_t n : lens) {
    const kv::seq_id c = *contiguous.add_sequence(), p = *paged.add_sequence();
    REQUIRE(contiguous.grow(c, n));
    REQUIRE(paged.grow(p, n));
    for (std::size_t layer = 0; layer < shape.n_layers; ++layer) {
      const auto k = uniform_values(n * shape.n_kv_heads * shape.head_dim, rng), v = uniform_values(k.size(), rng);
      contiguous.store(c, layer, 0, k, v);
      paged.store(p, layer, 0, k, v);
    }
    cids.push_back(c);
    pids.push_back(p);
    n_q.push_back(1 + rng() % n);
    cu.push_back(cu.back() + static_cast<std::int32_t>(n_q.back()));
  }
  const auto q = uniform_values(static_cast<std::size_t>(cu.back()) * row, rng);
  std::vector<float> a(q.size()), b(q.size());
  prefill({.q = q, .out = a, .cu_seqlens = cu, .seq_ids = cids, .layer = 1, .n_heads = n_heads}, contiguous);
  prefill({.q = q, .out = b, .cu_seqlens = cu, .seq_ids = pids, .layer = 1, .n_heads = n_heads}, paged);
  REQUIRE(a == b);
  const double scale = 1.0 / std::sqrt(64.0);
  double err = 0.0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    std::vector<std::int32_t> pos(n_q[i]);
    for (std::size_t t = 0; t < n_q[i]; ++t) pos[t] = static_cast<std::int32_t>(lens[i] - n_q[i] + t);
    const auto ref = llmkit::test::reference_attention(
        paged, pids[i], 1, std::span<const float>(q).subspan(static_cast<std::size_t>(cu[i]) * row, n_q[i] * row), pos,
        n_heads, scale, 0.0, [](std::int32_t qp, std::int32_t kp) { return kp <= qp; });
    for (std::size_t x = 0; x < ref.size(); ++x)
      err = std::max(err, std::fabs(ref[x] - a[static_cast<std::size_t>(cu[i]) * row + x]));
  }
  REQUIRE(err < 1e-5);

  const auto qd = uniform_values(lens.size() * row, rng);
  std::vector<float> da(qd.size()), db(qd.size()), dc(qd.size());
  decode({.q = qd, .out = da, .seq_ids = cids, .layer = 0, .n_heads = n_heads}, contiguous);
  decode({.q = qd, .out = db, .seq_ids = pids, .layer = 0, .n_heads = n_heads}, paged);
  REQUIRE(da == db);
  decode({.q = qd, .out = dc, .seq_ids = pids, .layer = 0, .n_heads = n_heads, .kv_split_tokens = 32}, paged);
  for (std::size_t x = 0; x < da.size(); ++x) REQUIRE(std::fabs(da[x] - dc[x]) < 1e-6);

  // A fork shares the blocks: decoding it gives the parent's result.
  const kv::seq_id child = *paged.fork(pids[4]);
  const std::vector<kv::seq_id> both{pids[4], child};
  const auto q2 = uniform_values(2 * row, rng);
  std::vector<float> o2(q2.size());
  decode({.q = q2, .out = o2, .seq_ids = both, .layer = 1, .n_heads = n_heads}, paged);
  const std::vector<float> q2a(q2.begin(), q2.begin() + static_cast<std::ptrdiff_t>(row));
  std::vector<float> twice(2 * row);
  std::copy(q2a.begin(), q2a.end(), twice.begin());
  std::copy(q2a.begin(), q2a.end(), twice.begin() + static_cast<std::ptrdiff_t>(row));
  decode({.q = twice, .out = o2, .seq_ids = both, .layer = 1, .n_heads = n_heads}, paged);
  REQUIRE(std::equal(o2.begin(), o2.begin() + static_cast<std::ptrdiff_t>(row), o2.begin() + static_cast<std::ptrdiff_t>(row)));
}

}  // namespace

TEST_CASE("paged cache equals contiguous cache: f32") { paged_equals_contiguous<float>(1); }
TEST_CASE("paged cache equals contiguous cache: f16") { paged_equals_contiguous<f16>(2); }
TEST_CASE("paged cache equals contiguous cache: bf16") { paged_equals_contiguous<bf16>(3); }
TEST_CASE("paged cache equals contiguous cache: int8") { paged_equals_contiguous<std::int8_t>(4); }

TEST_CASE("attention reads the real caches' unknown-sequence errors") {
  kv::contiguous_cache<float> cache({1, 1, 64}, {1, 8});
  const std::vector<kv::seq_id> ids{5};
  std::vector<float> q(64), out(64);
  REQUIRE_THROWS_AS(decode({.q = q, .out = out, .seq_ids = ids, .n_heads = 1}, cache), llmkit::error);
}
