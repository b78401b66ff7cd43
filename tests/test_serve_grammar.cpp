// SPDX-License-Identifier: MIT
// serve/: structured outputs in the engine (`generation_request::grammar`)
// on the vendored stories260K model. Every finished output, greedy and
// sampled, is accepted by the Earley oracle of its grammar and ends with EOS
// where the grammar may end; a request takes the same tokens alone and in a
// batch with unconstrained and other constrained requests (prefix reuse on
// and off), as n > 1 samples, with speculative decoding (drafts cut by the
// grammar, rollback on rejection) and under preemption; beam search keeps
// every hypothesis inside the grammar; a grammar that allows no token ends
// its request with an error; cancel frees everything; bad grammars are
// refused at submit.
#include <llmkit/core/executor.hpp>
#include <llmkit/grammar/json_schema.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/serve/serve.hpp>

#include <catch2/catch.hpp>

#include "reference/grammar_reference.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace llmkit;

namespace {

using cache_t = kv::prefix_cache<float, 16>;

struct stories {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model model{file};
  std::shared_ptr<const grammar::token_vocabulary> vocab = grammar::token_vocabulary::from_tokenizer(tok);
};
stories& loaded() {
  static stories s;
  return s;
}

/// A grammar, its GBNF text and the Earley oracle that checks outputs.
struct constrained {
  std::string gbnf;
  std::shared_ptr<const grammar::token_masker> masker;
};

constrained from_gbnf(std::string gbnf) {
  constrained c;
  c.masker = grammar::compile_cached(gbnf, loaded().vocab);
  c.gbnf = std::move(gbnf);
  return c;
}
constrained from_schema(const char* schema) { return from_gbnf(grammar::schema_to_gbnf(std::string_view(schema))); }

/// Bounded schemas (every output fits the token budget: the JSON whitespace
/// rule takes up to 20 characters per gap, which stories260K likes) and one
/// GBNF grammar.
const std::vector<constrained>& grammars() {
  static const std::vector<constrained> g{
      from_schema(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}, "happy": {"type": "boolean"}},
          "required": ["name", "age"], "additionalProperties": false})"),
      from_schema(R"({"type": "array", "items": {"enum": ["cat", "dog", "bird"]}, "minItems": 1, "maxItems": 3})"),
      from_gbnf("root ::= \"The \" animal \" is \" (\"big\" | \"small\") \".\"\nanimal ::= [a-z]{1,8}\n")};
  return g;
}

const std::vector<std::string> prompts{"Once upon a time", "Lily and Tom went to the park. Lily saw a big red ball.",
                                       "The cat sat on the mat. The dog", "One day, a little boy named Tim"};

/// What one request received.
struct outcome {
  std::vector<token_id> tokens;
  std::string text;
  serve::stream_event finish;
  int n_finish = 0;
};

serve::engine_options options(std::int64_t max_step_tokens = 512,
                              serve::prefix_reuse reuse = serve::prefix_reuse::enabled) {
  return {.max_context = 512,
          .policy = {.max_batch_seqs = 32, .max_step_tokens = max_step_tokens, .chunked_prefill = true},
          .reuse = reuse};
}

/// Runs `requests` (all submitted before the first step) on a fresh engine
/// stepped on this thread; returns what each received (samples of an n > 1
/// request, or hypotheses of a beam request, in turn).
std::vector<outcome> run(std::vector<serve::generation_request> requests, serve::engine_options o = options(),
                         std::size_t n_blocks = 512) {
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = n_blocks});
  serial_executor serial;
  serve::engine eng(s.model, cache, serial, o, &s.tok);
  std::map<request_id, outcome> got;
  std::vector<request_id> handles;
  for (auto& r : requests) {
    const std::size_t n = r.n;
    r.on_event = [&](const serve::stream_event& e) {
      outcome& out = got[e.handle];
      out.text += e.text;
      if (e.type == serve::event_type::token) {
        out.tokens.push_back(e.token);
      } else {
        ++out.n_finish;
        out.finish = e;
      }
    };
    const auto res = eng.submit(std::move(r));
    REQUIRE(res.accepted());
    for (std::size_t i = 0; i < n; ++i) handles.push_back(res.handle + i);
  }
  eng.run_until_idle();
  std::vector<outcome> out;
  for (request_id h : handles) {
    REQUIRE(got[h].n_finish == 1);
    out.push_back(got[h]);
  }
  REQUIRE(eng.stats().kv_blocks_used == 0);
  return out;
}

serve::generation_request request(const std::string& prompt, const constrained& g, const std::string& sampling,
                                  std::uint64_t seed, std::size_t max_new = 400) {
  return {.prompt = loaded().tok.encode(prompt, {.add_bos = true}),
          .sampling = sampling,
          .grammar = g.masker,
          .seed = seed,
          .stop = {.max_new_tokens = max_new},
          .on_event = {}};
}

