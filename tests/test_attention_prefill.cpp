// SPDX-License-Identifier: MIT
// attention/prefill.hpp against the double-precision oracle.
#include <llmkit/attention/prefill.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_checks.hpp"
#include "reference/attention_reference.hpp"

using namespace llmkit;
using namespace llmkit::attention;
using llmkit::test::chunked_test_cache;

namespace {

using llmkit::test::uniform_values;
using errors = llmkit::test::attention_errors;

struct prefill_case {
  std::size_t n_kv_heads = 2;
  std::size_t group = 2;
  std::size_t head_dim = 64;
  std::vector<std::size_t> n_cached;  // per sequence
  std::vector<std::size_t> n_q;       // per sequence (<= n_cached)
  std::size_t max_chunk = 40;
  std::size_t row_padding = 0;
  std::size_t rotate = 0;
  std::int32_t first_pos = 0;
  float scale = 0.0f;
  float softcap = 0.0f;
  float sink_mean = std::nanf("");  // not NaN: a sink per head around it (params.sinks)
};

/// Builds caches with the case's data in storage T (and in f32 for the
/// quantisation check), runs prefill and returns the largest error against
/// the oracle over the stored values (`stored`) and over the original f32
/// values (`original`), both relative to max|V| (= 1).
template <class T, class Arch = simd::default_arch, class Mask = causal_mask, class Exec = serial_executor>
errors run_case(const prefill_case& c, const Mask& mask, std::uint32_t seed, Exec&& exec = {}) {
  std::mt19937 rng(seed);
  const kv::kv_shape shape{2, c.n_kv_heads, c.head_dim};
  const std::size_t layer = 1;
  chunked_test_cache<T> cache(shape, c.row_padding);
  chunked_test_cache<float> exact(shape, c.row_padding);
  const std::size_t n_seqs = c.n_cached.size();
  std::vector<kv::seq_id> ids(n_seqs);
  std::vector<std::int32_t> cu{0};
  for (std::size_t i = 0; i < n_seqs; ++i) {
    ids[i] = static_cast<kv::seq_id>(100 + 7 * i);
    const std::size_t n = c.n_cached[i];
    const auto k = uniform_values(shape.n_layers * n * c.n_kv_heads * c.head_dim, rng);
    const auto v = uniform_values(k.size(), rng);
    const auto chunks = llmkit::test::random_chunks(n, c.max_chunk, rng);
    cache.add_sequence(ids[i], n, k, v, chunks, c.first_pos, c.rotate);
    exact.add_sequence(ids[i], n, k, v, chunks, c.first_pos, c.rotate);
    cu.push_back(cu.back() + static_cast<std::int32_t>(c.n_q[i]));
  }
  const std::size_t n_heads = c.n_kv_heads * c.group;
  const std::size_t row = n_heads * c.head_dim;
  const auto q = uniform_values(static_cast<std::size_t>(cu.back()) * row, rng);
  const auto sinks = llmkit::test::random_sinks(n_heads, c.sink_mean, rng);
  std::vector<float> out(q.size(), std::nanf(""));
  prefill<Arch>({.q = q, .out = out, .cu_seqlens = cu, .seq_ids = ids, .layer = layer, .n_heads = n_heads,
                 .scale = c.scale, .softcap = c.softcap, .sinks = sinks},
                cache, mask, exec);
  errors e;
  const double scale = c.scale > 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (std::size_t i = 0; i < n_seqs; ++i) {
    const std::size_t first = static_cast<std::size_t>(cu[i]), n_q = c.n_q[i];
    const std::span<const float> qi(q.data() + first * row, n_q * row);
    std::vector<std::int32_t> pos(n_q);
    const std::int32_t last = llmkit::test::reference_last_position(cache, ids[i]);
    for (std::size_t t = 0; t < n_q; ++t) pos[t] = last - static_cast<std::int32_t>(n_q - 1 - t);
    auto vis = [&](std::int32_t qp, std::int32_t kp) { return mask.visible(qp, kp); };
    const auto ref = llmkit::test::reference_attention(cache, ids[i], layer, qi, pos, n_heads, scale, c.softcap, vis, sinks);
    const auto ref0 = llmkit::test::reference_attention(exact, ids[i], layer, qi, pos, n_heads, scale, c.softcap, vis, sinks);
    e.add(out.data() + first * row, ref, ref0);
  }
  return e;
}

// f32 kernels agree with the exact oracle to this (relative to max|V|).
constexpr double f32_tolerance = 1e-5;

}  // namespace

