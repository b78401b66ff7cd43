// SPDX-License-Identifier: MIT
// sched/: requests, stop criteria, state transitions, policies, scheduler.
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/request.hpp>
#include <llmkit/sched/scheduler.hpp>
#include <llmkit/sched/state.hpp>
#include <llmkit/sched/step_plan.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "reference/sched_reference.hpp"

using namespace llmkit::sched;
using llmkit::request_id;
using llmkit::token_id;
using sched_reference::check_plan;
using sched_reference::check_state;
using sched_reference::fake_engine;

namespace {
request make_request(request_id id, std::int64_t n_prompt, std::int64_t max_new, std::int32_t first = 1) {
  request r;
  r.id = id;
  for (std::int64_t i = 0; i < n_prompt; ++i) r.prompt.push_back(static_cast<token_id>(first + i));
  r.stop.max_new_tokens = static_cast<std::size_t>(max_new);
  return r;
}
}  // namespace

TEST_CASE("a request's stop criteria: stop tokens, stop sequences, token limit") {
  request r = make_request(1, 3, 4);
  r.stop.eos_tokens = {2};
  r.stop.stop_sequences = {{5, 6}, {9}};
  using v = std::vector<token_id>;
  REQUIRE(!r.stop.check(v{}));
  REQUIRE(!r.stop.check(v{1}));
  REQUIRE(r.stop.check(v{1, 2}) == llmkit::finish_reason::eos);
  REQUIRE(!r.stop.check(v{5}));
  REQUIRE(r.stop.check(v{5, 6}) == llmkit::finish_reason::stop_sequence);
  REQUIRE(!r.stop.check(v{6, 5}));
  REQUIRE(r.stop.check(v{1, 9}) == llmkit::finish_reason::stop_sequence);
  REQUIRE(!r.stop.check(v{1, 3, 4}));
  REQUIRE(r.stop.check(v{1, 3, 4, 1}) == llmkit::finish_reason::max_tokens);
  REQUIRE(r.stop.check(v{1, 3, 4, 2}) == llmkit::finish_reason::eos);  // the token wins over the limit
  REQUIRE(llmkit::finish_reason_name(llmkit::finish_reason::stop_sequence) == "stop_sequence");
}

TEST_CASE("bad input raises llmkit::error naming the argument, other requests are unaffected") {
  const engine_limits limits{.max_context = 32, .block_size = 4, .n_blocks = 16};
  scheduler s(limits, policy{.max_step_tokens = 32});
  s.submit(make_request(7, 5, 3));
  REQUIRE_THROWS_WITH(s.submit(make_request(7, 2, 2)), "submit: duplicate request id 7");
  REQUIRE_THROWS_WITH(s.submit(make_request(8, 30, 3)),
                      "request 8: prompt length 30 + max_new_tokens 3 exceeds the context of 32 tokens");
  REQUIRE_THROWS_WITH(s.submit(make_request(9, 3, 0)), "request 9: max_new_tokens must be > 0, got 0");
  REQUIRE_THROWS_WITH(s.submit(make_request(10, 0, 3)), "request 10: prompt is empty");
  request bad_stop = make_request(11, 2, 2);
  bad_stop.stop.stop_sequences = {{}};
  REQUIRE_THROWS_WITH(s.submit(bad_stop), "request 11: stop_sequences[0] is empty");
  // The rejected ids were not taken: they can be submitted correctly later.
  s.submit(make_request(8, 3, 3));
  REQUIRE(s.state().waiting.size() == 2);
  REQUIRE(check_state(s.state()).empty());

  REQUIRE_THROWS_WITH(scheduler(limits, policy{.max_step_tokens = 0}),
                      "policy: max_step_tokens must be >= 1 token, got 0");
  REQUIRE_THROWS_WITH(scheduler(limits, policy{.max_batch_seqs = 0}), "policy: max_batch_seqs must be >= 1, got 0");
  REQUIRE_THROWS_WITH(
      scheduler(limits, policy{.max_step_tokens = 16}),
      "policy: max_step_tokens = 16 is below max_context = 32; prefills run whole without chunked_prefill, so the "
      "budget must hold one context");
  REQUIRE_NOTHROW(scheduler(limits, policy{.max_step_tokens = 1, .chunked_prefill = true}));
  REQUIRE_THROWS_WITH(scheduler(limits, policy{.max_step_tokens = 64, .layout = prefill_layout::packed, .row_capacity = 16}),
                      "policy: row_capacity = 16 is below max_context = 32 without chunked_prefill");
  REQUIRE_THROWS_WITH(scheduler(limits, policy{.max_step_tokens = 64, .row_capacity = 65}),
                      "policy: row_capacity = 65 must be in [0, max_step_tokens = 64]");
  REQUIRE_THROWS_WITH(make_state({.max_context = 32, .block_size = 4, .n_blocks = 7}),
                      "engine_limits: n_blocks = 7 cannot hold one sequence of max_context = 32 tokens (needs 8 "
                      "blocks of 4)");
  REQUIRE_THROWS_WITH(make_state({.max_context = 32, .block_size = 0}), "engine_limits: block_size must be >= 1, got 0");
  REQUIRE_THROWS_WITH(s.complete_step(std::vector<token_id>{}), "complete_step: no step was planned (call next_step first)");
  s.next_step();
  REQUIRE_THROWS_WITH(s.complete_step(std::vector<token_id>{1}), "complete_step: sampled has 1 tokens, the plan samples 2");
}

