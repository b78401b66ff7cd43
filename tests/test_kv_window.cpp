// SPDX-License-Identifier: MIT
// kv/: sliding-window cache with attention sinks, and its visible ring aligned.
#include <llmkit/kv/sliding_window_cache.hpp>

#include <catch2/catch.hpp>

#include "reference/kv_reference.hpp"

#include <cstdint>
#include <random>
#include <vector>

using namespace llmkit;
using namespace llmkit::kv;

static_assert(kv_cache<sliding_window_cache<float>>);
static_assert(kv_cache<sliding_window_cache<f16>>);
static_assert(kv_cache<sliding_window_cache<bf16>>);
static_assert(kv_cache<sliding_window_cache<std::int8_t>>);

namespace {

template <class Cache>
void grow_and_store(Cache& cache, seq_id s, kv_reference::sequence& ref, std::size_t n, std::mt19937& rng) {
  const std::size_t first = cache.n_tokens(s);
  REQUIRE(cache.grow(s, n));
  ref.grow(n);
  const kv_shape shape = cache.shape();
  for (std::size_t layer = 0; layer < shape.n_layers; ++layer) {
    auto k = kv_reference::random_rows(rng, n, shape.n_kv_heads * shape.head_dim);
    auto v = kv_reference::random_rows(rng, n, shape.n_kv_heads * shape.head_dim);
    cache.store(s, layer, first, k, v);
    ref.store(layer, first, k, v);
  }
}

/// Oracle of the visible positions: sinks, then (T - W - g + 1 .. T), its
/// start rounded down to a multiple of `align`.
std::vector<std::size_t> visible(std::size_t n_tokens, std::size_t window, std::size_t n_sink, std::size_t last_grow,
                                 std::size_t align = 1) {
  std::vector<std::size_t> out;
  for (std::size_t p = 0; p < std::min(n_sink, n_tokens); ++p) out.push_back(p);
  const std::size_t reach = window + last_grow - 1;
  const std::size_t begin = (n_tokens > reach ? n_tokens - reach : 0) / align * align;
  for (std::size_t p = std::max(n_sink, begin); p < n_tokens; ++p) out.push_back(p);
  return out;
}

template <class Cache>
void require_visible(const Cache& cache, seq_id s, const kv_reference::sequence& ref, std::size_t last_grow) {
  const auto& o = cache.options();
  const auto want = visible(ref.n_tokens(), o.window, o.n_sink, last_grow, o.align);
  REQUIRE(cache.n_tokens(s) == ref.n_tokens());
  REQUIRE(cache.n_visible(s) == want.size());
  REQUIRE(n_visible_rows(cache, s) == want.size());
  const auto result = kv_reference::compare(cache, s, ref, want);
  INFO(result.message);
  REQUIRE(result.ok);
}

}  // namespace

TEST_CASE("sliding window: the ring wraps as documented", "[kv]") {
  const kv_shape shape{1, 1, 2};
  sliding_window_cache<float> cache(shape, {.window = 4, .n_sink = 2, .max_rollback = 1});
  REQUIRE(cache.ring_capacity() == 5);
  REQUIRE(cache.rows_per_sequence() == 7);
  const seq_id s = *cache.add_sequence();
  std::mt19937 rng(1);
  kv_reference::sequence ref{shape, {}, {}};
  REQUIRE(cache.n_chunks(s) == 0);
  for (int i = 0; i < 10; ++i) grow_and_store(cache, s, ref, 1, rng);
  auto first_pos = [&](std::size_t i) { return cache.chunk(s, 0, 0, i).first_pos; };
  auto count = [&](std::size_t i) { return cache.chunk(s, 0, 0, i).n_tokens; };
  REQUIRE(cache.n_chunks(s) == 3);
  REQUIRE((first_pos(0) == 0 && count(0) == 2));
  REQUIRE((first_pos(1) == 6 && count(1) == 1));
  REQUIRE((first_pos(2) == 7 && count(2) == 3));
  // Row 6 of the buffer holds p6, rows 2..4 hold p7..p9.
  REQUIRE(cache.chunk(s, 0, 0, 1).k == cache.chunk(s, 0, 0, 0).k + 6 * 2);
  REQUIRE(cache.chunk(s, 0, 0, 2).k == cache.chunk(s, 0, 0, 0).k + 2 * 2);
  require_visible(cache, s, ref, 1);
  for (int i = 0; i < 2; ++i) grow_and_store(cache, s, ref, 1, rng);
  REQUIRE(cache.n_chunks(s) == 2);
  REQUIRE((first_pos(1) == 8 && count(1) == 4));
  require_visible(cache, s, ref, 1);
  REQUIRE(cache.usage().token_bytes == 7 * cache.bytes_per_token());
  REQUIRE(cache.usage().n_tokens == 12);
}

