// SPDX-License-Identifier: MIT
// serve/: the serving engine on the vendored stories260K model: seeded
// determinism alone / under load / on its own thread / on 2 executor
// threads, stop strings across token boundaries, cancellation from other
// threads, exactly one finish per request, prefix reuse, preemption under a
// tiny block pool, admission limits, requests prefilled elsewhere (KV
// imported from a staging area); and the incremental text stream.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/serve/serve.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
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

std::vector<token_id> encode(const std::string& text) {
  return loaded().tok.encode(text, {.add_bos = true});
}

const std::vector<std::string> prompts{"Once upon a time",
                                       "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
                                       "The cat sat on the mat. The cat was happy. The dog",
                                       "One day, a little boy named Tim",
                                       "She said, \"I want to play!\" Her mom said, \"You can play",
                                       "The sun was hot",
                                       "Ben had a toy car. He liked his toy car. One day his toy car",
                                       "Sue",
                                       "The bird flew to the tree. The bird sang a song. The bird",
                                       "They were best friends"};

/// Everything one request received, in order.
struct record {
  std::vector<token_id> tokens;
  std::string text;
  std::vector<serve::stream_event> events;  // token events keep no top list copy beyond the first
  int n_finish = 0;
  bool finish_last = true;  // no event after the finish
  serve::stream_event finish;
};

/// Thread-safe sink of events by handle.
class recorder {
 public:
  std::function<void(const serve::stream_event&)> sink() {
    return [this](const serve::stream_event& e) { on_event(e); };
  }
  void on_event(const serve::stream_event& e) {
    std::lock_guard lock(mutex_);
    record& r = records_[e.handle];
    if (r.n_finish > 0) r.finish_last = false;
    r.text += e.text;
    if (e.type == serve::event_type::token) {
      r.tokens.push_back(e.token);
      r.events.push_back(e);
    } else {
      ++r.n_finish;
      r.finish = e;
    }
  }
  record get(request_id h) const {
    std::lock_guard lock(mutex_);
    const auto it = records_.find(h);
    return it == records_.end() ? record{} : it->second;
  }
  std::map<request_id, record> all() const {
    std::lock_guard lock(mutex_);
    return records_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<request_id, record> records_;
};

serve::engine_options small_steps(std::int64_t max_step_tokens = 48) {
  return {.max_context = 256,
          .policy = {.max_batch_seqs = 32, .max_step_tokens = max_step_tokens, .chunked_prefill = true}};
}

serve::generation_request sampled_request(const std::string& prompt, std::uint64_t seed, std::size_t max_new,
                                          recorder& rec) {
  return {.prompt = encode(prompt),
          .sampling = "top_k(40);top_p(0.95);temperature(0.9);sample",
          .seed = seed,
          .stop = {.max_new_tokens = max_new},
          .on_event = rec.sink()};
}

/// Runs `requests` (all submitted before the first step) to completion on
/// a fresh engine; returns the tokens of each, in order.
template <class Exec>
std::vector<std::vector<token_id>> run_all(std::vector<serve::generation_request> requests, Exec& exec,
                                           serve::engine_options options, std::size_t n_blocks = 512,
                                           serve::engine_stats* stats_out = nullptr) {
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = n_blocks});
  std::uint64_t n_reports = 0, n_preempted = 0;
  std::size_t min_used = 1 << 30;
  options.on_step = [&](const serve::step_report& r) {
    ++n_reports;
    n_preempted += r.plan.preempted.size();
    min_used = std::min(min_used, r.kv_blocks_used);
  };
  serve::engine eng(s.model, cache, exec, options, &s.tok);
  recorder rec;
  std::vector<request_id> handles;
  for (auto& r : requests) {
    r.on_event = rec.sink();
    const auto res = eng.submit(std::move(r));
    REQUIRE(res.accepted());
    handles.push_back(res.handle);
  }
  eng.run_until_idle();
  std::vector<std::vector<token_id>> out;
  std::size_t request_preemptions = 0;
  for (auto h : handles) {
    const record r = rec.get(h);
    REQUIRE(r.n_finish == 1);
    out.push_back(r.tokens);
    request_preemptions += r.finish.usage.n_preemptions;
  }
  const auto st = eng.stats();
  REQUIRE(n_reports == st.n_steps);  // one step report per forward pass
  REQUIRE(n_preempted == st.n_preemptions);
  REQUIRE(request_preemptions == st.n_preemptions);
  REQUIRE(min_used > 0);  // every step holds the blocks it computed
  if (stats_out) *stats_out = st;
  REQUIRE(eng.stats().kv_blocks_used == 0);
  return out;
}

}  // namespace

TEST_CASE("text_stream: deltas never show a stop string and never split a UTF-8 character") {
  const stop_criteria stop{.stop_strings = {"o w", "END"}};
  serve::text_stream t;
  auto d = t.push_text("Hel", stop);
  REQUIRE(d.text == "Hel");
  d = t.push_text("lo", stop);  // "o" may begin "o w": held back
  REQUIRE(d.text == "l");
  d = t.push_text(" ", stop);
  REQUIRE(d.text.empty());
  d = t.push_text("wor", stop);  // completes "o w": cut before it
  REQUIRE(d.stop_string);
  REQUIRE(d.text.empty());
  REQUIRE(t.flush().empty());
  REQUIRE(t.text() == "Hello wor");

  serve::text_stream u;
  REQUIRE(u.push_text("caf\xc3", {}).text == "caf");  // first byte of é held
  REQUIRE(u.push_text("\xa9!", {}).text == "\xc3\xa9!");
  REQUIRE(u.push_text("EN", stop).text.empty());
  REQUIRE(u.flush() == "EN");  // the end of the request makes held text final
  REQUIRE(serve::incomplete_utf8_tail("a\xe2\x82") == 2);
  REQUIRE(serve::incomplete_utf8_tail("a\xe2\x82\xac") == 0);
}

