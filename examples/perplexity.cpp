// SPDX-License-Identifier: MIT
// llmkit-perplexity: how well a model predicts a text, computed as llama.cpp's
// llama-perplexity computes it (llmkit/eval/perplexity.hpp), so that a user
// checks their own GGUF file, and compares it with a reference run:
//
//   llmkit-perplexity --model m.gguf -f wiki.test.raw [--ctx 512] [--chunks N]
//   llmkit-perplexity --model f16.gguf -f text.txt --save-logits base.bin
//   llmkit-perplexity --model q4_k_m.gguf --kl-base base.bin   # KL, top-1, PPL difference
//
// The text's tokens (BOS first when the vocabulary adds one) are cut into
// chunks of --ctx tokens; each chunk runs from an empty cache with BOS as its
// first token and is scored on its second half. It prints the running
// perplexity after each chunk ("[1]12.3456,[2]...") and the final estimate
// with its standard error. A base file is llama-perplexity's
// --kl-divergence-base format: either program reads the other's; --kl-base
// takes the chunks' tokens from the base, so no text is needed.
#include <llmkit/core/executor.hpp>
#include <llmkit/eval/logit_base.hpp>
#include <llmkit/eval/perplexity.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>

#include "example_cli.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace eval = llmkit::eval;
namespace model = llmkit::model;