TEST_CASE("continuous batching: prefills and decodes mix in one step, finished requests leave at once") {
  sched_state s = make_state({.max_context = 64, .block_size = 4, .n_blocks = 64});
  const policy p{.max_step_tokens = 64};
  submit(s, 0, 10, 3);
  submit(s, 1, 5, 2);
  step_plan a = plan_step(s, p);
  REQUIRE(a.items == std::vector<step_item>{{0, 0, 10, true, true}, {1, 0, 5, true, true}});
  REQUIRE(a.admitted == std::vector<block_move>{{0, 0}, {1, 0}});
  REQUIRE(a.n_computed_tokens() == 15);
  REQUIRE(commit_step(s, a).empty());
  REQUIRE(s.n_free_blocks == 64 - 3 - 2);
  submit(s, 2, 3, 1);
  step_plan b = plan_step(s, p);  // two decodes, then the new prompt
  REQUIRE(b.items == std::vector<step_item>{{0, 10, 1, true, false}, {1, 5, 1, true, false}, {2, 0, 3, true, true}});
  const auto done = commit_step(s, b);
  REQUIRE(done.size() == 2);  // 1 reached 2 tokens, 2 reached 1 token
  REQUIRE(done[0].id == 1);
  REQUIRE(done[1].id == 2);
  step_plan c = plan_step(s, p);
  REQUIRE(c.items == std::vector<step_item>{{0, 11, 1, true, false}});
  REQUIRE(commit_step(s, c).size() == 1);
  REQUIRE(n_live(s) == 0);
  REQUIRE(s.n_free_blocks == 64);
}

TEST_CASE("chunked prefill splits a prompt under the step budget, decodes first") {
  sched_state s = make_state({.max_context = 16, .block_size = 4, .n_blocks = 8});
  const policy p{.max_step_tokens = 4, .chunked_prefill = true};
  submit(s, 0, 10, 2);
  auto step = [&] {
    step_plan plan = plan_step(s, p);
    REQUIRE(check_plan(s, p, plan).empty());
    commit_step(s, plan);
    REQUIRE(check_state(s).empty());
    return plan.items;
  };
  REQUIRE(step() == std::vector<step_item>{{0, 0, 4, false, true}});
  submit(s, 1, 3, 2);
  REQUIRE(step() == std::vector<step_item>{{0, 4, 4, false, true}});  // no budget left for 1
  REQUIRE(step() == std::vector<step_item>{{0, 8, 2, true, true}, {1, 0, 2, false, true}});
  REQUIRE(step() == std::vector<step_item>{{0, 10, 1, true, false}, {1, 2, 1, true, true}});
  REQUIRE(step() == std::vector<step_item>{{1, 3, 1, true, false}});
  REQUIRE(n_live(s) == 0);
}

