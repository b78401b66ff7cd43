// SPDX-License-Identifier: MIT
// bench_roofline: this machine's limits, the denominators of every
// "fraction of roofline" figure the other benches print.
//
//   read_bw/threads:T   sustained read bandwidth of T threads streaming a
//                       2 GiB buffer in all, GB/s: far beyond the caches
//                       (the VM these figures come from reports a 480 MiB
//                       L3, which a 64 MiB buffer fits in and reads at about
//                       twice the DRAM rate), in transparent huge pages as
//                       every big llmkit::aligned_vector is (4 KiB pages
//                       stream about a third slower here)
//   fma_peak/threads:T  peak fp32 FMA rate of T threads, 16 independent
//                       vector FMA chains each, GFLOP/s
//   int8_peak/threads:T peak int8 dot-product rate of T threads, 16 chains
//                       of the widest int8 multiply-add the build has
//                       (VPDPBUSD zmm or ymm, else VPMADDUBSW + VPMADDWD),
//                       GOP/s counting 2 per multiply-add (as an FMA is 2
//                       flops)
//
// After the run the figures (best of the repetitions) are written as JSON to
// $LLMKIT_ROOFLINE_JSON or <source dir>/build/roofline.json, which
// bench/roofline.hpp and llmkit-serve read. With LLMKIT_BENCH_SMOKE=1 the
// sizes shrink and nothing is written (the figures would be meaningless).
// --short (what `make test` runs, a few seconds) keeps the sizes but repeats
// each measurement once instead of five times, and writes the file only when
// there is none, so a full run's figures stay.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "roofline.hpp"

namespace {

using llmkit_bench::smoke;

unsigned all_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

std::size_t read_bytes() { return smoke() ? std::size_t{8} << 20 : std::size_t{2} << 30; }


// Best figure per benchmark name, filled by the benchmarks themselves.
std::map<std::string, double>& best() {
  static std::map<std::string, double> m;
  return m;
}

void BM_read_bw(benchmark::State& state, unsigned n_threads, int repeats) {
  double gbps = 0.0;
  for (auto _ : state) {
    gbps = llmkit_bench::measure_read_gbps(n_threads, read_bytes(), repeats);
    benchmark::DoNotOptimize(gbps);
  }
  state.counters["GB/s"] = gbps;
  state.counters["threads"] = n_threads;
  auto& b = best()["read_" + std::to_string(n_threads)];
  b = std::max(b, gbps);
}

// A peak figure: `measure(n_threads, iterations, repeats)` in `unit`, kept as best()[key_threads].
template <class Measure>
void bm_peak(benchmark::State& state, Measure measure, const char* unit, const char* key, unsigned n_threads,
             int repeats) {
  double rate = 0.0;
  for (auto _ : state) {
    rate = measure(n_threads, smoke() ? 10'000 : 20'000'000, repeats);
    benchmark::DoNotOptimize(rate);
  }
  state.counters[unit] = rate;
  state.counters["threads"] = n_threads;
  auto& b = best()[std::string(key) + "_" + std::to_string(n_threads)];
  b = std::max(b, rate);
}

void BM_fma_peak(benchmark::State& state, unsigned n_threads, int repeats) {
  bm_peak(state, llmkit_bench::measure_fma_gflops, "GFLOP/s", "fma", n_threads, repeats);
}

void BM_int8_peak(benchmark::State& state, unsigned n_threads, int repeats) {
  state.SetLabel(llmkit_bench::detail::int8_instruction());
  bm_peak(state, llmkit_bench::measure_int8_gops, "GOP/s", "int8", n_threads, repeats);
}

// repeats: measurements per figure, the best kept.
void register_all(int repeats) {
  for (unsigned t : {1u, all_threads()}) {
    benchmark::RegisterBenchmark(("read_bw/threads:" + std::to_string(t)).c_str(), BM_read_bw, t, repeats)
        ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("fma_peak/threads:" + std::to_string(t)).c_str(), BM_fma_peak, t, repeats)
        ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("int8_peak/threads:" + std::to_string(t)).c_str(), BM_int8_peak, t, repeats)
        ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
    if (all_threads() == 1) break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool short_run = false;  // --short: one measurement per figure instead of five
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--short") {
      short_run = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  std::printf("bench_roofline  arch: %s  hardware threads: %u\n",
              llmkit::simd::arch_name<llmkit::simd::default_arch>(), all_threads());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all(smoke() || short_run ? 1 : 5);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  llmkit_bench::roofline r;
  r.threads_all = all_threads();
  r.read_gbps_1t = best()["read_1"];
  r.read_gbps_all = best()["read_" + std::to_string(all_threads())];
  r.fma_gflops_1t = best()["fma_1"];
  r.fma_gflops_all = best()["fma_" + std::to_string(all_threads())];
  r.int8_gops_1t = best()["int8_1"];
  r.int8_gops_all = best()["int8_" + std::to_string(all_threads())];
  r.int8_instruction = llmkit_bench::detail::int8_instruction();
  r.arch = llmkit::simd::arch_name<llmkit::simd::default_arch>();
  std::printf("roofline: read %.1f GB/s (1 thread), %.1f GB/s (%u threads); fma %.1f GFLOP/s (1 thread), %.1f GFLOP/s (%u threads); "
              "int8 %.1f GOP/s (1 thread), %.1f GOP/s (%u threads, %s)\n",
              r.read_gbps_1t, r.read_gbps_all, r.threads_all, r.fma_gflops_1t, r.fma_gflops_all, r.threads_all,
              r.int8_gops_1t, r.int8_gops_all, r.threads_all, r.int8_instruction.c_str());
  if (smoke()) {
    std::printf("smoke run: %s not written\n", llmkit_bench::roofline_json_path().c_str());
    return 0;
  }
  if (r.read_gbps_1t <= 0 || r.fma_gflops_1t <= 0) {
    std::printf("a benchmark was filtered out: %s not written\n", llmkit_bench::roofline_json_path().c_str());
    return 0;
  }
  const std::string path = llmkit_bench::roofline_json_path();
  std::error_code ec;
  if (short_run && std::filesystem::exists(path, ec)) {
    std::printf("short run: %s exists, kept\n", path.c_str());
    return 0;
  }
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  out << r.to_json().dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
