// SPDX-License-Identifier: MIT
// The simd kernel tests, written once and instantiated per arch: a test
// translation unit defines
//   LLMKIT_TEST_ARCH            the arch tag type (e.g. xsimd::avx512bw)
//   LLMKIT_TEST_ARCH_NAME       a string literal naming it in test names
//   LLMKIT_TEST_ARCH_AVAILABLE  a run-time bool: can this CPU run it?
// then includes this file. Everything is in an unnamed namespace, so TUs
// built with different -march flags share no inline code.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/simd/simd.hpp"
#include "reference/simd_reference.hpp"

#ifndef LLMKIT_TEST_ARCH
#error "define LLMKIT_TEST_ARCH, LLMKIT_TEST_ARCH_NAME and LLMKIT_TEST_ARCH_AVAILABLE before including simd_cases.hpp"
#endif

namespace {

namespace simd = llmkit::simd;
namespace ref = llmkit::reference;
using arch = LLMKIT_TEST_ARCH;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();
constexpr double f32_eps = 0x1p-24;  // unit roundoff of f32

/// The lengths every kernel is tried with: empty, one, around a 16-lane
/// register, odd large sizes.
const std::size_t lengths[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 64, 1023, 4097};

/// A vector of n values at offset `misalign` floats from a 64-byte boundary, so
/// kernels see unaligned pointers.
struct test_vector {
  llmkit::aligned_vector<float> storage;
  std::span<float> view;
  test_vector(std::size_t n, std::size_t misalign) : storage(n + misalign + 1) {
    view = std::span<float>(storage.data() + misalign, n);
  }
};

test_vector random_vector(std::size_t n, std::size_t misalign, std::mt19937& rng, float lo = -4.0f, float hi = 4.0f) {
  test_vector v(n, misalign);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& x : v.view) x = dist(rng);
  return v;
}

bool arch_available() {
  if (!(LLMKIT_TEST_ARCH_AVAILABLE)) {
    WARN("arch " LLMKIT_TEST_ARCH_NAME " not supported by this CPU: skipped");
    return false;
  }
  return true;
}

#define LLMKIT_SIMD_TEST(title) TEST_CASE(title " [" LLMKIT_TEST_ARCH_NAME "]", "[simd][" LLMKIT_TEST_ARCH_NAME "]")

LLMKIT_SIMD_TEST("dot and sum match the double oracle within the f32 error bound") {
  if (!arch_available()) return;
  std::mt19937 rng(1);
  for (std::size_t n : lengths) {
    for (std::size_t misalign : {0u, 1u, 3u}) {
      const auto a = random_vector(n, misalign, rng), b = random_vector(n, (misalign + 1) % 4, rng);
      std::span<const float> av(a.view), bv(b.view);
      INFO("n = " << n << ", misalign = " << misalign);
      // Recursive/blocked summation: |error| <= (n + 1) u sum|terms| (with
      // FMA or without); the double oracle's own error is negligible.
      const double bound = (static_cast<double>(n) + 2.0) * f32_eps * ref::dot_abs(av, bv);
      CHECK(std::fabs(simd::dot<arch>(av, bv) - ref::dot(av, bv)) <= bound);
      const double sum_bound = (static_cast<double>(n) + 2.0) * f32_eps * ref::sum_abs(av);
      CHECK(std::fabs(simd::sum<arch>(av) - ref::sum(av)) <= sum_bound);
    }
  }
  const std::vector<float> a{1.0f, 2.0f, 3.0f}, b{4.0f, 5.0f};
  REQUIRE_THROWS_WITH(simd::dot<arch>(a, b), Catch::Contains("a.size() = 3") && Catch::Contains("b.size() = 2"));
  // Exactly representable sums are exact whatever the order.
  std::vector<float> ones(4097, 1.0f);
  CHECK(simd::sum<arch>(ones) == 4097.0f);
  CHECK(simd::dot<arch>(ones, ones) == 4097.0f);
  ones[4000] = nan_value;
  CHECK(std::isnan(simd::sum<arch>(ones)));
}