TEST_CASE("set_cached_prefix: a waiting request's cached prefix is not planned, blocks still count it") {
  sched_state s = make_state({.max_context = 64, .block_size = 4, .n_blocks = 16});
  const policy p{.max_step_tokens = 64};
  submit(s, 0, 10, 3);
  REQUIRE_THROWS_WITH(set_cached_prefix(s, 0, 10), Catch::Contains("n_cached = 10 is outside [0, context = 10)"));
  REQUIRE(set_cached_prefix(s, 0, 8));
  REQUIRE_FALSE(set_cached_prefix(s, 7, 4));  // unknown
  step_plan a = plan_step(s, p);
  REQUIRE(a.items == std::vector<step_item>{{0, 8, 2, true, true}});
  REQUIRE(check_plan(s, p, a).empty());
  commit_step(s, a);
  REQUIRE(check_state(s).empty());
  REQUIRE(s.running[0].n_blocks == 3);  // the shared prefix counts: the accounting stays conservative
  REQUIRE(s.n_free_blocks == 13);
  REQUIRE_FALSE(set_cached_prefix(s, 0, 4));  // running now
  // Through the scheduler: only while no step is planned.
  scheduler sc({.max_context = 64, .block_size = 4, .n_blocks = 16}, p);
  sc.submit({.id = 1, .prompt = {1, 2, 3, 4, 5}, .stop = {.max_new_tokens = 2}});
  REQUIRE(sc.set_cached_prefix(1, 4));
  REQUIRE(sc.next_step().items == std::vector<step_item>{{1, 4, 1, true, true}});
  REQUIRE_THROWS_WITH(sc.set_cached_prefix(1, 0), Catch::Contains("a planned step is not complete yet"));
}

TEST_CASE("submit_forked: a forked sample runs on its shared prefix when blocks allow, else recomputes") {
  sched_state s = make_state({.max_context = 32, .block_size = 4, .n_blocks = 8});
  REQUIRE(submit_forked(s, 1, 10, 5, 1, 10, 8));  // 3 blocks for its 10 cached tokens
  REQUIRE(s.running.back().n_cached == 10);
  REQUIRE(s.n_free_blocks == 5);
  REQUIRE(check_state(s).empty());
  const policy p{.max_step_tokens = 32};
  REQUIRE(plan_step(s, p).items == std::vector<step_item>{{1, 10, 1, true, false}});  // a decode next
  REQUIRE(submit_forked(s, 2, 10, 5, 1, 10, 8));
  REQUIRE_FALSE(submit_forked(s, 3, 10, 5, 1, 10, 8));  // 2 blocks left: waits at the front, recomputes
  REQUIRE(s.waiting.front().id == 3);
  REQUIRE(s.waiting.front().n_cached == 0);
  REQUIRE_FALSE(submit_forked(s, 4, 10, 5, 1, 4, 2));  // 1 block would do, but the batch is full (max_running 2)
  REQUIRE(check_state(s).empty());
  REQUIRE_THROWS_WITH(submit_forked(s, 5, 10, 5, 5, 10, 8), Catch::Contains("n_generated = 5 is outside"));
  REQUIRE_THROWS_WITH(submit_forked(s, 5, 10, 5, 1, 11, 8), Catch::Contains("n_cached = 11 is outside"));
  REQUIRE_THROWS_WITH(submit_forked(s, 1, 10, 5, 1, 10, 8), Catch::Contains("duplicate request id 1"));
  // Through the scheduler, which keeps the generated tokens.
  scheduler sc({.max_context = 32, .block_size = 4, .n_blocks = 10}, p);
  REQUIRE(sc.submit_forked({.id = 7, .prompt = {1, 2, 3}, .stop = {.max_new_tokens = 3}}, {9}, 3));
  REQUIRE(sc.output(7).size() == 1);
  const std::vector<token_id> next{4};
  sc.next_step();
  REQUIRE(sc.complete_step(next).empty());
  REQUIRE(sc.output(7).size() == 2);
}