TEST_CASE("engine: a seeded request gives the same tokens alone, under load, on its own thread and on 2 threads") {
  serial_executor serial;
  recorder unused;
  auto target = [&] { return sampled_request(prompts[1], 7, 40, unused); };
  const auto alone = run_all({target()}, serial, small_steps())[0];
  REQUIRE(alone.size() == 40);

  // 16 others in flight, submitted before and after it, chunked prefill
  // under a small step budget.
  std::vector<serve::generation_request> load;
  for (int i = 0; i < 16; ++i) {
    if (i == 5) load.push_back(target());
    load.push_back(sampled_request(prompts[static_cast<std::size_t>(i) % prompts.size()], 100 + i, 10 + 3 * i, unused));
  }
  const auto busy = run_all(load, serial, small_steps());
  REQUIRE(busy[5] == alone);

  // Greedy and sampled rows mixed, other step budgets.
  load[0].sampling = "greedy";
  REQUIRE(run_all(load, serial, small_steps(512))[5] == alone);
  REQUIRE(run_all(load, serial, small_steps(17))[5] == alone);

  // Two executor threads (the forward's products and the sampling rows split).
  thread_pool pool(2);
  REQUIRE(run_all(load, pool, small_steps())[5] == alone);
  REQUIRE(run_all({target()}, pool, small_steps())[0] == alone);

  // The engine's own step thread, requests arriving while it runs, with
  // top-logprobs asked for (the events change, not the tokens).
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = 512});
  serve::engine eng(s.model, cache, pool, small_steps(), &s.tok);
  recorder rec;
  eng.start();
  std::vector<request_id> handles;
  for (int i = 0; i < 16; ++i) {
    auto r = sampled_request(prompts[static_cast<std::size_t>(i) % prompts.size()], 200 + i, 20, rec);
    handles.push_back(eng.submit(std::move(r)).handle);
    if (i == 8) {
      auto t = target();
      t.top_logprobs = 5;
      t.on_event = rec.sink();
      handles.push_back(eng.submit(std::move(t)).handle);
    }
  }
  REQUIRE(eng.wait_idle(std::chrono::seconds(60)));
  eng.stop();
  const record r = rec.get(handles[9]);
  REQUIRE(r.tokens == alone);
  REQUIRE(r.finish.finish == serve::finish_kind::length);
  REQUIRE(r.finish.reason == finish_reason::max_tokens);
  REQUIRE(r.finish.usage.n_generated_tokens == 40);
  REQUIRE(r.text == s.tok.decode(alone));
  for (const auto& e : r.events) {
    REQUIRE(e.top_logprobs.size() >= 1);  // top_k / top_p may keep fewer than 5
    REQUIRE(e.top_logprobs.size() <= 5);
    REQUIRE(e.top_logprobs[0].logprob >= e.logprob);
    REQUIRE(e.logprob <= 0.0f);
  }
}

TEST_CASE("engine: greedy tokens equal the model's own greedy decoding, logprobs list the argmax first") {
  auto& s = loaded();
  serial_executor serial;
  recorder rec;
  cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serve::engine eng(s.model, cache, serial, small_steps(), &s.tok);
  const auto h = eng.submit({.prompt = encode(prompts[0]), .stop = {.max_new_tokens = 20}, .top_logprobs = 2,
                             .on_event = rec.sink()}).handle;
  eng.run_until_idle();
  const record r = rec.get(h);

  // Reference: one sequence, one token at a time, argmax.
  cache_t ref(s.model.kv_shape(), {.n_blocks = 64});
  const auto seq = *ref.add_sequence();
  std::vector<token_id> ctx = encode(prompts[0]);
  std::vector<token_id> expected;
  std::size_t done = 0;
  model::batch_builder b;
  while (expected.size() < 20) {
    b.clear();
    b.add(seq, std::span<const token_id>(ctx).subspan(done), static_cast<std::int32_t>(done));
    done = ctx.size();
    const auto row = s.model.forward(b.view(), ref).row(0);
    const auto t = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
    expected.push_back(t);
    ctx.push_back(t);
  }
  REQUIRE(r.tokens == expected);
  for (const auto& e : r.events) {
    REQUIRE(e.top_logprobs.size() == 2);
    REQUIRE(e.top_logprobs[0].token == e.token);
    REQUIRE(e.top_logprobs[0].logprob == Approx(e.logprob));
  }
}

namespace {
/// A user's own processor, defined here and nowhere in the library: the next
/// token is the prompt's, in a cycle (every other token is masked).
struct repeat_prompt {
  void apply(sampling::candidates& c, const sampling::sampling_context& ctx) const {
    const token_id want = ctx.history[ctx.step % ctx.n_prompt];
    auto values = c.values();
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c.token(i) != want) values[i] = -std::numeric_limits<float>::infinity();
    c.values_changed();
  }
};
static_assert(sampling::logits_processor<repeat_prompt>);
}  // namespace

TEST_CASE("engine: a request's chain as a value, with a user's own processor, changes that request's tokens only") {
  auto& s = loaded();
  serial_executor serial;
  recorder rec;
  const auto prompt = encode(prompts[1]);
  auto run_alone = [&](serve::generation_request r) {
    recorder solo;
    cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
    serve::engine eng(s.model, cache, serial, small_steps(), &s.tok);
    r.on_event = solo.sink();
    const auto h = eng.submit(std::move(r)).handle;
    eng.run_until_idle();
    return solo.get(h).tokens;
  };
  const std::vector<token_id> plain_alone = run_alone({.prompt = prompt, .stop = {.max_new_tokens = 24}});

  cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serve::engine eng(s.model, cache, serial, small_steps(), &s.tok);
  const sampling::runtime_chain custom({sampling::any_processor(repeat_prompt{})}, sampling::greedy{});
  const auto plain = eng.submit({.prompt = prompt, .stop = {.max_new_tokens = 24}, .on_event = rec.sink()});
  const auto mine = eng.submit({.prompt = prompt, .chain = custom, .stop = {.max_new_tokens = 24}, .on_event = rec.sink()});
  // The value wins over the string; a chain string that does not parse is still refused.
  const auto sampled = eng.submit({.prompt = prompt, .sampling = "temperature(1.5);sample", .chain = custom, .seed = 3,
                                   .stop = {.max_new_tokens = 24}, .on_event = rec.sink()});
  REQUIRE(plain.accepted());
  REQUIRE(mine.accepted());
  REQUIRE(sampled.accepted());
  CHECK_FALSE(eng.submit({.prompt = prompt, .sampling = "no_such_processor", .on_event = rec.sink()}).accepted());
  eng.run_until_idle();

  std::vector<token_id> cycled;
  for (std::size_t t = 0; t < 24; ++t) cycled.push_back(prompt[t % prompt.size()]);
  CHECK(rec.get(mine.handle).tokens == cycled);
  CHECK(rec.get(sampled.handle).tokens == cycled);
  CHECK(rec.get(plain.handle).tokens == plain_alone);
  CHECK(rec.get(plain.handle).tokens != cycled);
}

