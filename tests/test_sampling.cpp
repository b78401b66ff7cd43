// SPDX-License-Identifier: MIT
// sampling/: every processor against the sort-based double oracle, samplers,
// chains (compiled and run-time), bad input.
#include <llmkit/sampling/sampling.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "reference/sampling_reference.hpp"

using namespace llmkit;
using namespace llmkit::sampling;
namespace ref = llmkit::sampling::reference;
using test_data::kind;

static_assert(logits_processor<temperature>);
static_assert(logits_processor<top_k>);
static_assert(logits_processor<top_p>);
static_assert(logits_processor<min_p>);
static_assert(logits_processor<typical_p>);
static_assert(logits_processor<penalties>);
static_assert(logits_processor<logit_bias>);
static_assert(logits_processor<no_repeat_ngram>);
static_assert(logits_processor<banned_sequences>);
static_assert(logits_processor<min_length>);
static_assert(logits_processor<processor_chain<top_k, top_p>>);
static_assert(logits_processor<runtime_chain>);
static_assert(logits_processor<any_processor>);
static_assert(sampler<greedy>);
static_assert(sampler<categorical>);
static_assert(sampler<runtime_chain>);
static_assert(!sampler<top_k>);

namespace {

constexpr std::size_t sizes[] = {1, 2, 3, 5, 16, 17, 255, 256, 257, 1000, 4097, 20000, 40000};
constexpr float inf = std::numeric_limits<float>::infinity();

/// Runs `chain` through process_row and returns the result in double.
template <class Chain>
ref::row run(const Chain& chain, std::vector<float> logits, const sampling_context& ctx = {}) {
  candidates ws;
  process_row(logits, ctx, chain, ws);
  return ref::row(logits.begin(), logits.end());
}

/// fast must keep every token of lo, only tokens of hi, and the surviving
/// values must match the oracle's.
void require_between(const ref::row& fast, const ref::row& lo, const ref::row& hi) {
  REQUIRE(fast.size() == lo.size());
  const auto s_fast = ref::support(fast), s_lo = ref::support(lo), s_hi = ref::support(hi);
  // One assertion per row (not per token) keeps the sanitizer run short.
  std::string problem;
  for (auto t : s_lo)
    if (problem.empty() && s_fast.count(t) == 0) problem = "token " + std::to_string(t) + " should be kept";
  for (auto t : s_fast)
    if (problem.empty() && s_hi.count(t) == 0) problem = "token " + std::to_string(t) + " should be removed";
  for (auto t : s_fast)
    if (problem.empty() && s_hi.count(t) && std::fabs(fast[t] - hi[t]) > 1e-6 * std::max(1.0, std::fabs(hi[t])))
      problem = "token " + std::to_string(t) + ": logit " + std::to_string(fast[t]) + ", expected " + std::to_string(hi[t]);
  INFO(problem);
  REQUIRE(problem.empty());
}

void require_same(const ref::row& fast, const ref::row& expected) { require_between(fast, expected, expected); }

}  // namespace

TEST_CASE("top_k keeps exactly the k best, lowest token on ties") {
  std::uint32_t seed = 1;
  for (auto n : sizes)
    for (auto k_kind : test_data::all_kinds)
      for (std::int64_t k : {0, 1, 2, 7, 40, 64, 1000, 100000}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", k = " << k);
        require_same(run(top_k{k}, v), ref::top_k(ref::from_float(v), k));
      }
}

TEST_CASE("top_k on an already sparse set, and a large k on a dense row") {
  for (auto n : {1000u, 40000u}) {
    const auto v = test_data::logits(n, kind::ties, 77);
    const auto expected = ref::top_k(ref::top_k(ref::from_float(v), n / 3), 25);
    require_same(run(processor_chain{top_k{static_cast<std::int64_t>(n / 3)}, top_k{25}}, v), expected);
    require_same(run(processor_chain{top_k{25}, top_k{static_cast<std::int64_t>(n / 3)}}, v), expected);
  }
}

TEST_CASE("top_p keeps the shortest most-probable prefix reaching p") {
  std::uint32_t seed = 100;
  for (auto n : sizes)
    for (auto k_kind : test_data::all_kinds)
      for (float p : {0.01f, 0.3f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", p = " << p);
        const auto base = ref::from_float(v);
        require_between(run(top_p{p}, v), ref::top_p(base, p * (1 - 1e-5)), ref::top_p(base, std::min(1.0, p * (1 + 1e-5))));
      }
}

