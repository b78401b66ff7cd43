// SPDX-License-Identifier: MIT
// llmkit-prepack: prefill the same prompts three ways -- padded batching,
// length-sorted padded batching, and prepacked rows (bin-packed, ragged, each
// prompt's K/V written straight into its own cache sequence) -- on a real
// model, and print time, padding ratio, peak activation memory and the
// largest batch that fits a memory budget for each prompt-length
// distribution. Peak activation memory is measured: every heap allocation
// of the program is counted (a replaced global operator new), and each
// method runs in a fresh thread on a freshly loaded model, so the peak of
// live bytes during its forward passes, minus what was live before the
// first, is the model's workspace plus the attention kernels' per-thread
// scratch plus anything transient.
//
//   llmkit-prepack                                  # stories260K, all distributions
//   llmkit-prepack --distribution lognormal --json  # one JSON object per row
//   llmkit-prepack --model synthetic --n-prompts 16 # the synthetic ~100M model
//   llmkit-prepack --distribution mixed             # mostly short prompts, a few at the context
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/pack/length_distribution.hpp>
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>
#include <llmkit/pack/padded_batch.hpp>
#include <llmkit/pack/prefill.hpp>

#include "example_cli.hpp"

#include <nlohmann/json.hpp>

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <new>
#include <string>
#include <thread>
#include <vector>

// ---- counting allocator ----------------------------------------------------
// Every operator new of the program goes through here (llmkit's
// aligned_allocator calls the aligned form), so live and peak heap bytes are
// known at any time. Sizes are malloc_usable_size, the bytes actually held.

namespace {
std::atomic<std::size_t> live_bytes{0}, peak_bytes{0};

void note_alloc(void* p) noexcept {
  const std::size_t now = live_bytes.fetch_add(malloc_usable_size(p), std::memory_order_relaxed) + malloc_usable_size(p);
  std::size_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void* counted_alloc(std::size_t n, std::size_t alignment) {
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(n == 0 ? 1 : n);
  } else if (::posix_memalign(&p, alignment, n == 0 ? alignment : n) != 0) {
    p = nullptr;
  }
  if (p == nullptr) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  live_bytes.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, 0); }
