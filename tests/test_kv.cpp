// SPDX-License-Identifier: MIT
// kv/: contiguous and paged caches, block pool, export/import.
#include <llmkit/kv/block_pool.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>

#include <catch2/catch.hpp>

#include "reference/kv_reference.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace llmkit;
using namespace llmkit::kv;

static_assert(kv_cache<contiguous_cache<float>>);
static_assert(kv_cache<contiguous_cache<f16>>);
static_assert(kv_cache<contiguous_cache<bf16>>);
static_assert(kv_cache<contiguous_cache<std::int8_t>>);
static_assert(kv_cache<paged_cache<float, 16>>);
static_assert(kv_cache<paged_cache<f16, 1>>);
static_assert(kv_cache<paged_cache<bf16, 7>>);
static_assert(kv_cache<paged_cache<std::int8_t, 32>>);

namespace {

/// Grows `cache` and `ref` by n and stores random rows into every layer.
template <class Cache>
bool grow_and_store(Cache& cache, seq_id s, kv_reference::sequence& ref, std::size_t n, std::mt19937& rng) {
  const std::size_t first = cache.n_tokens(s);
  if (!cache.grow(s, n)) return false;
  ref.grow(n);
  const kv_shape shape = cache.shape();
  for (std::size_t layer = 0; layer < shape.n_layers; ++layer) {
    auto k = kv_reference::random_rows(rng, n, shape.n_kv_heads * shape.head_dim);
    auto v = kv_reference::random_rows(rng, n, shape.n_kv_heads * shape.head_dim);
    cache.store(s, layer, first, k, v);
    ref.store(layer, first, k, v);
  }
  return true;
}

template <class Cache>
void require_matches(const Cache& cache, seq_id s, const kv_reference::sequence& ref) {
  REQUIRE(cache.n_tokens(s) == ref.n_tokens());
  REQUIRE(n_visible_rows(cache, s) == ref.n_tokens());
  const auto result = kv_reference::compare(cache, s, ref, kv_reference::range(0, ref.n_tokens()));
  INFO(result.message);
  REQUIRE(result.ok);
}

/// Decoded K and V of every row of (cache, s), in chunk order.
template <class Cache>
std::vector<float> decoded(const Cache& cache, seq_id s) {
  using T = typename Cache::storage_type;
  std::vector<float> out;
  const kv_shape shape = cache.shape();
  for (std::size_t layer = 0; layer < shape.n_layers; ++layer)
    for (std::size_t head = 0; head < shape.n_kv_heads; ++head)
      for (std::size_t c = 0; c < cache.n_chunks(s); ++c) {
        const auto ch = cache.chunk(s, layer, head, c);
        for (std::size_t t = 0; t < ch.n_tokens; ++t)
          for (std::size_t i = 0; i < shape.head_dim; ++i) {
            out.push_back(decode_element<T>(ch.k + t * ch.row_stride, i, ch.k_scale ? ch.k_scale[t] : 1.0f));
            out.push_back(decode_element<T>(ch.v + t * ch.row_stride, i, ch.v_scale ? ch.v_scale[t] : 1.0f));
          }
      }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("paged and contiguous caches read back what was stored, and agree", "[kv]", float, f16, bf16,
                   std::int8_t) {
  std::mt19937 rng(1234);
  constexpr std::size_t block = 8;
  for (int trial = 0; trial < 12; ++trial) {
    std::uniform_int_distribution<std::size_t> layers(1, 3), heads(1, 4);
    const std::size_t dims[] = {1, 3, 16, 17, 64, 80};
    const kv_shape shape{layers(rng), heads(rng), dims[static_cast<std::size_t>(trial) % 6]};
    const std::size_t max_tokens = 4 * block + 3;
    contiguous_cache<TestType> contiguous(shape, {.max_sequences = 4, .max_tokens = max_tokens});
    paged_cache<TestType, block> paged(shape, {.n_blocks = 64});
    const seq_id a = *contiguous.add_sequence();
    const seq_id b = *paged.add_sequence();
    kv_reference::sequence ref{shape, {}, {}};
    std::mt19937 rng_a(static_cast<unsigned>(trial)), rng_b(static_cast<unsigned>(trial));
    // Edge growth sizes: 0, 1, block - 1, block, block + 1, odd, then roll back and grow again.
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, block - 1, block, block + 1, std::size_t{3}}) {
      kv_reference::sequence ref_b = ref;
      REQUIRE(grow_and_store(contiguous, a, ref, n, rng_a));
      REQUIRE(grow_and_store(paged, b, ref_b, n, rng_b));
      require_matches(contiguous, a, ref);
      require_matches(paged, b, ref);
      REQUIRE(decoded(contiguous, a) == decoded(paged, b));
      REQUIRE(paged.n_chunks(b) == (ref.n_tokens() + block - 1) / block);
    }
    const std::size_t keep = std::uniform_int_distribution<std::size_t>(0, ref.n_tokens())(rng);
    contiguous.truncate(a, keep);
    paged.truncate(b, keep);
    ref.truncate(keep);
    require_matches(contiguous, a, ref);
    require_matches(paged, b, ref);
    kv_reference::sequence ref_b = ref;
    REQUIRE(grow_and_store(contiguous, a, ref, 5, rng_a));
    REQUIRE(grow_and_store(paged, b, ref_b, 5, rng_b));
    require_matches(contiguous, a, ref);
    require_matches(paged, b, ref);
    REQUIRE(decoded(contiguous, a) == decoded(paged, b));
    // Contiguous capacity: growing past max_tokens is refused, nothing changes.
    const std::size_t before = contiguous.n_tokens(a);
    REQUIRE_FALSE(contiguous.grow(a, max_tokens - before + 1));
    REQUIRE(contiguous.n_tokens(a) == before);
    REQUIRE(contiguous.grow(a, max_tokens - before));
  }
}

