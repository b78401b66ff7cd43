// SPDX-License-Identifier: MIT
// llmkit-server-load: N concurrent streaming clients against a running
// llmkit-server (or any OpenAI-compatible server), measured from the client
// side: tokens/s, time to first token (p50, p99) and the time between
// streamed pieces (p50, p99).
//
//   llmkit-server-load [--host 127.0.0.1] [--port 8080] [--clients 8] [--requests 32]
//                      [--prompt TEXT] [--max-tokens 64] [--temperature 0.8] [--api-key KEY] [--json]
//
// Every request streams (SSE); each client sends its requests one after
// another, with seed = the request's index, so two runs send the same work.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../example_cli.hpp"

namespace {

using steady = std::chrono::steady_clock;

struct request_timing {
  bool ok = false;
  double ttft_s = 0.0;
  std::vector<double> gaps_s;  // between consecutive pieces
  std::size_t n_tokens = 0;    // usage.completion_tokens
};

// The q-quantile (nearest rank) of `v`, sorted in place; 0 when empty.
double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

request_timing run_one(const std::string& host, int port, const std::string& body, const std::string& api_key) {
  httplib::Client client(host, port);
  client.set_connection_timeout(10);
  client.set_read_timeout(300);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  if (!api_key.empty()) req.headers.emplace("Authorization", "Bearer " + api_key);
  req.body = body;
  request_timing t;
  std::string pending;
  const auto start = steady::now();
  auto last = start;
  bool first = true;
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    pending.append(data, n);
    std::size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const auto chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("usage") && chunk["usage"].is_object())
        t.n_tokens = chunk["usage"].value("completion_tokens", std::size_t{0});
      if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
      if (chunk["choices"][0].value("text", std::string()).empty()) continue;
      const auto now = steady::now();
      if (first) t.ttft_s = std::chrono::duration<double>(now - start).count();
      else t.gaps_s.push_back(std::chrono::duration<double>(now - last).count());
      first = false;
      last = now;
    }
    return true;
  };
  const auto res = client.send(req);
  t.ok = res && res->status == 200 && !first;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"llmkit-server-load: concurrent streaming clients against llmkit-server"};
  cli.show_defaults();
  std::string host = "127.0.0.1", prompt = "Once upon a time", api_key;
  long port = 8080;
  std::size_t clients = 8, requests = 32, max_tokens = 64;
  double temperature = 0.8;
  bool json_output = false;
  cli.add_option("--host", host, "server address");
  cli.add_option("--port", port, "server port").in_range(1, 65535);
  cli.add_option("--clients", clients, "concurrent clients").count_at_least(1, "nobody would send");
  cli.add_option("--requests", requests, "requests in all").count_at_least(1, "nothing to send");
  cli.add_option("--prompt", prompt, "prompt of every request");
  cli.add_option("--max-tokens", max_tokens, "max_tokens of every request").count_at_least(1, "nothing to generate");
  cli.add_option("--temperature", temperature, "temperature of every request").in_range(0.0, 2.0);
  cli.add_option("--api-key", api_key, "bearer token");
  cli.add_flag("--json", json_output, "one JSON line instead of text");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;

  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::vector<request_timing> done;
  const auto t0 = steady::now();
  std::vector<std::thread> threads;
  for (std::size_t c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      for (std::size_t i = next++; i < requests; i = next++) {
        const nlohmann::json body = {{"prompt", prompt},           {"max_tokens", max_tokens},
                                     {"temperature", temperature}, {"seed", i},
                                     {"stream", true},             {"stream_options", {{"include_usage", true}}}};
        auto t = run_one(host, static_cast<int>(port), body.dump(), api_key);
        std::lock_guard lock(mutex);
        done.push_back(std::move(t));
      }
    });
  for (auto& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(steady::now() - t0).count();

  std::size_t n_ok = 0, n_tokens = 0;
  std::vector<double> ttft, gaps;
  for (const auto& t : done) {
    if (!t.ok) continue;
    ++n_ok;
    n_tokens += t.n_tokens;
    ttft.push_back(t.ttft_s);
    gaps.insert(gaps.end(), t.gaps_s.begin(), t.gaps_s.end());
  }
  const double tokens_per_s = wall_s > 0 ? static_cast<double>(n_tokens) / wall_s : 0.0;
  const double ttft_p50 = quantile(ttft, 0.5), ttft_p99 = quantile(ttft, 0.99);
  const double gap_p50 = quantile(gaps, 0.5), gap_p99 = quantile(gaps, 0.99);
  if (json_output) {
    const nlohmann::json j = {{"clients", clients},          {"requests", requests},     {"ok", n_ok},
                              {"tokens", n_tokens},          {"wall_s", wall_s},         {"tokens_per_s", tokens_per_s},
                              {"ttft_p50_s", ttft_p50},      {"ttft_p99_s", ttft_p99},   {"inter_token_p50_s", gap_p50},
                              {"inter_token_p99_s", gap_p99}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%zu clients, %zu requests (%zu ok), %zu tokens in %.3f s: %.0f tokens/s\n", clients, requests, n_ok,
                n_tokens, wall_s, tokens_per_s);
    std::printf("time to first token: p50 %.2f ms, p99 %.2f ms; between pieces: p50 %.3f ms, p99 %.3f ms\n",
                ttft_p50 * 1e3, ttft_p99 * 1e3, gap_p50 * 1e3, gap_p99 * 1e3);
  }
  return n_ok == requests ? 0 : 1;
}