void* operator new[](std::size_t n) { return counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

namespace {

using namespace llmkit;

/// Process CPU time in seconds. The forward runs on one thread by default,
/// and on a shared machine CPU time is far steadier than wall time (other
/// processes steal the core, not the work); with --threads > 1 it sums the
/// threads' time, so use --wall there.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct options {
  std::string model = "stories";
  std::string distribution = "all";
  std::size_t n_prompts = 128;
  std::size_t batch_size = 16;
  std::string packer = "ffd";
  std::string capacity = "padded-peak";
  double budget_mib = 0;
  std::size_t repeats = 3;
  std::size_t threads = 1;
  std::uint64_t seed = 2404;
  double long_fraction = 1.0 / 16.0;
  std::size_t short_max = 64;
  std::size_t long_length = 0;
  bool json = false;
  bool progress = true;
  bool wall = false;
  double now() const { return wall ? wall_seconds() : cpu_seconds(); }
};

/// Activation bytes of llama_model::forward for a call of n tokens and
/// n_logits logits: its workspace (x, xn, qkv, q, k, v, attention output,
/// gate|up, hidden, logits; see llama_model::reserve) plus one attention score
/// row group per thread. The measured figure (counting allocator) is what
/// the tables report; this one is the cross-check.
std::size_t activation_bytes(const model::llama_config& c, std::size_t n, std::size_t n_logits,
                             std::size_t longest_sequence) {
  const std::size_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const std::size_t per_token = c.dim + (qd + 2 * kvd) + qd + 2 * kvd + qd + 3 * c.ffn_dim;
  const std::size_t scores = (c.n_heads / c.n_kv_heads) * longest_sequence;
  return sizeof(float) * (n * per_token + std::max(n, n_logits) * c.dim + n_logits * c.n_vocab + scores);
}

struct method_result {
  double seconds = 0;                   // forwards, plus packing and building the rows for prepacked
  double prepare_seconds = 0;           // packing and building the rows (prepacked)
  std::size_t n_forwards = 0;
  std::size_t slots = 0;                // tokens computed, pads included
  std::size_t largest_forward = 0;      // tokens of the largest forward
  std::size_t peak_activation = 0;      // bytes, measured: peak live heap bytes during the forwards
  std::size_t computed_activation = 0;  // bytes, activation_bytes() of the largest forward
  std::size_t first_forward_bytes = 0;  // bytes, measured during the first forward (fresh workspace)
  std::size_t first_forward_tokens = 0;
  /// Measured activation bytes per token of one forward from a fresh
  /// workspace: the first forward's peak over its tokens (later forwards
  /// can add the workspace's regrowth, old and new buffers live at once).
  double bytes_per_token() const {
    return double(first_forward_bytes) / double(std::max<std::size_t>(first_forward_tokens, 1));
  }
};

class progress_bar {
 public:
  progress_bar(bool enabled, std::size_t total, std::string label)
      : enabled_(enabled), total_(std::max<std::size_t>(total, 1)), label_(std::move(label)) {}
  void tick() {
    ++done_;
    if (!enabled_) return;
    const std::size_t width = 30, filled = done_ * width / total_;
    std::fprintf(stderr, "\r%-40s [%s%s] %zu/%zu", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done_, total_);
    if (done_ == total_) std::fprintf(stderr, "\r%*s\r", 80, "");
  }

 private:
  bool enabled_;
  std::size_t total_, done_ = 0;
  std::string label_;
};

struct runner {
  std::string path;  // the model file: every run loads a fresh model (empty workspace)
  const options& opt;

  // Runs rows through a freshly loaded model, in a fresh thread (so the
  // attention kernels' thread-local scratch starts empty too), into fresh
  // sequences of a paged cache. Times only the forward passes; measures the
  // peak of live heap bytes during them over what was live before.
  template <class Row>
  method_result run(const std::vector<Row>& rows, std::size_t n_requests, std::size_t longest, progress_bar& bar) {
    method_result result;
    std::exception_ptr failure;
    std::thread worker([&] {
      try {
        result = run_here(rows, n_requests, longest, bar);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    worker.join();
    if (failure) std::rethrow_exception(failure);
    return result;
  }

  template <class Row>
  method_result run_here(const std::vector<Row>& rows, std::size_t n_requests, std::size_t longest,
                         progress_bar& bar) {
    model::llama_model model = model::llama_model::load(path);
    thread_pool pool(opt.threads);
    const auto& c = model.config();
    std::size_t total_slots = 0;
    for (const auto& r : rows) total_slots += r.token_ids.size();
    constexpr std::size_t block = 16;
    const std::size_t n_blocks = total_slots / block + n_requests * 2 + 8;
    kv::paged_cache<float, block> cache(model.kv_shape(), {.n_blocks = n_blocks, .max_sequences = n_requests});
    // Rows name sequences by request index: the fresh cache hands out 0, 1, ...
    for (std::size_t q = 0; q < n_requests; ++q) {
      const auto seq = cache.add_sequence();
      LLMKIT_CHECK(seq && *seq == static_cast<kv::seq_id>(q), "llmkit-prepack: unexpected cache sequence id");
    }
    std::vector<float> logits(n_requests * model.vocab_size());
    method_result result;
    const std::size_t before = live_bytes.load();
    auto forward = [&](const Row& row) {
      bar.tick();
      ++result.n_forwards;
      result.slots += row.token_ids.size();
      result.largest_forward = std::max(result.largest_forward, row.token_ids.size());
      result.computed_activation = std::max(
          result.computed_activation, activation_bytes(c, row.token_ids.size(), row.logit_rows.size(), longest));
      const auto out =
          model.forward(model::batch{row.token_ids, row.positions, row.seq_ids, row.logit_rows}, cache, pool);
      if (result.n_forwards == 1) {
        result.first_forward_bytes = peak_bytes.load() - before;
        result.first_forward_tokens = row.token_ids.size();
      }
      return out;
    };
    peak_bytes.store(before);
    const double start = opt.now();
    pack::run_prefill(std::span<const Row>(rows), forward,
                      matrix_view<float>(logits.data(), n_requests, model.vocab_size()));
    result.seconds = opt.now() - start;
    result.peak_activation = peak_bytes.load() - before;
    return result;
  }
};

std::size_t max_batch_padded(const std::vector<std::size_t>& lengths, std::size_t token_budget) {
  std::size_t longest = 0;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    longest = std::max(longest, lengths[k]);
    if ((k + 1) * longest > token_budget) return k;
  }
  return lengths.size();
}
std::size_t max_batch_prepacked(const std::vector<std::size_t>& lengths, std::size_t token_budget) {
  std::size_t sum = 0;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    sum += lengths[k];
    if (sum > token_budget) return k;
  }
  return lengths.size();
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  llmkit_examples::command_line cli{"Prefill time and memory of padded, length-sorted and prepacked batching"};
  cli.show_defaults();
  cli.add_option("--model", opt.model, "stories (the vendored stories260K), synthetic (~100M, written to /tmp once), or a GGUF path");
  cli.add_option("--distribution", opt.distribution, "uniform | lognormal | constant | mixed | all")
      .one_of({"uniform", "lognormal", "constant", "mixed", "all"});
  cli.add_option("--long-fraction", opt.long_fraction, "mixed: fraction of long prompts").in_range(0.0, 1.0);
  cli.add_option("--short-max", opt.short_max, "mixed: short prompts are uniform[8, short-max]").in_range(8, 1 << 24);
  cli.add_option("--long-length", opt.long_length, "mixed: length of the long prompts (0 = the context)");
  cli.add_option("--n-prompts", opt.n_prompts, "prompts per distribution").count_at_least(1, "no prompt to prefill");
  cli.add_option("--batch-size", opt.batch_size, "prompts per padded batch").count_at_least(1, "a batch holds at least one prompt");
  cli.add_option("--packer", opt.packer, "ffd | bfd | next_fit | online_ff");
  cli.add_option("--capacity", opt.capacity,
                 "prepacked row capacity: padded-peak (the largest padded batch's slots: no more memory than padding), "
                 "longest (the paper's choice), or a token count");
  cli.add_option("--budget-mib", opt.budget_mib, "activation memory budget for the max-batch columns (0 = batch-size x context tokens)");
  cli.add_option("--repeats", opt.repeats, "runs per method; the fastest is reported").count_at_least(1, "nothing to report");
  cli.add_option("--threads", opt.threads, "threads of the forward pass")
      .count_at_least(1, "the forward pass needs a thread");
  cli.add_option("--seed", opt.seed, "seed of prompt lengths and tokens");
  cli.add_flag("--json", opt.json, "one JSON object per row on stdout");
  cli.add_flag("!--no-progress", opt.progress, "no progress bar on stderr (there is none unless stderr is a terminal)");
  cli.add_flag("--wall", opt.wall, "time with the wall clock instead of process CPU time");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  const bool bars = opt.progress && llmkit_examples::stderr_is_terminal();

  try {
    std::string path = opt.model, model_name = opt.model;
    if (opt.model == "stories") {
      path = LLMKIT_DEFAULT_MODEL;
      model_name = "stories260K";
    } else if (opt.model == "synthetic") {
      path = (std::filesystem::temp_directory_path() / "llmkit-synthetic-100m.gguf").string();
      model_name = "synthetic-100M";
      if (!std::filesystem::exists(path)) {
        if (opt.progress) std::fprintf(stderr, "writing %s ...\n", path.c_str());
        model::write_synthetic_llama(path, {.config = model::synthetic_100m_config(), .weight_type = model::ggml_type::f16, .seed = 1});
      }
    }
    const model::llama_config config = model::llama_config::from_gguf(model::gguf_file::open(path));
    runner run{path, opt};
    const pack::packer packer = pack::packer_from_name(opt.packer);
    const std::size_t context = std::min<std::size_t>(config.context_length, 2048);

    std::vector<pack::length_shape> shapes;
    for (auto s : {pack::length_shape::uniform, pack::length_shape::lognormal, pack::length_shape::constant,
                   pack::length_shape::mixed})
      if (opt.distribution == "all" || opt.distribution == pack::length_shape_name(s)) shapes.push_back(s);

    if (!opt.json)
      std::printf("model %s (dim %zu, %zu layers, vocab %zu, context %zu), %zu prompts, padded batch %zu, packer %s, "
                  "%zu thread(s), best of %zu, %s time\n\n"
                  "%-10s %7s %8s %8s | %9s %9s %9s | %7s %7s | %9s %9s %9s | %7s %7s\n",
                  model_name.c_str(), config.dim, config.n_layers, config.n_vocab, context, opt.n_prompts,
                  opt.batch_size, opt.packer.c_str(), opt.threads, opt.repeats, opt.wall ? "wall" : "CPU", "dist", "meanlen", "pad_rat",
                  "sort_rat", "t_pad_ms", "t_sort_ms", "t_pack_ms", "x_pad", "x_sort", "mem_pad", "mem_sort",
                  "mem_pack", "B_pad", "B_pack");

    for (const auto shape : shapes) {
      const pack::length_distribution dist{.shape = shape, .min_length = 8, .max_length = std::min<std::size_t>(512, context),
                                           .median = 60, .p99 = 1000, .constant = 128,
                                           .long_fraction = opt.long_fraction, .short_max = opt.short_max};
      pack::length_distribution capped = dist;
      if (shape == pack::length_shape::lognormal) capped.max_length = context;
      if (shape == pack::length_shape::mixed) capped.max_length = opt.long_length > 0 ? std::min(opt.long_length, context) : context;
      const auto lengths = pack::sample_lengths(capped, opt.n_prompts, opt.seed);
      std::mt19937_64 rng(opt.seed + 1);
      std::vector<std::vector<llmkit::token_id>> prompts(lengths.size());
      for (std::size_t q = 0; q < prompts.size(); ++q) {
        prompts[q].resize(lengths[q]);
        prompts[q][0] = 1;
        for (std::size_t t = 1; t < lengths[q]; ++t)
          prompts[q][t] = static_cast<llmkit::token_id>(3 + rng() % (config.n_vocab - 3));
      }
      std::size_t real = 0, longest = 0;
      for (std::size_t l : lengths) {
        real += l;
        longest = std::max(longest, l);
      }

      const auto padded = pack::make_padded_batches(prompts, opt.batch_size, pack::batch_order::request);
      const auto sorted = pack::make_padded_batches(prompts, opt.batch_size, pack::batch_order::by_length);
      std::size_t padded_peak = 0;
      for (const auto& b : padded) padded_peak = std::max(padded_peak, b.n_slots());
      std::size_t capacity = 0;
      if (opt.capacity == "padded-peak") {
        capacity = padded_peak;
      } else if (opt.capacity == "longest") {
        capacity = longest;
      } else {
        std::size_t used = 0;
        try {
          capacity = std::stoul(opt.capacity, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        LLMKIT_CHECK(used == opt.capacity.size() && capacity > 0, "--capacity must be padded-peak, longest or a "
                     "positive token count, got \"", opt.capacity, "\"");
      }

      method_result best_pad, best_sort, best_pack;
      const auto better = [](method_result& best, const method_result& r) {
        if (best.n_forwards == 0 || r.seconds < best.seconds) best = r;
      };
      for (std::size_t rep = 0; rep < opt.repeats; ++rep) {
        const std::string tag = std::string(pack::length_shape_name(shape)) + " " + std::to_string(rep + 1) + "/" +
                                std::to_string(opt.repeats);
        {
          progress_bar bar(bars, padded.size(), "padded " + tag);
          better(best_pad, run.run(padded, prompts.size(), longest, bar));
        }
        {
          progress_bar bar(bars, sorted.size(), "sorted " + tag);
          better(best_sort, run.run(sorted, prompts.size(), longest, bar));
        }
        {
          // Packing and building the rows are part of the method: timed.
          const double start = opt.now();
          const auto layout = pack::pack_items(lengths, packer, {.capacity = capacity, .split_oversized = true});
          const auto batch = pack::build_packed_batch(prompts, layout);
          const double prep = opt.now() - start;
          progress_bar bar(bars, batch.n_rows(), "prepacked " + tag);
          auto r = run.run(batch.rows, prompts.size(), longest, bar);
          r.seconds += prep;
          r.prepare_seconds = prep;
          better(best_pack, r);
        }
      }

      // Largest batch in a fixed activation budget (default: what the
      // formula gives for a padded batch of batch-size prompts at the
      // context length): prefixes of a large sample of the same
      // distribution, each method at its own measured bytes per token of a
      // forward from a fresh workspace. Padded needs k x longest slots,
      // prepacked the sum of the lengths.
      const std::size_t formula_per_token = activation_bytes(config, 1, 0, 0);
      const std::size_t budget = opt.budget_mib > 0 ? static_cast<std::size_t>(opt.budget_mib * 1048576.0)
                                                    : opt.batch_size * context * formula_per_token;
      const auto per_token = [](const method_result& r) { return r.bytes_per_token(); };
      const auto many = pack::sample_lengths(capped, 100000, opt.seed + 7);
      const std::size_t b_pad = max_batch_padded(many, static_cast<std::size_t>(double(budget) / per_token(best_pad)));
      const std::size_t b_pack =
          max_batch_prepacked(many, static_cast<std::size_t>(double(budget) / per_token(best_pack)));

      const double pad_ratio = pack::padding_ratio(padded), sort_ratio = pack::padding_ratio(sorted);
      const double x_pad = best_pad.seconds / best_pack.seconds, x_sort = best_sort.seconds / best_pack.seconds;
      const double mib = 1.0 / 1048576.0;
      if (opt.json) {
        nlohmann::json row = {{"model", model_name},
                              {"distribution", pack::length_shape_name(shape)},
                              {"n_prompts", prompts.size()},
                              {"real_tokens", real},
                              {"mean_length", double(real) / double(prompts.size())},
                              {"batch_size", opt.batch_size},
                              {"packer", opt.packer},
                              {"capacity", capacity},
                              {"threads", opt.threads},
                              {"padding_ratio", pad_ratio},
                              {"padding_ratio_sorted", sort_ratio},
                              {"seconds_padded", best_pad.seconds},
                              {"seconds_sorted", best_sort.seconds},
                              {"seconds_prepacked", best_pack.seconds},
                              {"seconds_prepare", best_pack.prepare_seconds},
                              {"clock", opt.wall ? "wall" : "process_cpu"},
                              {"speedup_vs_padded", x_pad},
                              {"speedup_vs_sorted", x_sort},
                              {"speedup_over_0_85_ratio", x_pad / (0.85 * pad_ratio)},
                              {"forwards_padded", best_pad.n_forwards},
                              {"forwards_prepacked", best_pack.n_forwards},
                              {"peak_activation_bytes_padded", best_pad.peak_activation},
                              {"peak_activation_bytes_sorted", best_sort.peak_activation},
                              {"peak_activation_bytes_prepacked", best_pack.peak_activation},
                              {"computed_activation_bytes_padded", best_pad.computed_activation},
                              {"computed_activation_bytes_prepacked", best_pack.computed_activation},
                              {"largest_forward_padded", best_pad.largest_forward},
                              {"largest_forward_prepacked", best_pack.largest_forward},
                              {"activation_bytes_per_token_padded", per_token(best_pad)},
                              {"activation_bytes_per_token_prepacked", per_token(best_pack)},
                              {"memory_budget_bytes", budget},
                              {"max_batch_padded", b_pad},
                              {"max_batch_prepacked", b_pack}};
        std::cout << row.dump() << std::endl;
      } else {
        std::printf("%-10s %7.1f %8.2f %8.2f | %9.1f %9.1f %9.1f | %7.2f %7.2f | %8.1fM %8.1fM %8.1fM | %7zu %7zu\n",
                    std::string(pack::length_shape_name(shape)).c_str(), double(real) / double(prompts.size()),
                    pad_ratio, sort_ratio, best_pad.seconds * 1e3, best_sort.seconds * 1e3, best_pack.seconds * 1e3,
                    x_pad, x_sort, best_pad.peak_activation * mib, best_sort.peak_activation * mib,
                    best_pack.peak_activation * mib, b_pad, b_pack);
      }
    }
    if (!opt.json)
      std::printf("\npad_rat = padded slots / real tokens; x_pad, x_sort = speedup of prepacked; mem = measured peak "
                  "activation (heap bytes live during the forwards, fresh model); B_* = largest batch (prefix of 1e5 "
                  "prompts) within the activation budget at the measured bytes per token.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmkit-prepack: %s\n", e.what());
    return 1;
  }
  return 0;
}
