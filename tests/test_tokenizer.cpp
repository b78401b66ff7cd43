// SPDX-License-Identifier: MIT
// model/tokenizer.hpp: SentencePiece BPE against a naive oracle, merges,
// byte fallback, round trips and bad input.
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "reference/model_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;
using llmkit::token_id;

namespace {
struct stories {
  gguf_file file = gguf_file::open(LLMKIT_DEFAULT_MODEL);
  tokenizer tok = tokenizer::from_gguf(file);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  stories() {
    for (auto t : file.get_array("tokenizer.ggml.tokens").strings()) tokens.emplace_back(t);
    const auto& s = file.get_array("tokenizer.ggml.scores");
    for (std::size_t i = 0; i < s.size(); ++i) scores.push_back(s.get<float>(i));
  }
};
const stories& model_vocab() {
  static const stories s;
  return s;
}

tokenizer toy(std::vector<std::string> tokens, std::vector<float> scores, bool prefix = false) {
  std::vector<token_type> types;
  for (const auto& t : tokens)
    types.push_back(t.size() == 6 && t.rfind("<0x", 0) == 0 ? token_type::byte : token_type::normal);
  types[0] = token_type::unknown;
  return tokenizer(std::move(tokens), std::move(scores), std::move(types), {.bos = -1, .eos = -1, .unk = 0}, prefix);
}

std::vector<std::string> texts(const tokenizer& t, const std::vector<token_id>& ids) {
  std::vector<std::string> out;
  for (auto id : ids) out.emplace_back(t.token_text(id));
  return out;
}
}  // namespace

TEST_CASE("tokenizer: metadata of stories260K") {
  const auto& tok = model_vocab().tok;
  REQUIRE(tok.vocab_size() == 512);
  REQUIRE(tok.bos() == 1);
  REQUIRE(tok.eos() == 2);
  REQUIRE(tok.unk() == 0);
  REQUIRE(tok.add_space_prefix());
  REQUIRE(tok.type(1) == token_type::control);
  REQUIRE(tok.type(3) == token_type::byte);
  REQUIRE(tok.token_text(259) == "\xe2\x96\x81t");
  REQUIRE(tok.score(262) == -3.0f);
  REQUIRE(tok.find("<s>") == 1);
  REQUIRE_FALSE(tok.find("not a token").has_value());
}

TEST_CASE("tokenizer: encodes a known prompt into whole-word pieces") {
  const auto& tok = model_vocab().tok;
  const auto ids = tok.encode("Once upon a time", {.add_bos = true});
  REQUIRE(ids.front() == 1);
  REQUIRE(texts(tok, ids) == std::vector<std::string>{"<s>", "\xe2\x96\x81Once", "\xe2\x96\x81upon", "\xe2\x96\x81" "a",
                                                      "\xe2\x96\x81time"});
  REQUIRE(tok.decode(ids) == " Once upon a time");
  REQUIRE(tok.decode(ids, {.strip_prefix_space = true}) == "Once upon a time");
  REQUIRE(tok.encode("").empty());
  REQUIRE(tok.encode("", {.add_bos = true}) == std::vector<token_id>{1});
}

