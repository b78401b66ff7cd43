// SPDX-License-Identifier: MIT
// llmkit-server-load: N concurrent streaming clients against a running
// llmkit-server (or any OpenAI-compatible server), measured from the client
// side: tokens/s, time to first token (mean, p50, p99) and the time between
// streamed pieces (p50, p99).
//
//   llmkit-server-load [--host 127.0.0.1] [--port 8080] [--clients 8] [--requests 32]
//                      [--prompt TEXT] [--distinct-prompts] [--max-tokens 64] [--temperature 0.8] [--api-key KEY] [--grammar GBNF] [--json]
//   llmkit-server-load --in-process --model PATH [--threads N] [--max-batch N] [--max-queue N] [--ctx N]
//                      [--kv-type T] [--kv-blocks N] [--kv-window ring|full]
//                      [--draft ngram|self|DRAFT.gguf] [--draft-max N] [--draft-max-decodes N] ...
//
// Every request streams (SSE); each client sends its requests one after
// another, with seed = the request's index, so two runs send the same work.
// With --in-process the same clients send the same request bodies to
// llmkit-server's engine backend in this process (parsed, tokenized and
// submitted as the server does, events taken straight from the engine's
// callback): the run without HTTP that the server's overhead is measured
// against.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../example_cli.hpp"
#include "engine_backend.hpp"
#include "openai_protocol.hpp"

namespace {

using steady = std::chrono::steady_clock;

struct request_timing {
  bool ok = false;
  double ttft_s = 0.0;
  std::vector<double> gaps_s;  // between consecutive pieces
  std::size_t n_tokens = 0;    // usage.completion_tokens
};

// The q-quantile (nearest rank) of `v`, sorted in place; 0 when empty.
// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or 0.
std::size_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  return 0;
}

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
  client.set_tcp_nodelay(true);
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