TEST_CASE("min_p keeps tokens at least min_p times the most probable") {
  std::uint32_t seed = 200;
  for (auto n : sizes)
    for (auto k_kind : test_data::all_kinds)
      for (float mp : {0.0f, 0.01f, 0.05f, 0.2f, 0.5f, 1.0f}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", min_p = " << mp);
        const auto base = ref::from_float(v);
        require_between(run(min_p{mp}, v), ref::min_p(base, mp * (1 + 1e-5)), ref::min_p(base, mp * (1 - 1e-5)));
      }
}

TEST_CASE("typical_p keeps the most typical tokens up to mass p") {
  std::uint32_t seed = 300;
  for (auto n : sizes)
    for (auto k_kind : {kind::gaussian, kind::with_neg_inf, kind::with_nan, kind::uniform})
      for (float p : {0.2f, 0.5f, 0.9f, 1.0f}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", p = " << p);
        const auto base = ref::from_float(v);
        require_between(run(typical_p{p}, v), ref::typical(base, p * (1 - 1e-5)),
                        ref::typical(base, std::min(1.0, p * (1 + 1e-5))));
      }
}

TEST_CASE("typical_p breaks ties of the typicality score by token") {
  // Two tokens equally far from the mean logit: 0 and 2 around 1 (and 1 itself).
  const std::vector<float> v{0.0f, 1.0f, 2.0f, 1.0f};
  const auto fast = run(typical_p{0.4f}, v);
  const auto expected = ref::typical(ref::from_float(v), 0.4);
  require_same(fast, expected);
}

namespace {
/// Applies `proc` with the kernels of `Arch` and returns the row in double.
template <class Arch, class Proc>
ref::row run_arch(const Proc& proc, std::vector<float> logits) {
  candidates ws;
  ws.reset(logits);
  proc.template apply<Arch>(ws, {});
  ws.to_logits(logits);
  return ref::row(logits.begin(), logits.end());
}

/// top_p and typical_p through the kernels of `Arch` against the oracle.
template <class Arch>
void require_mass_selections(const std::vector<float>& v, float p) {
  const auto base = ref::from_float(v);
  const double lo = p * (1 - 1e-5), hi = std::min(1.0, p * (1 + 1e-5));
  require_between(run_arch<Arch>(top_p{p}, v), ref::top_p(base, lo), ref::top_p(base, hi));
  require_between(run_arch<Arch>(typical_p{p}, v), ref::typical(base, lo), ref::typical(base, hi));
}
}  // namespace

TEST_CASE("top_p and typical_p on long rows: every arch and path of the mass selection") {
  // 16383 takes the radix select; from 16384 the sampled bracket, one-sided
  // (small p on peaked rows) or two-sided, then the threshold refinement.
  std::uint32_t seed = 900;
  for (std::size_t n : {16383u, 16384u, 50001u})
    for (auto k_kind : test_data::all_kinds)
      for (float p : {0.001f, 0.1f, 0.5f, 0.8f, 0.999f}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", p = " << p);
        require_mass_selections<simd::default_arch>(v, p);
        if (n == 50001 && (p == 0.1f || p == 0.8f)) {
          require_mass_selections<xsimd::fma3<xsimd::avx2>>(v, p);
          require_mass_selections<simd::scalar>(v, p);
        }
      }
}

