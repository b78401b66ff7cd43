// SPDX-License-Identifier: MIT
// chat/: tool definitions and tool_choice (bad input named), conversations
// with tools rendered as the reference templates render them (expected texts
// rendered with Jinja2 from the Hugging Face templates), call grammars per
// family against the Earley oracle, the lazy grammar processor, the parser
// whole and streamed, and generation on stories260K under a call grammar.
#include <llmkit/chat/harmony_parser.hpp>
#include <llmkit/chat/harmony_tools.hpp>
#include <llmkit/chat/tool_grammar.hpp>
#include <llmkit/chat/tool_parser.hpp>
#include <llmkit/chat/tool_template.hpp>
#include <llmkit/chat/tools.hpp>
#include <llmkit/grammar/lazy_processor.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/categorical.hpp>
#include <llmkit/sampling/concepts.hpp>
#include <llmkit/sampling/runtime_chain.hpp>
#include <llmkit/sampling/temperature.hpp>
#include <llmkit/search/generate.hpp>

#include <catch2/catch.hpp>

#include "chat_fixtures.hpp"
#include "reference/grammar_reference.hpp"

#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::chat;
using llmkit::token_id;

static_assert(sampling::logits_processor<grammar::lazy_grammar_processor>);

namespace {

const model::tokenizer& stories_tok() {
  static const model::tokenizer t = model::tokenizer::from_gguf(model::gguf_file::open(LLMKIT_DEFAULT_MODEL));
  return t;
}
std::shared_ptr<const grammar::token_vocabulary> stories_vocab() {
  static const auto v = grammar::token_vocabulary::from_tokenizer(stories_tok());
  return v;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const llmkit::error& e) {
    return e.what();
  }
  return "";
}

const json weather_tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"]}}}])");

// Five tools of varied shapes (enums, nested objects, arrays, integer bounds, $defs).
const json five_tools = json::parse(llmkit::test::five_tools_json);

std::vector<chat_turn> weather_chat() {
  return {{"system", "Be brief."},
          {"user", "Weather in Paris?"},
          {"assistant", "", {{"abcdefghi", "get_weather", R"({"city":"Paris"})"}}},
          {"tool", R"({"temp": 21})", {}, "abcdefghi"}};
}

bool accepts(const std::string& gbnf, std::string_view text) {
  const grammar::automaton a{grammar::parse_gbnf(gbnf)};
  const grammar::state_id s = a.advance(a.start(), text);
  const bool lib = s != grammar::dead_state && a.can_end(s);
  // The Earley oracle agrees on every text checked.
  const grammar::compiled_grammar g = grammar::parse_gbnf(gbnf);
  const grammar::reference::earley oracle(g);
  auto chart = oracle.start();
  bool full = true;
  for (const char ch : text) full = full && oracle.scan(chart, static_cast<unsigned char>(ch));  // ASCII texts
  INFO("text '" << text << "'");
  CHECK((full && oracle.complete(chart)) == lib);
  return lib;
}

/// `text` fed to a tool_call_stream of `syntax` (seed 42) in pieces of 1
/// byte (`max_piece` 1) or 1 to max_piece bytes, the deltas reassembled;
/// requires each call announced in order, once, before its arguments.
parsed_answer streamed(tool_syntax syntax, std::string_view text, std::size_t max_piece, std::mt19937& rng) {
  tool_call_stream s(syntax, 42);
  parsed_answer out;
  const auto take = [&](const answer_delta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (!c.name.empty()) {
        REQUIRE(c.index == out.calls.size());  // announced in order, once
        out.calls.push_back({c.id, c.name, {}});
      }
      REQUIRE(c.index < out.calls.size());  // no arguments before the name
      out.calls[c.index].arguments += c.arguments;
    }
  };
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = max_piece == 1 ? 1 : 1 + rng() % max_piece;
    take(s.feed(text.substr(at, n)));
    at += n;
  }
  take(s.finish());
  return out;
}

/// Checks that a streamed answer equals the whole parse.
void check_same_answer(const parsed_answer& got, const parsed_answer& whole) {
  CHECK(got.reasoning == whole.reasoning);
  CHECK(got.content == whole.content);
  REQUIRE(got.calls.size() == whole.calls.size());
  for (std::size_t i = 0; i < got.calls.size(); ++i) {
    CHECK(got.calls[i].id == whole.calls[i].id);
    CHECK(got.calls[i].name == whole.calls[i].name);
    CHECK(got.calls[i].arguments == whole.calls[i].arguments);
  }
}

}  // namespace

