// SPDX-License-Identifier: MIT
// sched/cost_model.hpp: the roofline cost of a step plan, and latency targets.
#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/state.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "reference/sched_reference.hpp"

using namespace llmkit::sched;
using llmkit::request_id;
using llmkit::token_id;

namespace {
const llama_config tiny{.n_layers = 2, .dim = 4, .n_heads = 2, .n_kv_heads = 1, .head_dim = 2, .ffn_dim = 8,
                        .vocab = 10, .bytes_per_weight = 2, .bytes_per_kv = 1};
}

TEST_CASE("cost model: a hand-computed mixed step") {
  // Per layer: wq 4x4, wk/wv 4x2 each, wo 4x4, FFN 3 x 4x8 -> 144 weights,
  // 288 FLOPs per token; LM head 10x4 -> 80 FLOPs per sample.
  REQUIRE(tiny.weights_per_layer() == 144);
  REQUIRE(tiny.n_weights() == 2 * 144 + 40);
  REQUIRE(tiny.kv_bytes_per_token() == 2 * 2 * 2 * 1);
  step_plan plan;
  plan.items = {{.id = 0, .first_pos = 5, .n_tokens = 1, .samples = true, .is_prefill = false},
                {.id = 1, .first_pos = 0, .n_tokens = 3, .samples = true, .is_prefill = true}};
  const cost_model cm{.model = tiny, .machine = {.peak_flops = 1000, .bandwidth = 500, .step_overhead_s = 0.5}};
  REQUIRE_NOTHROW(cm.validate());
  const step_cost c = cm(plan);
  REQUIRE(c.linear_flops == 4 * 2 * 288 + 2 * 80);               // 2464
  REQUIRE(c.attention_flops == 4 * 2 * 2 * (6 + 6) * 2);          // pairs: 5+1 and 1+2+3; 384
  REQUIRE(c.weight_bytes == (2 * 144 + 40) * 2);                  // 656
  REQUIRE(c.kv_read_bytes == (6 + 3) * 4 * 2);                    // 72
  REQUIRE(c.kv_write_bytes == 4 * 4 * 2);                         // 32
  REQUIRE(c.compute_s == Approx(2.848).epsilon(1e-12));
  REQUIRE(c.memory_s == Approx(1.52).epsilon(1e-12));
  REQUIRE(c.compute_bound());
  REQUIRE(c.time_s == Approx(2.848 + 0.5).epsilon(1e-12));
  REQUIRE(cm(step_plan{}).time_s == 0.0);  // an empty step costs nothing
  // Memory-bound when the bandwidth is low.
  const cost_model slow{.model = tiny, .machine = {.peak_flops = 1e6, .bandwidth = 100}};
  REQUIRE_FALSE(slow(plan).compute_bound());
  REQUIRE(slow(plan).time_s == Approx(7.6).epsilon(1e-12));
}

TEST_CASE("cost model: padding, packing, idle slots and swaps are costed as documented") {
  const cost_model cm{.model = tiny, .machine = {.peak_flops = 1e9, .bandwidth = 1e9}, .block_size = 4};
  step_plan padded;
  padded.layout = prefill_layout::padded;
  padded.items = {{.id = 0, .first_pos = 0, .n_tokens = 2, .samples = true, .is_prefill = true},
                  {.id = 1, .first_pos = 0, .n_tokens = 4, .samples = true, .is_prefill = true}};
  padded.prefill_rows = {{0}, {1}};
  padded.row_length = 4;
  // 8 slots; each row a full causal 4x4 square (10 pairs).
  REQUIRE(cm(padded).linear_flops == 8 * 2 * 288 + 2 * 80);
  REQUIRE(cm(padded).attention_flops == 16 * 2 * 20);
  step_plan packed = padded;
  packed.layout = prefill_layout::packed;
  packed.prefill_rows = {{1, 0}};
  packed.row_length = 8;
  REQUIRE(cm(packed).linear_flops == 8 * 2 * 288 + 2 * 80);
  REQUIRE(cm(packed).attention_flops == 16 * 2 * (3 + 10));  // block-diagonal: only the pieces' pairs
  step_plan idle;
  idle.items = {{.id = 0, .first_pos = 3, .n_tokens = 1, .samples = true}};
  idle.n_idle_slots = 2;
  REQUIRE(cm(idle).linear_flops == 3 * 2 * 288 + 3 * 80);
  step_plan swap = idle;
  swap.n_idle_slots = 0;
  swap.swapped_out = {{7, 3}};
  swap.swapped_in = {{8, 2}};
  REQUIRE(cm(swap).swap_bytes == 2.0 * 5 * 4 * 8);
}