// Every model::weight_type's name, for --weight-type.
std::span<const std::string_view> weight_type_names() {
  static const auto names = [] {
    std::vector<std::string_view> v;
    for (const model::weight_type t : model::all_weight_types) v.push_back(model::weight_type_name(t));
    return v;
  }();
  return names;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LLMKIT_CHECK(in.is_open(), "-f: cannot open '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"Perplexity of a model over a text, as llama-perplexity computes it"};
  cli.show_defaults();
  std::string model_path = LLMKIT_DEFAULT_MODEL, text_path, save_path, base_path;
  std::size_t n_ctx = 512, max_chunks = 0, threads = 0;
  cli.add_option("--model", model_path, "GGUF model file");
  const auto text_option = cli.add_option("-f,--file", text_path, "the text to score (UTF-8)");
  cli.add_option("--ctx", n_ctx, "tokens per chunk (each scored on its second half)")
      .count_at_least(4, "a chunk of fewer than 4 tokens scores none");
  cli.add_option("--chunks", max_chunks, "score at most this many chunks (0 = all the text fills)");
  cli.add_option("--threads", threads, "threads; 0 = by the model's size");
  std::string weights_name = "native", activations_name = "q8_0";
  cli.add_option("--weight-type", weights_name, "how the weights are kept in memory (see llmkit-generate)")
      .one_of(weight_type_names());
  cli.add_option("--activations", activations_name, "what quantised matrices multiply: q8_0 or f32 (exact)")
      .one_of({"f32", "q8_0"});
  const auto save_option =
      cli.add_option("--save-logits", save_path, "write the scored distributions to FILE (a base for --kl-base)");
  const auto base_option = cli.add_option(
      "--kl-base", base_path, "compare with a base (llmkit --save-logits or llama-perplexity --kl-divergence-base)");
  base_option.excludes(save_option);
  base_option.excludes(text_option);
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  if (text_path.empty() && base_path.empty()) {
    std::cerr << "error: give the text to score with -f FILE (or a base with --kl-base FILE)\n";
    return 2;
  }

  try {
    const auto file = model::gguf_file::open(model_path);
    const auto tok = model::tokenizer::from_gguf(file);
    model::llama_model m(file, {.weight_type = model::weight_type_from_name(weights_name),
                                .activations = activations_name == "f32" ? model::activation_type::f32
                                                                         : model::activation_type::q8_0});
    const std::size_t n_vocab = m.config().n_vocab;
    std::unique_ptr<eval::logit_base_reader> base;
    std::vector<llmkit::token_id> tokens;
    if (!base_path.empty()) {
      base = std::make_unique<eval::logit_base_reader>(base_path);
      const auto& h = base->header();
      LLMKIT_CHECK(h.n_vocab == n_vocab, "--kl-base: the base has a vocabulary of ", h.n_vocab, ", ", model_path,
                   " of ", n_vocab);
      n_ctx = h.n_ctx;
      max_chunks = max_chunks == 0 ? h.n_chunks : std::min(max_chunks, h.n_chunks);
      tokens = h.tokens;
    } else {
      tokens = tok.encode(read_text(text_path), {.add_bos = tok.add_bos_token()});
    }
    LLMKIT_CHECK(n_ctx <= m.config().context_length, "--ctx ", n_ctx, " exceeds the model's context of ",
                 m.config().context_length);
    const auto plan = eval::chunking::of(tokens.size(), n_ctx, max_chunks);
    if (threads == 0) threads = llmkit_examples::default_threads(m.weight_bytes_per_step());
    std::optional<llmkit::token_id> bos;
    if (tok.add_bos_token()) bos = tok.bos();
    std::fprintf(stderr, "llmkit-perplexity: %s (weights %s, activations %s), %zu tokens, %zu chunks of %zu, %zu thread(s)\n",
                 model_path.c_str(), weights_name.c_str(), activations_name.c_str(), tokens.size(), plan.n_chunks,
                 n_ctx, threads);

    std::unique_ptr<eval::logit_base_writer> saver;
    if (!save_path.empty()) {
      tokens.resize(plan.n_chunks * n_ctx);
      saver = std::make_unique<eval::logit_base_writer>(
          save_path, eval::logit_base_header{n_ctx, n_vocab, plan.n_chunks, tokens});
    }
    llmkit::thread_pool pool(threads);
    llmkit::kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = n_ctx});
    model::batch_builder b;
    eval::running_mean nll;
    eval::kl_comparison kl;
    std::vector<double> scratch;
    for (std::size_t c = 0; c < plan.n_chunks; ++c) {
      const auto ids = plan.chunk_tokens(tokens, c, bos);
      const auto logits = eval::score_chunk(m, cache, pool, plan, ids, b);
      for (std::size_t i = 0; i < plan.n_scored(); ++i) {
        const llmkit::token_id next = ids[plan.first_scored() + i + 1];
        if (base) {
          kl.add(logits.row(i), base->next_row(), next, scratch);
        } else {
          nll.add(eval::token_nll(logits.row(i), next, scratch));
          if (saver) saver->write_row(logits.row(i));
        }
      }
      std::printf("[%zu]%.4f,", c + 1, eval::perplexity_of(base ? kl.nll : nll).value);
      std::fflush(stdout);
    }
    std::printf("\n");
    if (saver) saver->check(save_path);
    if (!base) {
      const auto ppl = eval::perplexity_of(nll);
      std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl.value, ppl.uncertainty);
      return 0;
    }
    const auto ppl = eval::perplexity_of(kl.nll), ppl_base = eval::perplexity_of(kl.nll_base);
    const auto ratio = kl.log_ppl_ratio(), diff = kl.ppl_difference(), top = kl.same_top();
    std::printf("positions:                 %zu\n", kl.count());
    std::printf("PPL:                       %.6f +/- %.6f\n", ppl.value, ppl.uncertainty);
    std::printf("PPL(base):                 %.6f +/- %.6f\n", ppl_base.value, ppl_base.uncertainty);
    std::printf("ln(PPL / PPL(base)):       %.6f +/- %.6f\n", ratio.value, ratio.uncertainty);
    std::printf("PPL - PPL(base):           %.6f +/- %.6f\n", diff.value, diff.uncertainty);
    std::printf("KL divergence: mean        %.6f +/- %.6f\n", kl.kl.mean(), kl.kl.standard_error());
    std::printf("KL divergence: median      %.6f, 99%%: %.6f, max: %.6f\n", kl.kl_quantile(0.5), kl.kl_quantile(0.99),
                kl.kl_quantile(1.0));
    std::printf("same top token:            %.3f +/- %.3f %%\n", 100 * top.value, 100 * top.uncertainty);
    std::printf("RMS p(next) - p_base(next): %.3f %%\n",
                100 * std::sqrt(kl.p_diff.sum2 / static_cast<double>(std::max<std::size_t>(kl.count(), 1))));
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
