// SPDX-License-Identifier: MIT
// core/: errors, aligned buffers, dtypes, views, dispatch, executors.
#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/core/dispatch.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/core/error.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/core/stop.hpp>
#include <llmkit/core/views.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace llmkit;

static_assert(executor<serial_executor>);
static_assert(executor<thread_pool>);

TEST_CASE("LLMKIT_CHECK throws llmkit::error with the parts streamed") {
  auto f = [](int k) { LLMKIT_CHECK(k >= 0, "top_k: k must be >= 0, got ", k); };
  REQUIRE_NOTHROW(f(3));
  REQUIRE_THROWS_AS(f(-2), llmkit::error);
  REQUIRE_THROWS_WITH(f(-2), "top_k: k must be >= 0, got -2");
}

TEST_CASE("aligned_vector is 64-byte aligned") {
  for (std::size_t n : {1u, 3u, 17u, 1000u}) {
    aligned_vector<float> v(n);
    REQUIRE(reinterpret_cast<std::uintptr_t>(v.data()) % 64 == 0);
  }
  REQUIRE(round_up(0, 32) == 0);
  REQUIRE(round_up(33, 32) == 64);
}

TEST_CASE("big aligned_vectors are huge-page aligned, grow and shrink intact") {
  // Just below, at and above the 2 MiB threshold, then a resize across it in
  // both directions: the deallocation must use the allocation's alignment
  // (ASan checks the pairing of aligned new/delete).
  const std::size_t at = huge_page_bytes / sizeof(float);
  for (std::size_t n : {at - 1, at, at + 1, 3 * at + 5}) {
    aligned_vector<float> v(n, 1.5f);
    const auto addr = reinterpret_cast<std::uintptr_t>(v.data());
    REQUIRE(addr % (n * sizeof(float) >= huge_page_bytes ? huge_page_bytes : 64) == 0);
    v[n - 1] = 2.5f;
    v.resize(n / 4);
    v.shrink_to_fit();
    v.resize(2 * n, 0.5f);
    REQUIRE(v[0] == 1.5f);
    REQUIRE(v[2 * n - 1] == 0.5f);
  }
  REQUIRE(detail::allocation_alignment(huge_page_bytes - 1, 64) == 64);
  REQUIRE(detail::allocation_alignment(huge_page_bytes, 64) == huge_page_bytes);
}

namespace {
// Double-checked oracle for f16: the nearest representable half by search.
double f16_value(std::uint16_t h) { return static_cast<double>(f16_bits_to_f32(h)); }
}  // namespace