TEST_CASE("tools: definitions and tool_choice are checked, bad input named") {
  const auto tools = parse_tools(five_tools);
  REQUIRE(tools.size() == 5);
  CHECK(tools[0].name == "get_weather");
  CHECK(tools[0].description == "Weather in a city");
  CHECK(tools[4].parameters == json::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})"));
  CHECK(parse_tool_choice("auto", tools).mode == tool_choice_mode::automatic);
  CHECK(parse_tool_choice("none", tools).mode == tool_choice_mode::none);
  CHECK(parse_tool_choice("required", tools).mode == tool_choice_mode::required);
  const auto named = parse_tool_choice(json::parse(R"({"type": "function", "function": {"name": "add"}})"), tools);
  CHECK((named.mode == tool_choice_mode::named && named.name == "add"));

  CHECK_THAT(error_of([&] { parse_tool_choice(json::parse(R"({"type": "function", "function": {"name": "nope"}})"), tools); }),
             Catch::Contains("'nope' is not in tools (get_weather, add, send_mail, move, ping)"));
  CHECK_THAT(error_of([&] { parse_tool_choice("sometimes", tools); }), Catch::Contains("got \"sometimes\""));
  CHECK_THAT(error_of([&] { parse_tool_choice(3, tools); }), Catch::Contains("tool_choice: must be"));
  CHECK_THAT(error_of([] { parse_tools(json::object()); }), Catch::Contains("tools: must be an array"));
  CHECK_THAT(error_of([] { parse_tools(json::parse(R"([{"type": "retrieval"}])")); }),
             Catch::Contains("tools[0].type"));
  CHECK_THAT(error_of([] { parse_tools(json::parse(R"([{"type": "function", "function": {"name": "a b"}}])")); }),
             Catch::Contains("tools[0].function.name: only letters"));
  CHECK_THAT(error_of([] {
               parse_tools(json::parse(R"([{"type": "function", "function": {"name": "f"}},
                                          {"type": "function", "function": {"name": "f"}}])"));
             }),
             Catch::Contains("tools[1].function.name: 'f' is defined twice"));
  CHECK_THAT(error_of([] {
               parse_tools(json::parse(R"([{"type": "function", "function": {"name": "f"}},
                 {"type": "function", "function": {"name": "g", "parameters": {"type": "object",
                  "properties": {"xs": {"type": "array", "uniqueItems": true}}}}}])"));
             }),
             Catch::Contains("tools[1].function.parameters: json schema: at #/properties/xs/uniqueItems"));
  CHECK_THAT(error_of([] {
               parse_tools(json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])"));
             }),
             Catch::Contains("must describe an object"));
  CHECK_THAT(error_of([] { tool_call_grammar(tool_syntax::hermes, parse_tools(weather_tools), {tool_choice_mode::named, "x"}); }),
             Catch::Contains("'x' is not in tools"));
  CHECK(tool_syntax_of(model::chat_family::qwen2_5) == tool_syntax::hermes);
  CHECK(tool_syntax_of(model::chat_family::llama3_1) == tool_syntax::llama3_json);
  CHECK(tool_syntax_of(model::chat_family::mistral_v3) == tool_syntax::mistral);
  CHECK_FALSE(tool_syntax_of(model::chat_family::gemma).has_value());
  // Call ids: 9 letters or digits, distinct per index.
  CHECK(make_tool_call_id(7, 0).size() == 9);
  CHECK(make_tool_call_id(7, 0) != make_tool_call_id(7, 1));
}

TEST_CASE("tools: conversations render as the reference templates (qwen2.5, llama3.1, mistral-v3)") {
  const auto tools = parse_tools(weather_tools);
  const auto chat = weather_chat();
  const auto qwen = format_with_tools(model::chat_template::by_name("qwen2.5"), chat, tools);
  CHECK(qwen.text ==
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": "
        "\"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
        "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>"
        "assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|"
        "im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>"
        "assistant\n");
  // Markers are never content; the user's text and the tool result are.
  for (const auto& span : qwen.contents) {
    const std::string_view piece = std::string_view(qwen.text).substr(span.offset, span.length);
    CHECK(piece.find("<|im_start|>") == std::string_view::npos);
    CHECK(piece.find("<tool_call>") == std::string_view::npos);
  }
  const auto is_content = [](const model::formatted_chat& f, std::string_view s) {
    const std::size_t at = f.text.find(s);
    for (const auto& span : f.contents)
      if (span.offset <= at && at + s.size() <= span.end()) return true;
    return false;
  };
  CHECK(is_content(qwen, "Weather in Paris?"));
  CHECK(is_content(qwen, "{\"temp\": 21}"));

  const auto llama = format_with_tools(model::chat_template::by_name("llama3.1"), chat, tools);
  CHECK(llama.text ==
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December "
        "2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the "
        "following functions, please respond with a JSON for a function call with its proper arguments that best "
        "answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
        "argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n "
        "       \"name\": \"get_weather\",\n        \"description\": \"Weather in a city\",\n        \"parameters\": "
        "{\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n         "
        "           \"type\": \"string\"\n                }\n            },\n            \"required\": [\n          "
        "      \"city\"\n            ]\n        }\n    }\n}\n\nWeather in Paris?<|eot_id|><|start_header_id|>"
        "assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|"
        "start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>assistant<|"
        "end_header_id|>\n\n");
  CHECK(is_content(llama, "Weather in Paris?"));

  const auto mistral = format_with_tools(model::chat_template::by_name("mistral-v3"), chat, tools);
  CHECK(mistral.text ==
        "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
        "\"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
        "\"string\"}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST][TOOL_CALLS] "
        "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]</s>"
        "[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abcdefghi\"}[/TOOL_RESULTS]");
  // The system message goes into the last user turn when that turn ends the conversation.
  const std::vector<chat_turn> ask{{"system", "Be brief."}, {"user", "Hi"}};
  CHECK(format_with_tools(model::chat_template::by_name("mistral-v3"), ask, tools).text.ends_with(
      "[/AVAILABLE_TOOLS][INST] Be brief.\n\nHi[/INST]"));

  // qwen3: no default system message, the first call right after the turn's opening.
  const auto qwen3 = format_with_tools(model::chat_template::by_name("qwen3"),
                                       std::span(chat).subspan(1), tools, {.enable_thinking = false});
  CHECK(qwen3.text.starts_with("<|im_start|>system\n# Tools\n\n"));
  CHECK(qwen3.text.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n") != std::string::npos);
  CHECK(qwen3.text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));

  // Without tools, calls or results: the plain template.
  const std::vector<chat_turn> plain{{"user", "Hi"}};
  CHECK(format_with_tools(model::chat_template::by_name("qwen2.5"), plain, {}).text ==
        model::chat_template::by_name("qwen2.5").format(std::vector<model::chat_message>{{"user", "Hi"}}));

  // What the templates refuse.
  CHECK_THAT(error_of([&] { format_with_tools(model::chat_template::by_name("gemma"), chat, tools); }),
             Catch::Contains("'gemma' has no tool-call format"));
  auto two_calls = chat;
  two_calls[2].tool_calls.push_back({"bcdefghij", "get_weather", "{}"});
  CHECK_THAT(error_of([&] { format_with_tools(model::chat_template::by_name("llama3.1"), two_calls, tools); }),
             Catch::Contains("one call per turn"));
  auto bad_id = chat;
  bad_id[2].tool_calls[0].id = "call_1";
  CHECK_THAT(error_of([&] { format_with_tools(model::chat_template::by_name("mistral-v3"), bad_id, tools); }),
             Catch::Contains("9 letters or digits, got 'call_1'"));
  auto bad_args = chat;
  bad_args[2].tool_calls[0].arguments = "{city";
  CHECK_THAT(error_of([&] { format_with_tools(model::chat_template::by_name("qwen2.5"), bad_args, tools); }),
             Catch::Contains("messages[2].tool_calls[0].function.arguments: not valid JSON"));
  auto bad_role = chat;
  bad_role[1].role = "robot";
  CHECK_THAT(error_of([&] { format_with_tools(model::chat_template::by_name("qwen2.5"), bad_role, tools); }),
             Catch::Contains("messages[1].role: 'robot'"));
}

