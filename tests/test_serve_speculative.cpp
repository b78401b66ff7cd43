// SPDX-License-Identifier: MIT
// serve/: speculative decoding inside the engine's continuous batching, on
// the vendored stories260K model: requests drafting with prompt lookup (and
// with a draft model) take exactly the tokens they take without drafting,
// greedy and sampled, alone and mixed with plain and prefilling requests,
// under preemption in a tiny pool, with stop rules firing inside a run of
// accepted guesses; bad settings are refused at submit. And the scheduler's
// lookahead slots and variable-length completion.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sched/scheduler.hpp>
#include <llmkit/search/self_draft.hpp>
#include <llmkit/serve/serve.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

using namespace llmkit;

namespace {

using cache_t = kv::prefix_cache<float, 16>;

struct stories {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model model{file};
};
stories& loaded() {
  static stories s;
  return s;
}

const std::vector<std::string> prompts{"Once upon a time",
                                       "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
                                       "The cat sat on the mat. The cat was happy. The dog",
                                       "One day, a little boy named Tim",
                                       "Ben had a toy car. He liked his toy car. One day his toy car",
                                       "The bird flew to the tree. The bird sang a song. The bird"};

/// What one request received.
struct outcome {
  std::vector<token_id> tokens;
  std::string text;
  std::vector<float> logprobs;
  serve::stream_event finish;
  int n_finish = 0;
  std::size_t max_tokens_in_a_step = 0;  ///< most token events of one step
};

/// Whether two runs computed every prompt in the same pieces.
enum class chunking : bool {
  same,     ///< logprobs have the same bits (verification rows attend as decodes)
  differs,  ///< lookahead slots took step budget, so prompts were cut elsewhere: prefill tiles round differently
};

/// Checks that `got` and `want` received the same, field by field (for readable failures).
void require_same(const std::vector<outcome>& got, const std::vector<outcome>& want,
                  chunking c = chunking::same) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("request " << i);
    REQUIRE(got[i].tokens == want[i].tokens);
    REQUIRE(got[i].text == want[i].text);
    REQUIRE(got[i].finish.reason == want[i].finish.reason);
    REQUIRE(got[i].finish.usage.n_generated_tokens == want[i].finish.usage.n_generated_tokens);
    REQUIRE(got[i].n_finish == 1);
    REQUIRE(got[i].logprobs.size() == want[i].logprobs.size());
    if (c == chunking::same) {
      REQUIRE(got[i].logprobs == want[i].logprobs);
    } else {
      for (std::size_t j = 0; j < got[i].logprobs.size(); ++j)
        REQUIRE(got[i].logprobs[j] == Approx(want[i].logprobs[j]).margin(1e-4));
    }
  }
}

struct run_result {
  std::vector<outcome> outcomes;
  serve::engine_stats stats;
};

/// Runs `requests` (all submitted before the first step) on a fresh engine
/// stepped on this thread, with `drafter` set on the requests whose index
/// is in `drafting` (all when empty).
run_result run(std::vector<serve::generation_request> requests, serve::engine_options options,
               std::size_t n_blocks = 512) {
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = n_blocks});
  serial_executor serial;
  serve::engine eng(s.model, cache, serial, options, &s.tok);
  std::map<request_id, outcome> got;
  std::map<request_id, std::size_t> this_step;
  std::vector<request_id> handles;
  for (auto& r : requests) {
    r.on_event = [&](const serve::stream_event& e) {
      outcome& o = got[e.handle];
      o.text += e.text;
      if (e.type == serve::event_type::token) {
        o.tokens.push_back(e.token);
        o.logprobs.push_back(e.logprob);
        o.max_tokens_in_a_step = std::max(o.max_tokens_in_a_step, ++this_step[e.handle]);
      } else {
        ++o.n_finish;
        o.finish = e;
      }
    };
    const auto res = eng.submit(std::move(r));
    REQUIRE(res.accepted());
    handles.push_back(res.handle);
  }
  while (eng.step() || !eng.idle()) this_step.clear();
  run_result out;
  for (request_id h : handles) {
    REQUIRE(got[h].n_finish == 1);
    out.outcomes.push_back(got[h]);
  }
  out.stats = eng.stats();
  REQUIRE(out.stats.kv_blocks_used == 0);
  return out;
}

serve::engine_options options(std::int64_t max_step_tokens = 512) {
  return {.max_context = 256,
          .policy = {.max_batch_seqs = 32, .max_step_tokens = max_step_tokens, .chunked_prefill = true}};
}

serve::generation_request request(std::size_t i, const std::string& sampling, std::size_t max_new) {
  return {.prompt = loaded().tok.encode(prompts[i % prompts.size()], {.add_bos = true}),
          .sampling = sampling,
          .seed = 100 + i,
          .stop = {.max_new_tokens = max_new},
          .top_logprobs = 2,
          .on_event = {}};
}

