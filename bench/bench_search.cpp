// SPDX-License-Identifier: MIT
// bench_search: decoding strategies on the vendored stories260K model.
//
// - BM_plain_decode: greedy decoding (the baseline of everything below).
// - BM_speculative/<drafter>/<k>: greedy speculative decoding with the
//   prompt-lookup n-gram drafter (0), the target's first 4 of 5 layers (1)
//   or its int8 copy (2); counters: acceptance alpha, tokens per target pass
//   against (1 - alpha^(k+1)) / (1 - alpha), tokens/s. Speedup = tokens/s
//   over BM_plain_decode's in the same run.
// - BM_beam/<B>/<naive>: beam search with shared paged KV blocks (naive = 0)
//   or copying every beam's dense cache every step (naive = 1); counters:
//   tokens/s (beam tokens), peak KV bytes, memory ratio (bytes in use /
//   distinct tokens' bytes).
// Every rate also appears as GB/s of weights read (one pass reads all
// target weights once; draft-model passes are not counted) and as a fraction of the one-thread read roofline
// (bench/roofline.hpp).
// LLMKIT_BENCH_SMOKE=1 shortens the generations so the smoke run takes seconds.
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/greedy.hpp>
#include <llmkit/search/search.hpp>
#include <llmkit/search/self_draft.hpp>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace llmkit;

namespace {
using paged16 = kv::paged_cache<float, 16>;
using paged4 = kv::paged_cache<float, 4>;

bool smoke() {
  const char* v = std::getenv(LLMKIT_BENCH_SMOKE_ENV);
  return v != nullptr && std::string(v) != "0";
}
std::size_t n_new_tokens() { return smoke() ? 8 : 96; }

struct fixture {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model target{file};
  std::vector<std::byte> layers_bytes = search::self_draft_gguf(file, {.n_layers = 4});
  model::llama_model layers{model::gguf_file(layers_bytes)};
  std::vector<std::byte> int8_bytes = search::self_draft_gguf(file, {.int8_weights = true});
  model::llama_model int8{model::gguf_file(int8_bytes)};
  std::vector<std::vector<std::int32_t>> prompts;
  fixture() {
    for (const char* p : {"Once upon a time", "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
                          "The cat sat on the mat. The cat was happy. The dog", "One day, a little boy named Tim"})
      prompts.push_back(tok.encode(p, true));
  }
};
fixture& fx() {
  static fixture f;
  return f;
}

/// Weight bytes read by `passes` target passes: GB/s and, as a rate, the fraction of the one-thread read roofline.
void weight_counters(benchmark::State& state, double passes) {
  const double bytes = passes * static_cast<double>(fx().target.weight_bytes_per_step());
  state.counters["weights_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["read_roofline_fraction"] =
      benchmark::Counter(bytes / 1e9 / llmkit_bench::roofline::get().read_gbps_1t, benchmark::Counter::kIsRate);
  state.counters["weights_bytes_per_token"] = bytes / static_cast<double>(state.counters["tokens"].value);
}

void BM_plain_decode(benchmark::State& state) {
  auto& f = fx();
  paged16 cache(f.target.kv_shape(), {.n_blocks = 64, .max_sequences = 2});
  std::size_t tokens = 0, passes = 0;
  for (auto _ : state)
    for (const auto& p : f.prompts) {
      const auto r = search::generate(f.target, cache, p, sampling::processor_chain<>{}, sampling::greedy{false},
                                      {.stop = {.max_new_tokens = n_new_tokens()}});
      tokens += r.tokens.size();
      passes += r.n_forward_passes;
    }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  weight_counters(state, static_cast<double>(passes));
}
BENCHMARK(BM_plain_decode)->Unit(benchmark::kMillisecond);

void BM_speculative(benchmark::State& state) {
  auto& f = fx();
  const auto which = state.range(0);
  const auto k = static_cast<std::size_t>(state.range(1));
  paged16 cache(f.target.kv_shape(), {.n_blocks = 64, .max_sequences = 2});
  model::llama_model* draft_model = which == 1 ? &f.layers : which == 2 ? &f.int8 : nullptr;
  std::unique_ptr<paged16> draft_cache;
  if (draft_model)
    draft_cache = std::make_unique<paged16>(draft_model->kv_shape(), kv::paged_cache_options{.n_blocks = 64, .max_sequences = 2});
  search::speculative_stats total;
  for (auto _ : state)
    for (const auto& p : f.prompts) {
      const search::speculative_options opt{.stop = {.max_new_tokens = n_new_tokens()}, .draft_length = k};
      search::speculative_result r;
      if (draft_model) {
        search::model_drafter d(*draft_model, *draft_cache);
        r = search::speculative_generate(f.target, cache, d, p, opt);
      } else {
        search::ngram_drafter d;
        r = search::speculative_generate(f.target, cache, d, p, opt);
      }
      total.n_rounds += r.stats.n_rounds;
      total.n_drafted += r.stats.n_drafted;
      total.n_accepted += r.stats.n_accepted;
      total.n_rejected += r.stats.n_rejected;
      total.n_generated += r.stats.n_generated;
    }
  state.SetLabel(which == 0 ? "ngram" : which == 1 ? "layers4" : "int8");
  state.counters["tokens"] = static_cast<double>(total.n_generated);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(total.n_generated), benchmark::Counter::kIsRate);
  state.counters["acceptance"] = total.acceptance_rate();
  state.counters["tokens_per_pass"] = total.tokens_per_target_pass();
  state.counters["theory_tokens_per_pass"] = search::expected_tokens_per_pass(total.acceptance_rate(), k);
  weight_counters(state, static_cast<double>(total.n_rounds));
}
BENCHMARK(BM_speculative)
    ->ArgsProduct({{0, 1, 2}, {1, 2, 4, 8}})
    ->ArgNames({"drafter", "k"})
    ->Unit(benchmark::kMillisecond);

void BM_beam(benchmark::State& state) {
  auto& f = fx();
  const auto B = static_cast<std::size_t>(state.range(0));
  const bool naive = state.range(1) != 0;
  const auto& prompt = f.prompts[1];
  const std::size_t n_new = smoke() ? 6 : 48;
  const std::size_t max_len = prompt.size() + n_new;
  const search::beam_options opt{.beam_width = B, .stopping = search::early_stopping::never,
                                 .stop = {.max_new_tokens = n_new}, .copy_all_beams = naive};
  search::beam_result r;
  std::size_t tokens = 0;
  for (auto _ : state) {
    if (naive) {
      kv::contiguous_cache<float> cache(f.target.kv_shape(), {.max_sequences = 2 * B + 1, .max_tokens = max_len});
      r = search::beam_search(f.target, cache, prompt, opt);
    } else {
      paged4 cache(f.target.kv_shape(), {.n_blocks = B * (max_len / 4 + 2) + 1, .max_sequences = 2 * B + 1});
      r = search::beam_search(f.target, cache, prompt, opt);
    }
    tokens += r.n_steps * B;
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["beam_tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["peak_kv_KiB"] = static_cast<double>(r.memory.peak_bytes_in_use) / 1024.0;
  state.counters["memory_ratio"] = r.memory.memory_ratio;
  state.counters["distinct_tokens_at_peak"] = static_cast<double>(r.memory.distinct_tokens_at_peak);
  state.counters["tokens_held"] = static_cast<double>(r.memory.peak_tokens_held);
  state.counters["forks"] = static_cast<double>(r.n_forks);
}
BENCHMARK(BM_beam)->ArgsProduct({{1, 4, 16}, {0, 1}})->ArgNames({"B", "naive"})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
