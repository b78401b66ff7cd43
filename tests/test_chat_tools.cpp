// SPDX-License-Identifier: MIT
// chat/: tool definitions and tool_choice (bad input named), conversations
// with tools rendered as the reference templates render them (expected texts
// rendered with Jinja2 from the Hugging Face templates), call grammars per
// family against the Earley oracle, the lazy grammar processor, the parser
// whole and streamed, and generation on stories260K under a call grammar.
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
                              family_case{"mistral-v3", "[/INST]", "</s>", 2}}) {
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
    for (int trial = 0; trial < 20; ++trial) {
      tool_call_stream s(k.syntax, 42);
      std::string content;
      std::vector<tool_call> calls;
      const auto take = [&](const answer_delta& d) {
        content += d.content;
        for (const auto& c : d.calls) {
          if (!c.name.empty()) {
            REQUIRE(c.index == calls.size());  // announced in order, once
            calls.push_back({c.id, c.name, {}});
          }
          REQUIRE(c.index < calls.size());  // no arguments before the name
          calls[c.index].arguments += c.arguments;
        }
      };
      for (std::size_t at = 0; at < k.text.size();) {
        const std::size_t n = trial == 0 ? 1 : 1 + rng() % 7;
        take(s.feed(std::string_view(k.text).substr(at, n)));
        at += n;
      }
      take(s.finish());
      CHECK(content == whole.content);
      REQUIRE(calls.size() == whole.calls.size());
      for (std::size_t i = 0; i < calls.size(); ++i) {
        CHECK(calls[i].id == whole.calls[i].id);
        CHECK(calls[i].name == whole.calls[i].name);
        CHECK(calls[i].arguments == whole.calls[i].arguments);
      }
    }
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
