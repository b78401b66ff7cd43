// SPDX-License-Identifier: MIT
// llmkit-speculative: speculative decoding measured against plain decoding
// in the same run, for several drafters and draft lengths k.
//
//   llmkit-speculative [--model PATH | --synthetic] [--prompt TEXT]... [--tokens N]
//                      [--k 1,2,...] [--drafters ngram,layers2,int8] [--verify greedy|stochastic]
//                      [--adaptive] [--threads N] [--json]
//
// Drafters: `ngram` (prompt lookup, no model), `layersN` (the target's first
// N layers), `int8` (the target with Q8_0 weights; the reference Llama
// dequantizes them at load, so this draft costs as much as the target).
// With --json, one JSON object per line and (drafter, k): drafter, k,
// acceptance_rate, tokens_per_target_pass, theoretical_tokens_per_pass =
// (1 - a^(k+1)) / (1 - a), speedup (wall clock over plain decoding of the
// same prompts), and more. Greedy runs also check that the output equals
// plain greedy decoding token for token.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/categorical.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/greedy.hpp>
#include <llmkit/sampling/temperature.hpp>
#include <llmkit/sampling/top_k.hpp>
#include <llmkit/search/search.hpp>
#include <llmkit/search/self_draft.hpp>
#include <llmkit/simd/arch.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <variant>
#include <vector>

using namespace llmkit;