TEMPLATE_TEST_CASE("sliding window matches the oracle through random grow, truncate and fork", "[kv]", float, f16, bf16,
                   std::int8_t) {
  std::mt19937 rng(99);
  struct config {
    std::size_t window, n_sink, max_grow, max_rollback, align = 1;
  };
  for (const config c : {config{1, 0, 1, 0}, config{4, 0, 1, 0}, config{5, 3, 4, 2}, config{8, 1, 8, 8},
                         config{3, 4, 2, 5}, config{16, 2, 17, 1}, config{5, 0, 4, 2, 4}, config{8, 8, 8, 3, 8},
                         config{3, 1, 2, 5, 2}, config{1, 0, 1, 0, 32}}) {
    const kv_shape shape{2, 2, 3};
    sliding_window_cache<TestType> cache(
        shape, {.window = c.window, .n_sink = c.n_sink, .max_grow = c.max_grow, .max_rollback = c.max_rollback,
                .max_sequences = 3, .align = c.align});
    REQUIRE(cache.ring_capacity() % c.align == 0);
    REQUIRE(cache.ring_capacity() >= c.window + std::max(c.max_grow - 1, c.max_rollback) + c.align - 1);
    const seq_id s = *cache.add_sequence();
    kv_reference::sequence ref{shape, {}, {}};
    std::size_t last_grow = 1, high = 0;
    std::size_t n_truncates = 0;
    for (int step = 0; step < 120; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 3)(rng);
      // Rolling back at most max_rollback tokens below the highest position ever reached always works.
      const std::size_t budget = c.max_rollback - std::min(c.max_rollback, high - ref.n_tokens());
      if (op == 0 && budget > 0 && ref.n_tokens() > 0) {
        const std::size_t back = std::uniform_int_distribution<std::size_t>(1, std::min(budget, ref.n_tokens()))(rng);
        cache.truncate(s, ref.n_tokens() - back);
        ref.truncate(ref.n_tokens() - back);
        last_grow = 1;
        ++n_truncates;
      } else {
        const std::size_t n = std::uniform_int_distribution<std::size_t>(1, op == 1 ? c.max_grow : 1)(rng);
        grow_and_store(cache, s, ref, n, rng);
        last_grow = n;
        high = std::max(high, ref.n_tokens());
      }
      require_visible(cache, s, ref, last_grow);
      // With sinks a multiple of align, every chunk starts at a multiple of it.
      if (c.n_sink % c.align == 0)
        for (std::size_t i = 0; i < cache.n_chunks(s); ++i)
          REQUIRE(static_cast<std::size_t>(cache.chunk(s, 1, 1, i).first_pos) % c.align == 0);
    }
    REQUIRE((c.max_rollback == 0 || n_truncates > 0));
    // One token further back than the ring allows (C - W below the highest position) is refused.
    const std::size_t slack = cache.ring_capacity() - c.window;
    if (high >= c.n_sink + cache.ring_capacity() + 1 && high - slack - 1 < ref.n_tokens())
      REQUIRE_THROWS_WITH(cache.truncate(s, high - slack - 1), Catch::Contains("cannot be restored"));
    // A fork is an independent copy.
    const seq_id f = *cache.fork(s);
    kv_reference::sequence ref_f = ref;
    grow_and_store(cache, f, ref_f, 1, rng);
    require_visible(cache, s, ref, last_grow);
    require_visible(cache, f, ref_f, 1);
    cache.free(f);
    cache.free(s);
    REQUIRE(cache.usage().n_sequences == 0);
  }
}