TEST_CASE("cost model agrees with a token-by-token enumeration on random plans from real policies") {
  std::mt19937 rng(11);
  const engine_limits limits{.max_context = 64, .block_size = 4, .n_blocks = 40, .n_swap_blocks = 20};
  const std::vector<policy> policies = {
      {.mode = batching::request_level, .max_batch_seqs = 4, .max_step_tokens = 128},
      {.max_batch_seqs = 8, .max_step_tokens = 24, .chunked_prefill = true, .preempt = preemption::swap},
      {.max_batch_seqs = 8, .max_step_tokens = 128, .layout = prefill_layout::padded},
      {.max_batch_seqs = 8, .max_step_tokens = 40, .chunked_prefill = true, .layout = prefill_layout::packed,
       .row_capacity = 16}};
  for (const policy& p : policies) {
    const llama_config m{.n_layers = 1 + static_cast<std::int64_t>(rng() % 3), .dim = 8, .n_heads = 4,
                         .n_kv_heads = 2, .head_dim = 3, .ffn_dim = 5, .vocab = 7, .bytes_per_weight = 1.0625,
                         .bytes_per_kv = 2};
    const cost_model cm{.model = m, .machine = {.peak_flops = 1, .bandwidth = 1}, .block_size = limits.block_size};
    sched_state s = make_state(limits);
    for (int id = 0; id < 30; ++id) submit(s, id, 1 + rng() % 40, 1 + rng() % 20);
    int n_steps = 0;
    while (n_live(s) > 0) {
      const step_plan plan = plan_step(s, p);
      const auto ref = sched_reference::cost_by_enumeration(m, plan, limits.block_size);
      const step_cost c = cm(plan);
      REQUIRE(c.flops() == Approx(ref.flops).epsilon(1e-12));
      REQUIRE(c.bytes() == Approx(ref.bytes).epsilon(1e-12));
      commit_step(s, plan);
      ++n_steps;
    }
    REQUIRE(n_steps > 10);
  }
}

TEST_CASE("latency targets: largest chunk and batch that fit, monotone, with clear errors") {
  // A memory-bound decode model: 1M weights of 1 byte at 1 GB/s = 1 ms per step.
  const llama_config m{.n_layers = 4, .dim = 256, .n_heads = 4, .n_kv_heads = 4, .head_dim = 64, .ffn_dim = 128,
                       .vocab = 1024, .bytes_per_weight = 1, .bytes_per_kv = 1};
  const cost_model cm{.model = m, .machine = {.peak_flops = 1e11, .bandwidth = 1e9}};
  const double t1 = cm.mixed_step_time(1, 100, 0);
  REQUIRE(t1 > 0);
  for (double target : {0.5 * t1, 1.0 * t1, 1.5 * t1, 4 * t1, 40 * t1}) {
    const std::int64_t b = max_batch_for_latency(cm, 100, target, 4096);
    if (b > 0) REQUIRE(cm.mixed_step_time(b, 100, 0) <= target);
    if (b < 4096) REQUIRE(cm.mixed_step_time(b + 1, 100, 0) > target);
    const std::int64_t c = max_chunk_for_latency(cm, 8, 100, target, 1 << 16);
    if (c > 0) REQUIRE(cm.mixed_step_time(8, 100, c) <= target);
    if (c < (1 << 16)) REQUIRE(cm.mixed_step_time(8, 100, c + 1) > target);
  }
  REQUIRE(max_batch_for_latency(cm, 100, 0.5 * t1) == 0);
  REQUIRE(max_chunk_for_latency(cm, 8, 100, 40 * t1) > max_chunk_for_latency(cm, 8, 100, 4 * t1));
  REQUIRE_THROWS_WITH(max_chunk_for_latency(cm, 8, 100, 0.0), "max_chunk_for_latency: target_s must be > 0, got 0");
  REQUIRE_THROWS_WITH(max_batch_for_latency(cm, -1, 1.0),
                      "max_batch_for_latency: decode_context = -1 and max_batch = 65536 must be >= 0");
  cost_model bad = cm;
  bad.model.n_kv_heads = 0;
  REQUIRE_THROWS_WITH(bad.validate(), "cost_model: n_kv_heads must be >= 1, got 0");
  bad = cm;
  bad.machine.bandwidth = 0;
  REQUIRE_THROWS_WITH(bad.validate(), "cost_model: peak_flops = 1e+11 and bandwidth = 0 must be > 0");
}

