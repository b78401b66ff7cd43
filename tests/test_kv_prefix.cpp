// SPDX-License-Identifier: MIT
// kv/: prefix cache (block reuse by token hash, LRU eviction) on the paged cache.
#include <llmkit/kv/prefix_cache.hpp>

#include <catch2/catch.hpp>

#include "reference/kv_reference.hpp"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

using namespace llmkit;
using namespace llmkit::kv;

static_assert(kv_cache<prefix_cache<float, 16>>);
static_assert(kv_cache<prefix_cache<f16, 4>>);
static_assert(kv_cache<prefix_cache<bf16, 1>>);
static_assert(kv_cache<prefix_cache<std::int8_t, 32>>);
static_assert(token_tracking_cache<prefix_cache<float, 16>>);
static_assert(!token_tracking_cache<paged_cache<float, 16>>);

namespace {

using tokens_t = std::vector<std::int32_t>;

/// A stand-in model: the K/V row of position p in `layer` is a fixed
/// function of the tokens [0, p] (as in a real transformer), so a reused
/// block must equal what prefilling the same prefix would store.
std::vector<float> model_rows(const tokens_t& tokens, std::size_t first, std::size_t n, std::size_t layer,
                              const kv_shape& shape, int which) {
  std::vector<float> out;
  for (std::size_t p = first; p < first + n; ++p) {
    std::uint64_t h = 1469598103934665603ull ^ (layer * 7919 + static_cast<std::uint64_t>(which));
    for (std::size_t i = 0; i <= p; ++i) h = (h ^ static_cast<std::uint32_t>(tokens[i])) * 1099511628211ull;
    std::mt19937 rng(static_cast<std::uint32_t>(h ^ (h >> 32)));
    const auto row = kv_reference::random_rows(rng, 1, shape.n_kv_heads * shape.head_dim);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

/// Grows s by tokens[n_tokens(s):] (all of them) and stores model rows.
template <class Cache>
bool prefill(Cache& cache, seq_id s, const tokens_t& tokens) {
  const std::size_t first = cache.n_tokens(s);
  const std::size_t n = tokens.size() - first;
  if (!cache.grow(s, std::span<const std::int32_t>(tokens).subspan(first))) return false;
  for (std::size_t layer = 0; layer < cache.shape().n_layers; ++layer)
    cache.store(s, layer, first, model_rows(tokens, first, n, layer, cache.shape(), 0),
                model_rows(tokens, first, n, layer, cache.shape(), 1));
  return true;
}

/// The oracle of a sequence with these tokens.
kv_reference::sequence oracle(const tokens_t& tokens, const kv_shape& shape) {
  kv_reference::sequence ref{shape, {}, {}};
  ref.grow(tokens.size());
  for (std::size_t layer = 0; layer < shape.n_layers; ++layer)
    ref.store(layer, 0, model_rows(tokens, 0, tokens.size(), layer, shape, 0),
              model_rows(tokens, 0, tokens.size(), layer, shape, 1));
  return ref;
}

template <class Cache>
void require_holds(const Cache& cache, seq_id s, const tokens_t& tokens) {
  REQUIRE(cache.n_tokens(s) == tokens.size());
  const auto result = kv_reference::compare(cache, s, oracle(tokens, cache.shape()), kv_reference::range(0, tokens.size()));
  INFO(result.message);
  REQUIRE(result.ok);
}

tokens_t concat(tokens_t a, const tokens_t& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

tokens_t iota_tokens(std::int32_t first, std::size_t n) {
  tokens_t t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<std::int32_t>(i);
  return t;
}

}  // namespace

TEMPLATE_TEST_CASE("prefix cache reuses the longest published prefix and skips it", "[kv]", float, f16, std::int8_t) {
  constexpr std::size_t B = 4;
  const kv_shape shape{2, 2, 8};
  prefix_cache<TestType, B> cache(shape, {.n_blocks = 32});
  const tokens_t system = iota_tokens(100, 2 * B + 1);  // 2 full blocks + 1
  const tokens_t a_tokens = concat(system, iota_tokens(500, 6));

  // Nothing is cached yet.
  const auto a = *cache.add_sequence(a_tokens);
  REQUIRE(a.n_cached_tokens == 0);
  REQUIRE(prefill(cache, a.seq, a_tokens));
  cache.commit(a.seq);
  REQUIRE(cache.stats().n_cached_blocks == a_tokens.size() / B);  // 15 tokens: 3 full blocks
  REQUIRE(cache.stats().n_evictable_blocks == 0);

  // Same system prompt, different question: the 2 full system blocks are reused.
  const tokens_t b_tokens = concat(system, iota_tokens(900, 3));
  REQUIRE(cache.match(b_tokens) == 2 * B);  // what add_sequence will find, without a lookup counted
  REQUIRE(cache.match(a_tokens) == 3 * B);
  REQUIRE(cache.match(tokens_t{}) == 0);
  REQUIRE(cache.stats().n_lookups == 1);
  const auto b = *cache.add_sequence(b_tokens);
  REQUIRE(b.n_cached_tokens == 2 * B);
  REQUIRE(cache.n_tokens(b.seq) == 2 * B);
  REQUIRE(cache.block_table(b.seq)[0] == cache.block_table(a.seq)[0]);
  REQUIRE(cache.block_table(b.seq)[1] == cache.block_table(a.seq)[1]);
  REQUIRE(cache.pool().refcount(cache.block_table(a.seq)[0]) == 3);  // a, b and the cache
  const std::size_t used = cache.pool().n_used();
  REQUIRE(prefill(cache, b.seq, b_tokens));
  REQUIRE(cache.pool().n_used() == used + 1);  // only the remainder took a block
  require_holds(cache, b.seq, b_tokens);
  require_holds(cache, a.seq, a_tokens);

  // A prompt equal to a's, block-aligned: one token is always left to prefill.
  const tokens_t aligned(a_tokens.begin(), a_tokens.begin() + 3 * B);
  const auto c = *cache.add_sequence(aligned);
  REQUIRE(c.n_cached_tokens == 2 * B);
  const tokens_t aligned_plus = concat(aligned, {7});
  const auto d = *cache.add_sequence(aligned_plus);
  REQUIRE(d.n_cached_tokens == 3 * B);
  // Different first token: no reuse at all (the key chains every token before).
  tokens_t other = a_tokens;
  other[0] = 1;
  REQUIRE(cache.add_sequence(other)->n_cached_tokens == 0);
  REQUIRE(cache.add_sequence(tokens_t{})->n_cached_tokens == 0);
  REQUIRE(cache.stats().n_lookups == 6);
  REQUIRE(cache.stats().n_hit_tokens == 2 * B + 2 * B + 3 * B);

  // Published blocks are read-only for everybody.
  std::vector<float> row(shape.n_kv_heads * shape.head_dim, 0.0f);
  REQUIRE_THROWS_WITH(cache.store(a.seq, 0, 0, row, row), Catch::Contains("only slots reserved by grow are writable"));
}

TEST_CASE("prefix cache evicts unreferenced blocks least recently used, tail first", "[kv]") {
  constexpr std::size_t B = 2;
  const kv_shape shape{1, 1, 4};
  prefix_cache<float, B> cache(shape, {.n_blocks = 8});
  const tokens_t p = iota_tokens(10, 3 * B + 1);  // 4 blocks, 3 publishable
  const tokens_t q = iota_tokens(50, 3 * B + 1);
  for (const tokens_t* t : {&p, &q}) {
    const auto h = *cache.add_sequence(*t);
    REQUIRE(prefill(cache, h.seq, *t));
    cache.commit(h.seq);
    cache.free(h.seq);
  }
  // p's 3 and q's 3 blocks stay cached; the partial blocks went back.
  REQUIRE(cache.stats().n_cached_blocks == 6);
  REQUIRE(cache.stats().n_evictable_blocks == 6);
  REQUIRE(cache.pool().n_free() == 2);

  // q is in use again: its blocks are not evictable.
  const auto q2 = *cache.add_sequence(q);
  REQUIRE(q2.n_cached_tokens == 3 * B);
  REQUIRE(cache.stats().n_evictable_blocks == 3);

  // A fresh sequence needing 4 blocks evicts 2 of p's: its last two blocks (tail first).
  const tokens_t r = iota_tokens(90, 4 * B);
  const auto h = *cache.add_sequence(r);
  REQUIRE(h.n_cached_tokens == 0);
  REQUIRE(prefill(cache, h.seq, r));
  REQUIRE(cache.stats().n_evicted_blocks == 2);
  REQUIRE(cache.add_sequence(p)->n_cached_tokens == B);  // only p's first block survived
  require_holds(cache, q2.seq, tokens_t(q.begin(), q.begin() + 3 * B));

  // Not enough even with eviction: false, nothing evicted, nothing changed.
  const auto stats = cache.stats();
  const auto pool = cache.pool().stats();
  REQUIRE_FALSE(cache.grow(h.seq, std::span<const std::int32_t>(iota_tokens(0, 10 * B))));
  REQUIRE(cache.stats().n_evicted_blocks == stats.n_evicted_blocks);
  REQUIRE(cache.pool().stats() == pool);
  REQUIRE(cache.n_tokens(h.seq) == r.size());
}

TEST_CASE("prefix cache: truncating into a published block copies it, untracked growth is never published", "[kv]") {
  constexpr std::size_t B = 4;
  const kv_shape shape{1, 2, 3};
  prefix_cache<bf16, B> cache(shape, {.n_blocks = 16});
  const tokens_t t = iota_tokens(1, 2 * B + 2);
  const auto a = *cache.add_sequence(t);
  REQUIRE(prefill(cache, a.seq, t));
  cache.commit(a.seq);
  // Speculative rollback into block 1 (published), then different tokens.
  cache.truncate(a.seq, B + 1);
  const block_id published = cache.block_table(a.seq)[1];
  tokens_t u(t.begin(), t.begin() + B + 1);
  u.push_back(77);
  REQUIRE(prefill(cache, a.seq, u));
  REQUIRE(cache.block_table(a.seq)[1] != published);  // copied on write
  require_holds(cache, a.seq, u);
  // The published block still serves the original prefix.
  const auto b = *cache.add_sequence(t);
  REQUIRE(b.n_cached_tokens == 2 * B);
  REQUIRE(cache.block_table(b.seq)[1] == published);
  require_holds(cache, b.seq, tokens_t(t.begin(), t.begin() + 2 * B));

  // Rows grown without token ids are never published...
  const auto c = *cache.add_sequence();
  REQUIRE(cache.grow(c, 2 * B));
  cache.commit(c);
  REQUIRE(cache.stats().n_cached_blocks == 2);
  // ...until a truncate back to known tokens (none here) restarts tracking.
  cache.truncate(c, 0);
  const tokens_t v = iota_tokens(300, B + 1);
  REQUIRE(prefill(cache, c, v));
  cache.commit(c);
  REQUIRE(cache.stats().n_cached_blocks == 3);

  for (seq_id s : {a.seq, b.seq, c}) cache.free(s);
  REQUIRE(cache.pool().n_used() == 3);  // only the cache's own references
  cache.evict_unreferenced();
  REQUIRE(cache.pool().stats() == block_pool_stats{16, 16, 0});
  REQUIRE(cache.stats().n_cached_blocks == 0);
}

TEST_CASE("prefix cache: hash collisions never return the wrong block", "[kv]") {
  struct constant_hash {
    std::uint64_t operator()(std::uint64_t, std::span<const std::int32_t>) const noexcept { return 42; }
  };
  constexpr std::size_t B = 2;
  const kv_shape shape{1, 1, 2};
  prefix_cache<float, B, constant_hash> cache(shape, {.n_blocks = 16});
  const tokens_t p = {1, 2, 3, 4, 5};
  const auto a = *cache.add_sequence(p);
  REQUIRE(prefill(cache, a.seq, p));
  cache.commit(a.seq);
  // Block 1 has the same key as block 0 but another parent: not published.
  REQUIRE(cache.stats().n_cached_blocks == 1);
  const tokens_t q = {1, 9, 3, 4, 5};
  REQUIRE(cache.add_sequence(q)->n_cached_tokens == 0);  // same key, other tokens: miss
  REQUIRE(cache.add_sequence(p)->n_cached_tokens == B);
}

TEST_CASE("prefix cache: random workload keeps contents and block accounting exact", "[kv]") {
  constexpr std::size_t B = 3;
  const kv_shape shape{2, 1, 4};
  prefix_cache<f16, B> cache(shape, {.n_blocks = 14, .max_sequences = 6});
  std::mt19937 rng(2024);
  const std::vector<tokens_t> stems = {iota_tokens(1, 7), iota_tokens(1, 4), iota_tokens(40, 9)};
  std::map<seq_id, tokens_t> live;
  std::size_t refused = 0, hits = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (live.empty() || op < 2) {
      tokens_t prompt = stems[std::uniform_int_distribution<std::size_t>(0, stems.size() - 1)(rng)];
      const std::size_t extra = std::uniform_int_distribution<std::size_t>(0, 4)(rng);
      for (std::size_t i = 0; i < extra; ++i) prompt.push_back(std::uniform_int_distribution<std::int32_t>(0, 3)(rng));
      auto hit = cache.add_sequence(prompt);
      if (!hit) continue;
      hits += hit->n_cached_tokens > 0;
      if (!prefill(cache, hit->seq, prompt)) {
        ++refused;
        cache.free(hit->seq);
        continue;
      }
      cache.commit(hit->seq);
      live[hit->seq] = prompt;
      continue;
    }
    auto it = live.begin();
    std::advance(it, std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
    const seq_id s = it->first;
    if (op < 6) {  // decode a token
      tokens_t next = it->second;
      next.push_back(std::uniform_int_distribution<std::int32_t>(0, 3)(rng));
      if (prefill(cache, s, next)) {
        cache.commit(s);
        it->second = next;
      } else {
        ++refused;
      }
    } else if (op == 6) {
      if (auto f = cache.fork(s)) live[*f] = it->second;
    } else if (op == 7) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(0, it->second.size())(rng);
      cache.truncate(s, n);
      it->second.resize(n);
    } else {
      cache.free(s);
      live.erase(it);
    }
    // Reference counts = block-table references + one per published block.
    std::vector<std::uint32_t> count(cache.pool().n_total(), 0);
    for (const auto& [id, tokens] : live)
      for (block_id b : cache.block_table(id)) ++count[static_cast<std::size_t>(b)];
    const auto stats = cache.stats();
    std::size_t published_refs = 0;
    for (std::size_t b = 0; b < count.size(); ++b) {
      const std::uint32_t rc = cache.pool().refcount(static_cast<block_id>(b));
      REQUIRE((rc == count[b] || rc == count[b] + 1));
      published_refs += rc - count[b];
    }
    REQUIRE(published_refs == stats.n_cached_blocks);
  }
  REQUIRE(refused > 0);
  REQUIRE(hits > 0);
  REQUIRE(cache.stats().n_evicted_blocks > 0);
  for (const auto& [id, tokens] : live) require_holds(cache, id, tokens);
  for (const auto& [id, tokens] : live) cache.free(id);
  cache.evict_unreferenced();
  REQUIRE(cache.pool().stats() == block_pool_stats{14, 14, 0});
}

TEST_CASE("prefix cache: bad input", "[kv]") {
  prefix_cache<float, 4> cache({1, 1, 4}, {.n_blocks = 4});
  REQUIRE_THROWS_WITH(cache.commit(3), "commit: unknown sequence id 3");
  REQUIRE_THROWS_WITH(cache.free(3), "free: unknown sequence id 3");
  REQUIRE_THROWS_WITH(cache.fork(3), "fork: unknown sequence id 3");
  REQUIRE_THROWS_WITH(cache.truncate(3, 0), "truncate: unknown sequence id 3");
  REQUIRE_THROWS_WITH(cache.grow(3, 1), "grow: unknown sequence id 3");
  REQUIRE_THROWS_WITH(cache.n_tokens(3), "n_tokens: unknown sequence id 3");
  REQUIRE_THROWS_WITH((prefix_cache<float, 4>({1, 1, 4}, {.n_blocks = 0})),
                      "paged_cache: options.n_blocks must be > 0, got 0");
}

TEST_CASE("prefix cache: an imported sequence holds the buffer's K/V, evicts to make room, is never published",
          "[kv]") {
  constexpr std::size_t B = 2;
  const kv_shape shape{2, 1, 4};
  const tokens_t t = iota_tokens(200, 3 * B + 1);  // 4 blocks
  prefix_cache<float, B> source(shape, {.n_blocks = 8});
  const auto src = *source.add_sequence(t);
  REQUIRE(prefill(source, src.seq, t));
  const auto bytes = source.paged().export_sequence(src.seq);
  REQUIRE(paged_cache<float, B>::exported_tokens(bytes) == t.size());

  // 6 blocks, 3 of them cached and evictable: the import evicts one.
  prefix_cache<float, B> target(shape, {.n_blocks = 6, .max_sequences = 2});
  const tokens_t p = iota_tokens(10, 3 * B + 1);
  const auto h = *target.add_sequence(p);
  REQUIRE(prefill(target, h.seq, p));
  target.commit(h.seq);
  target.free(h.seq);
  REQUIRE(target.stats().n_evictable_blocks == 3);

  // A corrupt buffer throws with nothing evicted.
  auto corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= std::byte{1};
  REQUIRE_THROWS_WITH(target.import_sequence(corrupt), "import_sequence: checksum mismatch (buffer corrupt)");
  REQUIRE(target.stats().n_evicted_blocks == 0);

  const auto s = target.import_sequence(bytes);
  REQUIRE(s.has_value());
  REQUIRE(target.stats().n_evicted_blocks == 1);
  require_holds(target, *s, t);
  target.commit(*s);  // token ids unknown: nothing is published
  REQUIRE(target.stats().n_cached_blocks == 2);
  REQUIRE(target.match(concat(t, {1})) == 0);
  // It grows like any sequence (evicting one more block); its later tokens
  // are not published either.
  REQUIRE(target.grow(*s, std::span<const std::int32_t>(iota_tokens(7, B))));
  REQUIRE(target.stats().n_evicted_blocks == 2);
  target.commit(*s);
  REQUIRE(target.stats().n_cached_blocks == 1);

  // Another one does not fit even with eviction (5 + 4 > 6): nullopt, nothing evicted.
  REQUIRE_FALSE(target.import_sequence(bytes).has_value());
  REQUIRE(target.stats().n_evicted_blocks == 2);
  target.free(*s);
  REQUIRE(target.pool().n_free() + target.stats().n_cached_blocks == 6);

  // max_sequences live: nullopt before any eviction (2 free blocks, 3 evictable).
  prefix_cache<float, B> full(shape, {.n_blocks = 6, .max_sequences = 1});
  const auto f = *full.add_sequence(p);
  REQUIRE(prefill(full, f.seq, p));
  full.commit(f.seq);
  full.free(f.seq);
  const auto live = *full.add_sequence(tokens_t{1});
  REQUIRE(prefill(full, live.seq, tokens_t{1}));
  REQUIRE(full.pool().n_free() == 2);
  REQUIRE_FALSE(full.import_sequence(bytes).has_value());
  REQUIRE(full.stats().n_evicted_blocks == 0);
  const auto head = std::span<const std::byte>(bytes).first(10);
  using paged_t = paged_cache<float, B>;
  REQUIRE_THROWS_WITH(paged_t::exported_tokens(head), Catch::Contains("shorter than the 56-byte header"));
}
