// SPDX-License-Identifier: MIT
// bench_search: decoding strategies on the vendored stories260K model and on
// the synthetic ~100M model (dim 768, 12 layers, 12 heads, 4 KV heads, vocab
// 32000, seeded random weights; model/synthetic.hpp).
//
// stories260K:
// - BM_plain_decode: greedy decoding (the baseline of BM_speculative).
// - BM_speculative/<drafter>/<k>: greedy speculative decoding with the
//   prompt-lookup n-gram drafter (0), the target's first 4 of 5 layers (1)
//   or its int8 copy (2); counters: acceptance alpha, tokens per target pass
//   against (1 - alpha^(k+1)) / (1 - alpha), tokens/s.
// - BM_beam/<B>/<naive>: beam search with shared paged KV blocks of 4 tokens (naive = 0),
//   or copying every beam's cache every step (naive = 1: kv::contiguous_cache,
//   whose fork allocates a buffer; naive = 2: preallocated dense slots, so
//   the baseline pays for the copies only); counters: beam tokens/s, peak KV
//   bytes, memory ratio (bytes in use / distinct tokens' bytes).
// synthetic ~100M (target weights f32; speedups against a plain greedy decode
// of the same prompts timed once per process, `plain_s_per_token`):
// - BM_synth_verify_pass/<n>: one target forward of n rows after a 64-token
//   context; counter cost_vs_step = its time / the 1-row forward's.
// - BM_synth_speculative/<drafter>/<k>: drafter 0 = n-gram, 1 = the target's
//   first 6 layers, 2 = the target with Q8_0 weights (int8 self-draft);
//   counters as above plus speedup (time per token of plain decoding / this).
// - BM_synth_beam/<B>/<naive>/<prompt>: beam search from a 512- or
//   1536-token prompt prefilled once per cache before the timed loop
//   (beam_options::prefix), 16 new tokens; naive as for BM_beam (the copying
//   baselines copy the whole context, so their cost grows with the prompt).
// Times are the benchmark's CPU time of the main thread (everything runs on
// it: LLMKIT_BENCH_THREADS unset or 1), so a loaded machine disturbs them
// less than wall time; ratios come from one run.
// LLMKIT_BENCH_SMOKE=1 shrinks the generations and the synthetic model so
// the smoke run takes seconds.
#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/kv_view.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/greedy.hpp>
#include <llmkit/search/search.hpp>
#include <llmkit/search/self_draft.hpp>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace llmkit;

namespace {
using paged16 = kv::paged_cache<float, 16>;
using paged4 = kv::paged_cache<float, 4>;

using llmkit_bench::smoke;
std::size_t n_new_tokens() { return smoke() ? 8 : 96; }

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The copying baseline without allocation: a dense cache of `max_sequences`
/// preallocated slots of `max_tokens` f32 rows (layout of
/// kv::contiguous_cache); fork copies the parent's rows into a free slot,
/// free releases the slot. So a beam search that forks every beam every step
/// pays for exactly the copies, not for allocating and zeroing buffers.
class slot_cache {
 public:
  using storage_type = float;
  slot_cache(kv::kv_shape shape, std::size_t max_sequences, std::size_t max_tokens)
      : shape_(shape), max_tokens_(max_tokens), rows_(max_sequences * slot_elements()),
        n_tokens_(max_sequences, free_slot) {}

