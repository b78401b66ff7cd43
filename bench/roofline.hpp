// SPDX-License-Identifier: MIT
#pragma once

/// @file bench/roofline.hpp
/// The machine's limits for benchmarks: sustained read bandwidth and peak
/// fp32 FMA rate, one core and all cores. `bench_roofline` measures them
/// carefully and writes them as JSON; every other bench includes this header
/// and calls `llmkit_bench::roofline::get()` to print its figures as
/// fractions of those limits. When the JSON file is missing (or unreadable)
/// the limits are measured quickly in-process instead, and `source` says so.
///
/// The JSON file is the path in the environment variable LLMKIT_ROOFLINE_JSON,
/// else `<source dir>/build/roofline.json`.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "llmkit/core/aligned_buffer.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/intrinsics.hpp"

namespace llmkit_bench {

/// LLMKIT_BENCH_SMOKE=1 (set by the bench-smoke ctest entries): every bench
/// shrinks its sizes so the run takes seconds and proves only that it works.
inline bool smoke() {
  const char* v = std::getenv("LLMKIT_BENCH_SMOKE");
  return v != nullptr && std::string(v) != "0";
}

/// Where the roofline JSON lives (LLMKIT_ROOFLINE_JSON, else <source>/build/roofline.json).
inline std::string roofline_json_path() {
  if (const char* p = std::getenv("LLMKIT_ROOFLINE_JSON"); p != nullptr && *p != '\0') return p;
#if defined(LLMKIT_SOURCE_DIR)
  return std::string(LLMKIT_SOURCE_DIR) + "/build/roofline.json";
#else
  return "roofline.json";
#endif
}

/// Thread counts of a scaling benchmark: 1, 2, 4, ... below the hardware
/// threads, then the hardware threads themselves, so a row per doubling shows
/// how a kernel scales on whatever machine runs it (1, 2 on two cores; 1, 2,
/// 4, 8, 12 on twelve). Smoke runs stop at 2.
inline std::vector<std::int64_t> thread_counts() {
  const auto hardware = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t top = smoke() ? std::min<std::int64_t>(hardware, 2) : hardware;
  std::vector<std::int64_t> counts;
  for (std::int64_t t = 1; t < top; t *= 2) counts.push_back(t);
  counts.push_back(top);
  return counts;
}

namespace detail {

/// Runs fn(thread_index) on n_threads threads released together; returns the
/// wall time in seconds from the release to the last thread's end.
template <class Fn>
double run_together(unsigned n_threads, Fn&& fn) {
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
    });
  while (ready.load() != n_threads) {
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Reads n floats with eight independent vector accumulators: as close to the
/// load ports' and the memory system's limit as plain loads get. With
/// `prefetch`, each 64-byte line is also prefetched 1 KiB ahead, as the
/// decode kernels do, since decode can beat a plain-loads figure; the
/// roofline takes the better of the two.
inline float read_kernel(const float* p, std::size_t n, bool prefetch = false) {
  using arch = llmkit::simd::default_arch;
  if constexpr (llmkit::simd::is_scalar_v<arch>) {
    float acc = 0.0f;
    for (std::size_t i = 0; i < n; ++i) acc += p[i];
    return acc;
  } else {
    using batch = xsimd::batch<float, arch>;
    constexpr std::size_t l = batch::size;
    batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f), a4(0.0f), a5(0.0f), a6(0.0f), a7(0.0f);
    const std::size_t body = n / (8 * l) * (8 * l);
    std::size_t i = 0;
    constexpr std::size_t ahead = 1024 / sizeof(float);
    for (; i < body; i += 8 * l) {
      if (prefetch)
        for (std::size_t b = 0; b < 8 * l; b += 64 / sizeof(float)) __builtin_prefetch(p + i + ahead + b, 0, 3);
      a0 += batch::load_aligned(p + i);
      a1 += batch::load_aligned(p + i + l);
      a2 += batch::load_aligned(p + i + 2 * l);
      a3 += batch::load_aligned(p + i + 3 * l);
      a4 += batch::load_aligned(p + i + 4 * l);
      a5 += batch::load_aligned(p + i + 5 * l);
      a6 += batch::load_aligned(p + i + 6 * l);
      a7 += batch::load_aligned(p + i + 7 * l);
    }
    float acc = xsimd::hadd(((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)));
    for (; i < n; ++i) acc += p[i];
    return acc;
  }
}

/// Peak-FMA loop: 16 independent chains (enough for 2 FMA ports x 4-cycle
/// latency with room to spare). Returns the flops done.
inline double fma_kernel(std::size_t iterations, float seed) {
  using arch = llmkit::simd::default_arch;
  if constexpr (llmkit::simd::is_scalar_v<arch>) {
    float a[16];
    for (int k = 0; k < 16; ++k) a[k] = seed + k;
    for (std::size_t it = 0; it < iterations; ++it)
      for (int k = 0; k < 16; ++k) a[k] = a[k] * 0.999999f + 1e-7f;
    volatile float sink = 0;
    for (int k = 0; k < 16; ++k) sink = sink + a[k];
    return 2.0 * 16.0 * static_cast<double>(iterations);
  } else {
    using batch = xsimd::batch<float, arch>;
    const batch m(0.999999f), c(1e-7f);
    batch a0(seed), a1(seed + 1), a2(seed + 2), a3(seed + 3), a4(seed + 4), a5(seed + 5), a6(seed + 6),
        a7(seed + 7), a8(seed + 8), a9(seed + 9), a10(seed + 10), a11(seed + 11), a12(seed + 12),
        a13(seed + 13), a14(seed + 14), a15(seed + 15);
    for (std::size_t it = 0; it < iterations; ++it) {
      a0 = xsimd::fma(a0, m, c); a1 = xsimd::fma(a1, m, c); a2 = xsimd::fma(a2, m, c); a3 = xsimd::fma(a3, m, c);
      a4 = xsimd::fma(a4, m, c); a5 = xsimd::fma(a5, m, c); a6 = xsimd::fma(a6, m, c); a7 = xsimd::fma(a7, m, c);
      a8 = xsimd::fma(a8, m, c); a9 = xsimd::fma(a9, m, c); a10 = xsimd::fma(a10, m, c); a11 = xsimd::fma(a11, m, c);
      a12 = xsimd::fma(a12, m, c); a13 = xsimd::fma(a13, m, c); a14 = xsimd::fma(a14, m, c); a15 = xsimd::fma(a15, m, c);
    }
    const batch total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11)) +
                        ((a12 + a13) + (a14 + a15));
    volatile float sink = xsimd::hadd(total);
    static_cast<void>(sink);
    return 2.0 * 16.0 * static_cast<double>(batch::size) * static_cast<double>(iterations);
  }
}