TEST_CASE("engine: a stop string across token boundaries ends the request, the text stops before it") {
  auto& s = loaded();
  serial_executor serial;
  const auto prompt = encode(prompts[0]);
  // The free run, and its text piece by piece.
  recorder rec;
  cache_t cache(s.model.kv_shape(), {.n_blocks = 128});
  serve::engine eng(s.model, cache, serial, small_steps(), &s.tok);
  const auto free_run = eng.submit({.prompt = prompt, .stop = {.max_new_tokens = 48}, .on_event = rec.sink()}).handle;
  eng.run_until_idle();
  const record full = rec.get(free_run);
  REQUIRE(full.text == s.tok.decode(full.tokens));

  // A stop string made of the end of one piece and the start of the next,
  // its first occurrence after a few tokens.
  std::vector<std::string> pieces;
  for (token_id t : full.tokens) {
    std::string p;
    s.tok.decode_token(t, p);
    pieces.push_back(p);
  }
  std::string stop;
  std::size_t k = 3;
  for (; k + 1 < pieces.size(); ++k) {
    if (pieces[k].size() < 2 || pieces[k + 1].size() < 2) continue;
    stop = pieces[k].substr(pieces[k].size() - 2) + pieces[k + 1].substr(0, 2);
    std::size_t before = 0;
    for (std::size_t j = 0; j < k; ++j) before += pieces[j].size();
    if (full.text.find(stop) == before + pieces[k].size() - 2) break;
  }
  REQUIRE(k + 1 < pieces.size());
  INFO("stop string '" << stop << "' across tokens " << k << " and " << k + 1);

  const auto h = eng.submit({.prompt = prompt, .stop = {.max_new_tokens = 48, .stop_strings = {"zzzz", stop}},
                             .on_event = rec.sink()}).handle;
  eng.run_until_idle();
  const record r = rec.get(h);
  REQUIRE(r.n_finish == 1);
  REQUIRE(r.finish.finish == serve::finish_kind::stop);
  REQUIRE(r.finish.reason == finish_reason::stop_string);
  REQUIRE(r.tokens == std::vector<token_id>(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(k + 2)));
  REQUIRE(r.text == full.text.substr(0, full.text.find(stop)));
  // No event ever showed the stop string's first characters.
  std::string shown;
  for (const auto& e : r.events) shown += e.text;
  REQUIRE(shown == r.text);
  REQUIRE(eng.stats().kv_blocks_used == 0);

  // EOS and stop sequences end requests too, with their own reasons.
  const auto h_eos = eng.submit({.prompt = prompt, .stop = {.max_new_tokens = 48, .eos_tokens = {full.tokens[4]}},
                                 .on_event = rec.sink()}).handle;
  const auto h_seq = eng.submit({.prompt = prompt,
                                 .stop = {.max_new_tokens = 48, .stop_sequences = {{full.tokens[5], full.tokens[6]}}},
                                 .on_event = rec.sink()}).handle;
  eng.run_until_idle();
  REQUIRE(rec.get(h_eos).finish.reason == finish_reason::eos);
  REQUIRE(rec.get(h_eos).tokens.size() <= 5);
  REQUIRE(rec.get(h_seq).finish.reason == finish_reason::stop_sequence);
  REQUIRE(rec.get(h_seq).tokens.size() <= 7);
}

TEST_CASE("engine: cancelling from another thread frees every KV block") {
  auto& s = loaded();
  thread_pool pool(2);
  cache_t cache(s.model.kv_shape(), {.n_blocks = 256});
  serve::engine eng(s.model, cache, pool, small_steps(), &s.tok);
  recorder rec;
  std::atomic<int> tokens_seen{0};
  eng.start();
  std::vector<request_id> handles;
  for (int i = 0; i < 8; ++i)
    handles.push_back(eng.submit({.prompt = encode(prompts[static_cast<std::size_t>(i)]),
                                  .sampling = "temperature(1.0);sample",
                                  .seed = static_cast<std::uint64_t>(i),
                                  .stop = {.max_new_tokens = 200},
                                  .on_event =
                                      [&](const serve::stream_event& e) {
                                        rec.on_event(e);
                                        if (e.type == serve::event_type::token) ++tokens_seen;
                                      }})
                          .handle);
  std::size_t used_before = 0;
  std::thread canceller([&] {  // no Catch2 assertion off the main thread
    while (tokens_seen.load() < 16) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    used_before = eng.stats().kv_blocks_used;
    for (auto h : handles) eng.cancel(h);
    eng.cancel(987654);  // unknown: ignored
  });
  canceller.join();
  REQUIRE(used_before > 0);
  REQUIRE(eng.wait_idle(std::chrono::seconds(30)));
  const auto st = eng.stats();
  REQUIRE(st.kv_blocks_used == 0);
  REQUIRE(st.n_running == 0);
  REQUIRE(st.n_queued == 0);
  REQUIRE(cache.n_sequences() == 0);
  for (auto h : handles) {
    const record r = rec.get(h);
    REQUIRE(r.n_finish == 1);
    REQUIRE(r.finish_last);
    REQUIRE(r.finish.finish == serve::finish_kind::cancelled);
    REQUIRE(r.finish.usage.n_generated_tokens == r.tokens.size());
    REQUIRE(r.tokens.size() < 200);
  }
  REQUIRE(st.finished(serve::finish_kind::cancelled) == 8);
  eng.stop();
}

TEST_CASE("engine: every request ends with exactly one finish under concurrent submits, cancels and shutdown") {
  auto& s = loaded();
  thread_pool pool(2);
  cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serve::engine_options o = small_steps(32);
  o.max_queued = 6;
  o.policy.max_batch_seqs = 4;
  serve::engine eng(s.model, cache, pool, o, &s.tok);
  recorder rec;
  eng.start();
  std::mutex handles_mutex;
  std::vector<serve::submit_result> results;
  auto client = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<request_id> mine;
    for (int i = 0; i < 30; ++i) {
      serve::generation_request r{.prompt = encode(prompts[rng() % prompts.size()]),
                                  .sampling = rng() % 2 ? "greedy" : "top_k(20);sample",
                                  .seed = rng(),
                                  .stop = {.max_new_tokens = 1 + rng() % 30},
                                  .n = rng() % 4 == 0 ? 3u : 1u,
                                  .on_event = rec.sink()};
      switch (rng() % 8) {
        case 0: r.prompt.clear(); break;                 // invalid
        case 1: r.sampling = "top_k(;"; break;           // invalid
        case 2: r.stop.max_new_tokens = 10'000; break;  // longer than the context
        case 3: r.stop.stop_strings = {"."}; break;
        default: break;
      }
      const std::size_t n = r.n;
      const auto res = eng.submit(std::move(r));
      {
        std::lock_guard lock(handles_mutex);
        for (std::size_t k = 0; k < n; ++k) {  // one result per sample
          auto one = res;
          one.handle += static_cast<request_id>(k);
          results.push_back(one);
          mine.push_back(one.handle);
        }
      }
      if (rng() % 3 == 0) eng.cancel(mine[rng() % mine.size()]);
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    }
  };
  std::vector<std::thread> clients;
  for (unsigned c = 0; c < 3; ++c) clients.emplace_back(client, 11 + c);
  for (auto& c : clients) c.join();
  eng.stop();  // cancels what is left, queued requests included
  REQUIRE(eng.submit({.prompt = encode("late"), .on_event = rec.sink()}).status == serve::submit_status::shutting_down);

  const auto all = rec.all();
  REQUIRE(all.size() == results.size() + 1);
  std::map<serve::finish_kind, std::uint64_t> kinds;
  std::size_t queue_full = 0, invalid = 0;
  for (const auto& res : results) {
    const record& r = all.at(res.handle);
    REQUIRE(r.n_finish == 1);
    REQUIRE(r.finish_last);
    ++kinds[r.finish.finish];
    if (!res.accepted()) REQUIRE(r.finish.finish == serve::finish_kind::error);
    queue_full += res.status == serve::submit_status::queue_full;
    invalid += res.status == serve::submit_status::invalid;
  }
  REQUIRE(invalid > 0);
  const auto st = eng.stats();
  REQUIRE(st.n_submitted == results.size() + 1);
  REQUIRE(st.n_rejected_queue_full == queue_full);
  REQUIRE(st.n_finished_total() == results.size() + 1);
  REQUIRE(st.finished(serve::finish_kind::cancelled) == kinds[serve::finish_kind::cancelled]);
  REQUIRE(st.finished(serve::finish_kind::stop) + st.finished(serve::finish_kind::length) ==
          kinds[serve::finish_kind::stop] + kinds[serve::finish_kind::length]);
  // Which requests end cancelled, by their length or by shutdown depends on
  // timing; that each ends once does not.
  REQUIRE(kinds[serve::finish_kind::cancelled] + kinds[serve::finish_kind::length] + kinds[serve::finish_kind::stop] >
          0);
  REQUIRE(st.kv_blocks_used == 0);
  REQUIRE(cache.n_sequences() == 0);
}