/// dot and sum written out with four explicit accumulators, the order
/// simd::detail::accumulate_batches and combine_pairwise must keep.
template <class A>
float four_accumulator_dot(std::span<const float> a, std::span<const float> b) {
  using batch = xsimd::batch<float, A>;
  constexpr std::size_t L = batch::size;
  const std::size_t n = a.size();
  batch acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
  std::size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    acc0 = xsimd::fma(batch::load_unaligned(a.data() + i), batch::load_unaligned(b.data() + i), acc0);
    acc1 = xsimd::fma(batch::load_unaligned(a.data() + i + L), batch::load_unaligned(b.data() + i + L), acc1);
    acc2 = xsimd::fma(batch::load_unaligned(a.data() + i + 2 * L), batch::load_unaligned(b.data() + i + 2 * L), acc2);
    acc3 = xsimd::fma(batch::load_unaligned(a.data() + i + 3 * L), batch::load_unaligned(b.data() + i + 3 * L), acc3);
  }
  for (; i + L <= n; i += L)
    acc0 = xsimd::fma(batch::load_unaligned(a.data() + i), batch::load_unaligned(b.data() + i), acc0);
  float acc = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
  for (; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <class A>
float four_accumulator_sum(std::span<const float> x) {
  using batch = xsimd::batch<float, A>;
  constexpr std::size_t L = batch::size;
  const std::size_t n = x.size();
  batch acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
  std::size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    acc0 += batch::load_unaligned(x.data() + i);
    acc1 += batch::load_unaligned(x.data() + i + L);
    acc2 += batch::load_unaligned(x.data() + i + 2 * L);
    acc3 += batch::load_unaligned(x.data() + i + 3 * L);
  }
  for (; i + L <= n; i += L) acc0 += batch::load_unaligned(x.data() + i);
  float acc = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
  for (; i < n; ++i) acc += x[i];
  return acc;
}

template <class A>
void check_four_accumulator_order() {
  if constexpr (!simd::is_scalar_v<A>) {
    std::mt19937 rng(11);
    for (std::size_t n : lengths) {
      const auto a = random_vector(n, 1, rng), b = random_vector(n, 2, rng);
      std::span<const float> av(a.view), bv(b.view);
      INFO("n = " << n);
      CHECK(std::bit_cast<std::uint32_t>(simd::dot<A>(av, bv)) ==
            std::bit_cast<std::uint32_t>(four_accumulator_dot<A>(av, bv)));
      CHECK(std::bit_cast<std::uint32_t>(simd::sum<A>(av)) == std::bit_cast<std::uint32_t>(four_accumulator_sum<A>(av)));
    }
  }
}

LLMKIT_SIMD_TEST("dot and sum round exactly as four explicit accumulators") {
  if (!arch_available()) return;
  check_four_accumulator_order<arch>();
}

LLMKIT_SIMD_TEST("max and argmax: first index on ties, NaN as NumPy, empty input") {
  if (!arch_available()) return;
  std::mt19937 rng(2);
  for (std::size_t n : lengths) {
    if (n == 0) continue;
    for (std::size_t misalign : {0u, 1u}) {
      auto v = random_vector(n, misalign, rng);
      std::span<const float> x(v.view);
      INFO("n = " << n << ", misalign = " << misalign);
      CHECK(simd::max<arch>(x) == ref::max(x));
      CHECK(simd::argmax<arch>(x) == ref::argmax(x));
      // Ties: plant the maximum at three places; the first wins.
      std::uniform_int_distribution<std::size_t> pick(0, n - 1);
      const std::size_t i = pick(rng), j = pick(rng), k = pick(rng);
      v.view[i] = v.view[j] = v.view[k] = 100.0f;
      CHECK(simd::argmax<arch>(x) == std::min({i, j, k}));
      CHECK(simd::max<arch>(x) == 100.0f);
      // A NaN after the maximum still wins (NumPy semantics).
      const std::size_t at = pick(rng);
      v.view[at] = nan_value;
      CHECK(std::isnan(simd::max<arch>(x)));
      CHECK(simd::argmax<arch>(x) == at);
      // -inf everywhere: index 0.
      for (float& e : v.view) e = -inf;
      CHECK(simd::argmax<arch>(x) == 0);
      CHECK(simd::max<arch>(x) == -inf);
    }
  }
  CHECK(simd::max<arch>(std::span<const float>()) == -inf);
  REQUIRE_THROWS_WITH(simd::argmax<arch>(std::span<const float>()), Catch::Contains("argmax") && Catch::Contains("empty"));
}

