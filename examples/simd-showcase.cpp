// SPDX-License-Identifier: MIT
// llmkit-simd-showcase: runs llmkit's SIMD kernels with the compile-time arch
// next to the scalar path on the same data, and prints what each computed
// (the largest difference between the two) and how fast each was.
//
// The scalar path is kept honestly scalar: this file is compiled without
// tree vectorisation (the pragma comes before every include, so it covers the
// kernel templates instantiated here), which stops g++ -O3 from
// auto-vectorising the scalar loops; the SIMD path uses explicit registers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-vectorize")
#endif
#include <llmkit/llmkit.hpp>

#include "example_cli.hpp"

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

namespace simd = llmkit::simd;
using simd_arch = simd::default_arch;

/// CPU time of this thread in nanoseconds (other processes on a busy machine
/// do not count).
double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e9 * static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec);
}

/// Median CPU nanoseconds per call of fn over a few batches of calls.
template <class Fn>
double time_ns(Fn&& fn, int calls = 50) {
  std::vector<double> samples;
  for (int batch = 0; batch < 7; ++batch) {
    const double start = cpu_ns();
    for (int r = 0; r < calls; ++r) fn();
    samples.push_back((cpu_ns() - start) / calls);
  }
  std::nth_element(samples.begin(), samples.begin() + 3, samples.end());
  return samples[3];
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

void row(const char* what, double t_simd, double t_scalar, const char* agreement) {
  std::printf("  %-34s %9.0f ns %9.0f ns %7.1fx   %s\n", what, t_simd, t_scalar, t_scalar / t_simd, agreement);
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{
      "llmkit's SIMD kernels with the compile-time arch next to the scalar path on the same data: what each "
      "computed and how fast (CPU time per call); takes no options"};
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  std::printf("llmkit %s  arch: %s (%zu floats per register)\n\n", llmkit::version_string,
              simd::arch_name<simd_arch>(), simd::float_lanes<simd_arch>);
  std::printf("  %-34s %12s %12s %8s   %s\n", "kernel (n = 16384 unless noted)", simd::arch_name<simd_arch>(),
              "scalar", "speedup", "SIMD vs scalar result");
  constexpr std::size_t n = 1 << 14;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> a(n), b(n), w(n);
  for (auto& x : a) x = normal(rng);
  for (auto& x : b) x = normal(rng);
  for (auto& x : w) x = 1.0f + 0.1f * normal(rng);
  char text[128];
  volatile float sink = 0;
  volatile std::size_t index_sink = 0;

  {  // dot
    const float d_simd = simd::dot<simd_arch>(a, b), d_scalar = simd::dot<simd::scalar>(a, b);
    std::snprintf(text, sizeof text, "%.5f vs %.5f", d_simd, d_scalar);
    row("dot", time_ns([&] { sink = simd::dot<simd_arch>(a, b); }),
        time_ns([&] { sink = simd::dot<simd::scalar>(a, b); }), text);
  }
  {  // sum
    std::snprintf(text, sizeof text, "%.5f vs %.5f", simd::sum<simd_arch>(a), simd::sum<simd::scalar>(a));
    row("sum", time_ns([&] { sink = simd::sum<simd_arch>(a); }), time_ns([&] { sink = simd::sum<simd::scalar>(a); }),
        text);
  }
  {  // argmax
    std::snprintf(text, sizeof text, "index %zu vs %zu", simd::argmax<simd_arch>(a), simd::argmax<simd::scalar>(a));
    row("argmax", time_ns([&] { index_sink = simd::argmax<simd_arch>(a); }),
        time_ns([&] { index_sink = simd::argmax<simd::scalar>(a); }), text);
  }
  std::vector<float> out_simd(n), out_scalar(n);
  {  // exp
    simd::exp<simd_arch>(a, out_simd);
    simd::exp<simd::scalar>(a, out_scalar);
    std::snprintf(text, sizeof text, "max |diff| %.2g", max_abs_diff(out_simd, out_scalar));
    row("exp", time_ns([&] { simd::exp<simd_arch>(a, out_simd); }),
        time_ns([&] { simd::exp<simd::scalar>(a, out_scalar); }), text);
  }
  {  // softmax over a vocabulary-sized row
    const std::size_t vocab = 32000;
    std::vector<float> logits(vocab);
    for (auto& x : logits) x = 3.0f * normal(rng);
    std::vector<float> p_simd = logits, p_scalar = logits;
    simd::softmax<simd_arch>(p_simd, 0.8f);
    simd::softmax<simd::scalar>(p_scalar, 0.8f);
    double total = 0.0;
    for (float p : p_simd) total += p;
    std::snprintf(text, sizeof text, "max |diff| %.2g, sum - 1 = %.1g", max_abs_diff(p_simd, p_scalar), total - 1.0);
    row("softmax (n = 32000, T = 0.8)", time_ns([&] {
          p_simd = logits;
          simd::softmax<simd_arch>(p_simd, 0.8f);
        }),
        time_ns([&] {
          p_scalar = logits;
          simd::softmax<simd::scalar>(p_scalar, 0.8f);
        }),
        text);
  }
  {  // rmsnorm
    simd::rmsnorm<simd_arch>(a, w, out_simd, 1e-5f);
    simd::rmsnorm<simd::scalar>(a, w, out_scalar, 1e-5f);
    std::snprintf(text, sizeof text, "max |diff| %.2g", max_abs_diff(out_simd, out_scalar));
    row("rmsnorm", time_ns([&] { simd::rmsnorm<simd_arch>(a, w, out_simd, 1e-5f); }),
        time_ns([&] { simd::rmsnorm<simd::scalar>(a, w, out_scalar, 1e-5f); }), text);
  }
  {  // RoPE on 32 heads x 128 of one token, precomputed table
    const simd::rope_config config{.theta = 10000.0f, .layout = simd::rope_layout::interleaved};
    const simd::rope_table table(config, 128, 4096);
    std::vector<float> q_simd(a.begin(), a.begin() + 32 * 128), q_scalar = q_simd;
    simd::apply_rope<simd_arch>(q_simd, 128, 1234, table);
    simd::apply_rope<simd::scalar>(q_scalar, 128, 1234, table);
    std::snprintf(text, sizeof text, "max |diff| %.2g", max_abs_diff(q_simd, q_scalar));
    row("rope (32 heads x 128, table)", time_ns([&] { simd::apply_rope<simd_arch>(q_simd, 128, 7, table); }),
        time_ns([&] { simd::apply_rope<simd::scalar>(q_scalar, 128, 7, table); }), text);
  }
  {  // f32 -> f16 -> f32
    std::vector<llmkit::f16> h_simd(n), h_scalar(n);
    simd::convert<simd_arch>(std::span<const float>(a), std::span<llmkit::f16>(h_simd));
    simd::convert<simd::scalar>(std::span<const float>(a), std::span<llmkit::f16>(h_scalar));
    std::snprintf(text, sizeof text, "%s", h_simd == h_scalar ? "bit-identical" : "DIFFERENT");
    row("f32 -> f16", time_ns([&] { simd::convert<simd_arch>(std::span<const float>(a), std::span<llmkit::f16>(h_simd)); }),
        time_ns([&] { simd::convert<simd::scalar>(std::span<const float>(a), std::span<llmkit::f16>(h_scalar)); }),
        text);
  }
  {  // Q8_0
    std::vector<llmkit::block_q8_0> q_simd(n / 32), q_scalar(n / 32);
    simd::quantize_q8_0<simd_arch>(a, q_simd);
    simd::quantize_q8_0<simd::scalar>(a, q_scalar);
    bool same = true;
    for (std::size_t i = 0; i < q_simd.size(); ++i)
      same = same && q_simd[i].scale == q_scalar[i].scale && std::equal(q_simd[i].qs, q_simd[i].qs + 32, q_scalar[i].qs);
    simd::dequantize_q8_0<simd_arch>(q_simd, out_simd);
    std::snprintf(text, sizeof text, "%s; round trip max |err| %.3f", same ? "bit-identical" : "DIFFERENT",
                  max_abs_diff(out_simd, a));
    row("quantize Q8_0", time_ns([&] { simd::quantize_q8_0<simd_arch>(a, q_simd); }),
        time_ns([&] { simd::quantize_q8_0<simd::scalar>(a, q_scalar); }), text);
  }
  std::printf("\n(CPU time per call, median of 7 batches; bench/bench_simd measures each kernel properly)\n");
  return 0;
}