  kv::kv_shape shape() const noexcept { return shape_; }
  std::size_t bytes_per_token() const noexcept { return 2 * shape_.n_layers * shape_.n_kv_heads * shape_.head_dim * 4; }
  std::optional<kv::seq_id> add_sequence() {
    for (std::size_t s = 0; s < n_tokens_.size(); ++s)
      if (n_tokens_[s] == free_slot) {
        n_tokens_[s] = 0;
        return static_cast<kv::seq_id>(s);
      }
    return std::nullopt;
  }
  std::optional<kv::seq_id> fork(kv::seq_id s) {
    const auto child = add_sequence();
    if (!child) return std::nullopt;
    const std::size_t n = n_tokens(s);
    for (std::size_t run = 0; run < n_runs(); ++run)
      std::copy_n(run_data(s, run), n * shape_.head_dim, run_data(*child, run));
    n_tokens_[static_cast<std::size_t>(*child)] = n;
    return child;
  }
  void free(kv::seq_id s) { n_tokens_.at(static_cast<std::size_t>(s)) = free_slot; }
  void truncate(kv::seq_id s, std::size_t n) { n_tokens_.at(static_cast<std::size_t>(s)) = n; }
  bool contains(kv::seq_id s) const noexcept {
    return s >= 0 && static_cast<std::size_t>(s) < n_tokens_.size() && n_tokens_[static_cast<std::size_t>(s)] != free_slot;
  }
  std::size_t n_tokens(kv::seq_id s) const { return n_tokens_.at(static_cast<std::size_t>(s)); }
  std::size_t n_sequences() const noexcept {
    return static_cast<std::size_t>(std::count_if(n_tokens_.begin(), n_tokens_.end(), [](std::size_t n) { return n != free_slot; }));
  }
  bool grow(kv::seq_id s, std::size_t n) {
    std::size_t& have = n_tokens_.at(static_cast<std::size_t>(s));
    if (n > max_tokens_ - have) return false;
    have += n;
    return true;
  }
  void store(kv::seq_id s, std::size_t layer, std::size_t first_token, std::span<const float> k,
             std::span<const float> v) {
    const std::size_t d = shape_.head_dim, n_new = k.size() / (shape_.n_kv_heads * d);
    for (std::size_t t = 0; t < n_new; ++t)
      for (std::size_t h = 0; h < shape_.n_kv_heads; ++h) {
        const std::size_t src = (t * shape_.n_kv_heads + h) * d;
        std::copy_n(k.data() + src, d, run_data(s, (layer * 2) * shape_.n_kv_heads + h) + (first_token + t) * d);
        std::copy_n(v.data() + src, d, run_data(s, (layer * 2 + 1) * shape_.n_kv_heads + h) + (first_token + t) * d);
      }
  }
  std::size_t n_chunks(kv::seq_id s) const { return n_tokens(s) > 0 ? 1 : 0; }
  kv::kv_chunk<float> chunk(kv::seq_id s, std::size_t layer, std::size_t kv_head, std::size_t) const {
    kv::kv_chunk<float> c;
    c.k = run_data(s, (layer * 2) * shape_.n_kv_heads + kv_head);
    c.v = run_data(s, (layer * 2 + 1) * shape_.n_kv_heads + kv_head);
    c.n_tokens = n_tokens(s);
    c.row_stride = shape_.head_dim;
    c.first_pos = 0;
    return c;
  }
  kv::cache_usage usage() const {
    kv::cache_usage u;
    u.n_sequences = n_sequences();
    u.bytes_allocated = u.bytes_in_use = u.n_sequences * max_tokens_ * bytes_per_token();
    return u;
  }

 private:
  static constexpr std::size_t free_slot = ~std::size_t{0};
  std::size_t n_runs() const noexcept { return shape_.n_layers * 2 * shape_.n_kv_heads; }
  std::size_t slot_elements() const noexcept { return n_runs() * max_tokens_ * shape_.head_dim; }
  float* run_data(kv::seq_id s, std::size_t run) {
    return rows_.data() + static_cast<std::size_t>(s) * slot_elements() + run * max_tokens_ * shape_.head_dim;
  }
  const float* run_data(kv::seq_id s, std::size_t run) const {
    return rows_.data() + static_cast<std::size_t>(s) * slot_elements() + run * max_tokens_ * shape_.head_dim;
  }
  kv::kv_shape shape_;
  std::size_t max_tokens_;
  aligned_vector<float> rows_;
  std::vector<std::size_t> n_tokens_;
};
static_assert(search::sequence_cache<slot_cache>);

/// Puts `[n] prompt` into a new sequence of `cache` (one packed forward).
template <class Model, class Cache>
kv::seq_id prefill(Model& m, Cache& cache, std::span<const std::int32_t> prompt) {
  const auto s = cache.add_sequence();
  model::batch_builder b;
  b.add(*s, prompt, 0);
  m.forward(b.view(), cache);
  return *s;
}

/// Beam search counters shared by BM_beam and BM_synth_beam.
void beam_counters(benchmark::State& state, const search::beam_result& r, std::size_t tokens) {
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["beam_tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["peak_kv_KiB"] = static_cast<double>(r.memory.peak_bytes_in_use) / 1024.0;
  state.counters["memory_ratio"] = r.memory.memory_ratio;
  state.counters["distinct_tokens_at_peak"] = static_cast<double>(r.memory.distinct_tokens_at_peak);
  state.counters["tokens_held"] = static_cast<double>(r.memory.peak_tokens_held);
  state.counters["forks"] = static_cast<double>(r.n_forks);
}

/// Beam searches of `prompt` over the benchmark's iterations, with shared blocks (naive 0) or a copying
/// baseline (naive 1, 2); `prefilled`: the prompt's K/V is computed once, before the timed loop. Returns
/// the last result and adds the beam tokens to `tokens`.
template <class Model>
search::beam_result run_beams(benchmark::State& state, Model& m, std::span<const std::int32_t> prompt, std::size_t B,
                              int naive, std::size_t n_new, bool prefilled, std::size_t& tokens) {
  const std::size_t max_len = prompt.size() + n_new + 1;
  search::beam_options opt{.beam_width = B, .stopping = search::early_stopping::never,
                           .stop = {.max_new_tokens = n_new}, .copy_all_beams = naive != 0};
  search::beam_result r;
  auto run = [&](auto& cache) {
    if (prefilled) opt.prefix = prefill(m, cache, prompt);
    for (auto _ : state) {
      r = search::beam_search(m, cache, prompt, opt);
      tokens += r.n_steps * B;
    }
  };
  if (naive == 1) {
    kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 2 * B + 2, .max_tokens = max_len});
    run(cache);
  } else if (naive == 2) {
    slot_cache cache(m.kv_shape(), 2 * B + 2, max_len);
    run(cache);
  } else {
    paged4 cache(m.kv_shape(), {.n_blocks = (B + 1) * (max_len / 4 + 2) + 1, .max_sequences = 2 * B + 2});
    run(cache);
  }
  return r;
}

