// SPDX-License-Identifier: MIT
// search/: generation loop, beam search and speculative decoding on a toy
// Markov model with known probabilities that reads its context back from a
// real KV cache (tests/reference/search_reference.hpp).
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/sampling/categorical.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/greedy.hpp>
#include <llmkit/sampling/logit_bias.hpp>
#include <llmkit/sampling/temperature.hpp>
#include <llmkit/sampling/top_k.hpp>
#include <llmkit/search/detail/row_select.hpp>
#include <llmkit/search/search.hpp>

#include <catch2/catch.hpp>

#include "reference/search_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::search;
using search_reference::toy_lm;

namespace {
using paged = kv::paged_cache<float, 4>;
using dense = kv::contiguous_cache<float>;

static_assert(sequence_cache<paged>);
static_assert(sequence_cache<dense>);
static_assert(model::language_model<toy_lm, paged>);
static_assert(model::language_model<toy_lm, dense, thread_pool>);
namespace {
struct no_executor_lm {  // the forward of the old contract, without an executor
  std::size_t vocab_size() const noexcept { return 4; }
  kv::kv_shape kv_shape() const noexcept { return {1, 1, 2}; }
  matrix_view<const float> forward(const model::batch&, paged&);
};
}  // namespace
static_assert(!model::language_model<no_executor_lm, paged>);
static_assert(drafter<ngram_drafter>);
static_assert(drafter<model_drafter<toy_lm, paged>>);

paged make_paged(std::size_t n_blocks = 512, std::size_t max_sequences = 64) {
  return paged(kv::kv_shape{1, 1, 2}, {.n_blocks = n_blocks, .max_sequences = max_sequences});
}

void require_pool_full(const paged& cache) {
  REQUIRE(cache.n_sequences() == 0);
  REQUIRE(cache.pool().n_free() == cache.pool().n_total());
}

/// Plain greedy continuation from the oracle's distributions.
std::vector<std::int32_t> oracle_greedy(const toy_lm& m, std::vector<std::int32_t> context, std::size_t n,
                                        const std::vector<std::int32_t>& eos = {}) {
  std::vector<std::int32_t> out;
  for (std::size_t i = 0; i < n; ++i) {
    const auto p = m.probs(context);
    const auto t = static_cast<std::int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
    out.push_back(t);
    context.push_back(t);
    if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
  }
  return out;
}
}  // namespace

// ---------------------------------------------------------------- stopping

TEST_CASE("stop_criteria: EOS, stop sequences and the budget, in that order") {
  stop_criteria s{.max_new_tokens = 5, .eos_tokens = {7}, .stop_sequences = {{1, 2}, {3}}};
  const std::vector<std::int32_t> none{}, a{4}, b{1, 2}, c{5, 3}, d{4, 4, 4, 4, 4}, e{4, 4, 4, 1, 7}, f{2, 1};
  REQUIRE_FALSE(s.check(none));
  REQUIRE_FALSE(s.check(a));
  REQUIRE(*s.check(b) == finish_reason::stop_sequence);
  REQUIRE(*s.check(c) == finish_reason::stop_sequence);
  REQUIRE(*s.check(d) == finish_reason::max_tokens);
  REQUIRE(*s.check(e) == finish_reason::eos);
  REQUIRE_FALSE(s.check(f));
  REQUIRE(finish_reason_name(finish_reason::eos) == "eos");
  REQUIRE_THROWS_WITH((stop_criteria{.max_new_tokens = 0}.validate("who")), "who: max_new_tokens must be > 0, got 0");
  REQUIRE_THROWS_WITH((stop_criteria{.stop_sequences = {{1}, {}}}.validate("who")), "who: stop_sequences[1] is empty");
}

// ---------------------------------------------------------------- generate

TEST_CASE("generate, beam search, speculative decoding and model_drafter run the model on the caller's executor") {
  toy_lm m(7, 1), d(7, 1);
  auto cache = make_paged();
  auto draft_cache = make_paged();
  const std::vector<std::int32_t> prompt{1, 4, 2};
  thread_pool pool(2);
  serial_executor other;
  const sampling::processor_chain<> none;
  const auto plain = generate(m, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 5}});
  REQUIRE(m.last_executor() != nullptr);
  REQUIRE(m.last_executor() != &pool);
  const auto pooled = generate(m, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 5}}, {}, pool);
  REQUIRE(m.last_executor() == &pool);
  REQUIRE(pooled.tokens == plain.tokens);
  beam_search(m, cache, prompt, {.beam_width = 2, .stop = {.max_new_tokens = 4}}, none, other);
  REQUIRE(m.last_executor() == &other);
  model_drafter<toy_lm, paged, sampling::processor_chain<>, thread_pool> drafter_on_pool(d, draft_cache, pool);
  const auto spec = speculative_generate(m, cache, drafter_on_pool, prompt, {.stop = {.max_new_tokens = 5}, .draft_length = 2},
                                         none, {}, other);
  REQUIRE(spec.tokens == plain.tokens);
  REQUIRE(m.last_executor() == &other);
  REQUIRE(d.last_executor() == &pool);
}