TEST_CASE("a request of width 3 counts 3 x the blocks of its context, is preempted whole, must fit the pool") {
  const engine_limits limits{.max_context = 32, .block_size = 4, .n_blocks = 12};
  scheduler s(limits, policy{.max_batch_seqs = 8, .max_step_tokens = 32});
  s.submit(make_request(2, 8, 16));       // up to 23 tokens: 6 blocks
  request beams = make_request(1, 6, 6);  // up to 11 tokens: 3 blocks per sequence
  beams.width = 3;
  s.submit(beams);
  const step_plan& first = s.next_step();
  REQUIRE(first.items.size() == 2);
  REQUIRE(first.items[1] == step_item{1, 0, 6, true, true});  // one prefill item for the group
  REQUIRE(s.complete_step(std::vector<token_id>{5, 5}).empty());
  REQUIRE(s.state().running.back().n_blocks == 6);  // 3 x blocks_for(6)
  REQUIRE(s.state().n_free_blocks == 4);
  REQUIRE(check_state(s.state()).empty());
  std::size_t preempted = 0;
  while (!s.idle()) {
    const step_plan& plan = s.next_step();
    for (const block_move& m : plan.preempted) {
      REQUIRE(m.id == 1);  // the newer request goes
      REQUIRE(m.n_blocks % 3 == 0);  // every beam's blocks at once
      ++preempted;
    }
    REQUIRE(plan.n_samples() <= 2);
    s.complete_step(std::vector<token_id>(static_cast<std::size_t>(plan.n_samples()), 5));
    REQUIRE(check_state(s.state()).empty());
    for (const seq_record& r : s.state().running)
      if (r.id == 1) REQUIRE(r.n_blocks == 3 * blocks_for(r.n_cached, 4));
  }
  REQUIRE(preempted > 0);
  request wide = make_request(3, 20, 10);  // 5 x 8 blocks > 12
  wide.width = 5;
  REQUIRE_THROWS_WITH(s.submit(wide), Catch::Contains("width 5 x 29 tokens needs 40 blocks, the pool holds 12"));
}

TEST_CASE("request-level batching: nobody joins a batch in flight, finished slots idle, padded prefill") {
  sched_state s = make_state({.max_context = 16, .block_size = 4, .n_blocks = 16});
  const policy p{.mode = batching::request_level, .max_batch_seqs = 2, .max_step_tokens = 16};
  submit(s, 0, 4, 3);
  submit(s, 1, 6, 1);
  submit(s, 2, 2, 1);
  step_plan a = plan_step(s, p);
  REQUIRE(a.items == std::vector<step_item>{{0, 0, 4, true, true}, {1, 0, 6, true, true}});
  REQUIRE(a.admitted == std::vector<block_move>{{0, 2}, {1, 2}});  // blocks for 4+3-1 and 6+1-1 tokens
  REQUIRE(a.row_length == 6);
  REQUIRE(a.n_computed_tokens() == 12);
  REQUIRE(a.static_batch_size == 2);
  REQUIRE(check_plan(s, p, a).empty());
  REQUIRE(commit_step(s, a).size() == 1);
  step_plan b = plan_step(s, p);
  REQUIRE(b.items == std::vector<step_item>{{0, 4, 1, true, false}});
  REQUIRE(b.n_idle_slots == 1);
  REQUIRE(b.n_computed_tokens() == 2);
  commit_step(s, b);
  REQUIRE(plan_step(s, p).items.size() == 1);
  commit_step(s, plan_step(s, p));
  REQUIRE(s.running.empty());
  step_plan d = plan_step(s, p);
  REQUIRE(d.items == std::vector<step_item>{{2, 0, 2, true, true}});
  // Budget: the padded batch must fit max_step_tokens = 16.
  sched_state t = make_state({.max_context = 16, .block_size = 4, .n_blocks = 16});
  submit(t, 0, 9, 1);
  submit(t, 1, 8, 1);
  REQUIRE(plan_step(t, p).items.size() == 1);  // 2 rows of 9 > 16
}

TEST_CASE("length-aware formation takes the head, then the closest lengths in the window") {
  sched_state s = make_state({.max_context = 64, .block_size = 4, .n_blocks = 64});
  for (auto [id, len] : std::vector<std::pair<int, int>>{{0, 10}, {1, 50}, {2, 12}, {3, 11}, {4, 49}, {5, 10}})
    submit(s, id, len, 1);
  policy p{.mode = batching::request_level, .max_batch_seqs = 3, .max_step_tokens = 64, .length_window = 5};
  std::vector<request_id> got;
  for (const auto& it : plan_step(s, p).items) got.push_back(it.id);
  REQUIRE(got == std::vector<request_id>{0, 3, 2});  // 5 is outside the window
  REQUIRE(plan_step(s, p).row_length == 12);
  p.length_window = 0;
  got.clear();
  for (const auto& it : plan_step(s, p).items) got.push_back(it.id);
  REQUIRE(got == std::vector<request_id>{0});  // FCFS: 10 then 50 pads to 2 x 50 > 64
}