/// The int8 multiply-add instruction int8_kernel times in this build.
constexpr const char* int8_instruction() noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return "vpdpbusd zmm (AVX-512 VNNI)";
#elif defined(__AVXVNNI__)
  return "vpdpbusd ymm (AVX-VNNI)";
#elif defined(__AVX2__)
  return "vpmaddubsw + vpmaddwd + vpaddd ymm (AVX2)";
#else
  return "scalar";
#endif
}

/// Peak int8 dot-product loop: 16 independent int32 accumulator chains of
/// the widest unsigned x signed int8 multiply-add the build has (the
/// instruction the quantised products use; int8_instruction names it).
/// Returns the int8 operations done: 2 per multiply-add, as flops count an
/// FMA, so the figure compares with the f32 FMA peak.
inline double int8_kernel(std::size_t iterations, int seed) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const __m512i a = _mm512_set1_epi8(static_cast<char>(1 + seed % 7)), b = _mm512_set1_epi8(3);
  // Named accumulators updated in place (GCC moves an array's registers
  // around the intrinsic, a copy per multiply-add that the peak must not pay).
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
          a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  for (std::size_t it = 0; it < iterations; ++it) {
    asm("vpdpbusd %2, %1, %0" : "+v"(a0) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a1) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a2) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a3) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a4) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a5) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a6) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a7) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a8) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a9) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a10) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a11) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a12) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a13) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a14) : "v"(a), "v"(b));
    asm("vpdpbusd %2, %1, %0" : "+v"(a15) : "v"(a), "v"(b));
  }
  const __m512i total = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)),
                       _mm512_add_epi32(_mm512_add_epi32(a12, a13), _mm512_add_epi32(a14, a15))));
  volatile int sink = _mm512_reduce_add_epi32(total);
  static_cast<void>(sink);
  return 2.0 * 64.0 * 16.0 * static_cast<double>(iterations);