sched::request sched_request(request_id id, std::vector<token_id> prompt, stop_criteria stop, std::int64_t k) {
  sched::request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.stop = std::move(stop);
  r.n_lookahead = k;
  return r;
}

std::vector<serve::generation_request> drafting(std::vector<serve::generation_request> rs, serve::draft_source d,
                                                std::size_t k, bool every_other = false) {
  for (std::size_t i = 0; i < rs.size(); ++i)
    if (!every_other || i % 2 == 0) rs[i].speculative = {.drafter = d, .max_tokens = k};
  return rs;
}

const std::string greedy = "greedy";
const std::string sampled = "top_k(40);top_p(0.95);temperature(0.9);sample";

}  // namespace

TEST_CASE("speculative: greedy requests drafting by prompt lookup take their plain tokens, alone and mixed") {
  std::vector<serve::generation_request> plain;
  for (std::size_t i = 0; i < prompts.size(); ++i) plain.push_back(request(i, greedy, 64));
  const run_result ref = run(plain, options());
  REQUIRE(ref.stats.n_draft_tokens == 0);
  for (const std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{8}}) {
    // Alone: each request on its own engine.
    for (std::size_t i = 0; i < plain.size(); ++i) {
      const run_result one = run(drafting({plain[i]}, serve::draft_source::ngram, k), options());
      require_same(one.outcomes, {ref.outcomes[i]});
      // A prefill step, then one step per decode, each taking 1 + its kept guesses of the 64 tokens.
      REQUIRE(one.stats.n_steps == 64 - one.stats.n_draft_tokens_accepted);
    }
    // Mixed: half of them draft, beside plain decodes and chunked prefills (16-token steps).
    for (const std::int64_t budget : {std::int64_t{16}, std::int64_t{512}}) {
      const run_result mixed = run(drafting(plain, serve::draft_source::ngram, k, true), options(budget));
      require_same(mixed.outcomes, ref.outcomes, budget == 512 ? chunking::same : chunking::differs);
      REQUIRE(mixed.stats.n_draft_tokens_accepted > 0);  // guesses were kept ...
      REQUIRE(mixed.stats.n_draft_tokens_accepted < mixed.stats.n_draft_tokens);  // ... and rejected
    }
  }
}

TEST_CASE("speculative: sampled requests drafting take the very tokens they draw without drafting") {
  std::vector<serve::generation_request> plain;
  for (std::size_t i = 0; i < 12; ++i) plain.push_back(request(i, sampled, 48));
  serve::engine_options o = options();
  o.max_drafting_decodes = 16;
  const run_result ref = run(plain, o);
  const run_result spec = run(drafting(plain, serve::draft_source::ngram, 4), o);
  require_same(spec.outcomes, ref.outcomes);
  REQUIRE(spec.stats.n_draft_tokens_accepted > 0);
}

TEST_CASE("speculative: drafting under preemption in a tiny block pool takes the same tokens") {
  std::vector<serve::generation_request> plain;
  for (std::size_t i = 0; i < 8; ++i) plain.push_back(request(i, i % 2 == 0 ? greedy : sampled, 60));
  const run_result roomy = run(plain, options(48));
  serve::engine_options tight = options(48);
  tight.max_context = 96;  // 6 blocks; the pool holds 8
  const run_result squeezed = run(drafting(plain, serve::draft_source::ngram, 6), tight, 8);
  require_same(squeezed.outcomes, roomy.outcomes, chunking::differs);  // preempted contexts are recomputed
  REQUIRE(squeezed.stats.n_preemptions > 0);
  REQUIRE(squeezed.stats.n_draft_tokens_accepted > 0);
}

TEST_CASE("speculative: EOS, stop sequences, stop strings and max_tokens inside a run of kept guesses") {
  auto& s = loaded();
  const serve::generation_request base = request(1, greedy, 80);
  const run_result ref = run({base}, options());
  const std::vector<token_id>& full = ref.outcomes[0].tokens;
  REQUIRE(full.size() == 80);
  std::size_t inside_a_run = 0;  // stops that fired on a step that streamed more than one token
  for (std::size_t at = 4; at < 60; at += 3) {
    std::vector<serve::generation_request> variants(4, base);
    variants[0].stop.eos_tokens = {full[at]};
    variants[1].stop.stop_sequences = {{full[at - 1], full[at]}};
    variants[2].stop.max_new_tokens = at + 1;
    const std::string piece = s.tok.decode(std::span<const token_id>(&full[at], 1));
    if (piece.find_first_not_of(' ') != std::string::npos) variants[3].stop.stop_strings = {piece};
    const run_result plain = run(variants, options());
    const run_result spec = run(drafting(variants, serve::draft_source::ngram, 8), options());
    require_same(spec.outcomes, plain.outcomes);
    for (const outcome& o : spec.outcomes) {
      REQUIRE(o.finish.finish != serve::finish_kind::error);
      if (o.tokens.size() < full.size() && o.max_tokens_in_a_step > 1) ++inside_a_run;
    }
  }
  REQUIRE(inside_a_run > 0);
}