TEST_CASE("generate: greedy equals the oracle's arg-max chain, the pool is full afterwards") {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    toy_lm m(7, seed);
    auto cache = make_paged();
    const std::vector<std::int32_t> prompt{1, 4, 2};
    std::vector<std::int32_t> streamed;
    const auto r = generate(m, cache, prompt, sampling::processor_chain<>{}, sampling::greedy{},
                            {.stop = {.max_new_tokens = 23}}, [&](std::int32_t t) { streamed.push_back(t); });
    REQUIRE(r.tokens == oracle_greedy(m, prompt, 23));
    REQUIRE(streamed == r.tokens);
    REQUIRE(r.reason == finish_reason::max_tokens);
    REQUIRE(r.n_forward_passes == 23);
    REQUIRE(m.n_tokens_processed() == prompt.size() + 22);
    for (std::size_t i = 0; i < r.tokens.size(); ++i) {
      std::vector<std::int32_t> ctx = prompt;
      ctx.insert(ctx.end(), r.tokens.begin(), r.tokens.begin() + static_cast<std::ptrdiff_t>(i));
      REQUIRE(r.logprobs[i] == Approx(std::log(m.probs(ctx)[static_cast<std::size_t>(r.tokens[i])])).margin(1e-5));
    }
    require_pool_full(cache);
  }
}

TEST_CASE("generate: EOS, stop sequences, budget of 1 and cancellation") {
  toy_lm m(5, 11);
  auto cache = make_paged();
  const std::vector<std::int32_t> prompt{0};
  const auto greedy_tokens = oracle_greedy(m, prompt, 12);
  const sampling::processor_chain<> none;
  // EOS = the 4th greedy token (unless it appeared before).
  const std::int32_t eos = greedy_tokens[3];
  const auto first = std::find(greedy_tokens.begin(), greedy_tokens.end(), eos) - greedy_tokens.begin();
  auto r = generate(m, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 12, .eos_tokens = {eos}}});
  REQUIRE(r.reason == finish_reason::eos);
  REQUIRE(r.tokens == std::vector<std::int32_t>(greedy_tokens.begin(), greedy_tokens.begin() + first + 1));
  // Stop sequence = greedy tokens 5..6.
  r = generate(m, cache, prompt, none, sampling::greedy{},
               {.stop = {.max_new_tokens = 12, .stop_sequences = {{99, 98}, {greedy_tokens[5], greedy_tokens[6]}}}});
  REQUIRE(r.reason == finish_reason::stop_sequence);
  REQUIRE(r.tokens.size() <= 7);
  REQUIRE(r.tokens == std::vector<std::int32_t>(greedy_tokens.begin(), greedy_tokens.begin() + r.tokens.size()));
  r = generate(m, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 1}});
  REQUIRE(r.tokens.size() == 1);
  REQUIRE(r.n_forward_passes == 1);
  int calls = 0;
  r = generate(m, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 12}},
               [&](std::int32_t) { return ++calls < 3; });
  REQUIRE(r.reason == finish_reason::cancelled);
  REQUIRE(r.tokens.size() == 3);
  require_pool_full(cache);
}

TEST_CASE("generate: sampled tokens follow the processed distribution (chi-square, p > 1e-6)") {
  // One step from a fixed prompt, many requests: the token histogram against
  // softmax(top_k(3, logits) / 0.7). False-failure rate 1e-6 by the threshold.
  toy_lm m(6, 5);
  auto cache = make_paged();
  const std::vector<std::int32_t> prompt{2, 3};
  const sampling::processor_chain chain{sampling::top_k{3}, sampling::temperature{0.7f}};
  const std::size_t n = 20000;
  std::vector<std::size_t> counts(6, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = generate(m, cache, prompt, chain, sampling::categorical{},
                            {.stop = {.max_new_tokens = 1}, .seed = 42, .request_id = i});
    ++counts[static_cast<std::size_t>(r.tokens[0])];
  }
  const auto l = m.logits(prompt);
  std::vector<std::size_t> idx(6);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return l[a] > l[b]; });
  std::vector<double> expected(6, 0.0);
  double z = 0;
  for (int j = 0; j < 3; ++j) z += expected[idx[j]] = std::exp((l[idx[j]] - l[idx[0]]) / 0.7);
  for (double& e : expected) e /= z;
  REQUIRE(search_reference::chi_square_p_value(counts, expected, n) > 1e-6);
  require_pool_full(cache);
}

TEST_CASE("generate: bad input raises llmkit::error naming the argument") {
  toy_lm m(5, 1);
  auto cache = make_paged(4, 1);
  const sampling::processor_chain<> none;
  const std::vector<std::int32_t> empty, bad{9}, ok{1};
  REQUIRE_THROWS_WITH(generate(m, cache, empty, none, sampling::greedy{}, {}),
                      Catch::Contains("generate: prompt is empty"));
  REQUIRE_THROWS_WITH(generate(m, cache, ok, none, sampling::greedy{}, {.stop = {.max_new_tokens = 0}}),
                      "generate: max_new_tokens must be > 0, got 0");
  REQUIRE_THROWS_WITH(generate(m, cache, bad, none, sampling::greedy{}, {}), Catch::Contains("toy_lm: token 9"));
  // 4 blocks of 4 tokens: 1 + 15 tokens fit, the 17th does not.
  REQUIRE_THROWS_WITH(generate(m, cache, ok, none, sampling::greedy{}, {.stop = {.max_new_tokens = 40}}),
                      Catch::Contains("no room"));
  require_pool_full(cache);
}

// ---------------------------------------------------------------- beam search

