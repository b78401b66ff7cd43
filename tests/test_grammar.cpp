// SPDX-License-Identifier: MIT
// grammar/: the GBNF parser (good grammars, errors at line:column, limits),
// the byte automaton against an Earley oracle on random strings, token masks
// against the oracle on the stories260K (SentencePiece) and Llama 3
// (byte-level BPE) vocabularies, JSON Schema conversion, and the processor
// (rollback, errors, constrained generation on stories260K).
#include <llmkit/grammar/automaton.hpp>
#include <llmkit/grammar/gbnf.hpp>
#include <llmkit/grammar/json_schema.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/grammar/token_masker.hpp>
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

#include "reference/grammar_reference.hpp"

#include <nlohmann/json.hpp>

#include <bit>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::grammar;
using llmkit::token_id;

static_assert(sampling::logits_processor<grammar_processor>);

namespace {

const std::string fixture_dir = std::string(LLMKIT_SOURCE_DIR) + "/tests/data/";

const model::tokenizer& stories_tok() {
  static const model::tokenizer t = model::tokenizer::from_gguf(model::gguf_file::open(LLMKIT_DEFAULT_MODEL));
  return t;
}
const model::tokenizer& llama3_tok() {
  static const model::tokenizer t =
      model::tokenizer::from_gguf(model::gguf_file::open(fixture_dir + "llama3-bpe-vocab.gguf"));
  return t;
}
std::shared_ptr<const token_vocabulary> stories_vocab() {
  static const auto v = token_vocabulary::from_tokenizer(stories_tok());
  return v;
}
std::shared_ptr<const token_vocabulary> llama3_vocab() {
  static const auto v = token_vocabulary::from_tokenizer(llama3_tok());
  return v;
}

// The error message of f(), or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const llmkit::error& e) {
    return e.what();
  }
  return "";
}

bool full_match(const automaton& a, std::string_view s) {
  const state_id e = a.advance(a.start(), s);
  return e != dead_state && a.can_end(e);
}

const char* const json_gbnf = R"(# a small JSON grammar
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";

const char* const unicode_gbnf = R"(root ::= (greeting | [α-ωА-я]+ | "日本" [語人]? | "\u00e9t\u00E9" | [\U0001F600-\U0001F64F]{1,3} | [^a-z\n]) ("\n" root)?
greeting ::= "héllo" | "wörld" [!?]
)";

}  // namespace

TEST_CASE("gbnf: good grammars parse and match what they describe") {
  const automaton json{parse_gbnf(json_gbnf)};
  CHECK(full_match(json, R"({"a": [1, 2.5e3, "x\n\u00e9"], "b": {"c": null}})"));
  CHECK(full_match(json, "{}"));
  CHECK_FALSE(full_match(json, "{"));
  CHECK_FALSE(full_match(json, R"({"a": 01x})"));
  CHECK_FALSE(full_match(json, "[]"));

  const automaton uni{parse_gbnf(unicode_gbnf)};
  CHECK(full_match(uni, "héllo"));
  CHECK(full_match(uni, "wörld?\nαβγ\n日本語\nété\n\xF0\x9F\x98\x80\xF0\x9F\x98\x81"));
  CHECK(full_match(uni, "Я"));
  CHECK_FALSE(full_match(uni, "hello"));
  CHECK_FALSE(full_match(uni, "日本語語"));
  CHECK(full_match(uni, "Z"));  // [^a-z\n]
  CHECK_FALSE(full_match(uni, "z"));

  // Repetition bounds, comments, groups over lines, '.', escapes in classes.
  const automaton rep{parse_gbnf("root ::= (\n  \"a\"{2,3} # two or three\n  | [\\]\\-x]{2} | \"q\" .\n) \"!\"?\n")};
  CHECK_FALSE(full_match(rep, "a"));
  CHECK(full_match(rep, "aa"));
  CHECK(full_match(rep, "aaa!"));
  CHECK_FALSE(full_match(rep, "aaaa"));
  CHECK(full_match(rep, "]-"));
  CHECK(full_match(rep, "x]!"));
  CHECK(full_match(rep, "q\xE2\x82\xAC"));
  CHECK_FALSE(full_match(rep, "q"));
  const automaton open_ended{parse_gbnf("root ::= [0-9]{2,} \"x\"{0,1}")};
  CHECK_FALSE(full_match(open_ended, "1"));
  CHECK(full_match(open_ended, "123456789x"));
  // A repetition after a literal of several characters repeats the whole literal (llama.cpp's reading).
  const automaton words{parse_gbnf("root ::= \"<\" \"ab\"? \"cd\"* \"ef\" {2} \">\"")};
  CHECK(full_match(words, "<efef>"));
  CHECK(full_match(words, "<abcdcdefef>"));
  CHECK_FALSE(full_match(words, "<aefef>"));
  CHECK_FALSE(full_match(words, "<abcddefef>"));
  CHECK_FALSE(full_match(words, "<abeff>"));
}

