// SPDX-License-Identifier: MIT
// bench_simd: every simd kernel, scalar path vs the compile-time SIMD arch,
// at L1- (16 KiB per array), L2- (1 MiB) and DRAM-resident (64 MiB, cycled
// through 16 copies per operand so that no call finds its input in L3) sizes.
//
// Counters: bytes_per_second is the memory traffic the kernel's algorithm
// must move per call (listed per kernel below), so it can be set against the
// machine's read bandwidth; frac_read_bw is that rate over the single-core
// sustained read bandwidth of bench/roofline.hpp (meaningful for the DRAM
// size; above 1 for cache-resident sizes). At the end a table gives the
// SIMD / scalar ratio of each kernel and size, from this one run.
//
// Honest scalar: this translation unit is compiled with tree vectorisation
// switched off (the pragma below, before any include), so g++ -O3 cannot
// auto-vectorise the scalar path; the SIMD path uses explicit xsimd
// registers and is unaffected. (A side effect: the plain loops that narrow
// int32 lanes to 16 bits inside the SIMD conversions stay scalar here too.)
//
// LLMKIT_BENCH_SMOKE=1 shrinks the sizes so the smoke run takes seconds.
#pragma GCC optimize("no-tree-vectorize")

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/simd/simd.hpp>

#include "roofline.hpp"

namespace {

namespace simd = llmkit::simd;
using simd_arch = simd::default_arch;

using llmkit_bench::smoke;

struct size_class {
  const char* name;
  std::size_t bytes;  // per f32 array
};

std::vector<size_class> size_classes() {
  if (smoke()) return {{"L1", 16 << 10}, {"L2", 64 << 10}, {"DRAM", 1 << 20}};
  return {{"L1", 16 << 10}, {"L2", 1 << 20}, {"DRAM", 64 << 20}};
}

/// Copies of each operand cycled through at the DRAM size: 16 x 64 MiB =
/// 1 GiB per operand, twice the 480 MiB L3 this VM reports, so that every
/// call reads from DRAM (one 64 MiB array would stay in L3 and read at about
/// twice the DRAM rate). One copy at the cache-resident sizes.
std::size_t copies(std::size_t n) { return !smoke() && n * sizeof(float) >= (std::size_t{32} << 20) ? 16 : 1; }

/// An operand of `n` elements: `copies(n)` pre-faulted arrays of random
/// data; next() returns the array for the next call, in turn.
template <class T>
class operand {
 public:
  operand(int slot, std::size_t n) : n_(n), copies_(copies(n)), data_(storage(slot, n * copies_)) {}
  T* next() { return data_ + (k_++ % copies_) * n_; }

