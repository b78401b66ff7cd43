// SPDX-License-Identifier: MIT
// llmkit-server on models with local (sliding-window) layers, over real
// sockets: synthetic Gemma 3 and gpt-oss files (window 8, written by the
// test program LLMKIT_WINDOW_MODELS_WRITER) served with --kv-window ring
// (the default: local layers in rings, no prefix reuse) and full (every
// layer in the prefix cache). A prompt that shares a served prompt's
// 48-token prefix gets the same text from both, with its prefix reused
// (prompt_tokens_details.cached_tokens) only under full.
#include <httplib.h>

#include "server_process.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace {

using llmkit_server_test::server_process;
using json = nlohmann::json;

// The directory of the window models, written once per run.
std::string window_models() {
  static const std::string dir = [] {
    const auto d = std::filesystem::temp_directory_path() / ("llmkit-window-models-" + std::to_string(::getpid()));
    const std::string command = std::string(LLMKIT_WINDOW_MODELS_WRITER) + " " + d.string();
    REQUIRE(std::system(command.c_str()) == 0);
    return d.string();
  }();
  return dir;
}

struct answer {
  std::string text;
  std::size_t cached_tokens = 0;
};

answer complete(const server_process& s, const std::vector<int>& prompt) {
  auto c = s.client();
  const json body{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  const auto r = c.Post("/v1/completions", body.dump(), "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  return {j.at("choices")[0].at("text").get<std::string>(),
          j.at("usage").at("prompt_tokens_details").at("cached_tokens").get<std::size_t>()};
}

}  // namespace

TEST_CASE("window models: a prompt sharing a served prefix gets the same text with --kv-window ring and full") {
  for (const std::string arch : {"gemma3", "gpt-oss"}) {
    INFO(arch);
    const std::string model = window_models() + "/" + arch + "-window.gguf";
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> token(3, 299);
    std::vector<int> first(48), second;
    for (int& t : first) t = token(rng);
    second = first;
    for (int i = 0; i < 10; ++i) first.push_back(token(rng));
    for (int i = 0; i < 13; ++i) second.push_back(token(rng));

    server_process ring({"--model", model, "--kv-type", "f32"});
    server_process full({"--model", model, "--kv-type", "f32", "--kv-window", "full"});
    server_process fresh({"--model", model, "--kv-type", "f32", "--kv-window", "full"});
    complete(ring, first);
    complete(full, first);
    const answer from_ring = complete(ring, second);
    const answer from_full = complete(full, second);
    const answer alone = complete(fresh, second);
    CHECK(from_ring.cached_tokens == 0);
    CHECK(from_full.cached_tokens == 48);
    CHECK(alone.cached_tokens == 0);
    REQUIRE(alone.text.size() >= 12);
    CHECK(from_full.text == alone.text);
    CHECK(from_ring.text == alone.text);
    CHECK(ring.stop() == 0);
    CHECK(full.stop() == 0);
  }
}

TEST_CASE("window models: every --kv-type serves the ring as it serves the full cache") {
  const std::string model = window_models() + "/gemma3-window.gguf";
  std::vector<int> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 37) % 290);
  for (const std::string type : {"f16", "bf16", "int8"}) {
    INFO(type);
    server_process ring({"--model", model, "--kv-type", type});
    server_process full({"--model", model, "--kv-type", type, "--kv-window", "full"});
    const answer a = complete(ring, prompt), b = complete(full, prompt);
    REQUIRE(b.text.size() >= 12);
    CHECK(a.text == b.text);
  }
}