// The same request through llmkit-server's path without HTTP: parsed,
// prepared and submitted as server.cpp does; pieces timed as they leave the
// engine's callback.
request_timing run_in_process(llmkit_server::backend& model, const std::string& body,
                              const llmkit::serve::speculation& drafting) {
  using namespace llmkit_server;
  request_timing t;
  const auto start = steady::now();
  const backend_model_info& info = model.info();
  auto parsed = parse_request(api_kind::completions, body, {.n_ctx = info.n_ctx, .n_vocab = info.n_vocab});
  if (!std::holds_alternative<generation_request>(parsed)) return t;
  const generation_request& r = std::get<generation_request>(parsed);
  auto prepared = prepare_request(r, model, r.sampling.seed.value_or(0), drafting);
  if (!std::holds_alternative<prepared_request>(prepared)) return t;
  serve::generation_request& br = std::get<prepared_request>(prepared).request;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false, first = true;
  serve::finish_kind finish = serve::finish_kind::error;
  auto last = start;
  br.on_event = [&](const serve::stream_event& e) {
    const auto now = steady::now();
    std::lock_guard lock(mutex);
    if (e.type == serve::event_type::finish) {
      t.n_tokens = e.usage.n_generated_tokens;
      finish = e.finish;
      done = true;
      finished.notify_all();
      return;
    }
    if (e.text.empty()) return;
    if (first) t.ttft_s = std::chrono::duration<double>(now - start).count();
    else t.gaps_s.push_back(std::chrono::duration<double>(now - last).count());
    first = false;
    last = now;
  };
  if (!model.submit(std::move(br)).accepted()) return t;
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return done; });
  t.ok = !first && (finish == serve::finish_kind::stop || finish == serve::finish_kind::length);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"llmkit-server-load: concurrent streaming clients against llmkit-server"};
  cli.show_defaults();
  std::string host = "127.0.0.1", prompt = "Once upon a time", api_key, grammar;
  long port = 8080;
  std::size_t clients = 8, requests = 32, max_tokens = 64;
  double temperature = 0.8;
  bool json_output = false, in_process = false;
  llmkit_server::engine_backend_options engine_options{.model_path = LLMKIT_DEFAULT_MODEL, .max_batch = 8,
                                                       .chat_template = {}};
  std::size_t forward_threads = 0;
  cli.add_option("--host", host, "server address");
  cli.add_option("--port", port, "server port").in_range(1, 65535);
  cli.add_option("--clients", clients, "concurrent clients").count_at_least(1, "nobody would send");
  cli.add_option("--requests", requests, "requests in all").count_at_least(1, "nothing to send");
  cli.add_option("--prompt", prompt, "prompt of every request");
  cli.add_option("--max-tokens", max_tokens, "max_tokens of every request").count_at_least(1, "nothing to generate");
  cli.add_option("--temperature", temperature, "temperature of every request").in_range(0.0, 2.0);
  cli.add_option("--api-key", api_key, "bearer token");
  cli.add_option("--grammar", grammar, "GBNF grammar of every request (structured output); empty = none");
  bool distinct_prompts = false;
  cli.add_flag("--distinct-prompts", distinct_prompts,
               "prefix request i's prompt with \"i: \", so that no two requests share a prefix (no prefix reuse)");
  cli.add_flag("--json", json_output, "one JSON line instead of text");
  cli.add_flag("--in-process", in_process,
               "no server: the same requests to llmkit-server's engine backend in this process (the options below)");
  cli.add_option("--model", engine_options.model_path, "--in-process: GGUF model file");
  cli.add_option("--threads", forward_threads, "--in-process: forward-pass threads; 0 = by the model's size (as llmkit-server)");
  cli.add_option("--max-batch", engine_options.max_batch, "--in-process: samples running at once")
      .count_at_least(1, "no request could run");
  cli.add_option("--max-queue", engine_options.max_queue, "--in-process: samples waiting before a request is refused")
      .count_at_least(1, "every request would be refused");
  cli.add_option("--ctx", engine_options.n_ctx, "--in-process: tokens per request; 0 = the model's context length");
  std::string kv_type_name{llmkit_server::kv_type_names[static_cast<std::size_t>(engine_options.kv)]};
  cli.add_option("--kv-type", kv_type_name, "--in-process: element type of the KV cache")
      .one_of(std::span<const std::string_view>(llmkit_server::kv_type_names));
  cli.add_option("--kv-blocks", engine_options.kv_blocks,
                 "--in-process: 16-token KV blocks in the pool; 0 = max-batch full contexts");
  std::string kv_window_name = "ring";
  cli.add_option("--kv-window", kv_window_name, "--in-process: KV of a model's local layers, as llmkit-server's --kv-window")
      .one_of(std::span<const std::string_view>(llmkit_examples::kv_window_names));
  cli.add_option("--draft", engine_options.draft, "--in-process: speculative decoding, as llmkit-server's --draft");
  cli.add_option("--draft-max", engine_options.draft_max, "--in-process: guesses per request and step").in_range(1, 16);
  std::size_t draft_max_decodes = 0;
  cli.add_option("--draft-max-decodes", draft_max_decodes,
                 "--in-process: no drafting in steps with more decodes than this; 0 = by the drafter, as "
                 "llmkit-server");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  if (draft_max_decodes != 0) engine_options.draft_max_decodes = draft_max_decodes;
  const auto drafting = llmkit_server::speculation_of(engine_options.draft, engine_options.draft_max);

  std::unique_ptr<llmkit_server::backend> engine;
  if (in_process) try {
      engine_options.threads =
          forward_threads != 0 ? forward_threads : llmkit_examples::default_threads(std::filesystem::file_size(engine_options.model_path));
      engine_options.kv = *llmkit_server::kv_type_of(kv_type_name);
      engine_options.window = *llmkit_examples::kv_window_of(kv_window_name);
      engine = llmkit_server::make_engine_backend(engine_options);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 1;
    }

  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::vector<request_timing> done;
  const auto t0 = steady::now();
  std::vector<std::thread> threads;
  for (std::size_t c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      for (std::size_t i = next++; i < requests; i = next++) {
        nlohmann::json body = {{"prompt", distinct_prompts ? std::to_string(i) + ": " + prompt : prompt},
                               {"max_tokens", max_tokens},
                               {"temperature", temperature}, {"seed", i},
                               {"stream", true},             {"stream_options", {{"include_usage", true}}}};
        if (!grammar.empty()) body["grammar"] = grammar;
        auto t = engine ? run_in_process(*engine, body.dump(), drafting) : run_one(host, static_cast<int>(port), body.dump(), api_key);
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
  double ttft_mean = 0.0;
  for (const double x : ttft) ttft_mean += x / static_cast<double>(ttft.size());
  const double ttft_p50 = quantile(ttft, 0.5), ttft_p99 = quantile(ttft, 0.99);
  const double gap_p50 = quantile(gaps, 0.5), gap_p99 = quantile(gaps, 0.99);
  const std::size_t kv_bytes_peak = engine ? engine->stats().kv_bytes_peak : 0;
  const std::size_t resident_peak = engine ? status_bytes("VmHWM") : 0;  // the model's mapping, the cache, ...
  if (json_output) {
    nlohmann::json j = {{"clients", clients},          {"requests", requests},     {"ok", n_ok},
                              {"tokens", n_tokens},          {"wall_s", wall_s},         {"tokens_per_s", tokens_per_s},
                              {"in_process", in_process},    {"ttft_mean_s", ttft_mean},
                              {"ttft_p50_s", ttft_p50},      {"ttft_p99_s", ttft_p99},   {"inter_token_p50_s", gap_p50},
                              {"inter_token_p99_s", gap_p99}};
    if (engine) {
      j["kv_bytes_peak"] = kv_bytes_peak;
      j["resident_peak_bytes"] = resident_peak;
    }
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%zu clients, %zu requests (%zu ok), %zu tokens in %.3f s: %.0f tokens/s\n", clients, requests, n_ok,
                n_tokens, wall_s, tokens_per_s);
    std::printf("time to first token: mean %.2f ms, p50 %.2f ms, p99 %.2f ms; between pieces: p50 %.3f ms, p99 %.3f ms\n",
                ttft_mean * 1e3, ttft_p50 * 1e3, ttft_p99 * 1e3, gap_p50 * 1e3, gap_p99 * 1e3);
    if (engine)
      std::printf("KV cache: %.1f MB allocated at most; the process's peak resident memory (VmHWM) %.1f MB\n",
                  double(kv_bytes_peak) / 1e6, double(resident_peak) / 1e6);
  }
  return n_ok == requests ? 0 : 1;
}
