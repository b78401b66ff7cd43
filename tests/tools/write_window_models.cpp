// SPDX-License-Identifier: MIT
// Writes small synthetic GGUF files of models with local (sliding-window)
// layers into a directory (created if missing), for the tests that run llmkit-generate and
// llmkit-server on them (tests/generate_window.cmake, the server's
// http_window_test.cpp):
//   gemma3-window.gguf   Gemma 3: layers 0-4 local, 5 global, window 8
//   gpt-oss-window.gguf  gpt-oss: even layers local (with sinks), window 8, 4 experts
//   llama-window.gguf    a llama file with a window of 8 in every layer
// and with --gemma3-1b-kv, for the serving figures of docs/serving.md:
//   gemma3-1b-kv.gguf    Gemma 3 1B's KV shape (26 layers, 4 heads and 1 KV
//                        head of 256, window 512, every 6th layer global)
//                        with small matrices (dim 512, ffn 1024, vocab
//                        4096), Q4_K_M
//
//   write_window_models DIR [--gemma3-1b-kv]
#include <llmkit/model/synthetic.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

namespace {

using namespace llmkit::model;

// Heads of 64: every build's attention kernels have them.
llama_config window_config(architecture arch) {
  llama_config c;
  c.arch = arch;
  c.n_vocab = 300;
  c.dim = 128;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.context_length = 512;
  c.sliding_window = 8;
  c.n_layers = 4;
  c.ffn_dim = 96;
  if (arch == architecture::gemma3) {
    c.n_layers = 6;
    c.local_layers = local_layer_pattern(c.n_layers, 6);
  } else if (arch == architecture::gpt_oss) {
    c.ffn_dim = 64;
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.expert_ffn_dim = 64;
    c.local_layers = local_layer_pattern(c.n_layers, 2);
  } else {
    c.local_layers.assign(c.n_layers, 1);
  }
  return c;
}

// Gemma 3 1B's layers, heads and window; the matrices much smaller, so that
// long contexts run quickly while the KV is as large as the real model's.
synthetic_options gemma3_1b_kv() {
  llama_config c = window_config(architecture::gemma3);  // 1 KV head
  c.n_vocab = 4096, c.dim = 512, c.n_layers = 26, c.n_heads = 4, c.head_dim = 256, c.ffn_dim = 1024;
  c.context_length = 32768, c.sliding_window = 512, c.rms_eps = 1e-6f, c.rope.theta = 1000000.0f;
  c.local_layers = local_layer_pattern(c.n_layers, 6);
  synthetic_options o{.config = c, .seed = 3, .tied_output = true};
  o.tensor_types = q4_k_m_types(o);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gemma3_1b = argc == 3 && std::string(argv[2]) == "--gemma3-1b-kv";
  if (argc != 2 && !gemma3_1b) {
    std::fprintf(stderr, "usage: write_window_models DIR [--gemma3-1b-kv]\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    write_synthetic_llama(dir + "/gemma3-window.gguf",
                          {.config = window_config(architecture::gemma3), .seed = 81});
    write_synthetic_llama(dir + "/gpt-oss-window.gguf", {.config = window_config(architecture::gpt_oss), .seed = 82});
    write_synthetic_llama(dir + "/llama-window.gguf", {.config = window_config(architecture::llama), .seed = 83});
    if (gemma3_1b) write_synthetic_llama(dir + "/gemma3-1b-kv.gguf", gemma3_1b_kv());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