TEST_CASE("prefill: causal, one sequence, lengths across tile boundaries") {
  for (std::size_t n : {1u, 2u, 3u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 100u, 129u, 257u}) {
    INFO("n = " << n);
    prefill_case c;
    c.n_cached = {n};
    c.n_q = {n};
    const auto e = run_case<float>(c, causal_mask{}, static_cast<std::uint32_t>(n));
    REQUIRE(e.finite);
    REQUIRE(e.stored < f32_tolerance);
    const auto s = run_case<float, simd::scalar>(c, causal_mask{}, static_cast<std::uint32_t>(n));
    REQUIRE(s.stored < f32_tolerance);
  }
}

TEST_CASE("prefill: chunked prefill against long caches (up to 4097 keys)") {
  std::mt19937 rng(11);
  for (std::size_t n : {511u, 512u, 513u, 1023u, 2049u, 4095u, 4096u, 4097u}) {
    INFO("n_cached = " << n);
    prefill_case c;
    c.n_cached = {n, n / 3 + 1};
    c.n_q = {1 + rng() % 9, 1 + rng() % 5};
    c.max_chunk = 1 + rng() % 200;
    c.n_kv_heads = 1;
    c.group = 4;
    const auto e = run_case<float>(c, causal_mask{}, static_cast<std::uint32_t>(n));
    REQUIRE(e.finite);
    REQUIRE(e.stored < f32_tolerance);
  }
}

TEST_CASE("prefill: random packed batches, every head_dim and GQA ratio") {
  std::mt19937 rng(12);
  for (std::size_t head_dim : attention::supported_head_dims) {
    for (std::size_t group : {1u, 2u, 3u, 4u, 5u, 8u}) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      prefill_case c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 1 + rng() % 2;
      const std::size_t n_seqs = 1 + rng() % 3;
      for (std::size_t i = 0; i < n_seqs; ++i) {
        const std::size_t n = 1 + rng() % 90;
        c.n_cached.push_back(n);
        c.n_q.push_back(rng() % 2 ? n : 1 + rng() % n);  // full or chunked prefill
      }
      c.max_chunk = 1 + rng() % 50;
      c.row_padding = rng() % 3 == 0 ? 5 : 0;
      const auto e = run_case<float>(c, causal_mask{}, static_cast<std::uint32_t>(rng()));
      REQUIRE(e.finite);
      REQUIRE(e.stored < f32_tolerance);
    }
  }
}

TEST_CASE("prefill: register-tile edges, every GQA ratio 1..8 and head_dim 64..256") {
  // The AVX-512 micro-kernels work on blocks of 12 keys x 2 row registers
  // (Q.K) and 3 query rows x 8 column registers (P.V), inside key tiles of
  // 32 and query blocks of ~64 rows (tokens x group): lengths one below, at
  // and one above those edges, with every remainder of rows mod 3.
  std::mt19937 rng(17);
  const std::size_t lengths[] = {1, 11, 12, 13, 23, 24, 25, 31, 33, 35, 36, 37, 63, 65};
  for (std::size_t head_dim : llmkit::test::compiled_head_dims({64, 80, 96, 128, 256}))
    for (std::size_t group = 1; group <= 8; ++group) {
      prefill_case c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 1;
      const std::size_t n = lengths[rng() % std::size(lengths)];
      const std::size_t n2 = lengths[rng() % std::size(lengths)];
      c.n_cached = {n, n2 + 12};
      c.n_q = {n, 1 + rng() % n2};
      c.max_chunk = 1 + rng() % 40;
      INFO("head_dim = " << head_dim << ", group = " << group << ", n = " << n << ", n2 = " << n2);
      const auto e = run_case<float>(c, causal_mask{}, static_cast<std::uint32_t>(rng()));
      REQUIRE(e.finite);
      REQUIRE(e.stored < f32_tolerance);
    }
}

