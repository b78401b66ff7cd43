// SPDX-License-Identifier: MIT
// attention/decode.hpp against the double-precision oracle.
#include <llmkit/attention/decode.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attention_checks.hpp"
#include "reference/attention_reference.hpp"

using namespace llmkit;
using namespace llmkit::attention;
using llmkit::test::chunked_test_cache;

namespace {

using llmkit::test::uniform_values;
using errors = llmkit::test::attention_errors;

struct decode_case {
  std::size_t n_kv_heads = 2;
  std::size_t group = 4;
  std::size_t head_dim = 64;
  std::vector<std::size_t> n_cached;  // per sequence
  std::size_t max_chunk = 40;
  std::size_t rotate = 0;
  std::size_t split = 0;  // kv_split_tokens
  float scale = 0.0f;
  float softcap = 0.0f;
  float sink_mean = std::nanf("");  // not NaN: a sink per head around it (params.sinks)
  bool int8_queries = false;  // decode_params::int8_queries
  bool bf16_queries = false;  // decode_params::bf16_queries
  bool bf16_probabilities = false;  // decode_params::bf16_probabilities
  bool int8_probabilities = false;  // decode_params::int8_probabilities
  attention::decode_tuning tuning{};  // decode_params::tuning
};

/// The queries decode scores when int8_queries is set: each head of q *
/// scale rounded to int8 levels as the kernel rounds them (in float, the
/// same operations), returned unscaled (the oracle multiplies by scale).
std::vector<float> int8_rounded_queries(const std::vector<float>& q, std::size_t head_dim, float scale) {
  std::vector<float> r(q.size());
  for (std::size_t h = 0; h < q.size() / head_dim; ++h) {
    std::vector<float> x(head_dim);
    float amax = 0.0f;
    for (std::size_t d = 0; d < head_dim; ++d) {
      x[d] = q[h * head_dim + d] * scale;
      amax = std::max(amax, std::fabs(x[d]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (std::size_t d = 0; d < head_dim; ++d)
      r[h * head_dim + d] =
          static_cast<float>(std::nearbyint(x[d] * inv) * (static_cast<double>(amax) / 127.0) / scale);
  }
  return r;
}

/// The queries decode scores when bf16_queries is set: q * scale rounded
/// to bf16 (to nearest even, on the f32 bits), returned unscaled.
std::vector<float> bf16_rounded_queries(const std::vector<float>& q, float scale) {
  std::vector<float> r(q.size());
  for (std::size_t x = 0; x < q.size(); ++x) {
    std::uint32_t bits = std::bit_cast<std::uint32_t>(q[x] * scale);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    r[x] = static_cast<float>(static_cast<double>(std::bit_cast<float>(bits)) / scale);
  }
  return r;
}

template <class T, class Arch = simd::default_arch, class Mask = causal_mask, class Exec = serial_executor>
errors run_case(const decode_case& c, const Mask& mask, std::uint32_t seed, Exec&& exec = {}) {
  std::mt19937 rng(seed);
  const kv::kv_shape shape{1, c.n_kv_heads, c.head_dim};
  chunked_test_cache<T> cache(shape);
  chunked_test_cache<float> exact(shape);
  const std::size_t n_seqs = c.n_cached.size();
  std::vector<kv::seq_id> ids(n_seqs);
  for (std::size_t i = 0; i < n_seqs; ++i) {
    ids[i] = static_cast<kv::seq_id>(3 * i + 1);
    const std::size_t n = c.n_cached[i];
    const auto k = uniform_values(n * c.n_kv_heads * c.head_dim, rng);
    const auto v = uniform_values(k.size(), rng);
    const auto chunks = llmkit::test::random_chunks(n, c.max_chunk, rng);
    cache.add_sequence(ids[i], n, k, v, chunks, 0, c.rotate);
    exact.add_sequence(ids[i], n, k, v, chunks, 0, c.rotate);
  }
  const std::size_t n_heads = c.n_kv_heads * c.group, row = n_heads * c.head_dim;
  const auto q = uniform_values(n_seqs * row, rng);
  const auto sinks = llmkit::test::random_sinks(n_heads, c.sink_mean, rng);
  errors e;
  e.out.assign(q.size(), std::nanf(""));
  decode<Arch>({.q = q, .out = e.out, .seq_ids = ids, .layer = 0, .n_heads = n_heads, .scale = c.scale,
                .softcap = c.softcap, .sinks = sinks, .kv_split_tokens = c.split, .int8_queries = c.int8_queries,
                .bf16_queries = c.bf16_queries, .bf16_probabilities = c.bf16_probabilities,
                .int8_probabilities = c.int8_probabilities, .tuning = c.tuning},
               cache, mask, exec);
  const double scale = c.scale > 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  // int8_queries (int8 caches) and bf16_queries (bf16 caches): the stored
  // error is against the rounded queries, the original one against the
  // queries as given.
  const float kernel_scale = attention::detail::effective_scale(c.scale, c.head_dim);
  const auto q_scored = c.int8_queries && std::is_same_v<T, std::int8_t> ? int8_rounded_queries(q, c.head_dim, kernel_scale)
                        : c.bf16_queries && std::is_same_v<T, bf16>       ? bf16_rounded_queries(q, kernel_scale)
                                                                          : q;
  auto vis = [&](std::int32_t qp, std::int32_t kp) { return mask.visible(qp, kp); };
  for (std::size_t i = 0; i < n_seqs; ++i) {
    const std::span<const float> qi(q.data() + i * row, row), qs(q_scored.data() + i * row, row);
    const std::int32_t pos[1] = {llmkit::test::reference_last_position(cache, ids[i])};
    const auto ref = llmkit::test::reference_attention(cache, ids[i], 0, qs, pos, n_heads, scale, c.softcap, vis, sinks);
    const auto ref0 = llmkit::test::reference_attention(exact, ids[i], 0, qi, pos, n_heads, scale, c.softcap, vis, sinks);
    e.add(e.out.data() + i * row, ref, ref0);
  }
  return e;
}

/// An int8-cache case of the given shape with random lengths (a long one,
/// a short one, 16 and 33), chunks (long ones or short ones: blocks that
/// span chunks), split and soft-capping.
decode_case random_int8_case(std::size_t head_dim, std::size_t group, std::mt19937& rng) {
  decode_case c;
  c.head_dim = head_dim;
  c.group = group;
  c.n_kv_heads = 1 + rng() % 2;
  c.n_cached = {1 + rng() % 700, 1 + rng() % 40, 16, 33};
  c.max_chunk = rng() % 2 ? 1000 : 1 + rng() % 40;
  c.split = rng() % 2 ? 64 : 0;
  c.softcap = rng() % 2 ? 3.0f : 0.0f;
  return c;
}

constexpr double f32_tolerance = llmkit::test::attention_f32_tolerance;
constexpr double int8_tolerance = llmkit::test::attention_int8_decode_tolerance;
/// bf16_probabilities against the oracle of the stored values: each
/// probability is off by at most 2^-9 of itself, so with |v| <= 1 the output
/// by at most 2^-9, plus f32's error (observed up to 1.3e-3).
constexpr double bf16_p_tolerance = 1.0 / 512 + f32_tolerance;
/// int8_probabilities against the oracle of the stored values: each
/// probability (times its row's scale) is off by at most 1/510 of its
/// block's largest, so with |v| <= 1 the output by at most (the sum over
/// blocks of rows x the block's largest probability) / (510 x the sum of
/// the probabilities). The tests' scores (|s| <~ 1) keep each block's
/// largest probability within 2x of its mean, hence below 2/510 (observed
/// up to 1.97e-3); plus int8's own error.
constexpr double int8_p_tolerance = 2.0 / 510 + int8_tolerance;

}  // namespace

TEST_CASE("decode: batches of different lengths across block boundaries (1..4097)") {
  decode_case c;
  c.n_cached = {1, 2, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 4095, 4097};
  c.max_chunk = 70;
  for (const std::size_t split : {0u, 16u, 100u, 1024u}) {
    INFO("kv_split_tokens = " << split);
    c.split = split;
    const auto e = run_case<float>(c, causal_mask{}, 1);
    REQUIRE(e.finite);
    REQUIRE(e.stored < f32_tolerance);
  }
  c.split = 48;
  const auto s = run_case<float, simd::scalar>(c, causal_mask{}, 2);
  REQUIRE(s.stored < f32_tolerance);
}

TEST_CASE("decode: every head_dim and GQA ratio 1..8") {
  std::mt19937 rng(3);
  for (std::size_t head_dim : attention::supported_head_dims)
    for (std::size_t group = 1; group <= 8; ++group) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      decode_case c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 1 + rng() % 3;
      c.n_cached = {1 + rng() % 300, 1 + rng() % 40};
      c.max_chunk = 1 + rng() % 64;
      c.split = rng() % 2 ? 32 : 0;
      const auto e = run_case<float>(c, causal_mask{}, static_cast<std::uint32_t>(rng()));
      REQUIRE(e.finite);
      REQUIRE(e.stored < f32_tolerance);
    }
}

TEST_CASE("decode: masks (sliding window over a ring, prefix-LM, custom) and soft-capping") {
  decode_case c;
  c.n_cached = {300, 64, 65, 7};
  c.rotate = 3;
  c.split = 64;
  c.max_chunk = 30;
  auto every_third = [](position q, position k) { return k <= q && k % 3 == 0; };
  for (const auto& e : {run_case<float>(c, sliding_window_mask(50, 4), 4), run_case<float>(c, sliding_window_mask(1), 5),
                        run_case<float>(c, prefix_lm_mask(20), 6), run_case<float>(c, custom_mask{every_third}, 7),
                        run_case<float>(c, no_mask{}, 8)}) {
    REQUIRE(e.finite);
    REQUIRE(e.stored < f32_tolerance);
  }
  c.softcap = 4.0f;
  c.scale = 0.4f;
  c.head_dim = 128;
  const auto e = run_case<float>(c, causal_mask{}, 9);
  REQUIRE(e.stored < f32_tolerance);
}

TEST_CASE("decode: a query that sees nothing gives zeros, also across splits") {
  decode_case c;
  c.n_cached = {500, 3};
  c.split = 64;
  auto nothing = [](position, position) { return false; };
  const auto e = run_case<float>(c, custom_mask{nothing}, 10);
  REQUIRE(e.finite);
  REQUIRE(std::all_of(e.out.begin(), e.out.end(), [](float x) { return x == 0.0f; }));
  // Only the first split sees keys: the others merge as empty.
  auto first_only = [](position, position k) { return k < 10; };
  const auto f = run_case<float>(c, custom_mask{first_only}, 11);
  REQUIRE(f.finite);
  REQUIRE(f.stored < f32_tolerance);
}

TEST_CASE("decode: f16, bf16 and int8 storage") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 3; ++trial) {
    decode_case c;
    c.head_dim = trial == 1 && attention::supports_head_dim(96) ? 96 : 128;
    c.n_cached = {1 + rng() % 2000, 1 + rng() % 100, 17};
    c.max_chunk = 1 + rng() % 100;
    c.split = trial == 2 ? 128 : 0;
    const auto seed = static_cast<std::uint32_t>(rng());
    const auto h = run_case<f16>(c, causal_mask{}, seed);
    const auto b = run_case<bf16>(c, causal_mask{}, seed);
    const auto i8 = run_case<std::int8_t>(c, causal_mask{}, seed);
    const auto hs = run_case<f16, simd::scalar>(c, causal_mask{}, seed);
    for (const auto* e : {&h, &b, &i8, &hs}) {
      REQUIRE(e->finite);
      REQUIRE(e->stored < (e == &i8 ? int8_tolerance : f32_tolerance));
    }
    REQUIRE(h.original < 1e-3);
    REQUIRE(b.original < 8e-3);
    REQUIRE(i8.original < 1.5e-2);
    REQUIRE(b.original > h.original);
  }
}