TEST_CASE("int8 storage: per-row scale, zero rows, exact extremes", "[kv]") {
  const kv_shape shape{1, 2, 5};
  paged_cache<std::int8_t, 4> cache(shape, {.n_blocks = 2});
  const seq_id s = *cache.add_sequence();
  REQUIRE(cache.grow(s, 1));
  const std::vector<float> k = {0, 0, 0, 0, 0, -3.0f, 1.5f, 0.0f, 3.0f, -0.75f};
  const std::vector<float> v = {1, 2, 3, 4, 5, 1e-30f, 0, 0, 0, 0};
  cache.store(s, 0, 0, k, v);
  const auto h0 = cache.chunk(s, 0, 0, 0), h1 = cache.chunk(s, 0, 1, 0);
  REQUIRE(h0.k_scale[0] == 0.0f);  // all-zero row
  for (int i = 0; i < 5; ++i) REQUIRE(h0.k[i] == 0);
  REQUIRE(h1.k_scale[0] == Approx(3.0f / 127.0f));
  REQUIRE(h1.k[0] == -127);
  REQUIRE(h1.k[3] == 127);
  REQUIRE((h1.k[1] == 63 || h1.k[1] == 64));  // 1.5 / 3 * 127 = 63.5, up to the rounding of 1 / scale
  REQUIRE(h0.v[4] == 127);
  REQUIRE(h1.v[0] == 127);  // tiny values keep their own scale
  REQUIRE(decode_element(h1.v, 0, h1.v_scale[0]) == Approx(1e-30f));
}