TEST_CASE("engine: admission limits answer queue_full, bad requests and shutdown answer with one error finish") {
  auto& s = loaded();
  serial_executor serial;
  cache_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serve::engine_options o = small_steps();
  o.max_queued = 2;
  serve::engine eng(s.model, cache, serial, o, &s.tok);
  recorder rec;
  auto req = [&](std::vector<token_id> prompt) {
    return serve::generation_request{.prompt = std::move(prompt), .stop = {.max_new_tokens = 4}, .on_event = rec.sink()};
  };
  const auto a = eng.submit(req(encode("Sue")));
  const auto b = eng.submit(req(encode("Tom")));
  const auto c = eng.submit(req(encode("Ben")));
  REQUIRE(a.accepted());
  REQUIRE(b.accepted());
  REQUIRE(c.status == serve::submit_status::queue_full);
  REQUIRE(rec.get(c.handle).n_finish == 1);  // before submit returned
  REQUIRE(rec.get(c.handle).finish.finish == serve::finish_kind::error);
  REQUIRE(eng.stats().n_queued == 2);
  REQUIRE(eng.submit(req({})).status == serve::submit_status::invalid);
  REQUIRE(eng.submit(req({1, 100000})).message.find("outside the vocabulary") != std::string::npos);
  auto bad_chain = req(encode("Sue"));
  bad_chain.sampling = "top_q(3)";
  REQUIRE(eng.submit(bad_chain).message.find("unknown item 'top_q'") != std::string::npos);
  auto too_long = req(encode("Sue"));
  too_long.stop.max_new_tokens = 300;
  REQUIRE(eng.submit(too_long).status == serve::submit_status::invalid);

  // Without a tokenizer stop strings cannot be checked.
  serve::engine no_text(s.model, cache, serial, o);
  auto with_stop = req(encode("Sue"));
  with_stop.stop.stop_strings = {"."};
  with_stop.on_event = {};  // handles are per engine: keep rec for eng's
  REQUIRE(no_text.submit(with_stop).message == "stop strings need a tokenizer; the engine has none");

  // Shutdown cancels the queued requests; they finish exactly once.
  eng.stop();
  for (auto h : {a.handle, b.handle}) {
    INFO("handle " << h << " reason " << serve::to_string(rec.get(h).finish.finish) << " " << rec.get(h).finish.error);
    REQUIRE(rec.get(h).n_finish == 1);
    REQUIRE(rec.get(h).finish.finish == serve::finish_kind::cancelled);
  }
  REQUIRE(eng.submit(req(encode("Sue"))).status == serve::submit_status::shutting_down);
  REQUIRE(eng.stats().finished(serve::finish_kind::error) == 6);
}

TEST_CASE("engine: a repeated system prompt is reused from the prefix cache, outputs equal a run without reuse") {
  serial_executor serial;
  recorder unused;
  const std::string system =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
      "a big, red ball. ";
  std::vector<serve::generation_request> requests;
  for (std::size_t i = 0; i < 6; ++i) requests.push_back(sampled_request(system + prompts[i], 30 + i, 16, unused));
  REQUIRE(encode(system).size() >= 32);

  // A small step budget: the first request's prompt is published before
  // the others are admitted.
  serve::engine_options with = small_steps(16);
  with.policy.max_batch_seqs = 2;
  serve::engine_options without = with;
  without.reuse = serve::prefix_reuse::disabled;
  serve::engine_stats st_with, st_without;
  const auto reused = run_all(requests, serial, with, 512, &st_with);
  const auto plain = run_all(requests, serial, without, 512, &st_without);
  REQUIRE(reused == plain);
  REQUIRE(st_without.n_prompt_tokens_reused == 0);
  REQUIRE(st_with.n_prompt_tokens_reused >= 5 * 32);
  REQUIRE(st_with.n_prompt_tokens_prefilled + st_with.n_prompt_tokens_reused == st_without.n_prompt_tokens_prefilled);

  // The same prompt again, alone, after the first finished: its usage says
  // how many prompt tokens were reused.
  auto& s = loaded();
  cache_t cache(s.model.kv_shape(), {.n_blocks = 512});
  serve::engine eng(s.model, cache, serial, with, &s.tok);
  recorder rec;
  auto first = sampled_request(system + prompts[0], 1, 8, rec);
  auto again = first;
  const auto h1 = eng.submit(std::move(first)).handle;
  eng.run_until_idle();
  const auto h2 = eng.submit(std::move(again)).handle;
  eng.run_until_idle();
  REQUIRE(rec.get(h1).finish.usage.n_prompt_tokens_reused == 0);
  const std::size_t n_prompt = encode(system + prompts[0]).size();
  REQUIRE(rec.get(h2).finish.usage.n_prompt_tokens_reused == (n_prompt - 1) / 16 * 16);
  REQUIRE(rec.get(h2).tokens == rec.get(h1).tokens);
  REQUIRE(eng.stats().kv_blocks_used == 0);
  REQUIRE(eng.stats().kv_blocks_cached > 0);  // published, evictable
}