TEST_CASE("prefill: every mask policy") {
  std::mt19937 rng(13);
  const std::vector<std::int32_t> segments{0, 7, 40, 41, 90, 150};
  const packed_causal_mask packed(segments);
  auto stripes = [](position q, position k) { return k <= q && (q / 4 + k / 3) % 3 != 0; };
  for (int trial = 0; trial < 6; ++trial) {
    prefill_case c;
    c.n_kv_heads = 2;
    c.group = 1 + rng() % 4;
    c.n_cached = {150, 1 + rng() % 150};
    c.n_q = {150 - rng() % 20, c.n_cached[1]};
    c.max_chunk = 1 + rng() % 64;
    const auto seed = static_cast<std::uint32_t>(rng());
    for (const auto& [name, e] :
         {std::pair{"no_mask", run_case<float>(c, no_mask{}, seed)},
          std::pair{"causal", run_case<float>(c, causal_mask{}, seed)},
          std::pair{"sliding_window(37, 3)", run_case<float>(c, sliding_window_mask(37, 3), seed)},
          std::pair{"sliding_window(1)", run_case<float>(c, sliding_window_mask(1), seed)},
          std::pair{"prefix_lm(45)", run_case<float>(c, prefix_lm_mask(45), seed)},
          std::pair{"packed_causal", run_case<float>(c, packed, seed)},
          std::pair{"custom", run_case<float>(c, custom_mask{stripes}, seed)},
          std::pair{"custom, scalar", run_case<float, simd::scalar>(c, custom_mask{stripes}, seed)}}) {
      INFO(name);
      REQUIRE(e.finite);
      REQUIRE(e.stored < f32_tolerance);
    }
  }
}

TEST_CASE("prefill: a fully masked row gives zeros, never NaN") {
  // Queries at even positions see nothing.
  auto odd_only = [](position q, position k) { return q % 2 == 1 && k <= q; };
  prefill_case c;
  c.n_cached = {70};
  c.n_q = {70};
  const auto e = run_case<float>(c, custom_mask{odd_only}, 5);
  REQUIRE(e.finite);
  REQUIRE(e.stored < f32_tolerance);  // the oracle gives exact zeros for those rows
  // A mask hiding everything: every output row is zero.
  auto nothing = [](position, position) { return false; };
  const auto z = run_case<float>(c, custom_mask{nothing, [](position, position, position, position) {
                                                  return tile_visibility::hidden;
                                                }},
                                 6);
  REQUIRE(z.finite);
  REQUIRE(z.stored == 0.0);
}

TEST_CASE("prefill: ring-ordered chunks, shifted positions, padded rows") {
  prefill_case c;
  c.n_cached = {200, 77};
  c.n_q = {13, 77};
  c.rotate = 2;
  c.first_pos = 1000;
  c.row_padding = 3;
  c.max_chunk = 50;
  for (const auto& e : {run_case<float>(c, sliding_window_mask(64, 4), 21), run_case<float>(c, causal_mask{}, 22)}) {
    REQUIRE(e.finite);
    REQUIRE(e.stored < f32_tolerance);
  }
}

TEST_CASE("prefill: explicit scale and logit soft-capping") {
  prefill_case c;
  c.n_cached = {120};
  c.n_q = {120};
  c.head_dim = 128;
  c.scale = 0.3f;    // sharp softmax
  c.softcap = 5.0f;  // Gemma-2 style
  const auto e = run_case<float>(c, causal_mask{}, 31);
  REQUIRE(e.finite);
  REQUIRE(e.stored < f32_tolerance);
  c.softcap = 0.0f;
  c.scale = 0.1f;
  REQUIRE(run_case<float>(c, causal_mask{}, 32).stored < f32_tolerance);
}

// Tolerances against the ORIGINAL f32 K/V (relative to max|V| = 1, with
// q, k, v uniform in [-1, 1] and the default scale): the quantisation error
// of the stored rows, not the kernel's. Against the stored (dequantised)
// values the kernels meet the f32 tolerance.
TEST_CASE("prefill: f16, bf16 and int8 storage") {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 4; ++trial) {
    prefill_case c;
    c.head_dim = trial % 2 ? 128 : 80;
    c.group = 1 + rng() % 4;
    c.n_cached = {1 + rng() % 300, 1 + rng() % 100};
    c.n_q = {c.n_cached[0], 1 + rng() % c.n_cached[1]};
    c.max_chunk = 1 + rng() % 70;
    const auto seed = static_cast<std::uint32_t>(rng());
    const auto h = run_case<f16>(c, causal_mask{}, seed);
    const auto b = run_case<bf16>(c, causal_mask{}, seed);
    const auto i8 = run_case<std::int8_t>(c, causal_mask{}, seed);
    const auto i8s = run_case<std::int8_t, simd::scalar>(c, causal_mask{}, seed);
    for (const auto* e : {&h, &b, &i8, &i8s}) {
      REQUIRE(e->finite);
      REQUIRE(e->stored < f32_tolerance);
    }
    REQUIRE(h.original < 2e-3);
    REQUIRE(b.original < 1.5e-2);
    REQUIRE(i8.original < 1.5e-2);
    // The quantisation error is real (the test can tell the types apart).
    REQUIRE(h.original > 1e-6);
    REQUIRE(b.original > h.original);
  }
}