TEST_CASE("paged fork shares every block and copies on the first write into a shared partial block", "[kv]") {
  constexpr std::size_t B = 4;
  const kv_shape shape{2, 2, 8};
  paged_cache<float, B> cache(shape, {.n_blocks = 16});
  std::mt19937 rng(5);
  const seq_id parent = *cache.add_sequence();
  kv_reference::sequence ref_parent{shape, {}, {}};
  REQUIRE(grow_and_store(cache, parent, ref_parent, 2 * B + 2, rng));  // 2 full blocks + 2 rows
  REQUIRE(cache.pool().n_used() == 3);

  const seq_id child = *cache.fork(parent);
  kv_reference::sequence ref_child = ref_parent;
  REQUIRE(cache.pool().n_used() == 3);  // nothing copied
  for (block_id b : cache.block_table(parent)) REQUIRE(cache.pool().refcount(b) == 2);
  REQUIRE(std::vector<block_id>(cache.block_table(child).begin(), cache.block_table(child).end()) ==
          std::vector<block_id>(cache.block_table(parent).begin(), cache.block_table(parent).end()));
  require_matches(cache, child, ref_child);

  // Storing into a shared block is refused (nothing written).
  std::vector<float> rows(shape.n_kv_heads * shape.head_dim, 1.0f);
  REQUIRE_THROWS_WITH(cache.store(child, 0, 9, rows, rows),
                      Catch::Contains("store: token slot 9 of sequence 1 lies in block") &&
                          Catch::Contains("shared by 2 owners"));
  require_matches(cache, parent, ref_parent);

  // The child's first grow copies the partial last block; full blocks stay shared.
  REQUIRE(cache.blocks_needed(child, 1) == 1);
  REQUIRE(grow_and_store(cache, child, ref_child, 1, rng));
  REQUIRE(cache.pool().n_used() == 4);
  const auto pt = cache.block_table(parent), ct = cache.block_table(child);
  REQUIRE(pt[0] == ct[0]);
  REQUIRE(pt[1] == ct[1]);
  REQUIRE(pt[2] != ct[2]);
  REQUIRE(cache.pool().refcount(pt[2]) == 1);
  REQUIRE(cache.pool().refcount(ct[2]) == 1);
  require_matches(cache, parent, ref_parent);
  require_matches(cache, child, ref_child);

  // The parent now owns its partial block alone: it grows in place.
  REQUIRE(cache.blocks_needed(parent, 2) == 0);
  REQUIRE(grow_and_store(cache, parent, ref_parent, 2, rng));
  REQUIRE(cache.pool().n_used() == 4);
  require_matches(cache, parent, ref_parent);
  require_matches(cache, child, ref_child);

  // A fork at a block boundary needs no copy: the next token opens a new block.
  const seq_id boundary = *cache.add_sequence();
  kv_reference::sequence ref_boundary{shape, {}, {}};
  REQUIRE(grow_and_store(cache, boundary, ref_boundary, B, rng));
  const seq_id boundary_child = *cache.fork(boundary);
  REQUIRE(cache.blocks_needed(boundary_child, 1) == 1);
  const std::size_t used = cache.pool().n_used();
  kv_reference::sequence ref_boundary_child = ref_boundary;
  REQUIRE(grow_and_store(cache, boundary_child, ref_boundary_child, 1, rng));
  REQUIRE(cache.pool().n_used() == used + 1);
  REQUIRE(cache.block_table(boundary_child)[0] == cache.block_table(boundary)[0]);
  require_matches(cache, boundary, ref_boundary);
  require_matches(cache, boundary_child, ref_boundary_child);

  // Truncating a fork into a shared block and growing again copies too.
  cache.free(boundary_child);
  const seq_id t = *cache.fork(parent);
  kv_reference::sequence ref_t = ref_parent;
  cache.truncate(t, B + 1);
  ref_t.truncate(B + 1);
  REQUIRE(cache.blocks_needed(t, 1) == 1);
  REQUIRE(grow_and_store(cache, t, ref_t, 1, rng));
  require_matches(cache, t, ref_t);
  require_matches(cache, parent, ref_parent);

  for (seq_id s : {parent, child, boundary, t}) cache.free(s);
  REQUIRE(cache.pool().stats() == block_pool_stats{16, 16, 0});
}

TEST_CASE("paged grow without enough free blocks returns false and changes nothing", "[kv]") {
  constexpr std::size_t B = 4;
  const kv_shape shape{1, 1, 4};
  paged_cache<f16, B> cache(shape, {.n_blocks = 3});
  std::mt19937 rng(9);
  const seq_id a = *cache.add_sequence();
  kv_reference::sequence ref{shape, {}, {}};
  REQUIRE(grow_and_store(cache, a, ref, 2 * B + 1, rng));
  REQUIRE(cache.pool().n_free() == 0);
  const seq_id b = *cache.fork(a);
  // b would need a copy of the shared partial block: no free block.
  REQUIRE_FALSE(cache.grow(b, 1));
  REQUIRE(cache.n_tokens(b) == 2 * B + 1);
  REQUIRE(cache.pool().refcount(cache.block_table(b)[2]) == 2);
  REQUIRE_FALSE(cache.grow(a, 1));  // a shares it too
  REQUIRE(cache.n_tokens(a) == 2 * B + 1);
  cache.free(b);
  // Once a owns its partial block alone, filling it needs no block; one more does.
  REQUIRE(cache.grow(a, B - 1));
  REQUIRE_FALSE(cache.grow(a, 1));
  REQUIRE(cache.n_tokens(a) == 3 * B);
  // The failing grow must not have touched rows already visible.
  ref.grow(B - 1);
  ref.truncate(2 * B + 1);
  cache.truncate(a, 2 * B + 1);
  require_matches(cache, a, ref);
  REQUIRE(cache.grow(a, 0));
  REQUIRE_THROWS_WITH(cache.grow(a, std::numeric_limits<std::size_t>::max()),
                      "grow: n = 18446744073709551615 overflows the position range of sequence 0");
}

