// SPDX-License-Identifier: MIT
// llmkit/eval: perplexity as llama-perplexity computes it, against a
// double-precision oracle on stories260K; the logit base file (llama.cpp's
// KL-divergence base) and the comparison of a run with a base.
#include <llmkit/core/executor.hpp>
#include <llmkit/eval/logit_base.hpp>
#include <llmkit/eval/perplexity.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>

#include "reference/model_reference.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace llmkit;
using Catch::Matchers::Contains;

namespace {

std::string story() {
  std::ifstream in(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/perplexity-story.txt", std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// log(sum exp(x)) - x[i] in long double: the oracle of token_nll.
double nll_oracle(const std::vector<float>& x, std::size_t i) {
  long double m = x[0];
  for (float v : x) m = std::max<long double>(m, v);
  long double s = 0;
  for (float v : x) s += std::exp(static_cast<long double>(v) - m);
  return static_cast<double>(m + std::log(s) - x[i]);
}

std::vector<float> random_logits(std::mt19937& rng, std::size_t n, float spread) {
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct temp_file {
  std::string path;
  explicit temp_file(std::string p) : path(std::move(p)) {}
  ~temp_file() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("eval: running_mean gives the mean and the standard error of the mean") {
  eval::running_mean m;
  CHECK(m.mean() == 0.0);
  CHECK(m.standard_error() == 0.0);
  m.add(2.5);
  CHECK(m.mean() == 2.5);
  CHECK(m.standard_error() == 0.0);  // one value: no spread
  std::mt19937 rng(3);
  std::normal_distribution<double> d(1.0, 2.0);
  std::vector<double> v{2.5};
  for (int i = 0; i < 999; ++i) v.push_back(d(rng)), m.add(v.back());
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  // Sample variance over n, divided by n - 1 (llama-perplexity's estimate).
  const double se = std::sqrt(ss / double(v.size()) / double(v.size() - 1));
  CHECK(m.mean() == Approx(mean).epsilon(1e-12));
  CHECK(m.standard_error() == Approx(se).epsilon(1e-9));
  const auto p = eval::perplexity_of(m);
  CHECK(p.value == Approx(std::exp(mean)).epsilon(1e-12));
  CHECK(p.uncertainty == Approx(std::exp(mean) * se).epsilon(1e-9));
}

TEST_CASE("eval: chunking cuts the text as llama-perplexity does and refuses what scores nothing") {
  const auto plan = eval::chunking::of(1000, 128);
  CHECK(plan.n_chunks == 7);
  CHECK(plan.first_scored() == 64);
  CHECK(plan.n_scored() == 63);  // positions 64 .. 126 predict tokens 65 .. 127
  CHECK(eval::chunking::of(1000, 128, 3).n_chunks == 3);
  CHECK(eval::chunking::of(1000, 128, 30).n_chunks == 7);
  const auto odd = eval::chunking::of(20, 5);
  CHECK(odd.first_scored() == 2);
  CHECK(odd.n_scored() == 2);

  REQUIRE_THROWS_WITH(eval::chunking::of(1000, 3), Contains("n_ctx = 3"));
  REQUIRE_THROWS_WITH(eval::chunking::of(255, 128), Contains("255 tokens") && Contains("at least 256"));

  std::vector<token_id> text(20);
  std::iota(text.begin(), text.end(), 100);
  CHECK(odd.chunk_tokens(text, 1, std::nullopt) == std::vector<token_id>{105, 106, 107, 108, 109});
  CHECK(odd.chunk_tokens(text, 2, 1) == std::vector<token_id>{1, 111, 112, 113, 114});
  REQUIRE_THROWS_WITH(odd.chunk_tokens(text, 4, 1), Contains("chunk 4 of 4"));
  REQUIRE_THROWS_WITH(odd.chunk_tokens(std::span<const token_id>(text).first(12), 2, 1), Contains("needs 15"));
}

TEST_CASE("eval: token_nll is -log softmax in double, and refuses tokens outside the vocabulary") {
  std::mt19937 rng(11);
  std::vector<double> scratch;
  for (std::size_t n : {1u, 2u, 17u, 512u, 4099u}) {
    for (float spread : {0.1f, 3.0f, 30.0f}) {
      const auto x = random_logits(rng, n, spread);
      for (std::size_t i : {std::size_t{0}, n / 2, n - 1}) {
        INFO("n " << n << " spread " << spread << " token " << i);
        CHECK(eval::token_nll(x, static_cast<token_id>(i), scratch) == Approx(nll_oracle(x, i)).epsilon(1e-12).margin(1e-12));
      }
    }
  }
  const std::vector<float> x{1.0f, 2.0f, 3.0f};
  REQUIRE_THROWS_WITH(eval::token_nll(x, 3, scratch), Contains("token 3") && Contains("vocabulary of 3"));
  REQUIRE_THROWS_WITH(eval::token_nll(x, -1, scratch), Contains("token -1"));
}

TEST_CASE("eval: perplexity of stories260K over a story equals the double-precision oracle") {
  const auto file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  const auto tok = model::tokenizer::from_gguf(file);
  model::llama_model m(file, {.activations = model::activation_type::f32});
  const reference::llama_reference oracle(file);
  const auto tokens = tok.encode(story(), {.add_bos = tok.add_bos_token()});
  REQUIRE(tokens.size() > 400);
  std::vector<double> scratch;
  for (const std::size_t n_ctx : {64u, 65u, 128u}) {
    INFO("n_ctx " << n_ctx);
    const auto plan = eval::chunking::of(tokens.size(), n_ctx, 3);
    kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = n_ctx});
    thread_pool pool(2);
    model::batch_builder batch;
    eval::running_mean nll;
    double oracle_nll = 0.0;
    std::size_t count = 0;
    for (std::size_t c = 0; c < plan.n_chunks; ++c) {
      const auto ids = plan.chunk_tokens(tokens, c, tok.bos());
      REQUIRE(ids[0] == tok.bos());
      const auto logits = eval::score_chunk(m, cache, pool, plan, ids, batch);
      REQUIRE(logits.rows() == plan.n_scored());
      const auto exact = oracle.logits(ids);
      for (std::size_t i = 0; i < plan.n_scored(); ++i) {
        const std::size_t pos = plan.first_scored() + i;
        nll.add(eval::token_nll(logits.row(i), ids[pos + 1], scratch));
        const auto& row = exact[pos];
        double mx = row[0], s = 0.0;
        for (double v : row) mx = std::max(mx, v);
        for (double v : row) s += std::exp(v - mx);
        oracle_nll += mx + std::log(s) - row[static_cast<std::size_t>(ids[pos + 1])];
        ++count;
      }
    }
    REQUIRE(nll.count == count);
    REQUIRE(cache.n_sequences() == 0);  // every chunk's sequence was freed
    const double oracle_ppl = std::exp(oracle_nll / double(count));
    CHECK(eval::perplexity_of(nll).value == Approx(oracle_ppl).epsilon(1e-4));
    CHECK(eval::perplexity_of(nll).value > 1.0);
  }
}

TEST_CASE("eval: a saved row keeps every log-probability within 16 of the top to half a step") {
  std::mt19937 rng(5);
  std::vector<double> exact;
  for (std::size_t n : {1u, 2u, 3u, 512u, 1001u}) {
    for (float spread : {0.5f, 4.0f, 20.0f}) {
      const auto x = random_logits(rng, n, spread);
      std::vector<std::uint16_t> row(eval::logit_row_width(n));
      eval::encode_logit_row(x, row);
      exact.resize(n);
      search::detail::log_softmax(x, exact, "test");
      const double top = *std::max_element(exact.begin(), exact.end());
      const double step = std::min(16.0, double(*std::max_element(x.begin(), x.end()) -
                                                *std::min_element(x.begin(), x.end()))) / 65535.0;
      for (std::size_t i = 0; i < n; ++i) {
        INFO("n " << n << " spread " << spread << " i " << i);
        const double saved = eval::saved_log_prob(row, i);
        if (exact[i] > top - 16.0 + step)
          CHECK(std::abs(saved - exact[i]) <= step / 2 + 1e-5 * std::max(1.0, std::abs(exact[i])));
        else
          CHECK(saved >= exact[i] - 1e-5 * std::max(1.0, std::abs(exact[i])));  // the floor is above
      }
    }
  }
  std::vector<std::uint16_t> row(eval::logit_row_width(3));
  REQUIRE_THROWS_WITH(eval::encode_logit_row(std::vector<float>{1.0f, NAN, 0.0f}, row), Contains("a logit is nan"));
  REQUIRE_THROWS_WITH(eval::encode_logit_row(std::vector<float>{1.0f, 2.0f}, row), Contains("vocabulary of 2"));
}

TEST_CASE("eval: a base file round-trips and a run compared with its own base gives KL 0 exactly") {
  const temp_file f("test_eval_base.bin");
  const std::size_t n_vocab = 37, n_ctx = 10, n_chunks = 2;
  const eval::chunking plan{n_ctx, n_chunks};
  std::mt19937 rng(9);
  eval::logit_base_header h{n_ctx, n_vocab, n_chunks, {}};
  for (std::size_t i = 0; i < n_ctx * n_chunks; ++i) h.tokens.push_back(static_cast<token_id>(rng() % n_vocab));
  std::vector<std::vector<float>> rows;
  {
    eval::logit_base_writer w(f.path, h);
    for (std::size_t r = 0; r < plan.n_scored() * n_chunks; ++r) {
      rows.push_back(random_logits(rng, n_vocab, 3.0f));
      w.write_row(rows.back());
    }
    w.check(f.path);
    REQUIRE_THROWS_WITH(w.write_row(std::vector<float>(5)), Contains("row of 5 logits"));
  }
  // The file's size is what llama-perplexity writes: header, tokens, rows.
  std::ifstream sz(f.path, std::ios::binary | std::ios::ate);
  CHECK(static_cast<std::size_t>(sz.tellg()) ==
        20 + 4 * n_ctx * n_chunks + 2 * eval::logit_row_width(n_vocab) * plan.n_scored() * n_chunks);

  auto compare = [&](float noise) {
    eval::logit_base_reader r(f.path);
    REQUIRE(r.header().n_ctx == n_ctx);
    REQUIRE(r.header().n_vocab == n_vocab);
    REQUIRE(r.header().n_chunks == n_chunks);
    REQUIRE(r.header().tokens == h.tokens);
    eval::kl_comparison kl;
    std::vector<double> scratch;
    std::mt19937 nrng(1);
    std::normal_distribution<float> d(0.0f, noise);
    for (std::size_t c = 0, k = 0; c < n_chunks; ++c)
      for (std::size_t i = 0; i < plan.n_scored(); ++i, ++k) {
        auto x = rows[k];
        if (noise > 0)
          for (float& v : x) v += d(nrng);
        kl.add(x, r.next_row(), h.tokens[c * n_ctx + plan.first_scored() + i + 1], scratch);
      }
    REQUIRE_THROWS_WITH(r.next_row(), Contains("ends early"));
    return kl;
  };
  const auto same = compare(0.0f);
  CHECK(same.count() == plan.n_scored() * n_chunks);
  CHECK(same.kl.sum == 0.0);
  CHECK(same.kl_quantile(1.0) == 0.0);
  CHECK(same.same_top().value == 1.0);
  CHECK(same.log_ppl_ratio().value == Approx(0.0).margin(1e-4));
  const auto other = compare(1.0f);
  CHECK(other.kl.mean() > 1e-3);  // a perturbed run diverges
  CHECK(other.kl_quantile(0.5) > 0.0);
}

TEST_CASE("eval: a base file that is not one, or is cut short, is refused with its path") {
  const temp_file f("test_eval_bad.bin");
  REQUIRE_THROWS_WITH(eval::logit_base_reader("no/such/file.bin"), Contains("cannot open 'no/such/file.bin'"));
  {
    std::ofstream o(f.path, std::ios::binary);
    o << "GGUF not a base";
  }
  REQUIRE_THROWS_WITH(eval::logit_base_reader(f.path), Contains("is not a logit base"));
  eval::logit_base_header h{8, 5, 2, std::vector<token_id>(16, 1)};
  {
    eval::logit_base_writer w(f.path, h);
    w.write_row(std::vector<float>(5, 0.0f));  // 1 row of the 6 the header promises
  }
  REQUIRE_THROWS_WITH(eval::logit_base_reader(f.path), Contains("bytes; its header") && Contains("n_vocab 5"));
  {
    std::ofstream o(f.path, std::ios::binary);
    o.write("_logits_", 8);
    const std::int32_t v[3] = {2, 5, 1};  // n_ctx 2 scores nothing
    o.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  REQUIRE_THROWS_WITH(eval::logit_base_reader(f.path), Contains("n_ctx 2"));
  REQUIRE_THROWS_WITH(eval::logit_base_writer(f.path, {8, 5, 2, std::vector<token_id>(15, 1)}),
                      Contains("15 tokens for 2 chunks of 8"));
  REQUIRE_THROWS_WITH(eval::logit_base_writer("no/such/dir/x.bin", h), Contains("cannot create"));
}