#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
// The AVX2 kernels (8 lanes, 16 registers: no held registers, xsimd's
// haddp, the F16C and widening conversions) on this machine, whatever its
// default arch: the machines engine authors most often run on.
TEST_CASE("decode: the AVX2 kernels on every storage type, head_dim and GQA ratio") {
  using avx2 = xsimd::fma3<xsimd::avx2>;
  if (!llmkit::test::avx2_fma_available()) return;
  std::mt19937 rng(41);
  for (std::size_t head_dim : llmkit::test::compiled_head_dims({64, 80, 96, 128, 256}))
    for (std::size_t group : {1u, 2u, 3u, 4u, 8u}) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      decode_case c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 1 + rng() % 2;
      c.n_cached = {1 + rng() % 300, 1 + rng() % 40, 17};
      c.max_chunk = 1 + rng() % 64;
      c.split = rng() % 2 ? 32 : 0;
      c.softcap = rng() % 4 == 0 ? 3.0f : 0.0f;
      const auto seed = static_cast<std::uint32_t>(rng());
      llmkit::test::require_every_storage_type(
          [&](auto t) { return run_case<decltype(t), avx2>(c, causal_mask{}, seed); }, f32_tolerance,
          int8_tolerance);  // int8 with VNNI: P.V in integers on int16 probabilities
    }
}
#endif