LLMKIT_SIMD_TEST("axpy and scale match the double oracle") {
  if (!arch_available()) return;
  std::mt19937 rng(3);
  for (std::size_t n : lengths) {
    const auto x = random_vector(n, 1, rng);
    auto y = random_vector(n, 2, rng);
    const std::vector<float> y0(y.view.begin(), y.view.end());
    const float a = -1.75f;
    simd::axpy<arch>(a, x.view, y.view);
    for (std::size_t i = 0; i < n; ++i) {
      const double exact = y0[i] + static_cast<double>(a) * x.view[i];
      // One or two roundings of terms bounded by |y0| + |a x|.
      REQUIRE(std::fabs(y.view[i] - exact) <= 2 * f32_eps * (std::fabs(y0[i]) + std::fabs(a * x.view[i])));
    }
    simd::scale<arch>(y.view, 0.5f);  // exact in binary
    for (std::size_t i = 0; i < n; ++i) REQUIRE(y.view[i] * 2.0f == (n ? y.view[i] * 2.0f : 0.0f));
  }
  std::vector<float> x(5), y(6);
  REQUIRE_THROWS_WITH(simd::axpy<arch>(1.0f, x, y), Catch::Contains("x.size() = 5") && Catch::Contains("y.size() = 6"));
  std::vector<float> s{1.0f, -2.0f, 3.0f, 0.25f, 8.0f};
  simd::scale<arch>(s, 4.0f);
  CHECK(s == std::vector<float>{4.0f, -8.0f, 12.0f, 1.0f, 32.0f});
}

LLMKIT_SIMD_TEST("exp: relative error <= 2e-7 on [-87, 88], exact 0 below, inf above, NaN kept") {
  if (!arch_available()) return;
  std::mt19937 rng(4);
  // A dense grid plus random points over the whole accurate range, fed in
  // odd-sized unaligned chunks so tails are covered too.
  std::vector<float> points;
  for (int i = -870000; i <= 880000; i += 7) points.push_back(static_cast<float>(i) * 1e-4f);
  std::uniform_real_distribution<float> dist(-87.0f, 88.0f);
  for (int i = 0; i < 200000; ++i) points.push_back(dist(rng));
  for (float v : {-87.0f, 88.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f * 0.693147182f, 0.693147182f})
    points.push_back(v);
  test_vector in(points.size(), 1), out(points.size(), 3);
  std::copy(points.begin(), points.end(), in.view.begin());
  double worst = 0.0;
  float worst_x = 0.0f;
  for (std::size_t start = 0; start < points.size();) {
    const std::size_t len = std::min<std::size_t>(points.size() - start, 1 + (start % 37));
    simd::exp<arch>(in.view.subspan(start, len), out.view.subspan(start, len));
    start += len;
  }
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double exact = std::exp(static_cast<double>(in.view[i]));
    const double rel = std::fabs(out.view[i] - exact) / exact;
    if (rel > worst) worst = rel, worst_x = in.view[i];
  }
  INFO("worst relative error " << worst << " at x = " << worst_x);
  CHECK(worst <= 2e-7);
  // Special values, also through the in-place form.
  std::vector<float> special{-inf, -1000.0f, -104.5f, 88.8f, 89.0f, 100.0f, inf, nan_value, -nan_value, 0.0f};
  simd::exp<arch>(special, special);
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::bit_cast<std::uint32_t>(special[i]) == 0u);  // exactly +0
  for (std::size_t i = 3; i < 7; ++i) CHECK(special[i] == inf);
  CHECK(std::isnan(special[7]));
  CHECK(std::isnan(special[8]));
  CHECK(special[9] == 1.0f);
  // Subnormal range: within one subnormal step of the truth.
  std::vector<float> tiny{-88.0f, -95.0f, -100.0f, -103.0f};
  std::vector<float> tiny_out(tiny.size());
  simd::exp<arch>(tiny, tiny_out);
  for (std::size_t i = 0; i < tiny.size(); ++i)
    CHECK(std::fabs(tiny_out[i] - std::exp(static_cast<double>(tiny[i]))) <=
          std::exp(static_cast<double>(tiny[i])) * 2e-7 + 0x1p-149);
  std::vector<float> three(3), two(2);
  REQUIRE_THROWS_WITH(simd::exp<arch>(three, two), Catch::Contains("in.size() = 3") && Catch::Contains("out.size() = 2"));
}