#elif defined(__AVXVNNI__)
  const __m256i a = _mm256_set1_epi8(static_cast<char>(1 + seed % 7)), b = _mm256_set1_epi8(3);
  __m256i acc[16];
  for (auto& x : acc) x = _mm256_setzero_si256();
  for (std::size_t it = 0; it < iterations; ++it)
    for (auto& x : acc) x = _mm256_dpbusd_avx_epi32(x, a, b);
  __m256i total = acc[0];
  for (int k = 1; k < 16; ++k) total = _mm256_add_epi32(total, acc[k]);
  alignas(32) int lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  volatile int sink = lanes[0];
  static_cast<void>(sink);
  return 2.0 * 32.0 * 16.0 * static_cast<double>(iterations);
#elif defined(__AVX2__)
  __m256i a = _mm256_set1_epi8(static_cast<char>(1 + seed % 7));
  const __m256i b = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i acc[16];
  for (auto& x : acc) x = _mm256_setzero_si256();
  for (std::size_t it = 0; it < iterations; ++it) {
    asm("" : "+x"(a));  // a "changes": the products cannot be hoisted out of the loop
    for (auto& x : acc) x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  }
  __m256i total = acc[0];
  for (int k = 1; k < 16; ++k) total = _mm256_add_epi32(total, acc[k]);
  alignas(32) int lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  volatile int sink = lanes[0];
  static_cast<void>(sink);
  return 2.0 * 32.0 * 16.0 * static_cast<double>(iterations);
#else
  std::int32_t acc[16] = {};
  volatile std::uint8_t a = static_cast<std::uint8_t>(1 + seed % 7);
  const std::uint8_t x = a;
  for (std::size_t it = 0; it < iterations; ++it)
    for (int k = 0; k < 16; ++k) acc[k] += std::int32_t{x} * std::int32_t{static_cast<std::int8_t>(3 + k)};
  volatile std::int32_t sink = 0;
  for (int k = 0; k < 16; ++k) sink = sink + acc[k];
  return 2.0 * 16.0 * static_cast<double>(iterations);
#endif
}

}  // namespace detail

/// CPU time of the calling thread, in seconds.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Floats to read: [first float, count).
using read_span = std::pair<const float*, std::size_t>;

/// Reads `spans` with read_kernel on n_threads threads (thread t reads
/// spans t, t + n_threads, ...) and returns the rate in GB/s (1e9 bytes/s):
/// each thread's bytes over its own CPU time (not wall time, so that other
/// processes time-slicing the cores do not count as memory stalls), summed
/// over the threads.
inline double read_spans_gbps(const std::vector<read_span>& spans, unsigned n_threads, bool prefetch) {
  std::vector<double> rate(n_threads);
  std::vector<float> sinks(n_threads);
  detail::run_together(n_threads, [&](unsigned t) {
    const double start = thread_cpu_seconds();
    double bytes = 0.0;
    for (std::size_t i = t; i < spans.size(); i += n_threads) {
      sinks[t] += detail::read_kernel(spans[i].first, spans[i].second, prefetch);
      bytes += static_cast<double>(spans[i].second * sizeof(float));
    }
    rate[t] = bytes / (thread_cpu_seconds() - start) * 1e-9;
  });
  benchmark::DoNotOptimize(sinks.data());
  double total = 0.0;
  for (const double r : rate) total += r;
  return total;
}

/// Sustained read bandwidth in GB/s of n_threads threads each streaming its
/// own share of `total_bytes` (first-touched by that thread), best of
/// `repeats` plain and `repeats` prefetching passes (read_spans_gbps) after
/// one warm-up pass.
inline double measure_read_gbps(unsigned n_threads, std::size_t total_bytes, int repeats) {
  const std::size_t per_thread = total_bytes / n_threads / sizeof(float) / 1024 * 1024;
  std::vector<llmkit::aligned_vector<float>> buffers(n_threads);
  detail::run_together(n_threads, [&](unsigned t) { buffers[t].assign(per_thread, 1.0f); });
  std::vector<read_span> spans;
  for (const auto& b : buffers) spans.emplace_back(b.data(), per_thread);
  read_spans_gbps(spans, n_threads, false);
  double best = 0.0;
  for (int r = 0; r < 2 * repeats; ++r)  // plain and prefetching passes alternate
    best = std::max(best, read_spans_gbps(spans, n_threads, r % 2 == 1));
  return best;
}