#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
// The AVX2 kernels (8 lanes, 16 registers, the generic transposes) on this
// machine, whatever its default arch.
TEST_CASE("prefill: the AVX2 kernels on every storage type, head_dim and GQA ratio") {
  using avx2 = xsimd::fma3<xsimd::avx2>;
  if (!llmkit::test::avx2_fma_available()) return;
  std::mt19937 rng(42);
  for (std::size_t head_dim : llmkit::test::compiled_head_dims({64, 80, 96, 128, 256}))
    for (std::size_t group : {1u, 3u, 4u, 8u}) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      prefill_case c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 1 + rng() % 2;
      c.n_cached = {1 + rng() % 150, 1 + rng() % 70};
      c.n_q = {c.n_cached[0], 1 + rng() % c.n_cached[1]};
      c.max_chunk = 1 + rng() % 70;
      c.softcap = rng() % 4 == 0 ? 3.0f : 0.0f;
      const auto seed = static_cast<std::uint32_t>(rng());
      llmkit::test::require_every_storage_type(
          [&](auto t) { return run_case<decltype(t), avx2>(c, causal_mask{}, seed); }, f32_tolerance);
    }
}
#endif

TEST_CASE("prefill: consecutive 16-bit and int8 calls never reuse another call's converted rows") {
  // A thread keeps the f32 rows it converted for (call, sequence, KV head)
  // across its tasks. With one KV head and one sequence, every call's tasks
  // share the previous call's last (sequence, head): only the call id tells
  // the rows apart. New data (and head dims) each call must still match the
  // oracle.
  std::mt19937 rng(21);
  for (int call = 0; call < 6; ++call) {
    prefill_case c;
    c.n_kv_heads = 1;
    c.group = 1 + call % 3;
    c.head_dim = call % 3 == 2 ? 128 : 64;
    c.n_cached = {40 + rng() % 90};
    c.n_q = {c.n_cached[0]};
    const auto seed = static_cast<std::uint32_t>(rng());
    for (const auto& e : {run_case<f16>(c, causal_mask{}, seed), run_case<std::int8_t>(c, causal_mask{}, seed)}) {
      REQUIRE(e.finite);
      REQUIRE(e.stored < f32_tolerance);
    }
  }
}

TEST_CASE("prefill: a thread pool gives bit-identical results") {
  std::mt19937 rng(15);
  const kv::kv_shape shape{1, 2, 64};
  chunked_test_cache<float> cache(shape);
  const std::vector<std::size_t> lens{300, 5, 129};
  std::vector<kv::seq_id> ids{0, 1, 2};
  std::vector<std::int32_t> cu{0};
  for (std::size_t i = 0; i < lens.size(); ++i) {
    const auto k = uniform_values(lens[i] * 2 * 64, rng), v = uniform_values(lens[i] * 2 * 64, rng);
    cache.add_sequence(ids[i], lens[i], k, v, llmkit::test::random_chunks(lens[i], 33, rng));
    cu.push_back(cu.back() + static_cast<std::int32_t>(lens[i]));
  }
  const auto q = uniform_values(static_cast<std::size_t>(cu.back()) * 8 * 64, rng);
  std::vector<float> a(q.size()), b(q.size());
  const prefill_params p{.q = q, .out = a, .cu_seqlens = cu, .seq_ids = ids, .layer = 0, .n_heads = 8};
  prefill(p, cache);
  thread_pool pool(2);
  prefill_params pb = p;
  pb.out = b;
  prefill(pb, cache, causal_mask{}, pool);
  REQUIRE(a == b);
}