LLMKIT_SIMD_TEST("softmax and log_softmax match the double oracle, masked rows") {
  if (!arch_available()) return;
  std::mt19937 rng(5);
  for (std::size_t n : lengths) {
    for (float temperature : {1.0f, 0.7f, 2.5f}) {
      auto v = random_vector(n, 1, rng, -20.0f, 20.0f);
      // Mask about a quarter of the entries.
      for (std::size_t i = 0; i < n; ++i)
        if (rng() % 4 == 0) v.view[i] = -inf;
      const std::vector<float> x(v.view.begin(), v.view.end());
      INFO("n = " << n << ", temperature = " << temperature);
      const auto expected = ref::softmax(x, temperature);
      const auto expected_log = ref::log_softmax(x, temperature);
      simd::softmax<arch>(v.view, temperature);
      // exp error 2e-7 per term plus the sum's rounding (n u), relative.
      const double rel = 4e-7 + (static_cast<double>(n) + 2.0) * f32_eps;
      double total = 0.0;
      const float m = ref::max(x);
      for (std::size_t i = 0; i < n; ++i) {
        // Plus the rounding of the exponent argument (x - m) / T: u |x - m| / T twice.
        const double arg_error = x[i] == -inf ? 0.0 : 2 * f32_eps * std::fabs((x[i] - m) / temperature);
        INFO("i = " << i << ", got " << v.view[i] << ", expected " << expected[i]);
        REQUIRE(std::fabs(v.view[i] - expected[i]) <= (rel + arg_error) * expected[i] + 1e-37);
        total += v.view[i];
      }
      if (n > 0 && expected[0] == expected[0]) CHECK(std::fabs(total - (ref::max(x) == -inf ? 0.0 : 1.0)) <= rel * 2);
      std::copy(x.begin(), x.end(), v.view.begin());
      simd::log_softmax<arch>(v.view, temperature);
      for (std::size_t i = 0; i < n; ++i) {
        if (expected_log[i] == -std::numeric_limits<double>::infinity()) {
          REQUIRE(v.view[i] == -inf);
        } else {
          // Absolute error: roundings of (x - m) / T (~u |x - m| / T) and of log s.
          const double scale = std::fabs((x[i] - ref::max(x)) / temperature) + std::fabs(expected_log[i]) + 1.0;
          REQUIRE(std::fabs(v.view[i] - expected_log[i]) <= 4 * f32_eps * scale + rel);
        }
      }
    }
  }
  // Long rows take the chunked path: chunks at very different levels, one
  // chunk fully masked, a ragged last chunk.
  for (std::size_t n : {simd::softmax_chunk + 1, 3 * simd::softmax_chunk + 5}) {
    auto v = random_vector(n, 1, rng, -3.0f, 3.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t chunk = i / simd::softmax_chunk;
      if (chunk == 1 && n > 2 * simd::softmax_chunk) v.view[i] = -inf;
      if (chunk == 0) v.view[i] -= 30.0f;
      if (chunk == 2) v.view[i] += 10.0f;
    }
    const std::vector<float> x(v.view.begin(), v.view.end());
    const float m = ref::max(x);
    for (float temperature : {1.0f, 3.0f}) {
      INFO("chunked, n = " << n << ", temperature = " << temperature);
      std::copy(x.begin(), x.end(), v.view.begin());
      simd::softmax<arch>(v.view, temperature);
      const auto expected = ref::softmax(x, temperature);
      const double rel = 8e-7 + (static_cast<double>(n) + 2.0) * f32_eps;
      for (std::size_t i = 0; i < n; ++i) {
        const double arg_error = x[i] == -inf ? 0.0 : 4 * f32_eps * std::fabs((x[i] - m) / temperature);
        REQUIRE(std::fabs(v.view[i] - expected[i]) <= (rel + arg_error) * expected[i] + 1e-37);
      }
      std::copy(x.begin(), x.end(), v.view.begin());
      simd::log_softmax<arch>(v.view, temperature);
      const auto expected_log = ref::log_softmax(x, temperature);
      for (std::size_t i = 0; i < n; ++i) {
        if (x[i] == -inf) {
          REQUIRE(v.view[i] == -inf);
        } else {
          const double scale = std::fabs((x[i] - m) / temperature) + std::fabs(expected_log[i]) + 1.0;
          REQUIRE(std::fabs(v.view[i] - expected_log[i]) <= 4 * f32_eps * scale + rel);
        }
      }
    }
  }
  // A fully masked row gives zeros (softmax) and -inf (log_softmax), never NaN.
  for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{100}, 2 * simd::softmax_chunk + 3}) {
    std::vector<float> row(n, -inf);
    simd::softmax<arch>(row);
    for (float v : row) CHECK(std::bit_cast<std::uint32_t>(v) == 0u);
    std::fill(row.begin(), row.end(), -inf);
    simd::log_softmax<arch>(row);
    for (float v : row) CHECK(v == -inf);
  }
  // Large logits do not overflow.
  std::vector<float> big{1000.0f, 1000.0f, -1000.0f};
  simd::softmax<arch>(big);
  CHECK(big[0] == Approx(0.5f));
  CHECK(big[1] == Approx(0.5f));
  CHECK(big[2] == 0.0f);
  std::vector<float> row(4, 1.0f);
  REQUIRE_THROWS_WITH(simd::softmax<arch>(row, 0.0f), Catch::Contains("temperature") && Catch::Contains("got 0"));
  REQUIRE_THROWS_WITH(simd::log_softmax<arch>(row, -1.0f), Catch::Contains("temperature") && Catch::Contains("-1"));
  REQUIRE_THROWS_WITH(simd::softmax<arch>(row, nan_value), Catch::Contains("temperature"));
}