/// Requires that `o` finished by EOS and that the bytes of its tokens
/// before it are a sentence of `g` (the Earley oracle's verdict).
void require_sentence(const outcome& o, const constrained& g) {
  auto& s = loaded();
  std::string bytes;
  for (std::size_t i = 0; i + 1 < o.tokens.size(); ++i) bytes += s.vocab->bytes[static_cast<std::size_t>(o.tokens[i])];
  INFO("output '" << bytes << "', grammar\n" << g.gbnf);
  REQUIRE(o.finish.finish == serve::finish_kind::stop);
  REQUIRE(o.finish.reason == finish_reason::eos);
  REQUIRE(o.tokens.back() == s.tok.eos());
  const grammar::compiled_grammar compiled = grammar::parse_gbnf(g.gbnf);
  const grammar::reference::earley oracle(compiled);  // keeps a reference to the grammar
  auto chart = oracle.start();
  const auto cps = grammar::reference::decode_utf8(bytes);
  REQUIRE(cps.has_value());
  REQUIRE(cps->tail.empty());
  for (char32_t cp : cps->code_points) REQUIRE(oracle.scan(chart, cp));
  REQUIRE(oracle.complete(chart));
}

const std::string sampled = "top_k(40);temperature(1.0);sample";

}  // namespace

TEST_CASE("serve grammar: greedy and sampled outputs are sentences of the grammar ending with EOS") {
  for (std::size_t gi = 0; gi < grammars().size(); ++gi) {
    INFO("grammar " << gi);
    std::vector<serve::generation_request> rs;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      rs.push_back(request(prompts[p], grammars()[gi], "greedy", 0));
      rs.push_back(request(prompts[p], grammars()[gi], sampled, 10 + p));
    }
    for (const outcome& o : run(rs)) require_sentence(o, grammars()[gi]);
  }
  // The JSON documents also parse and keep the schema's bounds.
  for (const outcome& o : run({request(prompts[0], grammars()[0], sampled, 3)})) {
    const auto doc = nlohmann::json::parse(o.text, nullptr, false);
    REQUIRE_FALSE(doc.is_discarded());
    REQUIRE(doc.at("name").get<std::string>().size() <= 10);
    REQUIRE(doc.at("age").get<int>() <= 120);
  }
}

TEST_CASE("serve grammar: a request takes the same tokens alone and in a mixed batch, with and without prefix reuse") {
  const constrained& g = grammars()[0];
  const auto alone_greedy = run({request(prompts[1], g, "greedy", 0)})[0];
  const auto alone_sampled = run({request(prompts[1], g, sampled, 42)})[0];
  require_sentence(alone_greedy, g);
  require_sentence(alone_sampled, g);
  for (const auto reuse : {serve::prefix_reuse::enabled, serve::prefix_reuse::disabled})
    for (const std::int64_t step_tokens : {512, 24}) {
      INFO("step tokens " << step_tokens << " reuse " << (reuse == serve::prefix_reuse::enabled));
      std::vector<serve::generation_request> rs;
      for (std::size_t i = 0; i < 6; ++i) {
        auto plain = request(prompts[i % prompts.size()], g, sampled, 100 + i, 30);
        plain.grammar = nullptr;  // unconstrained neighbours
        rs.push_back(std::move(plain));
        rs.push_back(request(prompts[(i + 1) % prompts.size()], grammars()[i % grammars().size()], sampled, 200 + i));
        if (i == 2) rs.push_back(request(prompts[1], g, "greedy", 0));
        if (i == 4) rs.push_back(request(prompts[1], g, sampled, 42));
      }
      const auto got = run(rs, options(step_tokens, reuse));
      REQUIRE(got[6].tokens == alone_greedy.tokens);
      REQUIRE(got[6].text == alone_greedy.text);
      REQUIRE(got[11].tokens == alone_sampled.tokens);
      REQUIRE(got[11].text == alone_sampled.text);
      const std::size_t neighbours[6] = {1, 3, 5, 8, 10, 13};  // the other constrained requests
      for (std::size_t i = 0; i < 6; ++i) require_sentence(got[neighbours[i]], grammars()[i % grammars().size()]);
    }
  // Preempted and recomputed in a tiny pool: the same tokens.
  std::vector<serve::generation_request> crowd;
  for (std::size_t i = 0; i < 8; ++i) crowd.push_back(request(prompts[1], g, sampled, 42));
  for (const outcome& o : run(crowd, options(64), 40)) REQUIRE(o.tokens == alone_sampled.tokens);
}

