// SPDX-License-Identifier: MIT
// attention::decode and attention::prefill called from two threads at once
// with different tuning on shared read-only caches, each result against the
// double-precision oracle. Compiled for head dim 64 only
// (attention_threads.cmake) and run under ThreadSanitizer by the tsan
// preset (label `threads`).
#include <llmkit/attention/decode.hpp>
#include <llmkit/attention/prefill.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <latch>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <llmkit/core/executor.hpp>

#include "reference/attention_reference.hpp"

using namespace llmkit;
using llmkit::test::chunked_test_cache;

namespace {

constexpr std::size_t head_dim = 64, n_kv_heads = 2, group = 4, n_heads = n_kv_heads * group;
constexpr std::size_t row = n_heads * head_dim;

/// One caller's settings: its tuning, split and executor.
struct caller {
  attention::decode_tuning tuning;
  std::size_t kv_split_tokens = 0;
  std::size_t pool_threads = 0;  // 0: serial
};

/// Shared read-only inputs of storage type T and their oracle.
template <class T>
struct shared_case {
  chunked_test_cache<T> cache{kv::kv_shape{1, n_kv_heads, head_dim}};
  std::vector<kv::seq_id> ids;
  std::vector<float> q;
  std::vector<double> oracle;  // [n_seqs, n_heads, head_dim]
  // prefill: the last n_prompt tokens of every sequence as queries
  static constexpr std::size_t n_prompt = 33;
  std::vector<std::int32_t> cu_seqlens;
  std::vector<float> prompt_q;
  std::vector<double> prompt_oracle;  // [n_seqs * n_prompt, n_heads, head_dim]

  explicit shared_case(std::uint32_t seed) {
    std::mt19937 rng(seed);
    const std::size_t lengths[] = {1500, 700, 33};
    for (std::size_t i = 0; i < std::size(lengths); ++i) {
      const std::size_t n = lengths[i];
      ids.push_back(static_cast<kv::seq_id>(2 * i + 5));
      const auto k = llmkit::test::uniform_values(n * n_kv_heads * head_dim, rng);
      const auto v = llmkit::test::uniform_values(k.size(), rng);
      cache.add_sequence(ids.back(), n, k, v, llmkit::test::random_chunks(n, 90, rng));
    }
    q = llmkit::test::uniform_values(ids.size() * row, rng);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const auto causal = [](std::int32_t qp, std::int32_t kp) { return kp <= qp; };
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int32_t pos[1] = {llmkit::test::reference_last_position(cache, ids[i])};
      const auto ref = llmkit::test::reference_attention(cache, ids[i], 0, std::span<const float>(q).subspan(i * row, row),
                                                         pos, n_heads, scale, 0.0, causal);
      oracle.insert(oracle.end(), ref.begin(), ref.end());
    }
    prompt_q = llmkit::test::uniform_values(ids.size() * n_prompt * row, rng);
    cu_seqlens.push_back(0);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      cu_seqlens.push_back(static_cast<std::int32_t>((i + 1) * n_prompt));
      const std::int32_t last = llmkit::test::reference_last_position(cache, ids[i]);
      std::vector<std::int32_t> pos(n_prompt);
      for (std::size_t t = 0; t < n_prompt; ++t) pos[t] = last - static_cast<std::int32_t>(n_prompt - 1 - t);
      const auto ref = llmkit::test::reference_attention(
          cache, ids[i], 0, std::span<const float>(prompt_q).subspan(i * n_prompt * row, n_prompt * row), pos, n_heads,
          scale, 0.0, causal);
      prompt_oracle.insert(prompt_oracle.end(), ref.begin(), ref.end());
    }
  }
};

/// One prefill caller's settings.
struct prefill_caller {
  attention::prefill_tuning tuning;
  std::size_t pool_threads = 0;  // 0: serial
};

/// What one caller saw over its calls.
struct outcome {
  double max_error = 0.0;
  bool finite = true;
  bool repeatable = true;  // every call gave the first call's bits
};

/// Waits at `start`, then makes `n_calls` calls of `call(out, exec)` on
/// `pool_threads` threads (0: the serial executor), checking each `out`
/// against `[out.size()] oracle` and against the first call's bits.
template <class Call>
outcome repeat_calls(std::size_t out_size, const std::vector<double>& oracle, std::size_t pool_threads,
                     std::latch& start, int n_calls, Call&& call) {
  std::vector<float> out(out_size), first;
  outcome r;
  std::optional<thread_pool> pool;
  if (pool_threads > 0) pool.emplace(pool_threads);
  start.arrive_and_wait();
  for (int n = 0; n < n_calls; ++n) {
    if (pool) call(out, *pool);
    else call(out, serial_executor{});
    for (std::size_t x = 0; x < out.size(); ++x) {
      if (!std::isfinite(out[x])) r.finite = false;
      r.max_error = std::max(r.max_error, std::fabs(static_cast<double>(out[x]) - oracle[x]));
    }
    if (n == 0) first = out;
    else if (out != first) r.repeatable = false;
  }
  return r;
}