TEST_CASE("sliding window: single-token growth exposes exactly the window plus the sinks", "[kv]") {
  const kv_shape shape{1, 1, 1};
  sliding_window_cache<float> cache(shape, {.window = 3, .n_sink = 1, .max_grow = 4});
  const seq_id s = *cache.add_sequence();
  std::mt19937 rng(4);
  kv_reference::sequence ref{shape, {}, {}};
  grow_and_store(cache, s, ref, 4, rng);  // prefill chunk: queries 0..3 need rows 1..3 and the sink
  require_visible(cache, s, ref, 4);
  grow_and_store(cache, s, ref, 4, rng);  // queries 4..7 need keys from position 2
  REQUIRE(cache.n_visible(s) == 1 + 6);
  require_visible(cache, s, ref, 4);
  for (int i = 0; i < 9; ++i) {
    grow_and_store(cache, s, ref, 1, rng);
    REQUIRE(cache.n_visible(s) == 1 + 3);  // sink + window
    require_visible(cache, s, ref, 1);
  }
}

TEST_CASE("sliding window: bad input", "[kv]") {
  const kv_shape shape{1, 2, 4};
  sliding_window_cache<float> cache(shape, {.window = 4, .n_sink = 1, .max_grow = 2, .max_rollback = 2});
  const seq_id s = *cache.add_sequence();
  REQUIRE_FALSE(cache.add_sequence().has_value());
  REQUIRE_FALSE(cache.fork(s).has_value());
  REQUIRE_THROWS_WITH(cache.grow(s, 3), "grow: n = 3 exceeds options.max_grow = 2 (grow in chunks, or raise max_grow)");
  REQUIRE_THROWS_WITH(cache.grow(7, 1), "grow: unknown sequence id 7");
  REQUIRE_THROWS_WITH(cache.n_visible(7), "n_visible: unknown sequence id 7");
  for (int i = 0; i < 12; ++i) REQUIRE(cache.grow(s, 1));
  // Ring capacity 6 holds positions 6..11; rolling back to 10 needs 6.., to 9 needs 5...
  REQUIRE_THROWS_WITH(cache.truncate(s, 9),
                      "truncate: n_tokens 9 of sequence 0 cannot be restored: it needs positions from 5 but the ring "
                      "holds positions from 6 (options.max_rollback = 2)");
  REQUIRE_THROWS_WITH(cache.truncate(s, 13), "truncate: n_tokens 13 exceeds the 12 tokens of sequence 0");
  std::vector<float> row(8, 1.0f);
  REQUIRE_THROWS_WITH(cache.store(s, 0, 5, row, row),
                      "store: positions [5, 6) of sequence 0 are no longer in the ring, which holds positions from 6");
  REQUIRE_NOTHROW(cache.store(s, 0, 0, row, row));  // the sink stays writable
  REQUIRE_NOTHROW(cache.truncate(s, 10));
  REQUIRE(cache.n_chunks(s) == 3);  // sink, p6 (last ring row), p7..p9 (wrapped)
  REQUIRE_THROWS_WITH(cache.chunk(s, 0, 0, 3), "chunk: chunk index 3 is out of range [0, 3)");
  REQUIRE_THROWS_WITH((sliding_window_cache<float>(shape, {.window = 0})),
                      "sliding_window_cache: options.window must be > 0, got 0");
  REQUIRE_THROWS_WITH((sliding_window_cache<float>(shape, {.window = 2, .max_grow = 0})),
                      "sliding_window_cache: options.max_grow must be > 0, got 0");
}
