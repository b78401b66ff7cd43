// SPDX-License-Identifier: MIT
// llmkit-simd-showcase: runs llmkit's SIMD kernels with the compile-time arch
// next to the scalar path and prints what each computed and how fast.
#include <llmkit/llmkit.hpp>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  namespace simd = llmkit::simd;
  std::printf("llmkit %s  arch: %s\n", llmkit::version_string, simd::arch_name<simd::default_arch>());
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> a(1 << 14), b(1 << 14);
  for (auto& x : a) x = normal(rng);
  for (auto& x : b) x = normal(rng);
  auto time_ns = [](auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < 1000; ++r) fn();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / 1000;
  };
  volatile float sink = 0;
  const float d_simd = simd::dot(std::span<const float>(a), std::span<const float>(b));
  const float d_scalar = simd::dot<simd::scalar>(std::span<const float>(a), std::span<const float>(b));
  const double t_simd = time_ns([&] { sink = simd::dot(std::span<const float>(a), std::span<const float>(b)); });
  const double t_scalar =
      time_ns([&] { sink = simd::dot<simd::scalar>(std::span<const float>(a), std::span<const float>(b)); });
  std::printf("dot   n=%zu  %s: %.4f (%.0f ns)  scalar: %.4f (%.0f ns)  speedup %.1fx\n", a.size(),
              simd::arch_name<simd::default_arch>(), d_simd, t_simd, d_scalar, t_scalar, t_scalar / t_simd);
  return 0;
}