/// Peak fp32 FMA rate in GFLOP/s of n_threads threads, best of `repeats`;
/// per-thread CPU time as for measure_read_gbps.
inline double measure_fma_gflops(unsigned n_threads, std::size_t iterations, int repeats) {
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> rate(n_threads);
    detail::run_together(n_threads, [&](unsigned t) {
      const double start = thread_cpu_seconds();
      const double flops = detail::fma_kernel(iterations, 1.0f + static_cast<float>(t));
      rate[t] = flops / (thread_cpu_seconds() - start) / 1e9;
    });
    double total = 0.0;
    for (double x : rate) total += x;
    best = std::max(best, total);
  }
  return best;
}

/// Peak int8 dot-product rate in GOP/s (2 operations per multiply-add) of
/// n_threads threads, best of `repeats`; per-thread CPU time as for
/// measure_read_gbps. detail::int8_instruction names what it times.
inline double measure_int8_gops(unsigned n_threads, std::size_t iterations, int repeats) {
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> rate(n_threads);
    detail::run_together(n_threads, [&](unsigned t) {
      const double start = thread_cpu_seconds();
      const double ops = detail::int8_kernel(iterations, static_cast<int>(t));
      rate[t] = ops / (thread_cpu_seconds() - start) / 1e9;
    });
    double total = 0.0;
    for (double x : rate) total += x;
    best = std::max(best, total);
  }
  return best;
}

/// Median of x (the upper one of an even count; 0 when empty).
inline double median(std::vector<double> x) {
  if (x.empty()) return 0.0;
  const auto mid = x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2);
  std::nth_element(x.begin(), mid, x.end());
  return *mid;
}

/// A kernel's rate over a limit of the machine measured again right after
/// each call, outside the call's timing (a "live" probe). The speed of a
/// shared VM moves by 10-30 % within minutes and stalls for a moment now
/// and then: each call's rate over the probe just after it, and the median
/// of those ratios, move far less than the kernel's rate over a roofline
/// reading of another hour, and a short stall does not move the median.
class live_ratio {
 public:
  /// Records one call's rate and the probe's rate after it (same units).
  void add(double call_rate, double probe_rate) {
    probes_.push_back(probe_rate);
    ratios_.push_back(probe_rate > 0.0 ? call_rate / probe_rate : 0.0);
  }
  std::size_t size() const { return probes_.size(); }
  /// Median of the probes' rates.
  double probe_median() const { return median(probes_); }
  /// Median over the calls of the call's rate over the next probe's.
  double ratio_median() const { return median(ratios_); }

 private:
  std::vector<double> probes_;
  std::vector<double> ratios_;
};

/// The machine limits, in GB/s and GFLOP/s.
struct roofline {
  double read_gbps_1t = 0.0;    ///< sustained read bandwidth, one thread
  double read_gbps_all = 0.0;   ///< sustained read bandwidth, all hardware threads
  double fma_gflops_1t = 0.0;   ///< peak fp32 FMA rate, one thread
  double fma_gflops_all = 0.0;  ///< peak fp32 FMA rate, all hardware threads
  double int8_gops_1t = 0.0;    ///< peak int8 dot-product rate (2 ops per multiply-add), one thread; 0 = not measured
  double int8_gops_all = 0.0;   ///< the same, all hardware threads
  std::string int8_instruction; ///< what the int8 figures time (detail::int8_instruction)
  unsigned threads_all = 1;     ///< the thread count of the *_all figures
  std::string arch;             ///< SIMD arch of the measuring binary
  std::string source;           ///< the JSON file read, or "measured in-process (quick)"

  /// Read-bandwidth limit of n_threads threads: one thread's figure times
  /// n_threads, at most the all-threads figure (both are measured; counts in
  /// between are not).
  double read_gbps(std::size_t n_threads) const {
    return n_threads <= 1 ? read_gbps_1t : std::min(read_gbps_all, read_gbps_1t * static_cast<double>(n_threads));
  }
  /// FMA limit of n_threads threads, as read_gbps.
  double fma_gflops(std::size_t n_threads) const {
    return n_threads <= 1 ? fma_gflops_1t : std::min(fma_gflops_all, fma_gflops_1t * static_cast<double>(n_threads));
  }

  /// int8 dot-product limit of n_threads threads, as read_gbps (0 when
  /// the file predates the measurement).
  double int8_gops(std::size_t n_threads) const {
    return n_threads <= 1 ? int8_gops_1t : std::min(int8_gops_all, int8_gops_1t * static_cast<double>(n_threads));
  }