TEST_CASE("tokenizer: matches the naive BPE oracle and round-trips random ASCII and non-ASCII text") {
  const auto& v = model_vocab();
  const std::vector<std::string> alphabet{"a", "e", "t", "h", "o", "n", "s", " ", " ", ".", ",", "L", "i", "y",
                                          "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x99\x82", "\xd0\xb6", "\n", "!",
                                          "the", "and", "Lily", "\xe2\x96\x81"};
  std::mt19937 rng(2024);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(0, 30);
  for (int trial = 0; trial < 400; ++trial) {
    std::string s;
    for (int n = length(rng); n > 0; --n) s += alphabet[pick(rng)];
    INFO("text '" << s << "'");
    const auto ids = v.tok.encode(s);
    REQUIRE(ids == reference::spm_encode(v.tokens, v.scores, s, true, 0));
    if (s.find("\xe2\x96\x81") == std::string::npos) REQUIRE(v.tok.decode(ids) == (s.empty() ? "" : " " + s));
  }
  const std::string utf8 = "Lily vit \xc3\xa0 Z\xc3\xbcrich \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82!";
  const auto ids = v.tok.encode(utf8);
  REQUIRE(v.tok.decode(ids, {.strip_prefix_space = true}) == utf8);
  // Multi-byte characters not in the vocabulary become byte tokens.
  REQUIRE(texts(v.tok, v.tok.encode("\xf0\x9f\x99\x82")) ==
          std::vector<std::string>{"\xe2\x96\x81", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"});
}

TEST_CASE("tokenizer: merges by score, leftmost on ties, and falls back to bytes") {
  {  // Ties go to the leftmost pair.
    const auto t = toy({"<unk>", "a", "aa"}, {0, -1, -1});
    REQUIRE(texts(t, t.encode("aaa")) == std::vector<std::string>{"aa", "a"});
    REQUIRE(texts(t, t.encode("aaaaa")) == std::vector<std::string>{"aa", "aa", "a"});
  }
  {  // The higher score wins wherever it is.
    const auto t = toy({"<unk>", "a", "b", "c", "ab", "bc"}, {0, 0, 0, 0, -2, -1});
    REQUIRE(texts(t, t.encode("abc")) == std::vector<std::string>{"a", "bc"});
    const auto u = toy({"<unk>", "a", "b", "c", "ab", "bc"}, {0, 0, 0, 0, -1, -2});
    REQUIRE(texts(u, u.encode("abc")) == std::vector<std::string>{"ab", "c"});
  }
  {  // Merges chain: ab, then ab + c.
    const auto t = toy({"<unk>", "a", "b", "c", "ab", "abc", "bc"}, {0, 0, 0, 0, -1, -3, -2});
    REQUIRE(texts(t, t.encode("abc")) == std::vector<std::string>{"abc"});
    REQUIRE(texts(t, t.encode("abcabc")) == std::vector<std::string>{"abc", "abc"});
  }
  {  // The merge is only done when the whole concatenation is a token.
    const auto t = toy({"<unk>", "a", "b", "abb"}, {0, 0, 0, -1});
    REQUIRE(texts(t, t.encode("abb")) == std::vector<std::string>{"a", "b", "b"});
  }
  {  // Byte fallback, and unk without byte tokens.
    const auto t = toy({"<unk>", "a", "<0xC3>", "<0xA9>"}, {0, 0, 0, 0});
    REQUIRE(texts(t, t.encode("a\xc3\xa9")) == std::vector<std::string>{"a", "<0xC3>", "<0xA9>"});
    REQUIRE(t.decode(t.encode("a\xc3\xa9")) == "a\xc3\xa9");
    const auto u = toy({"<unk>", "a"}, {0, 0});
    REQUIRE(u.encode("a\xc3\xa9") == std::vector<token_id>{1, 0, 0});
  }
  {  // Dummy prefix and spaces.
    const auto t = toy({"<unk>", "\xe2\x96\x81", "x", "\xe2\x96\x81x"}, {0, 0, 0, -1}, true);
    REQUIRE(texts(t, t.encode("x x")) == std::vector<std::string>{"\xe2\x96\x81x", "\xe2\x96\x81x"});
    REQUIRE(t.decode(t.encode("x  x")) == " x  x");
  }
}

TEST_CASE("tokenizer: bad input raises llmkit::error naming the value") {
  const auto& tok = model_vocab().tok;
  const std::vector<token_id> bad{5, 512};
  REQUIRE_THROWS_WITH(tok.decode(bad), "tokenizer::decode: token id 512 is outside the vocabulary of 512 tokens");
  REQUIRE_THROWS_WITH(tok.token_text(-1), "tokenizer::token_text: token id -1 is outside the vocabulary of 512 tokens");
  REQUIRE_THROWS_WITH(tokenizer({"a"}, {0, 1}, {}, {}), "tokenizer: scores.size() = 2 differs from tokens.size() = 1");
  REQUIRE_THROWS_WITH(tokenizer({"a"}, {0}, {}, {.bos = 3}), "tokenizer: bos id 3 is outside the vocabulary of 1 tokens");
  REQUIRE_THROWS_WITH(tokenizer({"<0xZZ>"}, {0}, {token_type::byte}, {}),
                      "tokenizer: byte token 0 is '<0xZZ>', not <0xXX>");
}

TEST_CASE("tokenizer: special tokens are parsed only when asked, with the dummy prefix after each") {
  const auto& tok = model_vocab().tok;
  REQUIRE(tok.kind() == tokenizer_kind::sentencepiece);
  REQUIRE(tok.sentencepiece() != nullptr);
  REQUIRE(tok.bpe() == nullptr);
  REQUIRE(tok.add_bos_token());
  const auto plain = tok.encode("<s>Once</s>");
  for (auto id : plain) REQUIRE(tok.type(id) != token_type::control);
  REQUIRE(tok.decode(plain, {.strip_prefix_space = true}) == "<s>Once</s>");
  const auto parsed = tok.encode("<s>Once</s>", {.parse_special = true});
  REQUIRE(parsed == std::vector<token_id>{1, *tok.find("\xe2\x96\x81Once"), 2});
  REQUIRE(tok.decode(parsed) == " Once");
  REQUIRE(tok.decode(parsed, {.render_special = true}) == "<s> Once</s>");
  // Text at the start gets the prefix as without specials.
  REQUIRE(tok.encode("Once upon<s>", {.parse_special = true}) ==
          std::vector<token_id>{*tok.find("\xe2\x96\x81Once"), *tok.find("\xe2\x96\x81upon"), 1});
}

TEST_CASE("tokenizer: plain text never merges into a control token") {
  // "</s>" is reachable by merges ("</" + "s>"), but it is a control token.
  std::vector<std::string> tokens{"<unk>", "<", "/", "s", ">", "</", "s>", "</s>"};
  std::vector<token_type> types(tokens.size(), token_type::normal);
  types[0] = token_type::unknown;
  types[7] = token_type::control;
  const tokenizer t(tokens, {0, 0, 0, 0, 0, -1, -1, 5}, types, {.bos = -1, .eos = 7, .unk = 0}, false);
  REQUIRE(texts(t, t.encode("</s>")) == std::vector<std::string>{"</", "s>"});
  REQUIRE(texts(t, t.encode("a</s>")) == std::vector<std::string>{"<unk>", "</", "s>"});
  REQUIRE(t.encode("</s>", {.parse_special = true}) == std::vector<token_id>{7});
}

TEST_CASE("tokenizer: literal ranges keep special-token texts as text, the rest parsed as before") {
  const auto& tok = model_vocab().tok;
  const token_id bos = 1, eos = 2;
  auto count = [](const std::vector<token_id>& ids, token_id id) { return std::count(ids.begin(), ids.end(), id); };
  //                       0123456789012345678
  const std::string text = "<s>Hi</s>Ho</s><s>";
  // No ranges: every special parsed.
  const auto all = tok.encode(text, {.parse_special = true});
  REQUIRE(count(all, eos) == 2);
  REQUIRE(count(all, bos) == 2);
  // "Hi</s>Ho" literal: its </s> is text, the last </s> and both <s> are tokens.
  const std::vector<text_span> literal{{.offset = 3, .length = 8}};
  const auto some = tok.encode(text, {.parse_special = true, .literal = literal});
  REQUIRE(count(some, eos) == 1);
  REQUIRE(count(some, bos) == 2);
  REQUIRE(some.front() == bos);
  REQUIRE(tok.decode(some, {.render_special = true}) == "<s> Hi</s>Ho</s><s>");
  // A special token that only overlaps a range (starts before, ends inside) is not parsed either.
  const std::vector<text_span> overlap{{.offset = 7, .length = 1}};
  REQUIRE(count(tok.encode(text, {.parse_special = true, .literal = overlap}), eos) == 1);
  const std::vector<text_span> edge{{.offset = 2, .length = 1}, {.offset = 15, .length = 3}};
  const auto edges = tok.encode(text, {.parse_special = true, .literal = edge});
  REQUIRE(count(edges, bos) == 0);
  REQUIRE(count(edges, eos) == 2);
  // Literal ranges without special texts change nothing: the text between
  // parsed specials is encoded whole, across range boundaries.
  const std::string chat = "<s>Once upon a time</s>there was</s>";
  const std::vector<text_span> words{{.offset = 3, .length = 9}, {.offset = 12, .length = 7}, {.offset = 23, .length = 9}};
  REQUIRE(tok.encode(chat, {.add_bos = true, .parse_special = true, .literal = words}) ==
          tok.encode(chat, {.add_bos = true, .parse_special = true}));
  // Without parse_special the ranges do nothing.
  REQUIRE(tok.encode(text, {.literal = literal}) == tok.encode(text));
}