/// The largest errors against the unrounded inputs, with and without a
/// rounding option.
struct rounding_errors {
  double rounded = 0.0, exact = 0.0;
  double stored = 0.0;  ///< largest error against the oracle of the stored values, with the options
};

/// The check of rounding options (`options`, all set or all clear:
/// int8_queries, bf16_queries, bf16_probabilities) for storage type T,
/// head_dim 64-256, GQA 1-8, random lengths and chunks, a sliding window:
/// with the options, the SIMD, AVX2 and scalar archs are within `tolerance`
/// of the oracle given the rounded queries (`stored`) and within
/// `original_bound` of the queries as given and the keys and values before
/// storage (`original`: what a caller sees); on each arch the options move
/// the result by more than `min_moved` (so no path ignores them); the
/// storage types Others ignore them bit for bit.
template <class T, class... Others>
rounding_errors check_rounding(std::initializer_list<bool decode_case::*> options, std::uint32_t seed,
                               double tolerance, double min_moved, double original_bound) {
  std::mt19937 rng(seed);
  rounding_errors worst;
  auto moved = [](const errors& a, const errors& b) {
    double m = 0.0;
    for (std::size_t x = 0; x < a.out.size(); ++x) m = std::max(m, std::fabs(static_cast<double>(a.out[x]) - b.out[x]));
    return m;
  };
  for (std::size_t head_dim : llmkit::test::compiled_head_dims({64, 80, 96, 128, 256}))
    for (std::size_t group : {1u, 2u, 3u, 4u, 8u}) {
      INFO("head_dim = " << head_dim << ", group = " << group);
      decode_case c = random_int8_case(head_dim, group, rng);
      const auto case_seed = static_cast<std::uint32_t>(rng());
      const sliding_window_mask window(300, 2);
      // The AVX2 kernels too where the CPU has them (an AVX-512 build runs
      // both; with VNNI, int8 takes accumulate_int<std::int16_t>'s AVX2 overload).
      auto avx2_run = [&](const decode_case& x) {
#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
        if (xsimd::available_architectures().fma3_avx2 != 0)
          return run_case<T, xsimd::fma3<xsimd::avx2>>(x, window, case_seed);
#endif
        return run_case<T>(x, window, case_seed);
      };
      for (auto option : options) c.*option = true;
      const auto fast = run_case<T>(c, window, case_seed);
      const auto scalar = run_case<T, simd::scalar>(c, window, case_seed);
      const auto avx2 = avx2_run(c);
      const std::vector<std::vector<float>> others_on{run_case<Others>(c, window, case_seed).out...};
      for (auto option : options) c.*option = false;
      const auto exact = run_case<T>(c, window, case_seed);
      const auto scalar_exact = run_case<T, simd::scalar>(c, window, case_seed);
      const auto avx2_exact = avx2_run(c);
      const std::vector<std::vector<float>> others_off{run_case<Others>(c, window, case_seed).out...};
      for (const auto* e : {&fast, &scalar, &avx2}) {
        REQUIRE(e->finite);
        REQUIRE(e->stored < tolerance);
        REQUIRE(e->original < original_bound);
        worst.rounded = std::max(worst.rounded, e->original);
        worst.stored = std::max(worst.stored, e->stored);
      }
      REQUIRE(moved(fast, exact) > min_moved);
      REQUIRE(moved(scalar, scalar_exact) > min_moved);
      REQUIRE(moved(avx2, avx2_exact) > min_moved);
      REQUIRE(others_on == others_off);
      worst.exact = std::max(worst.exact, exact.original);
    }
  return worst;
}

