// SPDX-License-Identifier: MIT
// llmkit-speculative: speculative decoding measured against plain decoding
// in the same run, for several drafters and draft lengths k.
//
//   llmkit-speculative [--synthetic | --stories | --model PATH] [--prompt TEXT]... [--tokens N]
//                      [--k 1,2,...] [--drafters int8,ngram,layers2] [--verify greedy|stochastic]
//                      [--target-weights f32|f16|q8_0|native] [--clock cpu|wall]
//                      [--adaptive] [--threads N] [--json]
//
// With no arguments it runs the synthetic ~100M model (its f32 target reads
// 400 MB of weights per step, so a step is worth saving) against its own
// int8 copy (k = 2, 3, 4): the int8 drafter agrees with the target on most
// tokens and costs a fraction of a step, which is where speculation wins.
// On the vendored stories260K (--stories) a step is so cheap that no
// drafter pays for itself, and a random model gives prompt lookup (ngram)
// nothing to find.
//
// Drafters: `ngram` (prompt lookup, no model), `layersN` (the target's first
// N layers), `int8` (the target itself with its weight matrices stored as
// Q8_0 and multiplied as int8 by int8-quantised activations:
// llama_options{.weight_type = q8_0, .activations = q8_0}), and
// `int8-layersN` (both). The target keeps the weights as --target-weights
// (f32 by default).
// With --json, one JSON object per line and (drafter, k): drafter, k,
// acceptance_rate, tokens_per_target_pass, theoretical_tokens_per_pass =
// (1 - a^(k+1)) / (1 - a) (and _as_drafted: the same averaged over the
// rounds with the guesses each really had, fewer than k near the token
// budget or when the n-gram drafter finds no match), speedup (time over plain decoding of the same
// prompts in the same run), and the costs that explain it: verify_cost (a
// target pass over the k + 1 rows / a plain decode step), draft_cost (a
// draft forward / a plain decode step) and predicted_speedup = tokens per
// pass / (draft forwards per round x draft_cost + verify_cost).
// --clock cpu (the default) times by process CPU time, which a loaded
// machine disturbs less than wall time (use it with --threads 1). One
// thread is the default: on two, the f32 target's plain step reads at twice
// the bandwidth while the compute-bound int8 draft and the multi-row verify
// gain less, so the speed-up is smaller there and swings with the load.
// Greedy runs also check that the output equals plain greedy decoding token
// for token.
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

#include "example_cli.hpp"
#include "example_model.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <ctime>
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

/// Seconds of process CPU time (cpu) or of the steady clock (wall).
double now_seconds(bool cpu) {
  if (cpu) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
}

/// The reference Llama timing its forward passes: single-token ones (decode
/// steps) and the others.
struct timed_model {
  model::llama_model* model;
  bool cpu_clock;
  double step_seconds = 0, multi_seconds = 0;
  std::size_t n_steps = 0, n_multi = 0;
  std::size_t vocab_size() const noexcept { return model->vocab_size(); }
  kv::kv_shape kv_shape() const noexcept { return model->kv_shape(); }
  template <executor Exec>
  matrix_view<const float> forward(const model::batch& b, cache_type& cache, Exec& exec) {
    const double t0 = now_seconds(cpu_clock);
    const auto logits = model->forward(b, cache, exec);
    const double dt = now_seconds(cpu_clock) - t0;
    if (b.n_tokens() == 1) {
      step_seconds += dt;
      ++n_steps;
    } else {
      multi_seconds += dt;
      ++n_multi;
    }
    return logits;
  }
  void reset_timers() { step_seconds = multi_seconds = 0, n_steps = n_multi = 0; }
  double mean_pass_seconds() const {
    return n_steps + n_multi ? (step_seconds + multi_seconds) / double(n_steps + n_multi) : 0.0;
  }
  double mean_step_seconds() const { return n_steps ? step_seconds / double(n_steps) : 0.0; }
};