TEST_CASE("tools: rendered calls parse back to the same calls in every family") {
  const auto tools = parse_tools(five_tools);
  const std::vector<tool_call> calls{{"abcdefghi", "get_weather", R"({"city": "Oslo", "unit": "c"})"},
                                     {"bcdefghij", "move", R"({"to": {"x": -3, "y": 4}})"}};
  struct family_case {
    const char* name;
    std::string_view open, close;  // the assistant turn's markers around its text
    std::size_t n_calls;
  };
  for (const family_case f : {family_case{"qwen2.5", "<|im_start|>assistant\n", "<|im_end|>", 2},
                              family_case{"llama3.1", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", 1},
                              family_case{"mistral-v3", "[/INST]", "</s>", 2},
                              family_case{"harmony", "<|start|>user<|message|>Go<|end|><|start|>assistant", "", 2}}) {
    INFO(f.name);
    const auto tmpl = model::chat_template::by_name(f.name);
    const std::vector<chat_turn> turns{
        {"user", "Go"}, {"assistant", "", std::vector<tool_call>(calls.begin(), calls.begin() + f.n_calls)}};
    const std::string text = format_with_tools(tmpl, turns, tools, {.prompt = model::generation_prompt::omit}).text;
    const std::size_t begin = text.rfind(f.open) + f.open.size();
    const std::string answer = text.substr(begin, text.rfind(f.close) - begin);
    const auto parsed = parse_tool_calls(*tool_syntax_of(tmpl.family()), answer);
    CHECK(parsed.content.empty());
    REQUIRE(parsed.calls.size() == f.n_calls);
    for (std::size_t i = 0; i < f.n_calls; ++i) {
      CHECK(parsed.calls[i].name == calls[i].name);
      CHECK(json::parse(parsed.calls[i].arguments) == json::parse(calls[i].arguments));
    }
  }
}

TEST_CASE("tools: call grammars accept the family's calls and reject others (Earley oracle)") {
  const auto tools = parse_tools(five_tools);
  const tool_choice required{tool_choice_mode::required};
  {
    const auto g = tool_call_grammar(tool_syntax::hermes, tools, required, true);
    REQUIRE(g.has_value());
    CHECK(g->triggers.empty());
    CHECK(accepts(g->gbnf, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 99}}\n</tool_call>"));
    CHECK(accepts(g->gbnf, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                           "{\"name\": \"move\", \"arguments\": {\"to\": {\"x\": -9, \"y\": 0}}}\n</tool_call>"));
    CHECK(accepts(g->gbnf, "<tool_call>\n{\"name\": \"send_mail\", \"arguments\": {\"to\": [\"ann\"], \"urgent\": "
                           "true}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 100}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", "
                                 "\"unit\": \"k\"}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, "<tool_call>\n{\"name\": \"move\", \"arguments\": {\"to\": {\"x\": 10, \"y\": 0}}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, "Sure! <tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
    CHECK_FALSE(accepts(g->gbnf, ""));
    const auto single = tool_call_grammar(tool_syntax::hermes, tools, required, false);
    CHECK_FALSE(accepts(single->gbnf, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n"
                                      "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
    const auto lazy = tool_call_grammar(tool_syntax::hermes, tools, {tool_choice_mode::automatic});
    CHECK(lazy->triggers == std::vector<std::string>{"<tool_call>"});
    CHECK_FALSE(tool_call_grammar(tool_syntax::hermes, tools, {tool_choice_mode::none}).has_value());
  }
  {
    const auto g = tool_call_grammar(tool_syntax::llama3_json, tools, {tool_choice_mode::named, "add"});
    CHECK(accepts(g->gbnf, "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}"));
    CHECK_FALSE(accepts(g->gbnf, "{\"name\": \"ping\", \"parameters\": {}}"));  // another function than the named one
    CHECK_FALSE(accepts(g->gbnf, "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}"));
  }
  {
    const auto g = tool_call_grammar(tool_syntax::mistral, tools, required, true);
    CHECK(accepts(g->gbnf, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}, "
                           "{\"name\": \"add\", \"arguments\": {\"a\": 0, \"b\": 0}, \"id\": \"Z9Z9Z9Z9Z\"}]"));
    CHECK_FALSE(accepts(g->gbnf, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}, \"id\": \"short\"}]"));
    CHECK_FALSE(accepts(g->gbnf, "[TOOL_CALLS] []"));
    const auto single = tool_call_grammar(tool_syntax::mistral, tools, required, false);
    CHECK_FALSE(accepts(single->gbnf, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}, "
                                      "{\"name\": \"ping\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}]"));
  }
}

TEST_CASE("tools: the lazy grammar leaves text free until the trigger, then constrains and rolls back") {
  const auto vocab = stories_vocab();
  const auto& tok = stories_tok();
  // The grammar starts with its trigger, as tool_call_grammar's do.
  const auto masker = grammar::compile_cached("root ::= \"CALL\" \" \" [a-c]+ \".\"", vocab);
  const grammar::lazy_grammar_processor p(masker, {"CALL"});
  const std::vector<token_id> prompt{tok.bos()};
  std::vector<token_id> history = prompt;
  const auto ctx = [&] { return sampling::sampling_context{.history = history, .n_prompt = prompt.size()}; };
  const auto push_text = [&](std::string_view text) {
    for (const token_id t : tok.encode(text, {.add_bos = false})) history.push_back(t);
  };
  std::vector<float> logits(tok.vocab_size(), 0.0f);
  sampling::candidates c;
  const auto n_allowed = [&] {
    c.reset_copy(logits);
    p.apply(c, ctx());
    std::size_t n = 0;
    for (std::size_t i = 0; i < c.size(); ++i) n += c.values()[i] != -std::numeric_limits<float>::infinity();
    return n;
  };
  push_text("Once upon a time");
  CHECK(n_allowed() == tok.vocab_size());  // free text: nothing masked
  CHECK_FALSE(p.active());
  const std::size_t before_trigger = history.size();
  push_text(" CALL a");
  const std::size_t allowed = n_allowed();
  CHECK(p.active());
  CHECK(allowed > 0);
  CHECK(allowed < 20);  // [a-c] or "."
  // Every allowed token continues the grammar; EOS only once it may end.
  c.reset_copy(logits);
  p.apply(c, ctx());
  for (std::size_t i = 0; i < c.size(); ++i)
    if (c.values()[i] != -std::numeric_limits<float>::infinity()) {
      std::string piece;
      if (c.token(i) == tok.eos()) continue;
      tok.decode_token(c.token(i), piece);
      INFO("token '" << piece << "'");
      CHECK(piece.find_first_not_of("abc.") == std::string::npos);
    }
  // Cut back before the trigger: free again.
  history.resize(before_trigger);
  CHECK(n_allowed() == tok.vocab_size());
  CHECK_FALSE(p.active());
  // Text after the trigger that breaks the grammar is an error.
  push_text(" CALL x");
  CHECK_THAT(error_of([&] { n_allowed(); }), Catch::Contains("not allowed by the grammar"));
  // A marker token: its given text counts (here token 5 stands for the whole trigger).
  const token_id marker = 5;  // any token: its given text replaces its own
  const grammar::lazy_grammar_processor q(masker, {"CALL"}, {{marker, "CALL"}});
  history.resize(before_trigger);
  history.push_back(marker);
  c.reset_copy(logits);
  q.apply(c, ctx());
  CHECK(q.active());
  std::size_t n_after_marker = 0;
  for (std::size_t i = 0; i < c.size(); ++i)  // after "CALL": a space, then [a-c]
    if (c.values()[i] != -std::numeric_limits<float>::infinity()) {
      std::string piece;
      tok.decode_token(c.token(i), piece);
      CHECK(piece.starts_with(" "));
      CHECK(piece.find_first_not_of("abc.", 1) == std::string::npos);
      ++n_after_marker;
    }
  CHECK(n_after_marker >= 4);  // " ", " a", " b", " c"
  CHECK_THAT(error_of([&] { grammar::lazy_grammar_processor(masker, {}); }), Catch::Contains("no trigger"));
  CHECK_THAT(error_of([&] { grammar::lazy_grammar_processor(masker, {""}); }), Catch::Contains("empty trigger"));
  CHECK_THAT(error_of([&] { grammar::lazy_grammar_processor(masker, {"x"}, {{100000, "x"}}); }),
             Catch::Contains("marker token 100000 outside"));
}

TEST_CASE("tools: the stream splits content and calls as the whole parse does, in any chunking") {
  struct answer_case {
    tool_syntax syntax;
    std::string text;
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  };
  const std::vector<answer_case> cases{
      {tool_syntax::hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"add\"}\n</tool_call>",
       "Let me check.", {{"get_weather", R"({"city": "Paris"})"}, {"add", R"({"a": [1, {"b": "}"}]})"}}},
      {tool_syntax::hermes, "  No call needed; <tool is a word here.  ", "No call needed; <tool is a word here.", {}},
      {tool_syntax::llama3_json, "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}", "",
       {{"add", R"({"a": 1, "b": 2})"}}},
      {tool_syntax::llama3_json, "It is sunny.", "It is sunny.", {}},
      {tool_syntax::mistral, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}, {\"name\": \"add\", \"arguments\": {\"a\": \"x\\\"]\"}, \"id\": \"b1b2c3d4e\"}]",
       "", {{"ping", "{}"}, {"add", R"({"a": "x\"]"})"}}},
  };
  std::mt19937 rng(5);
  for (const auto& k : cases) {
    INFO(k.text);
    const auto whole = parse_tool_calls(k.syntax, k.text, 42);
    CHECK(whole.content == k.content);
    REQUIRE(whole.calls.size() == k.calls.size());
    for (std::size_t i = 0; i < k.calls.size(); ++i) {
      CHECK(whole.calls[i].name == k.calls[i].first);
      CHECK(whole.calls[i].arguments == k.calls[i].second);
      CHECK(whole.calls[i].id == make_tool_call_id(42, i));
    }
    for (int trial = 0; trial < 20; ++trial)
      check_same_answer(streamed(k.syntax, k.text, trial == 0 ? 1 : 7, rng), whole);
  }
  // Broken calls are all content in a whole parse.
  const auto cut = parse_tool_calls(tool_syntax::hermes, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\"");
  CHECK(cut.calls.empty());
  CHECK(cut.content == "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\"");
  const auto junk = parse_tool_calls(tool_syntax::mistral, "[TOOL_CALLS] oops");
  CHECK(junk.calls.empty());
  CHECK(junk.content == "[TOOL_CALLS] oops");
  // A stream names a call as soon as its name is complete, before its arguments end.
  tool_call_stream s(tool_syntax::hermes, 1);
  CHECK(s.feed("<tool_call>\n{\"name\": \"ad").calls.empty());
  const auto d = s.feed("d\", \"arguments\": {\"a\": 1");
  REQUIRE(d.calls.size() == 1);
  CHECK(d.calls[0].name == "add");
  CHECK(d.calls[0].arguments == "{\"a\": 1");
}

TEST_CASE("tools: generation on stories260K under required and named call grammars gives valid calls") {
  const auto vocab = stories_vocab();
  const auto& tok = stories_tok();
  const auto file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::llama_model m{file};
  const auto tools = parse_tools(five_tools);
  for (const tool_syntax syntax : {tool_syntax::hermes, tool_syntax::llama3_json, tool_syntax::mistral}) {
    for (const tool_choice& choice : {tool_choice{tool_choice_mode::required}, tool_choice{tool_choice_mode::named, "move"}}) {
      const auto g = tool_call_grammar(syntax, tools, choice, /*parallel=*/false);
      const auto masker = grammar::compile_cached(g->gbnf, vocab);
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 512});
        sampling::runtime_chain chain({grammar::grammar_processor(masker), sampling::temperature{1.0f}});
        const std::vector<token_id> prompt{tok.bos()};
        const auto r = search::generate(m, cache, prompt, chain, sampling::categorical{},
                                        {.stop = {.max_new_tokens = 400, .eos_tokens = {tok.eos()}}, .seed = seed});
        const std::string text = tok.decode(std::span<const token_id>(r.tokens.data(), r.tokens.size() - 1));
        INFO("syntax " << static_cast<int>(syntax) << " seed " << seed << " output '" << text << "'");
        REQUIRE(r.reason == finish_reason::eos);
        const auto parsed = parse_tool_calls(syntax, text, seed);
        REQUIRE_FALSE(parsed.calls.empty());
        CHECK(parsed.content.empty());
        for (const auto& call : parsed.calls) {
          const auto args = json::parse(call.arguments);
          if (choice.mode == tool_choice_mode::named) CHECK(call.name == "move");
          if (call.name == "get_weather")
            CHECK((args.size() == 2 && args["city"].is_string() && args["city"].get<std::string>().size() <= 12 &&
                   (args["unit"] == "c" || args["unit"] == "f")));
          else if (call.name == "add")
            CHECK((args["a"].is_number_integer() && args["a"].get<int>() >= 0 && args["a"].get<int>() <= 99 &&
                   args["b"].is_number_integer() && args["b"].get<int>() >= 0 && args["b"].get<int>() <= 99));
          else if (call.name == "send_mail")
            CHECK((args["to"].is_array() && !args["to"].empty() && args["to"].size() <= 2 && args["urgent"].is_boolean()));
          else if (call.name == "move")
            CHECK((args["to"]["x"].is_number_integer() && std::abs(args["to"]["x"].get<int>()) <= 9 &&
                   args["to"]["y"].is_number_integer() && std::abs(args["to"]["y"].get<int>()) <= 9));
          else
            CHECK(call.name == "ping");
        }
      }
    }
  }
}