TEST_CASE("decode: int8_queries scores the queries rounded to int8, on every path") {
  // Paths: the VNNI kernel (scores_int<int8_t>: head_dim 64 / 128 / 256),
  // the int16-query kernel given int8 levels (96), the f32 kernels (80, and
  // the scalar arch everywhere).
  const auto e = check_rounding<std::int8_t, f16, bf16>({&decode_case::int8_queries}, 41, int8_tolerance,
                                                         int8_tolerance, 1e-2);
  WARN("int8_queries: largest error against the unrounded inputs " << e.rounded << " (int16 queries: " << e.exact
                                                                      << ")");
}

TEST_CASE("decode: bf16_queries scores the queries rounded to bf16, on every path") {
  // Paths: the VDPBF16PS kernel (scores_bf16: AVX512_BF16, head_dim 64 / 96
  // / 128 / 256), the f32 kernel given the rounded values (80, CPUs without
  // AVX512_BF16, the scalar arch everywhere).
  const auto e = check_rounding<bf16, f16, std::int8_t>({&decode_case::bf16_queries}, 43, f32_tolerance,
                                                         f32_tolerance, 8e-3);
  WARN("bf16_queries: largest error against the unrounded inputs " << e.rounded << " (f32 queries: " << e.exact
                                                                      << ")");
}