TEST_CASE("prefill: bad input raises llmkit::error naming the argument") {
  std::mt19937 rng(16);
  const kv::kv_shape shape{2, 2, 64};
  chunked_test_cache<float> cache(shape);
  const auto k = uniform_values(2 * 10 * 2 * 64, rng);
  cache.add_sequence(3, 10, k, k, {4, 6});
  std::vector<kv::seq_id> ids{3};
  std::vector<std::int32_t> cu{0, 4};
  auto q = uniform_values(4 * 4 * 64, rng);
  std::vector<float> out(q.size());
  prefill_params p{.q = q, .out = out, .cu_seqlens = cu, .seq_ids = ids, .layer = 1, .n_heads = 4};
  REQUIRE_NOTHROW(prefill(p, cache));

  auto bad = p;
  bad.n_heads = 3;
  REQUIRE_THROWS_WITH(prefill(bad, cache),
                      "prefill: n_heads = 3 is not a positive multiple of the cache's n_kv_heads = 2");
  bad = p;
  bad.layer = 2;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: layer 2 is out of range (n_layers = 2)");
  bad = p;
  bad.q = std::span<const float>(q).first(q.size() - 1);
  REQUIRE_THROWS_WITH(prefill(bad, cache),
                      "prefill: q.size() = 1023 must be n_tokens * n_heads * head_dim = 4 * 4 * 64 = 1024");
  bad = p;
  bad.out = std::span<float>(out).first(8);
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: out.size() = 8 must be n_tokens * n_heads * head_dim = 1024");
  const std::vector<std::int32_t> cu2{0, 2, 4};
  bad = p;
  bad.cu_seqlens = cu2;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: cu_seqlens.size() = 3 must be seq_ids.size() + 1 = 2");
  const std::vector<std::int32_t> cu3{1, 4};
  bad = p;
  bad.cu_seqlens = cu3;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: cu_seqlens[0] must be 0, got 1");
  const std::vector<kv::seq_id> unknown{42};
  bad = p;
  bad.seq_ids = unknown;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "chunked_test_cache: unknown sequence 42");
  const std::vector<std::int32_t> too_many{0, 11};
  std::vector<float> q11(11 * 4 * 64), o11(q11.size());
  bad = p;
  bad.cu_seqlens = too_many;
  bad.q = q11;
  bad.out = o11;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: sequence 3 (batch index 0) has 11 queries but only 10 cached "
                                           "tokens; store the new K/V rows first");
  bad = p;
  bad.scale = std::nanf("");
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: scale must be finite and >= 0, got nan");
  bad = p;
  bad.softcap = -1.0f;
  REQUIRE_THROWS_WITH(prefill(bad, cache), "prefill: softcap must be finite and >= 0, got -1");
  chunked_test_cache<float> odd({1, 1, 48});
  std::vector<float> k48(48);
  odd.add_sequence(0, 1, k48, k48, {1});
  const std::vector<kv::seq_id> id0{0};
  const std::vector<std::int32_t> cu1{0, 1};
  std::vector<float> q48(48), o48(48);
  REQUIRE_THROWS_WITH(
      prefill({.q = q48, .out = o48, .cu_seqlens = cu1, .seq_ids = id0, .layer = 0, .n_heads = 1}, odd),
      "dispatch: unsupported head_dim (supported: " + attention::supported_head_dims_text() + ") 48");
  // Nothing was written by a rejected call.
  std::vector<float> untouched(q.size(), 7.0f);
  bad = p;
  bad.out = untouched;
  bad.n_heads = 3;
  REQUIRE_THROWS(prefill(bad, cache));
  REQUIRE(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == 7.0f; }));
}

TEST_CASE("prefill: empty batch and sequences without queries") {
  const kv::kv_shape shape{1, 1, 64};
  chunked_test_cache<float> cache(shape);
  std::vector<float> k(3 * 64, 0.5f);
  cache.add_sequence(0, 3, k, k, {3});
  const std::vector<std::int32_t> cu{0};
  std::vector<float> none;
  REQUIRE_NOTHROW(prefill({.q = none, .out = none, .cu_seqlens = cu, .seq_ids = {}, .layer = 0, .n_heads = 1}, cache));
  const std::vector<std::int32_t> cu0{0, 0};
  const std::vector<kv::seq_id> ids{0};
  REQUIRE_NOTHROW(prefill({.q = none, .out = none, .cu_seqlens = cu0, .seq_ids = ids, .layer = 0, .n_heads = 1}, cache));
}

