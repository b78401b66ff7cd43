// SPDX-License-Identifier: MIT
// serve/: beam search inside the engine (generation_request::beam) against
// the stand-alone search::beam_search on the same prompt and model, token
// for token and score for score: on a toy Markov model that reads its
// context back from the KV cache (so a wrong fork or a stale block fails),
// and on the vendored stories260K; alone, in a batch with sampled requests,
// with prefix reuse, under a pool too small to hold every request's beams;
// cancellation frees every beam's blocks; bad settings are refused.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/search/beam_search.hpp>
#include <llmkit/serve/serve.hpp>

#include <catch2/catch.hpp>

#include "reference/search_reference.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace llmkit;
using search_reference::toy_lm;

namespace {

/// Everything one handle received.
struct record {
  std::vector<token_id> tokens;
  std::string text;
  int n_finish = 0;
  bool finish_last = true;
  serve::stream_event finish;
};

struct recorder {
  std::map<request_id, record> by_handle;
  std::function<void(const serve::stream_event&)> sink() {
    return [this](const serve::stream_event& e) {
      record& r = by_handle[e.handle];
      if (r.n_finish > 0) r.finish_last = false;
      r.text += e.text;
      if (e.type == serve::event_type::token) {
        r.tokens.push_back(e.token);
      } else {
        ++r.n_finish;
        r.finish = e;
      }
    };
  }
};

/// One beam request of a test: prompt, beam settings, stop rules, hypotheses returned.
struct beam_case {
  std::vector<token_id> prompt;
  serve::beam_options beam;
  stop_criteria stop;
  std::size_t n = 1;
};

serve::generation_request beam_request(const beam_case& c, recorder& rec) {
  serve::generation_request r;
  r.prompt = c.prompt;
  r.stop = c.stop;
  r.n = c.n;
  r.beam = c.beam;
  r.on_event = rec.sink();
  return r;
}

/// The stand-alone search on a roomy paged cache of the same block size.
template <class Model, std::size_t BlockSize>
search::beam_result standalone(Model& model, const beam_case& c) {
  kv::paged_cache<float, BlockSize> cache(model.kv_shape(), {.n_blocks = 1024, .max_sequences = 64});
  auto r = search::beam_search(model, cache, c.prompt,
                               {.beam_width = c.beam.width,
                                .n_best = c.n,
                                .length_penalty = c.beam.length_penalty,
                                .stopping = c.beam.stopping,
                                .stop = c.stop});
  REQUIRE(cache.n_sequences() == 0);
  return r;
}

/// The n hypotheses the engine sent for the request at `handle` equal `want`.
void require_same(const recorder& rec, request_id handle, const beam_case& c, const search::beam_result& want) {
  REQUIRE(want.hypotheses.size() == c.n);
  for (std::size_t i = 0; i < c.n; ++i) {
    INFO("hypothesis " << i);
    const auto it = rec.by_handle.find(handle + static_cast<request_id>(i));
    REQUIRE(it != rec.by_handle.end());
    const record& got = it->second;
    const search::beam_hypothesis& h = want.hypotheses[i];
    REQUIRE(got.n_finish == 1);
    REQUIRE(got.finish_last);
    REQUIRE(got.finish.index == i);
    REQUIRE(got.tokens == h.tokens);
    REQUIRE(got.finish.reason == h.reason);
    REQUIRE(got.finish.finish == serve::kind_of(h.reason));
    REQUIRE(got.finish.usage.n_generated_tokens == h.tokens.size());
    REQUIRE(got.finish.usage.n_prompt_tokens == c.prompt.size());
    if (got.finish.usage.n_preemptions == 0) {
      // The same double operations on the same logits: equal, not only close.
      REQUIRE(got.finish.beam_logprob == h.logprob);
      REQUIRE(got.finish.beam_score == h.score);
    } else {
      // Recomputed contexts run the prefill kernels where the search ran decode ones (another
      // summation order in attention): logits within float rounding.
      REQUIRE(got.finish.beam_logprob == Approx(h.logprob).epsilon(1e-5));
      REQUIRE(got.finish.beam_score == Approx(h.score).epsilon(1e-5));
    }
  }
}

/// Toy cases: widths 1 to 5, prompts of odd and even lengths, an EOS the
/// toy often draws, every stopping mode, length penalties 0, 1, -0.5, 2.
std::vector<beam_case> toy_cases() {
  std::vector<beam_case> cases;
  const std::vector<std::vector<token_id>> prompts{{3}, {1, 4, 1}, {2, 7, 1, 8, 2, 8}, {5, 0, 6, 6, 3, 2, 1, 0, 4}};
  const std::vector<search::early_stopping> modes{search::early_stopping::when_no_better,
                                                  search::early_stopping::when_n_done, search::early_stopping::never};
  const std::vector<float> alphas{1.0f, 0.0f, -0.5f, 2.0f};
  std::size_t k = 0;
  for (const std::size_t width : {1u, 2u, 3u, 4u, 5u})
    for (const std::size_t max_new : {1u, 6u, 11u}) {
      beam_case c;
      c.prompt = prompts[k % prompts.size()];
      c.beam = {.width = width, .length_penalty = alphas[k % alphas.size()], .stopping = modes[k % modes.size()]};
      c.stop = {.max_new_tokens = max_new, .eos_tokens = {static_cast<token_id>(k % 9)}};
      if (k % 4 == 3) c.stop.stop_sequences = {{1, 2}};
      c.n = 1 + k % width;
      cases.push_back(c);
      ++k;
    }
  return cases;
}

using toy_cache = kv::paged_cache<float, 4>;

}  // namespace