template <class T>
outcome run_calls(const shared_case<T>& c, const caller& who, std::latch& start, int n_calls) {
  return repeat_calls(c.q.size(), c.oracle, who.pool_threads, start, n_calls, [&](std::vector<float>& out, auto&& exec) {
    attention::decode({.q = c.q, .out = out, .seq_ids = c.ids, .n_heads = n_heads,
                       .kv_split_tokens = who.kv_split_tokens, .tuning = who.tuning},
                      c.cache, attention::causal_mask{}, exec);
  });
}

template <class T>
outcome run_calls(const shared_case<T>& c, const prefill_caller& who, std::latch& start, int n_calls) {
  return repeat_calls(c.prompt_q.size(), c.prompt_oracle, who.pool_threads, start, n_calls,
                      [&](std::vector<float>& out, auto&& exec) {
                        attention::prefill({.q = c.prompt_q, .out = out, .cu_seqlens = c.cu_seqlens, .seq_ids = c.ids,
                                            .n_heads = n_heads, .tuning = who.tuning},
                                           c.cache, attention::causal_mask{}, exec);
                      });
}

template <class T, class Caller>
void check_concurrent(const shared_case<T>& c, const Caller& a, const Caller& b, double tolerance) {
  constexpr int n_calls = 6;
  std::latch start(2);
  outcome ra, rb;
  std::thread ta([&] { ra = run_calls(c, a, start, n_calls); });
  std::thread tb([&] { rb = run_calls(c, b, start, n_calls); });
  ta.join();
  tb.join();
  for (const outcome& r : {ra, rb}) {
    REQUIRE(r.finite);
    REQUIRE(r.repeatable);
    REQUIRE(r.max_error < tolerance);
  }
}

}  // namespace

TEST_CASE("decode: two threads with different tuning at once, f32 cache") {
  const shared_case<float> c(41);
  const caller a{.tuning = {.prefetch_bytes = 0, .split_tasks_per_thread = 2}, .pool_threads = 2};
  const caller b{.tuning = {.prefetch_bytes = 8192}, .kv_split_tokens = 128};
  check_concurrent(c, a, b, llmkit::test::attention_f32_tolerance);
}

TEST_CASE("decode: two threads with different tuning at once, int8 cache (AMX on and off)") {
  const shared_case<std::int8_t> c(43);
  const caller a{.tuning = {.prefetch_bytes = 256, .use_amx = false}, .kv_split_tokens = 300};
  const caller b{.tuning = {.use_amx = true, .min_split_tokens = 64}, .pool_threads = 2};
  check_concurrent(c, a, b, llmkit::test::attention_int8_decode_tolerance);
}

TEST_CASE("prefill: two threads with different tuning at once, f32 and int8 caches") {
  const prefill_caller a{.tuning = {.query_rows = 16, .memo_bytes = 0, .run_length = 1}, .pool_threads = 2};
  const prefill_caller b{.tuning = {.query_rows = 128, .memo_bytes = 1 << 20, .run_length = 3}};
  check_concurrent(shared_case<float>(53), a, b, llmkit::test::attention_f32_tolerance);
  check_concurrent(shared_case<std::int8_t>(59), a, b, llmkit::test::attention_f32_tolerance);
}

TEST_CASE("decode and prefill: tuning is checked") {
  const shared_case<float> c(47);
  std::vector<float> out(c.q.size());
  REQUIRE_THROWS_AS(attention::decode({.q = c.q, .out = out, .seq_ids = c.ids, .n_heads = n_heads,
                                       .tuning = {.split_tasks_per_thread = 0}},
                                      c.cache),
                    llmkit::error);
  std::vector<float> prompt_out(c.prompt_q.size());
  REQUIRE_THROWS_AS(attention::prefill({.q = c.prompt_q, .out = prompt_out, .cu_seqlens = c.cu_seqlens,
                                        .seq_ids = c.ids, .n_heads = n_heads, .tuning = {.run_length = 0}},
                                       c.cache),
                    llmkit::error);
}