TEST_CASE("beam_search: a designed model where greedy misses the best sequence") {
  // Tokens: 0 = A, 1 = B, 2 = EOS. After the prompt [A]: A .5, B .4, EOS .1.
  // After A: uniform. After B: EOS .9. Best 2-token sequence: [B, EOS], p = .36.
  toy_lm m(3, 0, 1.0, /*use_parity=*/false);
  m.set_probs(0, -1, {0.5, 0.4, 0.1});
  m.set_probs(0, 0, {1.0 / 3, 1.0 / 3, 1.0 / 3});
  m.set_probs(1, 0, {0.05, 0.05, 0.9});
  auto cache = make_paged();
  const std::vector<std::int32_t> prompt{0};
  const stop_criteria stop{.max_new_tokens = 2, .eos_tokens = {2}};
  const auto greedy_run = beam_search(m, cache, prompt, {.beam_width = 1, .stopping = early_stopping::when_n_done, .stop = stop});
  REQUIRE(greedy_run.hypotheses.size() == 1);
  REQUIRE(greedy_run.hypotheses[0].tokens == std::vector<std::int32_t>{0, 0});
  const auto r = beam_search(m, cache, prompt, {.beam_width = 2, .length_penalty = 0.0f, .stop = stop});
  REQUIRE(r.hypotheses.size() == 2);
  REQUIRE(r.hypotheses[0].tokens == std::vector<std::int32_t>{1, 2});
  REQUIRE(r.hypotheses[0].reason == finish_reason::eos);
  REQUIRE(r.hypotheses[0].logprob == Approx(std::log(0.36)).epsilon(1e-6));
  REQUIRE(r.hypotheses[1].logprob == Approx(std::log(0.5 / 3)).epsilon(1e-6));
  require_pool_full(cache);
}

TEST_CASE("beam_search: width 1 equals greedy") {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    toy_lm m(9, seed);
    auto cache = make_paged();
    const std::vector<std::int32_t> prompt{3, 1, 4};
    const std::vector<std::int32_t> eos{static_cast<std::int32_t>(seed % 9)};
    const auto g = oracle_greedy(m, prompt, 17, eos);
    const auto r = beam_search(m, cache, prompt,
                               {.beam_width = 1, .stopping = early_stopping::when_n_done,
                                .stop = {.max_new_tokens = 17, .eos_tokens = eos}});
    REQUIRE(r.hypotheses.size() == 1);
    REQUIRE(r.hypotheses[0].tokens == g);
    REQUIRE(r.n_forks == 0);
    require_pool_full(cache);
  }
}

TEST_CASE("beam_search: equals the reference beam search on random toys, every stopping mode and alpha") {
  int case_no = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed)
    for (std::size_t B : {2u, 3u, 5u})
      for (double alpha : {0.0, 1.0, -0.5})
        for (early_stopping mode : {early_stopping::when_n_done, early_stopping::when_no_better, early_stopping::never}) {
          ++case_no;
          toy_lm m(6, seed * 31 + static_cast<std::uint32_t>(B), 2.0);
          auto cache = make_paged(1024, 64);
          const std::vector<std::int32_t> prompt{static_cast<std::int32_t>(seed % 6), 2};
          const std::vector<std::int32_t> eos{5};
          const std::size_t max_new = 7;
          const std::size_t n_best = std::max<std::size_t>(1, B - 1);
          const auto r = beam_search(m, cache, prompt,
                                     {.beam_width = B, .n_best = n_best, .length_penalty = static_cast<float>(alpha),
                                      .stopping = mode, .stop = {.max_new_tokens = max_new, .eos_tokens = eos}});
          const auto ref = search_reference::reference_beam_search(
              [&](std::span<const std::int32_t> c) { return m.probs(c); }, prompt, B, max_new, eos, alpha,
              static_cast<int>(mode), n_best);
          INFO("case " << case_no << " seed " << seed << " B " << B << " alpha " << alpha << " mode "
                       << early_stopping_name(mode));
          REQUIRE(r.hypotheses.size() == ref.size());
          for (std::size_t i = 0; i < ref.size(); ++i) {
            REQUIRE(r.hypotheses[i].tokens == ref[i].tokens);
            REQUIRE(r.hypotheses[i].logprob == Approx(ref[i].logprob).epsilon(1e-5));
            REQUIRE(r.hypotheses[i].score == Approx(ref[i].score).epsilon(1e-5));
          }
          require_pool_full(cache);
        }
}

TEST_CASE("beam_search: a beam as wide as the tree finds the exhaustive n-best") {
  for (std::uint32_t seed : {3u, 8u}) {
    toy_lm m(4, seed, 1.0);
    auto cache = make_paged(2048, 128);
    const std::vector<std::int32_t> prompt{1};
    const std::vector<std::int32_t> eos{3};
    const auto ex = search_reference::exhaustive_search([&](std::span<const std::int32_t> c) { return m.probs(c); },
                                                        prompt, 4, eos, 1.0, 5);
    const auto r = beam_search(m, cache, prompt,
                               {.beam_width = 64, .n_best = 5, .length_penalty = 1.0f,
                                .stopping = early_stopping::never, .stop = {.max_new_tokens = 4, .eos_tokens = eos}});
    REQUIRE(r.hypotheses.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) {
      REQUIRE(r.hypotheses[i].tokens == ex[i].tokens);
      REQUIRE(r.hypotheses[i].score == Approx(ex[i].score).epsilon(1e-5));
    }
    require_pool_full(cache);
  }
}