TEST_CASE("engine beam search: equals search::beam_search on a toy model, alone and all in one batch") {
  toy_lm model(9, 17, 2.0);
  serial_executor serial;
  const auto cases = toy_cases();
  std::vector<search::beam_result> want;
  for (const beam_case& c : cases) want.push_back(standalone<toy_lm, 4>(model, c));

  SECTION("each alone") {
    for (std::size_t k = 0; k < cases.size(); ++k) {
      INFO("case " << k << " width " << cases[k].beam.width << " max_new " << cases[k].stop.max_new_tokens);
      toy_cache cache(model.kv_shape(), {.n_blocks = 256});
      serve::engine eng(model, cache, serial, {.max_context = 64});
      recorder rec;
      const auto res = eng.submit(beam_request(cases[k], rec));
      REQUIRE(res.accepted());
      eng.run_until_idle();
      require_same(rec, res.handle, cases[k], want[k]);
      REQUIRE(cache.n_sequences() == 0);
      REQUIRE(cache.pool().n_free() == cache.pool().n_total());
    }
  }
  SECTION("all at once, between sampled requests, with small steps") {
    toy_cache cache(model.kv_shape(), {.n_blocks = 512});
    serve::engine eng(model, cache, serial,
                      {.max_context = 64, .policy = {.max_batch_seqs = 8, .max_step_tokens = 16, .chunked_prefill = true}});
    recorder rec;
    std::vector<request_id> handles;
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const auto other = eng.submit({.prompt = {1, 2, 3}, .sampling = "temperature(1.0);sample", .seed = k,
                                     .stop = {.max_new_tokens = 9}, .on_event = rec.sink()});
      REQUIRE(other.accepted());
      const auto res = eng.submit(beam_request(cases[k], rec));
      REQUIRE(res.accepted());
      handles.push_back(res.handle);
    }
    eng.run_until_idle();
    for (std::size_t k = 0; k < cases.size(); ++k) {
      INFO("case " << k);
      require_same(rec, handles[k], cases[k], want[k]);
    }
    REQUIRE(cache.n_sequences() == 0);
    REQUIRE(cache.pool().n_free() == cache.pool().n_total());
    REQUIRE(eng.stats().kv_blocks_used == 0);
  }
}