TEST_CASE("prepacked prefill bin-packs the step's prompts into rows") {
  sched_state s = make_state({.max_context = 8, .block_size = 4, .n_blocks = 64});
  const policy p{.max_step_tokens = 24, .layout = prefill_layout::packed, .row_capacity = 8};
  for (auto [id, len] : std::vector<std::pair<int, int>>{{0, 5}, {1, 3}, {2, 6}, {3, 2}}) submit(s, id, len, 1);
  step_plan a = plan_step(s, p);
  REQUIRE(a.items.size() == 4);
  REQUIRE(a.prefill_rows == std::vector<std::vector<std::size_t>>{{2, 3}, {0, 1}});  // FFD: 6+2, 5+3
  REQUIRE(a.row_length == 8);
  REQUIRE(a.n_computed_tokens() == 16);
  REQUIRE(check_plan(s, p, a).empty());
  // A custom packer is used, and checked.
  policy q = p;
  q.packer = [](std::span<const std::int64_t> l, std::int64_t) {
    std::vector<std::vector<std::size_t>> rows;
    for (std::size_t i = 0; i < l.size(); ++i) rows.push_back({i});
    return rows;
  };
  step_plan b = plan_step(s, q);  // 4 rows is worse than first-fit decreasing: FFD is kept
  REQUIRE(b.prefill_rows == std::vector<std::vector<std::size_t>>{{2, 3}, {0, 1}});
  q.packer = [](std::span<const std::int64_t>, std::int64_t) { return std::vector<std::vector<std::size_t>>{{0, 0}}; };
  REQUIRE_THROWS_WITH(plan_step(s, q), "policy.packer: returned piece index 0 out of range or twice (4 pieces)");
  q.packer = make_prefill_packer(llmkit::pack::packer::best_fit_decreasing);
  REQUIRE(plan_step(s, q).prefill_rows.size() == 2);
  q.packer = make_prefill_packer(llmkit::pack::packer::next_fit);  // in order: 5+3, 6+2
  REQUIRE(plan_step(s, q).prefill_rows == std::vector<std::vector<std::size_t>>{{0, 1}, {2, 3}});
  std::vector<std::int64_t> bad{3, 9};
  REQUIRE_THROWS_WITH(pack_prefill(bad, 8), "pack_prefill: lengths[1] = 9 is outside [1, capacity = 8]");
  // Row capacity 0: rows as long as the longest piece (6): {6}, {5}, {3, 2}.
  const policy dyn{.max_step_tokens = 24, .layout = prefill_layout::packed};
  step_plan e = plan_step(s, dyn);
  REQUIRE(e.prefill_rows == std::vector<std::vector<std::size_t>>{{2}, {0}, {1, 3}});
  REQUIRE(e.row_length == 6);
  REQUIRE(e.n_computed_tokens() == 18);
  REQUIRE(check_plan(s, dyn, e).empty());
  // Padded layout of the same step: one row per prompt at the longest.
  const policy r{.max_step_tokens = 24, .layout = prefill_layout::padded};
  step_plan c = plan_step(s, r);
  REQUIRE(c.items.size() == 4);  // 4 rows of 6 = 24 fit exactly
  REQUIRE(c.n_computed_tokens() == 24);
  REQUIRE(check_plan(s, r, c).empty());
  const policy r2{.max_step_tokens = 23, .layout = prefill_layout::padded};
  REQUIRE(plan_step(s, r2).items.size() == 3);  // 3 x 6 = 18; a fourth row of 6 would make 24 > 23
}

TEST_CASE("preemption by recompute and by swap when KV blocks run out") {
  for (const preemption mode : {preemption::recompute, preemption::swap}) {
    const engine_limits limits{.max_context = 8, .block_size = 2, .n_blocks = 4, .n_swap_blocks = 4};
    sched_state s = make_state(limits);
    const policy p{.max_step_tokens = 8, .preempt = mode};
    submit(s, 0, 3, 5);
    submit(s, 1, 3, 5);
    commit_step(s, plan_step(s, p));  // both prefill: 2 + 2 blocks
    REQUIRE(s.n_free_blocks == 0);
    commit_step(s, plan_step(s, p));  // both decode position 3: still 2 blocks each
    step_plan c = plan_step(s, p);    // position 4 needs a third block: 1 is preempted
    REQUIRE(c.items == std::vector<step_item>{{0, 4, 1, true, false}});
    if (mode == preemption::recompute) {
      REQUIRE(c.preempted == std::vector<block_move>{{1, 2}});
      REQUIRE(c.swapped_out.empty());
    } else {
      REQUIRE(c.swapped_out == std::vector<block_move>{{1, 2}});
      REQUIRE(c.preempted.empty());
    }
    REQUIRE(check_plan(s, p, c).empty());
    commit_step(s, c);
    REQUIRE(check_state(s).empty());
    if (mode == preemption::recompute) {
      REQUIRE(s.waiting.size() == 1);
      REQUIRE(s.waiting[0].n_cached == 0);
      REQUIRE(s.waiting[0].n_generated == 2);
    } else {
      REQUIRE(s.swapped.size() == 1);
      REQUIRE(s.swapped[0].n_cached == 4);
      REQUIRE(s.n_free_swap_blocks == 2);
    }
  }
}