TEST_CASE("decode: bf16_probabilities multiplies the values by bf16 probabilities, on every path") {
  // Paths: the VDPBF16PS kernel (accumulate_bf16: AVX512_BF16, head_dim 64
  // / 128 / 256), the f32 kernel given the rounded values (80, 96, CPUs
  // without AVX512_BF16, the scalar arch everywhere). No oracle rounds the
  // probabilities as a block sees them, so the stored error is bounded by
  // bf16_p_tolerance; each path must still move by more than f32's.
  const auto p = check_rounding<bf16, f16, std::int8_t>({&decode_case::bf16_probabilities}, 47, bf16_p_tolerance,
                                                         f32_tolerance, 8e-3);
  const auto both = check_rounding<bf16, f16, std::int8_t>(
      {&decode_case::bf16_queries, &decode_case::bf16_probabilities}, 53, bf16_p_tolerance, f32_tolerance, 8e-3);
  WARN("bf16_probabilities: largest error against the stored values " << p.stored << " (with bf16_queries "
                                                                       << both.stored
                                                                       << "); against the unrounded inputs "
                                                                       << p.rounded << " (with bf16_queries "
                                                                       << both.rounded << ", neither " << p.exact
                                                                       << ")");
}

TEST_CASE("decode: int8_probabilities multiplies the values by 8-bit probabilities, on every path") {
  // Paths: the VPDPBUSD kernel (accumulate_int<std::uint8_t>: AVX-512 VNNI, head_dim 64 /
  // 128 / 256; its AVX2 overload on the AVX2 arch with VNNI, every head_dim
  // here, the probabilities by row quads at GQA 3 to 8), the f32 kernel given
  // the rounded values (80, 96 on AVX-512, AVX2 without VNNI, the scalar
  // arch everywhere). No oracle rounds the
  // probabilities as a block sees them, so the stored error is bounded by
  // int8_p_tolerance; each path must still move by more than int8's.
  const auto p = check_rounding<std::int8_t, f16, bf16>({&decode_case::int8_probabilities}, 59, int8_p_tolerance,
                                                         int8_tolerance, 1e-2);
  const auto both = check_rounding<std::int8_t, f16, bf16>(
      {&decode_case::int8_queries, &decode_case::int8_probabilities}, 61, int8_p_tolerance, int8_tolerance, 1e-2);
  WARN("int8_probabilities: largest error against the stored values " << p.stored << " (with int8_queries "
                                                                       << both.stored
                                                                       << "); against the unrounded inputs "
                                                                       << p.rounded << " (with int8_queries "
                                                                       << both.rounded << ", neither " << p.exact
                                                                       << ")");
}