TEST_CASE("engine beam search: a pool too small for every request's beams waits or preempts, results unchanged") {
  toy_lm model(9, 5, 2.0);
  serial_executor serial;
  std::vector<beam_case> cases;
  for (std::size_t k = 0; k < 6; ++k) {
    beam_case c;
    c.prompt = {static_cast<token_id>(k), 3, static_cast<token_id>(8 - k)};
    c.beam = {.width = 4, .length_penalty = 1.0f, .stopping = search::early_stopping::never};
    c.stop = {.max_new_tokens = 13, .eos_tokens = {7}};
    c.n = 2;
    cases.push_back(c);
  }
  std::vector<search::beam_result> want;
  for (const beam_case& c : cases) want.push_back(standalone<toy_lm, 4>(model, c));
  // 4 beams x 15 tokens = 4 x 4 blocks: the pool of 20 runs one group and a bit.
  toy_cache cache(model.kv_shape(), {.n_blocks = 20});
  std::uint64_t n_preempted = 0;
  serve::engine eng(model, cache, serial,
                    {.max_context = 20,
                     .policy = {.max_batch_seqs = 8, .max_step_tokens = 64, .chunked_prefill = true},
                     .on_step = [&](const serve::step_report& r) { n_preempted += r.plan.preempted.size(); }});
  recorder rec;
  std::vector<request_id> handles;
  for (const beam_case& c : cases) {
    const auto res = eng.submit(beam_request(c, rec));
    REQUIRE(res.accepted());
    handles.push_back(res.handle);
  }
  for (std::size_t k = 0; k < 4; ++k)  // sampled requests grow into the beams' room
    REQUIRE(eng.submit({.prompt = {1, 2}, .sampling = "temperature(1.0);sample", .seed = k,
                        .stop = {.max_new_tokens = 17}, .on_event = rec.sink()})
                .accepted());
  eng.run_until_idle();
  std::size_t beams_preempted = 0;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    INFO("case " << k);
    require_same(rec, handles[k], cases[k], want[k]);
    beams_preempted += rec.by_handle.at(handles[k]).finish.usage.n_preemptions;
  }
  REQUIRE(beams_preempted > 0);  // whole groups were preempted and recomputed
  REQUIRE(n_preempted > 0);
  REQUIRE(eng.stats().n_preemptions == n_preempted);
  REQUIRE(cache.n_sequences() == 0);
  REQUIRE(cache.pool().n_free() == cache.pool().n_total());
}

TEST_CASE("engine beam search: cancelling a beam request frees every beam's blocks, each hypothesis slot ends once") {
  toy_lm model(9, 11, 1.0);
  serial_executor serial;
  toy_cache cache(model.kv_shape(), {.n_blocks = 256});
  serve::engine eng(model, cache, serial, {.max_context = 64});
  recorder rec;
  beam_case c{.prompt = {1, 2, 3, 4, 5},
              .beam = {.width = 4, .stopping = search::early_stopping::never},
              .stop = {.max_new_tokens = 40},
              .n = 3};
  const auto res = eng.submit(beam_request(c, rec));
  REQUIRE(res.accepted());
  for (int i = 0; i < 6; ++i) REQUIRE(eng.step());
  REQUIRE(cache.n_sequences() == 4);  // one per beam
  REQUIRE(eng.stats().kv_blocks_used > 0);
  REQUIRE(rec.by_handle.empty());  // nothing streams while the search runs
  eng.cancel(res.handle);
  eng.run_until_idle();
  REQUIRE(cache.n_sequences() == 0);
  REQUIRE(cache.pool().n_free() == cache.pool().n_total());
  const auto st = eng.stats();
  REQUIRE(st.kv_blocks_used == 0);
  REQUIRE(st.finished(serve::finish_kind::cancelled) == 3);
  REQUIRE(rec.by_handle.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const record& r = rec.by_handle.at(res.handle + i);
    REQUIRE(r.n_finish == 1);
    REQUIRE(r.tokens.empty());
    REQUIRE(r.finish.index == i);
    REQUIRE(r.finish.finish == serve::finish_kind::cancelled);
  }
}