TEST_CASE("fit_machine_limits recovers the limits that generated the step times") {
  const machine_limits truth{.peak_flops = 2e10, .bandwidth = 3e9, .step_overhead_s = 1e-4};
  const machine_limits bound{.peak_flops = 4e11, .bandwidth = 2e10};
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> f(1e6, 1e10), b(1e6, 1e9);
  std::vector<step_sample> samples;
  for (int i = 0; i < 200; ++i) {
    const double flops = f(rng), bytes = b(rng);
    samples.push_back({flops, bytes, truth.step_overhead_s + std::max(flops / truth.peak_flops, bytes / truth.bandwidth)});
  }
  const machine_limits fit = fit_machine_limits(samples, bound, 1e3, 121);
  // The grid has 40 points per decade: within 6% of the truth.
  REQUIRE(fit.overlap);
  REQUIRE(fit.peak_flops == Approx(truth.peak_flops).epsilon(0.06));
  REQUIRE(fit.bandwidth == Approx(truth.bandwidth).epsilon(0.06));
  std::size_t within = 0;
  for (const auto& s : samples) {
    const double pred = fit.step_overhead_s + std::max(s.flops / fit.peak_flops, s.bytes / fit.bandwidth);
    within += std::fabs(pred / s.time_s - 1) <= 0.06 ? 1 : 0;
  }
  REQUIRE(within == samples.size());
  REQUIRE_THROWS_WITH(fit_machine_limits(std::vector<step_sample>{}, bound), "fit_machine_limits: no samples");
  REQUIRE_THROWS_WITH(fit_machine_limits(samples, bound, 10, 1),
                      "fit_machine_limits: grid = 1 must be >= 2 and range = 10 >= 1");
  REQUIRE_THROWS_WITH(fit_machine_limits(samples, bound, 10, 5, true, 1.5),
                      "fit_machine_limits: error_quantile must be in [0, 1], got 1.5");
  // Minimising the worst error recovers the limits too.
  const machine_limits worst = fit_machine_limits(samples, bound, 1e3, 121, true, 1.0);
  REQUIRE(worst.peak_flops == Approx(truth.peak_flops).epsilon(0.06));
  REQUIRE(worst.bandwidth == Approx(truth.bandwidth).epsilon(0.06));
}

TEST_CASE("fit_machine_limits recognises an engine whose compute and memory time add") {
  const machine_limits truth{.peak_flops = 8e10, .bandwidth = 1.2e10, .step_overhead_s = 2e-4, .overlap = false};
  const machine_limits bound{.peak_flops = 4e11, .bandwidth = 4e10};
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> f(1e8, 5e10), b(1e8, 5e8);
  std::vector<step_sample> samples;
  for (int i = 0; i < 100; ++i) {
    const double flops = f(rng), bytes = b(rng);
    samples.push_back({flops, bytes, truth.step_overhead_s + flops / truth.peak_flops + bytes / truth.bandwidth});
  }
  REQUIRE(truth.busy_s(4e10, 6e8) == Approx(0.5 + 0.05));
  REQUIRE(machine_limits{.peak_flops = 8e10, .bandwidth = 1.2e10}.busy_s(4e10, 6e8) == Approx(0.5));
  const machine_limits fit = fit_machine_limits(samples, bound, 1e3, 121);
  REQUIRE_FALSE(fit.overlap);
  REQUIRE(fit.peak_flops == Approx(truth.peak_flops).epsilon(0.06));
  REQUIRE(fit.bandwidth == Approx(truth.bandwidth).epsilon(0.06));
  // Restricted to the roofline form, the same samples fit worse.
  const machine_limits roof = fit_machine_limits(samples, bound, 1e3, 121, false);
  REQUIRE(roof.overlap);
  auto median_error = [&](const machine_limits& m) {
    std::vector<double> e;
    for (const auto& s : samples) e.push_back(std::fabs((m.step_overhead_s + m.busy_s(s.flops, s.bytes)) / s.time_s - 1));
    std::sort(e.begin(), e.end());
    return e[e.size() / 2];
  };
  REQUIRE(median_error(fit) < 0.03);
  REQUIRE(median_error(roof) > median_error(fit));
  // The cost of a plan follows the form.
  cost_model cm{.model = {.n_layers = 2, .dim = 8, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .ffn_dim = 16,
                          .vocab = 32, .bytes_per_weight = 4, .bytes_per_kv = 4},
                .machine = truth,
                .block_size = 4};
  step_plan plan;
  plan.items.push_back({.id = 0, .first_pos = 3, .n_tokens = 2, .samples = true, .is_prefill = true});
  const step_cost c = cm(plan);
  REQUIRE(c.time_s == Approx(truth.step_overhead_s + c.compute_s + c.memory_s));
}