TEST_CASE("mass selection: a sample that misses the crossing (second bracket, or radix select)") {
  // The strided sample reads positions j * n / 1024 only.
  constexpr std::size_t n = 20480, stride = n / 1024;
  // Every sampled position holds a low logit: the sample brackets the wrong region.
  auto v = test_data::logits(n, kind::gaussian, 950);
  for (std::size_t j = 0; j < n; j += stride) v[j] = -30.0f + 0.001f * static_cast<float>(j % 97);
  for (float p : {0.05f, 0.5f, 0.9f}) {
    INFO("p = " << p);
    require_mass_selections<simd::default_arch>(v, p);
  }
  // 50 heavy logits between the sampled positions: the crossing lies below
  // the bracket (second, one-sided bracket at p = 0.5; radix select at 0.7).
  auto heavy = test_data::logits(n, kind::gaussian, 970);
  for (auto& x : heavy) x /= 3.0f;
  for (std::size_t j = 0; j < 50; ++j) heavy[j * 400 + 7] = 8.0f + 0.01f * static_cast<float>(j);
  for (float p : {0.3f, 0.5f, 0.7f}) {
    INFO("heavy, p = " << p);
    require_mass_selections<simd::default_arch>(heavy, p);
    require_mass_selections<xsimd::fma3<xsimd::avx2>>(heavy, p);
  }
  // The sampled positions hold the top group and 4000 unsampled logits the
  // rest of the mass: for top-p the crossing lies above the bracket.
  std::vector<float> light(n, -inf);
  for (std::size_t j = 0; j < 1024; ++j) light[j * stride] = 2.0f + 0.001f * static_cast<float>(j);
  for (std::size_t j = 0; j < 4000; ++j) light[j * 5 + 1] = 1.0f + 0.0001f * static_cast<float>(j);
  for (float p : {0.6f, 0.8f}) {
    INFO("light, p = " << p);
    require_mass_selections<simd::default_arch>(light, p);
    require_mass_selections<xsimd::fma3<xsimd::avx2>>(light, p);
  }
  // Many ties across the crossing: the refinement stops on a tie group, which
  // the final sort splits by token.
  std::vector<float> ties(n);
  std::mt19937 rng(951);
  for (auto& x : ties) x = static_cast<float>(rng() % 200) * 0.01f;
  for (float p : {0.1f, 0.3f, 0.5f, 0.77f}) {
    INFO("ties, p = " << p);
    require_mass_selections<simd::default_arch>(ties, p);
  }
}

TEST_CASE("top_p and typical_p on long sparse sets (after min_p and top_k)") {
  // Uniform in [-10, 10]: min_p(0.1) keeps ~11.5% of 150000 (sparse,
  // unsorted, above the 16384 of the fast path); top_k leaves a sorted set.
  auto v = test_data::logits(150000, kind::uniform, 960);
  for (auto& x : v) x *= 10.0f;
  const auto base = ref::from_float(v);
  const auto after_min_p = ref::min_p(base, 0.1);
  const auto after_top_k = ref::top_k(base, 30000);
  for (float p : {0.05f, 0.6f}) {
    INFO("p = " << p);
    const double lo = p * (1 - 1e-5), hi = p * (1 + 1e-5);
    require_between(run(processor_chain{min_p{0.1f}, top_p{p}}, v), ref::top_p(after_min_p, lo), ref::top_p(after_min_p, hi));
    require_between(run(processor_chain{min_p{0.1f}, typical_p{p}}, v), ref::typical(after_min_p, lo),
                    ref::typical(after_min_p, hi));
    require_between(run(processor_chain{top_k{30000}, top_p{p}}, v), ref::top_p(after_top_k, lo), ref::top_p(after_top_k, hi));
    require_between(run(processor_chain{top_k{30000}, typical_p{p}}, v), ref::typical(after_top_k, lo),
                    ref::typical(after_top_k, hi));
  }
}

TEST_CASE("temperature divides, and T <= 0 reduces to the arg-max") {
  std::uint32_t seed = 400;
  for (auto n : sizes)
    for (auto k_kind : test_data::all_kinds)
      for (float t : {-1.0f, 0.0f, 0.5f, 1.0f, 1.7f}) {
        const auto v = test_data::logits(n, k_kind, seed++);
        INFO("n = " << n << ", kind = " << int(k_kind) << ", T = " << t);
        require_same(run(temperature{t}, v), ref::temperature(ref::from_float(v), t));
      }
}