using chain_type = sampling::processor_chain<sampling::top_k, sampling::temperature>;

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
  llmkit_examples::command_line cli{
      "Speculative decoding with llmkit: acceptance, tokens per target pass and speedup per (drafter, k)"};
  cli.show_defaults();
  std::string model_path;  // empty: the synthetic model
  bool synthetic = false, stories = false;
  std::vector<std::string> prompts;
  std::size_t n_tokens = 64;
  std::string k_list = "2,3,4";
  std::string drafter_list = "int8";
  std::string verify = "greedy";
  float temperature = 1.0f;
  std::int64_t top_k = 40;
  bool adaptive = false;
  std::size_t threads = 1;
  bool json = false;
  std::string target_weights = "f32";
  std::string clock_name = "cpu";
  std::uint64_t seed = 1;
  const auto model_option = cli.add_option("--model", model_path, "GGUF model file (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss)");
  const auto stories_flag =
      cli.add_flag("--stories", stories, "the vendored stories260K model (" LLMKIT_DEFAULT_MODEL ")");
  cli.add_flag("--synthetic", synthetic,
               "the synthetic ~100M model (dim 768, 12 layers, vocab 32000, seeded random F16 weights); the default")
      .excludes(model_option)
      .excludes(stories_flag);
  model_option.excludes(stories_flag);
  cli.add_option("--prompt", prompts, "prompt text (repeatable; BOS is prepended); default: 6 story openings");
  cli.add_option("--tokens", n_tokens, "tokens to generate per prompt").count_at_least(1, "nothing to generate");
  cli.add_option("--k", k_list, "draft lengths, comma separated");
  cli.add_option("--drafters", drafter_list, "ngram, layersN, int8 (comma separated)");
  cli.add_option("--verify", verify, "greedy or stochastic").one_of({"greedy", "stochastic"});
  cli.add_option("--temperature", temperature, "stochastic: temperature");
  cli.add_option("--top-k", top_k, "stochastic: top-k (0 = all)");
  cli.add_option("--seed", seed, "stochastic: seed");
  cli.add_option("--target-weights", target_weights, "the target's weight storage: f32, f16, q8_0 or native (the file's)")
      .one_of({"f32", "f16", "q8_0", "native"});
  cli.add_option("--clock", clock_name, "cpu (process CPU time) or wall").one_of({"cpu", "wall"});
  cli.add_flag("--adaptive", adaptive, "also run the adaptive draft length (k = the maximum)");
  cli.add_option("--threads", threads, "threads").count_at_least(1, "the forward pass needs a thread");
  cli.add_flag("--json", json, "one JSON object per line and (drafter, k)");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  if (stories) model_path = LLMKIT_DEFAULT_MODEL;
  synthetic = model_path.empty();
  if (prompts.empty())
    prompts = {"Once upon a time",
               "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
               "The cat sat on the mat. The cat was happy. The dog",
               "One day, a little boy named Tim",
               "Ben had a toy car. He liked his toy car. One day his toy car",
               "The bird flew to the tree. The bird sang a song. The bird"};

  try {
    const auto source = llmkit_examples::open_example_model(synthetic, model_path);
    const auto& file = source.file;
    model_path = source.name;
    const auto tok = model::tokenizer::from_gguf(*file);
    const auto weights_of = [](const std::string& name) {
      return name == "f32" ? model::weight_type::f32 : name == "f16" ? model::weight_type::f16
           : name == "q8_0" ? model::weight_type::q8_0 : model::weight_type::native;
    };
    const bool cpu_clock = clock_name == "cpu";
    model::llama_model target(*file, {.weight_type = weights_of(target_weights)});
    thread_pool pool(threads);
    timed_model tgt{&target, cpu_clock};
    const auto& c = target.config();
    std::cerr << "llmkit-speculative: " << model_path << " (dim " << c.dim << ", " << c.n_layers << " layers, vocab "
              << c.n_vocab << "), arch " << simd::arch_name<simd::default_arch>() << ", " << threads
              << " thread(s), verify " << verify << ", target weights " << target_weights << " ("
              << target.weight_bytes_per_step() / 1e6 << " MB per pass), " << clock_name << " time\n";

    std::vector<std::vector<token_id>> prompt_ids;
    for (const auto& p : prompts) prompt_ids.push_back(tok.encode(p, {.add_bos = true}));
    const std::size_t max_len = [&] {
      std::size_t m = 0;
      for (const auto& p : prompt_ids) m = std::max(m, p.size());
      return m;
    }() + n_tokens + 16;
    const std::size_t n_blocks = (max_len + 15) / 16 * 2 + 4;
    cache_type cache(target.kv_shape(), {.n_blocks = n_blocks, .max_sequences = 4});
    const bool stochastic = verify == "stochastic";
    const chain_type chain{sampling::top_k{stochastic ? top_k : 0}, sampling::temperature{stochastic ? temperature : 1.0f}};
    const llmkit::stop_criteria stop{.max_new_tokens = n_tokens};

    // Plain decoding of every prompt: the baseline (timed twice, the faster run kept).
    std::vector<std::vector<token_id>> plain;
    double plain_seconds = 1e300;
    std::size_t plain_tokens = 0;
    double plain_step = 1e300;
    for (int rep = 0; rep < 2; ++rep) {
      plain.clear();
      plain_tokens = 0;
      tgt.reset_timers();
      const double t0 = now_seconds(cpu_clock);
      for (std::size_t i = 0; i < prompt_ids.size(); ++i) {
        const search::generate_options opt{.stop = stop, .seed = seed, .request_id = i};
        auto r = stochastic ? search::generate(tgt, cache, prompt_ids[i], chain, sampling::categorical{}, opt, {}, pool)
                            : search::generate(tgt, cache, prompt_ids[i], chain, sampling::greedy{}, opt, {}, pool);
        plain_tokens += r.tokens.size();
        plain.push_back(std::move(r.tokens));
      }
      plain_seconds = std::min(plain_seconds, now_seconds(cpu_clock) - t0);
      plain_step = std::min(plain_step, tgt.mean_step_seconds());
    }
    const double plain_rate = static_cast<double>(plain_tokens) / plain_seconds;
    if (!json)
      std::cerr << "plain decoding: " << plain_tokens << " tokens in " << plain_seconds << " s (" << plain_rate
                << " tokens/s; a decode step " << plain_step * 1e3 << " ms)\n";

    const auto ks = parse_list(k_list);
    std::vector<std::pair<std::size_t, bool>> runs;
    for (std::size_t k : ks) runs.emplace_back(k, false);
    if (adaptive && !ks.empty()) runs.emplace_back(*std::max_element(ks.begin(), ks.end()), true);

    for (const std::string& name : split(drafter_list)) {
      // Build the drafter: layersN keeps the first N layers (a GGUF image of them), int8 stores the
      // weight matrices as Q8_0; int8-layersN does both.
      std::unique_ptr<model::llama_model> draft_model;
      std::vector<std::byte> draft_bytes;
      const bool int8 = name.rfind("int8", 0) == 0;
      const std::string rest = int8 ? (name.size() > 4 && name[4] == '-' ? name.substr(5) : name.substr(4)) : name;
      if (rest.rfind("layers", 0) == 0) {
        draft_bytes = search::self_draft_gguf(*file, {.n_layers = std::stoul(rest.substr(6))});
      } else if (!(int8 && rest.empty()) && name != "ngram") {
        std::cerr << "error: unknown drafter '" << name << "' (ngram, layersN, int8, int8-layersN)\n";
        return 2;
      }
      const model::llama_options draft_options{
          .weight_type = int8 ? model::weight_type::q8_0 : weights_of(target_weights),
          .activations = int8 ? model::activation_type::q8_0 : model::activation_type::f32};
      if (!draft_bytes.empty())
        draft_model = std::make_unique<model::llama_model>(model::gguf_file(draft_bytes), draft_options);
      else if (int8)
        draft_model = std::make_unique<model::llama_model>(*file, draft_options);
      std::unique_ptr<cache_type> draft_cache;
      if (draft_model)
        draft_cache = std::make_unique<cache_type>(draft_model->kv_shape(),
                                                   kv::paged_cache_options{.n_blocks = n_blocks, .max_sequences = 2});
      timed_model dm{draft_model.get(), cpu_clock};

      for (auto [k, is_adaptive] : runs) {
        search::speculative_stats total;
        std::size_t draft_passes = 0;
        bool matches = true;
        tgt.reset_timers();
        dm.reset_timers();
        const double t0 = now_seconds(cpu_clock);
        for (std::size_t i = 0; i < prompt_ids.size(); ++i) {
          const search::speculative_options opt{
              .stop = stop, .verify = stochastic ? search::verification::stochastic : search::verification::greedy,
              .draft_length = k, .adaptive = is_adaptive, .seed = seed, .request_id = i};
          search::speculative_result r;
          if (draft_model) {
            search::model_drafter<timed_model, cache_type, chain_type, thread_pool> d(dm, *draft_cache, pool, chain, name);
            r = search::speculative_generate(tgt, cache, d, prompt_ids[i], opt, chain, {}, pool);
            draft_passes += d.n_forward_passes();
          } else {
            search::ngram_drafter d;
            r = search::speculative_generate(tgt, cache, d, prompt_ids[i], opt, chain, {}, pool);
          }
          matches = matches && r.tokens == plain[i];
          total += r.stats;
        }
        const double secs = now_seconds(cpu_clock) - t0;
        const double verify_cost = tgt.mean_pass_seconds() / plain_step;
        const double draft_cost = draft_model ? dm.mean_pass_seconds() / plain_step : 0.0;
        const double rounds = static_cast<double>(std::max<std::size_t>(total.n_rounds, 1));
        const double predicted =
            total.tokens_per_target_pass() / (static_cast<double>(draft_passes) / rounds * draft_cost + verify_cost);
        const double a = total.acceptance_rate();
        const double rate = static_cast<double>(total.n_generated) / secs;
        nlohmann::json row{{"model", model_path},
                           {"drafter", name},
                           {"k", k},
                           {"adaptive", is_adaptive},
                           {"verify", verify},
                           {"threads", threads},
                           {"clock", clock_name},
                           {"target_weights", target_weights},
                           {"acceptance_rate", a},
                           {"kept_fraction", total.kept_fraction()},
                           {"tokens_per_target_pass", total.tokens_per_target_pass()},
                           {"theoretical_tokens_per_pass", search::expected_tokens_per_pass(a, k)},
                           {"theoretical_tokens_per_pass_as_drafted", total.expected_tokens_per_pass_as_drafted()},
                           {"mean_draft_length", total.mean_draft_length()},
                           {"speedup", rate / plain_rate},
                           {"tokens_per_s", rate},
                           {"plain_tokens_per_s", plain_rate},
                           {"tokens", total.n_generated},
                           {"target_passes", total.n_rounds},
                           {"draft_forward_passes", draft_passes},
                           {"plain_step_ms", plain_step * 1e3},
                           {"verify_cost", verify_cost},
                           {"draft_cost", draft_cost},
                           {"predicted_speedup", predicted}};
        if (!stochastic) row["matches_plain"] = matches;
        if (json) {
          std::cout << row.dump() << std::endl;
        } else {
          std::cout << std::fixed << std::setprecision(3) << std::setw(10) << name << " k=" << k
                    << (is_adaptive ? " (adaptive)" : "") << "  acceptance " << a << "  tokens/pass "
                    << total.tokens_per_target_pass() << " (theory " << search::expected_tokens_per_pass(a, k)
                    << ")  speedup " << rate / plain_rate << "x (verify " << verify_cost << ", draft "
                    << draft_cost << " steps)"
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