TEST_CASE("decode: int8 keys on AMX give the VNNI kernel's results bit for bit") {
  if (!attention::detail::amx_tiles_usable()) {
    WARN("AMX tiles are not available to this build or process: only the VNNI kernel ran");
  }
  // With int8_queries AMX takes the int8 levels as int16 queries; the VNNI
  // kernel dots int8 bytes (scores_int<int8_t>): the same exact int32 sums.
  std::mt19937 rng(17);
  for (std::size_t head_dim : llmkit::test::compiled_head_dims({64, 96, 128, 256}))
    for (std::size_t group : {1u, 2u, 3u, 4u, 8u}) {
      decode_case c = random_int8_case(head_dim, group, rng);
      const auto seed = static_cast<std::uint32_t>(rng());
      const sliding_window_mask window(300, 2);
      for (const bool int8_queries : {false, true}) {
        INFO("head_dim = " << head_dim << ", group = " << group << ", int8_queries " << int8_queries);
        c.int8_queries = int8_queries;
        c.tuning.use_amx = true;
        const auto amx = run_case<std::int8_t>(c, window, seed);
        c.tuning.use_amx = false;
        const auto vnni = run_case<std::int8_t>(c, window, seed);
        REQUIRE(amx.finite);
        REQUIRE(amx.stored < int8_tolerance);
        REQUIRE(amx.out == vnni.out);
      }
    }
}

TEST_CASE("decode: thread pool and split-KV agree with serial") {
  decode_case c;
  c.n_kv_heads = 1;
  c.group = 8;
  c.n_cached = {3000, 10};
  thread_pool pool(2);
  const auto serial = run_case<float>(c, causal_mask{}, 13);
  c.split = 0;  // automatic: splits on 2 threads with one KV head
  const auto pooled = run_case<float>(c, causal_mask{}, 13, pool);
  REQUIRE(pooled.stored < f32_tolerance);
  double diff = 0.0;
  for (std::size_t i = 0; i < serial.out.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::fabs(serial.out[i] - pooled.out[i])));
  REQUIRE(diff < 1e-6);
  // Tasks are independent of the executor: same split, same bits.
  c.split = 256;
  const auto a = run_case<float>(c, causal_mask{}, 14);
  const auto b = run_case<float>(c, causal_mask{}, 14, pool);
  REQUIRE(a.out == b.out);
}