TEST_CASE("gbnf: syntax errors name their line and column") {
  const auto err = [](const char* text) { return error_of([&] { parse_gbnf(text); }); };
  CHECK_THAT(err("root ::= \"a\"\nfoo ::= bar\n"), Catch::Contains("line 2, column 9") && Catch::Contains("undefined rule 'bar'"));
  CHECK_THAT(err("root ::= \"abc"), Catch::Contains("line 1, column 10") && Catch::Contains("unterminated literal"));
  CHECK_THAT(err("root ::= [a-"), Catch::Contains("unterminated character class"));
  CHECK_THAT(err("root ::= [z-a]"), Catch::Contains("line 1, column 13") && Catch::Contains("below its start"));
  CHECK_THAT(err("root ::= (\"a\" | \"b\""), Catch::Contains("line 1, column 10") && Catch::Contains("unclosed '('"));
  CHECK_THAT(err("root ::= \"a\" )"), Catch::Contains("unmatched ')'"));
  CHECK_THAT(err("root := \"a\""), Catch::Contains("line 1, column 6") && Catch::Contains("expected '::='"));
  CHECK_THAT(err("a ::= \"x\"\n"), Catch::Contains("no 'root' rule"));
  CHECK_THAT(err("root ::= \"a\"\nroot ::= \"b\""), Catch::Contains("line 2, column 1") && Catch::Contains("defined twice"));
  CHECK_THAT(err("root ::= * \"a\""), Catch::Contains("line 1, column 10") && Catch::Contains("follows nothing"));
  CHECK_THAT(err("root ::= \"a\"{3,1}"), Catch::Contains("max below min"));
  CHECK_THAT(err("root ::= \"a\"{2"), Catch::Contains("expected '}'"));
  CHECK_THAT(err("root ::= \"\\q\""), Catch::Contains("line 1, column 11") && Catch::Contains("unknown escape"));
  CHECK_THAT(err("root ::= \"\\xZZ\""), Catch::Contains("hex digit"));
  CHECK_THAT(err("root ::= \"\\U00110000\""), Catch::Contains("beyond U+10FFFF"));
  CHECK_THAT(err("root ::= \"a\" \"b\"*+"), Catch::Contains("follows a repetition"));
  CHECK_THAT(err("root ::= \"a\" $"), Catch::Contains("line 1, column 14") && Catch::Contains("unexpected character"));
  CHECK_THAT(err("root ::= [^\\x00-\\U0010FFFF]"), Catch::Contains("matches nothing"));
  CHECK_THAT(err("root ::= \"\xC3\""), Catch::Contains("invalid UTF-8"));
}

TEST_CASE("gbnf: left recursion and oversized grammars are refused") {
  CHECK_THAT(error_of([] { parse_gbnf("root ::= root \"a\" | \"b\""); }), Catch::Contains("'root' is left-recursive"));
  CHECK_THAT(error_of([] { parse_gbnf("root ::= x\nx ::= y? \"a\"\ny ::= \"\" | root"); }),
             Catch::Contains("left-recursive"));
  CHECK_THAT(error_of([] { parse_gbnf("root ::= (\"\")*"); }), Catch::Contains("left-recursive"));
  CHECK_THAT(error_of([] { parse_gbnf("root ::= \"a\"{0,5000}"); }), Catch::Contains("exceeds the limit of 4096"));
  CHECK_THAT(error_of([] { parse_gbnf("root ::= ((\"a\"{0,100}){0,100}){0,100}"); }),
             Catch::Contains("rules after expanding repetitions") || Catch::Contains("elements after expanding"));
  CHECK_THAT(error_of([] { parse_gbnf("root ::= \"a\"", {.max_source_bytes = 4}); }), Catch::Contains("exceeds the limit"));
  std::string nested = "root ::= ";
  nested.append(300, '(').append("\"a\"").append(300, ')');
  CHECK_THAT(error_of([&] { parse_gbnf(nested); }),
             Catch::Contains("nested deeper than 256"));
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 5000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r5000 ::= \"z\"\n";
  CHECK_THAT(error_of([&] { automaton{parse_gbnf(chain)}; }), Catch::Contains("long chain of rules"));
  // Right recursion is fine, and its matching depth is bounded.
  const automaton nest{parse_gbnf("root ::= \"(\" root \")\" | \"x\""), {.max_stack_depth = 64}};
  CHECK(full_match(nest, "((x))"));
  CHECK_THAT(error_of([&] { nest.advance(nest.start(), std::string(100, '(')); }), Catch::Contains("deeper than 64"));
  // Ambiguity blows up the stack count: bounded.
  const automaton amb{parse_gbnf("root ::= a \"y\"\na ::= \"x\" a \"z\"? | \"x\" a \"w\"? | \"\""), {.max_stacks = 8}};
  CHECK(full_match(automaton{parse_gbnf("root ::= a \"y\"\na ::= \"x\" a \"z\"? | \"x\" a \"w\"? | \"\"")}, "xxzwy"));
  CHECK_THAT(error_of([&] { amb.advance(amb.start(), std::string(64, 'x')); }), Catch::Contains("matcher stacks"));
}

TEST_CASE("automaton: byte-level acceptance equals the Earley oracle on random strings") {
  std::mt19937 rng(49);
  for (const char* text : {json_gbnf, unicode_gbnf}) {
    const compiled_grammar g = parse_gbnf(text);
    const automaton a{g};
    const reference::earley oracle{g};
    // Alphabet: the grammar's interesting bytes, multi-byte sequences cut anywhere, invalid bytes.
    const std::vector<std::string> pieces{"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "0", "1", "-", ".", "e",
                                          "\\", "n", "u", "true", "null", "é", "\xC3", "\xA9", "日", "\xE6\x97", "\xA5",
                                          "\xF0\x9F\x98", "\x80", "\xFF", "\xED\xA0\x80", "\xC0\xAF", "α", "h", "!",
                                          "Z", "\xE0\x80\x80", "\xF4\x90\x80\x80"};
    for (int trial = 0; trial < 3000; ++trial) {
      std::string s;
      const int n = static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
      const state_id e = a.advance(a.start(), s);
      const bool expected = oracle.accepts(oracle.start(), s);
      INFO("text " << text << " input '" << s << "'");
      REQUIRE((e != dead_state) == expected);
      if (expected) {
        auto c = oracle.start();
        const auto d = reference::decode_utf8(s);
        for (char32_t cp : d->code_points) REQUIRE(oracle.scan(c, cp));
        REQUIRE(a.can_end(e) == (d->tail.empty() && oracle.complete(c)));
      }
    }
  }
}