TEST_CASE("penalties over the last N tokens, dense and sparse") {
  std::mt19937 rng(5);
  std::uint32_t seed = 500;
  for (auto n : {1u, 5u, 257u, 20000u}) {
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(n) - 1);
    for (std::size_t len : {0u, 1u, 10u, 100u}) {
      std::vector<std::int32_t> history(len);
      for (auto& t : history) t = tok(rng) % std::max<std::int32_t>(1, static_cast<std::int32_t>(std::min(n, 30u)));
      const sampling_context ctx{.history = history, .n_prompt = len / 2};
      for (std::int64_t last_n : {-1, 0, 1, 8, 64}) {
        const penalties pen{.repeat = 1.3f, .frequency = 0.25f, .presence = 0.5f, .last_n = last_n};
        const auto v = test_data::logits(n, kind::ties, seed++);
        INFO("n = " << n << ", history " << len << ", last_n = " << last_n);
        const auto base = ref::from_float(v);
        require_same(run(pen, v, ctx), ref::penalties(base, history, 1.3, 0.25, 0.5, last_n));
        // After a truncation the set is sparse: same result on the survivors.
        const std::int64_t k = std::max<std::int64_t>(1, n / 10);
        require_same(run(processor_chain{top_k{k}, pen}, v, ctx),
                     ref::penalties(ref::top_k(base, k), history, 1.3, 0.25, 0.5, last_n));
      }
    }
  }
}