TEST_CASE("speculative: a draft model (the target itself, its int8 self-draft) guesses for many requests at once") {
  auto& s = loaded();
  std::vector<serve::generation_request> plain;
  for (std::size_t i = 0; i < 8; ++i) plain.push_back(request(i, i < 6 ? greedy : sampled, 48));
  const run_result ref = run(plain, options());
  for (const bool int8 : {false, true}) {
    INFO("int8 weights: " << int8);
    const std::vector<std::byte> bytes = search::self_draft_gguf(s.file, {.int8_weights = int8});
    const model::gguf_file file(bytes);
    model::llama_model draft(file);
    for (const std::size_t draft_blocks : {std::size_t{256}, std::size_t{6}}) {  // 6: some drafts find no room
      INFO("draft blocks: " << draft_blocks);
      kv::paged_cache<float, 16> draft_cache(draft.kv_shape(), {.n_blocks = draft_blocks});
      serial_executor serial;
      serve::model_draft drafter(draft, draft_cache, serial);
      serve::engine_options o = options();
      o.draft_model = &drafter;
      o.max_model_drafting_decodes = 32;  // many requests draft in one step
      const run_result spec = run(drafting(plain, serve::draft_source::model, 4), o);
      require_same(spec.outcomes, ref.outcomes);
      REQUIRE(spec.stats.n_draft_tokens_accepted > 0);
      if (draft_blocks == 6) REQUIRE(spec.stats.n_draft_tokens < ref.outcomes.size() * 48);  // some found no room
      REQUIRE(drafter.n_sequences() == 0);  // released as each request ended
      REQUIRE(draft_cache.pool().n_free() == draft_blocks);
      // Mixed with n-gram and plain requests.
      std::vector<serve::generation_request> mixed = drafting(plain, serve::draft_source::model, 3, true);
      for (std::size_t i = 1; i < mixed.size(); i += 4) mixed[i].speculative = {.drafter = serve::draft_source::ngram};
      require_same(run(mixed, o).outcomes, ref.outcomes);
    }
  }
  // The target as its own draft: every greedy guess is the token drawn.
  model::llama_model target(s.file);
  kv::paged_cache<float, 16> draft_cache(target.kv_shape(), {.n_blocks = 256});
  serial_executor serial;
  serve::model_draft drafter(target, draft_cache, serial);
  serve::engine_options o = options();
  o.draft_model = &drafter;
  o.max_model_drafting_decodes = 32;
  std::vector<serve::generation_request> greedy_only(plain.begin(), plain.begin() + 6);
  const run_result spec = run(drafting(greedy_only, serve::draft_source::model, 4), o);
  REQUIRE(spec.stats.n_draft_tokens > 0);
  REQUIRE(spec.stats.n_draft_tokens_accepted == spec.stats.n_draft_tokens);
}

TEST_CASE("speculative: bad settings are refused at submit with a message naming them") {
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serial_executor serial;
  serve::engine_options o = options();
  o.max_draft_tokens = 6;
  serve::engine eng(s.model, cache, serial, o, &s.tok);
  auto refused = [&](serve::speculation spec, const std::string& needle) {
    serve::generation_request r = request(0, greedy, 8);
    r.speculative = spec;
    std::string error;
    r.on_event = [&](const serve::stream_event& e) { error = e.error; };
    const auto res = eng.submit(std::move(r));
    REQUIRE(res.status == serve::submit_status::invalid);
    INFO(res.message);
    REQUIRE(res.message.find(needle) != std::string::npos);
    REQUIRE(error == res.message);
  };
  refused({.drafter = serve::draft_source::ngram, .max_tokens = 0}, "speculative.max_tokens = 0");
  refused({.drafter = serve::draft_source::ngram, .max_tokens = 7}, "max_draft_tokens = 6");
  refused({.drafter = serve::draft_source::model, .max_tokens = 2}, "no draft model");
  refused({.drafter = static_cast<serve::draft_source>(9), .max_tokens = 2}, "speculative.drafter = 9");
  serve::generation_request fine = request(0, greedy, 8);
  fine.speculative = {.drafter = serve::draft_source::none, .max_tokens = 0};  // no drafting: k unused
  REQUIRE(eng.submit(std::move(fine)).accepted());
  eng.run_until_idle();
}

