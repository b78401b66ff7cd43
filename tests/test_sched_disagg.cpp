// SPDX-License-Identifier: MIT
// sched/disaggregation.hpp: prefill/decode workers joined by a KV hand-off,
// simulated, and driven for real through paged_cache export/import.
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/sched/disaggregation.hpp>
#include <llmkit/sched/scheduler.hpp>
#include <llmkit/sched/state.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "reference/sched_reference.hpp"

using namespace llmkit::sched;
using llmkit::request_id;
using llmkit::token_id;

namespace {
const cost_model one_second_steps{
    .model = {.n_layers = 1, .dim = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 1, .ffn_dim = 1, .vocab = 1},
    .machine = {.peak_flops = 1e300, .bandwidth = 1e300, .step_overhead_s = 1.0}};
}

TEST_CASE("submit_prefilled stages a request with its KV in the swap space, with back-pressure") {
  sched_state s = make_state({.max_context = 32, .block_size = 4, .n_blocks = 10, .n_swap_blocks = 10});
  REQUIRE(submit_prefilled(s, 1, 9, 5));  // 9 cached tokens: 3 blocks
  REQUIRE(s.swapped.size() == 1);
  REQUIRE(s.swapped[0].n_cached == 9);
  REQUIRE(s.swapped[0].n_generated == 1);
  REQUIRE(s.n_free_swap_blocks == 7);
  REQUIRE(submit_prefilled(s, 2, 20, 8, 3));  // 22 cached: 6 blocks
  REQUIRE_FALSE(submit_prefilled(s, 3, 8, 2));  // needs 2 > 1 free: retry later
  REQUIRE_FALSE(s.seen_ids.contains(3));
  REQUIRE(sched_reference::check_state(s).empty());
  REQUIRE_THROWS_WITH(submit_prefilled(s, 1, 3, 2), "submit_prefilled: duplicate request id 1");
  REQUIRE_THROWS_WITH(submit_prefilled(s, 4, 3, 2, 2), "submit_prefilled: request 4: n_generated = 2 is outside [1, "
                                                       "max_new_tokens = 2)");
  // The decode policy swaps them in and decodes position 9 (and 22).
  const policy p{.max_step_tokens = 32};
  const step_plan plan = plan_step(s, p);
  REQUIRE(plan.swapped_in == std::vector<block_move>{{1, 3}, {2, 6}});
  REQUIRE(plan.items == std::vector<step_item>{{1, 9, 1, true, false}, {2, 22, 1, true, false}});
  REQUIRE(sched_reference::check_plan(s, p, plan).empty());
}

TEST_CASE("simulate_disaggregated: a hand-traced timeline and conservation on a random trace") {
  disaggregated_config c{
      .prefill_limits = {.max_context = 64, .block_size = 4, .n_blocks = 16},
      .prefill_policy = {.max_step_tokens = 64, .layout = prefill_layout::packed},
      .prefill_cost = one_second_steps,
      .decode_limits = {.max_context = 64, .block_size = 4, .n_blocks = 16, .n_swap_blocks = 16},
      .decode_policy = {.max_step_tokens = 64},
      .decode_cost = one_second_steps,
      .link_bandwidth = 1e300,
      .link_latency_s = 0.25};
  const run_result r = simulate_disaggregated(
      {{.id = 0, .arrival_s = 0, .n_prompt = 4, .n_output = 3, .max_new_tokens = 3},
       {.id = 1, .arrival_s = 0, .n_prompt = 5, .n_output = 1, .max_new_tokens = 4}},
      c);
  REQUIRE(r.requests_done == 2);
  std::map<request_id, request_timing> t;
  for (const auto& x : r.requests) t[x.id] = x;
  REQUIRE(t[1].finish_s == Approx(1));  // one token: done on the prefill worker
  REQUIRE(t[0].first_token_s == Approx(1));
  REQUIRE(t[0].finish_s == Approx(3.25));  // hand-off at 1.25, two decode steps
  REQUIRE(t[0].tpot_s() == Approx(1.125));
  REQUIRE(r.makespan_s == Approx(3.25));
  REQUIRE(r.generated_tokens == 4);

  const auto trace = make_trace({.n_requests = 50, .rate = 3, .prompt_lengths = {.min_length = 1, .max_length = 40},
                                 .output_lengths = {.min_length = 1, .max_length = 20}, .seed = 3});
  c.decode_limits.n_blocks = 20;  // tight: decode preempts
  c.decode_policy.preempt = preemption::swap;
  const run_result a = simulate_disaggregated(trace, c), b = simulate_disaggregated(trace, c);
  REQUIRE(a.requests_done == 50);
  std::int64_t want = 0;
  for (const auto& x : trace) want += x.n_output;
  REQUIRE(a.generated_tokens == want);
  std::set<request_id> ids;
  for (const auto& x : a.requests) {
    REQUIRE(ids.insert(x.id).second);
    REQUIRE(x.n_output == trace[static_cast<std::size_t>(x.id)].n_output);
  }
  REQUIRE(a.makespan_s == b.makespan_s);
  REQUIRE(a.ttft_p99_s == b.ttft_p99_s);
  c.decode_limits.n_swap_blocks = 3;
  REQUIRE_THROWS_WITH(simulate_disaggregated(trace, c),
                      "disaggregated_config: decode_limits.n_swap_blocks = 3 cannot stage one sequence of max_context "
                      "(needs 16 blocks)");
}