TEST_CASE("beam_search: paged beams share blocks, contiguous copies, both give the same hypotheses") {
  toy_lm m(16, 77, 0.5);
  std::vector<std::int32_t> prompt(37);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 7) % 16);
  const beam_options opt{.beam_width = 8, .stopping = early_stopping::never, .stop = {.max_new_tokens = 12}};
  auto paged_cache = make_paged(1024, 64);
  const auto shared = beam_search(m, paged_cache, prompt, opt);
  dense copying(kv::kv_shape{1, 1, 2}, {.max_sequences = 64, .max_tokens = 64});
  beam_options naive = opt;
  naive.copy_all_beams = true;
  const auto copied = beam_search(m, copying, prompt, naive);
  REQUIRE(copied.n_forks >= 8 * 10);  // every beam of every step after the first
  REQUIRE(shared.hypotheses.size() == copied.hypotheses.size());
  for (std::size_t i = 0; i < shared.hypotheses.size(); ++i) REQUIRE(shared.hypotheses[i].tokens == copied.hypotheses[i].tokens);
  // 8 beams x 48 cached tokens would be 384 rows; the prompt is held once.
  REQUIRE(shared.memory.peak_tokens_held == 8 * (37 + 11));  // the 12th token needs no forward
  REQUIRE(shared.memory.peak_distinct_tokens < shared.memory.peak_tokens_held / 2);
  REQUIRE(shared.memory.peak_blocks_in_use * 4 < shared.memory.peak_tokens_held / 2);
  REQUIRE(shared.memory.peak_bytes_in_use == shared.memory.peak_blocks_in_use * 4 * paged_cache.bytes_per_token());
  // Rows that are not distinct tokens: at each of the <= 2B - 1 segments of the beam tree, at most
  // 3 copied rows of the block where it branches off and 3 free slots in its last block.
  REQUIRE(shared.memory.peak_blocks_in_use * 4 <= shared.memory.peak_distinct_tokens + 6 * (2 * 8 - 1));
  REQUIRE(shared.memory.memory_ratio >= 1.0);
  REQUIRE(shared.memory.memory_ratio < 2.0);
  REQUIRE(copied.memory.peak_bytes_in_use == 8 * 64 * copying.bytes_per_token());
  REQUIRE(shared.n_forks > 0);
  require_pool_full(paged_cache);
  REQUIRE(copying.n_sequences() == 0);
}

TEST_CASE("beam_search: stop sequences end hypotheses, the chain removes tokens") {
  toy_lm m(6, 9);
  auto cache = make_paged();
  const std::vector<std::int32_t> prompt{1, 2};
  const auto r = beam_search(m, cache, prompt,
                             {.beam_width = 3, .stopping = early_stopping::never,
                              .stop = {.max_new_tokens = 6, .stop_sequences = {{4, 4}, {0}}}});
  for (const auto& h : r.hypotheses) {
    if (h.reason == finish_reason::stop_sequence) {
      const bool ends = h.tokens.back() == 0 || (h.tokens.size() >= 2 && h.tokens[h.tokens.size() - 2] == 4 && h.tokens.back() == 4);
      REQUIRE(ends);
    } else {
      REQUIRE(h.reason == finish_reason::max_tokens);
      REQUIRE(h.tokens.size() == 6);
    }
  }
  // A logit bias of -inf on token 3: never chosen.
  const sampling::processor_chain chain{sampling::logit_bias({{3, -std::numeric_limits<float>::infinity()}})};
  const auto banned = beam_search(m, cache, prompt, {.beam_width = 4, .stop = {.max_new_tokens = 5}}, chain);
  for (const auto& h : banned.hypotheses) REQUIRE(std::find(h.tokens.begin(), h.tokens.end(), 3) == h.tokens.end());
  require_pool_full(cache);
}

TEST_CASE("beam_search: bad options and a cache too small raise llmkit::error") {
  toy_lm m(6, 9);
  auto cache = make_paged(6, 4);
  const std::vector<std::int32_t> prompt{1}, empty;
  REQUIRE_THROWS_WITH(beam_search(m, cache, prompt, {.beam_width = 0}), "beam_search: beam_width must be >= 1, got 0");
  REQUIRE_THROWS_WITH(beam_search(m, cache, prompt, {.beam_width = 2, .n_best = 3}),
                      "beam_search: n_best = 3 exceeds beam_width = 2");
  REQUIRE_THROWS_WITH(beam_search(m, cache, prompt, {.length_penalty = std::numeric_limits<float>::quiet_NaN()}),
                      Catch::StartsWith("beam_search: length_penalty must be finite"));
  REQUIRE_THROWS_WITH(beam_search(m, cache, empty, {}), Catch::Contains("beam_search: prompt is empty"));
  REQUIRE_THROWS_WITH(beam_search(m, cache, prompt, {.beam_width = 5, .stop = {.max_new_tokens = 3}}),
                      Catch::Contains("no free sequence slot"));
  require_pool_full(cache);
  REQUIRE_THROWS_WITH(beam_search(m, cache, prompt, {.beam_width = 4, .stop = {.max_new_tokens = 30}}),
                      Catch::Contains("no room"));
  require_pool_full(cache);
}

