// SPDX-License-Identifier: MIT
// sampling/: the counter-based RNG, canonical kernels across archs,
// chi-square tests of every sampler and common chains, reproducibility
// across batch sizes and thread counts.
//
// Chi-square tests: N draws (steps 0..N-1 of one seeded request) are counted
// per token and compared with the oracle's truncated, renormalised
// distribution by Pearson's statistic (cells with expected count < 5
// pooled). The test fails when the p-value is below 1e-6, so a correct
// sampler fails a given test with probability 1e-6 (as the draws are
// fixed by the seeds, the outcome is in fact deterministic). Each test also
// checks its power: the same counts against the *untruncated* distribution
// must be rejected (p < 1e-6), so the test can fail.
#include <llmkit/sampling/sampling.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/sampling_reference.hpp"

using namespace llmkit;
using namespace llmkit::sampling;
namespace sdetail = llmkit::sampling::detail;
namespace ref = llmkit::sampling::reference;
using test_data::kind;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  using c = philox4x32::counter_type;
  REQUIRE(philox4x32::generate({0, 0, 0, 0}, {0, 0}) == c{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  REQUIRE(philox4x32::generate({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          c{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  REQUIRE(philox4x32::generate({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          c{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("philox uniforms lie in 0 <= u < 1, distinct per seed/request/step/draw, and uniform") {
  std::vector<std::size_t> counts(64, 0);
  for (std::uint64_t step = 0; step < 64000; ++step) {
    const double u = philox_uniform(1, 2, step);
    REQUIRE((u >= 0.0 && u < 1.0));
    ++counts[static_cast<std::size_t>(u * 64)];
  }
  REQUIRE(ref::chi_square_p_value(counts, std::vector<double>(64, 1.0 / 64)) > 1e-6);
  REQUIRE(philox_uniform(1, 2, 3) != philox_uniform(2, 2, 3));
  REQUIRE(philox_uniform(1, 2, 3) != philox_uniform(1, 3, 3));
  REQUIRE(philox_uniform(1, 2, 3) != philox_uniform(1, 2, 4));
  REQUIRE(philox_uniform(1, 2, 3, 0) != philox_uniform(1, 2, 3, 1));
  REQUIRE(philox_uniform(1, 1ull << 32, 3) != philox_uniform(1, 0, 3));
}

namespace {
template <class Arch>
void require_kernels_match_scalar(const std::vector<float>& v, float m) {
  const std::size_t nb = sdetail::n_sum_blocks(v.size());
  std::vector<double> bs(nb), bv(nb);
  std::vector<float> es(v.size()), ev(v.size());
  const double ts = sdetail::exp_block_sums<simd::scalar>(v, m, bs, es);
  const double tv = sdetail::exp_block_sums<Arch>(v, m, bv, ev);
  REQUIRE(std::bit_cast<std::uint64_t>(ts) == std::bit_cast<std::uint64_t>(tv));
  REQUIRE(bs == bv);
  for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(std::bit_cast<std::uint32_t>(es[i]) == std::bit_cast<std::uint32_t>(ev[i]));
  for (double u : {0.0, 0.1, 0.5, 0.9, 0.999999})
    REQUIRE(sdetail::inverse_cdf(v, m, bs, u * ts) == sdetail::inverse_cdf(v, m, bv, u * tv));
  auto a = v, b = v;
  REQUIRE(sdetail::sanitize_max<simd::scalar>(a) == sdetail::sanitize_max<Arch>(b));
}
}  // namespace

TEST_CASE("canonical exp is accurate and bit-identical across archs") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> x(-90.0f, 0.0f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float xi = x(rng);
    const double exact = std::exp(static_cast<double>(xi));
    const float got = sdetail::exp_canonical(xi);
    if (xi >= sdetail::exp_cutoff) worst = std::max(worst, std::fabs(got - exact) / exact);
    else REQUIRE(got == 0.0f);
  }
  REQUIRE(worst < 4e-7);
  REQUIRE(sdetail::exp_canonical(0.0f) == 1.0f);
  REQUIRE(sdetail::exp_canonical(-INFINITY) == 0.0f);
  for (std::size_t n : {1u, 15u, 16u, 17u, 255u, 256u, 257u, 1000u, 32000u})
    for (auto k : test_data::all_kinds) {
      auto v = test_data::logits(n, k, static_cast<std::uint32_t>(n) + 1);
      for (auto& f : v)
        if (f != f) f = -INFINITY;
      const float m = sdetail::max_value(v);
      require_kernels_match_scalar<simd::default_arch>(v, m);
#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
      require_kernels_match_scalar<xsimd::fma3<xsimd::avx2>>(v, m);
#endif
    }
}

namespace {
/// Draws n_draws tokens (steps 0..n_draws-1) from `logits` through chain+pick.
template <class Chain, class Sampler>
std::vector<std::size_t> draw_counts(const std::vector<float>& logits, const Chain& chain, const Sampler& pick,
                                     std::size_t n_draws, std::span<const std::int32_t> history = {}) {
  std::vector<std::size_t> counts(logits.size(), 0);
  candidates ws;
  std::vector<float> row(logits.size());
  for (std::uint64_t step = 0; step < n_draws; ++step) {
    std::copy(logits.begin(), logits.end(), row.begin());
    const auto r = sample_row(row, {.seed = 1234, .request_id = 5, .step = step, .history = history}, chain, pick, ws);
    ++counts[static_cast<std::size_t>(r.token)];
  }
  return counts;
}

/// Chi-square of `chain` against the oracle distribution `expected`, plus a
/// power check against `untruncated`.
template <class Chain>
void require_distribution(const std::vector<float>& logits, const Chain& chain, const ref::row& expected,
                          const ref::row& untruncated, std::size_t n_draws, std::span<const std::int32_t> history = {}) {
  const auto counts = draw_counts(logits, chain, categorical{}, n_draws, history);
  const double p = ref::chi_square_p_value(counts, ref::softmax(expected));
  INFO("p-value " << p);
  REQUIRE(p > 1e-6);
  const double p_wrong = ref::chi_square_p_value(counts, ref::softmax(untruncated));
  INFO("p-value against the untruncated distribution " << p_wrong);
  REQUIRE(p_wrong < 1e-6);
}
}  // namespace

TEST_CASE("chi-square: categorical and each truncation sample the renormalised distribution") {
  const std::size_t n_draws = 20000;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(12);
  for (auto& x : v) x = normal(rng);
  const auto base = ref::from_float(v);
  // Flat (untruncated) alternative for the power check of the plain sampler.
  const ref::row flat(v.size(), 0.0);
  SECTION("plain categorical") { require_distribution(v, processor_chain<>{}, base, flat, n_draws); }
  SECTION("temperature 0.5") { require_distribution(v, temperature{0.5f}, ref::temperature(base, 0.5), base, n_draws); }
  SECTION("top_k 5") { require_distribution(v, top_k{5}, ref::top_k(base, 5), base, n_draws); }
  SECTION("top_p 0.7") { require_distribution(v, top_p{0.7f}, ref::top_p(base, 0.7), base, n_draws); }
  SECTION("min_p 0.3") { require_distribution(v, min_p{0.3f}, ref::min_p(base, 0.3), base, n_draws); }
  SECTION("typical 0.6") { require_distribution(v, typical_p{0.6f}, ref::typical(base, 0.6), base, n_draws); }
  SECTION("penalties") {
    const std::vector<std::int32_t> history{0, 1, 1, 2, 3, 3, 3};
    require_distribution(v, penalties{.repeat = 1.5f, .frequency = 0.3f, .presence = 0.4f},
                         ref::penalties(base, history, 1.5, 0.3, 0.4, 64), base, n_draws, history);
  }
}

TEST_CASE("chi-square: common chains on large vocabularies (fast paths)") {
  SECTION("top_k(40);top_p(0.95);temperature(0.8) at vocab 9000") {
    const auto v = test_data::logits(9000, kind::gaussian, 21);
    const auto base = ref::from_float(v);
    const auto chain = runtime_chain::parse("top_k(40);top_p(0.95);temperature(0.8)");
    require_distribution(v, chain, ref::temperature(ref::top_p(ref::top_k(base, 40), 0.95), 0.8),
                         ref::top_p(ref::top_k(base, 40), 0.95), 5000);
  }
  SECTION("min_p(0.05) at vocab 300, Gaussian x 3") {
    const auto v = test_data::logits(300, kind::gaussian, 22);
    const auto base = ref::from_float(v);
    require_distribution(v, min_p{0.05f}, ref::min_p(base, 0.05), ref::row(300, 0.0), 20000);
  }
  SECTION("min_p(0.05) at vocab 300, flat in [-1, 1] (keeps every token)") {
    const auto v = test_data::logits(300, kind::uniform, 23);
    const auto base = ref::from_float(v);
    REQUIRE(ref::support(ref::min_p(base, 0.05)).size() == 300);
    require_distribution(v, min_p{0.05f}, base, ref::top_k(base, 150), 40000);
  }
  SECTION("top_p(0.9) on a dense row of 20000 (radix select)") {
    const auto v = test_data::logits(20000, kind::gaussian, 24);
    const auto base = ref::from_float(v);
    require_distribution(v, top_p{0.9f}, ref::top_p(base, 0.9), ref::top_p(base, 0.8), 5000);
  }
}

TEST_CASE("greedy is deterministic and ignores the seed") {
  const auto v = test_data::logits(1000, kind::ties, 31);
  const auto counts = draw_counts(v, processor_chain<>{}, greedy{}, 100);
  REQUIRE(counts[ref::argmax(ref::from_float(v))] == 100);
}

TEST_CASE("same seed, same tokens: across batch sizes 1/8/64, orders and thread counts") {
  constexpr std::size_t n_requests = 64, vocab = 5000, n_steps = 3;
  const auto chain = runtime_chain::parse("penalties(repeat=1.1,last_n=64);top_k(40);top_p(0.95);temperature(0.8);sample");
  std::vector<std::vector<float>> rows(n_requests * n_steps);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = test_data::logits(vocab, kind::gaussian, static_cast<std::uint32_t>(i));
  const std::vector<std::int32_t> history{1, 2, 3, 2, 1};
  auto context = [&](std::size_t request, std::size_t step) {
    return sampling_context{.seed = 1000 + request % 5, .request_id = request, .step = step, .history = history};
  };
  // Reference: each request alone (batch 1, serial).
  std::vector<std::int32_t> alone(rows.size());
  for (std::size_t step = 0; step < n_steps; ++step)
    for (std::size_t r = 0; r < n_requests; ++r) {
      auto row = rows[step * n_requests + r];
      const sampling_context ctx = context(r, step);
      std::vector<sample_result> out(1);
      sample_batch(matrix_view<float>(row.data(), 1, vocab), std::span(&ctx, 1), chain, chain, std::span(out));
      alone[step * n_requests + r] = out[0].token;
    }
  // Requests with the same seed still differ (request id in the counter).
  std::size_t differ = 0;
  for (std::size_t r = 5; r < n_requests; ++r) differ += alone[r] != alone[r - 5];
  REQUIRE(differ > 0);
  for (std::size_t threads : {1u, 2u, 4u}) {
    thread_pool pool(threads);
    for (std::size_t batch : {1u, 8u, 64u}) {
      for (std::size_t step = 0; step < n_steps; ++step) {
        for (std::size_t first = 0; first < n_requests; first += batch) {
          // Reverse order inside the batch: composition and position do not matter.
          std::vector<float> logits(batch * vocab);
          std::vector<sampling_context> ctx(batch);
          for (std::size_t j = 0; j < batch; ++j) {
            const std::size_t r = first + batch - 1 - j;
            std::copy(rows[step * n_requests + r].begin(), rows[step * n_requests + r].end(), logits.begin() + j * vocab);
            ctx[j] = context(r, step);
          }
          std::vector<sample_result> out(batch);
          sample_batch(matrix_view<float>(logits.data(), batch, vocab), ctx, chain, chain, out, pool);
          for (std::size_t j = 0; j < batch; ++j) {
            INFO("threads " << threads << ", batch " << batch << ", step " << step);
            REQUIRE(out[j].token == alone[step * n_requests + first + batch - 1 - j]);
          }
        }
      }
    }
  }
}

TEST_CASE("sample_batch checks its shapes and rethrows a row's error") {
  std::vector<float> logits(6, 0.0f);
  std::vector<sampling_context> ctx(2);
  std::vector<sample_result> out(2);
  const processor_chain<> none;
  REQUIRE_THROWS_WITH(sample_batch(matrix_view<float>(logits.data(), 3, 2), ctx, none, categorical{}, out),
                      "sample_batch: contexts.size() = 2 differs from logits.rows() = 3");
  logits[3] = logits[4] = logits[5] = -INFINITY;
  thread_pool pool(2);
  REQUIRE_THROWS_WITH(sample_batch(matrix_view<float>(logits.data(), 2, 3), ctx, none, categorical{}, out, pool),
                      "logits: every entry is -inf or NaN (vocab 3)");
}