namespace {

// For random reachable positions (random walks through allowed tokens),
// every token's mask bit equals the oracle's verdict on prefix + token bytes,
// EOS equals "complete", and special tokens are never allowed.
void check_masks(const char* text, const std::shared_ptr<const token_vocabulary>& vocab, const model::tokenizer& tok,
                 int n_walks, int n_steps, std::uint32_t seed) {
  const compiled_grammar g = parse_gbnf(text);
  const reference::earley oracle{g};
  const token_masker masker(std::make_shared<const automaton>(g), vocab);
  std::mt19937 rng(seed);
  for (int walk = 0; walk < n_walks; ++walk) {
    state_id s = masker.grammar_automaton().start();
    std::string prefix;
    for (int step = 0; step < n_steps; ++step) {
      const token_bitset mask = masker.compute_mask(s);
      REQUIRE(mask == *masker.mask(s));
      auto chart = oracle.start();
      const auto d = reference::decode_utf8(prefix);
      REQUIRE(d.has_value());
      for (char32_t cp : d->code_points) REQUIRE(oracle.scan(chart, cp));
      std::vector<token_id> allowed;
      for (std::size_t t = 0; t < vocab->size(); ++t) {
        const auto id = static_cast<token_id>(t);
        bool expected;
        if (vocab->is_eos(id)) expected = d->tail.empty() && oracle.complete(chart);
        else if (model::is_special(tok.type(id)) || vocab->bytes[t].empty()) expected = false;
        else expected = oracle.accepts(chart, d->tail + vocab->bytes[t]);
        INFO("prefix '" << prefix << "' token " << t << " '" << vocab->bytes[t] << "'");
        REQUIRE(test_bit(mask, id) == expected);
        if (expected && !vocab->is_eos(id)) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      const token_id pick = allowed[rng() % allowed.size()];
      s = masker.advance(s, pick);
      REQUIRE(s != dead_state);
      prefix += vocab->bytes[static_cast<std::size_t>(pick)];
    }
  }
}

}  // namespace

TEST_CASE("masks: stories260K (SentencePiece, byte fallback) equal the oracle") {
  check_masks(json_gbnf, stories_vocab(), stories_tok(), 6, 12, 1);
  check_masks(unicode_gbnf, stories_vocab(), stories_tok(), 6, 8, 2);
  check_masks(R"(root ::= "Once upon a time" (" " [a-z]+){1,6} "." | "\u00e9" [\x80-\uFFFF]* "\n")", stories_vocab(),
              stories_tok(), 4, 10, 3);
}

TEST_CASE("masks: Llama 3 vocabulary (byte-level BPE, 128k) equals the oracle") {
  check_masks(json_gbnf, llama3_vocab(), llama3_tok(), 1, 4, 4);
  check_masks(unicode_gbnf, llama3_vocab(), llama3_tok(), 1, 3, 5);
}

TEST_CASE("masks: special tokens are never allowed, EOS exactly at the end") {
  const auto vocab = llama3_vocab();
  const token_masker m(std::make_shared<const automaton>(parse_gbnf("root ::= [^x]*")), vocab);
  const token_bitset mask = m.compute_mask(m.grammar_automaton().start());
  const auto& tok = llama3_tok();
  std::size_t n_special = 0;
  for (std::size_t t = 0; t < tok.vocab_size(); ++t)
    if (model::is_special(tok.type(static_cast<token_id>(t))) && !vocab->is_eos(static_cast<token_id>(t))) {
      ++n_special;
      REQUIRE_FALSE(test_bit(mask, static_cast<token_id>(t)));
    }
  CHECK(n_special > 200);
  CHECK(test_bit(mask, tok.eos()));
  const token_masker m2(std::make_shared<const automaton>(parse_gbnf("root ::= \"ab\"")), vocab);
  CHECK_FALSE(test_bit(m2.compute_mask(m2.grammar_automaton().start()), tok.eos()));
}

namespace {

// On random reachable positions, the element-table path (compute_allowed)
// equals the full trie walk (compute_mask) and the token-by-token automaton.
// Returns how many positions took the tables with dependent tokens to check.
int check_tables(const char* text, const std::shared_ptr<const token_vocabulary>& vocab, int n_walks, int n_steps,
                 std::uint32_t seed, std::size_t max_dependent = 0,
                 std::size_t eager_pairs = mask_tables::default_eager_pairs) {
  const token_masker masker(std::make_shared<const automaton>(parse_gbnf(text)), vocab, 1024, max_dependent,
                            eager_pairs);
  const automaton& a = masker.grammar_automaton();
  std::mt19937 rng(seed);
  int n_dependent = 0;
  for (int walk = 0; walk < n_walks; ++walk) {
    state_id s = a.start();
    for (int step = 0; step < n_steps; ++step) {
      const token_bitset walked = masker.compute_mask(s);
      const token_mask m = masker.compute_allowed(s);
      REQUIRE(m.to_bitset() == walked);
      std::vector<std::pair<std::uint32_t, std::uint32_t>> tops;
      if (a.stack_tops(s, tops))
        for (const auto& [below, top] : tops) n_dependent += masker.tables().at(below, top).dependent.empty() ? 0 : 1;
      std::vector<token_id> allowed;
      for (std::size_t t = 0; t < vocab->size(); ++t) {
        const auto id = static_cast<token_id>(t);
        const bool expected = vocab->is_eos(id) ? a.can_end(s) : masker.advance(s, id) != dead_state;
        INFO("token " << t << " '" << vocab->bytes[t] << "'");
        REQUIRE(m.contains(id) == expected);
        if (expected && !vocab->is_eos(id)) allowed.push_back(id);
      }
      std::size_t n_walked = 0;
      for (std::uint64_t w : walked) n_walked += static_cast<std::size_t>(std::popcount(w));
      REQUIRE(m.count() == n_walked);
      if (allowed.empty()) break;
      s = masker.advance(s, allowed[rng() % allowed.size()]);
    }
  }
  return n_dependent;
}

// Grammars whose tokens cross rule ends: short rules joined by separators,
// recursion, nullable rules and nullable tails, repetitions with bounds.
const char* const crossing_gbnf[] = {
    R"g(root ::= word ("," " "? word)* "."
word ::= [a-z]+)g",
    R"g(root ::= item
item ::= "(" item* ")" | [a-z]+ | "<" item ">" item?)g",
    R"g(root ::= a b c d "!"
a ::= "x"?
b ::= ( | "y" | "yy" )
c ::= [a-z]*
d ::= e
e ::= | " " d)g",
    R"g(root ::= "\"" [^"\\]{0,6} "\"" ( ":" root )?)g",
};

}  // namespace

