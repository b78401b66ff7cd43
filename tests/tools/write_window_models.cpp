// SPDX-License-Identifier: MIT
// Writes small synthetic GGUF files of models with local (sliding-window)
// layers into a directory (created if missing), for the tests that run llmkit-generate and
// llmkit-server on them (tests/generate_window.cmake, the server's
// http_window_test.cpp):
//   gemma3-window.gguf   Gemma 3: layers 0-4 local, 5 global, window 8
//   gpt-oss-window.gguf  gpt-oss: even layers local (with sinks), window 8, 4 experts
//   llama-window.gguf    a llama file with a window of 8 in every layer
//
//   write_window_models DIR
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_window_models DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    write_synthetic_llama(dir + "/gemma3-window.gguf",
                          {.config = window_config(architecture::gemma3), .seed = 81});
    write_synthetic_llama(dir + "/gpt-oss-window.gguf", {.config = window_config(architecture::gpt_oss), .seed = 82});
    write_synthetic_llama(dir + "/llama-window.gguf", {.config = window_config(architecture::llama), .seed = 83});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
