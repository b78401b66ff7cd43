// SPDX-License-Identifier: MIT
// bench_chat: compiling tool-call grammars (llmkit/chat/tool_grammar.hpp) for
// the Llama 3 vocabulary (128,256 tokens, tests/data fixture), 1 thread.
//
//   compile/tools5/<syntax>   tool_call_grammar of five tools (required) + parse_gbnf
//                             + automaton + the first mask of the grammar
//   compile/one_schema        baseline in the same run: the same steps for the
//                             parameters schema of one of the tools alone
//                             (schema_to_gbnf instead of tool_call_grammar)
//
// The vocabulary trie is built once before (bench_grammar's vocabulary/llama3
// times it): every grammar of a server shares it. The tools are kept here so
// figures stay comparable (tests/chat_fixtures.hpp, shared with test_chat_tools).
#include <benchmark/benchmark.h>

#include <llmkit/chat/tool_grammar.hpp>
#include <llmkit/grammar/json_schema.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <string>

#include "chat_fixtures.hpp"

namespace {

using namespace llmkit;

const std::shared_ptr<const grammar::token_vocabulary>& vocab() {
  static const auto v = grammar::token_vocabulary::from_tokenizer(model::tokenizer::from_gguf(
      model::gguf_file::open(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/llama3-bpe-vocab.gguf")));
  return v;
}

using llmkit::test::five_tools_json;

void compile_gbnf(const std::string& gbnf) {
  grammar::token_masker m(std::make_shared<const grammar::automaton>(grammar::parse_gbnf(gbnf)), vocab());
  benchmark::DoNotOptimize(m.mask(m.grammar_automaton().start()));
}

void tools5(benchmark::State& state, chat::tool_syntax syntax) {
  const auto tools = chat::parse_tools(chat::json::parse(five_tools_json));
  (void)vocab();
  for (auto _ : state)
    compile_gbnf(chat::tool_call_grammar(syntax, tools, {chat::tool_choice_mode::required})->gbnf);
}

void one_schema(benchmark::State& state) {
  const auto tools = chat::parse_tools(chat::json::parse(five_tools_json));
  (void)vocab();
  for (auto _ : state) compile_gbnf(grammar::schema_to_gbnf(tools[3].parameters));
}

const bool registered = [] {
  benchmark::RegisterBenchmark("compile/one_schema", one_schema)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("compile/tools5/hermes", tools5, chat::tool_syntax::hermes)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("compile/tools5/llama3_json", tools5, chat::tool_syntax::llama3_json)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("compile/tools5/mistral", tools5, chat::tool_syntax::mistral)
      ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