TEST_CASE("mask tables: the table path equals the full walk where tokens cross rule ends") {
  int n_dependent = 0;
  for (std::size_t i = 0; i < std::size(crossing_gbnf); ++i) {
    INFO("grammar " << i);
    n_dependent += check_tables(crossing_gbnf[i], stories_vocab(), 8, 16, 10 + static_cast<std::uint32_t>(i));
    n_dependent += check_tables(crossing_gbnf[i], llama3_vocab(), 1, 5, 20 + static_cast<std::uint32_t>(i));
  }
  n_dependent += check_tables(json_gbnf, stories_vocab(), 6, 20, 30);
  n_dependent += check_tables(json_gbnf, llama3_vocab(), 1, 6, 31);
  n_dependent += check_tables(unicode_gbnf, llama3_vocab(), 1, 4, 32);
  CHECK(n_dependent > 20);  // the dependent-token path ran, not only accepted sets
}

TEST_CASE("mask tables: pairs read on first use give the same masks as pairs read up front") {
  // No pair read up front: every pair table comes from `at` during the walks.
  int n_dependent = 0;
  for (std::size_t i = 0; i < std::size(crossing_gbnf); ++i)
    n_dependent += check_tables(crossing_gbnf[i], stories_vocab(), 6, 14, 50 + static_cast<std::uint32_t>(i), 0, 0);
  n_dependent += check_tables(json_gbnf, stories_vocab(), 4, 20, 60, 0, 0);
  CHECK(n_dependent > 10);
  const token_masker m(std::make_shared<const automaton>(parse_gbnf(json_gbnf)), stories_vocab(), 1024, 0, 0);
  const std::size_t deferred = m.tables().n_deferred(), tables = m.tables().size();
  REQUIRE(deferred > 0);
  state_id s = m.grammar_automaton().start();
  for (char ch : std::string_view(R"({"ab": [1, "x y"]})")) {
    (void)m.allowed(s);
    s = m.grammar_automaton().advance(s, std::string_view(&ch, 1));
    REQUIRE(s != dead_state);
  }
  CHECK(m.tables().n_deferred() < deferred);  // read on first use, once
  CHECK(m.tables().size() == tables + (deferred - m.tables().n_deferred()));
}

TEST_CASE("mask tables: elements with many dependent tokens take the full walk, with the same masks") {
  // A limit of 2 dependent tokens sends most string and word elements to the walk.
  for (std::size_t i = 0; i < std::size(crossing_gbnf); ++i) check_tables(crossing_gbnf[i], stories_vocab(), 4, 12, 40, 2);
  const token_masker m(std::make_shared<const automaton>(parse_gbnf(json_gbnf)), stories_vocab(), 1024, 2);
  CHECK(m.tables().n_walk() > 0);
  CHECK(m.tables().n_walk() < m.tables().size());
}