TEST_CASE("engine beam search: bad settings are refused at submit with a message naming them") {
  toy_lm model(9, 1);
  serial_executor serial;
  toy_cache cache(model.kv_shape(), {.n_blocks = 64});
  serve::engine eng(model, cache, serial, {.max_context = 64, .max_beam_width = 6});
  auto refused = [&](serve::generation_request r, const std::string& words) {
    recorder rec;
    const std::size_t n = r.n;
    r.on_event = rec.sink();
    const auto res = eng.submit(std::move(r));
    INFO(res.message);
    REQUIRE(res.status == serve::submit_status::invalid);
    REQUIRE_THAT(res.message, Catch::Contains(words));
    REQUIRE(rec.by_handle.size() == n);  // one error finish per requested hypothesis
    for (const auto& [h, got] : rec.by_handle) REQUIRE(got.finish.finish == serve::finish_kind::error);
  };
  auto base = [] {
    serve::generation_request r;
    r.prompt = {1, 2, 3};
    r.stop = {.max_new_tokens = 8};
    r.beam = serve::beam_options{.width = 3};
    return r;
  };
  auto r = base();
  r.beam->width = 0;
  refused(r, "beam.width = 0 is outside [1, max_beam_width = 6]");
  r = base();
  r.beam->width = 7;
  refused(r, "beam.width = 7 is outside [1, max_beam_width = 6]");
  r = base();
  r.n = 4;
  refused(r, "n = 4 exceeds beam.width = 3");
  r = base();
  r.beam->length_penalty = std::numeric_limits<float>::quiet_NaN();
  refused(r, "beam.length_penalty must be finite");
  r = base();
  r.sampling = "top_k(40);temperature(0.8);sample";
  refused(r, "sampling must be \"greedy\"");
  r = base();
  r.top_logprobs = 2;
  refused(r, "top_logprobs = 2 is not supported with beam search");
  r = base();
  r.speculative = serve::speculation{.drafter = serve::draft_source::ngram, .max_tokens = 2};
  refused(r, "speculative decoding does not run with beam search");
  r = base();
  r.stop.max_new_tokens = 60;  // 6 beams x 16 blocks of 4 > 64 blocks
  r.beam->width = 6;
  refused(r, "beam.width = 6 sequences of up to 62 tokens need 96 KV blocks, the cache holds 64");
  toy_lm tiny(4, 1);
  toy_cache tiny_cache(tiny.kv_shape(), {.n_blocks = 64});
  serve::engine small_vocab(tiny, tiny_cache, serial, {.max_context = 64});
  r = base();
  r.prompt = {1};
  r.beam->width = 5;
  const auto res = small_vocab.submit(std::move(r));
  REQUIRE(res.status == serve::submit_status::invalid);
  REQUIRE_THAT(res.message, Catch::Contains("beam.width = 5 exceeds the vocabulary of 4 tokens"));
  // A good request still runs.
  recorder ok;
  auto good = base();
  good.on_event = ok.sink();
  const auto accepted = eng.submit(std::move(good));
  REQUIRE(accepted.accepted());
  eng.run_until_idle();
  REQUIRE(ok.by_handle.at(accepted.handle).n_finish == 1);
  REQUIRE(ok.by_handle.at(accepted.handle).finish.finish != serve::finish_kind::error);
}

// ------------------------------------------------------------ stories260K

namespace {
struct stories {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model model{file};
};
stories& loaded() {
  static stories s;
  return s;
}
using stories_cache = kv::prefix_cache<float, 16>;
}  // namespace