LLMKIT_SIMD_TEST("rmsnorm matches the double oracle, in place too") {
  if (!arch_available()) return;
  std::mt19937 rng(6);
  for (std::size_t n : lengths) {
    if (n == 0) continue;
    const auto x = random_vector(n, 1, rng);
    const auto w = random_vector(n, 2, rng, 0.5f, 1.5f);
    auto out = random_vector(n, 3, rng);
    const auto expected = ref::rmsnorm(x.view, w.view, 1e-5);
    simd::rmsnorm<arch>(x.view, w.view, out.view, 1e-5f);
    const double rel = (static_cast<double>(n) + 8.0) * f32_eps;
    for (std::size_t i = 0; i < n; ++i) REQUIRE(std::fabs(out.view[i] - expected[i]) <= rel * std::fabs(expected[i]) + 1e-30);
    auto inplace = x;
    inplace.view = std::span<float>(inplace.storage.data() + 1, n);
    simd::rmsnorm<arch>(inplace.view, w.view, inplace.view, 1e-5f);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(inplace.view[i] == out.view[i]);
  }
  std::vector<float> zero(9, 0.0f), w(9, 1.0f), out(9, 7.0f);
  simd::rmsnorm<arch>(zero, w, out, 1e-6f);  // eps keeps an all-zero row finite
  for (float v : out) CHECK(v == 0.0f);
  std::vector<float> w8(8), out8(8);
  REQUIRE_THROWS_WITH(simd::rmsnorm<arch>(zero, w8, out, 1e-6f), Catch::Contains("weight.size() = 8") && Catch::Contains("x.size() = 9"));
  REQUIRE_THROWS_WITH(simd::rmsnorm<arch>(zero, w, out8, 1e-6f), Catch::Contains("out.size() = 8"));
  REQUIRE_THROWS_WITH(simd::rmsnorm<arch>(zero, w, out, -1.0f), Catch::Contains("eps") && Catch::Contains("-1"));
}