TEST_CASE("mask tables: classification of one element") {
  // From the class [a-z] of `word` alone, "ab" stays inside the rule (accepted),
  // "a," runs past its end (dependent), ",a" dies at once (rejected).
  auto v = std::make_shared<token_vocabulary>();
  v->bytes = {"ab", "a,", ",a", "a", "", "a, b"};
  v->trie = vocabulary_trie(v->bytes, std::vector<bool>(v->bytes.size(), false));
  v->eos = {4};
  const compiled_grammar g = parse_gbnf("root ::= word (\",\" \" \"? word)*\nword ::= [a-z]+");
  const auto a = std::make_shared<const automaton>(g);
  const token_masker m(a, v, 1024, 16);  // the default limit (n_vocab / 8) is 0 for 6 tokens
  std::uint32_t p = 0;
  while (g.elements[p].type != element::kind::char_class || !g.classes[g.elements[p].value].contains(U'q')) ++p;
  const element_tokens& e = m.tables().at(p);
  CHECK(e.accepted.contains(0));
  CHECK(e.accepted.contains(3));
  CHECK_FALSE(e.accepted.contains(1));
  CHECK_FALSE(e.accepted.contains(2));
  CHECK_FALSE(e.accepted.contains(4));
  std::vector<token_id> dependent;
  for (std::uint32_t k : e.dependent) dependent.push_back(v->trie.node_tokens()[k]);
  CHECK(dependent == std::vector<token_id>{1, 5});  // in byte order: "a," then "a, b"
  // At the start a word must come first: ",a" and EOS are rejected; "a," and
  // "a, b" pass only through the stack below the word (the list goes on).
  const token_mask first = m.compute_allowed(a->start());
  CHECK(first.to_bitset() == m.compute_mask(a->start()));
  for (token_id t : {0, 1, 3, 5}) CHECK(first.contains(t));
  CHECK_FALSE(first.contains(2));
  CHECK_FALSE(first.contains(4));
  // After "a" the word may go on, the list continue, or the text end: all pass.
  const state_id s = a->advance(a->start(), "a");
  const token_mask allowed = m.compute_allowed(s);
  CHECK(allowed.to_bitset() == m.compute_mask(s));
  for (token_id t : {0, 1, 2, 3, 4, 5}) CHECK(allowed.contains(t));
  // Bad frames for a table's position are named.
  const auto n = static_cast<std::uint32_t>(g.elements.size());
  CHECK_THAT(error_of([&] { (void)a->stack_state({}); }), Catch::Contains("no frames"));
  CHECK_THAT(error_of([&] { (void)a->stack_state(std::vector<std::uint32_t>{n}); }),
             Catch::Contains("element " + std::to_string(n) + " is outside the grammar"));
  std::uint32_t ref = 0;
  while (g.elements[ref].type != element::kind::rule_ref) ++ref;
  CHECK_THAT(error_of([&] { (void)a->stack_state(std::vector<std::uint32_t>{p, ref}); }),
             Catch::Contains("top element " + std::to_string(ref) + " is not a character class"));
  CHECK(a->stack_state(std::vector<std::uint32_t>{p}) != dead_state);
}

TEST_CASE("token_mask: the smallest form, and the same set in every form") {
  std::mt19937 rng(7);
  for (std::size_t n : {1u, 63u, 64u, 65u, 1000u, 4096u, 128256u}) {
    for (double density : {0.0, 0.001, 0.02, 0.5, 0.98, 0.999, 1.0}) {
      token_bitset b((n + 63) / 64, 0);
      std::bernoulli_distribution keep(density);
      std::vector<token_id> in;
      for (std::size_t t = 0; t < n; ++t)
        if (keep(rng)) {
          set_bit(b, static_cast<token_id>(t));
          in.push_back(static_cast<token_id>(t));
        }
      const token_mask m = token_mask::from_bitset(b, n);
      INFO("n " << n << " density " << density);
      REQUIRE(m.count() == in.size());
      REQUIRE(m.to_bitset() == b);
      const std::size_t list_max = n / 32;
      if (in.size() <= list_max) CHECK(m.storage() == token_mask::form::allowed);
      else if (n - in.size() <= list_max) CHECK(m.storage() == token_mask::form::forbidden);
      else CHECK(m.storage() == token_mask::form::bitset);
      for (std::size_t t = 0; t < n; t += 1 + n / 500) REQUIRE(m.contains(static_cast<token_id>(t)) == test_bit(b, static_cast<token_id>(t)));
      // Adding tokens gives the union, whatever the form.
      std::vector<token_id> extra;
      for (int k = 0; k < 5; ++k) extra.push_back(static_cast<token_id>(rng() % n));
      std::sort(extra.begin(), extra.end());
      extra.erase(std::unique(extra.begin(), extra.end()), extra.end());
      token_bitset u = b;
      for (token_id t : extra) set_bit(u, t);
      const token_mask w = m.with(extra);
      REQUIRE(w.to_bitset() == u);
      REQUIRE(w.count() == token_mask::from_bitset(u, n).count());
    }
  }
}