TEST_CASE("beam_search: a prefilled prefix gives the same hypotheses and is left untouched") {
  toy_lm m(8, 41, 1.0);
  std::vector<std::int32_t> prompt(11);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 5 + 1) % 8);
  const beam_options base{.beam_width = 4, .stopping = early_stopping::never, .stop = {.max_new_tokens = 6}};
  auto check = [&](auto& cache) {
    const auto plain = beam_search(m, cache, prompt, base);
    for (std::size_t n_prefix : {std::size_t{1}, std::size_t{4}, std::size_t{8}, prompt.size() - 1, prompt.size()}) {
      INFO("prefix of " << n_prefix << " tokens");
      const kv::seq_id prefix = *cache.add_sequence();
      model::batch_builder b;
      b.add(prefix, std::span<const std::int32_t>(prompt).first(n_prefix), 0);
      serial_executor serial;
      m.forward(b.view(), cache, serial);
      const std::size_t passes_before = m.n_forward_passes(), tokens_before = m.n_tokens_processed();
      beam_options opt = base;
      opt.prefix = prefix;
      for (int repeat = 0; repeat < 2; ++repeat) {  // the prefix still serves a second search
        const auto r = beam_search(m, cache, prompt, opt);
        REQUIRE(r.hypotheses.size() == plain.hypotheses.size());
        for (std::size_t i = 0; i < plain.hypotheses.size(); ++i) {
          REQUIRE(r.hypotheses[i].tokens == plain.hypotheses[i].tokens);
          REQUIRE(r.hypotheses[i].score == Approx(plain.hypotheses[i].score).epsilon(1e-12));
        }
        REQUIRE(cache.n_tokens(prefix) == n_prefix);
        REQUIRE(cache.n_sequences() == 1);
      }
      // Only the prompt tokens past the prefix (at least the last one) were fed again.
      const std::size_t fed_first = prompt.size() - std::min(n_prefix, prompt.size() - 1);
      REQUIRE(m.n_tokens_processed() - tokens_before == 2 * (fed_first + (plain.n_forward_passes - 1) * 4));
      REQUIRE(m.n_forward_passes() - passes_before == 2 * plain.n_forward_passes);
      cache.free(prefix);
    }
  };
  auto paged_cache = make_paged(256, 16);
  check(paged_cache);
  require_pool_full(paged_cache);
  dense copying(kv::kv_shape{1, 1, 2}, {.max_sequences = 16, .max_tokens = 32});
  check(copying);
  REQUIRE(copying.n_sequences() == 0);

  const kv::seq_id prefix = *paged_cache.add_sequence();
  model::batch_builder b;
  b.add(prefix, prompt, 0);
  serial_executor serial;
  m.forward(b.view(), paged_cache, serial);
  beam_options opt = base;
  opt.prefix = prefix;
  const std::vector<std::int32_t> shorter(prompt.begin(), prompt.end() - 1);
  REQUIRE_THROWS_WITH(beam_search(m, paged_cache, shorter, opt),
                      "beam_search: prefix sequence " + std::to_string(prefix) + " holds 11 tokens, more than the 10 of the prompt");
  opt.prefix = prefix + 1000;
  REQUIRE_THROWS_WITH(beam_search(m, paged_cache, prompt, opt),
                      "beam_search: prefix sequence " + std::to_string(prefix + 1000) + " is not in the cache");
  REQUIRE(paged_cache.n_sequences() == 1);
  paged_cache.free(prefix);
  require_pool_full(paged_cache);
}

TEST_CASE("row_select: log_sum_exp and top_entries against double-precision references") {
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t n : {1u, 2u, 15u, 16u, 17u, 31u, 33u, 255u, 256u, 257u, 1000u, 4099u, 32000u}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      if (variant == 1)  // ties: few distinct values
        for (float& v : x) v = std::round(v);
      if (variant == 2 && n > 1)  // NaN and -inf entries (never chosen; e^ = 0)
        for (std::size_t i = 0; i < n; i += 3) x[i] = (i / 3) % 2 ? nan : ninf;
      INFO("n " << n << " variant " << variant);
      double m = -std::numeric_limits<double>::infinity();
      for (float v : x)
        if (v == v) m = std::max(m, static_cast<double>(v));
      double sum = 0.0;
      for (float v : x)
        if (v == v) sum += std::exp(static_cast<double>(v) - m);
      const double lse = m + std::log(sum);
      REQUIRE(search::detail::log_sum_exp(x, "t") == Approx(lse).epsilon(1e-7).margin(1e-7));
      REQUIRE(search::detail::log_sum_exp<simd::scalar>(x, "t") == Approx(lse).epsilon(1e-12).margin(1e-12));

      std::vector<search::detail::row_entry> all;
      for (std::size_t i = 0; i < n; ++i)
        if (x[i] > ninf) all.push_back({x[i], static_cast<std::int32_t>(i)});
      std::sort(all.begin(), all.end(), search::detail::better_entry);
      std::vector<search::detail::row_entry> got, got_scalar;
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{32}, n, n + 3}) {
        search::detail::top_entries(x, k, got);
        search::detail::top_entries<simd::scalar>(x, k, got_scalar);
        const std::size_t want = std::min(k, all.size());
        auto indices = [](const std::vector<search::detail::row_entry>& e, std::size_t count) {
          std::vector<std::int32_t> out;
          for (std::size_t i = 0; i < std::min(count, e.size()); ++i) out.push_back(e[i].index);
          return out;
        };
        REQUIRE(got.size() == want);
        REQUIRE(indices(got, want) == indices(all, want));
        REQUIRE(indices(got_scalar, want + 1) == indices(all, want));
        for (std::size_t i = 0; i < want; ++i)
          if (got[i].value != x[static_cast<std::size_t>(got[i].index)]) FAIL("entry " << i << " has the wrong value");
      }
    }
  }
  const std::vector<float> with_inf{0.0f, std::numeric_limits<float>::infinity(), 1.0f};
  REQUIRE_THROWS_WITH(search::detail::log_sum_exp(with_inf, "beam_search"), "beam_search: a logit is +inf");
  std::vector<float> empty_row(40, ninf);
  empty_row[17] = nan;
  REQUIRE_THROWS_WITH(search::detail::log_sum_exp(empty_row, "beam_search"),
                      "beam_search: every logit is -inf or NaN (vocab 40)");
  std::vector<search::detail::row_entry> none;
  search::detail::top_entries(empty_row, 4, none);
  REQUIRE(none.empty());
}

