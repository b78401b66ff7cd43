// SPDX-License-Identifier: MIT
// bench_grammar: grammar-constrained decoding costs on the Llama 3
// vocabulary (128,256 tokens, tests/data fixture), 1 thread.
//
//   vocabulary                 token_vocabulary::from_tokenizer (trie), once per vocabulary
//   compile/<schema>           schema_to_gbnf + parse_gbnf + automaton + element tables
//                              (token_masker) + the first mask; counters table_kib (memory
//                              of the tables), tables, walk_elements (tables whose
//                              positions take the full trie walk), deferred (pairs
//                              left to read on first use), states (automaton)
//   mask/<schema>              grammar_processor::apply on a dense [128256] row, for
//                              every step of a valid document of the schema (its
//                              Llama 3 tokens, then EOS), with a freshly compiled masker
//                              per document (automaton, element tables, empty mask
//                              cache; built outside the timed steps, as compile/
//                              measures it), so each document pays its first visit of
//                              every position: counters median_us, p99_us,
//                              mean_us over the steps, in thread CPU time (the
//                              machine is shared: wall time would count waiting)
//   row_copy                   baseline in the same run: candidates::reset_copy of
//                              the row, what every step pays before any processor
//
// The schemas and documents are kept here so figures stay comparable.
#include <benchmark/benchmark.h>

#include <llmkit/grammar/json_schema.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/candidates.hpp>

#include <algorithm>
#include <ctime>
#include <string>
#include <vector>

#include "grammar_cases.hpp"

namespace {

using namespace llmkit;
using llmkit_bench::bench_case;
using llmkit_bench::grammar_cases;
using llmkit_bench::llama3;
using llmkit_bench::llama3_vocab;

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

void vocabulary(benchmark::State& state) {
  for (auto _ : state) {
    auto v = grammar::token_vocabulary::from_tokenizer(llama3());
    benchmark::DoNotOptimize(v);
  }
}

void compile(benchmark::State& state, const bench_case& c) {
  const auto& v = llama3_vocab();
  std::size_t table_bytes = 0, elements = 0, walk_elements = 0, deferred = 0, states = 0;
  for (auto _ : state) {
    const std::string gbnf = grammar::schema_to_gbnf(std::string_view(c.schema));
    grammar::token_masker m(std::make_shared<const grammar::automaton>(grammar::parse_gbnf(gbnf)), v);
    benchmark::DoNotOptimize(m.allowed(m.grammar_automaton().start()));
    table_bytes = m.tables().memory_bytes();
    elements = m.tables().size();
    walk_elements = m.tables().n_walk();
    deferred = m.tables().n_deferred();
    states = m.grammar_automaton().n_states();
  }
  state.counters["states"] = static_cast<double>(states);
  state.counters["table_kib"] = static_cast<double>(table_bytes) / 1024.0;
  state.counters["tables"] = static_cast<double>(elements);
  state.counters["walk_elements"] = static_cast<double>(walk_elements);
  state.counters["deferred"] = static_cast<double>(deferred);
}

void mask(benchmark::State& state, const bench_case& c) {
  const auto& tok = llama3();
  const auto& v = llama3_vocab();
  std::vector<token_id> doc = tok.encode(c.document);
  doc.push_back(tok.eos());
  const std::string gbnf = grammar::schema_to_gbnf(std::string_view(c.schema));
  const grammar::compiled_grammar g = grammar::parse_gbnf(gbnf);
  std::vector<float> row(tok.vocab_size());
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
  sampling::candidates cand;
  std::vector<double> us;
  const std::vector<token_id> prompt{tok.bos()};
  for (auto _ : state) {
    const auto masker = std::make_shared<const grammar::token_masker>(std::make_shared<const grammar::automaton>(g), v);
    const grammar::grammar_processor p(masker);
    std::vector<token_id> history = prompt;
    for (token_id t : doc) {
      cand.reset_copy(row);
      const double t0 = thread_cpu_us();
      p.apply(cand, {.history = history, .n_prompt = 1});
      us.push_back(thread_cpu_us() - t0);
      history.push_back(t);
    }
  }
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double x : us) sum += x;
  state.counters["median_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  state.counters["mean_us"] = sum / static_cast<double>(us.size());
  state.counters["steps"] = static_cast<double>(doc.size());
}

void row_copy(benchmark::State& state) {
  std::vector<float> row(llama3().vocab_size(), 0.5f);
  sampling::candidates cand;
  for (auto _ : state) {
    cand.reset_copy(row);
    benchmark::DoNotOptimize(cand.values().data());
  }
}

const bool registered = [] {
  benchmark::RegisterBenchmark("vocabulary/llama3", vocabulary)->Unit(benchmark::kMillisecond);
  for (const auto& c : grammar_cases) {
    benchmark::RegisterBenchmark((std::string("compile/") + c.name).c_str(), compile, c)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("mask/") + c.name).c_str(), mask, c)->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("row_copy/llama3", row_copy)->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