TEST_CASE("grammar_processor: each mask form keeps exactly the allowed logits, dense or sparse") {
  const auto vocab = llama3_vocab();
  const auto& tok = llama3_tok();
  // "{" allows a handful (allowed list), inside the string nearly all (forbidden list or bitset).
  const auto masker = compile_cached(R"(root ::= "{" [a-z]{0,3} "\"" [^"]* "\"" "}")", vocab);
  const grammar_processor p(masker);
  std::vector<float> row(tok.vocab_size());
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
  const std::vector<token_id> prompt{tok.bos()};
  std::vector<std::vector<token_id>> histories = {prompt};
  histories.push_back({tok.bos(), static_cast<token_id>(tok.find("{").value())});
  histories.push_back({tok.bos(), static_cast<token_id>(tok.find("{").value()), static_cast<token_id>(tok.find("\"").value())});
  std::set<token_mask::form> forms;
  sampling::candidates c;
  std::vector<float> out(row.size());
  for (const auto& h : histories) {
    const sampling::sampling_context ctx{.history = h, .n_prompt = 1};
    const token_mask& m = *masker->allowed(p.sync(ctx));
    forms.insert(m.storage());
    c.reset_copy(row);
    p.apply(c, ctx);
    c.to_logits(out);
    for (std::size_t t = 0; t < row.size(); ++t)
      REQUIRE(out[t] == (m.contains(static_cast<token_id>(t)) ? row[t] : -std::numeric_limits<float>::infinity()));
    // Sparse candidates (after a truncation): kept exactly when allowed.
    std::vector<token_id> ids;
    std::vector<float> vals;
    for (std::size_t t = 0; t < row.size(); t += 97) {
      ids.push_back(static_cast<token_id>(t));
      vals.push_back(row[t]);
    }
    ids.push_back(m.storage() == token_mask::form::forbidden ? 0 : m.ids().empty() ? 0 : m.ids()[0]);
    vals.push_back(9.0f);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    vals.resize(ids.size(), 1.0f);
    c.reset_copy(row);
    c.assign_sparse(ids, vals, sampling::candidates::order::any);
    std::size_t n_allowed = 0;
    for (token_id t : ids) n_allowed += m.contains(t) ? 1 : 0;
    if (n_allowed == 0) continue;
    p.apply(c, ctx);
    REQUIRE(c.size() == n_allowed);
    for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(m.contains(c.token(i)));
  }
  CHECK(forms.count(token_mask::form::allowed) == 1);
  CHECK(forms.size() >= 2);
}

TEST_CASE("json schema: documents valid under the schema match, invalid ones do not") {
  const auto matches = [](const char* schema, std::string_view doc) {
    const automaton a{parse_gbnf(schema_to_gbnf(std::string_view(schema)))};
    return full_match(a, doc);
  };
  const char* person = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "uuid"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null]}, "minItems": 1, "maxItems": 2}},
      "required": ["name", "age"], "additionalProperties": false})";
  CHECK(matches(person, R"({"name": "Ann", "age": 150})"));
  CHECK(matches(person, R"({ "name" : "Ann" , "age" : 7 , "tags" : [ 3 , null ] })"));
  CHECK(matches(person, R"({"name": "", "age": 0, "email": "123e4567-e89b-12d3-a456-426614174000", "tags": ["a"]})"));
  CHECK_FALSE(matches(person, R"({"name": "Ann"})"));                  // required missing
  CHECK_FALSE(matches(person, R"({"name": "Annabel", "age": 3})"));    // maxLength
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 151})"));        // maximum
  CHECK_FALSE(matches(person, R"({"name": "A", "age": -1})"));         // minimum
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 1, "x": 1})"));  // additionalProperties
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 1, "tags": []})"));
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 1, "tags": ["a", "b", "a"]})"));
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 1, "tags": ["c"]})"));
  CHECK_FALSE(matches(person, R"({"name": "A", "age": 1, "email": "not-a-uuid"})"));

  const char* tree = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": ["number", "null"]}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}})";
  CHECK(matches(tree, R"({"v": 1.5, "kids": [{"v": null}, {"v": -2e3, "kids": []}]})"));
  CHECK_FALSE(matches(tree, R"({"v": 1, "kids": [{"w": 1}]})"));

  const char* misc = R"({"type": "array", "prefixItems": [{"const": "x"}, {"type": "boolean"}],
      "items": {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}})";
  CHECK(matches(misc, R"(["x", true, "2024-02-29", "2024-02-29T12:30:00Z"])"));
  CHECK(matches(misc, R"(["x"])"));
  CHECK(matches(misc, "[]"));
  CHECK_FALSE(matches(misc, R"(["y"])"));
  CHECK_FALSE(matches(misc, R"(["x", true, "2024-13-01"])"));
  CHECK_FALSE(matches(misc, R"(["x", true, "2024-01-01T25:00:00Z"])"));
  {  // format date: exactly the calendar's dates (leap years by the Gregorian rule)
    const automaton date{parse_gbnf(schema_to_gbnf(std::string_view(R"({"type": "string", "format": "date"})")))};
    for (const int year : {0, 4, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9999})
      for (int month = 0; month <= 13; ++month)
        for (int day = 0; day <= 32; ++day) {
          const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
          const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
          const bool valid = month >= 1 && month <= 12 && day >= 1 && day <= days[month - 1];
          char doc[32];
          std::snprintf(doc, sizeof doc, "\"%04d-%02d-%02d\"", year, month, day);
          INFO(doc);
          CHECK(full_match(date, doc) == valid);
        }
  }
  CHECK(matches(R"({"type": "string", "format": "time"})", R"("23:59:60.5+01:00")") == false);
  CHECK(matches(R"({"type": "string", "format": "time"})", R"("23:59:59.5+01:00")"));

  const char* merged = R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "boolean"}}}]})";
  CHECK(matches(merged, R"({"a": 1, "b": false})"));
  CHECK(matches(merged, R"({"a": 1})"));
  CHECK_FALSE(matches(merged, R"({"b": true})"));

  const char* code = R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(?:x|yz)*$"})";
  CHECK(matches(code, R"("AB-123")"));
  CHECK(matches(code, R"("QZ-000xyzx")"));
  CHECK_FALSE(matches(code, R"("AB-12")"));
  CHECK_FALSE(matches(code, R"("ab-123")"));
  CHECK_FALSE(matches(code, R"("AB-123y")"));
  const char* unanchored = R"({"type": "string", "pattern": "c[aeiou]t"})";
  CHECK(matches(unanchored, R"("a cat!")"));
  CHECK(matches(unanchored, R"("cut")"));
  CHECK_FALSE(matches(unanchored, R"("dog")"));
  const char* quoted = R"({"type": "string", "pattern": "^a\"[^b]\\\\.$"})";
  CHECK(matches(quoted, R"("a\"\"\\é")"));
  CHECK(matches(quoted, R"("a\"c\\x")"));
  CHECK_FALSE(matches(quoted, R"("a\"b\\x")"));
  CHECK_FALSE(matches(quoted, R"("a"c\\x")"));
  const automaton any{parse_gbnf(json_object_gbnf())};
  CHECK(full_match(any, R"({"k": [1, {"z": "\u0041"}, true, null, -0.5e-3]})"));
  CHECK_FALSE(full_match(any, R"([1])"));
  CHECK_FALSE(full_match(any, R"({"k": tru})"));
  CHECK(matches(R"({"type": "integer", "minimum": -5, "maximum": 5})", "-5"));
  CHECK_FALSE(matches(R"({"type": "integer", "minimum": -5, "maximum": 5})", "6"));
  CHECK(matches(R"({"type": "object", "additionalProperties": {"type": "integer"}})", R"({"x": 1, "y": 2})"));
  CHECK_FALSE(matches(R"({"type": "object", "additionalProperties": {"type": "integer"}})", R"({"x": "1"})"));
}

TEST_CASE("json schema: bad or unsupported schemas name their path") {
  const auto err = [](const char* schema, json_schema_options o = {}) {
    return error_of([&] { (void)schema_to_gbnf(std::string_view(schema), o); });
  };
  CHECK_THAT(err("{\"type\": "), Catch::Contains("not valid JSON"));
  CHECK_THAT(err(R"({"properties": {"a": {"type": "string", "pattern": "^(?=a)a+$"}}})"),
             Catch::Contains("#/properties/a/pattern") && Catch::Contains("not supported"));
  CHECK(err(R"({"properties": {"a": {"type": "string", "pattern": "^(?=a)a+$"}}})", {.strict = false}).empty());
  CHECK_THAT(err(R"({"type": "string", "pattern": "\\bx"})"), Catch::Contains("#/pattern"));
  CHECK_THAT(err(R"({"type": "string", "pattern": "a(b"})"), Catch::Contains("unclosed '('"));
  CHECK_THAT(err(R"({"type": "string", "pattern": "a+?"})"), Catch::Contains("lazy"));
  CHECK_THAT(err(R"({"type": "string", "pattern": "x", "maxLength": 3})"), Catch::Contains("#/pattern"));
  CHECK_THAT(err(R"({"uniqueItems": true})"), Catch::Contains("#/uniqueItems"));
  CHECK_THAT(err(R"({"type": "strin"})"), Catch::Contains("#/type") && Catch::Contains("unknown type 'strin'"));
  CHECK_THAT(err(R"({"$ref": "#/$defs/missing"})"), Catch::Contains("#/$defs/missing"));
  CHECK_THAT(err(R"({"type": "array", "minItems": 3, "maxItems": 2})"), Catch::Contains("below minItems"));
  CHECK_THAT(err(R"({"type": "array", "minItems": -1})"), Catch::Contains("#/minItems"));
  CHECK_THAT(err(R"({"type": "string", "format": "email"})"), Catch::Contains("#/format"));
  CHECK_THAT(err(R"({"properties": {"a": false}})"), Catch::Contains("#/properties/a") && Catch::Contains("matches nothing"));
  CHECK_THAT(err(R"({"properties": {"a": {}}, "required": ["b"]})"), Catch::Contains("#/required"));
  CHECK_THAT(err(R"({"anyOf": []})"), Catch::Contains("#/anyOf"));
  CHECK_THAT(err(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})"), Catch::Contains("#/allOf/0"));
  // A deeply nested schema is bounded.
  std::string deep = "{\"type\": \"integer\"}";
  for (int i = 0; i < 200; ++i) deep = "{\"type\": \"array\", \"items\": " + deep + "}";
  CHECK_THAT(err(deep.c_str()), Catch::Contains("nested deeper than"));
  std::string defs = "{\"$ref\": \"#/$defs/d0\", \"$defs\": {";
  for (int i = 0; i < 300; ++i) defs += "\"d" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) + "\"}, ";
  defs += "\"d300\": {\"type\": \"null\"}}}";
  CHECK_THAT(err(defs.c_str()), Catch::Contains("nested deeper than"));
}

TEST_CASE("compile_cached with a warm-up: a grammar past a limit throws every time and is not kept") {
  const auto vocab = stories_vocab();
  // Each '(' nests root once more: the warm-up walks past 32 nested rules.
  const std::string deep = "root ::= \"(\" root \")\" | \"(\" root | \"x\"";
  const automaton_limits tight{.max_stack_depth = 32};
  for (int attempt = 0; attempt < 2; ++attempt)
    CHECK_THAT(error_of([&] { (void)compile_cached(deep, vocab, {}, tight, 256); }), Catch::Contains("deeper than 32"));
  // Without the warm-up the same grammar compiles (the limit would be met mid-generation).
  const auto lazy = compile_cached(deep, vocab, {}, tight);
  CHECK(lazy != nullptr);
  // A grammar that passes is cached under its warm-up too.
  const auto fine = compile_cached("root ::= \"yes\" | \"no\"", vocab, {}, tight, 256);
  CHECK(compile_cached("root ::= \"yes\" | \"no\"", vocab, {}, tight, 256) == fine);
  CHECK(compile_cached("root ::= \"yes\" | \"no\"", vocab, {}, tight) != fine);
}

TEST_CASE("grammar_processor: masks, follows the history, rolls back, and refuses what the grammar cannot continue") {
  const auto vocab = stories_vocab();
  const auto& tok = stories_tok();
  const auto masker = compile_cached("root ::= \" Once upon a time\" \".\"?", vocab);
  CHECK(compile_cached("root ::= \" Once upon a time\" \".\"?", vocab) == masker);  // cached by content
  const grammar_processor p(masker);
  const std::vector<token_id> prompt{tok.bos()};
  std::vector<token_id> history = prompt;
  std::vector<float> logits(tok.vocab_size(), 0.0f);
  sampling::candidates c;
  const auto ctx = [&] { return sampling::sampling_context{.history = history, .n_prompt = prompt.size()}; };
  // Greedy-like walk: take the smallest allowed token until the text is complete.
  std::string text;
  for (int step = 0; step < 40; ++step) {
    c.reset_copy(logits);
    p.apply(c, ctx());
    token_id pick = -1;
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c.values()[i] != -std::numeric_limits<float>::infinity()) {
        pick = c.token(i);
        break;
      }
    REQUIRE(pick >= 0);
    if (pick == tok.eos()) break;
    history.push_back(pick);
    tok.decode_token(pick, text);
  }
  CHECK((text == " Once upon a time" || text == " Once upon a time."));
  CHECK(p.can_end(ctx()));
  // Roll back two tokens: the processor follows the shorter history.
  const std::size_t full = history.size();
  history.resize(full - 2);
  CHECK_FALSE(p.can_end(ctx()));
  c.reset_copy(logits);
  p.apply(c, ctx());
  for (std::size_t i = 0; i < c.size(); ++i)
    if (c.token(i) == tok.eos()) CHECK(c.values()[i] == -std::numeric_limits<float>::infinity());
  // A token the grammar forbids in the history is an error, as is a dead end.
  history.push_back(static_cast<token_id>(tok.find("x").value_or(100)));
  CHECK_THAT(error_of([&] { p.apply(c, ctx()); }), Catch::Contains("not allowed by the grammar"));
  // Earlier processors that removed every allowed token.
  history.resize(prompt.size());
  std::vector<float> only_eos(tok.vocab_size(), -std::numeric_limits<float>::infinity());
  only_eos[static_cast<std::size_t>(tok.eos())] = 0.0f;
  c.reset_copy(only_eos);
  CHECK_THAT(error_of([&] { p.apply(c, ctx()); }), Catch::Contains("logit -inf"));
  std::vector<float> wrong(7, 0.0f);
  c.reset_copy(wrong);
  CHECK_THAT(error_of([&] { p.apply(c, ctx()); }), Catch::Contains("vocabulary"));
}

namespace {
// Hand-written checks of a generated document against each generation schema.
bool satisfies(int which, const nlohmann::json& d) {
  switch (which) {
    case 0:
      return d.is_object() && d.size() <= 3 && d.contains("name") && d["name"].is_string() &&
             d["name"].get<std::string>().size() <= 12 && d.contains("age") && d["age"].is_number_integer() &&
             d["age"].get<int>() >= 0 && d["age"].get<int>() <= 120 &&
             (!d.contains("happy") || d["happy"].is_boolean());
    case 1: {
      if (!d.is_array() || d.empty() || d.size() > 3) return false;
      for (const auto& e : d)
        if (!e.is_string() || (e != "cat" && e != "dog" && e != "bird")) return false;
      return true;
    }
    case 2:
      return d.is_object() && d.size() == 2 && d["when"].is_string() && d["when"].get<std::string>().size() == 10 &&
             d["id"].is_string() && d["id"].get<std::string>().size() == 36;
    default: return false;
  }
}
}  // namespace

TEST_CASE("grammar_processor: generation on stories260K at temperature 1 gives documents valid under the schema") {
  const auto vocab = stories_vocab();
  const auto file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::llama_model m{file};
  const std::vector<const char*> schemas{
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}, "happy": {"type": "boolean"}},
          "required": ["name", "age"]})",
      R"({"type": "array", "items": {"enum": ["cat", "dog", "bird"]}, "minItems": 1, "maxItems": 3})",
      R"({"type": "object", "properties": {"when": {"type": "string", "format": "date"},
          "id": {"type": "string", "format": "uuid"}}, "required": ["when", "id"]})"};
  const auto& tok = stories_tok();
  for (int which = 0; which < static_cast<int>(schemas.size()); ++which) {
    const auto masker = compile_cached(schema_to_gbnf(std::string_view(schemas[which])), vocab);
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 512});
      const grammar_processor p(masker);
      sampling::runtime_chain chain({grammar_processor(masker), sampling::temperature{1.0f}});
      const std::vector<token_id> prompt{tok.bos()};
      (void)p;
      const auto r = search::generate(m, cache, prompt, chain, sampling::categorical{},
                                      {.stop = {.max_new_tokens = 400, .eos_tokens = {tok.eos()}}, .seed = seed});
      INFO("schema " << which << " seed " << seed << " output '" << tok.decode(r.tokens) << "'");
      REQUIRE(r.reason == finish_reason::eos);
      const std::string text = tok.decode(std::span<const token_id>(r.tokens.data(), r.tokens.size() - 1));
      const auto doc = nlohmann::json::parse(text, nullptr, false);
      REQUIRE_FALSE(doc.is_discarded());
      CHECK(satisfies(which, doc));
    }
  }
}