LLMKIT_SIMD_TEST("RoPE in both layouts matches the double oracle, table == on the fly") {
  if (!arch_available()) return;
  std::mt19937 rng(7);
  struct shape { std::size_t head_dim, rotary_dim, n_heads; };
  for (const shape s : {shape{64, 0, 4}, shape{128, 0, 2}, shape{80, 0, 3}, shape{96, 32, 2}, shape{6, 0, 5},
                        shape{2, 0, 1}, shape{256, 64, 1}}) {
    for (auto layout : {simd::rope_layout::interleaved, simd::rope_layout::half_split}) {
      const simd::rope_config config{.theta = layout == simd::rope_layout::interleaved ? 10000.0f : 500000.0f,
                                     .layout = layout, .rotary_dim = s.rotary_dim,
                                     .freq_scale = s.head_dim == 80 ? 0.25f : 1.0f};
      const simd::rope_table table(config, s.head_dim, 300);
      const std::size_t rotary_dim = s.rotary_dim ? s.rotary_dim : s.head_dim;
      for (std::int32_t position : {0, 1, 7, 299}) {
        INFO("head_dim = " << s.head_dim << ", rotary_dim = " << rotary_dim << ", interleaved = "
                           << (layout == simd::rope_layout::interleaved) << ", position = " << position);
        const auto x = random_vector(s.n_heads * s.head_dim, 1, rng);
        const auto expected = ref::rope(x.view, s.head_dim, rotary_dim, layout == simd::rope_layout::interleaved,
                                        config.theta, config.freq_scale, position);
        auto on_the_fly = x, from_table = x;
        on_the_fly.view = std::span<float>(on_the_fly.storage.data() + 1, x.view.size());
        from_table.view = std::span<float>(from_table.storage.data() + 1, x.view.size());
        simd::apply_rope<arch>(on_the_fly.view, s.head_dim, position, config);
        simd::apply_rope<arch>(from_table.view, s.head_dim, position, table);
        for (std::size_t i = 0; i < x.view.size(); ++i) {
          REQUIRE(on_the_fly.view[i] == from_table.view[i]);
          // cos/sin rounded to f32 (u each), two products and a sum.
          REQUIRE(std::fabs(on_the_fly.view[i] - expected[i]) <= 8 * f32_eps * 6.0);
        }
      }
    }
  }
  const simd::rope_config config{};
  std::vector<float> x(64);
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 48, 0, config), Catch::Contains("x.size() = 64") && Catch::Contains("head_dim = 48"));
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 64, -1, config), Catch::Contains("position") && Catch::Contains("-1"));
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 64, 0, simd::rope_config{.rotary_dim = 65}), Catch::Contains("rotary_dim = 65"));
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 64, 0, simd::rope_config{.rotary_dim = 7}), Catch::Contains("even") && Catch::Contains("7"));
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 64, 0, simd::rope_config{.theta = 0.0f}), Catch::Contains("theta"));
  const simd::rope_table table(config, 64, 10);
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 64, 10, table), Catch::Contains("position = 10") && Catch::Contains("max_positions = 10"));
  REQUIRE_THROWS_WITH(simd::apply_rope<arch>(x, 32, 0, table), Catch::Contains("head_dim = 32") && Catch::Contains("64"));
}

