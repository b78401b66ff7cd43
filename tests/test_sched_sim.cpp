// SPDX-License-Identifier: MIT
// sched/simulator.hpp and sched/trace.hpp: the serving loop in virtual time.
#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/simulator.hpp>
#include <llmkit/sched/trace.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <set>

using namespace llmkit::sched;
using llmkit::request_id;
using llmkit::token_id;

namespace {
// Every non-empty step costs 1 s: times count steps.
const cost_model one_second_steps{
    .model = {.n_layers = 1, .dim = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 1, .ffn_dim = 1, .vocab = 1},
    .machine = {.peak_flops = 1e300, .bandwidth = 1e300, .step_overhead_s = 1.0}};

bool same(const run_result& a, const run_result& b) {
  if (a.requests.size() != b.requests.size() || a.n_steps != b.n_steps || a.makespan_s != b.makespan_s) return false;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    const auto &x = a.requests[i], &y = b.requests[i];
    if (x.id != y.id || x.first_token_s != y.first_token_s || x.finish_s != y.finish_s || x.n_output != y.n_output)
      return false;
  }
  return a.ttft_p99_s == b.ttft_p99_s && a.tpot_p99_s == b.tpot_p99_s && a.kv_use_mean == b.kv_use_mean;
}
}  // namespace

TEST_CASE("percentile interpolates between order statistics") {
  REQUIRE(percentile({}, 0.5) == 0.0);
  REQUIRE(percentile({3.0}, 0.99) == 3.0);
  REQUIRE(percentile({4, 1, 3, 2}, 0.0) == 1.0);
  REQUIRE(percentile({4, 1, 3, 2}, 1.0) == 4.0);
  REQUIRE(percentile({4, 1, 3, 2}, 0.5) == 2.5);
  REQUIRE(percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0.99) == Approx(10.9).epsilon(1e-15));
  REQUIRE_THROWS_WITH(percentile({1.0}, 1.5), "percentile: q must be in [0, 1], got 1.5");
}

TEST_CASE("simulator: hand-traced timelines of request-level and continuous batching") {
  const std::vector<trace_request> trace = {
      {.id = 0, .arrival_s = 0.0, .n_prompt = 4, .n_output = 3, .max_new_tokens = 3},
      {.id = 1, .arrival_s = 0.0, .n_prompt = 2, .n_output = 1, .max_new_tokens = 1},
      {.id = 2, .arrival_s = 0.5, .n_prompt = 3, .n_output = 2, .max_new_tokens = 2}};
  const engine_limits limits{.max_context = 16, .block_size = 4, .n_blocks = 16};
  std::map<request_id, request_timing> t;

  // Request-level: C waits for the batch {A, B}; B's slot idles.
  const run_result rl =
      simulate(trace, limits, {.mode = batching::request_level, .max_batch_seqs = 2, .max_step_tokens = 16},
               one_second_steps, {.record_steps = true});
  for (const auto& r : rl.requests) t[r.id] = r;
  REQUIRE(rl.n_steps == 5);
  REQUIRE(t[0].first_token_s == Approx(1));
  REQUIRE(t[0].finish_s == Approx(3));
  REQUIRE(t[1].finish_s == Approx(1));
  REQUIRE(t[2].first_token_s == Approx(4));
  REQUIRE(t[2].finish_s == Approx(5));
  REQUIRE(t[2].ttft_s() == Approx(3.5));
  REQUIRE(rl.makespan_s == Approx(5));
  REQUIRE(rl.tokens_per_s == Approx(6.0 / 5));
  REQUIRE(rl.steps[1].n_computed_tokens == 2);  // A's decode and B's idle slot
  REQUIRE(rl.steps[0].n_computed_tokens == 8);  // 2 rows padded to 4

  // Continuous: C joins as soon as it arrives.
  const run_result cb = simulate(trace, limits, {.max_batch_seqs = 2, .max_step_tokens = 16}, one_second_steps);
  t.clear();
  for (const auto& r : cb.requests) t[r.id] = r;
  REQUIRE(cb.n_steps == 3);
  REQUIRE(t[2].first_token_s == Approx(2));
  REQUIRE(t[2].finish_s == Approx(3));
  REQUIRE(t[0].finish_s == Approx(3));
  REQUIRE(cb.makespan_s == Approx(3));
  REQUIRE(cb.generated_tokens == 6);
  REQUIRE(cb.prompt_tokens == 9);
  REQUIRE(cb.tokens_per_s == Approx(2));
  REQUIRE(cb.ttft_mean_s == Approx(3.5 / 3));
  REQUIRE(cb.ttft_p50_s == Approx(1));
  REQUIRE(cb.ttft_p99_s == Approx(1.49));
  REQUIRE(cb.tpot_p50_s == Approx(1));
  REQUIRE(cb.itl_p99_s == Approx(1));
  // KV blocks of 4 tokens: {A 1, B 1}, then {A 2, C 1} twice, of 16.
  REQUIRE(cb.kv_use_peak == Approx(3.0 / 16));
  REQUIRE(cb.kv_use_mean == Approx(8.0 / 48));
  REQUIRE(cb.padding_overhead == 1.0);
}