 private:
  static T* storage(int slot, std::size_t total) {
    static std::map<int, llmkit::aligned_vector<T>> pool;
    auto& v = pool[slot];
    if (v.size() < total) {
      v.assign(total, T{});
      if constexpr (std::is_same_v<T, float>) {
        // Random values in [-4, 4): the first 1 Mi drawn, the rest copies (cheap to fill).
        std::mt19937 rng(static_cast<unsigned>(slot) + 11);
        std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
        const std::size_t head = std::min<std::size_t>(total, std::size_t{1} << 20);
        for (std::size_t i = 0; i < head; ++i) v[i] = dist(rng);
        for (std::size_t i = head; i < total; i += head)
          std::copy_n(v.begin(), std::min(head, total - i), v.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    return v.data();
  }
  std::size_t n_, copies_, k_ = 0;
  T* data_;
};

void finish(benchmark::State& state, double bytes_per_call) {
  const double bytes = bytes_per_call * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  const double read_bw = llmkit_bench::roofline::get().read_gbps_1t * 1e9;
  state.counters["frac_read_bw"] =
      benchmark::Counter(bytes / read_bw, benchmark::Counter::kIsRate);  // (bytes / s) / read_bw
}

// Each kernel: (n floats) -> bytes moved per call. Restoring inputs of
// in-place kernels is not needed: softmax/scale/rope keep values bounded.

template <class Arch>
void BM_dot(benchmark::State& state, std::size_t n) {
  operand<float> a(0, n), b(1, n);
  for (auto _ : state) benchmark::DoNotOptimize(simd::dot<Arch>({a.next(), n}, {b.next(), n}));
  finish(state, 8.0 * n);
}

template <class Arch>
void BM_sum(benchmark::State& state, std::size_t n) {
  operand<float> a(0, n);
  for (auto _ : state) benchmark::DoNotOptimize(simd::sum<Arch>({a.next(), n}));
  finish(state, 4.0 * n);
}

template <class Arch>
void BM_max(benchmark::State& state, std::size_t n) {
  operand<float> a(0, n);
  for (auto _ : state) benchmark::DoNotOptimize(simd::max<Arch>({a.next(), n}));
  finish(state, 4.0 * n);
}

template <class Arch>
void BM_argmax(benchmark::State& state, std::size_t n) {
  operand<float> a(0, n);  // random: the maximum is somewhere in the middle
  for (auto _ : state) benchmark::DoNotOptimize(simd::argmax<Arch>({a.next(), n}));
  finish(state, 4.0 * n);
}

template <class Arch>
void BM_axpy(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n), y(1, n);
  float a = 1e-7f;
  for (auto _ : state) {
    simd::axpy<Arch>(a, {x.next(), n}, {y.next(), n});
    a = -a;  // keeps y bounded
    benchmark::ClobberMemory();
  }
  finish(state, 12.0 * n);
}

template <class Arch>
void BM_scale(benchmark::State& state, std::size_t n) {
  operand<float> x(1, n);
  float a = 0.5f;
  for (auto _ : state) {
    simd::scale<Arch>({x.next(), n}, a);
    a = 1.0f / a;
    benchmark::ClobberMemory();
  }
  finish(state, 8.0 * n);
}

template <class Arch>
void BM_exp(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n), y(2, n);
  for (auto _ : state) {
    simd::exp<Arch>({x.next(), n}, {y.next(), n});
    benchmark::ClobberMemory();
  }
  finish(state, 8.0 * n);
}

template <class Arch>
void BM_softmax(benchmark::State& state, std::size_t n) {
  operand<float> x(3, n);
  for (auto _ : state) {
    simd::softmax<Arch>({x.next(), n});
    benchmark::ClobberMemory();
  }
  // Short rows: max, exp + store, scale = 20 B/value; long rows (chunked): 16 B/value.
  finish(state, (n <= simd::softmax_chunk ? 20.0 : 16.0) * n);
}

template <class Arch>
void BM_log_softmax(benchmark::State& state, std::size_t n) {
  operand<float> x(3, n);
  for (auto _ : state) {
    simd::log_softmax<Arch>({x.next(), n});
    benchmark::ClobberMemory();
  }
  // Short rows: max, sum, read + write = 16 B/value; long rows (chunked): 12 B/value.
  finish(state, (n <= simd::softmax_chunk ? 16.0 : 12.0) * n);
}

template <class Arch>
void BM_rmsnorm(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n), w(1, n), out(2, n);
  for (auto _ : state) {
    simd::rmsnorm<Arch>({x.next(), n}, {w.next(), n}, {out.next(), n}, 1e-5f);
    benchmark::ClobberMemory();
  }
  finish(state, 16.0 * n);  // read x (sum of squares), read x and w, write out
}

template <class Arch>
void BM_rope(benchmark::State& state, std::size_t n) {
  constexpr std::size_t head_dim = 128;
  const std::size_t len = n / head_dim * head_dim;
  operand<float> x(4, len);
  static const simd::rope_table table(simd::rope_config{}, head_dim, 4096);
  std::int32_t position = 0;
  for (auto _ : state) {
    simd::apply_rope<Arch>({x.next(), len}, head_dim, position, table);
    position = (position + 1) & 4095;
    benchmark::ClobberMemory();
  }
  finish(state, 8.0 * len);
}

template <class Arch>
void BM_f32_to_f16(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n);
  operand<llmkit::f16> h(0, n);
  for (auto _ : state) {
    simd::convert<Arch>(std::span<const float>(x.next(), n), std::span<llmkit::f16>(h.next(), n));
    benchmark::ClobberMemory();
  }
  finish(state, 6.0 * n);
}

template <class Arch>
void BM_f16_to_f32(benchmark::State& state, std::size_t n) {
  operand<llmkit::f16> h(1, n);
  operand<float> y(2, n);
  for (auto _ : state) {
    simd::convert<Arch>(std::span<const llmkit::f16>(h.next(), n), std::span<float>(y.next(), n));
    benchmark::ClobberMemory();
  }
  finish(state, 6.0 * n);
}

template <class Arch>
void BM_f32_to_bf16(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n);
  operand<llmkit::bf16> h(0, n);
  for (auto _ : state) {
    simd::convert<Arch>(std::span<const float>(x.next(), n), std::span<llmkit::bf16>(h.next(), n));
    benchmark::ClobberMemory();
  }
  finish(state, 6.0 * n);
}

template <class Arch>
void BM_quantize_q8_0(benchmark::State& state, std::size_t n) {
  const std::size_t len = n / 32 * 32;
  operand<float> x(0, len);
  operand<llmkit::block_q8_0> q(0, len / 32);
  for (auto _ : state) {
    simd::quantize_q8_0<Arch>({x.next(), len}, {q.next(), len / 32});
    benchmark::ClobberMemory();
  }
  finish(state, 4.0 * len + 34.0 * (len / 32));
}