LLMKIT_SIMD_TEST("f16 and bf16 conversions are bit-identical to the scalar ones") {
  if (!arch_available()) return;
  // 16-bit -> f32: exhaustive.
  std::vector<llmkit::f16> all_h(65536);
  std::vector<llmkit::bf16> all_b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    all_h[i].bits = static_cast<std::uint16_t>(i);
    all_b[i].bits = static_cast<std::uint16_t>(i);
  }
  std::vector<float> wide(65536);
  simd::convert<arch>(std::span<const llmkit::f16>(all_h), std::span<float>(wide));
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const std::uint32_t got = std::bit_cast<std::uint32_t>(wide[i]);
    const std::uint32_t want = std::bit_cast<std::uint32_t>(llmkit::to_f32(all_h[i]));
    INFO("f16 bits 0x" << std::hex << i);
    if (std::isnan(wide[i]) || std::isnan(llmkit::to_f32(all_h[i]))) {
      // Signalling NaNs may come back quieted (F16C / AVX-512 do); sign and payload are kept.
      REQUIRE((got | 0x00400000u) == (want | 0x00400000u));
    } else {
      REQUIRE(got == want);
    }
  }
  simd::convert<arch>(std::span<const llmkit::bf16>(all_b), std::span<float>(wide));
  for (std::uint32_t i = 0; i < 65536; ++i)
    REQUIRE(std::bit_cast<std::uint32_t>(wide[i]) == std::bit_cast<std::uint32_t>(llmkit::to_f32(all_b[i])));
  // f32 -> 16-bit: every f16 value, every rounding midpoint and its neighbours,
  // specials, and random bit patterns.
  std::vector<float> in;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const float v = llmkit::to_f32(all_h[i]);
    const std::uint32_t b = std::bit_cast<std::uint32_t>(v);
    for (std::uint32_t d : {0u, 1u, 0x1000u - 1, 0x1000u, 0x1000u + 1}) in.push_back(std::bit_cast<float>(b + d));
  }
  // Every bf16 value as f32, and the bf16 rounding midpoint above it with
  // its neighbours (NaN payloads included).
  for (std::uint32_t i = 0; i < 65536; ++i)
    for (std::uint32_t d : {0u, 0x7fffu, 0x8000u, 0x8001u}) in.push_back(std::bit_cast<float>((i << 16) + d));
  std::mt19937 rng(8);
  for (int i = 0; i < 200000; ++i) in.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  for (float v : {0.0f, -0.0f, inf, -inf, nan_value, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 0x1p-25f,
                  0x1.8p-25f, 0x1p-24f, 6.1e-5f, 3.0e38f, -3.0e38f})
    in.push_back(v);
  std::vector<llmkit::f16> out_h(in.size());
  std::vector<llmkit::bf16> out_b(in.size());
  simd::convert<arch>(std::span<const float>(in), std::span<llmkit::f16>(out_h));
  simd::convert<arch>(std::span<const float>(in), std::span<llmkit::bf16>(out_b));
  for (std::size_t i = 0; i < in.size(); ++i) {
    INFO("input bits 0x" << std::hex << std::bit_cast<std::uint32_t>(in[i]));
    REQUIRE(out_h[i].bits == llmkit::to_f16(in[i]).bits);
    REQUIRE(out_b[i].bits == llmkit::to_bf16(in[i]).bits);
  }
  // Round to nearest even at the midpoints, checked by value.
  CHECK(llmkit::to_f32(out_h[in.size() - 10]) == 65504.0f);  // 65519.99 rounds down
  CHECK(llmkit::to_f32(out_h[in.size() - 9]) == inf);        // 65520 ties to even: inf
  std::vector<llmkit::f16> h3(3);
  std::vector<float> f2(2);
  REQUIRE_THROWS_WITH(simd::convert<arch>(std::span<const float>(f2), std::span<llmkit::f16>(h3)), Catch::Contains("in.size() = 2") && Catch::Contains("out.size() = 3"));
  REQUIRE_THROWS_WITH(simd::convert<arch>(std::span<const llmkit::f16>(h3), std::span<float>(f2)), Catch::Contains("in.size() = 3"));
}