TEST_CASE("serve grammar: n samples keep a grammar position each and equal requests of their own") {
  const constrained& g = grammars()[1];
  auto r = request(prompts[2], g, sampled, 5);
  r.n = 4;
  r.stream = 9;
  const auto samples = run({r});
  REQUIRE(samples.size() == 4);
  std::set<std::vector<token_id>> distinct;
  for (std::size_t i = 0; i < 4; ++i) {
    require_sentence(samples[i], g);
    auto own = request(prompts[2], g, sampled, 5);
    own.stream = 9 + i;
    REQUIRE(run({own})[0].tokens == samples[i].tokens);
    distinct.insert(samples[i].tokens);
  }
  REQUIRE(distinct.size() > 1);  // the samples are not copies of one position
}

TEST_CASE("serve grammar: speculative decoding cuts guesses at the grammar and takes the plain tokens") {
  // A grammar whose sentences repeat themselves, so that prompt lookup guesses.
  const constrained rep = from_gbnf("root ::= (\"the cat. \" | \"the dog. \" | \"a \" [a-z]{1,4} \". \"){2,6}\n");
  for (const constrained* g : {&rep, &grammars()[0], &grammars()[1]}) {
    std::vector<serve::generation_request> plain;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      plain.push_back(request(prompts[i], *g, "greedy", 0));
      plain.push_back(request(prompts[i], *g, sampled, 30 + i));
    }
    auto drafting = plain;
    for (auto& r : drafting) r.speculative = {.drafter = serve::draft_source::ngram, .max_tokens = 4};
    const auto want = run(plain);
    for (const std::int64_t step_tokens : {512, 32}) {
      const auto got = run(drafting, options(step_tokens));
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("request " << i);
        REQUIRE(got[i].tokens == want[i].tokens);
        REQUIRE(got[i].text == want[i].text);
        require_sentence(got[i], *g);
      }
    }
  }
  // Guesses were made and some were rejected (rolled back) on the repetitive grammar.
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = 512});
  serial_executor serial;
  serve::engine eng(s.model, cache, serial, options(), &s.tok);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    auto r = request(prompts[i], rep, sampled, 60 + i);
    r.speculative = {.drafter = serve::draft_source::ngram, .max_tokens = 4};
    r.on_event = [](const serve::stream_event&) {};
    REQUIRE(eng.submit(std::move(r)).accepted());
  }
  eng.run_until_idle();
  const auto st = eng.stats();
  REQUIRE(st.n_draft_tokens_accepted > 0);
  REQUIRE(st.n_draft_tokens > st.n_draft_tokens_accepted);
}

TEST_CASE("serve grammar: beam search keeps every hypothesis inside the grammar, forked with its beam") {
  for (const std::size_t gi : {0u, 2u}) {
    const constrained& g = grammars()[gi];
    for (const std::size_t width : {1u, 3u}) {
      INFO("grammar " << gi << " width " << width);
      auto r = request(prompts[0], g, "greedy", 0);
      r.beam = serve::beam_options{.width = width, .length_penalty = 1.0f};
      r.n = width;
      std::vector<serve::generation_request> rs{r, request(prompts[1], g, sampled, 7)};
      const auto got = run(rs);
      REQUIRE(got.size() == width + 1);
      for (const outcome& o : got) require_sentence(o, g);
      for (std::size_t i = 0; i < width; ++i) REQUIRE(got[i].finish.beam_logprob <= 0.0);
      if (width == 3) REQUIRE(got[0].tokens != got[1].tokens);
    }
  }
}

TEST_CASE("serve grammar: a grammar that allows no token ends its request with an error, others go on") {
  auto& s = loaded();
  // A vocabulary without EOS: after "ab" the grammar may only end, which no token does.
  auto no_eos = std::make_shared<grammar::token_vocabulary>(*s.vocab);
  no_eos->eos.clear();
  const auto dead_end = std::make_shared<const grammar::token_masker>(
      std::make_shared<const grammar::automaton>(grammar::parse_gbnf("root ::= \"ab\"\n")),
      std::shared_ptr<const grammar::token_vocabulary>(no_eos));
  auto bad = request(prompts[0], grammars()[0], sampled, 1, 50);
  bad.grammar = dead_end;
  const auto got = run({bad, request(prompts[0], grammars()[2], sampled, 2)});
  REQUIRE(got[0].finish.finish == serve::finish_kind::error);
  REQUIRE_THAT(got[0].finish.error, Catch::Contains("grammar allows no token"));
  std::string bytes;
  for (token_id t : got[0].tokens) bytes += s.vocab->bytes[static_cast<std::size_t>(t)];
  REQUIRE(bytes == "ab");  // never a random token past the end
  require_sentence(got[1], grammars()[2]);

  // The same with beam search.
  auto beam = bad;
  beam.sampling = "greedy";
  beam.beam = serve::beam_options{.width = 2};
  const auto b = run({beam});
  REQUIRE(b[0].finish.finish == serve::finish_kind::error);
  REQUIRE_THAT(b[0].finish.error, Catch::Contains("grammar allows no token"));
}

