// SPDX-License-Identifier: MIT
// llmkit-beam: beam search on a real model, with beams sharing KV blocks in
// a paged cache, measured against a naive beam search that copies every
// beam's cache every step (a dense cache reordered by beam index).
//
//   llmkit-beam [--model PATH | --synthetic] [--prompt TEXT] [--tokens N] [--beams 1,4,16]
//               [--length-penalty A] [--early-stopping when_n_done|when_no_better|never]
//               [--prompt-tokens N] [--prefilled] [--clock cpu|wall]
//               [--no-naive] [--show N] [--threads N] [--json]
//
// --prefilled computes the prompt's K/V once per cache, outside the timed
// region (as a prefix cache would hold it; beam_options::prefix), so the
// times compare the search steps only. --clock cpu (the default) times by
// process CPU time, which a loaded machine disturbs less than wall time
// (use it with --threads 1).
//
// Per beam width: time, peak KV blocks and bytes, distinct tokens of
// the beam tree, tokens held (what private copies would hold), memory
// ratio (bytes in use / distinct tokens' bytes), the naive baseline's time
// and memory, and the best hypotheses.
#include <llmkit/core/dispatch.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/search/beam_search.hpp>
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
#include <vector>

using namespace llmkit;

namespace {
using dense_type = kv::contiguous_cache<float>;

/// Seconds of process CPU time (cpu) or of the steady clock (wall).
double now_seconds(bool cpu) {
  if (cpu) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Puts the prompt's K/V into a new sequence of `cache` (one packed forward).
template <class Model, class Cache>
kv::seq_id prefill(Model& m, Cache& cache, const std::vector<token_id>& prompt, thread_pool& pool) {
  const auto s = cache.add_sequence();
  LLMKIT_CHECK(s.has_value(), "llmkit-beam: no sequence slot for the prompt");
  model::batch_builder b;
  b.add(*s, prompt, 0);
  m.forward(b.view(), cache, pool);
  return *s;
}
}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"Beam search with shared KV blocks vs a copying baseline"};
  cli.show_defaults();
  std::string model_path = LLMKIT_DEFAULT_MODEL;
  bool synthetic = false;
  std::string prompt = "Once upon a time, there was a little dog named Max. Max liked to";
  std::size_t n_tokens = 32;
  std::vector<std::size_t> beams{1, 4, 16};
  float alpha = 1.0f;
  std::string stopping = "when_no_better";
  bool no_naive = false;
  std::size_t show = 3;
  std::size_t threads = 1;
  bool json = false;
  std::size_t block_size = 16;
  std::size_t prompt_tokens = 0;
  bool prefilled = false;
  std::string clock_name = "cpu";
  cli.add_option("--model", model_path, "GGUF model file (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss)");
  cli.add_flag("--synthetic", synthetic, "use the synthetic ~100M model (seeded random F16 weights)");
  cli.add_option("--prompt", prompt, "prompt text (BOS is prepended)");
  cli.add_option("--tokens", n_tokens, "max new tokens").count_at_least(1, "nothing to generate");
  cli.add_option("--beams", beams, "beam widths")
      .delimiter(',')
      .count_at_least(1, "a beam keeps at least one hypothesis");
  cli.add_option("--length-penalty", alpha, "alpha in score = logprob / length^alpha");
  cli.add_option("--early-stopping", stopping, "when_n_done, when_no_better or never")
      .one_of({"when_n_done", "when_no_better", "never"});
  cli.add_option("--block-size", block_size, "paged-cache block size: 4, 8, 16 or 32").one_of({4, 8, 16, 32});
  cli.add_option("--prompt-tokens", prompt_tokens, "repeat the prompt's tokens (after BOS) up to this many tokens");
  cli.add_flag("--prefilled", prefilled, "prefill the prompt once per cache, outside the timed search");
  cli.add_option("--clock", clock_name, "cpu (process CPU time) or wall").one_of({"cpu", "wall"});
  cli.add_flag("--no-naive", no_naive, "skip the copying baseline");
  cli.add_option("--show", show, "hypotheses printed per width");
  cli.add_option("--threads", threads, "threads").count_at_least(1, "the forward pass needs a thread");
  cli.add_flag("--json", json, "one JSON object per line and beam width");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;

  try {
    const auto source = llmkit_examples::open_example_model(synthetic, model_path);
    const auto& file = source.file;
    model_path = source.name;
    const auto tok = model::tokenizer::from_gguf(*file);
    model::llama_model target(*file);
    thread_pool pool(threads);
    auto prompt_ids = tok.encode(prompt, {.add_bos = true});
    for (std::size_t i = 1; prompt_ids.size() > 1 && prompt_ids.size() < prompt_tokens; ++i)
      prompt_ids.push_back(prompt_ids[i]);
    const bool cpu_clock = clock_name == "cpu";
    const std::size_t max_len = prompt_ids.size() + n_tokens;
    const search::early_stopping mode = stopping == "when_n_done"      ? search::early_stopping::when_n_done
                                        : stopping == "never"          ? search::early_stopping::never
                                                                       : search::early_stopping::when_no_better;
    std::cerr << "llmkit-beam: " << model_path << ", arch " << simd::arch_name<simd::default_arch>() << ", "
              << threads << " thread(s), prompt " << prompt_ids.size() << " tokens, up to " << n_tokens
              << " new, block size " << block_size << (prefilled ? ", prompt prefilled once" : "") << ", "
              << clock_name << " time\n";

    dispatch<std::size_t{4}, std::size_t{8}, std::size_t{16}, std::size_t{32}>(block_size, [&](auto bs) {
    constexpr std::size_t block = decltype(bs)::value;
    using paged_type = kv::paged_cache<float, block>;
    for (std::size_t B : beams) {
      const search::beam_options opt{.beam_width = B, .n_best = std::min(B, std::max<std::size_t>(show, 1)),
                                     .length_penalty = alpha, .stopping = mode,
                                     .stop = {.max_new_tokens = n_tokens, .eos_tokens = {tok.eos()}}};
      // Enough blocks for B private copies, so the pool never limits the search.
      paged_type shared(target.kv_shape(), {.n_blocks = (B + 1) * ((max_len + block - 1) / block + 1) + 1,
                                            .max_sequences = 2 * B + 2});
      search::beam_options shared_opt = opt;
      if (prefilled) shared_opt.prefix = prefill(target, shared, prompt_ids, pool);
      double t0 = now_seconds(cpu_clock);
      const auto r = search::beam_search(target, shared, prompt_ids, shared_opt, {}, pool);
      const double secs = now_seconds(cpu_clock) - t0;

      nlohmann::json row{{"model", model_path},
                         {"beams", B},
                         {"seconds", secs},
                         {"clock", clock_name},
                         {"prefilled", prefilled},
                         {"prompt_tokens", prompt_ids.size()},
                         {"steps", r.n_steps},
                         {"forks", r.n_forks},
                         {"peak_blocks", r.memory.peak_blocks_in_use},
                         {"block_size", block_size},
                         {"peak_kv_bytes", r.memory.peak_bytes_in_use},
                         {"peak_distinct_tokens", r.memory.peak_distinct_tokens},
                         {"distinct_tokens_at_peak", r.memory.distinct_tokens_at_peak},
                         {"peak_tokens_held", r.memory.peak_tokens_held},
                         {"memory_ratio", r.memory.memory_ratio}};
      if (!no_naive) {
        dense_type copying(target.kv_shape(), {.max_sequences = 2 * B + 2, .max_tokens = max_len});
        search::beam_options naive = opt;
        naive.copy_all_beams = true;
        if (prefilled) naive.prefix = prefill(target, copying, prompt_ids, pool);
        t0 = now_seconds(cpu_clock);
        const auto n = search::beam_search(target, copying, prompt_ids, naive, {}, pool);
        const double naive_secs = now_seconds(cpu_clock) - t0;
        bool same = n.hypotheses.size() == r.hypotheses.size();
        for (std::size_t i = 0; same && i < n.hypotheses.size(); ++i) same = n.hypotheses[i].tokens == r.hypotheses[i].tokens;
        row["naive_seconds"] = naive_secs;
        row["speedup_vs_naive"] = naive_secs / secs;
        row["naive_peak_kv_bytes"] = n.memory.peak_bytes_in_use;
        row["naive_memory_ratio"] = n.memory.memory_ratio;
        row["same_hypotheses"] = same;
      }
      nlohmann::json hyps = nlohmann::json::array();
      for (const auto& h : r.hypotheses)
        hyps.push_back({{"text", tok.decode(h.tokens)}, {"score", h.score}, {"logprob", h.logprob},
                        {"finish", llmkit::finish_reason_name(h.reason)}});
      row["hypotheses"] = hyps;
      if (json) {
        std::cout << row.dump() << std::endl;
        continue;
      }
      std::cout << std::fixed << std::setprecision(3) << "B=" << B << ": " << secs << " s, " << r.n_steps
                << " steps, peak " << r.memory.peak_blocks_in_use << " blocks (" << r.memory.peak_bytes_in_use / 1024
                << " KiB) for " << r.memory.distinct_tokens_at_peak << " distinct tokens (ratio "
                << r.memory.memory_ratio << "), " << r.memory.peak_tokens_held << " tokens held";
      if (!no_naive)
        std::cout << "; naive copying: " << row["naive_seconds"].get<double>() << " s ("
                  << row["speedup_vs_naive"].get<double>() << "x slower), "
                  << row["naive_peak_kv_bytes"].get<std::size_t>() / 1024 << " KiB"
                  << (row["same_hypotheses"].get<bool>() ? "" : " [DIFFERENT hypotheses]");
      std::cout << "\n";
      for (const auto& h : r.hypotheses)
        std::cout << "   " << std::setw(8) << h.score << "  " << tok.decode(h.tokens) << "\n";
    }
    }, "--block-size");
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