TEST_CASE("decode: a caller workspace is reused without growing") {
  std::mt19937 rng(15);
  chunked_test_cache<float> cache({1, 2, 64});
  const auto k = uniform_values(1000 * 2 * 64, rng);
  cache.add_sequence(0, 1000, k, k, {500, 500});
  const std::vector<kv::seq_id> ids{0};
  const auto q = uniform_values(4 * 64, rng);
  std::vector<float> out(q.size());
  decode_workspace ws;
  decode_params p{.q = q, .out = out, .seq_ids = ids, .n_heads = 4, .kv_split_tokens = 100, .workspace = &ws};
  decode(p, cache);
  const auto* data = ws.partial.data();
  const auto size = ws.partial.size();
  REQUIRE(size >= 10 * 4 * 66);
  decode(p, cache);
  REQUIRE(ws.partial.data() == data);
  REQUIRE(ws.partial.size() == size);
}

TEST_CASE("decode: bad input raises llmkit::error naming the argument") {
  std::mt19937 rng(16);
  chunked_test_cache<float> cache({2, 2, 64});
  const auto k = uniform_values(2 * 5 * 2 * 64, rng);
  cache.add_sequence(9, 5, k, k, {5});
  cache.add_sequence(10, 0, {}, {}, {});
  const std::vector<kv::seq_id> ids{9};
  const auto q = uniform_values(6 * 64, rng);
  std::vector<float> out(q.size());
  const decode_params p{.q = q, .out = out, .seq_ids = ids, .layer = 1, .n_heads = 6};
  REQUIRE_NOTHROW(decode(p, cache));
  auto bad = p;
  bad.n_heads = 5;
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: n_heads = 5 is not a positive multiple of the cache's n_kv_heads = 2");
  bad = p;
  bad.n_heads = 0;
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: n_heads = 0 is not a positive multiple of the cache's n_kv_heads = 2");
  bad = p;
  bad.q = std::span<const float>(q).first(64);
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: q.size() = 64 must be n_seqs * n_heads * head_dim = 1 * 6 * 64 = 384");
  bad = p;
  bad.out = {};
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: out.size() = 0 must be n_seqs * n_heads * head_dim = 384");
  bad = p;
  bad.layer = 7;
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: layer 7 is out of range (n_layers = 2)");
  const std::vector<kv::seq_id> unknown{77};
  bad = p;
  bad.seq_ids = unknown;
  REQUIRE_THROWS_WITH(decode(bad, cache), "chunked_test_cache: unknown sequence 77");
  const std::vector<kv::seq_id> empty_seq{10};
  bad = p;
  bad.seq_ids = empty_seq;
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: sequence 10 (batch index 0) holds no tokens; store the query "
                                          "token's K/V first");
  bad = p;
  bad.softcap = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(decode(bad, cache), "decode: softcap must be finite and >= 0, got inf");
  // An empty batch is fine.
  REQUIRE_NOTHROW(decode({.q = {}, .out = {}, .seq_ids = {}, .n_heads = 2}, cache));
}