  nlohmann::json to_json() const {
    return {{"read_gbps_1t", read_gbps_1t},     {"read_gbps_all", read_gbps_all}, {"fma_gflops_1t", fma_gflops_1t},
            {"fma_gflops_all", fma_gflops_all}, {"int8_gops_1t", int8_gops_1t},   {"int8_gops_all", int8_gops_all},
            {"int8_instruction", int8_instruction}, {"threads_all", threads_all}, {"arch", arch}};
  }

  /// Quick in-process measurement (about a second; a few milliseconds, and
  /// meaningless figures, under LLMKIT_BENCH_SMOKE=1).
  static roofline measure_quick() {
    const std::size_t bytes = smoke() ? std::size_t{4} << 20 : std::size_t{256} << 20;
    const std::size_t iterations = smoke() ? 20'000 : 2'000'000;
    roofline r;
    r.threads_all = std::max(1u, std::thread::hardware_concurrency());
    r.read_gbps_1t = measure_read_gbps(1, bytes, 3);
    r.read_gbps_all = measure_read_gbps(r.threads_all, bytes, 3);
    r.fma_gflops_1t = measure_fma_gflops(1, iterations, 3);
    r.fma_gflops_all = measure_fma_gflops(r.threads_all, iterations, 3);
    r.int8_gops_1t = measure_int8_gops(1, iterations, 3);
    r.int8_gops_all = measure_int8_gops(r.threads_all, iterations, 3);
    r.int8_instruction = detail::int8_instruction();
    r.arch = llmkit::simd::arch_name<llmkit::simd::default_arch>();
    r.source = smoke() ? "measured in-process (smoke: meaningless)" : "measured in-process (quick)";
    return r;
  }

  /// " (written N min ago)" for the file at `path`, or "" when its time is
  /// unknown. Fractions from two runs compare only when they divide by the
  /// same limits: a file written in another hour (the machine's speed drifts
  /// by several percent between hours) or a build whose source tree has no
  /// file (limits measured in-process) shifts every fraction of that run.
  static std::string age_note(const std::string& path) {
    std::error_code ec;
    const auto written = std::filesystem::last_write_time(path, ec);
    if (ec) return "";
    const auto age = std::filesystem::file_time_type::clock::now() - written;
    return " (written " + std::to_string(std::chrono::duration_cast<std::chrono::minutes>(age).count()) + " min ago)";
  }

  /// Reads the JSON at `path`; false if it is missing or malformed.
  static bool load(const std::string& path, roofline& out) {
    std::ifstream in(path);
    if (!in) return false;
    try {
      const auto j = nlohmann::json::parse(in);
      out.read_gbps_1t = j.at("read_gbps_1t").get<double>();
      out.read_gbps_all = j.at("read_gbps_all").get<double>();
      out.fma_gflops_1t = j.at("fma_gflops_1t").get<double>();
      out.fma_gflops_all = j.at("fma_gflops_all").get<double>();
      out.int8_gops_1t = j.value("int8_gops_1t", 0.0);
      out.int8_gops_all = j.value("int8_gops_all", 0.0);
      out.int8_instruction = j.value("int8_instruction", std::string());
      out.threads_all = j.value("threads_all", 1u);
      out.arch = j.value("arch", std::string("?"));
      out.source = path + age_note(path);
      return out.read_gbps_1t > 0 && out.read_gbps_all > 0 && out.fma_gflops_1t > 0 && out.fma_gflops_all > 0;
    } catch (const std::exception&) {
      return false;
    }
  }

  /// The limits for this process: from the JSON file if present, else
  /// measured quickly (once per process).
  static const roofline& get() {
    static const roofline instance = [] {
      roofline r;
      if (load(roofline_json_path(), r)) return r;
      return measure_quick();
    }();
    return instance;
  }
};

/// The limits of this process, also put into Google Benchmark's context
/// (`roofline` as JSON, `roofline_source`), so every output names the
/// roofline its fractions divide by. Call before RunSpecifiedBenchmarks.
inline const roofline& add_roofline_context() {
  const roofline& roof = roofline::get();
  benchmark::AddCustomContext("roofline", roof.to_json().dump());
  benchmark::AddCustomContext("roofline_source", roof.source);
  return roof;
}

}  // namespace llmkit_bench
