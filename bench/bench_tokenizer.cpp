// SPDX-License-Identifier: MIT
// bench_tokenizer: encoding speed of both tokenizer algorithms
// (model/tokenizer.hpp) on ~1 MB of text.
//
//   encode/sentencepiece/stories260K   SentencePiece BPE, 512-token vocabulary
//   encode/bpe/llama3                  byte-level BPE, Llama 3's 128256 tokens
//                                      and 280147 merges (tests/data fixture)
//
// The text is the oracle corpus tests/data/llama3-bpe-corpus.jsonl (English,
// code, numbers, CJK, Arabic, Devanagari, Cyrillic, Greek, emoji, white
// space runs), its strings joined by newlines and repeated up to 1 MiB
// (64 KiB under LLMKIT_BENCH_SMOKE=1). One `encode` call per iteration, so
// the per-call word cache starts empty each time. Counters: `tokens` (/s)
// and bytes/s of input text.
#include <benchmark/benchmark.h>

#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <fstream>
#include <stdexcept>
#include <string>

#include "roofline.hpp"

namespace {

using namespace llmkit;

// The corpus strings (\n, \r, \t, \" and \\ unescaped; \uXXXX kept as
// written), joined by newlines and repeated to `bytes`.
std::string bench_text(std::size_t bytes) {
  std::ifstream in(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/llama3-bpe-corpus.jsonl");
  std::string corpus;
  for (std::string line; std::getline(in, line);) {
    const auto begin = line.find("{\"text\":\"");
    const auto end = line.find("\",\"ids\":[");
    if (begin != 0 || end == std::string::npos) continue;
    for (std::size_t at = 9; at < end; ++at) {
      if (line[at] != '\\' || at + 1 == end) {
        corpus += line[at];
        continue;
      }
      const char e = line[++at];
      corpus += e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
    }
    corpus += '\n';
  }
  if (corpus.empty()) throw std::runtime_error("bench_tokenizer: tests/data/llama3-bpe-corpus.jsonl not found");
  std::string text;
  while (text.size() < bytes) text += corpus;
  text.resize(bytes);
  return text;
}

const std::string& text() {
  static const std::string t = bench_text(llmkit_bench::smoke() ? (64u << 10) : (1u << 20));
  return t;
}

void bm_encode(benchmark::State& state, const std::string& path) {
  const auto tok = model::tokenizer::from_gguf(model::gguf_file::open(path));
  const std::string& t = text();
  std::size_t n_tokens = 0;
  for (auto _ : state) {
    const auto ids = tok.encode(t);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * t.size()));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(n_tokens * state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.counters["tokens_per_call"] = static_cast<double>(n_tokens);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("encode/sentencepiece/stories260K",
                               [](benchmark::State& s) { bm_encode(s, LLMKIT_DEFAULT_MODEL); })
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("encode/bpe/llama3", [](benchmark::State& s) {
    bm_encode(s, std::string(LLMKIT_SOURCE_DIR) + "/tests/data/llama3-bpe-vocab.gguf");
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("encode/bpe/o200k", [](benchmark::State& s) {
    bm_encode(s, std::string(LLMKIT_SOURCE_DIR) + "/tests/data/o200k-vocab.gguf");
  })->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