namespace {

using cache_t = llmkit::kv::paged_cache<float, 4>;

// A worker: a scheduler and a paged cache whose K rows hold the token ids;
// the "model" samples a hash of the K rows it reads back from the cache.
struct worker {
  scheduler sched;
  cache_t cache;
  std::map<request_id, llmkit::kv::seq_id> seq;
  std::map<request_id, std::vector<std::byte>> host;  // swapped-out or received buffers
  std::int64_t n_moves = 0;                             // preemptions and swap-outs

  std::int32_t sample(llmkit::kv::seq_id s) const {
    std::vector<std::int32_t> ctx;
    for (std::size_t i = 0; i < cache.n_chunks(s); ++i) {
      const auto c = cache.chunk(s, 0, 0, i);
      for (std::size_t t = 0; t < c.n_tokens; ++t) ctx.push_back(static_cast<std::int32_t>(c.k[t * c.row_stride]));
    }
    return sched_reference::fake_engine::next_token(ctx, 40);
  }

  // Runs one step; returns the finished requests.
  std::vector<finished_request> step() {
    const step_plan& plan = sched.next_step();
    n_moves += static_cast<std::int64_t>(plan.preempted.size() + plan.swapped_out.size());
    for (const auto& m : plan.preempted) {
      cache.free(seq.at(m.id));
      seq.erase(m.id);
    }
    for (const auto& m : plan.swapped_out) {
      host[m.id] = cache.export_sequence(seq.at(m.id));
      cache.free(seq.at(m.id));
      seq.erase(m.id);
    }
    for (const auto& m : plan.swapped_in) {
      const auto s = cache.import_sequence(host.at(m.id));
      REQUIRE(s);
      seq[m.id] = *s;
      host.erase(m.id);
    }
    std::vector<token_id> sampled;
    for (const step_item& it : plan.items) {
      if (!seq.contains(it.id)) seq[it.id] = *cache.add_sequence();
      const auto s = seq.at(it.id);
      REQUIRE(cache.n_tokens(s) == static_cast<std::size_t>(it.first_pos));
      REQUIRE(cache.grow(s, static_cast<std::size_t>(it.n_tokens)));
      const request& r = sched.get(it.id);
      std::vector<float> rows;
      const auto out = sched.output(it.id);
      for (std::int64_t pos = it.first_pos; pos < it.first_pos + it.n_tokens; ++pos) {
        const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
        rows.push_back(static_cast<float>(pos < n_prompt ? r.prompt[pos] : out[pos - n_prompt]));
      }
      cache.store(s, 0, static_cast<std::size_t>(it.first_pos), rows, rows);
      if (it.samples) sampled.push_back(sample(s));
    }
    return sched.complete_step(sampled);
  }

