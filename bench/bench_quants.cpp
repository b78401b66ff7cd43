// SPDX-License-Identifier: MIT
// bench_quants: one product per weight format, W [5632, 2048] (TinyLlama's
// FFN shape) times one token (a decode step) or 128 tokens (a prefill), on
// one thread, timed by the thread's CPU time.
//
//   decode/<format>/<f32|q8>   one token, cycling through copies of W
//                              (>= 1 GiB) so every call reads W from DRAM:
//                              bytes_per_second and GBps of W read,
//                              frac_read_roof (over the roofline's one-thread
//                              read bandwidth), Gweights (per second)
//   prefill/<format>/<f32|q8>  128 tokens over one W: Gweights (weights
//                              times tokens per second); q8: frac_int8_roof
//                              (2 operations per weight and token over the
//                              roofline's one-thread int8 peak)
//
// f32: the exact product (f32 activations times the decoded weights,
// model/detail/matmul_blocks.hpp), the baseline; q8: activations rounded to
// int8 (activation_type::q8_0: model/detail/matmul_q8.hpp,
// matmul_blocks32_vnni.hpp, matmul_kquants_vnni.hpp, matmul_blocks_q8.hpp).
// The dot-product kernels live in model/, not in simd/, and this file is
// compiled with auto-vectorisation on (bench_simd turns it off for its
// scalar baselines, which would slow the exact decoders here).
// LLMKIT_BENCH_SMOKE=1 shrinks W to [256, 512].
#include <benchmark/benchmark.h>

#include <llmkit/core/executor.hpp>
#include <llmkit/model/weights.hpp>

#include <chrono>
#include <cstddef>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "roofline.hpp"

namespace {

using namespace llmkit;
using llmkit_bench::smoke;

std::size_t rows() { return smoke() ? 256 : 5632; }
std::size_t cols() { return smoke() ? 512 : 2048; }

/// `copies` copies of one random W of format t (one when copies == 0).
const std::vector<std::unique_ptr<model::weight_matrix>>& matrices(model::weight_type t, std::size_t copies) {
  static std::vector<std::unique_ptr<model::weight_matrix>> cache[std::size(model::all_weight_types)];
  auto& v = cache[static_cast<std::size_t>(t)];
  if (v.empty()) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    auto w = std::make_unique<model::weight_matrix>(t, rows(), cols());
    std::vector<float> row(cols());
    for (std::size_t r = 0; r < rows(); ++r) {
      for (auto& x : row) x = normal(rng);
      w->set_row(r, row);
    }
    v.push_back(std::move(w));
  }
  while (v.size() < copies) v.push_back(std::make_unique<model::weight_matrix>(*v.front()));
  return v;
}

std::vector<float> activations(std::size_t n) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n * cols());
  for (auto& v : x) v = normal(rng);
  return x;
}

void bm_decode(benchmark::State& state, model::weight_type t, model::activation_type act) {
  const std::size_t bytes = matrices(t, 1).front()->bytes();
  const std::size_t copies = smoke() ? 1 : ((std::size_t{1} << 30) + bytes - 1) / bytes;
  const auto& ws = matrices(t, copies);
  const auto x = activations(1);
  std::vector<float> y(rows());
  serial_executor serial;
  std::size_t i = 0;
  const double start = llmkit_bench::thread_cpu_seconds();
  for (auto _ : state) {
    model::linear(serial, x, 1, *ws[i++ % ws.size()], y, rows(), model::output_mode::overwrite, act);
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = llmkit_bench::thread_cpu_seconds() - start;
  const double calls = double(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(calls * double(bytes)));
  state.counters["GBps"] = calls * double(bytes) * 1e-9 / seconds;
  state.counters["Gweights"] = calls * double(rows() * cols()) * 1e-9 / seconds;
  state.counters["frac_read_roof"] = calls * double(bytes) * 1e-9 / seconds / llmkit_bench::roofline::get().read_gbps(1);
  state.counters["copies"] = double(copies);
}

void bm_prefill(benchmark::State& state, model::weight_type t, model::activation_type act) {
  constexpr std::size_t tokens = 128;
  const auto& w = *matrices(t, 1).front();
  const auto x = activations(tokens);
  std::vector<float> y(tokens * rows());
  serial_executor serial;
  const double start = llmkit_bench::thread_cpu_seconds();
  for (auto _ : state) {
    model::linear(serial, x, tokens, w, y, rows(), model::output_mode::overwrite, act);
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = llmkit_bench::thread_cpu_seconds() - start;
  const double gweights = double(state.iterations()) * double(tokens * rows() * cols()) * 1e-9 / seconds;
  state.counters["Gweights"] = gweights;
  // Two operations per weight and token, against the int8 dot-product roof.
  if (act == model::activation_type::q8_0 && llmkit_bench::roofline::get().int8_gops(1) > 0)
    state.counters["frac_int8_roof"] = 2 * gweights / llmkit_bench::roofline::get().int8_gops(1);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  using model::weight_type;
  for (const weight_type t : {weight_type::q8_0, weight_type::q4_0, weight_type::q4_1, weight_type::q5_0,
                              weight_type::q5_1, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k,
                              weight_type::q2_k, weight_type::q3_k, weight_type::iq4_nl, weight_type::iq4_xs,
                              weight_type::mxfp4})
    for (const auto act : {model::activation_type::f32, model::activation_type::q8_0}) {
      const std::string suffix =
          std::string(model::weight_type_name(t)) + (act == model::activation_type::f32 ? "/f32" : "/q8");
      benchmark::RegisterBenchmark(("decode/" + suffix).c_str(), [=](benchmark::State& s) { bm_decode(s, t, act); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("prefill/" + suffix).c_str(), [=](benchmark::State& s) { bm_prefill(s, t, act); })
          ->Unit(benchmark::kMillisecond);
    }
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
