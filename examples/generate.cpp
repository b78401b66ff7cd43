// SPDX-License-Identifier: MIT
// llmkit-generate: text generation with the reference Llama on llmkit's
// blocks (GGUF reader, tokenizer, KV cache, forward pass, llmkit::sampling).
//
//   llmkit-generate [--model PATH] [--prompt TEXT] [--tokens N] [--temperature T]
//                   [--top-k K] [--top-p P] [--seed S] [--threads N] [--sampling CHAIN]
//                   [--weight-type native|f32|f16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k|q2_k|q3_k|iq4_nl|iq4_xs|mxfp4]
//                   [--activations f32|q8_0] [--kv-window ring|full]
//                   [--chat MESSAGE [--system TEXT] [--chat-template NAME]]
//
// A model with local (sliding-window) layers (Gemma 2/3, gpt-oss, a phi3 or
// llama file with a window) keeps those layers' KV in a ring of the window
// (model/window_cache.hpp); --kv-window full keeps every position in every
// layer instead. The tokens are the same.
//
// --chat formats a user message (and an optional system message) with the
// model's chat template (model/chat_template.hpp) and generates the reply,
// stopping at EOS or at the template's end-of-turn token.
//
// The continuation alone goes to stdout; the SIMD arch, prompt tokens and
// prefill / decode tokens per second go to stderr. With no arguments it
// runs the vendored stories260K model greedily on a default prompt.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/sliding_window_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/chat_template.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/model/window_cache.hpp>
#include <llmkit/sampling/candidates.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/context.hpp>
#include <llmkit/sampling/runtime_chain.hpp>
#include <llmkit/simd/arch.hpp>

#include "example_cli.hpp"
#include "kv_window.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct sampling_options {
  float temperature = 0.0f;  // 0: greedy
  std::size_t top_k = 0;     // 0: off
  float top_p = 1.0f;        // 1: off
};

// The llmkit::sampling run-time chain for the command-line options.
std::string chain_config(const sampling_options& o) {
  if (o.temperature <= 0.0f) return "greedy";
  std::string config;
  if (o.top_k > 0) config += "top_k(" + std::to_string(o.top_k) + ");";
  if (o.top_p < 1.0f) config += "top_p(" + std::to_string(o.top_p) + ");";
  return config + "temperature(" + std::to_string(o.temperature) + ");sample";
}

// CPU time of the whole process (all threads), in seconds: on a shared
// machine the wall clock also counts the time spent waiting for a core.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Prompt tokens per forward() (and a ring's max_grow): a long prompt goes
// in chunks of this size, on every cache alike.
constexpr std::size_t prefill_chunk = 512;

// What one generation needs besides the model, cache and threads.
struct generation_run {
  const llmkit::model::tokenizer& tok;
  std::span<const llmkit::token_id> prompt_ids;
  std::span<const llmkit::token_id> stop_ids;
  std::size_t n_tokens = 0;  // tokens to generate at most
  std::size_t capacity = 0;  // positions the sequence may reach
  std::string chain;         // llmkit::sampling run-time chain
  std::uint64_t seed = 0;
};