TEST_CASE("logit_bias, no_repeat_ngram, banned_sequences, min_length") {
  const std::vector<std::int32_t> history{3, 4, 5, 3, 4, 9, 3, 4};
  const sampling_context ctx{.history = history, .n_prompt = 5};
  for (auto n : {10u, 300u, 40000u}) {
    const auto v = test_data::logits(n, kind::gaussian, n);
    const auto base = ref::from_float(v);
    const std::int64_t k = std::max<std::int64_t>(1, n / 10 + 5);
    // Dense, and after a truncation (sparse).
    for (bool sparse : {false, true}) {
      INFO("n = " << n << ", sparse = " << sparse);
      const auto start = sparse ? ref::top_k(base, k) : base;
      const top_k first{sparse ? k : 0};
      const logit_bias bias({{1, 2.5f}, {7, -inf}, {1, 0.5f}, {0, -1.0f}});
      require_same(run(processor_chain{first, bias}, v, ctx), ref::logit_bias(start, {{1, 3.0}, {7, -INFINITY}, {0, -1.0}}));
      for (std::size_t ng : {1u, 2u, 3u, 4u})
        require_same(run(processor_chain{first, no_repeat_ngram{static_cast<std::int64_t>(ng)}}, v, ctx),
                     ref::no_repeat_ngram(start, history, ng));
      const std::vector<std::vector<std::int32_t>> seqs{{8}, {3, 4, 6}, {4, 2}, {9, 3, 4, 7}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
      require_same(run(processor_chain{first, banned_sequences(seqs)}, v, ctx), ref::banned_sequences(start, history, seqs));
      for (std::int64_t min_new : {0, 3, 4})
        require_same(run(processor_chain{first, min_length{min_new, {2, 5}}}, v, ctx),
                     ref::min_length(start, 3, static_cast<std::size_t>(min_new), {2, 5}));
    }
  }
}

TEST_CASE("chains compose in the user's order and match the oracle") {
  std::uint32_t seed = 600;
  const std::vector<std::int32_t> history{1, 2, 3, 1, 2, 1};
  const sampling_context ctx{.history = history};
  for (auto n : {8u, 300u, 4097u, 40000u})
    for (auto k_kind : {kind::gaussian, kind::uniform}) {
      const auto v = test_data::logits(n, k_kind, seed++);
      const auto base = ref::from_float(v);
      INFO("n = " << n << ", kind = " << int(k_kind));
      const auto expected1 = ref::temperature(ref::top_p(ref::top_k(ref::penalties(base, history, 1.1, 0, 0, 64), 40), 0.95), 0.8);
      require_same(run(processor_chain{penalties{.repeat = 1.1f}, top_k{40}, top_p{0.95f}, temperature{0.8f}}, v, ctx),
                   expected1);
      require_same(run(runtime_chain::parse("penalties(repeat=1.1,last_n=64);top_k(40);top_p(0.95);temperature(0.8)"), v, ctx),
                   expected1);
      // Temperature before min_p changes the set; after it, it does not.
      const auto expected2 = ref::min_p(ref::temperature(base, 1.5), 0.3);
      require_same(run(runtime_chain::parse("temperature(1.5); min_p(0.3)"), v, ctx), expected2);
      const auto expected3 = ref::temperature(ref::min_p(base, 0.3), 1.5);
      require_same(run(runtime_chain::parse("min_p(0.3);temperature(1.5)"), v, ctx), expected3);
      const auto expected4 = ref::top_k(ref::typical(ref::min_p(base, 0.01), 0.9), 5);
      require_same(run(runtime_chain::parse("min_p(0.01);typical(0.9);top_k(5)"), v, ctx), expected4);
    }
}

TEST_CASE("read-only rows (std::span<const float>) give what the in-place path gives, and stay untouched") {
  const std::vector<std::int32_t> history{5, 6, 7, 5, 6};
  const processor_chain chain{penalties{.repeat = 1.1f, .frequency = 0.1f, .last_n = 64}, top_k{40}, top_p{0.95f},
                              temperature{0.8f}};
  const auto parsed = runtime_chain::parse("penalties(repeat=1.1,last_n=64);min_p(0.05);temperature(0.7);sample");
  candidates ws_in_place, ws_const;
  auto bits_equal = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (auto n : {8u, 17u, 300u, 32000u})  // history tokens are < 8
    for (kind k : test_data::all_kinds)
      for (std::uint64_t step = 0; step < 12; ++step) {
        INFO("n " << n << " step " << step);
        const auto v = test_data::logits(n, k, static_cast<std::uint32_t>(step));
        const sampling_context ctx{.seed = 9, .request_id = 2, .step = step, .history = history};
        const std::span<const float> row(v);
        auto m = v;
        REQUIRE(sample_row(row, ctx, chain, categorical{}, ws_const) == sample_row(m, ctx, chain, categorical{}, ws_in_place));
        m = v;
        REQUIRE(sample_row(row, ctx, parsed, parsed, ws_const) == sample_row(m, ctx, parsed, parsed, ws_in_place));
        m = v;
        REQUIRE(sample_row(row, ctx, processor_chain<>{}, greedy{}, ws_const) ==
                sample_row(m, ctx, processor_chain<>{}, greedy{}, ws_in_place));
        m = v;
        std::vector<float> out(n, 0.0f);
        process_row(m, ctx, chain, ws_in_place);
        process_row(row, ctx, chain, ws_const, std::span<float>(out));
        REQUIRE(bits_equal(out, m));
        REQUIRE(bits_equal(std::vector<float>(row.begin(), row.end()), v));  // NaNs would differ if sanitised in place
      }
  // Batches: the const rows give the mutable batch's tokens.
  const std::size_t rows = 5, vocab = 700;
  std::vector<float> all;
  std::vector<sampling_context> ctxs;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto v = test_data::logits(vocab, kind::gaussian, static_cast<std::uint32_t>(r));
    all.insert(all.end(), v.begin(), v.end());
    ctxs.push_back({.seed = 3, .request_id = r, .history = history});
  }
  const std::vector<float> original = all;
  std::vector<sample_result> from_const(rows), in_place(rows);
  sample_batch(matrix_view<const float>(all.data(), rows, vocab), ctxs, chain, categorical{}, std::span(from_const));
  REQUIRE(bits_equal(all, original));
  sample_batch(matrix_view<float>(all.data(), rows, vocab), ctxs, chain, categorical{}, std::span(in_place));
  for (std::size_t r = 0; r < rows; ++r) REQUIRE(from_const[r] == in_place[r]);
  std::vector<float> wrong(vocab - 1);
  REQUIRE_THROWS_AS(process_row(std::span<const float>(original.data(), vocab), ctxs[0], chain, ws_const,
                                std::span<float>(wrong)),
                    llmkit::error);
}

TEST_CASE("compiled and run-time chains give identical tokens") {
  const std::vector<std::int32_t> history{5, 6, 7, 5, 6};
  const processor_chain compiled{penalties{.repeat = 1.1f, .frequency = 0.1f, .last_n = 64}, top_k{40},
                                 top_p{0.95f}, temperature{0.8f}};
  const auto parsed =
      runtime_chain::parse("penalties(repeat=1.1,frequency=0.1,last_n=64);top_k(40);top_p(0.95);temperature(0.8);sample");
  const runtime_chain built({penalties{.repeat = 1.1f, .frequency = 0.1f, .last_n = 64}, top_k{40}, top_p{0.95f},
                             temperature{0.8f}});
  candidates ws;
  for (auto n : {50u, 32000u}) {
    for (std::uint64_t step = 0; step < 200; ++step) {
      auto v = test_data::logits(n, kind::gaussian, static_cast<std::uint32_t>(step % 7));
      const sampling_context ctx{.seed = 42, .request_id = 3, .step = step, .history = history};
      auto a = v, b = v, c = v;
      const auto ra = sample_row(a, ctx, compiled, categorical{}, ws);
      const auto rb = sample_row(b, ctx, parsed, parsed, ws);
      const auto rc = sample_row(c, ctx, built, categorical{}, ws);
      REQUIRE(ra == rb);
      REQUIRE(ra == rc);
    }
  }
}