namespace {

struct scenario {
  const char* name;
  policy p;
  engine_limits limits;
};

std::vector<scenario> scenarios() {
  const engine_limits tight{.max_context = 48, .block_size = 4, .n_blocks = 24, .n_swap_blocks = 0};
  const engine_limits swap{.max_context = 48, .block_size = 4, .n_blocks = 24, .n_swap_blocks = 16};
  const engine_limits roomy{.max_context = 48, .block_size = 3, .n_blocks = 200};
  return {
      {"request-level", {.mode = batching::request_level, .max_batch_seqs = 4, .max_step_tokens = 96}, tight},
      {"request-level length-aware",
       {.mode = batching::request_level, .max_batch_seqs = 4, .max_step_tokens = 96, .length_window = 8},
       roomy},
      {"continuous", {.max_batch_seqs = 6, .max_step_tokens = 64}, tight},
      {"continuous roomy", {.max_batch_seqs = 16, .max_step_tokens = 200}, roomy},
      {"chunked", {.max_batch_seqs = 6, .max_step_tokens = 16, .chunked_prefill = true}, tight},
      {"chunked tiny budget", {.max_batch_seqs = 3, .max_step_tokens = 1, .chunked_prefill = true}, tight},
      {"chunked swap",
       {.max_batch_seqs = 8, .max_step_tokens = 20, .chunked_prefill = true, .preempt = preemption::swap},
       swap},
      {"swap", {.max_batch_seqs = 8, .max_step_tokens = 64, .preempt = preemption::swap}, swap},
      {"padded", {.max_batch_seqs = 6, .max_step_tokens = 100, .layout = prefill_layout::padded}, tight},
      {"padded chunked",
       {.max_batch_seqs = 6, .max_step_tokens = 30, .chunked_prefill = true, .layout = prefill_layout::padded},
       tight},
      {"packed",
       {.max_batch_seqs = 8, .max_step_tokens = 120, .layout = prefill_layout::packed, .row_capacity = 48},
       roomy},
      {"packed dynamic rows", {.max_batch_seqs = 8, .max_step_tokens = 100, .layout = prefill_layout::packed}, tight},
      {"packed dynamic rows chunked",
       {.max_batch_seqs = 8, .max_step_tokens = 30, .chunked_prefill = true, .layout = prefill_layout::packed},
       tight},
      {"packed chunked",
       {.max_batch_seqs = 8,
        .max_step_tokens = 40,
        .chunked_prefill = true,
        .layout = prefill_layout::packed,
        .row_capacity = 13,
        .length_window = 4},
       tight},
  };
}

// Greedy output of request r run alone against the fake model.
std::vector<token_id> solo(const request& r, std::int32_t vocab) {
  std::vector<std::int32_t> ctx(r.prompt.begin(), r.prompt.end());
  std::vector<token_id> out;
  while (true) {
    out.push_back(fake_engine::next_token(ctx, vocab));
    if (r.stop.check(out)) return out;
    ctx.push_back(out.back());
  }
}

}  // namespace