TEST_CASE("engine: preemption under a tiny block pool completes every request with the same tokens") {
  serial_executor serial;
  recorder unused;
  std::vector<serve::generation_request> requests;
  for (std::size_t i = 0; i < 8; ++i) requests.push_back(sampled_request(prompts[i], 50 + i, 60, unused));
  const auto roomy = run_all(requests, serial, small_steps(), 512);
  for (const auto reuse : {serve::prefix_reuse::enabled, serve::prefix_reuse::disabled}) {
    serve::engine_options tight = small_steps();
    tight.max_context = 96;  // 6 blocks; the pool holds 8
    tight.reuse = reuse;
    serve::engine_stats st;
    const auto squeezed = run_all(requests, serial, tight, 8, &st);
    REQUIRE(squeezed == roomy);
    REQUIRE(st.n_preemptions > 0);
    REQUIRE(st.finished(serve::finish_kind::length) == requests.size());
  }
}

TEST_CASE("engine: n samples of one prompt prefill it once, fork its blocks, and equal n requests of their own") {
  auto& s = loaded();
  serial_executor serial;
  const auto prompt = encode(prompts[1]);
  auto solo = [&](std::uint64_t stream, std::size_t max_new) {
    recorder unused;
    auto r = sampled_request(prompts[1], 9, max_new, unused);
    r.stream = stream;
    return run_all({r}, serial, small_steps())[0];
  };
  for (const std::size_t max_new : {std::size_t{1}, std::size_t{24}}) {
    for (const std::size_t n_blocks : {std::size_t{512}, std::size_t{6}}) {  // 6: one context; forks wait
      INFO("max_new_tokens " << max_new << ", " << n_blocks << " blocks");
      cache_t cache(s.model.kv_shape(), {.n_blocks = n_blocks});
      serve::engine_options o = small_steps();
      o.max_context = 96;
      o.reuse = serve::prefix_reuse::disabled;  // so that the prompt's blocks are shared by the fork only
      serve::engine eng(s.model, cache, serial, o, &s.tok);
      recorder rec;
      auto r = sampled_request(prompts[1], 9, max_new, rec);
      r.n = 4;
      r.top_logprobs = 1;
      const auto res = eng.submit(std::move(r));
      REQUIRE(res.accepted());
      eng.run_until_idle();
      const auto st = eng.stats();
      for (std::size_t i = 0; i < 4; ++i) {
        const record got = rec.get(res.handle + static_cast<request_id>(i));
        REQUIRE(got.n_finish == 1);
        REQUIRE(got.finish_last);
        REQUIRE(got.finish.index == i);
        for (const auto& e : got.events) REQUIRE(e.index == i);
        REQUIRE(got.finish.finish == serve::finish_kind::length);
        REQUIRE(got.tokens == solo(i, max_new));
        if (n_blocks == 512 && max_new > 1 && i > 0) REQUIRE(got.finish.usage.n_prompt_tokens_reused == prompt.size());
      }
      if (n_blocks == 512) REQUIRE(st.n_prompt_tokens_prefilled == prompt.size());  // once, not 4 times
      if (n_blocks == 6 && max_new > 1) REQUIRE(st.n_prompt_tokens_prefilled > prompt.size());  // some recomputed
      REQUIRE(st.kv_blocks_used == 0);
      REQUIRE(cache.n_sequences() == 0);
      REQUIRE(st.finished(serve::finish_kind::length) == 4);
    }
  }
}

TEST_CASE("engine: a failing step ends its requests with an error, a throwing callback ends its own, work goes on") {
  auto& s = loaded();
  serial_executor serial;
  // A cache of 2 sequences for a batch of 4: the step that admits the third
  // request fails, every live request ends with an error.
  cache_t cache(s.model.kv_shape(), {.n_blocks = 128, .max_sequences = 2});
  serve::engine eng(s.model, cache, serial, small_steps(), &s.tok);
  recorder rec;
  std::vector<request_id> handles;
  for (int i = 0; i < 4; ++i)
    handles.push_back(eng.submit({.prompt = encode(prompts[static_cast<std::size_t>(i)]), .stop = {.max_new_tokens = 8},
                                  .on_event = rec.sink()}).handle);
  eng.run_until_idle();
  for (auto h : handles) {
    REQUIRE(rec.get(h).n_finish == 1);
    REQUIRE(rec.get(h).finish.finish == serve::finish_kind::error);
    REQUIRE(rec.get(h).finish.error.find("maximum number of sequences") != std::string::npos);
  }
  REQUIRE(cache.n_sequences() == 0);

  // Afterwards the engine serves again; a callback that throws ends only its request.
  const auto ok = eng.submit({.prompt = encode(prompts[0]), .stop = {.max_new_tokens = 8}, .on_event = rec.sink()});
  int calls = 0;
  std::optional<serve::stream_event> last;
  const auto bad = eng.submit({.prompt = encode(prompts[1]),
                               .stop = {.max_new_tokens = 8},
                               .on_event = [&](const serve::stream_event& e) {
                                 ++calls;
                                 last = e;
                                 if (e.type == serve::event_type::token) throw std::runtime_error("client gone");
                               }});
  eng.run_until_idle();
  REQUIRE(rec.get(ok.handle).tokens.size() == 8);
  REQUIRE(rec.get(ok.handle).finish.finish == serve::finish_kind::length);
  REQUIRE(calls == 2);  // the token that threw, then the finish
  REQUIRE(last->type == serve::event_type::finish);
  REQUIRE(last->handle == bad.handle);
  REQUIRE(last->finish == serve::finish_kind::error);
  REQUIRE(last->error == "the event callback threw");
  REQUIRE(eng.stats().kv_blocks_used == 0);
}

TEST_CASE("engine: the example of docs/serving.md runs (kept in step with the doc)") {
  const std::string path = LLMKIT_DEFAULT_MODEL;
  std::ostringstream out;
  // --- docs/serving.md "Example", with std::cout -> out and 2048 -> 512 (the model's context) ---
  auto file = model::gguf_file::open(path);
  model::llama_model llama(file);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  kv::prefix_cache<float, 16> cache(llama.kv_shape(), {.n_blocks = 2048});
  thread_pool pool(4);

  serve::engine eng(llama, cache, pool,
                    {.max_context = 512,
                     .policy = {.max_batch_seqs = 32, .max_step_tokens = 512, .chunked_prefill = true},
                     .max_queued = 256},
                    &tok);
  eng.start();  // the engine's step thread; or call eng.step() from your own loop

  serve::submit_result r = eng.submit({
      .prompt = tok.encode("Once upon a time", {.add_bos = true}),
      .sampling = "top_k(40);top_p(0.95);temperature(0.8);sample",
      .seed = 7,
      .stop = {.max_new_tokens = 128, .eos_tokens = {tok.eos()}, .stop_strings = {"\n\n"}},
      .top_logprobs = 3,
      .on_event = [&out](const serve::stream_event& e) {
        if (e.type == serve::event_type::token) out << e.text << std::flush;
        else out << "\n[" << serve::to_string(e.finish) << ", " << e.usage.n_generated_tokens << " tokens]\n";
      }});
  if (r.status == serve::submit_status::queue_full) { /* HTTP 429 */ }
  // ... eng.cancel(r.handle) from any thread, e.g. when a client disconnects
  eng.stop(serve::shutdown_mode::drain);  // finish what runs, accept nothing new
  // --- end of the example ---
  REQUIRE(r.accepted());
  INFO(out.str());
  const std::string text = out.str();
  REQUIRE(text.find(" tokens]\n") != std::string::npos);  // the finish line, once, at the end
  REQUIRE(text.find(" tokens]\n") == text.size() - 9);
  REQUIRE(text.find("\n\n") == std::string::npos);  // the stop string is never shown
}