TEST_CASE("greedy picks the arg-max, lowest token on ties, with its log-probability") {
  std::uint32_t seed = 700;
  candidates ws;
  for (auto n : sizes)
    for (auto k_kind : test_data::all_kinds) {
      auto v = test_data::logits(n, k_kind, seed++);
      const auto base = ref::from_float(v);
      const auto r = sample_row(v, {}, processor_chain<>{}, greedy{}, ws);
      REQUIRE(r.token == static_cast<std::int32_t>(ref::argmax(base)));
      REQUIRE(r.logprob == Approx(std::log(ref::softmax(base)[ref::argmax(base)])).margin(1e-5));
      // top_k(1) and temperature(0) agree with greedy.
      auto w = test_data::logits(n, k_kind, seed - 1);
      REQUIRE(sample_row(w, {.seed = 9}, top_k{1}, categorical{}, ws).token == r.token);
      w = test_data::logits(n, k_kind, seed - 1);
      REQUIRE(sample_row(w, {.seed = 9}, temperature{0.0f}, categorical{}, ws).token == r.token);
    }
}

TEST_CASE("top_logprobs lists the n most probable tokens with their log-probabilities") {
  std::uint32_t seed = 800;
  candidates ws;
  for (auto n : {1u, 7u, 300u, 40000u})
    for (auto k_kind : {kind::ties, kind::with_neg_inf}) {
      auto v = test_data::logits(n, k_kind, seed++);
      const auto base = ref::from_float(v);
      const auto prob = ref::softmax(base);
      const auto order = ref::order_desc(base);
      ws.reset(v);
      std::vector<token_logprob> out(20);
      const std::size_t got = top_logprobs(ws, out);
      std::size_t finite = 0;
      for (double x : base) finite += x != ref::neg_inf;
      REQUIRE(got == std::min<std::size_t>(20, finite));
      for (std::size_t j = 0; j < got; ++j) {
        REQUIRE(out[j].token == static_cast<std::int32_t>(order[j]));
        REQUIRE(out[j].logprob == Approx(std::log(prob[order[j]])).margin(1e-5));
      }
      // The categorical log-probability of the drawn token agrees too.
      const auto r = categorical{}.sample(ws, {.seed = 1});
      REQUIRE(r.logprob == Approx(std::log(prob[static_cast<std::size_t>(r.token)])).margin(1e-5));
    }
}

TEST_CASE("bad input: NaN is -inf, all -inf is an error, +inf and empty rows are errors") {
  candidates ws;
  std::vector<float> v{NAN, 1.0f, NAN, 0.5f};
  process_row(v, {}, processor_chain<>{}, ws);
  REQUIRE(v[0] == -inf);
  REQUIRE(v[2] == -inf);
  for (std::uint64_t step = 0; step < 100; ++step) {
    std::vector<float> w{NAN, 1.0f, NAN, 0.5f};
    const auto t = sample_row(w, {.step = step}, processor_chain<>{}, categorical{}, ws).token;
    REQUIRE((t == 1 || t == 3));
  }
  std::vector<float> all_inf{-inf, -inf, NAN};
  REQUIRE_THROWS_WITH(ws.reset(all_inf), "logits: every entry is -inf or NaN (vocab 3)");
  std::vector<float> pos_inf{0.0f, inf};
  REQUIRE_THROWS_WITH(ws.reset(pos_inf), "logits: entry 1 is +inf");
  std::vector<float> empty;
  REQUIRE_THROWS_WITH(ws.reset(empty), "logits: the row is empty (vocab 0)");
  // Processing can remove every token: the sampler says so.
  std::vector<float> two{1.0f, 2.0f};
  REQUIRE_THROWS_WITH(sample_row(two, {}, logit_bias({{0, -inf}, {1, -inf}}), categorical{}, ws),
                      "categorical: every candidate logit is -inf (all tokens were removed), vocab 2");
}