TEST_CASE("random workloads: invariants hold, nothing lost or duplicated, outputs equal solo runs") {
  for (const scenario& sc : scenarios()) {
    std::int64_t n_recomputed = 0, n_swapped = 0, n_chunks = 0;
    for (std::uint32_t seed = 1; seed <= 6; ++seed) {
      INFO(sc.name << " seed " << seed);
      std::mt19937 rng(seed);
      scheduler s(sc.limits, sc.p);
      fake_engine engine;
      engine.vocab = 40;
      std::map<request_id, request> submitted;
      std::map<request_id, finished_request> finished;
      std::map<request_id, std::vector<token_id>> cancelled;  // with the tokens generated before
      const int n_requests = 40;
      request_id next_id = 0;
      std::int64_t steps = 0;
      while (next_id < n_requests || !s.idle()) {
        // Arrivals: a burst now and then.
        if (next_id < n_requests && rng() % 3 == 0) {
          for (int k = static_cast<int>(rng() % 4); k >= 0 && next_id < n_requests; --k) {
            const std::int64_t n_prompt = 1 + rng() % 30;
            const std::int64_t max_new = 1 + rng() % std::min<std::int64_t>(17, sc.limits.max_context - n_prompt);
            request r = make_request(next_id, n_prompt, max_new, static_cast<std::int32_t>(rng() % 40));
            if (rng() % 2) r.stop.eos_tokens = {static_cast<token_id>(rng() % 40)};
            submitted[r.id] = r;
            s.submit(r);
            ++next_id;
          }
        }
        if (s.idle()) continue;
        // Now and then a live request is cancelled (before or after planning).
        const bool cancel_after_plan = rng() % 2;
        auto maybe_cancel = [&] {
          if (rng() % 25 != 0) return;
          const auto& st = s.state();
          std::vector<request_id> live;
          for (auto* list : {&st.waiting, &st.running, &st.swapped})
            for (const auto& r : *list) live.push_back(r.id);
          const request_id id = live[rng() % live.size()];
          auto c = s.cancel(id);
          REQUIRE(c);
          REQUIRE(c->reason == llmkit::finish_reason::cancelled);
          REQUIRE(cancelled.emplace(id, c->output).second);
          REQUIRE_FALSE(s.cancel(id));
        };
        if (!cancel_after_plan) maybe_cancel();
        if (s.idle()) continue;
        const sched_state before = s.state();
        const step_plan& plan = s.next_step();
        REQUIRE(check_plan(before, sc.p, plan) == "");
        n_recomputed += static_cast<std::int64_t>(plan.preempted.size());
        n_swapped += static_cast<std::int64_t>(plan.swapped_out.size());
        for (const auto& it : plan.items) n_chunks += it.is_prefill && !it.samples ? 1 : 0;
        if (cancel_after_plan) maybe_cancel();
        std::vector<token_id> sampled = engine.run(plan, [&](request_id id) {
          const request& r = submitted.at(id);
          std::vector<std::int32_t> ctx(r.prompt.begin(), r.prompt.end());
          if (const auto c = cancelled.find(id); c != cancelled.end()) {
            ctx.insert(ctx.end(), c->second.begin(), c->second.end());
          } else {
            const auto out = s.output(id);
            ctx.insert(ctx.end(), out.begin(), out.end());
          }
          return ctx;
        });
        for (const auto& [id, out] : cancelled) {
          engine.kv.erase(id);
          engine.host.erase(id);
        }
        for (auto& f : s.complete_step(sampled)) {
          REQUIRE(submitted.at(f.id).stop.check(f.output) == f.reason);  // the rule that fired
          engine.kv.erase(f.id);
          REQUIRE(finished.emplace(f.id, std::move(f)).second);
        }
        REQUIRE(check_state(s.state()) == "");
        REQUIRE(++steps < 20000);
      }
      REQUIRE(finished.size() + cancelled.size() == static_cast<std::size_t>(n_requests));
      for (const auto& [id, f] : finished) {
        REQUIRE_FALSE(cancelled.contains(id));
        REQUIRE(f.output == solo(submitted.at(id), engine.vocab));
      }
      REQUIRE(s.state().n_free_blocks == sc.limits.n_blocks);
      REQUIRE(s.state().n_free_swap_blocks == sc.limits.n_swap_blocks);
    }
    // The workloads do exercise what each scenario is about.
    INFO(sc.name);
    if (sc.p.mode == batching::continuous && sc.limits.n_blocks == 24 && sc.p.max_batch_seqs >= 6) REQUIRE(n_recomputed + n_swapped > 0);
    if (sc.p.preempt == preemption::swap) REQUIRE(n_swapped > 0);
    if (sc.p.mode == batching::request_level) REQUIRE(n_recomputed + n_swapped == 0);
    REQUIRE((n_chunks > 0) == sc.p.chunked_prefill);
  }
}