// ------------------------------------------------------------------ stories260K

struct fixture {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model target{file};
  std::vector<std::byte> layers_bytes = search::self_draft_gguf(file, {.n_layers = 4});
  model::llama_model layers{model::gguf_file(layers_bytes)};
  model::llama_model int8{file, {.weight_type = model::weight_type::q8_0, .activations = model::activation_type::q8_0}};
  std::vector<std::vector<std::int32_t>> prompts;
  fixture() {
    for (const char* p : {"Once upon a time", "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
                          "The cat sat on the mat. The cat was happy. The dog", "One day, a little boy named Tim"})
      prompts.push_back(tok.encode(p, {.add_bos = true}));
  }
};
fixture& fx() {
  static fixture f;
  return f;
}

/// Weight bytes read by `passes` target passes: GB/s and, as a rate, the fraction of the one-thread read roofline.
void weight_counters(benchmark::State& state, double passes, const model::llama_model& target) {
  const double bytes = passes * static_cast<double>(target.weight_bytes_per_step());
  state.counters["weights_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["read_roofline_fraction"] =
      benchmark::Counter(bytes / 1e9 / llmkit_bench::roofline::get().read_gbps_1t, benchmark::Counter::kIsRate);
  state.counters["weights_bytes_per_token"] = bytes / static_cast<double>(state.counters["tokens"].value);
}

void speculative_counters(benchmark::State& state, const search::speculative_stats& total, std::size_t k) {
  state.counters["tokens"] = static_cast<double>(total.n_generated);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(total.n_generated), benchmark::Counter::kIsRate);
  state.counters["acceptance"] = total.acceptance_rate();
  state.counters["tokens_per_pass"] = total.tokens_per_target_pass();
  state.counters["theory_tokens_per_pass"] = search::expected_tokens_per_pass(total.acceptance_rate(), k);
  state.counters["theory_as_drafted"] = total.expected_tokens_per_pass_as_drafted();
}

void BM_plain_decode(benchmark::State& state) {
  auto& f = fx();
  paged16 cache(f.target.kv_shape(), {.n_blocks = 64, .max_sequences = 2});
  std::size_t tokens = 0, passes = 0;
  for (auto _ : state)
    for (const auto& p : f.prompts) {
      const auto r = search::generate(f.target, cache, p, sampling::processor_chain<>{}, sampling::greedy{.with_logprob = false},
                                      {.stop = {.max_new_tokens = n_new_tokens()}});
      tokens += r.tokens.size();
      passes += r.n_forward_passes;
    }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  weight_counters(state, static_cast<double>(passes), f.target);
}
BENCHMARK(BM_plain_decode)->Unit(benchmark::kMillisecond);