// ---------------------------------------------------------------- drafters

TEST_CASE("ngram_drafter: proposes what followed the most recent earlier match of the longest suffix") {
  const ngram_drafter d{.max_ngram = 3, .min_ngram = 1};
  draft out;
  const std::vector<std::int32_t> h{1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3};
  d.propose({.history = h, .max_tokens = 3}, out);
  REQUIRE(out.tokens == std::vector<std::int32_t>{5, 6, 7});  // "2 3" most recently followed by 5 6 7
  REQUIRE(out.probs.empty());
  d.propose({.history = h, .max_tokens = 10}, out);
  REQUIRE(out.tokens == std::vector<std::int32_t>{5, 6, 7, 2, 3});  // clipped at the end of the history
  const std::vector<std::int32_t> h2{1, 2, 3, 8, 1, 2, 3};
  d.propose({.history = h2, .max_tokens = 2}, out);
  REQUIRE(out.tokens == std::vector<std::int32_t>{8, 1});
  const std::vector<std::int32_t> h3{1, 2, 3, 4};
  d.propose({.history = h3, .max_tokens = 2}, out);
  REQUIRE(out.tokens.empty());
  d.propose({.history = h, .max_tokens = 0}, out);
  REQUIRE(out.tokens.empty());
  const std::vector<std::int32_t> one{1};
  d.propose({.history = one, .max_tokens = 2}, out);
  REQUIRE(out.tokens.empty());
  REQUIRE_THROWS_WITH((ngram_drafter{.max_ngram = 1, .min_ngram = 2}.validate()),
                      "ngram_drafter: max_ngram = 1 is below min_ngram = 2");
  REQUIRE_THROWS_WITH((ngram_drafter{.min_ngram = 0}.validate()), "ngram_drafter: min_ngram must be >= 1, got 0");
}

TEST_CASE("model_drafter: greedy guesses continue the draft model's arg-max and roll back on disagreement") {
  toy_lm draft_model(7, 123);
  auto draft_cache = make_paged();
  {
    model_drafter d(draft_model, draft_cache);
    draft out;
    std::vector<std::int32_t> h{1, 2, 3};
    d.propose({.history = h, .max_tokens = 4}, out);
    REQUIRE(out.tokens == oracle_greedy(draft_model, h, 4));
    REQUIRE(draft_cache.n_sequences() == 1);
    // The target rejected guess 2: history = h + guesses[0..1] + a correction.
    h.insert(h.end(), out.tokens.begin(), out.tokens.begin() + 2);
    h.push_back((out.tokens[2] + 1) % 7);
    d.propose({.history = h, .max_tokens = 3}, out);
    REQUIRE(out.tokens == oracle_greedy(draft_model, h, 3));
    d.reset();
    require_pool_full(draft_cache);
    d.propose({.history = h, .max_tokens = 2}, out);
  }
  require_pool_full(draft_cache);  // the destructor frees the sequence
}

// ---------------------------------------------------------------- speculative

TEST_CASE("speculative: greedy verification equals plain greedy token for token, every drafter and k") {
  toy_lm target(8, 5, 1.0);
  toy_lm other(8, 6, 1.0);  // a different model: many rejections
  auto cache = make_paged();
  auto draft_cache = make_paged();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<std::int32_t> prompt(1 + static_cast<std::size_t>(trial) * 3);
    for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % 8);
    const auto plain = generate(target, cache, prompt, sampling::processor_chain<>{}, sampling::greedy{},
                                {.stop = {.max_new_tokens = 30}});
    for (std::size_t k : {0u, 1u, 3u, 8u}) {
      for (bool adaptive : {false, true}) {
        const speculative_options opt{.stop = {.max_new_tokens = 30}, .draft_length = k, .adaptive = adaptive};
        ngram_drafter ngram;
        model_drafter self(target, draft_cache, sampling::processor_chain<>{}, "self");
        model_drafter diff(other, draft_cache, sampling::processor_chain<>{}, "other");
        const std::size_t passes_before = target.n_forward_passes();
        const auto a = speculative_generate(target, cache, ngram, prompt, opt);
        REQUIRE(target.n_forward_passes() - passes_before == a.stats.n_rounds);
        const auto b = speculative_generate(target, cache, self, prompt, opt);
        const auto c = speculative_generate(target, cache, diff, prompt, opt);
        INFO("trial " << trial << " k " << k << " adaptive " << adaptive);
        REQUIRE(a.tokens == plain.tokens);
        REQUIRE(b.tokens == plain.tokens);
        REQUIRE(c.tokens == plain.tokens);
        if (k > 0 && !adaptive) {
          REQUIRE(b.stats.acceptance_rate() == 1.0);  // the target drafting itself is always right
          REQUIRE(b.stats.n_rounds == (30 + k) / (k + 1));
        }
        REQUIRE(c.stats.n_accepted < c.stats.n_drafted + (k == 0 ? 1u : 0u));
        REQUIRE(a.stats.n_generated == 30);
        for (const auto* st : {&a.stats, &b.stats, &c.stats}) {  // every round counted once, by its guesses
          std::size_t rounds = 0, guesses = 0;
          for (std::size_t j = 0; j < st->rounds_by_draft_length.size(); ++j) {
            rounds += st->rounds_by_draft_length[j];
            guesses += j * st->rounds_by_draft_length[j];
          }
          REQUIRE(rounds == st->n_rounds);
          REQUIRE(guesses == st->n_drafted);
          REQUIRE(st->rounds_by_draft_length.size() <= k + 1);
        }
        if (k > 0 && !adaptive) {  // self-draft: k guesses except in the last round (budget)
          REQUIRE(b.stats.rounds_by_draft_length[k] >= b.stats.n_rounds - 1);
          REQUIRE(b.stats.expected_tokens_per_pass_as_drafted() == Approx(b.stats.tokens_per_target_pass()));
        }
        require_pool_full(cache);
        require_pool_full(draft_cache);
      }
    }
  }
}