TEST_CASE("engine beam search: equals search::beam_search on stories260K, mixed batch, prefix reuse, tiny pool") {
  auto& s = loaded();
  thread_pool pool(2);
  const token_id period = s.tok.encode(".", {.add_bos = false}).back();
  const std::vector<std::string> texts{"Once upon a time", "Lily and Tom went to the park. Lily saw a big red ball.",
                                       "The cat sat on the mat. The dog", "Sue"};
  std::vector<beam_case> cases;
  std::size_t k = 0;
  for (const std::size_t width : {1u, 2u, 4u})
    for (const std::string& text : texts) {
      beam_case c;
      c.prompt = s.tok.encode(text, {.add_bos = true});
      c.beam = {.width = width, .length_penalty = k % 2 == 0 ? 1.0f : 0.0f,
                .stopping = k % 3 == 0 ? search::early_stopping::never : search::early_stopping::when_no_better};
      c.stop = {.max_new_tokens = 7 + 6 * (k % 3), .eos_tokens = {s.tok.eos(), period}};  // EOS: the end of a sentence
      c.n = std::min<std::size_t>(width, 2);
      cases.push_back(c);
      ++k;
    }
  std::vector<search::beam_result> want;
  for (const beam_case& c : cases) want.push_back(standalone<model::llama_model, 16>(s.model, c));
  bool eos_inside = false;
  for (const auto& w : want)
    for (const auto& h : w.hypotheses) eos_inside = eos_inside || h.reason == finish_reason::eos;
  REQUIRE(eos_inside);

  struct setup {
    const char* name;
    std::size_t n_blocks;
    std::int64_t max_context;
    serve::prefix_reuse reuse;
  };
  for (const setup& u : {setup{"roomy, prefix reuse", 512, 256, serve::prefix_reuse::enabled},
                         setup{"roomy, no reuse", 512, 256, serve::prefix_reuse::disabled},
                         setup{"tiny pool", 14, 160, serve::prefix_reuse::enabled}}) {
    INFO(u.name);
    stories_cache cache(s.model.kv_shape(), {.n_blocks = u.n_blocks});
    std::uint64_t n_preempted = 0;
    serve::engine eng(s.model, cache, pool,
                      {.max_context = u.max_context,
                       .policy = {.max_batch_seqs = 16, .max_step_tokens = 64, .chunked_prefill = true},
                       .reuse = u.reuse,
                       .on_step = [&](const serve::step_report& r) { n_preempted += r.plan.preempted.size(); }},
                      &s.tok);
    recorder rec;
    std::vector<request_id> handles;
    for (std::size_t round = 0; round < 2; ++round)  // the second round finds the prompts cached
      for (std::size_t i = 0; i < cases.size(); ++i) {
        REQUIRE(eng.submit({.prompt = cases[i].prompt, .sampling = "top_k(40);temperature(0.9);sample", .seed = i,
                            .stop = {.max_new_tokens = 20}, .on_event = rec.sink()})
                    .accepted());
        const auto res = eng.submit(beam_request(cases[i], rec));
        REQUIRE(res.accepted());
        handles.push_back(res.handle);
      }
    eng.run_until_idle();
    for (std::size_t i = 0; i < handles.size(); ++i) {
      INFO("request " << i);
      const beam_case& c = cases[i % cases.size()];
      require_same(rec, handles[i], c, want[i % cases.size()]);
      // The text is the hypothesis decoded.
      std::string text;
      for (token_id t : rec.by_handle.at(handles[i]).tokens) s.tok.decode_token(t, text);
      REQUIRE(rec.by_handle.at(handles[i]).text == text);
    }
    const auto st = eng.stats();
    if (u.reuse == serve::prefix_reuse::enabled) REQUIRE(st.n_prompt_tokens_reused > 0);
    std::size_t beams_preempted = 0;
    for (const request_id h : handles) beams_preempted += rec.by_handle.at(h).finish.usage.n_preemptions;
    if (u.n_blocks == 14) REQUIRE(beams_preempted > 0);
    if (u.n_blocks == 14) REQUIRE(n_preempted > 0);
    REQUIRE(st.kv_blocks_used == 0);
    REQUIRE(cache.n_sequences() == 0);
  }
}