LLMKIT_SIMD_TEST("Q8_0 and int8 quantisation follow GGUF's rounding, round trips within d / 2") {
  if (!arch_available()) return;
  std::mt19937 rng(9);
  for (std::size_t n_blocks : {0u, 1u, 2u, 3u, 33u}) {
    auto x = random_vector(n_blocks * 32, 1, rng, -3.0f, 3.0f);
    if (n_blocks >= 2) {
      for (std::size_t j = 0; j < 32; ++j) x.view[32 + j] = 0.0f;  // an all-zero block: scale 0
      x.view[5] = 127.0f * 0.5f;  // values landing on .5 after scaling test round-half-away
      x.view[6] = -0.25f;
    }
    std::vector<llmkit::block_q8_0> blocks(n_blocks);
    simd::quantize_q8_0<arch>(x.view, blocks);
    const auto expected = ref::quantize_q8_0(x.view);
    std::vector<float> back(n_blocks * 32);
    simd::dequantize_q8_0<arch>(blocks, back);
    for (std::size_t b = 0; b < n_blocks; ++b) {
      REQUIRE(blocks[b].scale.bits == expected[b].scale.bits);
      for (std::size_t j = 0; j < 32; ++j) {
        REQUIRE(blocks[b].qs[j] == expected[b].qs[j]);
        const float d = llmkit::to_f32(blocks[b].scale);
        REQUIRE(back[b * 32 + j] == d * static_cast<float>(blocks[b].qs[j]));
        // |x - d q| <= d/2 with exact d; the f16 scale adds |q| * |d - f16(d)|.
        const double d_exact = [&] {
          float amax = 0.0f;
          for (std::size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x.view[b * 32 + k]));
          return static_cast<double>(amax) / 127.0;
        }();
        REQUIRE(std::fabs(back[b * 32 + j] - x.view[b * 32 + j]) <=
                d_exact * 0.5 * (1 + 1e-5) + 127.0 * std::fabs(d - d_exact) + 1e-30);
      }
    }
    if (n_blocks >= 2) CHECK(blocks[1].scale.bits == 0);
  }
  // int8 rows.
  for (std::size_t n : lengths) {
    const auto x = random_vector(n, 2, rng, -5.0f, 5.0f);
    std::vector<std::int8_t> q(n);
    const float scale = simd::quantize_i8<arch>(x.view, q);
    float amax = 0.0f;
    for (float v : x.view) amax = std::max(amax, std::fabs(v));
    CHECK(scale == amax / 127.0f);
    std::vector<float> back(n);
    simd::dequantize_i8<arch>(q, scale, back);
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(q[i] == static_cast<std::int8_t>(std::round(x.view[i] * inv)));
      REQUIRE(back[i] == scale * static_cast<float>(q[i]));
      REQUIRE(std::fabs(back[i] - x.view[i]) <= scale * 0.5 * (1 + 1e-5));
    }
  }
  // Every .5 of the int8 range and its float neighbours, scaled by exactly 1
  // (amax 127): round-half-away, where the hardware's rounding is half-to-even
  // and x + 0.5 truncated rounds 0.49999997 up.
  {
    std::vector<float> x{127.0f};
    for (int k = -127; k < 127; ++k) {
      const float half = static_cast<float>(k) + 0.5f;
      x.insert(x.end(), {half, std::nextafter(half, 1000.0f), std::nextafter(half, -1000.0f)});
    }
    std::vector<std::int8_t> qh(x.size());
    REQUIRE(simd::quantize_i8<arch>(x, qh) == 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(qh[i] == static_cast<std::int8_t>(std::round(x[i])));
  }
  std::vector<float> zeros(40, 0.0f);
  std::vector<std::int8_t> q(40, 5);
  CHECK(simd::quantize_i8<arch>(zeros, q) == 0.0f);
  for (auto v : q) CHECK(v == 0);
  // Bad input.
  std::vector<float> x33(33), x64(64, 1.0f);
  std::vector<llmkit::block_q8_0> one(1), two(2);
  REQUIRE_THROWS_WITH(simd::quantize_q8_0<arch>(x33, one), Catch::Contains("in.size() = 33") && Catch::Contains("multiple"));
  REQUIRE_THROWS_WITH(simd::quantize_q8_0<arch>(x64, one), Catch::Contains("out.size() = 1") && Catch::Contains("2"));
  x64[40] = nan_value;
  REQUIRE_THROWS_WITH(simd::quantize_q8_0<arch>(x64, two), Catch::Contains("block 1") && Catch::Contains("non-finite"));
  x64[40] = inf;
  std::vector<std::int8_t> q64(64), q63(63);
  REQUIRE_THROWS_WITH(simd::quantize_i8<arch>(x64, q64), Catch::Contains("non-finite"));
  for (const float bad : {-inf, -nan_value, nan_value}) {  // each sign, in the vector part and in the tail
    for (const std::size_t at : {std::size_t{3}, std::size_t{62}}) {
      std::vector<float> xb(63, 1.0f);
      xb[at] = bad;
      std::vector<std::int8_t> qb(63);
      REQUIRE_THROWS_WITH(simd::quantize_i8<arch>(xb, qb), Catch::Contains("non-finite"));
    }
  }
  REQUIRE_THROWS_WITH(simd::quantize_i8<arch>(x64, q63), Catch::Contains("out.size() = 63"));
  std::vector<float> back(63);
  REQUIRE_THROWS_WITH(simd::dequantize_q8_0<arch>(two, back), Catch::Contains("out.size() = 63") && Catch::Contains("64"));
  REQUIRE_THROWS_WITH(simd::dequantize_i8<arch>(std::vector<std::int8_t>(64), 1.0f, back), Catch::Contains("in.size() = 64"));
}

#undef LLMKIT_SIMD_TEST

}  // namespace