template <class Arch>
void BM_dequantize_q8_0(benchmark::State& state, std::size_t n) {
  const std::size_t len = n / 32 * 32;
  operand<llmkit::block_q8_0> q(1, len / 32);
  operand<float> y(2, len);
  for (auto _ : state) {
    simd::dequantize_q8_0<Arch>({q.next(), len / 32}, {y.next(), len});
    benchmark::ClobberMemory();
  }
  finish(state, 4.0 * len + 34.0 * (len / 32));
}

template <class Arch>
void BM_quantize_i8(benchmark::State& state, std::size_t n) {
  operand<float> x(0, n);
  operand<std::int8_t> q(0, n);
  for (auto _ : state) {
    benchmark::DoNotOptimize(simd::quantize_i8<Arch>({x.next(), n}, {q.next(), n}));
    benchmark::ClobberMemory();
  }
  finish(state, 9.0 * n);  // read twice (amax, quantise), write int8
}

// The roofline probe's own read loop (eight accumulators, aligned loads) on
// the same buffer: what plain streaming reaches at each size in this run.
void BM_read_probe(benchmark::State& state, std::size_t n) {
  operand<float> a(0, n);
  for (auto _ : state) benchmark::DoNotOptimize(llmkit_bench::detail::read_kernel(a.next(), n));
  finish(state, 4.0 * n);
}

using bench_fn = void (*)(benchmark::State&, std::size_t);
struct kernel_entry {
  const char* name;
  bench_fn scalar;
  bench_fn vector;
};

#define LLMKIT_KERNEL(name) kernel_entry{#name, &BM_##name<simd::scalar>, &BM_##name<simd_arch>}

const kernel_entry kernels[] = {
    LLMKIT_KERNEL(dot),      LLMKIT_KERNEL(sum),          LLMKIT_KERNEL(max),
    LLMKIT_KERNEL(argmax),   LLMKIT_KERNEL(axpy),         LLMKIT_KERNEL(scale),
    LLMKIT_KERNEL(exp),      LLMKIT_KERNEL(softmax),      LLMKIT_KERNEL(log_softmax),
    LLMKIT_KERNEL(rmsnorm),  LLMKIT_KERNEL(rope),         LLMKIT_KERNEL(f32_to_f16),
    LLMKIT_KERNEL(f16_to_f32), LLMKIT_KERNEL(f32_to_bf16), LLMKIT_KERNEL(quantize_q8_0),
    LLMKIT_KERNEL(dequantize_q8_0), LLMKIT_KERNEL(quantize_i8),
};

/// Console output plus, at the end, the SIMD / scalar table of this run.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.error_occurred || !run.aggregate_name.empty()) continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) rates_[run.benchmark_name()] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto& roof = llmkit_bench::roofline::get();
    std::printf("\nroofline (%s): read %.1f GB/s one core\n", roof.source.c_str(), roof.read_gbps_1t);
    for (const auto& s : size_classes()) {
      const auto p = rates_.find(std::string("read_probe/") + s.name);
      if (p != rates_.end())
        std::printf("read probe %-5s %.2f GB/s (%.2f of the roofline figure)\n", s.name, p->second / 1e9,
                    p->second / (roof.read_gbps_1t * 1e9));
    }
    std::printf("%-16s %-5s %12s %12s %8s %13s\n", "kernel", "size", "scalar GB/s", "simd GB/s", "ratio",
                "simd/read_bw");
    for (const auto& k : kernels) {
      for (const auto& s : size_classes()) {
        const auto a = rates_.find(name(k.name, "scalar", s.name));
        const auto b = rates_.find(name(k.name, simd::arch_name<simd_arch>(), s.name));
        if (a == rates_.end() || b == rates_.end()) continue;
        std::printf("%-16s %-5s %12.2f %12.2f %8.2f %13.2f\n", k.name, s.name, a->second / 1e9, b->second / 1e9,
                    b->second / a->second, b->second / (roof.read_gbps_1t * 1e9));
      }
    }
  }
  static std::string name(const char* kernel, const char* arch, const char* size) {
    return std::string(kernel) + "/" + arch + "/" + size;
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  std::printf("bench_simd  arch: %s\n", simd::arch_name<simd_arch>());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (const auto& s : size_classes())
    benchmark::RegisterBenchmark((std::string("read_probe/") + s.name).c_str(), BM_read_probe,
                                 s.bytes / sizeof(float));
  for (const auto& k : kernels) {
    for (const auto& s : size_classes()) {
      const std::size_t n = s.bytes / sizeof(float);
      benchmark::RegisterBenchmark(ratio_reporter::name(k.name, "scalar", s.name).c_str(), k.scalar, n);
      benchmark::RegisterBenchmark(ratio_reporter::name(k.name, simd::arch_name<simd_arch>(), s.name).c_str(),
                                   k.vector, n);
    }
  }
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