TEST_CASE("speculative: EOS and stop sequences inside an accepted run end the output there") {
  toy_lm target(6, 21);
  auto cache = make_paged();
  auto draft_cache = make_paged();
  const std::vector<std::int32_t> prompt{2};
  const auto g = oracle_greedy(target, prompt, 20);
  model_drafter self(target, draft_cache);
  const auto r = speculative_generate(target, cache, self, prompt,
                                      {.stop = {.max_new_tokens = 20, .eos_tokens = {g[4]}}, .draft_length = 6});
  const auto first = std::find(g.begin(), g.end(), g[4]) - g.begin();
  REQUIRE(r.reason == finish_reason::eos);
  REQUIRE(r.tokens == std::vector<std::int32_t>(g.begin(), g.begin() + first + 1));
  std::vector<std::int32_t> streamed;
  const auto c = speculative_generate(target, cache, self, prompt, {.stop = {.max_new_tokens = 20}, .draft_length = 6},
                                      sampling::processor_chain<>{}, [&](std::int32_t t) {
                                        streamed.push_back(t);
                                        return streamed.size() < 5;
                                      });
  REQUIRE(c.reason == finish_reason::cancelled);
  REQUIRE(c.tokens == std::vector<std::int32_t>(g.begin(), g.begin() + 5));
  REQUIRE(streamed == c.tokens);
  require_pool_full(cache);
  require_pool_full(draft_cache);
}

namespace {
/// Runs n stochastic speculative requests of L tokens and returns the
/// chi-square p-value of the sequence histogram against the exact target
/// distribution after top_k(3) and temperature 0.8.
template <class Drafter>
double speculative_chi_square(toy_lm& target, Drafter& d, std::size_t n, std::size_t k, speculative_stats& total) {
  constexpr std::size_t V = 4, L = 3;
  auto cache = make_paged();
  const std::vector<std::int32_t> prompt{1, 2, 1};
  const sampling::processor_chain chain{sampling::top_k{3}, sampling::temperature{0.8f}};
  std::vector<std::size_t> counts(V * V * V, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = speculative_generate(target, cache, d, prompt,
                                        {.stop = {.max_new_tokens = L}, .verify = verification::stochastic,
                                         .draft_length = k, .seed = 2024, .request_id = i},
                                        chain);
    REQUIRE(r.tokens.size() == L);
    ++counts[static_cast<std::size_t>((r.tokens[0] * 4 + r.tokens[1]) * 4 + r.tokens[2])];
    total.n_drafted += r.stats.n_drafted;
    total.n_accepted += r.stats.n_accepted;
    total.n_rejected += r.stats.n_rejected;
    total.n_rounds += r.stats.n_rounds;
    total.n_generated += r.stats.n_generated;
  }
  require_pool_full(cache);
  // Exact: product of the processed conditionals.
  auto processed = [&](std::span<const std::int32_t> ctx) {
    const auto l = target.logits(ctx);
    std::vector<std::size_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return l[a] > l[b]; });
    std::vector<double> p(V, 0.0);
    double z = 0;
    for (int j = 0; j < 3; ++j) z += p[idx[j]] = std::exp((static_cast<double>(l[idx[j]]) - l[idx[0]]) / 0.8);
    for (double& x : p) x /= z;
    return p;
  };
  std::vector<double> expected(V * V * V, 0.0);
  for (std::size_t a = 0; a < V; ++a)
    for (std::size_t b = 0; b < V; ++b)
      for (std::size_t c = 0; c < V; ++c) {
        std::vector<std::int32_t> ctx = prompt;
        double p = processed(ctx)[a];
        ctx.push_back(static_cast<std::int32_t>(a));
        p *= processed(ctx)[b];
        ctx.push_back(static_cast<std::int32_t>(b));
        p *= processed(ctx)[c];
        expected[(a * 4 + b) * 4 + c] = p;
      }
  return search_reference::chi_square_p_value(counts, expected, n);
}
}  // namespace