void BM_speculative(benchmark::State& state) {
  auto& f = fx();
  const auto which = state.range(0);
  const auto k = static_cast<std::size_t>(state.range(1));
  paged16 cache(f.target.kv_shape(), {.n_blocks = 64, .max_sequences = 2});
  model::llama_model* draft_model = which == 1 ? &f.layers : which == 2 ? &f.int8 : nullptr;
  std::unique_ptr<paged16> draft_cache;
  if (draft_model)
    draft_cache = std::make_unique<paged16>(draft_model->kv_shape(), kv::paged_cache_options{.n_blocks = 64, .max_sequences = 2});
  search::speculative_stats total;
  for (auto _ : state)
    for (const auto& p : f.prompts) {
      const search::speculative_options opt{.stop = {.max_new_tokens = n_new_tokens()}, .draft_length = k};
      search::speculative_result r;
      if (draft_model) {
        search::model_drafter d(*draft_model, *draft_cache);
        r = search::speculative_generate(f.target, cache, d, p, opt);
      } else {
        search::ngram_drafter d;
        r = search::speculative_generate(f.target, cache, d, p, opt);
      }
      total += r.stats;
    }
  state.SetLabel(which == 0 ? "ngram" : which == 1 ? "layers4" : "int8");
  speculative_counters(state, total, k);
  weight_counters(state, static_cast<double>(total.n_rounds), f.target);
}
BENCHMARK(BM_speculative)
    ->ArgsProduct({{0, 1, 2}, {1, 2, 4, 8}})
    ->ArgNames({"drafter", "k"})
    ->Unit(benchmark::kMillisecond);

void BM_beam(benchmark::State& state) {
  auto& f = fx();
  const auto B = static_cast<std::size_t>(state.range(0));
  const int naive = static_cast<int>(state.range(1));
  const std::size_t n_new = smoke() ? 6 : 48;
  std::size_t tokens = 0;
  const auto r = run_beams(state, f.target, f.prompts[1], B, naive, n_new, false, tokens);
  beam_counters(state, r, tokens);
}
BENCHMARK(BM_beam)->ArgsProduct({{1, 4, 16}, {0, 1, 2}})->ArgNames({"B", "naive"})->Unit(benchmark::kMillisecond);

// ------------------------------------------------------------------ synthetic ~100M

struct synth_fixture {
  std::vector<std::byte> bytes;
  std::unique_ptr<model::gguf_file> file;
  std::unique_ptr<model::llama_model> target, layers, int8;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::int32_t> long_prompt;
  std::size_t n_new = 0;
  double plain_s_per_token = 0.0;  // CPU seconds per generated token of plain greedy decoding
  synth_fixture() {
    model::llama_config c = model::synthetic_100m_config();
    if (smoke()) {
      c.n_vocab = 512;
      c.dim = 64;
      c.n_layers = 3;
      c.n_heads = 4;
      c.n_kv_heads = 2;
      c.head_dim = 16;
      c.ffn_dim = 128;
      c.rope.rotary_dim = 16;
    }
    bytes = model::synthetic_llama({.config = c, .weight_type = model::ggml_type::f16, .seed = 1}).bytes();
    file = std::make_unique<model::gguf_file>(bytes);
    target = std::make_unique<model::llama_model>(*file, model::llama_options{.weight_type = model::weight_type::f32});
    int8 = std::make_unique<model::llama_model>(
        *file, model::llama_options{.weight_type = model::weight_type::q8_0, .activations = model::activation_type::q8_0});
    const auto layer_bytes = search::self_draft_gguf(*file, {.n_layers = std::max<std::size_t>(1, c.n_layers / 2)});
    layers = std::make_unique<model::llama_model>(model::gguf_file(layer_bytes),
                                                  model::llama_options{.weight_type = model::weight_type::f32});
    const auto vocab = static_cast<std::int32_t>(c.n_vocab);
    for (std::int32_t p = 0; p < 2; ++p) {
      std::vector<std::int32_t> prompt{1};
      for (std::int32_t i = 0; i < 7; ++i) prompt.push_back(3 + (p * 977 + i * 131) % (vocab - 3));
      prompts.push_back(std::move(prompt));
    }
    long_prompt.push_back(1);
    for (std::int32_t i = 0; long_prompt.size() < (smoke() ? 40u : 1536u); ++i) long_prompt.push_back(3 + (i * 613) % (vocab - 3));
    n_new = smoke() ? 6 : 32;
    // The plain baseline, timed once.
    paged16 cache(target->kv_shape(), {.n_blocks = 64, .max_sequences = 2});
    std::size_t tokens = 0;
    const double t0 = cpu_seconds();
    for (const auto& p : prompts)
      tokens += search::generate(*target, cache, p, sampling::processor_chain<>{}, sampling::greedy{.with_logprob = false},
                                 {.stop = {.max_new_tokens = n_new}})
                    .tokens.size();
    plain_s_per_token = (cpu_seconds() - t0) / static_cast<double>(tokens);
  }
};
synth_fixture& sfx() {
  static synth_fixture f;
  return f;
}