  // Frees the cache sequence of a finished request; returns its KV buffer
  // when `keep`.
  std::vector<std::byte> release(request_id id, bool keep) {
    std::vector<std::byte> buffer;
    if (auto it = seq.find(id); it != seq.end()) {
      if (keep) buffer = cache.export_sequence(it->second);
      cache.free(it->second);
      seq.erase(it);
    }
    return buffer;
  }
};

std::vector<token_id> solo(const request& r) {
  std::vector<std::int32_t> ctx(r.prompt.begin(), r.prompt.end());
  std::vector<token_id> out;
  while (true) {
    out.push_back(sched_reference::fake_engine::next_token(ctx, 40));
    if (r.stop.check(out)) return out;
    ctx.push_back(out.back());
  }
}

}  // namespace

TEST_CASE("disaggregated serving through paged_cache export/import equals solo runs, under preemption") {
  struct handoff {
    request_id id;
    std::vector<std::byte> buffer;
    std::vector<token_id> generated;
  };
  for (const preemption mode : {preemption::recompute, preemption::swap}) {
    std::int64_t moves = 0, handoffs = 0;
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
      INFO("seed " << seed << " swap " << (mode == preemption::swap));
      std::mt19937 rng(seed);
      const llmkit::kv::kv_shape shape{1, 1, 1};
      worker prefill{scheduler({.max_context = 48, .block_size = 4, .n_blocks = 24},
                               policy{.max_batch_seqs = 4, .max_step_tokens = 48, .layout = prefill_layout::packed}),
                     cache_t(shape, {.n_blocks = 24}), {}, {}};
      worker decode{scheduler({.max_context = 48, .block_size = 4, .n_blocks = 14, .n_swap_blocks = 24},
                              policy{.max_batch_seqs = 6, .max_step_tokens = 48, .preempt = mode}),
                    cache_t(shape, {.n_blocks = 14}), {}, {}};
      std::map<request_id, request> requests;
      std::map<request_id, std::vector<token_id>> outputs;
      std::vector<handoff> link;  // buffers waiting for staging room on the decode worker
      const int n = 30;
      int next = 0, steps = 0;
      while (static_cast<int>(outputs.size()) < n) {
        if (next < n && rng() % 2 == 0) {
          request r;
          r.id = next++;
          for (std::uint32_t i = 0, len = 1 + rng() % 25; i < len; ++i)
            r.prompt.push_back(static_cast<token_id>(rng() % 40));
          r.stop.max_new_tokens = 1 + rng() % 20;
          if (rng() % 3 == 0) r.stop.eos_tokens = {static_cast<token_id>(rng() % 40)};
          requests[r.id] = r;
          request first = r;
          first.stop.max_new_tokens = 1;  // the prefill worker stops after the first token
          prefill.sched.submit(first);
        }
        if (!prefill.sched.idle()) {
          for (auto& f : prefill.step()) {
            const request& r = requests.at(f.id);
            const bool done = r.stop.check(f.output).has_value();
            auto buffer = prefill.release(f.id, !done);
            if (done)
              outputs[f.id] = f.output;
            else
              link.push_back({f.id, std::move(buffer), f.output});
          }
        }
        while (!link.empty() && decode.sched.submit_prefilled(requests.at(link.front().id), link.front().generated)) {
          decode.host[link.front().id] = std::move(link.front().buffer);
          link.erase(link.begin());
          ++handoffs;
        }
        if (!decode.sched.idle()) {
          for (auto& f : decode.step()) {
            decode.release(f.id, false);
            REQUIRE(outputs.emplace(f.id, f.output).second);
          }
        }
        REQUIRE(++steps < 20000);
      }
      for (const auto& [id, out] : outputs) REQUIRE(out == solo(requests.at(id)));
      REQUIRE(decode.cache.pool().n_free() == 14);
      REQUIRE(prefill.cache.pool().n_free() == 24);
      REQUIRE(decode.host.empty());
      moves += decode.n_moves;
    }
    REQUIRE(handoffs > 0);
    REQUIRE(moves > 0);  // the decode pool of 14 blocks does preempt
  }
}