namespace {

using paged_t = kv::paged_cache<float, 16>;
static_assert(serve::importing_cache<paged_t>);
static_assert(serve::importing_cache<cache_t>);

/// What a prefill worker hands over: `r`'s prompt prefilled in a cache of
/// its own, then `n_given` tokens drawn as the engine draws them (the first
/// from the prompt's logits, the others decoded one by one), and the KV of
/// the context before the last of them, exported.
serve::prefilled_request prefill_elsewhere(serve::generation_request r, std::size_t n_given) {
  auto& s = loaded();
  paged_t cache(s.model.kv_shape(), {.n_blocks = 32});
  const auto seq = *cache.add_sequence();
  const auto chain = sampling::runtime_chain::parse(r.sampling);
  sampling::candidates ws;
  std::vector<token_id> ctx = r.prompt;
  model::batch_builder b;
  std::size_t done = 0;
  while (ctx.size() < r.prompt.size() + n_given) {
    b.clear();
    b.add(seq, std::span<const token_id>(ctx).subspan(done), static_cast<std::int32_t>(done));
    done = ctx.size();
    const auto logits = s.model.forward(b.view(), cache).row(0);
    ctx.push_back(done == r.prompt.size() ? serve::sample_first_token(r, logits)
                                          : serve::sample_token(chain, r, ctx, logits, ws).token);
  }
  serve::prefilled_request p;
  p.generated.assign(ctx.begin() + static_cast<std::ptrdiff_t>(r.prompt.size()), ctx.end());
  p.kv = cache.export_sequence(seq);
  p.request = std::move(r);
  return p;
}

/// A mix of greedy and seeded-sampling requests over the test prompts.
std::vector<serve::generation_request> mixed_requests(std::size_t n, std::size_t max_new) {
  recorder unused;
  std::vector<serve::generation_request> out;
  for (std::size_t i = 0; i < n; ++i) {
    auto r = sampled_request(prompts[i % prompts.size()], 70 + i, max_new, unused);
    if (i % 3 == 0) r.sampling = "greedy";
    if (i % 3 == 2) r.sampling = "penalties(repeat=1.3,last_n=16);top_k(20);temperature(0.7);sample";
    r.stream = i;
    r.on_event = {};
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

TEST_CASE("engine: prefilled requests continue as if run whole, under staging back-pressure, mixed with others") {
  auto& s = loaded();
  const auto requests = mixed_requests(9, 24);
  serial_executor serial;
  const auto whole = run_all(requests, serial, small_steps());

  thread_pool pool(2);
  // On a paged cache and on a prefix cache (which imports without publishing).
  auto run = [&](auto& cache, std::size_t n_blocks) {
    serve::engine_options o = small_steps();
    o.max_context = 96;                 // 6 blocks
    o.staging_blocks = 6;               // one context: back-pressure
    serve::engine eng(s.model, cache, pool, o, &s.tok);
    recorder rec;
    // Requests 1, 2, 4, 5, 7, 8 come prefilled with 1-3 given tokens; 0, 3, 6 whole.
    std::vector<request_id> handles(requests.size());
    std::vector<std::pair<std::size_t, serve::prefilled_request>> pending;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto r = requests[i];
      r.on_event = rec.sink();
      if (i % 3 == 0) {
        const auto res = eng.submit(std::move(r));
        REQUIRE(res.accepted());
        handles[i] = res.handle;
      } else {
        pending.emplace_back(i, prefill_elsewhere(std::move(r), 1 + i % 3));
      }
    }
    std::size_t n_staging_full = 0, n_steps = 0;
    while (!pending.empty() || !eng.idle()) {
      for (auto it = pending.begin(); it != pending.end();) {
        const std::size_t kv_bytes = it->second.kv.size();
        const auto res = eng.submit_prefilled(it->second);
        if (res.status == serve::submit_status::staging_full) {
          REQUIRE(res.handle == 0);
          REQUIRE(it->second.kv.size() == kv_bytes);  // left with the caller
          ++n_staging_full;
          break;  // first come, first served
        }
        REQUIRE(res.accepted());
        handles[it->first] = res.handle;
        it = pending.erase(it);
      }
      eng.step();
      REQUIRE(++n_steps < 10'000);
    }
    REQUIRE(n_staging_full > 0);
    const auto st = eng.stats();
    for (std::size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      const record r = rec.get(handles[i]);
      REQUIRE(r.n_finish == 1);
      REQUIRE(r.finish_last);
      REQUIRE(r.finish.finish == serve::finish_kind::length);
      REQUIRE(r.tokens == whole[i]);
      REQUIRE(r.text == s.tok.decode(whole[i]));
      REQUIRE(r.finish.usage.n_generated_tokens == 24);
      const std::size_t n_given = i % 3 == 0 ? 0 : 1 + i % 3;
      for (std::size_t k = 0; k < r.events.size(); ++k) REQUIRE(r.events[k].prefilled == (k < n_given));
    }
    REQUIRE(st.n_imported == 6);
    REQUIRE(st.n_rejected_staging_full == n_staging_full);
    REQUIRE(st.n_generated_tokens == 9 * 24 - (2 + 3 + 2 + 3 + 2 + 3));  // the given ones were not sampled here
    if (n_blocks == 8) REQUIRE(st.n_preemptions > 0);
    REQUIRE(st.kv_blocks_used == 0);
    REQUIRE(st.staging_blocks_used == 0);
    REQUIRE(cache.n_sequences() == 0);
    REQUIRE(cache.pool().n_free() + st.kv_blocks_cached == n_blocks);
  };
  for (const std::size_t n_blocks : {std::size_t{512}, std::size_t{8}}) {  // 8: preempts imported requests
    INFO(n_blocks << " blocks");
    paged_t paged(s.model.kv_shape(), {.n_blocks = n_blocks});
    run(paged, n_blocks);
    cache_t prefix(s.model.kv_shape(), {.n_blocks = n_blocks});
    run(prefix, n_blocks);
  }

  // The engine's own thread, prefilled requests arriving from this one and
  // retried while the staging area is full.
  paged_t cache(s.model.kv_shape(), {.n_blocks = 64});
  serve::engine_options o = small_steps();
  o.max_context = 96;
  o.staging_blocks = 6;
  serve::engine eng(s.model, cache, pool, o, &s.tok);
  recorder rec;
  std::vector<serve::prefilled_request> ready;  // prefilled first: the model's forward is not reentrant
  for (auto r : requests) {
    r.on_event = rec.sink();
    ready.push_back(prefill_elsewhere(std::move(r), 1));
  }
  eng.start();
  std::vector<request_id> handles;
  for (auto& p : ready) {
    serve::submit_result res;
    for (int tries = 0; (res = eng.submit_prefilled(p)).status == serve::submit_status::staging_full; ++tries) {
      REQUIRE(tries < 100'000);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    REQUIRE(res.accepted());
    handles.push_back(res.handle);
  }
  REQUIRE(eng.wait_idle(std::chrono::seconds(60)));
  eng.stop();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    REQUIRE(rec.get(handles[i]).n_finish == 1);
    REQUIRE(rec.get(handles[i]).tokens == whole[i]);
  }
  REQUIRE(eng.stats().kv_blocks_used == 0);
  REQUIRE(eng.stats().staging_blocks_used == 0);
}

TEST_CASE("engine: a corrupt KV buffer ends only its request, staged requests cancel, bad submissions are refused") {
  auto& s = loaded();
  serial_executor serial;
  const auto requests = mixed_requests(3, 12);
  const auto whole = run_all(requests, serial, small_steps());
  paged_t cache(s.model.kv_shape(), {.n_blocks = 128});
  serve::engine_options o = small_steps();
  o.staging_blocks = 64;
  serve::engine eng(s.model, cache, serial, o, &s.tok);
  recorder rec;
  auto with_sink = [&](serve::generation_request r) {
    r.on_event = rec.sink();
    return r;
  };
  auto good = prefill_elsewhere(with_sink(requests[1]), 2);
  auto flipped = prefill_elsewhere(with_sink(requests[1]), 2);
  flipped.kv[flipped.kv.size() / 2] ^= std::byte{0x10};  // the checksum catches it
  auto truncated = prefill_elsewhere(with_sink(requests[2]), 1);
  truncated.kv.resize(truncated.kv.size() - 8);
  auto too_short = prefill_elsewhere(with_sink(requests[2]), 1);  // KV of one token less than the context
  too_short.generated.push_back(too_short.generated.back());
  auto empty = prefill_elsewhere(with_sink(requests[2]), 1);
  empty.kv.clear();
  std::vector<request_id> bad;
  for (auto* p : {&flipped, &truncated, &too_short, &empty}) {
    const auto res = eng.submit_prefilled(*p);
    REQUIRE(res.accepted());
    bad.push_back(res.handle);
  }
  const auto h_good = eng.submit_prefilled(good).handle;
  const auto h_whole = eng.submit(with_sink(requests[0])).handle;
  eng.run_until_idle();
  for (const auto h : bad) {
    const record r = rec.get(h);
    INFO(r.finish.error);
    REQUIRE(r.n_finish == 1);
    REQUIRE(r.finish.finish == serve::finish_kind::error);
    REQUIRE(r.finish.error.find("importing the KV buffer: ") == 0);
  }
  REQUIRE(rec.get(bad[0]).finish.error.find("checksum") != std::string::npos);
  REQUIRE(rec.get(bad[2]).finish.error.find("the request's context needs") != std::string::npos);
  REQUIRE(rec.get(h_good).tokens == whole[1]);
  REQUIRE(rec.get(h_good).n_finish == 1);
  REQUIRE(rec.get(h_whole).tokens == whole[0]);
  auto st = eng.stats();
  REQUIRE(st.n_imported == 1);
  REQUIRE(st.finished(serve::finish_kind::error) == 4);
  REQUIRE(st.kv_blocks_used == 0);
  REQUIRE(st.staging_blocks_used == 0);
  REQUIRE(cache.n_sequences() == 0);

  // Given tokens that already end the request: it finishes at once, its KV
  // never imported.
  auto budget = prefill_elsewhere(with_sink(requests[0]), 2);
  budget.request.stop.max_new_tokens = 2;
  auto eos = prefill_elsewhere(with_sink(requests[0]), 3);
  eos.request.stop.eos_tokens = {eos.generated[1]};
  const auto h_budget = eng.submit_prefilled(budget).handle;
  const auto h_eos = eng.submit_prefilled(eos).handle;
  eng.run_until_idle();
  REQUIRE(rec.get(h_budget).tokens == std::vector<token_id>(whole[0].begin(), whole[0].begin() + 2));
  REQUIRE(rec.get(h_budget).finish.reason == finish_reason::max_tokens);
  REQUIRE(rec.get(h_eos).tokens == std::vector<token_id>(whole[0].begin(), whole[0].begin() + 2));
  REQUIRE(rec.get(h_eos).finish.reason == finish_reason::eos);
  REQUIRE(rec.get(h_eos).n_finish == 1);
  REQUIRE(eng.stats().n_imported == 1);

  // Cancelled while staged (cancellations come after the step's
  // submissions): one cancelled finish, the staging blocks back.
  auto staged = prefill_elsewhere(with_sink(requests[2]), 1);
  const auto h_staged = eng.submit_prefilled(staged).handle;
  REQUIRE(eng.stats().staging_blocks_used > 0);
  eng.cancel(h_staged);
  eng.step();
  REQUIRE(rec.get(h_staged).n_finish == 1);
  REQUIRE(rec.get(h_staged).finish.finish == serve::finish_kind::cancelled);
  REQUIRE(rec.get(h_staged).tokens.size() == 1);  // the given token
  REQUIRE(eng.stats().staging_blocks_used == 0);
  REQUIRE(eng.stats().n_imported == 1);

  // Refused at submit, with one error finish each.
  auto two = prefill_elsewhere(with_sink(requests[0]), 1);
  two.request.n = 2;
  const auto r_two = eng.submit_prefilled(two);
  REQUIRE(r_two.status == serve::submit_status::invalid);
  REQUIRE(rec.get(r_two.handle).n_finish == 1);
  auto outside = prefill_elsewhere(with_sink(requests[0]), 1);
  outside.generated[0] = 100000;
  REQUIRE(eng.submit_prefilled(outside).message.find("generated[0] = 100000 is outside the vocabulary") !=
          std::string::npos);
  auto none = prefill_elsewhere(with_sink(requests[0]), 1);
  none.generated.clear();
  REQUIRE(eng.submit_prefilled(none).status == serve::submit_status::invalid);

  // Shutdown cancels a staged request too.
  auto left = prefill_elsewhere(with_sink(requests[1]), 1);
  const auto h_left = eng.submit_prefilled(left).handle;
  eng.stop();
  REQUIRE(rec.get(h_left).n_finish == 1);
  REQUIRE(rec.get(h_left).finish.finish == serve::finish_kind::cancelled);
  REQUIRE(eng.stats().staging_blocks_used == 0);
  REQUIRE(eng.stats().kv_blocks_used == 0);
  REQUIRE(cache.n_sequences() == 0);

  serve::engine_options small = small_steps();
  small.staging_blocks = 1;  // less than any of these contexts
  serve::engine tiny(s.model, cache, serial, small, &s.tok);
  auto big = prefill_elsewhere(requests[1], 1);
  REQUIRE(tiny.submit_prefilled(big).message.find("the staging area holds 1") != std::string::npos);
  serve::engine no_staging(s.model, cache, serial, small_steps(), &s.tok);
  REQUIRE(no_staging.submit_prefilled(big).message.find("no staging area") != std::string::npos);
  // Request-level batching cannot stage (it never swaps a request in).
  small.policy.mode = sched::batching::request_level;
  small.policy.max_step_tokens = 256;
  REQUIRE_THROWS_WITH(serve::engine(s.model, cache, serial, small), Catch::Contains("needs continuous batching"));
}

TEST_CASE("engine: every architecture runs, its greedy tokens equal the model's own greedy decoding") {
  // Synthetic files of each architecture; a window of 4 positions (gemma,
  // phi3) that 20 new tokens after a 6-token prompt run far past.
  for (const auto arch : {model::architecture::qwen3, model::architecture::gemma2, model::architecture::gemma3,
                          model::architecture::phi3, model::architecture::qwen2, model::architecture::llama}) {
    model::llama_config c;
    c.arch = arch;
    c.n_vocab = 300;
    // Heads of 64, which every build's attention kernels have (the tsan
    // preset's only 8 and 64); qwen3's heads are wider than dim / n_heads.
    const bool wide = arch == model::architecture::qwen3;
    c.dim = 128;
    c.n_layers = 3;
    c.n_heads = wide ? 4 : 2;
    c.n_kv_heads = wide ? 2 : 1;
    c.head_dim = 64;
    c.ffn_dim = 96;
    c.context_length = 64;
    c.sliding_window = arch == model::architecture::gemma2 || arch == model::architecture::gemma3 ||
                               arch == model::architecture::phi3
                           ? 4
                           : 0;
    if (arch == model::architecture::gemma2) c.final_softcap = 5.0f;
    const auto image = model::synthetic_llama({.config = c, .seed = 77, .tied_output = true}).bytes();
    const model::gguf_file file{std::span<const std::byte>(image)};
    model::llama_model m(file);
    INFO(model::traits(arch).name);
    serial_executor serial;
    recorder rec;
    cache_t cache(m.kv_shape(), {.n_blocks = 16});
    serve::engine eng(m, cache, serial, small_steps());
    const std::vector<token_id> prompt{1, 17, 299, 3, 42, 8};
    const auto h = eng.submit({.prompt = prompt, .stop = {.max_new_tokens = 20}, .on_event = rec.sink()}).handle;
    eng.run_until_idle();
    const record r = rec.get(h);

    cache_t ref(m.kv_shape(), {.n_blocks = 16});
    const auto seq = *ref.add_sequence();
    std::vector<token_id> ctx = prompt, expected;
    std::size_t done = 0;
    model::batch_builder b;
    while (expected.size() < 20) {
      b.clear();
      b.add(seq, std::span<const token_id>(ctx).subspan(done), static_cast<std::int32_t>(done));
      done = ctx.size();
      const auto row = m.forward(b.view(), ref).row(0);
      const auto t = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
      expected.push_back(t);
      ctx.push_back(t);
    }
    REQUIRE(r.tokens == expected);
  }
}

namespace {

// The tokens of one request alone, and among four others (chunked prefill
// mixed with decode steps), are the same, serially and on 2 threads.
void check_tokens_alone_equal_batched(model::llama_model& m) {
  auto run = [&](const std::vector<std::vector<token_id>>& prompts, auto& exec) {
    cache_t cache(m.kv_shape(), {.n_blocks = 64});
    serve::engine eng(m, cache, exec, small_steps(16));
    recorder rec;
    std::vector<request_id> handles;
    for (const auto& p : prompts)
      handles.push_back(
          eng.submit({.prompt = p, .stop = {.max_new_tokens = 12}, .on_event = rec.sink()}).handle);
    eng.run_until_idle();
    std::vector<std::vector<token_id>> out;
    for (auto h : handles) out.push_back(rec.get(h).tokens);
    return out;
  };
  serial_executor serial;
  thread_pool pool(2);
  const std::vector<token_id> target{1, 17, 299, 3, 42, 8, 100, 7, 7};
  const auto alone = run({target}, serial)[0];
  REQUIRE(alone.size() == 12);
  std::vector<std::vector<token_id>> busy{{5, 6}, {250, 3, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, target,
                                          {42}, {8, 8, 8, 8, 8}};
  REQUIRE(run(busy, serial)[2] == alone);
  REQUIRE(run(busy, pool)[2] == alone);
  REQUIRE(run({target}, pool)[0] == alone);
}

}  // namespace

TEST_CASE("engine: a qwen3moe request's tokens are the same alone and in a batch, on 1 and 2 threads") {
  model::llama_config c;
  c.arch = model::architecture::qwen3moe;
  c.n_vocab = 300;
  c.dim = 256;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.ffn_dim = 256;
  c.n_expert = 8;
  c.n_expert_used = 2;
  c.expert_ffn_dim = 256;
  c.context_length = 128;
  const auto image =
      model::synthetic_llama({.config = c, .weight_type = model::ggml_type::q4_k, .seed = 48}).bytes();
  const model::gguf_file file{std::span<const std::byte>(image)};
  model::llama_model m(file);  // int8 activations
  check_tokens_alone_equal_batched(m);
}

TEST_CASE("engine: a gpt-oss request's tokens are the same alone and in a batch, on 1 and 2 threads") {
  model::llama_config c;
  c.arch = model::architecture::gpt_oss;
  c.n_vocab = 300;
  c.dim = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.ffn_dim = 128;
  c.n_expert = 4;
  c.n_expert_used = 2;
  c.expert_ffn_dim = 128;
  c.context_length = 128;
  c.sliding_window = 5;  // even layers see 5 tokens: less than most of these contexts
  c.rope.freq_scale = 0.25f;
  c.rope.yarn = {.ext_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .original_context = 32};
  const auto image =
      model::synthetic_llama({.config = c, .weight_type = model::ggml_type::mxfp4, .seed = 49}).bytes();
  const model::gguf_file file{std::span<const std::byte>(image)};
  model::llama_model m(file);  // int8 activations
  check_tokens_alone_equal_batched(m);
}