TEST_CASE("simulator: deterministic, every request finishes once with its output length, under every policy") {
  const workload w{.n_requests = 60,
                   .rate = 20.0,
                   .prompt_lengths = {.shape = llmkit::pack::length_shape::lognormal, .min_length = 1, .max_length = 200,
                                      .median = 30, .p99 = 180},
                   .output_lengths = {.shape = llmkit::pack::length_shape::uniform, .min_length = 1, .max_length = 50},
                   .max_new_tokens = 56,
                   .seed = 5};
  const auto trace = make_trace(w);
  REQUIRE(trace.size() == 60);
  REQUIRE(make_trace(w).front().n_prompt == trace.front().n_prompt);
  workload w2 = w;
  w2.seed = 6;
  bool differs = false;
  for (std::size_t i = 0; i < trace.size(); ++i) differs |= make_trace(w2)[i].n_prompt != trace[i].n_prompt;
  REQUIRE(differs);
  for (std::size_t i = 1; i < trace.size(); ++i) REQUIRE(trace[i].arrival_s >= trace[i - 1].arrival_s);

  const engine_limits limits{.max_context = 256, .block_size = 16, .n_blocks = 20, .n_swap_blocks = 16};
  const cost_model cm{.model = {.n_layers = 4, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                                .ffn_dim = 128, .vocab = 256},
                      .machine = {.peak_flops = 1e10, .bandwidth = 1e9, .step_overhead_s = 1e-4}};
  const std::vector<policy> policies = {
      {.mode = batching::request_level, .max_batch_seqs = 8, .max_step_tokens = 2048},
      {.max_batch_seqs = 8, .max_step_tokens = 512},
      {.max_batch_seqs = 8, .max_step_tokens = 64, .chunked_prefill = true},
      {.max_batch_seqs = 8, .max_step_tokens = 64, .chunked_prefill = true, .preempt = preemption::swap},
      {.max_batch_seqs = 8, .max_step_tokens = 1024, .layout = prefill_layout::packed, .row_capacity = 256},
      {.max_batch_seqs = 8, .max_step_tokens = 1024, .layout = prefill_layout::padded, .length_window = 8}};
  std::int64_t expected_tokens = 0, expected_prompt = 0;
  for (const auto& r : trace) {
    expected_tokens += r.n_output;
    expected_prompt += r.n_prompt;
  }
  std::int64_t preemptions = 0;
  for (const policy& p : policies) {
    const run_result a = simulate(trace, limits, p, cm);
    REQUIRE(same(a, simulate(trace, limits, p, cm)));
    REQUIRE(a.requests_done == 60);
    REQUIRE(a.generated_tokens == expected_tokens);
    REQUIRE(a.prompt_tokens == expected_prompt);
    std::set<request_id> ids;
    for (const auto& r : a.requests) {
      REQUIRE(ids.insert(r.id).second);
      REQUIRE(r.n_output == trace[static_cast<std::size_t>(r.id)].n_output);
      REQUIRE(r.first_token_s > r.arrival_s);
      REQUIRE(r.finish_s >= r.first_token_s);
    }
    REQUIRE(a.kv_use_peak <= 1.0);
    REQUIRE(a.kv_use_mean > 0.0);
    REQUIRE(a.kv_use_mean <= a.kv_use_peak);
    REQUIRE(a.ttft_p50_s <= a.ttft_p99_s);
    REQUIRE(a.tpot_p50_s <= a.tpot_p99_s);
    REQUIRE(a.padding_overhead >= 1.0);
    preemptions += a.n_preemptions;
  }
  REQUIRE(preemptions > 0);  // the pool of 20 blocks is tight enough to preempt

  // Bad traces.
  auto bad = trace;
  bad[3].n_output = bad[3].max_new_tokens + 1;
  REQUIRE_THROWS_WITH(simulate(bad, limits, policies[1], cm),
                      "trace: request 3: n_output = 57 is outside [1, max_new_tokens = 56]");
  bad = trace;
  bad[4].id = bad[2].id;
  REQUIRE_THROWS_WITH(simulate(bad, limits, policies[1], cm), "submit: duplicate request id 2");
  REQUIRE_THROWS_WITH(make_trace({.rate = -1}), "make_trace: rate must be >= 0 requests/s, got -1");
}