TEST_CASE("f16 conversion rounds to nearest even and keeps inf/NaN") {
  // Every half round-trips exactly.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_bits_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      REQUIRE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f))));
      continue;
    }
    REQUIRE(f32_to_f16_bits(f) == h);
  }
  // Random floats: the result is the nearest half, ties to even.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffffffffu);
  for (int trial = 0; trial < 200000; ++trial) {
    const float f = std::bit_cast<float>(bits(rng) & 0x8fffffffu | 0x30000000u);  // around the half range
    if (!std::isfinite(f) || std::fabs(f) >= 65504.0f) continue;
    const std::uint16_t h = f32_to_f16_bits(f);
    const double err = std::fabs(f16_value(h) - f);
    const std::uint16_t up = static_cast<std::uint16_t>(h + 1), down = static_cast<std::uint16_t>(h - 1);
    if ((h & 0x7fff) != 0x7bff) REQUIRE(err <= std::fabs(f16_value(up) - f));
    if ((h & 0x7fff) != 0) REQUIRE(err <= std::fabs(f16_value(down) - f));
  }
  REQUIRE(f32_to_f16_bits(65520.0f) == 0x7c00);   // ties up to inf
  REQUIRE(f32_to_f16_bits(65519.0f) == 0x7bff);
  REQUIRE(f32_to_f16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  REQUIRE(f32_to_f16_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  REQUIRE(std::isnan(to_f32(to_f16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(f32_to_f16_bits(0x1p-25f) == 0);                  // tie to even zero
  REQUIRE(f32_to_f16_bits(0x1.8p-25f) == 1);                // above the tie
  REQUIRE(f32_to_f16_bits(-0.0f) == 0x8000);
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps inf/NaN") {
  REQUIRE(f32_to_bf16_bits(1.0f) == 0x3f80);
  REQUIRE(f32_to_bf16_bits(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie to even (down)
  REQUIRE(f32_to_bf16_bits(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie to even (up)
  REQUIRE(f32_to_bf16_bits(std::bit_cast<float>(0x3f808001u)) == 0x3f81);
  REQUIRE(f32_to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  REQUIRE(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflow rounds to inf
  REQUIRE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));  // sNaN stays NaN
}

TEST_CASE("matrix_view and ragged_view") {
  std::vector<float> data(12);
  std::iota(data.begin(), data.end(), 0.0f);
  matrix_view<float> m(data.data(), 3, 3, 4);
  REQUIRE(m(2, 1) == 9.0f);
  REQUIRE(m.row(1)[2] == 6.0f);
  matrix_view<const float> cm = m;
  REQUIRE(cm.sub_rows(1, 2)(0, 0) == 4.0f);
  REQUIRE_THROWS_AS(m.sub_rows(2, 2), llmkit::error);
  REQUIRE_THROWS_AS(matrix_view<float>(data.data(), 3, 4, 2), llmkit::error);

  std::vector<std::int32_t> cu{0, 2, 2, 5};
  ragged_view<float> r(std::span<float>(data), cu);
  REQUIRE(r.size() == 3);
  REQUIRE(r[1].empty());
  REQUIRE(r[2].size() == 3);
  REQUIRE(r[2][0] == 2.0f);
  std::vector<std::int32_t> bad{0, 3, 2};
  REQUIRE_THROWS_WITH(ragged_view<float>(std::span<float>(data), bad),
                      "ragged_view: cu_seqlens[2] = 2 is below cu_seqlens[1] = 3");
  std::vector<std::int32_t> past{0, 13};
  REQUIRE_THROWS_AS(ragged_view<float>(std::span<float>(data), past), llmkit::error);
}

TEST_CASE("dispatch turns run-time values into compile-time ones") {
  int seen = 0;
  dispatch<64, 80, 128>(80, [&](auto d) { seen = d(); });
  REQUIRE(seen == 80);
  REQUIRE(dispatch<1, 2>(2, [](auto d) { return d() * 10; }) == 20);
  auto bad = [] { dispatch<64, 128>(65, [](auto) {}, "head_dim"); };
  REQUIRE_THROWS_WITH(bad(), "dispatch: unsupported head_dim 65");
}

TEMPLATE_TEST_CASE("executors run every index exactly once", "", serial_executor, thread_pool) {
  TestType ex;
  for (std::size_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    for (int round = 0; round < 3; ++round) ex.parallel_for(n, [&](std::size_t i) { hits[i].fetch_add(1); });
    for (auto& h : hits) REQUIRE(h.load() == 3);
  }
  REQUIRE(ex.concurrency() >= 1);
}

TEST_CASE("thread_pool propagates exceptions and allows nested calls") {
  thread_pool pool(3);
  REQUIRE(pool.concurrency() == 3);
  REQUIRE_THROWS_AS(pool.parallel_for(100,
                                      [](std::size_t i) {
                                        if (i == 37) throw llmkit::error("task 37 failed");
                                      }),
                    llmkit::error);
  std::atomic<int> total{0};
  pool.parallel_for(8, [&](std::size_t) { pool.parallel_for(8, [&](std::size_t) { total.fetch_add(1); }); });
  REQUIRE(total.load() == 64);
  // Still usable after an exception.
  std::atomic<int> after{0};
  pool.parallel_for(50, [&](std::size_t) { after.fetch_add(1); });
  REQUIRE(after.load() == 50);
}

// ---------------------------------------------------------------- stop criteria

TEST_CASE("stop_criteria: stop strings match the decoded text across token boundaries") {
  const stop_criteria s{.max_new_tokens = 4, .eos_tokens = {9}, .stop_sequences = {{5, 6}}, .stop_strings = {"time", "\n\n"}};
  using v = std::vector<token_id>;
  // " a ti" + "me": the stop string spans two tokens; the first part is held back.
  REQUIRE_FALSE(s.find_stop_string(" a ti"));
  REQUIRE(s.partial_stop_length(" a ti") == 2);
  REQUIRE(s.partial_stop_length(" a t\n") == 1);
  REQUIRE(s.partial_stop_length(" a t") == 1);
  REQUIRE(s.partial_stop_length(" a x") == 0);
  REQUIRE(s.partial_stop_length("") == 0);
  REQUIRE_FALSE(s.check(v{1}, " a ti"));
  REQUIRE(s.check(v{1, 2}, " a time") == finish_reason::stop_string);
  REQUIRE(s.find_stop_string(" a time") == 3u);
  // A token may carry text past the stop string; the earliest occurrence wins.
  REQUIRE(s.find_stop_string("x\n\ny time") == 1u);
  REQUIRE(s.find_stop_string("one time\n\n") == 4u);
  // Only occurrences ending in the n_new newest characters are looked for.
  REQUIRE(s.find_stop_string("xx\n\nyy", 3) == 2u);
  REQUIRE_FALSE(s.find_stop_string("xx\n\nyy", 2));
  REQUIRE(s.find_stop_string("xx\n\nyy", 100) == 2u);
  // Order: EOS, then a stop sequence, then a stop string, then the budget.
  REQUIRE(s.check(v{1, 9}, "time") == finish_reason::eos);
  REQUIRE(s.check(v{5, 6}, "time") == finish_reason::stop_sequence);
  REQUIRE(s.check(v{1, 2, 3, 4}, "time") == finish_reason::stop_string);
  REQUIRE(s.check(v{1, 2, 3, 4}, "tim") == finish_reason::max_tokens);
  REQUIRE_FALSE(s.check(v{}, "time"));
  // The token-only check ignores the strings.
  REQUIRE_FALSE(s.check(v{1, 2}));
  REQUIRE(finish_reason_name(finish_reason::stop_string) == "stop_string");
  REQUIRE(finish_reason_name(finish_reason::cancelled) == "cancelled");
  REQUIRE_THROWS_WITH((stop_criteria{.stop_strings = {"a", ""}}.validate("who")), "who: stop_strings[1] is empty");
}