TEST_CASE("serve grammar: cancel frees a constrained request, bad grammars are refused at submit") {
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = 512});
  serial_executor serial;
  serve::engine eng(s.model, cache, serial, options(), &s.tok);
  outcome o;
  auto r = request(prompts[0], grammars()[0], sampled, 3, 200);
  r.on_event = [&](const serve::stream_event& e) {
    if (e.type == serve::event_type::token) o.tokens.push_back(e.token);
    else {
      ++o.n_finish;
      o.finish = e;
    }
  };
  const auto h = eng.submit(std::move(r)).handle;
  for (int i = 0; i < 4; ++i) eng.step();
  eng.cancel(h);
  eng.run_until_idle();
  REQUIRE(o.n_finish == 1);
  REQUIRE(o.finish.finish == serve::finish_kind::cancelled);
  REQUIRE(eng.stats().kv_blocks_used == 0);

  // A grammar compiled for another vocabulary.
  auto small = std::make_shared<grammar::token_vocabulary>(*s.vocab);
  small->bytes.resize(100);
  small->eos.clear();
  small->trie = grammar::vocabulary_trie(small->bytes, std::vector<bool>(100, false));
  auto foreign = request(prompts[0], grammars()[0], sampled, 3);
  foreign.grammar = std::make_shared<const grammar::token_masker>(
      std::make_shared<const grammar::automaton>(grammar::parse_gbnf("root ::= \"a\"\n")),
      std::shared_ptr<const grammar::token_vocabulary>(small));
  std::string message;
  foreign.on_event = [&](const serve::stream_event& e) { message = e.error; };
  const auto res = eng.submit(std::move(foreign));
  REQUIRE(res.status == serve::submit_status::invalid);
  REQUIRE_THAT(res.message, Catch::Contains("grammar: compiled for a vocabulary of 100 tokens"));
  REQUIRE(message == res.message);
}

TEST_CASE("serve grammar: the grammar's EOS joins the stop tokens, the prefill worker's first token obeys it") {
  auto& s = loaded();
  auto r = request(prompts[0], grammars()[2], "greedy", 0);
  r.stop.eos_tokens.clear();
  const auto got = run({r});
  require_sentence(got[0], grammars()[2]);

  // sample_first_token applies the grammar: "The " is the only way in.
  std::vector<float> logits(s.tok.vocab_size(), 0.0f);
  const token_id t = serve::sample_first_token(r, logits);
  const std::string& b = s.vocab->bytes[static_cast<std::size_t>(t)];
  REQUIRE_FALSE(b.empty());
  REQUIRE(b[0] == 'T');
  const auto& m = *grammars()[2].masker;
  REQUIRE(m.advance(m.grammar_automaton().start(), t) != grammar::dead_state);
}

TEST_CASE("serve grammar: guesses are cut before the first token the grammar forbids and after EOS") {
  auto& s = loaded();
  const constrained g = from_gbnf("root ::= \"ab\" [0-9]{0,6}\n");
  auto token_of = [&](const std::string& bytes) {
    for (std::size_t t = 0; t < s.vocab->bytes.size(); ++t)
      if (s.vocab->bytes[t] == bytes) return static_cast<token_id>(t);
    FAIL("no token '" << bytes << "' in stories260K");
    return token_id{-1};
  };
  const token_id a = token_of("a"), b = token_of("b"), one = token_of("1"), x = token_of("x");
  serve::generation_request r = request(prompts[0], g, "greedy", 0);
  serve::detail::add_grammar_eos(r);
  serve::detail::live_request l = serve::detail::new_live_request(r, sampling::runtime_chain::parse("greedy"));
  REQUIRE(l.grammar);
  std::vector<token_id> draft{a, b, one, x, one};
  serve::detail::cut_to_grammar(l, draft);
  REQUIRE(draft == std::vector<token_id>{a, b, one});  // "x" is forbidden
  l.context.push_back(a);  // the position follows the context
  draft = {b, s.tok.eos(), one};
  serve::detail::cut_to_grammar(l, draft);
  REQUIRE(draft == std::vector<token_id>{b, s.tok.eos()});  // nothing after EOS
  draft = {a};
  serve::detail::cut_to_grammar(l, draft);
  REQUIRE(draft.empty());  // "aa" is not a prefix
}