TEST_CASE("bad parameters raise llmkit::error naming the argument and value") {
  candidates ws;
  std::vector<float> v{1.0f, 2.0f, 3.0f};
  auto apply = [&](const auto& p) {
    auto w = v;
    process_row(w, {}, p, ws);
  };
  REQUIRE_THROWS_WITH(apply(top_p{0.0f}), "top_p: p must be in (0, 1], got 0");
  REQUIRE_THROWS_WITH(apply(top_p{1.5f}), "top_p: p must be in (0, 1], got 1.5");
  REQUIRE_THROWS_WITH(apply(top_p{-0.1f}), "top_p: p must be in (0, 1], got -0.1");
  REQUIRE_THROWS_AS(apply(top_p{NAN}), llmkit::error);
  REQUIRE_THROWS_WITH(apply(typical_p{2.0f}), "typical_p: p must be in (0, 1], got 2");
  REQUIRE_THROWS_WITH(apply(min_p{1.5f}), "min_p: min_p must be in [0, 1], got 1.5");
  REQUIRE_THROWS_WITH(apply(top_k{-1}), "top_k: k must be >= 0, got -1");
  REQUIRE_THROWS_WITH(apply(penalties{.repeat = 0.0f}), "penalties: repeat must be > 0, got 0");
  REQUIRE_THROWS_WITH(apply(penalties{.last_n = -2}), "penalties: last_n must be >= -1, got -2");
  REQUIRE_THROWS_WITH(apply(temperature{NAN}), "temperature: T is NaN");
  REQUIRE_THROWS_WITH(logit_bias({{-3, 1.0f}}), "logit_bias: token must be >= 0, got -3");
  REQUIRE_THROWS_WITH(apply(logit_bias({{3, 1.0f}})), "logit_bias: biased token 3 is out of range [0, 3)");
  REQUIRE_THROWS_WITH(banned_sequences({{1}, {}}), "banned_sequences: sequence 1 is empty");
  REQUIRE_THROWS_WITH(apply(min_length{2, {7}}), "min_length: eos token 7 is out of range [0, 3)");
  const std::vector<std::int32_t> bad_history{0, 5};
  auto w = v;
  REQUIRE_THROWS_WITH(process_row(w, {.history = bad_history}, penalties{.repeat = 1.2f}, ws),
                      "penalties: history token 5 is out of range [0, 3)");
  // k = 0 is a no-op, k > vocab is clamped, p = 1 keeps everything, empty history is fine.
  REQUIRE(run(top_k{0}, v) == ref::from_float(v));
  REQUIRE(run(top_k{1000}, v) == ref::from_float(v));
  REQUIRE(run(top_p{1.0f}, v) == ref::from_float(v));
  REQUIRE(run(penalties{.repeat = 1.5f}, v, {}) == ref::from_float(v));
  REQUIRE(run(no_repeat_ngram{2}, v, {}) == ref::from_float(v));
}

TEST_CASE("a vocabulary of one always yields token 0") {
  candidates ws;
  const auto chain = runtime_chain::parse("penalties(repeat=1.3);top_k(40);top_p(0.5);min_p(0.5);typical(0.5);temperature(0.7)");
  for (std::uint64_t step = 0; step < 10; ++step) {
    std::vector<float> v{-3.0f};
    const std::vector<std::int32_t> history{0, 0};
    const auto r = sample_row(v, {.step = step, .history = history}, chain, chain, ws);
    REQUIRE(r.token == 0);
    REQUIRE(r.logprob == 0.0f);
  }
}