TEST_CASE("paged block accounting returns to full after random fork/grow/truncate/free", "[kv]") {
  constexpr std::size_t B = 3;
  const kv_shape shape{1, 1, 2};
  paged_cache<bf16, B> cache(shape, {.n_blocks = 40, .max_sequences = 12});
  std::mt19937 rng(77);
  std::vector<seq_id> live;
  std::vector<kv_reference::sequence> refs;
  std::size_t refused = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (live.empty() || op == 0) {
      if (auto s = cache.add_sequence()) {
        live.push_back(*s);
        refs.push_back({shape, {}, {}});
      }
      continue;
    }
    const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
    if (op <= 5) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(0, 2 * B + 1)(rng);
      const auto stats = cache.pool().stats();
      if (!grow_and_store(cache, live[i], refs[i], n, rng)) {
        ++refused;
        REQUIRE(cache.pool().stats() == stats);
      }
    } else if (op == 6) {
      if (auto c = cache.fork(live[i])) {
        live.push_back(*c);
        refs.push_back(refs[i]);
      }
    } else if (op == 7) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(0, refs[i].n_tokens())(rng);
      cache.truncate(live[i], n);
      refs[i].truncate(n);
    } else {
      cache.free(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      refs.erase(refs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Every used block is referenced exactly as often as block tables name it.
    std::vector<std::uint32_t> count(cache.pool().n_total(), 0);
    for (seq_id s : live)
      for (block_id b : cache.block_table(s)) ++count[static_cast<std::size_t>(b)];
    for (std::size_t b = 0; b < count.size(); ++b)
      REQUIRE(cache.pool().refcount(static_cast<block_id>(b)) == count[b]);
  }
  REQUIRE(refused > 0);  // the pool did run dry along the way
  for (std::size_t i = 0; i < live.size(); ++i) require_matches(cache, live[i], refs[i]);
  for (seq_id s : live) cache.free(s);
  REQUIRE(cache.pool().stats() == block_pool_stats{40, 40, 0});
  REQUIRE(cache.usage().n_sequences == 0);
  REQUIRE(cache.usage().bytes_in_use == 0);
}

TEST_CASE("contiguous fork copies, sequence ids are reused, capacity is an answer", "[kv]") {
  const kv_shape shape{2, 3, 4};
  contiguous_cache<std::int8_t> cache(shape, {.max_sequences = 2, .max_tokens = 10});
  std::mt19937 rng(3);
  const seq_id a = *cache.add_sequence();
  kv_reference::sequence ref{shape, {}, {}};
  REQUIRE(grow_and_store(cache, a, ref, 7, rng));
  const seq_id b = *cache.fork(a);
  REQUIRE_FALSE(cache.add_sequence().has_value());
  REQUIRE_FALSE(cache.fork(a).has_value());
  kv_reference::sequence ref_b = ref;
  REQUIRE(grow_and_store(cache, b, ref_b, 3, rng));
  cache.truncate(a, 2);
  ref.truncate(2);
  require_matches(cache, a, ref);
  require_matches(cache, b, ref_b);
  REQUIRE(cache.usage().n_tokens == 12);
  REQUIRE(cache.usage().bytes_in_use == 2 * 10 * cache.bytes_per_token());
  REQUIRE(cache.bytes_per_token() == 2 * 2 * 3 * (4 + 4));
  cache.free(a);
  REQUIRE(*cache.add_sequence() == a);
  REQUIRE(cache.n_tokens(a) == 0);
  REQUIRE(cache.n_chunks(a) == 0);
}

TEST_CASE("block_pool: free list, refcounts and stats", "[kv]") {
  block_pool pool(3);
  REQUIRE(pool.stats() == block_pool_stats{3, 3, 0});
  const block_id a = *pool.allocate(), b = *pool.allocate(), c = *pool.allocate();
  REQUIRE(a == 0);
  REQUIRE_FALSE(pool.allocate().has_value());
  pool.retain(b);
  REQUIRE(pool.refcount(b) == 2);
  REQUIRE_FALSE(pool.release(b));
  REQUIRE(pool.release(b));
  REQUIRE(pool.refcount(b) == 0);
  REQUIRE(*pool.allocate() == b);  // LIFO reuse
  REQUIRE_THROWS_WITH(pool.retain(7), "block_pool::retain: block 7 is out of range [0, 3)");
  REQUIRE(pool.release(c));
  REQUIRE_THROWS_WITH(pool.release(c), "block_pool::release: block 2 is free");
  REQUIRE_THROWS_WITH(pool.refcount(-1), "block_pool::refcount: block -1 is out of range [0, 3)");
  REQUIRE(pool.release(a));
  REQUIRE(pool.release(b));
  REQUIRE(pool.stats() == block_pool_stats{3, 3, 0});
}

TEMPLATE_TEST_CASE("bad input raises llmkit::error naming the argument and value", "[kv]", float, std::int8_t) {
  const kv_shape shape{2, 2, 4};
  contiguous_cache<TestType> contiguous(shape, {.max_sequences = 2, .max_tokens = 8});
  paged_cache<TestType, 4> paged(shape, {.n_blocks = 4});
  auto check = [&](auto& cache) {
    const seq_id s = *cache.add_sequence();
    REQUIRE(cache.grow(s, 2));
    std::vector<float> row(2 * 4, 0.5f), two(2 * 2 * 4, 0.5f), odd(7, 0.5f);
    REQUIRE_THROWS_WITH(cache.n_tokens(42), "n_tokens: unknown sequence id 42");
    REQUIRE_THROWS_WITH(cache.grow(-1, 1), "grow: unknown sequence id -1");
    REQUIRE_THROWS_WITH(cache.free(9), "free: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.fork(9), "fork: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.truncate(9, 0), "truncate: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.n_chunks(9), "n_chunks: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.chunk(9, 0, 0, 0), "chunk: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.store(9, 0, 0, row, row), "store: unknown sequence id 9");
    REQUIRE_THROWS_WITH(cache.truncate(s, 3), "truncate: n_tokens 3 exceeds the 2 tokens of sequence 0");
    REQUIRE_THROWS_WITH(cache.store(s, 2, 0, row, row), "store: layer 2 is out of range [0, 2)");
    REQUIRE_THROWS_WITH(cache.store(s, 0, 0, odd, odd),
                        "store: k.size() = 7 is not a multiple of n_kv_heads * head_dim = 8");
    REQUIRE_THROWS_WITH(cache.store(s, 0, 0, row, two), "store: v.size() = 16 differs from k.size() = 8");
    REQUIRE_THROWS_WITH(cache.store(s, 0, 1, two, two),
                        "store: token slots [1, 3) exceed n_tokens = 2 of sequence 0 (grow first)");
    REQUIRE_THROWS_WITH(cache.chunk(s, 2, 0, 0), "chunk: layer 2 is out of range [0, 2)");
    REQUIRE_THROWS_WITH(cache.chunk(s, 0, 2, 0), "chunk: kv_head 2 is out of range [0, 2)");
    REQUIRE_THROWS_WITH(cache.chunk(s, 0, 0, 1), "chunk: chunk index 1 is out of range [0, 1)");
    cache.store(s, 0, 0, two, two);
    if constexpr (std::is_same_v<TestType, std::int8_t>) {
      // A NaN anywhere rejects the whole store: nothing half-written.
      std::vector<float> bad = two;
      bad[12] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> fresh(two.size(), -1.0f);
      REQUIRE_THROWS_WITH(cache.store(s, 0, 0, fresh, bad),
                          Catch::StartsWith("store: v[12] = nan is not finite (int8 storage cannot hold it)"));
      REQUIRE(cache.chunk(s, 0, 0, 0).k[0] == 127);
    }
    cache.free(s);
  };
  check(contiguous);
  check(paged);
  REQUIRE_THROWS_WITH((contiguous_cache<TestType>({0, 1, 1}, {.max_sequences = 1, .max_tokens = 1})),
                      "contiguous_cache: shape.n_layers must be > 0, got 0");
  REQUIRE_THROWS_WITH((contiguous_cache<TestType>({1, 1, 1}, {.max_sequences = 1, .max_tokens = 0})),
                      "contiguous_cache: options.max_tokens must be > 0, got 0");
  REQUIRE_THROWS_WITH((paged_cache<TestType, 4>({1, 0, 1}, {.n_blocks = 1})),
                      "paged_cache: shape.n_kv_heads must be > 0, got 0");
  REQUIRE_THROWS_WITH((paged_cache<TestType, 4>({1, 1, 1}, {.n_blocks = 0})),
                      "paged_cache: options.n_blocks must be > 0, got 0");
  REQUIRE_THROWS_WITH(paged.add_sequence_sharing(std::vector<block_id>{0}, 5),
                      "add_sequence_sharing: 1 blocks given for n_tokens = 5, which needs 2");
  REQUIRE_THROWS_WITH(paged.add_sequence_sharing(std::vector<block_id>{3}, 1),
                      "add_sequence_sharing: block 3 is not a used block");
}

TEMPLATE_TEST_CASE("export_sequence / import_sequence round-trip and reject corrupt buffers", "[kv]", float, f16,
                   std::int8_t) {
  const kv_shape shape{2, 3, 5};
  paged_cache<TestType, 4> source(shape, {.n_blocks = 8});
  paged_cache<TestType, 3> target(shape, {.n_blocks = 8});  // another block size
  std::mt19937 rng(21);
  for (std::size_t n : {0u, 1u, 4u, 9u}) {
    const seq_id s = *source.add_sequence();
    kv_reference::sequence ref{shape, {}, {}};
    REQUIRE(grow_and_store(source, s, ref, n, rng));
    const auto bytes = source.export_sequence(s);
    REQUIRE(bytes.size() == 8 + 16 + 32 + n * source.bytes_per_token() + 8);
    const seq_id t = *target.import_sequence(bytes);
    require_matches(target, t, ref);
    REQUIRE(decoded(source, s) == decoded(target, t));
    source.free(s);
    target.free(t);
  }
  REQUIRE(target.pool().n_free() == 8);

  const seq_id s = *source.add_sequence();
  kv_reference::sequence ref{shape, {}, {}};
  REQUIRE(grow_and_store(source, s, ref, 6, rng));
  const auto good = source.export_sequence(s);
  auto corrupt = good;
  corrupt[0] = std::byte{'X'};
  REQUIRE_THROWS_WITH(target.import_sequence(corrupt),
                      "import_sequence: buffer does not start with the magic \"LLMKITKV\"");
  corrupt = good;
  corrupt[8] = std::byte{2};
  REQUIRE_THROWS_WITH(target.import_sequence(corrupt),
                      "import_sequence: buffer version 2 is not the supported version 1");
  corrupt = good;
  corrupt[100] ^= std::byte{1};
  REQUIRE_THROWS_WITH(target.import_sequence(corrupt), "import_sequence: checksum mismatch (buffer corrupt)");
  corrupt = good;
  corrupt.pop_back();
  REQUIRE_THROWS_WITH(target.import_sequence(corrupt),
                      Catch::StartsWith("import_sequence: n_tokens 6 does not match the buffer size"));
  REQUIRE_THROWS_WITH(target.import_sequence(std::span(good).first(20)),
                      "import_sequence: buffer of 20 bytes is shorter than the 64-byte header");
  paged_cache<TestType, 4> other_shape({2, 3, 6}, {.n_blocks = 8});
  REQUIRE_THROWS_WITH(other_shape.import_sequence(good),
                      "import_sequence: buffer shape (n_layers 2, n_kv_heads 3, head_dim 5) differs from the "
                      "cache's (2, 3, 6)");
  paged_cache<bf16, 4> other_dtype(shape, {.n_blocks = 8});
  REQUIRE_THROWS_WITH(other_dtype.import_sequence(good), Catch::StartsWith("import_sequence: buffer dtype"));
  // Not enough blocks: an answer, nothing changed.
  paged_cache<TestType, 4> small(shape, {.n_blocks = 1});
  REQUIRE_FALSE(small.import_sequence(good).has_value());
  REQUIRE(small.pool().n_free() == 1);
  REQUIRE(small.n_sequences() == 0);
  REQUIRE(small.usage().n_sequences == 0);
}