TEST_CASE("speculative: the engine stops drafting in steps with more decodes than its cut-offs") {
  std::vector<serve::generation_request> plain;
  for (std::size_t i = 0; i < 6; ++i) plain.push_back(request(i, greedy, 40));
  serve::engine_options o = options(512);
  o.max_drafting_decodes = 5;  // six decodes per step: never drafts
  const run_result off = run(drafting(plain, serve::draft_source::ngram, 4), o);
  REQUIRE(off.stats.n_draft_tokens == 0);
  o.max_drafting_decodes = 6;
  const run_result on = run(drafting(plain, serve::draft_source::ngram, 4), o);
  REQUIRE(on.stats.n_draft_tokens > 0);
  require_same(on.outcomes, off.outcomes);
  // A draft model has its own cut-off, 1 by default: six decodes never draft.
  model::llama_model target(loaded().file);
  kv::paged_cache<float, 16> draft_cache(target.kv_shape(), {.n_blocks = 256});
  serial_executor serial;
  serve::model_draft drafter(target, draft_cache, serial);
  serve::engine_options m = options(512);
  m.draft_model = &drafter;
  m.max_drafting_decodes = 64;  // prompt lookup's cut-off does not apply to the model
  REQUIRE(m.max_model_drafting_decodes == 1);
  REQUIRE(run(drafting(plain, serve::draft_source::model, 4), m).stats.n_draft_tokens == 0);
  m.max_model_drafting_decodes = 6;
  const run_result model_on = run(drafting(plain, serve::draft_source::model, 4), m);
  REQUIRE(model_on.stats.n_draft_tokens > 0);
  require_same(model_on.outcomes, off.outcomes);
  // Alone, a request drafts from the model under the default.
  m.max_model_drafting_decodes = serve::engine_options{}.max_model_drafting_decodes;
  REQUIRE(run(drafting({plain[0]}, serve::draft_source::model, 4), m).stats.n_draft_tokens > 0);
}

TEST_CASE("sched: decodes get lookahead slots within blocks, budget and max_new_tokens, never by preempting") {
  // Block size 4, 5 blocks: one request of prompt 6, k = 8.
  sched::scheduler s({.max_context = 20, .block_size = 4, .n_blocks = 5},
                     {.max_batch_seqs = 4, .max_step_tokens = 32, .chunked_prefill = true});
  s.submit(sched_request(1, {1, 2, 3, 4, 5, 6}, {.max_new_tokens = 10}, 8));
  const auto& p0 = s.next_step();
  REQUIRE(p0.items.size() == 1);
  REQUIRE(p0.items[0].n_lookahead == 0);  // a prefill carries no guesses
  REQUIRE(s.complete_step(std::vector<token_id>{7}).empty());
  const auto& p1 = s.next_step();  // context 7, cached 6: a decode; max_new leaves 10 - 1 - 1 = 8
  REQUIRE(p1.items[0].n_lookahead == 8);
  REQUIRE(p1.n_computed_tokens() == 9);
  // Took 1 + 3 tokens: 3 kept guesses and the model's own.
  REQUIRE(s.complete_step(std::vector<token_id>{8, 9, 10, 11}, std::vector<std::size_t>{4}).empty());
  REQUIRE(s.output(1).size() == 5);
  REQUIRE(s.state().running[0].n_cached == 10);
  REQUIRE(s.state().running[0].n_blocks == 3);
  const auto& p2 = s.next_step();  // 5 generated: 10 - 5 - 1 = 4 slots; blocks: 15 tokens = 4 blocks <= 5
  REQUIRE(p2.items[0].n_lookahead == 4);
  // A count outside [1, 1 + n_lookahead] or tokens that do not add up are refused.
  REQUIRE_THROWS_WITH(s.complete_step(std::vector<token_id>(6, 1), std::vector<std::size_t>{6}),
                      Catch::Contains("outside [1, 1 + n_lookahead = 5]"));
  REQUIRE_THROWS_WITH(s.complete_step(std::vector<token_id>(2, 1), std::vector<std::size_t>{3}),
                      Catch::Contains("sampled has 2 tokens"));
}

TEST_CASE("sched: a stop rule inside a variable-length completion keeps the tokens up to it") {
  sched::scheduler s({.max_context = 64, .block_size = 4, .n_blocks = 16}, {.max_batch_seqs = 4, .max_step_tokens = 64});
  s.submit(sched_request(1, {1, 2}, {.max_new_tokens = 20, .eos_tokens = {99}}, 4));
  s.next_step();
  REQUIRE(s.complete_step(std::vector<token_id>{5}).empty());
  const auto& p = s.next_step();
  REQUIRE(p.items[0].n_lookahead == 4);
  const auto done = s.complete_step(std::vector<token_id>{6, 99, 7}, std::vector<std::size_t>{3});
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].output == std::vector<token_id>{5, 6, 99});
  REQUIRE(done[0].reason == finish_reason::eos);
  REQUIRE(s.idle());
  REQUIRE(s.state().n_free_blocks == 16);
}