TEST_CASE("speculative: stochastic verification reproduces the target's distribution (chi-square, p > 1e-6)") {
  // 64 sequences of 3 tokens, 12000 requests per drafter; the test fails only
  // when p < 1e-6, so a correct implementation fails with probability 1e-6.
  toy_lm target(4, 7, 1.2);
  toy_lm other(4, 8, 1.2);
  auto draft_cache = make_paged();
  SECTION("draft model with its own distribution (q != p), k = 2") {
    model_drafter d(other, draft_cache, sampling::processor_chain{sampling::temperature{1.3f}});
    speculative_stats s;
    REQUIRE(speculative_chi_square(target, d, 12000, 2, s) > 1e-6);
    REQUIRE(s.n_drafted > 0);
    REQUIRE(s.n_accepted > 0);
    REQUIRE(s.n_accepted < s.n_drafted);
  }
  SECTION("deterministic n-gram guesses (q one-hot), k = 4") {
    ngram_drafter d;
    speculative_stats s;
    REQUIRE(speculative_chi_square(target, d, 12000, 4, s) > 1e-6);
    REQUIRE(s.n_drafted > 0);
    REQUIRE(s.n_accepted > 0);
  }
  SECTION("the target drafting itself through the same chain accepts every guess") {
    model_drafter d(target, draft_cache, sampling::processor_chain{sampling::top_k{3}, sampling::temperature{0.8f}});
    speculative_stats s;
    REQUIRE(speculative_chi_square(target, d, 3000, 3, s) > 1e-6);
    REQUIRE(s.n_accepted == s.n_drafted);
  }
  require_pool_full(draft_cache);
}

TEST_CASE("speculative: the acceptance of a drafter matches the expected min(p, q) overlap") {
  // One-token requests with k = 1 from a fixed prompt: P(accept) = sum_x min(p(x), q(x)).
  toy_lm target(5, 31, 1.0), other(5, 32, 1.0);
  auto cache = make_paged();
  auto draft_cache = make_paged();
  model_drafter d(other, draft_cache);
  const std::vector<std::int32_t> prompt{3, 0};
  const std::size_t n = 20000;
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = speculative_generate(target, cache, d, prompt,
                                        {.stop = {.max_new_tokens = 2}, .verify = verification::stochastic,
                                         .draft_length = 1, .seed = 5, .request_id = i});
    accepted += r.stats.n_accepted;
  }
  const auto p = target.probs(prompt), q = other.probs(prompt);
  double overlap = 0;
  for (std::size_t x = 0; x < 5; ++x) overlap += std::min(p[x], q[x]);
  // Binomial: 6 standard deviations (two-sided false-failure ~2e-9).
  const double sd = std::sqrt(overlap * (1 - overlap) / n);
  REQUIRE(std::fabs(static_cast<double>(accepted) / n - overlap) < 6 * sd);
  require_pool_full(cache);
  require_pool_full(draft_cache);
}

TEST_CASE("speculative: helpers and bad input") {
  REQUIRE(expected_tokens_per_pass(0.0, 4) == 1.0);
  REQUIRE(expected_tokens_per_pass(1.0, 4) == 5.0);
  REQUIRE(expected_tokens_per_pass(0.5, 2) == Approx(1.75));
  speculative_stats st{.n_rounds = 3, .n_drafted = 4, .n_accepted = 2, .n_rejected = 2, .n_generated = 5,
                       .rounds_by_draft_length = {1, 0, 2}};
  REQUIRE(st.expected_tokens_per_pass_as_drafted() == Approx((1.0 + 2 * 1.75) / 3));
  speculative_stats sum;
  sum += st;
  sum += speculative_stats{.n_rounds = 1, .n_drafted = 3, .n_accepted = 3, .n_generated = 4,
                           .rounds_by_draft_length = {0, 0, 0, 1}};
  REQUIRE(sum.n_rounds == 4);
  REQUIRE(sum.n_generated == 9);
  REQUIRE(sum.acceptance_rate() == Approx(5.0 / 7.0));
  REQUIRE(sum.rounds_by_draft_length == std::vector<std::size_t>{1, 0, 2, 1});
  REQUIRE(speculative_stats{}.expected_tokens_per_pass_as_drafted() == 0.0);
  toy_lm m(5, 1);
  auto cache = make_paged();
  ngram_drafter d;
  const std::vector<std::int32_t> empty, ok{1, 2};
  REQUIRE_THROWS_WITH(speculative_generate(m, cache, d, empty, {}), Catch::Contains("speculative_generate: prompt is empty"));
  REQUIRE_THROWS_WITH(speculative_generate(m, cache, d, ok, {.stop = {.max_new_tokens = 0}}),
                      "speculative_generate: max_new_tokens must be > 0, got 0");
  REQUIRE_THROWS_WITH(speculative_generate(m, cache, d, ok, {.adaptive = true, .adaptive_min_gain = 0.0}),
                      "speculative_generate: adaptive_min_gain must be in (0, 1], got 0");
  struct liar {
    std::int32_t token;
    std::size_t extra;
    std::string_view name() const { return "liar"; }
    void reset() {}
    void propose(const draft_request& r, draft& out) const {
      out.clear();
      out.tokens.assign(r.max_tokens + extra, token);
    }
  };
  liar too_many{1, 1}, outside{7, 0};
  REQUIRE_THROWS_WITH(speculative_generate(m, cache, too_many, ok, {}),
                      "speculative_generate: drafter 'liar' proposed 5 tokens, more than the 4 asked for");
  REQUIRE_THROWS_WITH(speculative_generate(m, cache, outside, ok, {}),
                      "speculative_generate: drafter 'liar' proposed token 7 outside the vocabulary of 5");
  require_pool_full(cache);
}