TEMPLATE_TEST_CASE("decode: a query holding NaN or inf gives zeros for its head only, every storage type", "", float, f16,
                   bf16, std::int8_t) {
  // Its scores are NaN, and the softmax gives such a head zeros, as it does
  // a query that sees nothing. int8 keys: the query is rounded to int16 with
  // a scale from its largest |value|; a NaN must not reach the float ->
  // int16 conversion (undefined behaviour; it gave finite garbage).
  std::mt19937 rng(31);
  const kv::kv_shape shape{1, 1, 128};
  const std::size_t n = 100, n_heads = 4, row = n_heads * shape.head_dim;
  chunked_test_cache<TestType> cache(shape);
  const auto k = uniform_values(n * shape.head_dim, rng);
  const auto v = uniform_values(k.size(), rng);
  const kv::seq_id id = 1;
  cache.add_sequence(id, n, k, v, llmkit::test::random_chunks(n, 40, rng), 0, 0);
  const auto q = uniform_values(row, rng);
  for (const bool rounded : {false, true}) {
    const decode_params base{.q = q, .out = {}, .seq_ids = {&id, 1}, .layer = 0, .n_heads = n_heads,
                             .int8_queries = rounded, .bf16_queries = rounded, .bf16_probabilities = rounded,
                             .int8_probabilities = rounded};
    std::vector<float> clean(row);
    auto with_clean = base;
    with_clean.out = clean;
    decode(with_clean, cache, causal_mask{});
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      INFO("bad value " << bad << ", int8_queries / bf16_queries / bf16_probabilities / int8_probabilities "
                        << rounded);
      auto qb = q;
      qb[shape.head_dim + 5] = bad;  // head 1
      std::vector<float> out(row);
      auto with_bad = base;
      with_bad.q = qb;
      with_bad.out = out;
      decode(with_bad, cache, causal_mask{});
      for (std::size_t g = 0; g < n_heads; ++g) {
        const auto first = out.begin() + static_cast<std::ptrdiff_t>(g * shape.head_dim);
        const auto last = first + static_cast<std::ptrdiff_t>(shape.head_dim);
        if (g == 1)
          REQUIRE(std::all_of(first, last, [](float x) { return x == 0.0f; }));
        else
          REQUIRE(std::equal(first, last, clean.begin() + static_cast<std::ptrdiff_t>(g * shape.head_dim)));
      }
    }
  }
}

TEST_CASE("decode: attention sinks on every storage type, across splits and masks") {
  // Sinks around -3 (a small share), 1 (about a key's), 12 (most of the
  // weight): the oracle adds exp(sink) to each head's denominator.
  std::mt19937 rng(77);
  for (const float sink : {-3.0f, 1.0f, 12.0f}) {
    for (const std::size_t split : {0u, 64u}) {
      INFO("sink " << sink << " split " << split);
      decode_case c;
      c.n_cached = {1 + rng() % 500, 1 + rng() % 40, 17};
      c.split = split;
      c.sink_mean = sink;
      const auto seed = static_cast<std::uint32_t>(rng());
      const auto f = llmkit::test::require_sinks_everywhere(
          [&](auto type, auto arch, const auto& mask) { return run_case<decltype(type), decltype(arch)>(c, mask, seed); },
          20, f32_tolerance, int8_tolerance);
      // A sink holding most of the weight shrinks every output.
      if (sink == 12.0f)
        REQUIRE(std::all_of(f.out.begin(), f.out.end(), [](float x) { return std::fabs(x) < 0.01f; }));
    }
  }
  // A query that sees no key gives zeros with a sink too.
  decode_case c;
  c.n_cached = {300, 3};
  c.split = 64;
  c.sink_mean = 0.0f;
  const auto e = run_case<float>(c, custom_mask{[](position, position) { return false; }}, 78);
  REQUIRE(std::all_of(e.out.begin(), e.out.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("decode: bad sinks raise llmkit::error naming the argument") {
  std::mt19937 rng(79);
  chunked_test_cache<float> cache({1, 2, 64});
  const auto k = uniform_values(5 * 2 * 64, rng);
  cache.add_sequence(9, 5, k, k, {5});
  const std::vector<kv::seq_id> ids{9};
  const auto q = uniform_values(4 * 64, rng);
  std::vector<float> out(q.size());
  const std::vector<float> three(3, 0.0f), nan_sink{0.0f, 0.0f, std::nanf(""), 0.0f};
  REQUIRE_THROWS_WITH(decode({.q = q, .out = out, .seq_ids = ids, .n_heads = 4, .sinks = three}, cache),
                      "decode: sinks.size() = 3 must be 0 or n_heads = 4");
  REQUIRE_THROWS_WITH(decode({.q = q, .out = out, .seq_ids = ids, .n_heads = 4, .sinks = nan_sink}, cache),
                      "decode: sinks[2] = nan must be finite");
}