TEST_CASE("run-time chain parser: syntax and error messages") {
  REQUIRE(runtime_chain::parse("").size() == 0);
  REQUIRE(runtime_chain::parse(" top_k(40) ; top_p(p=0.9); ").size() == 2);
  REQUIRE(runtime_chain::parse("greedy").is_greedy());
  REQUIRE(!runtime_chain::parse("temperature(0.7);sample").is_greedy());
  REQUIRE(runtime_chain::parse("logit_bias(2=-inf,15=+1.5);banned(1 2 3|4);min_length(3,eos=2 7);no_repeat_ngram(3);typical_p(0.9)")
              .size() == 5);
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_q(40)"),
                      Catch::Matchers::StartsWith("sampling chain: unknown item 'top_q' (known:"));
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_k(4x)"), "sampling chain: top_k: k '4x' is not a valid integer");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_p(1.5)"), "top_p: p must be in (0, 1], got 1.5");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_p(0)"), "top_p: p must be in (0, 1], got 0");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_k(40"), "sampling chain: missing ')' at the end of 'top_k(40'");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_k(k=(40))"), "sampling chain: unbalanced parentheses in 'top_k(k=(40))'");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_k()"), "sampling chain: top_k: missing parameter 'k'");
  REQUIRE_THROWS_WITH(runtime_chain::parse("top_k(1,2)"), "sampling chain: top_k: takes at most 1 argument(s), got 2");
  REQUIRE_THROWS_WITH(runtime_chain::parse("penalties(repeat=1.1,rep=2)"),
                      "sampling chain: penalties: unknown parameter 'rep'");
  REQUIRE_THROWS_WITH(runtime_chain::parse("penalties(repeat=1.1,repeat=2)"),
                      "sampling chain: penalties: parameter 'repeat' given twice");
  REQUIRE_THROWS_WITH(runtime_chain::parse("penalties(last_n=)"), "sampling chain: penalties: parameter 'last_n' has no value");
  REQUIRE_THROWS_WITH(runtime_chain::parse("sample;top_k(4)"),
                      "sampling chain: 'top_k(4)' follows the sampler; the sampler must be the last item");
  REQUIRE_THROWS_WITH(runtime_chain::parse("sample(3)"), "sampling chain: sample takes no arguments, got '3'");
  REQUIRE_THROWS_WITH(runtime_chain::parse("logit_bias(5)"),
                      "sampling chain: logit_bias: argument '5' is not of the form token=bias");
  REQUIRE_THROWS_WITH(runtime_chain::parse("banned(1 2||3)"), "sampling chain: banned: sequence is empty");
  REQUIRE_THROWS_WITH(runtime_chain::parse("(3)"), "sampling chain: item '(3)' has no name");
  REQUIRE_THROWS_WITH(runtime_chain::parse("temperature(hot)"),
                      "sampling chain: temperature: t 'hot' is not a valid number");
}

TEST_CASE("sampling_state keeps the history and advances the step") {
  const std::vector<std::int32_t> prompt{1, 2, 3};
  sampling_state state(7, 11, prompt);
  REQUIRE(state.context().n_generated() == 0);
  state.accept(9);
  state.accept(4);
  const auto ctx = state.context();
  REQUIRE(ctx.step == 2);
  REQUIRE(ctx.n_prompt == 3);
  REQUIRE(ctx.n_generated() == 2);
  REQUIRE(std::vector<std::int32_t>(ctx.history.begin(), ctx.history.end()) == std::vector<std::int32_t>{1, 2, 3, 9, 4});
  REQUIRE(ctx.uniform() == philox_uniform(7, 11, 2, 0));
  REQUIRE_THROWS_WITH(state.accept(-1), "sampling_state::accept: token must be >= 0, got -1");
}

TEST_CASE("the default chain parses, and the chain.hpp doc snippet compiles and runs") {
  const auto chain = runtime_chain::parse(default_chain_config);
  REQUIRE(chain.size() == 5);
  REQUIRE(!chain.is_greedy());
  // The snippet of chain.hpp:
  const std::vector<std::int32_t> prompt{1, 2, 3};
  sampling_state state(42, 7, prompt);
  auto logits_row = test_data::logits(1000, kind::gaussian, 5);
  const processor_chain compiled{penalties{.repeat = 1.1f}, top_k{40}, top_p{0.95f}, temperature{0.8f}};
  candidates ws;  // per thread, reused
  const sample_result r = sample_row(logits_row, state.context(), compiled, categorical{}, ws);
  REQUIRE((r.token >= 0 && r.token < 1000));
  REQUIRE(r.logprob <= 0.0f);
  state.accept(r.token);
  REQUIRE(state.step() == 1);
}