// Prefills the prompt into a new sequence of `cache`, then samples and
// streams the continuation to stdout; the rates go to stderr.
template <class Cache>
int generate(llmkit::model::llama_model& model, Cache& cache, llmkit::thread_pool& pool, const generation_run& r) {
  using clock = std::chrono::steady_clock;
  const llmkit::kv::seq_id seq = *cache.add_sequence();
  const auto chain = llmkit::sampling::runtime_chain::parse(r.chain);
  llmkit::sampling::sampling_state state(r.seed, 0, r.prompt_ids);
  llmkit::sampling::candidates cands;
  auto sample = [&](llmkit::matrix_view<const float> logits) {
    // The runtime chain is both the processors and the sampler.
    const llmkit::token_id t = llmkit::sampling::sample_row(logits.row(0), state.context(), chain, chain, cands).token;
    state.accept(t);
    return t;
  };

  llmkit::model::batch_builder b;
  const double c0 = cpu_seconds();
  const auto t0 = clock::now();
  llmkit::matrix_view<const float> logits;
  for (std::size_t pos = 0; pos < r.prompt_ids.size(); pos += prefill_chunk) {
    b.clear();
    b.add(seq, r.prompt_ids.subspan(pos, std::min(prefill_chunk, r.prompt_ids.size() - pos)),
          static_cast<std::int32_t>(pos));
    logits = model.forward(b.view(), cache, pool);
  }
  const auto t1 = clock::now();
  const double c1 = cpu_seconds();
  llmkit::token_id token = sample(logits);

  std::string piece;
  std::size_t generated = 0;
  const auto t2 = clock::now();
  const double c2 = cpu_seconds();
  while (true) {
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) break;
    piece.clear();
    r.tok.decode_token(token, piece);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    ++generated;
    if (generated >= r.n_tokens || cache.n_tokens(seq) >= r.capacity) break;
    b.clear();
    b.add(seq, {&token, 1}, static_cast<std::int32_t>(cache.n_tokens(seq)));
    logits = model.forward(b.view(), cache, pool);
    token = sample(logits);
  }
  const auto t3 = clock::now();
  const double c3 = cpu_seconds();
  std::fputc('\n', stdout);
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t3 - t2).count();
  const std::size_t decode_steps = generated > 0 ? generated - 1 : 0;  // forwards after the prefill
  std::fprintf(stderr, "  prompt: %zu tokens, prefill %.0f tokens/s (%.3f ms wall, %.3f ms CPU)\n", r.prompt_ids.size(),
               double(r.prompt_ids.size()) / prefill_s, prefill_s * 1e3, (c1 - c0) * 1e3);
  std::fprintf(stderr, "  generated: %zu tokens, decode %.0f tokens/s (%.3f ms wall, %.3f ms CPU over %zu steps)\n",
               generated, decode_steps > 0 ? double(decode_steps) / decode_s : 0.0, decode_s * 1e3, (c3 - c2) * 1e3,
               decode_steps);
  std::fprintf(stderr, "  KV cache: %.1f MB allocated\n", double(cache.usage().bytes_allocated) / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"Generate text with llmkit's reference Llama"};
  cli.show_defaults();
  std::string model_path = LLMKIT_DEFAULT_MODEL;
  std::string prompt = "Once upon a time";
  std::size_t n_tokens = 128;
  sampling_options so;
  std::uint64_t seed = 42;
  std::size_t threads = 0;  // 0: by the model's size (llmkit_examples::default_threads)
  cli.add_option("--model", model_path, "GGUF model file (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, qwen2moe)");
  const auto prompt_option =
      cli.add_option("--prompt", prompt, "prompt text (BOS prepended when tokenizer.ggml.add_bos_token asks)");
  cli.add_option("--tokens", n_tokens, "tokens to generate at most").count_at_least(1, "nothing to generate");
  cli.add_option("--temperature", so.temperature, "sampling temperature; 0 = greedy").in_range(0.0f, 100.0f);
  cli.add_option("--top-k", so.top_k, "keep the k most likely tokens; 0 = all");
  cli.add_option("--top-p", so.top_p, "nucleus sampling mass in (0, 1]").in_range(0.0f, 1.0f);
  cli.add_option("--seed", seed, "random seed");
  std::string chain_text;
  cli.add_option("--sampling", chain_text,
                 "llmkit::sampling chain, e.g. \"penalties(repeat=1.1);top_k(40);top_p(0.95);temperature(0.8);sample\" "
                 "(overrides --temperature/--top-k/--top-p)");
  cli.add_option("--threads", threads,
                 "threads; 0 = by the model's size (one per 8 MiB of weights read per token, at most the hardware's)");
  std::string weights_name = "native";
  cli.add_option("--weight-type", weights_name,
                 "how the weights are kept in memory: native (as in the file), f32, f16, q8_0, q4_0, q4_1, q5_0, "
                 "q5_1, q4_k, q5_k, q6_k, q2_k, q3_k, iq4_nl, iq4_xs or mxfp4")
      .one_of({"native", "f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q2_k",
               "q3_k", "iq4_nl", "iq4_xs", "mxfp4"});
  std::string activations_name = "q8_0";
  cli.add_option("--activations", activations_name,
                 "what quantised matrices multiply: q8_0 (int8-quantised activations, the faster integer product) or "
                 "f32 (exact)")
      .one_of({"f32", "q8_0"});
  std::string kv_window_name = "ring";
  cli.add_option("--kv-window", kv_window_name,
                 "KV of a model's local (sliding-window) layers: ring (only the window, the default) or full (every "
                 "position, as the global layers); the same tokens either way")
      .one_of(std::span<const std::string_view>(llmkit_examples::kv_window_names));
  bool no_mmap = false, mlock = false;
  cli.add_flag("--no-mmap", no_mmap,
               "copy every weight into memory instead of reading the file's mapping in place (llama_options::weights_in_place)");
  cli.add_flag("--mlock", mlock, "lock the weights read in place in memory, so they are never paged out (needs ulimit -l)");
  std::string chat_message, system_message, chat_template_name;
  const auto chat_option =
      cli.add_option("--chat", chat_message,
                     "a user message: formatted with the model's chat template (tokenizer.chat_template) "
                     "or --chat-template, and answered (instead of --prompt)");
  chat_option.excludes(prompt_option);
  cli.add_option("--system", system_message, "system message for --chat").needs(chat_option);
  cli.add_option("--chat-template", chat_template_name, "built-in chat template for --chat instead of the model's")
      .one_of(llmkit::model::chat_template::names)
      .needs(chat_option);
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  const bool chat = chat_option.was_given();
  const auto activations =
      activations_name == "q8_0" ? llmkit::model::activation_type::q8_0 : llmkit::model::activation_type::f32;
  const llmkit::model::weight_type weights = llmkit::model::weight_type_from_name(weights_name);
  if (!(so.top_p > 0.0f)) {
    std::cerr << "error: --top-p must be in (0, 1], got " << so.top_p << "\n";
    return 2;
  }

  try {
    using clock = std::chrono::steady_clock;
    const auto file = llmkit::model::gguf_file::open(model_path);
    const auto tok = llmkit::model::tokenizer::from_gguf(file);
    // Generation stops at EOS and, in a chat, at the template's end-of-turn token when the vocabulary has it.
    std::vector<llmkit::token_id> stop_ids{tok.eos()};
    std::string chat_note;
    if (chat) {
      if (chat_template_name.empty() && !file.contains("tokenizer.chat_template")) {
        std::cerr << "error: " << model_path << " has no chat template (tokenizer.chat_template); choose a built-in "
                  << "one with --chat-template NAME (" << llmkit::model::chat_template::names_list() << ")\n";
        return 2;
      }
      const auto tmpl = llmkit::model::chat_template::from_gguf(file, chat_template_name);
      std::vector<llmkit::model::chat_message> messages;
      if (!system_message.empty()) messages.push_back({"system", system_message});
      messages.push_back({"user", chat_message});
      prompt = tmpl.format(messages);  // ends with the assistant turn's opening; BOS left to the tokenizer
      chat_note = "\n  chat template: " + std::string(tmpl.name());
      if (const auto end_of_turn = tok.find(tmpl.end_of_turn_text())) {
        stop_ids.push_back(*end_of_turn);
        chat_note += ", stops at '" + std::string(tmpl.end_of_turn_text()) + "' (" + std::to_string(*end_of_turn) + ")";
      }
    }
    const auto load_start = clock::now();
    llmkit::model::llama_model model(file, {.weight_type = weights,
                                            .activations = activations,
                                            .weights_in_place = !no_mmap,
                                            .lock_weights = mlock});
    const double load_s = std::chrono::duration<double>(clock::now() - load_start).count();
    const auto& c = model.config();
    if (threads == 0) threads = llmkit_examples::default_threads(model.weight_bytes_per_step());
    // The one place text becomes tokens. A chat prompt holds special-token texts ("<|eot_id|>", "</s>", ...)
    // that must become their control ids; a plain prompt stays plain text. BOS is added here, once, when the
    // model asks for it (chat_template::format leaves the leading BOS text out).
    const std::vector<llmkit::token_id> prompt_ids =
        tok.encode(prompt, {.add_bos = tok.add_bos_token(), .parse_special = chat});
    const std::size_t capacity = std::min(c.context_length, prompt_ids.size() + n_tokens);
    if (prompt_ids.size() >= capacity) {
      std::cerr << "error: the prompt has " << prompt_ids.size() << " tokens; the context holds " << c.context_length
                << "\n";
      return 2;
    }
    std::cerr << "llmkit-generate: " << model_path << " (weights " << llmkit::model::weight_type_name(weights)
              << ", activations " << activations_name << ")\n  sampling: "
              << (chain_text.empty() ? chain_config(so) : chain_text) << "\n  arch " << llmkit::simd::arch_name<llmkit::simd::default_arch>()
              << ", " << threads << " thread(s); dim " << c.dim << ", " << c.n_layers << " layers, " << c.n_heads
              << " heads (" << c.n_kv_heads << " KV), vocab " << c.n_vocab << chat_note << "\n";
    std::fprintf(stderr, "  loaded in %.0f ms; %.1f MB of weights read in place from the file's mapping%s\n",
                 load_s * 1e3, double(model.weight_bytes_in_place()) / 1e6, mlock ? " (locked)" : "");

    const generation_run run{.tok = tok,
                             .prompt_ids = prompt_ids,
                             .stop_ids = stop_ids,
                             .n_tokens = n_tokens,
                             .capacity = capacity,
                             .chain = chain_text.empty() ? chain_config(so) : chain_text,
                             .seed = seed};
    llmkit::thread_pool pool(threads);
    const auto layout = llmkit_examples::kv_layout_of(c, *llmkit_examples::kv_window_of(kv_window_name));
    const char* layout_note[] = {"every position in every layer", "local layers in rings of ", "a ring of "};
    std::cerr << "  KV: " << layout_note[static_cast<int>(layout)];
    if (layout != llmkit_examples::kv_layout::full) std::cerr << c.sliding_window << " positions";
    std::cerr << "\n";
    switch (layout) {
      case llmkit_examples::kv_layout::full: {
        llmkit::kv::contiguous_cache<float> cache(model.kv_shape(), {.max_sequences = 1, .max_tokens = capacity});
        return generate(model, cache, pool, run);
      }
      case llmkit_examples::kv_layout::hybrid: {
        auto cache = llmkit::model::make_window_cache<float>(c, {.max_tokens = capacity, .max_grow = prefill_chunk});
        return generate(model, cache, pool, run);
      }
      case llmkit_examples::kv_layout::all_local: {
        llmkit::kv::sliding_window_cache<float> cache(model.kv_shape(),
                                                      llmkit::model::local_ring_options(c, prefill_chunk, 1));
        return generate(model, cache, pool, run);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