namespace {
/// vexp_softmax of Arch over [-87, 0] and the edges (see the test below).
template <class Arch>
void require_softmax_exp(const char* arch_name) {
  INFO("arch " << arch_name);
  namespace ad = llmkit::attention::detail;
  constexpr std::size_t L = ad::lanes<Arch>;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-87.0f, 0.0f);
  std::vector<float> x(4096);
  for (auto& v : x) v = u(rng);
  const float edges[] = {0.0f, -0.0f, -1e-30f, -86.99f, -87.0f, -87.0001f, -87.5f, -90.0f, -103.0f, -150.0f,
                         -160.0f, -1e30f, -std::numeric_limits<float>::infinity(), std::nanf("")};
  std::copy(std::begin(edges), std::end(edges), x.begin());
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); i += L)
    ad::vstore<Arch>(y.data() + i, ad::vexp_softmax<Arch>(ad::vload<Arch>(x.data() + i)));
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i] << ", e^x = " << y[i]);
    REQUIRE(std::fpclassify(y[i]) != FP_SUBNORMAL);
    if (!(x[i] >= -87.0f)) {  // below -87, -inf and NaN: +0
      REQUIRE(y[i] == 0.0f);
      REQUIRE(!std::signbit(y[i]));
    } else {
      const double e = std::exp(static_cast<double>(x[i]));
      REQUIRE(std::fabs(y[i] - e) <= 2e-7 * e);
    }
  }
}
}  // namespace

TEST_CASE("prefill: the softmax exponential, against std::exp in double") {
  // vexp_softmax is exact to 2e-7 on [-87, 0] and gives exactly +0 below
  // -87, for -inf and for NaN: never a subnormal (each one costs a
  // microcode assist). Every arch has its own code.
  require_softmax_exp<simd::default_arch>("default");
  require_softmax_exp<simd::scalar>("scalar");
#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
  if (llmkit::test::avx2_fma_available()) require_softmax_exp<xsimd::fma3<xsimd::avx2>>("fma3+avx2");
#endif
}

TEST_CASE("prefill: attention sinks on every storage type, packed batches and masks") {
  std::mt19937 rng(81);
  for (const float sink : {-3.0f, 1.0f, 12.0f}) {
    INFO("sink " << sink);
    prefill_case c;
    c.group = 1 + rng() % 4;
    c.n_cached = {1 + rng() % 300, 70, 5};
    c.n_q = {c.n_cached[0], 33, 5};
    c.max_chunk = 1 + rng() % 70;
    c.sink_mean = sink;
    const auto seed = static_cast<std::uint32_t>(rng());
    llmkit::test::require_sinks_everywhere(
        [&](auto type, auto arch, const auto& mask) { return run_case<decltype(type), decltype(arch)>(c, mask, seed); },
        16, f32_tolerance, f32_tolerance);
  }
  // A fully masked row gives zeros with a sink too.
  prefill_case c;
  c.n_cached = {40};
  c.n_q = {40};
  c.sink_mean = 0.0f;
  const auto e = run_case<float>(c, custom_mask{[](position, position) { return false; }}, 82);
  REQUIRE(e.finite);
  REQUIRE(e.stored < f32_tolerance);  // the oracle's zeros
}

TEST_CASE("prefill: bad sinks raise llmkit::error naming the argument") {
  std::mt19937 rng(83);
  chunked_test_cache<float> cache({1, 2, 64});
  const auto k = uniform_values(4 * 2 * 64, rng);
  cache.add_sequence(3, 4, k, k, {4});
  const std::vector<kv::seq_id> ids{3};
  const std::vector<std::int32_t> cu{0, 4};
  const auto q = uniform_values(4 * 4 * 64, rng);
  std::vector<float> out(q.size());
  const std::vector<float> five(5, 0.0f), inf_sink{0.0f, std::numeric_limits<float>::infinity(), 0.0f, 0.0f};
  REQUIRE_THROWS_WITH(prefill({.q = q, .out = out, .cu_seqlens = cu, .seq_ids = ids, .n_heads = 4, .sinks = five}, cache),
                      "prefill: sinks.size() = 5 must be 0 or n_heads = 4");
  REQUIRE_THROWS_WITH(
      prefill({.q = q, .out = out, .cu_seqlens = cu, .seq_ids = ids, .n_heads = 4, .sinks = inf_sink}, cache),
      "prefill: sinks[1] = inf must be finite");
}