TEST_CASE("tools: harmony chats render as gpt-oss's Jinja template renders them") {
  // tests/data/harmony-tools-rendered.json: scripts/harmony-oracle/render-tools.mjs.
  std::ifstream in(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/harmony-tools-rendered.json");
  REQUIRE(in.good());
  const json data = json::parse(in);
  const std::string date = data["date"].get<std::string>();
  const auto tmpl = model::chat_template::by_name("harmony");
  REQUIRE(data["cases"].size() >= 12);
  for (const json& c : data["cases"]) {
    INFO(c["name"].get<std::string>());
    // Lax schemas: the template reads keywords JSON Schema does not have (OpenAPI's `nullable`).
    const auto tools = parse_tools(c["tools"], {.strict = false});
    std::vector<chat_turn> turns;
    for (const json& m : c["messages"]) {
      chat_turn t{m["role"].get<std::string>(), m["content"].get<std::string>()};
      if (m.contains("tool_call_id")) t.tool_call_id = m["tool_call_id"].get<std::string>();
      if (m.contains("tool_calls"))
        for (const json& k : m["tool_calls"])
          t.tool_calls.push_back({k["id"].get<std::string>(), k["function"]["name"].get<std::string>(),
                                  k["function"]["arguments"].get<std::string>()});
      turns.push_back(std::move(t));
    }
    const std::string effort = c["reasoning_effort"].get<std::string>();
    const model::chat_format_options options{
        .prompt = c["add_generation_prompt"].get<bool>() ? model::generation_prompt::add : model::generation_prompt::omit,
        .reasoning_effort = effort,
        .current_date = date};
    const auto f = format_with_tools(tmpl, turns, tools, options);
    CHECK(f.text == c["text"].get<std::string>());
    // Markers are never content: the user's words, tool definitions, names, arguments and results are.
    for (const auto& span : f.contents)
      CHECK(std::string_view(f.text).substr(span.offset, span.length).find("<|") == std::string_view::npos);
    for (const json& m : c["messages"])
      if (m["role"] == "user") {
        const std::string& u = m["content"].get_ref<const std::string&>();
        const std::size_t at = f.text.find(u);
        CHECK(std::any_of(f.contents.begin(), f.contents.end(),
                          [&](const model::text_span& s) { return s.offset <= at && at + u.size() <= s.end(); }));
      }
  }
}

TEST_CASE("tools: harmony writes every call of a turn, names results by call id, refuses orphan results") {
  const auto tools = parse_tools(weather_tools);
  const auto tmpl = model::chat_template::by_name("harmony");
  const model::chat_format_options dated{.current_date = "2026-01-02"};
  const std::vector<chat_turn> two{{"user", "Both?"},
                                   {"assistant", "", {{"c1", "get_weather", R"({"city":"Oslo"})"}, {"c2", "other", "{}"}}},
                                   {"tool", "1", {}, "c1"},
                                   {"tool", "2", {}, "c2"}};
  const std::string text = format_with_tools(tmpl, two, tools, dated).text;
  CHECK_THAT(text, Catch::EndsWith(
                       "<|start|>user<|message|>Both?<|end|><|start|>assistant to=functions.get_weather<|channel|>"
                       "commentary json<|message|>{\"city\": \"Oslo\"}<|call|><|start|>assistant to=functions.other"
                       "<|channel|>commentary json<|message|>{}<|call|><|start|>functions.get_weather to=assistant"
                       "<|channel|>commentary<|message|>\"1\"<|end|><|start|>functions.other to=assistant<|channel|>"
                       "commentary<|message|>\"2\"<|end|><|start|>assistant"));
  const std::vector<chat_turn> orphan{{"user", "Hi"}, {"tool", "1", {}, "c1"}};
  CHECK_THAT(error_of([&] { format_with_tools(tmpl, orphan, tools, dated); }),
             Catch::Contains("messages[1]: a tool result needs an earlier assistant tool call"));
  model::chat_format_options bad = dated;
  bad.reasoning_effort = "max";
  CHECK_THAT(error_of([&] { format_with_tools(tmpl, two, tools, bad); }),
             Catch::Contains("reasoning_effort is 'max'"));
  // A tool without a description has no comment line; without properties it takes no arguments.
  const auto bare = parse_tools(json::parse(R"([{"type": "function", "function": {"name": "ping"}}])"));
  CHECK(harmony_tool_namespace(bare) == "## functions\n\nnamespace functions {\n\ntype ping = () => any;\n\n} // namespace functions");
  // Without tools, calls or results, a harmony chat renders as the template family does.
  const std::vector<chat_turn> plain{{"system", "S"}, {"user", "Hi"}};
  CHECK(format_with_tools(tmpl, plain, {}, dated).text ==
        tmpl.format(std::vector<model::chat_message>{{"system", "S"}, {"user", "Hi"}}, dated));
}

TEST_CASE("tools: an answer's reasoning is kept where the qwen3 and gpt-oss templates keep it") {
  const auto tools = parse_tools(weather_tools);
  // qwen3: answers after the last user query keep a think block, from the turn's reasoning or its content.
  const auto qwen3 = model::chat_template::by_name("qwen3");
  const auto chat = weather_chat();
  std::vector<chat_turn> given(chat.begin() + 1, chat.end()), inline_think = given;
  given[1].reasoning = "\nCall the tool.\n";
  inline_think[1].content = "<think>\nCall the tool.\n</think>\n\n";
  const std::string call_turn =
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
  CHECK_THAT(format_with_tools(qwen3, given, tools).text, Catch::EndsWith(call_turn));
  CHECK_THAT(format_with_tools(qwen3, inline_think, tools).text, Catch::EndsWith(call_turn));
  // With content too: a newline before the first call.
  given[1].content = "Checking.";
  CHECK_THAT(format_with_tools(qwen3, given, tools).text,
             Catch::Contains("<think>\nCall the tool.\n</think>\n\nChecking.\n<tool_call>\n"));
  // An answer before the last query loses its reasoning.
  std::vector<chat_turn> earlier{{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Weather in Paris?"}};
  earlier[1].reasoning = "Greet back.";
  const std::string earlier_text = format_with_tools(qwen3, earlier, tools).text;
  CHECK_THAT(earlier_text, Catch::Contains("<|im_start|>assistant\nHello!<|im_end|>\n"));
  CHECK_THAT(earlier_text, !Catch::Contains("Greet back."));
  // Without tools: the same text as the plain template given the reasoning inline.
  std::vector<chat_turn> plain{{"user", "2 + 2?"}, {"assistant", "4"}};
  plain[1].reasoning = "Add.";
  const model::chat_format_options training{.prompt = model::generation_prompt::omit};
  CHECK(format_with_tools(qwen3, plain, {}, training).text ==
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\nAdd.\n</think>\n\n4<|im_end|>\n");
  CHECK(format_with_tools(qwen3, plain, {}, training).text ==
        qwen3.format(std::vector<model::chat_message>{{"user", "2 + 2?"}, {"assistant", "<think>\nAdd.\n</think>\n\n4"}},
                     training));

  // harmony: a call's reasoning is its analysis message (as content alone is, which the Jinja oracle checks)
  // until an answer without calls follows; only a last answer written for training keeps its reasoning.
  const auto oss = model::chat_template::by_name("harmony");
  const model::chat_format_options dated{.current_date = "2026-01-02"};
  std::vector<chat_turn> thought = given, as_content = given;
  thought[1].content.clear();
  as_content[1].reasoning.clear();
  as_content[1].content = "\nCall the tool.\n";
  const std::string analysed = format_with_tools(oss, thought, tools, dated).text;
  CHECK(analysed == format_with_tools(oss, as_content, tools, dated).text);
  CHECK_THAT(analysed, Catch::Contains("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant<|channel|>"
                                       "analysis<|message|>\nCall the tool.\n<|end|><|start|>assistant to=functions."
                                       "get_weather<|channel|>commentary json<|message|>"));
  // Both (the template raises): the reasoning as analysis, the content as a commentary preamble.
  CHECK_THAT(format_with_tools(oss, given, tools, dated).text,
             Catch::Contains("<|channel|>analysis<|message|>\nCall the tool.\n<|end|><|start|>assistant<|channel|>"
                             "commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather"));
  // Answered later: the call's reasoning is dropped.
  auto answered = thought;
  answered.push_back({"assistant", "21 C."});
  answered.push_back({"user", "Thanks"});
  auto answered_bare = answered;
  answered_bare[1].reasoning.clear();
  CHECK(format_with_tools(oss, answered, tools, dated).text == format_with_tools(oss, answered_bare, tools, dated).text);
  // A last answer without a generation prompt (training) keeps its reasoning; with one, answers lose it.
  model::chat_format_options train = dated;
  train.prompt = model::generation_prompt::omit;
  CHECK_THAT(format_with_tools(oss, plain, {}, train).text,
             Catch::EndsWith("<|start|>user<|message|>2 + 2?<|end|><|start|>assistant<|channel|>analysis<|message|>"
                             "Add.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>"));
  auto asked = plain;
  asked.push_back({"user", "3 + 3?"});
  auto asked_bare = asked;
  asked_bare[1].reasoning.clear();
  CHECK(format_with_tools(oss, asked, {}, dated).text ==
        oss.format(std::vector<model::chat_message>{{"user", "2 + 2?"}, {"assistant", "4"}, {"user", "3 + 3?"}}, dated));
  CHECK(format_with_tools(oss, asked, {}, dated).text == format_with_tools(oss, asked_bare, {}, dated).text);

  // Other families drop it; only assistant turns carry it.
  CHECK(format_with_tools(model::chat_template::by_name("qwen2.5"), plain, {}).text ==
        format_with_tools(model::chat_template::by_name("qwen2.5"), std::vector<chat_turn>{{"user", "2 + 2?"}, {"assistant", "4"}}, {}).text);
  std::vector<chat_turn> user_reasoning{{"user", "Hi"}};
  user_reasoning[0].reasoning = "x";
  CHECK_THAT(error_of([&] { format_with_tools(qwen3, user_reasoning, tools); }),
             Catch::Contains("messages[0]: only assistant messages carry reasoning"));
}

TEST_CASE("tools: harmony answers split into reasoning, content and calls, whole and streamed in any chunking") {
  struct answer_case {
    std::string text;
    std::string reasoning, content;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  };
  const std::vector<answer_case> cases{
      {"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
       "Need the weather.", "", {{"get_weather", R"({"city": "Paris"})"}}},
      {" to=functions.add<|channel|>commentary json<|message|> {\"a\": 1,\n \"b\": 2} \n<|call|>", "", "",
       {{"add", "{\"a\": 1,\n \"b\": 2}"}}},
      {"<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 C.<|return|>",
       "Easy.", "It is 21 C.", {}},
      {"<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|><|start|>assistant "
       "to=functions.add<|channel|>commentary json<|message|>{\"s\": \"<|end <|call\"}<|call|>",
       "", "", {{"ping", "{}"}, {"add", R"({"s": "<|end <|call"})"}}},
      {"<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis to=browser.search"
       "<|message|>{\"q\": 1}<|call|>",
       "", "Checking.", {}},
      {"Hello <|there", "", "Hello <|there", {}},
      {"<|channel|>analysis<|message|>cut off mid-thou", "cut off mid-thou", "", {}},
  };
  std::mt19937 rng(11);
  for (const auto& k : cases) {
    INFO(k.text);
    const auto whole = parse_tool_calls(tool_syntax::harmony, k.text, 42);
    CHECK(whole.reasoning == k.reasoning);
    CHECK(whole.content == k.content);
    REQUIRE(whole.calls.size() == k.calls.size());
    for (std::size_t i = 0; i < k.calls.size(); ++i) {
      CHECK(whole.calls[i].name == k.calls[i].first);
      CHECK(whole.calls[i].arguments == k.calls[i].second);
      CHECK(whole.calls[i].id == make_tool_call_id(42, i));
    }
    for (int trial = 0; trial < 30; ++trial)
      check_same_answer(streamed(tool_syntax::harmony, k.text, trial == 0 ? 1 : 9, rng), whole);
  }
  // A call is announced once its header is complete, before its arguments end.
  harmony_call_stream s(1);
  CHECK(s.feed("<|channel|>commentary to=functions.ad").calls.empty());
  const auto d = s.feed("d <|constrain|>json<|message|>{\"a\": 1 ");
  REQUIRE(d.calls.size() == 1);
  CHECK(d.calls[0].name == "add");
  CHECK(d.calls[0].arguments == "{\"a\": 1");  // the space waits for what follows
  CHECK(s.feed(", \"b\": 2}<|call|>").calls[0].arguments == " , \"b\": 2}");
}

TEST_CASE("tools: harmony call grammars think then call, and name the special tokens they allow (Earley oracle)") {
  const auto tools = parse_tools(five_tools);
  const auto m = [](std::string_view marker) {  // a named special token
    std::string bytes = "\x01";
    bytes += marker;
    return bytes;
  };
  const std::string call_add = m("<|channel|>") + "commentary to=functions.add " + m("<|constrain|>") + "json" +
                               m("<|message|>") + "{\"a\": 1, \"b\": 2}";
  const std::string call_ping = " to=functions.ping" + m("<|channel|>") + "commentary json" + m("<|message|>") + "{}";
  const std::string thought = m("<|channel|>") + "analysis" + m("<|message|>") + "Add <them> {now}." + m("<|end|>") +
                              m("<|start|>") + "assistant";
  const auto required = tool_call_grammar(tool_syntax::harmony, tools, {tool_choice_mode::required});
  REQUIRE(required.has_value());
  CHECK(required->triggers.empty());
  CHECK(accepts(required->gbnf, call_add));
  CHECK(accepts(required->gbnf, call_ping));
  CHECK(accepts(required->gbnf, thought + call_add));
  CHECK(accepts(required->gbnf, m("<|channel|>") + "commentary to=functions.ping" + m("<|message|>") + "{}"));
  CHECK_FALSE(accepts(required->gbnf, thought));  // thinking alone is not a call
  CHECK_FALSE(accepts(required->gbnf, thought + thought + call_add));
  CHECK_FALSE(accepts(required->gbnf, m("<|channel|>") + "analysis" + m("<|message|>") + "a" + m("<|call|>") + "b" +
                                          m("<|end|>") + m("<|start|>") + "assistant" + call_ping));
  CHECK_FALSE(accepts(required->gbnf, "<|channel|>commentary to=functions.ping<|message|>{}"));  // markers as text
  CHECK_FALSE(accepts(required->gbnf, m("<|channel|>") + "commentary to=functions.add" + m("<|message|>") +
                                          "{\"a\": 100, \"b\": 2}"));
  CHECK_FALSE(accepts(required->gbnf, m("<|channel|>") + "commentary to=functions.sub" + m("<|message|>") + "{}"));
  CHECK_FALSE(accepts(required->gbnf, m("<|channel|>") + "final" + m("<|message|>") + "Hi"));
  const auto named = tool_call_grammar(tool_syntax::harmony, tools, {tool_choice_mode::named, "ping"});
  CHECK(accepts(named->gbnf, call_ping));
  CHECK_FALSE(accepts(named->gbnf, call_add));
  const auto lazy = tool_call_grammar(tool_syntax::harmony, tools, {tool_choice_mode::automatic});
  CHECK(lazy->triggers == std::vector<std::string>{" to=functions."});
  CHECK(accepts(lazy->gbnf, " to=functions.add " + m("<|constrain|>") + "json" + m("<|message|>") + "{\"a\": 1, \"b\": 2}"));
  CHECK(accepts(lazy->gbnf, call_ping));
  CHECK_FALSE(accepts(lazy->gbnf, " to=functions.ping" + m("<|message|>") + "{\"x\": 1}"));

  // On gpt-oss's vocabulary the markers are special tokens: allowed where the grammar names them, and never
  // inside a JSON string, where their text would be.
  const model::tokenizer tok = model::tokenizer::from_gguf(
      model::gguf_file::open(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/o200k-vocab.gguf"));
  const auto id = [&](std::string_view text) {
    const auto t = tok.find(text);
    REQUIRE(t.has_value());
    return *t;
  };
  const auto vocab = grammar::token_vocabulary::from_tokenizer(tok, {id("<|call|>")}, harmony_grammar_markers);
  CHECK(vocab->bytes[static_cast<std::size_t>(id("<|channel|>"))] == "\x01<|channel|>");
  CHECK(vocab->bytes[static_cast<std::size_t>(id("<|return|>"))].empty());  // not named: no grammar allows it
  const auto plain = grammar::token_vocabulary::from_tokenizer(tok, {id("<|call|>")});
  CHECK(plain->bytes[static_cast<std::size_t>(id("<|channel|>"))].empty());
  const auto named_masker = grammar::compile_cached(named->gbnf, vocab);
  grammar::state_id s = named_masker->grammar_automaton().start();
  CHECK(named_masker->allowed(s)->contains(id("<|channel|>")));
  CHECK_FALSE(named_masker->allowed(s)->contains(id("<|end|>")));
  CHECK_FALSE(named_masker->allowed(s)->contains(id("<|call|>")));  // the grammar may not end yet
  std::vector<token_id> answer{id("<|channel|>")};
  for (const token_id t : tok.encode("commentary to=functions.ping", {.add_bos = false})) answer.push_back(t);
  answer.push_back(id("<|message|>"));
  for (const token_id t : answer) {
    REQUIRE(named_masker->allowed(s)->contains(t));
    s = named_masker->grammar_automaton().advance(s, vocab->bytes[static_cast<std::size_t>(t)]);
    REQUIRE(s != grammar::dead_state);
  }
  CHECK(named_masker->allowed(s)->contains(id("{")));
  CHECK_FALSE(named_masker->allowed(s)->contains(id("<|call|>")));
  const auto required_masker = grammar::compile_cached(required->gbnf, vocab);
  // Inside a string argument of send_mail: '<' is text, the special tokens are not.
  std::string in_string = m("<|channel|>") + "commentary to=functions.send_mail" + m("<|message|>") + "{\"to\": [\"a";
  s = required_masker->grammar_automaton().advance(required_masker->grammar_automaton().start(), in_string);
  REQUIRE(s != grammar::dead_state);
  const auto inside = required_masker->allowed(s);
  CHECK(inside->contains(id("<")));
  for (std::string_view marker : harmony_grammar_markers) CHECK_FALSE(inside->contains(id(marker)));
  CHECK_FALSE(inside->contains(id("<|call|>")));
  // Once the arguments are complete, <|call|> (an end token of this vocabulary) ends the answer.
  s = required_masker->grammar_automaton().advance(required_masker->grammar_automaton().start(), call_ping);
  REQUIRE(s != grammar::dead_state);
  CHECK(required_masker->allowed(s)->contains(id("<|call|>")));
}
