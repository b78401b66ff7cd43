// SPDX-License-Identifier: MIT
// bench_serve_beam: beam search of one request on the vendored stories260K,
// run inside the serving engine (generation_request::beam: scheduler steps,
// packed batch, beams forked in a kv::prefix_cache) against the stand-alone
// search::beam_search loop on a kv::paged_cache of the same block size: the
// same prompt, width and budget, so the same forwards and hypotheses.
// - BM_beam_standalone/<B>: search::beam_search (the baseline).
// - BM_beam_engine/<B>: serve::engine, one beam request, run_until_idle.
// Counter beam_tokens_per_s: B tokens per expansion step (early stopping
// off, so every run takes max_new_tokens steps). One thread (the serial
// executor); CPU time of the main thread.
// LLMKIT_BENCH_SMOKE=1 shrinks the generation so the smoke run takes seconds.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/search/beam_search.hpp>
#include <llmkit/serve/serve.hpp>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <cstddef>
#include <vector>

using namespace llmkit;
using llmkit_bench::smoke;

namespace {

struct fixture {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model model{file};
  std::vector<token_id> prompt =
      tok.encode("Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red", {.add_bos = true});
};
fixture& fx() {
  static fixture f;
  return f;
}

std::size_t n_new() { return smoke() ? 6 : 64; }

void report(benchmark::State& state, std::size_t tokens) {
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["beam_tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void BM_beam_standalone(benchmark::State& state) {
  auto& f = fx();
  const auto B = static_cast<std::size_t>(state.range(0));
  kv::paged_cache<float, 16> cache(f.model.kv_shape(), {.n_blocks = 256, .max_sequences = 2 * B + 2});
  const search::beam_options opt{.beam_width = B, .stopping = search::early_stopping::never,
                                 .stop = {.max_new_tokens = n_new()}};
  std::size_t tokens = 0;
  for (auto _ : state) {
    const auto r = search::beam_search(f.model, cache, f.prompt, opt);
    tokens += r.n_steps * B;
    benchmark::DoNotOptimize(r.hypotheses.data());
  }
  report(state, tokens);
}
BENCHMARK(BM_beam_standalone)->Arg(4)->ArgName("B")->Unit(benchmark::kMillisecond);

void BM_beam_engine(benchmark::State& state) {
  auto& f = fx();
  const auto B = static_cast<std::size_t>(state.range(0));
  serial_executor serial;
  // No prefix reuse: every iteration prefills its prompt, as the stand-alone search does.
  kv::prefix_cache<float, 16> cache(f.model.kv_shape(), {.n_blocks = 256});
  serve::engine eng(f.model, cache, serial, {.max_context = 256, .reuse = serve::prefix_reuse::disabled});
  std::size_t tokens = 0, steps = 0;
  for (auto _ : state) {
    const std::uint64_t before = eng.stats().n_steps;
    serve::generation_request r;
    r.prompt = f.prompt;
    r.stop = {.max_new_tokens = n_new()};
    r.beam = serve::beam_options{.width = B, .stopping = search::early_stopping::never};
    if (!eng.submit(std::move(r)).accepted()) state.SkipWithError("the engine refused the beam request");
    eng.run_until_idle();
    steps = eng.stats().n_steps - before;
    tokens += n_new() * B;
  }
  state.counters["forwards"] = static_cast<double>(steps);
  report(state, tokens);
}
BENCHMARK(BM_beam_engine)->Arg(4)->ArgName("B")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