void BM_synth_verify_pass(benchmark::State& state) {
  auto& f = sfx();
  const auto n = static_cast<std::size_t>(state.range(0));
  paged16 cache(f.target->kv_shape(), {.n_blocks = 16, .max_sequences = 2});
  std::vector<std::int32_t> context(64), rows(n);
  for (std::size_t i = 0; i < context.size(); ++i) context[i] = static_cast<std::int32_t>(3 + i * 7);
  for (std::size_t i = 0; i < n; ++i) rows[i] = static_cast<std::int32_t>(5 + i * 11);
  const kv::seq_id s = prefill(*f.target, cache, context);
  model::batch_builder b;
  b.add(s, rows, static_cast<std::int32_t>(context.size()), model::last_logits::skip);
  for (std::size_t r = 0; r < n; ++r) b.request_logits(static_cast<std::int32_t>(r));
  model::batch_builder one;
  one.add(s, std::span<const std::int32_t>(rows).first(1), static_cast<std::int32_t>(context.size()));
  auto pass = [&](const model::batch_builder& batch) {
    f.target->forward(batch.view(), cache);
    cache.truncate(s, context.size());
  };
  pass(one);  // warm
  double step = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = cpu_seconds();
    pass(one);
    step += (cpu_seconds() - t0) / 3.0;
  }
  double seconds = 0.0;
  for (auto _ : state) {
    const double t0 = cpu_seconds();
    pass(b);
    seconds += cpu_seconds() - t0;
  }
  state.counters["rows"] = static_cast<double>(n);
  state.counters["cost_vs_step"] = seconds / static_cast<double>(state.iterations()) / step;
  state.counters["weights_GBps"] = benchmark::Counter(static_cast<double>(f.target->weight_bytes_per_step()) / 1e9,
                                                      benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_synth_verify_pass)->DenseRange(1, 9)->ArgName("rows")->Unit(benchmark::kMillisecond);

void BM_synth_speculative(benchmark::State& state) {
  auto& f = sfx();
  const auto which = state.range(0);
  const auto k = static_cast<std::size_t>(state.range(1));
  paged16 cache(f.target->kv_shape(), {.n_blocks = 64, .max_sequences = 2});
  model::llama_model* draft_model = which == 1 ? f.layers.get() : which == 2 ? f.int8.get() : nullptr;
  std::unique_ptr<paged16> draft_cache;
  if (draft_model)
    draft_cache = std::make_unique<paged16>(draft_model->kv_shape(), kv::paged_cache_options{.n_blocks = 64, .max_sequences = 2});
  search::speculative_stats total;
  double seconds = 0.0;
  for (auto _ : state) {
    const double t0 = cpu_seconds();
    for (const auto& p : f.prompts) {
      const search::speculative_options opt{.stop = {.max_new_tokens = f.n_new}, .draft_length = k};
      search::speculative_result r;
      if (draft_model) {
        search::model_drafter d(*draft_model, *draft_cache);
        r = search::speculative_generate(*f.target, cache, d, p, opt);
      } else {
        search::ngram_drafter d;
        r = search::speculative_generate(*f.target, cache, d, p, opt);
      }
      total += r.stats;
    }
    seconds += cpu_seconds() - t0;
  }
  state.SetLabel(which == 0 ? "ngram" : which == 1 ? "layers-half" : "int8");
  speculative_counters(state, total, k);
  state.counters["speedup"] = f.plain_s_per_token / (seconds / static_cast<double>(total.n_generated));
  state.counters["plain_tokens_per_s"] = 1.0 / f.plain_s_per_token;
}
BENCHMARK(BM_synth_speculative)
    ->ArgsProduct({{0, 1, 2}, {1, 2, 3, 4, 5, 6, 7, 8}})
    ->ArgNames({"drafter", "k"})
    ->Unit(benchmark::kMillisecond);

void BM_synth_beam(benchmark::State& state) {
  auto& f = sfx();
  const auto B = static_cast<std::size_t>(state.range(0));
  const int naive = static_cast<int>(state.range(1));
  const std::size_t prompt_len = std::min(static_cast<std::size_t>(state.range(2)), f.long_prompt.size());
  std::size_t tokens = 0;
  const auto r = run_beams(state, *f.target, std::span<const std::int32_t>(f.long_prompt).first(prompt_len), B, naive,
                           smoke() ? 4 : 16, true, tokens);
  beam_counters(state, r, tokens);
}
BENCHMARK(BM_synth_beam)
    ->ArgsProduct({{1, 4, 16}, {0, 1, 2}, {512, 1536}})
    ->ArgNames({"B", "naive", "prompt"})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