namespace {
using cache_type = kv::paged_cache<float, 16>;
using clock_type = std::chrono::steady_clock;

/// The reference Llama running on a thread pool (search strategies call forward(batch, cache)).
struct pooled_model {
  model::llama_model* model;
  thread_pool* pool;
  std::size_t vocab_size() const noexcept { return model->vocab_size(); }
  matrix_view<const float> forward(const model::batch& b, cache_type& cache) { return model->forward(b, cache, *pool); }
};

using chain_type = sampling::processor_chain<sampling::top_k, sampling::temperature>;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::vector<std::size_t> parse_list(const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t comma = text.find(',', start);
    out.push_back(std::stoul(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Speculative decoding with llmkit: acceptance, tokens per target pass and speedup per (drafter, k)"};
  std::string model_path = LLMKIT_DEFAULT_MODEL;
  bool synthetic = false;
  std::vector<std::string> prompts;
  std::size_t n_tokens = 64;
  std::string k_list = "1,2,3,4,5,6,7,8";
  std::string drafter_list = "ngram,layers2,int8";
  std::string verify = "greedy";
  float temperature = 1.0f;
  std::int64_t top_k = 40;
  bool adaptive = false;
  std::size_t threads = 1;
  bool json = false;
  std::uint64_t seed = 1;
  app.add_option("--model", model_path, "GGUF model file (Llama architecture)")->capture_default_str();
  app.add_flag("--synthetic", synthetic, "use the synthetic ~100M model (dim 768, 12 layers, vocab 32000, seeded random F16 weights)");
  app.add_option("--prompt", prompts, "prompt text (repeatable; BOS is prepended); default: 6 story openings");
  app.add_option("--tokens", n_tokens, "tokens to generate per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--k", k_list, "draft lengths, comma separated")->capture_default_str();
  app.add_option("--drafters", drafter_list, "ngram, layersN, int8 (comma separated)")->capture_default_str();
  app.add_option("--verify", verify, "greedy or stochastic")->check(CLI::IsMember({"greedy", "stochastic"}))->capture_default_str();
  app.add_option("--temperature", temperature, "stochastic: temperature")->capture_default_str();
  app.add_option("--top-k", top_k, "stochastic: top-k (0 = all)")->capture_default_str();
  app.add_option("--seed", seed, "stochastic: seed")->capture_default_str();
  app.add_flag("--adaptive", adaptive, "also run the adaptive draft length (k = the maximum)");
  app.add_option("--threads", threads, "threads (>= 1)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--json", json, "one JSON object per line and (drafter, k)");
  CLI11_PARSE(app, argc, argv);
  if (prompts.empty())
    prompts = {"Once upon a time",
               "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
               "The cat sat on the mat. The cat was happy. The dog",
               "One day, a little boy named Tim",
               "Ben had a toy car. He liked his toy car. One day his toy car",
               "The bird flew to the tree. The bird sang a song. The bird"};

  try {
    std::vector<std::byte> synthetic_bytes;
    std::unique_ptr<model::gguf_file> file;
    if (synthetic) {
      synthetic_bytes = model::synthetic_llama({.config = model::synthetic_100m_config(),
                                                .weight_type = model::ggml_type::f16, .seed = 1}).bytes();
      file = std::make_unique<model::gguf_file>(synthetic_bytes);
      model_path = "synthetic-100M";
    } else {
      file = std::make_unique<model::gguf_file>(model::gguf_file::open(model_path));
    }
    const auto tok = model::tokenizer::from_gguf(*file);
    model::llama_model target(*file);
    thread_pool pool(threads);
    pooled_model tgt{&target, &pool};
    const auto& c = target.config();
    std::cerr << "llmkit-speculative: " << model_path << " (dim " << c.dim << ", " << c.n_layers << " layers, vocab "
              << c.n_vocab << "), arch " << simd::arch_name<simd::default_arch>() << ", " << threads
              << " thread(s), verify " << verify << "\n";

    std::vector<std::vector<std::int32_t>> prompt_ids;
    for (const auto& p : prompts) prompt_ids.push_back(tok.encode(p, true));
    const std::size_t max_len = [&] {
      std::size_t m = 0;
      for (const auto& p : prompt_ids) m = std::max(m, p.size());
      return m;
    }() + n_tokens + 16;
    const std::size_t n_blocks = (max_len + 15) / 16 * 2 + 4;
    cache_type cache(target.kv_shape(), {.n_blocks = n_blocks, .max_sequences = 4});
    const bool stochastic = verify == "stochastic";
    const chain_type chain{sampling::top_k{stochastic ? top_k : 0}, sampling::temperature{stochastic ? temperature : 1.0f}};
    const search::stop_criteria stop{.max_new_tokens = n_tokens};

    // Plain decoding of every prompt: the baseline (timed twice, the faster run kept).
    std::vector<std::vector<std::int32_t>> plain;
    double plain_seconds = 1e300;
    std::size_t plain_tokens = 0;
    for (int rep = 0; rep < 2; ++rep) {
      plain.clear();
      plain_tokens = 0;
      const auto t0 = clock_type::now();
      for (std::size_t i = 0; i < prompt_ids.size(); ++i) {
        const search::generate_options opt{.stop = stop, .seed = seed, .request_id = i};
        auto r = stochastic ? search::generate(tgt, cache, prompt_ids[i], chain, sampling::categorical{}, opt)
                            : search::generate(tgt, cache, prompt_ids[i], chain, sampling::greedy{}, opt);
        plain_tokens += r.tokens.size();
        plain.push_back(std::move(r.tokens));
      }
      plain_seconds = std::min(plain_seconds, seconds_since(t0));
    }
    const double plain_rate = static_cast<double>(plain_tokens) / plain_seconds;
    if (!json)
      std::cerr << "plain decoding: " << plain_tokens << " tokens in " << plain_seconds << " s (" << plain_rate
                << " tokens/s)\n";

    const auto ks = parse_list(k_list);
    std::vector<std::pair<std::size_t, bool>> runs;
    for (std::size_t k : ks) runs.emplace_back(k, false);
    if (adaptive && !ks.empty()) runs.emplace_back(*std::max_element(ks.begin(), ks.end()), true);

    for (const std::string& name : split(drafter_list)) {
      // Build the drafter.
      std::unique_ptr<model::llama_model> draft_model;
      std::vector<std::byte> draft_bytes;
      if (name == "int8") {
        draft_bytes = search::self_draft_gguf(*file, {.int8_weights = true});
      } else if (name.rfind("layers", 0) == 0) {
        draft_bytes = search::self_draft_gguf(*file, {.n_layers = std::stoul(name.substr(6))});
      } else if (name != "ngram") {
        std::cerr << "error: unknown drafter '" << name << "' (ngram, layersN, int8)\n";
        return 2;
      }
      std::unique_ptr<cache_type> draft_cache;
      if (!draft_bytes.empty()) {
        draft_model = std::make_unique<model::llama_model>(model::gguf_file(draft_bytes));
        draft_cache = std::make_unique<cache_type>(draft_model->kv_shape(),
                                                   kv::paged_cache_options{.n_blocks = n_blocks, .max_sequences = 2});
      }
      pooled_model dm{draft_model.get(), &pool};

      for (auto [k, is_adaptive] : runs) {
        search::speculative_stats total;
        std::size_t draft_passes = 0;
        bool matches = true;
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < prompt_ids.size(); ++i) {
          const search::speculative_options opt{
              .stop = stop, .verify = stochastic ? search::verification::stochastic : search::verification::greedy,
              .draft_length = k, .adaptive = is_adaptive, .seed = seed, .request_id = i};
          search::speculative_result r;
          if (draft_model) {
            search::model_drafter<pooled_model, cache_type, chain_type> d(dm, *draft_cache, chain, name);
            r = search::speculative_generate(tgt, cache, d, prompt_ids[i], opt, chain);
            draft_passes += d.n_forward_passes();
          } else {
            search::ngram_drafter d;
            r = search::speculative_generate(tgt, cache, d, prompt_ids[i], opt, chain);
          }
          matches = matches && r.tokens == plain[i];
          total.n_rounds += r.stats.n_rounds;
          total.n_drafted += r.stats.n_drafted;
          total.n_accepted += r.stats.n_accepted;
          total.n_rejected += r.stats.n_rejected;
          total.n_generated += r.stats.n_generated;
        }
        const double secs = seconds_since(t0);
        const double a = total.acceptance_rate();
        const double rate = static_cast<double>(total.n_generated) / secs;
        nlohmann::json row{{"model", model_path},
                           {"drafter", name},
                           {"k", k},
                           {"adaptive", is_adaptive},
                           {"verify", verify},
                           {"threads", threads},
                           {"acceptance_rate", a},
                           {"kept_fraction", total.kept_fraction()},
                           {"tokens_per_target_pass", total.tokens_per_target_pass()},
                           {"theoretical_tokens_per_pass", search::expected_tokens_per_pass(a, k)},
                           {"mean_draft_length", total.mean_draft_length()},
                           {"speedup", rate / plain_rate},
                           {"tokens_per_s", rate},
                           {"plain_tokens_per_s", plain_rate},
                           {"tokens", total.n_generated},
                           {"target_passes", total.n_rounds},
                           {"draft_forward_passes", draft_passes}};
        if (!stochastic) row["matches_plain"] = matches;
        if (json) {
          std::cout << row.dump() << std::endl;
        } else {
          std::cout << std::fixed << std::setprecision(3) << std::setw(10) << name << " k=" << k
                    << (is_adaptive ? " (adaptive)" : "") << "  acceptance " << a << "  tokens/pass "
                    << total.tokens_per_target_pass() << " (theory " << search::expected_tokens_per_pass(a, k)
                    << ")  speedup " << rate / plain_rate << "x"
                    << (stochastic ? "" : matches ? "  [= plain]" : "  [DIFFERS from plain]") << std::endl;
        }
        if (!stochastic && !matches) {
          std::cerr << "error: greedy speculative output differs from plain greedy (" << name << ", k " << k << ")\n";
          return 1;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
