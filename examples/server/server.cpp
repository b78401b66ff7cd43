// SPDX-License-Identifier: MIT
// llmkit-server: an OpenAI-compatible HTTP server (Boost.Beast, http_server.hpp) on llmkit.
//
//   llmkit-server [--model PATH] [--host 127.0.0.1] [--port 8080] [--threads N] [--ctx N]
//                 [--max-batch N] [--max-queue N] [--api-key KEY] [--chat-template NAME]
//                 [--backend engine|serial] [--kv-blocks N] [--kv-type f32|f16|bf16|int8]
//                 [--kv-window ring|full]
//                 [--activations q8_0|f32] [--no-mmap] [--mlock]
//                 [--draft ngram|self|DRAFT.gguf] [--draft-max N] [--draft-max-decodes N]
//                 [--max-body-bytes N] [--drain-seconds S] [--grammar-max-* N]
//
// Routes: POST /v1/completions, POST /v1/chat/completions (streamed as SSE
// with "stream": true), GET /v1/models, POST /tokenize, POST /detokenize,
// GET /health, GET /metrics. The protocol (parsing, checks, answers, metrics text) is openai_protocol.hpp;
// the model runs behind backend.hpp: engine_backend.hpp (llmkit::serve::engine)
// or serial_backend.hpp (one request at a time). SIGTERM or SIGINT: new
// requests get 503, running ones finish within --drain-seconds (then they
// are cancelled), and the program exits 0. docs/serving.md has the details.
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../example_cli.hpp"
#include <llmkit/model/chat_template.hpp>
#include <llmkit/model/harmony_stream.hpp>

#include "backend.hpp"
#include "http_server.hpp"
#include "engine_backend.hpp"
#include "openai_protocol.hpp"
#include "serial_backend.hpp"
#include "server_metrics.hpp"

namespace {

using namespace llmkit_server;
using steady = std::chrono::steady_clock;

/// What every handler shares.
struct server_state {
  explicit server_state(backend& b) : model(b) {}
  backend& model;
  std::string api_key;
  std::size_t max_queue = 0;
  std::size_t max_body_bytes = 0;
  bool parse_special = false;  // --parse-special: a user's special-token texts become control tokens
  request_limits limits{};
  metrics_recorder metrics;
  std::atomic<bool> draining{false};
  std::atomic<std::size_t> in_flight{0};  // generations not yet answered in full
  std::atomic<std::uint64_t> next_id{0};
  std::uint64_t seed_base = 0;
  std::int64_t started = 0;
  serve::speculation draft{};  // --draft, --draft-max: what a request drafts unless it opts out
};

http::response error_response(const api_error& e, server_state& s) {
  s.metrics.record_rejected();
  http::response r{.status = e.status, .body = error_body(e)};
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

void send_error(http::exchange& ex, const api_error& e, server_state& s) { ex.reply(error_response(e, s)); }

// splitmix64: a distinct default seed per request from one random base.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct generation;
/// The generation whose `submit` runs on this thread: events for it that
/// arrive here are a rejection's (see backend.hpp) and are ignored.
thread_local const generation* rejecting = nullptr;

struct rejection_scope {
  explicit rejection_scope(const generation* g) { rejecting = g; }
  ~rejection_scope() { rejecting = nullptr; }
  rejection_scope(const rejection_scope&) = delete;
  rejection_scope& operator=(const rejection_scope&) = delete;
};

/// One generation request while it runs: what the backend's callbacks
/// collect, answered through the request's exchange once the backend has
/// accepted it (whole, or as SSE events while they come).
struct generation {
  generation(server_state& s, std::shared_ptr<http::exchange> e, std::size_t n)
      : state(s), ex(std::move(e)), choices(n), started(n), last_token(n) {
    ++s.in_flight;
  }
  ~generation() { --state.in_flight; }

  server_state& state;
  std::shared_ptr<http::exchange> ex;
  api_kind kind = api_kind::completions;
  bool stream = false;
  bool include_usage = false;
  bool with_logprobs = false;
  /// The answers open with a thinking block: split into reasoning_content and content.
  bool reasoning = false;
  std::vector<reasoning_stream> splitters;  // per choice, when streaming a reasoning answer
  /// The answers are in harmony's channels (gpt-oss): analysis as reasoning_content, final as content.
  bool harmony = false;
  std::vector<llmkit::model::harmony_stream> harmony_streams;  // per choice, when streaming harmony
  /// Tools may be called: answers are split into content and calls (tool_calls.hpp), and
  /// harmony's into reasoning too.
  std::optional<llmkit::chat::tool_syntax> tool_syntax;
  std::vector<std::pair<token_id, std::string>> silent_markers;  // prepared_request::silent_markers
  std::uint64_t tool_call_seed = 0;                 // of the call ids
  std::vector<llmkit::chat::tool_call_stream> tool_streams;  // per choice, when streaming with tools
  std::vector<bool> made_tool_calls;                // per choice, when streaming with tools
  response_header header;
  std::size_t n_prompt = 0;
  steady::time_point arrival = steady::now();

  std::mutex mutex;
  std::vector<request_id> handles;
  std::vector<choice_result> choices;
  std::vector<bool> started;
  std::vector<steady::time_point> last_token;
  bool first_token = false;
  bool accepted = false;  // submit returned accepted: the answer may go out
  bool answered = false;
  std::size_t n_generated = 0;
  std::size_t n_cached = 0;  // prompt tokens reused from the prefix cache (sample 0's)
  std::size_t n_finished = 0;
  // How the request failed, if it did: the first choice that ended with an
  // error or was cancelled (a drain deadline) decides the answer.
  std::optional<api_error> failure;
  std::string pending;  // SSE events that came before the stream started

  bool finished() const { return n_finished == choices.size(); }

  /// What add_piece puts in the answer: the piece's text, or its token and logprobs too.
  enum class piece_content : bool { text, text_and_logprobs };

  void cancel_all() {
    std::vector<request_id> hs;
    {
      std::lock_guard lock(mutex);
      if (finished()) return;
      hs = handles;
    }
    for (const request_id h : hs) state.model.cancel(h);
  }

  // On the backend's thread.
  void on_event(const serve::stream_event& e) {
    if (rejecting == this) return;
    const std::size_t index = e.index;
    std::lock_guard lock(mutex);
    if (index >= choices.size()) return;
    token_piece piece{.text = e.text};
    if (e.type == serve::event_type::token) {
      const auto now = steady::now();
      if (!first_token) state.metrics.record_ttft(std::chrono::duration<double>(now - arrival).count());
      else if (started[index])
        state.metrics.record_inter_token(std::chrono::duration<double>(now - last_token[index]).count());
      first_token = true;
      started[index] = true;
      last_token[index] = now;
      state.metrics.record_token();
      ++n_generated;
      for (const auto& [id, text] : silent_markers)
        if (e.token == id) piece.text += text;
      if (with_logprobs) {
        piece.token = e.token;
        piece.token_text = state.model.token_text(e.token);
        piece.logprob = e.logprob;
        for (const auto& t : e.top_logprobs) piece.top.push_back({t.token, state.model.token_text(t.token), t.logprob});
      }
      add_piece(index, piece, with_logprobs ? piece_content::text_and_logprobs : piece_content::text);
    } else {
      if (!e.text.empty()) add_piece(index, piece, piece_content::text);
      if (stream && (reasoning || harmony)) flush_reasoning(index);
      if (stream && tool_syntax) emit_tool_delta(index, tool_streams[index].finish());
      choices[index].finish = e.finish;
      if (index == 0) n_cached = e.usage.n_prompt_tokens_reused;
      state.metrics.record_finish(e.finish);
      if (e.finish == serve::finish_kind::error && !failure) failure = internal_error("generation failed: " + e.error);
      if (e.finish == serve::finish_kind::cancelled && !failure) failure = draining();
      if (stream && !failure)
        emit(sse_event(finish_chunk(kind, header, index, e.finish, tool_syntax && made_tool_calls[index])));
      ++n_finished;
      if (stream && finished()) {
        if (failure)
          emit(sse_event(stream_error_chunk(*failure)));
        else if (include_usage)
          emit(sse_event(usage_chunk(kind, header, {n_prompt, n_generated, n_cached})));
        emit(sse_done());
      }
    }
    if (accepted) answer_if_done();
  }

  // Under the mutex.
  void emit(std::string event) {
    if (accepted)
      ex->write(std::move(event));
    else
      pending += event;
  }

  // Under the mutex, once accepted: the whole answer, or the stream's end.
  void answer_if_done() {
    if (!finished() || answered) return;
    answered = true;
    if (stream) return ex->finish();
    if (failure) return send_error(*ex, *failure, state);
    if (tool_syntax)
      for (std::size_t i = 0; i < choices.size(); ++i) {
        auto parsed = llmkit::chat::parse_tool_calls(*tool_syntax, choices[i].text, choice_seed(i));
        choices[i].text = std::move(parsed.content);
        choices[i].tool_calls = std::move(parsed.calls);
        if (*tool_syntax == llmkit::chat::tool_syntax::harmony) choices[i].reasoning = std::move(parsed.reasoning);
      }
    if (harmony)
      for (choice_result& c : choices) {  // as the stream splits it
        llmkit::model::harmony_stream split;
        auto parts = split.feed(c.text);
        auto rest = split.finish();
        c.reasoning = std::move(parts.reasoning) + rest.reasoning;
        c.text = std::move(parts.content) + rest.content;
      }
    if (reasoning)
      for (choice_result& c : choices) {
        // As the stream splits it: only an answer that opens with <think> has reasoning.
        const std::size_t start = c.text.find_first_not_of('\n');
        if (start == std::string::npos || !std::string_view(c.text).substr(start).starts_with("<think>")) {
          c.reasoning = std::string();
          continue;
        }
        const auto split = llmkit::model::split_reasoning(c.text);
        c.reasoning = std::string(split.reasoning);
        c.text = std::string(split.content);
      }
    ex->reply({.body = completion_response(kind, header, choices, {n_prompt, n_generated, n_cached}, with_logprobs)});
  }

  // After submit accepted the request: its handles, the stream's start and
  // whatever came before it.
  void accept(request_id handle) {
    std::lock_guard lock(mutex);
    for (std::size_t i = 0; i < choices.size(); ++i) handles.push_back(handle + static_cast<request_id>(i));
    accepted = true;
    if (stream) {
      ex->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (kind == api_kind::chat_completions)
        for (std::size_t i = 0; i < choices.size(); ++i) ex->write(sse_event(chat_role_chunk(header, i)));
      ex->write(std::move(pending));
      pending.clear();
    }
    answer_if_done();
  }

  // Under the mutex: what choice `index`'s splitter held back, at its end.
  void flush_reasoning(std::size_t index) {
    if (harmony) {
      const auto parts = harmony_streams[index].finish();
      return emit_split(index, parts.reasoning, parts.content);
    }
    const auto parts = splitters[index].finish();
    emit_split(index, parts.reasoning, parts.content);
  }

  // Under the mutex: streamed reasoning and content of choice `index`.
  void emit_split(std::size_t index, const std::string& reasoning_text, const std::string& content_text) {
    if (!reasoning_text.empty()) emit(sse_event(reasoning_chunk(header, index, reasoning_text)));
    if (!content_text.empty()) emit(sse_event(piece_chunk(kind, header, index, {.text = content_text}, false)));
  }

  // The call ids of choice `index`.
  std::uint64_t choice_seed(std::size_t index) const { return tool_call_seed + 0x9E3779B97F4A7C15ull * index; }

  // Under the mutex: a streamed answer's reasoning (harmony), content and call deltas.
  void emit_tool_delta(std::size_t index, const llmkit::chat::answer_delta& d) {
    if (!d.reasoning.empty()) emit(sse_event(reasoning_chunk(header, index, d.reasoning)));
    if (!d.content.empty()) emit(sse_event(piece_chunk(kind, header, index, {.text = d.content}, false)));
    if (!d.calls.empty()) {
      made_tool_calls[index] = true;
      emit(sse_event(tool_call_chunk(header, index, d.calls)));
    }
  }

  void add_piece(std::size_t index, const token_piece& piece, piece_content content) {
    const bool keep_token = content == piece_content::text_and_logprobs;
    if (stream && tool_syntax) {
      // Content and calls go out as the stream tells them apart; logprobs are not streamed with tools.
      emit_tool_delta(index, tool_streams[index].feed(piece.text));
      return;
    }
    if (stream && (reasoning || harmony)) {
      // Thinking goes out as reasoning_content deltas; logprobs ride on the content chunk.
      const auto parts = harmony ? harmony_streams[index].feed(piece.text) : [&] {
        const auto p = splitters[index].feed(piece.text);
        return llmkit::model::harmony_stream::parts{p.reasoning, p.content};
      }();
      if (!parts.reasoning.empty()) emit(sse_event(reasoning_chunk(header, index, parts.reasoning)));
      if (!parts.content.empty() || (keep_token && parts.reasoning.empty())) {
        token_piece content = piece;
        content.text = parts.content;
        emit(sse_event(piece_chunk(kind, header, index, content, keep_token)));
      }
      return;
    }
    if (stream) {
      if (!piece.text.empty() || keep_token) emit(sse_event(piece_chunk(kind, header, index, piece, keep_token)));
      return;
    }
    choices[index].text += piece.text;
    if (keep_token) choices[index].pieces.push_back(piece);
  }
};

void handle_generation(api_kind kind, const std::shared_ptr<http::exchange>& ex, server_state& s) {
  const auto arrival = steady::now();  // TTFT counts parsing, tokenization and the chat template too
  if (s.draining) return send_error(*ex, draining(), s);
  const std::string& body = ex->req().body;
  if (body.size() > s.max_body_bytes) return send_error(*ex, payload_too_large(s.max_body_bytes), s);
  const backend_model_info& info = s.model.info();
  const model_limits limits{.n_ctx = info.n_ctx, .n_vocab = info.n_vocab};
  auto parsed = parse_request(kind, body, limits, s.limits);
  if (const auto* e = std::get_if<api_error>(&parsed)) return send_error(*ex, *e, s);
  const generation_request& r = std::get<generation_request>(parsed);

  const std::uint64_t id = ++s.next_id;
  auto prepared = prepare_request(r, s.model, r.sampling.seed.value_or(mix(s.seed_base + id)), s.draft, s.limits.grammar);
  if (const auto* e = std::get_if<api_error>(&prepared)) return send_error(*ex, *e, s);
  serve::generation_request& br = std::get<prepared_request>(prepared).request;
  const std::size_t n_prompt = std::get<prepared_request>(prepared).n_prompt;
  auto gen = std::make_shared<generation>(s, ex, r.n);
  gen->kind = kind;
  gen->stream = r.stream;
  gen->include_usage = r.include_usage;
  gen->with_logprobs = r.logprobs.has_value();
  gen->reasoning = std::get<prepared_request>(prepared).reasoning;
  gen->harmony = std::get<prepared_request>(prepared).harmony;
  gen->harmony_streams.resize(gen->harmony ? r.n : 0);
  gen->splitters.resize(r.n);
  gen->tool_syntax = std::get<prepared_request>(prepared).tool_syntax;
  gen->silent_markers = std::get<prepared_request>(prepared).silent_markers;
  if (gen->tool_syntax) {
    gen->tool_call_seed = br.seed;
    for (std::size_t i = 0; i < r.n; ++i) gen->tool_streams.emplace_back(*gen->tool_syntax, gen->choice_seed(i));
    gen->made_tool_calls.assign(r.n, false);
  }
  gen->header = {.id = (kind == api_kind::completions ? "cmpl-" : "chatcmpl-") + std::to_string(id),
                 .created = static_cast<std::int64_t>(std::time(nullptr)),
                 .model = info.id};
  gen->n_prompt = n_prompt;
  gen->arrival = arrival;

  br.on_event = [gen](const serve::stream_event& e) { gen->on_event(e); };
  serve::submit_result sub;
  {
    // A rejected request's error finishes arrive on this thread inside submit: the rejection answers instead.
    const rejection_scope scope(gen.get());
    sub = s.model.submit(std::move(br));
  }
  switch (sub.status) {
    case serve::submit_status::accepted: break;
    case serve::submit_status::queue_full:
    case serve::submit_status::staging_full: return send_error(*ex, queue_full(s.max_queue), s);
    case serve::submit_status::shutting_down: return send_error(*ex, draining(), s);
    case serve::submit_status::invalid: return send_error(*ex, invalid_request("", sub.message), s);
  }
  s.metrics.record_prompt(n_prompt);
  gen->accept(sub.handle);
  // A client that goes away (streamed or not) frees its samples' KV blocks at the next step.
  ex->on_disconnect([gen] { gen->cancel_all(); });
}

// POST /tokenize: llama-server's shape; special-token texts stay text
// unless the server runs with --parse-special.
void handle_tokenize(http::exchange& ex, server_state& s) {
  auto parsed = parse_tokenize_request(ex.req().body);
  if (const auto* e = std::get_if<api_error>(&parsed)) return send_error(ex, *e, s);
  const tokenize_request& r = std::get<tokenize_request>(parsed);
  if (r.parse_special.value_or(false) && !s.parse_special)
    return send_error(ex,
                      invalid_request("parse_special", "'parse_special' is true, but this server keeps a user's "
                                                       "special-token texts as text (start it with --parse-special)"),
                      s);
  const std::vector<token_id> ids = s.model.encode(r.content, r.add_special, r.parse_special.value_or(s.parse_special));
  if (!r.with_pieces) return ex.reply({.body = tokenize_response(ids)});
  std::vector<token_with_piece> pieces;
  pieces.reserve(ids.size());
  for (const token_id id : ids) pieces.push_back({.id = id, .piece = s.model.decode({&id, 1})});
  ex.reply({.body = tokenize_response(pieces)});
}

// POST /detokenize: `{"tokens": [ids]}` to `{"content": "text"}`.
void handle_detokenize(http::exchange& ex, server_state& s) {
  const backend_model_info& info = s.model.info();
  auto parsed = parse_detokenize_request(ex.req().body, {.n_ctx = info.n_ctx, .n_vocab = info.n_vocab});
  if (const auto* e = std::get_if<api_error>(&parsed)) return send_error(ex, *e, s);
  ex.reply({.body = detokenize_response(s.model.decode(std::get<detokenize_request>(parsed).tokens))});
}

/// Routes one request (on an HTTP I/O thread).
void route(const std::shared_ptr<http::exchange>& ex, server_state& s) {
  const http::request& req = ex->req();
  // With --api-key, the /v1/ routes and the tokenizer's need the key (llama-server asks it for /tokenize too).
  if (req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize")
    if (const auto e = check_authorization(req.header("Authorization"), s.api_key)) return send_error(*ex, *e, s);
  const bool get = req.method == "GET", post = req.method == "POST";
  if (post && req.path == "/tokenize") return handle_tokenize(*ex, s);
  if (post && req.path == "/detokenize") return handle_detokenize(*ex, s);
  if (post && req.path == "/v1/completions") return handle_generation(api_kind::completions, ex, s);
  if (post && req.path == "/v1/chat/completions") return handle_generation(api_kind::chat_completions, ex, s);
  if (get && req.path == "/v1/models")
    return ex->reply({.body = models_response(s.model.info().id, s.started)});
  if (get && req.path == "/health") {
    const backend_stats b = s.model.stats();
    return ex->reply({.status = s.draining ? 503 : 200, .body = health_response(s.draining, b.n_queued, b.n_running)});
  }
  if (get && req.path == "/metrics") {
    metrics_snapshot m = s.metrics.snapshot();
    const backend_stats b = s.model.stats();
    m.queue_depth = b.n_queued;
    m.running = b.n_running;
    m.kv_blocks_used = b.kv_blocks_used;
    m.kv_blocks_free = b.kv_blocks_free;
    return ex->reply({.content_type = "text/plain; version=0.0.4", .body = prometheus_text(m)});
  }
  send_error(*ex, not_found(req.method.substr(0, 16), req.path.substr(0, 256)), s);
}

// Blocks SIGTERM and SIGINT in every thread (call before starting any);
// the main thread then takes them with sigwait.
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{"llmkit-server: an OpenAI-compatible HTTP server on llmkit"};
  cli.show_defaults();
  serial_backend_options bo{.model_path = LLMKIT_DEFAULT_MODEL};
  std::string host = "127.0.0.1";
  long port = 8080;
  std::size_t threads = 0, max_batch = 8, max_queue = 64, max_body = std::size_t{1} << 20;
  http::limits http_limits{};
  std::size_t kv_blocks = 0;
  std::string kv_type_name{kv_type_names[static_cast<std::size_t>(engine_backend_options{}.kv)]};
  std::string kv_window_name = "ring";
  std::string backend_name = "engine";
  std::string draft;
  std::size_t draft_max = 4, draft_max_decodes = 0;
  double drain_seconds = 10.0;
  std::string api_key;
  cli.add_option("--model", bo.model_path, "GGUF model file (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss)");
  cli.add_option("--host", host, "address to listen on (loopback unless told otherwise)");
  cli.add_option("--port", port, "TCP port; 0 = any free port (printed on stdout)").in_range(0, 65535);
  cli.add_option("--threads", threads, "forward-pass threads; 0 = by the model's size");
  cli.add_option("--ctx", bo.n_ctx, "tokens per request (prompt + completion); 0 = the model's context length");
  cli.add_option("--backend", backend_name,
                 "what runs the model: engine (llmkit::serve::engine, continuous batching) or serial (one request "
                 "at a time)")
      .one_of({"engine", "serial"});
  cli.add_option("--max-batch", max_batch, "samples running at once (engine; the serial backend runs 1)")
      .count_at_least(1, "no request could run");
  cli.add_option("--kv-blocks", kv_blocks, "16-token KV blocks in the engine's pool; 0 = max-batch full contexts");
  cli.add_option("--kv-type", kv_type_name,
                 "element type of the engine's KV cache: f32, f16 or bf16 (half of f32's memory), int8 (about a "
                 "quarter)")
      .one_of(std::span<const std::string_view>(kv_type_names));
  cli.add_option("--kv-window", kv_window_name,
                 "KV of a model's local (sliding-window) layers (engine): ring (one ring of the window per request, "
                 "no prefix reuse for such models) or full (every position, with prefix reuse); the same tokens")
      .one_of(std::span<const std::string_view>(llmkit_examples::kv_window_names));
  cli.add_option("--draft", draft,
                 "speculative decoding (engine): ngram (prompt lookup), self (the model's weights as int8), or a GGUF "
                 "draft model of the same vocabulary; empty = off. A request opts out with \"speculative\": false");
  cli.add_option("--draft-max", draft_max,
                 "most guessed tokens per request and step (a request may ask for fewer: \"speculative.n_max\")")
      .in_range(1, 16);
  cli.add_option("--draft-max-decodes", draft_max_decodes,
                 "drafting is off in steps with more decodes than this (the batch is compute-bound); 0 = by the "
                 "drafter: 8 for ngram, 1 for a draft model");
  cli.add_option("--max-queue", max_queue, "requests waiting before new ones get 429")
      .count_at_least(1, "every request would get 429");
  cli.add_option("--api-key", api_key, "require 'Authorization: Bearer KEY' on /v1/ routes; empty = no key");
  cli.add_option("--chat-template", bo.chat_template,
                 "built-in chat template for /v1/chat/completions instead of the model's; empty = the model's")
      .one_of(llmkit::model::chat_template::names);
  cli.add_flag("--parse-special", bo.parse_special,
               "special-token texts in prompts and message contents become control tokens (trusted callers only)");
  std::string activations_name = "q8_0";
  cli.add_option("--activations", activations_name,
                 "what quantised matrices multiply: q8_0 (int8-quantised activations, the faster integer product) or "
                 "f32 (exact)")
      .one_of({"q8_0", "f32"});
  bool no_mmap = false;
  cli.add_flag("--no-mmap", no_mmap, "copy every weight into memory instead of reading the file's mapping in place");
  cli.add_flag("--mlock", bo.model.lock_weights,
               "lock the weights read in place in memory, so they are never paged out (needs ulimit -l)");
  cli.add_option("--max-body-bytes", max_body, "largest request body; larger ones get 413")
      .count_at_least(1, "every request would get 413");
  cli.add_option("--drain-seconds", drain_seconds,
                 "on SIGTERM, how long running requests may finish before they are cancelled")
      .non_negative();
  cli.add_option("--http-threads", http_limits.io_threads,
                 "threads running every connection's I/O (connections cost no thread)")
      .count_at_least(1, "no connection would be served");
  cli.add_option("--max-connections", http_limits.max_connections,
                 "open connections at once; past it a new one gets 503 and is closed")
      .count_at_least(1, "no connection would be served");
  cli.add_option("--max-header-bytes", http_limits.max_header_bytes, "largest request line + headers; larger get 431")
      .count_at_least(256, "no request line fits");
  double header_timeout = 10.0, body_timeout = 30.0, write_timeout = 30.0;
  cli.add_option("--header-timeout", header_timeout,
                 "seconds a connection may take to send a request's headers (also how long an idle keep-alive "
                 "connection stays open)")
      .in_range(0.001, 86400.0);
  cli.add_option("--body-timeout", body_timeout, "seconds a request's body may take after its headers")
      .in_range(0.001, 86400.0);
  cli.add_option("--write-timeout", write_timeout,
                 "seconds one write of a reply may take: a client that stops reading is disconnected")
      .in_range(0.001, 86400.0);
  grammar_limits glimits{};
  cli.add_option("--grammar-max-bytes", glimits.max_gbnf_bytes,
                 "structured output: largest grammar, as sent or converted from a JSON Schema (bytes)")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-rules", glimits.max_rules, "structured output: most grammar rules")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-elements", glimits.max_elements,
                 "structured output: most grammar elements, repetitions expanded")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-repetition", glimits.max_repetition,
                 "structured output: largest count of {m,n}, minLength, maxItems and the like")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-nesting", glimits.max_nesting, "structured output: parentheses nested in a rule")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-schema-depth", glimits.max_schema_depth,
                 "structured output: JSON Schema subschemas nested ($ref included)")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-positions", glimits.max_positions,
                 "structured output: matcher positions of one grammar (1 KiB and more each)")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-stacks", glimits.max_stacks,
                 "structured output: parses alive at one position (ambiguous grammars)")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-max-stack-depth", glimits.max_stack_depth,
                 "structured output: rules nested at one position")
      .count_at_least(1, "no grammar would compile");
  cli.add_option("--grammar-warm-up", glimits.warm_up_positions,
                 "structured output: positions built when a grammar is compiled (limits reached there give a 400)")
      .count_at_least(1, "no grammar would compile");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;

  const sigset_t signals = shutdown_signals();
  ::signal(SIGPIPE, SIG_IGN);
  try {
    bo.max_queue = max_queue;
    bo.model.activations =
        activations_name == "f32" ? llmkit::model::activation_type::f32 : llmkit::model::activation_type::q8_0;
    bo.model.weights_in_place = !no_mmap;
    // The file's size stands in for the weights one decode step reads.
    if (threads == 0) threads = llmkit_examples::default_threads(std::filesystem::file_size(bo.model_path));
    bo.threads = threads;
    std::unique_ptr<backend> model_ptr;
    if (!draft.empty() && backend_name == "serial") {
      std::cerr << "llmkit-server: --draft needs the engine backend\n";
      return 2;
    }
    if (backend_name == "serial") {
      model_ptr = std::make_unique<serial_backend>(bo);
    } else {
      model_ptr = make_engine_backend({.model_path = bo.model_path,
                                       .n_ctx = bo.n_ctx,
                                       .threads = threads,
                                       .max_queue = max_queue,
                                       .max_batch = max_batch,
                                       .kv_blocks = kv_blocks,
                                       .kv = *kv_type_of(kv_type_name),
                                       .window = *llmkit_examples::kv_window_of(kv_window_name),
                                       .chat_template = bo.chat_template,
                                       .parse_special = bo.parse_special,
                                       .model = bo.model,
                                       .draft = draft,
                                       .draft_max = draft_max,
                                       .draft_max_decodes = draft_max_decodes != 0
                                                                ? std::optional<std::size_t>(draft_max_decodes)
                                                                : std::nullopt});
    }
    backend& model = *model_ptr;
    server_state s{model};
    s.api_key = api_key;
    s.max_queue = max_queue;
    s.max_body_bytes = max_body;
    s.parse_special = bo.parse_special;
    s.seed_base = std::random_device{}();
    s.draft = speculation_of(draft, draft_max);
    s.limits.grammar = glimits;
    s.started = static_cast<std::int64_t>(std::time(nullptr));

    const auto ms = [](double seconds) { return std::chrono::milliseconds(static_cast<long long>(seconds * 1000)); };
    http_limits.max_body_bytes = max_body;
    http_limits.header_timeout = ms(header_timeout);
    http_limits.body_timeout = ms(body_timeout);
    http_limits.write_timeout = ms(write_timeout);
    http::server svr(
        http_limits, [&s](std::shared_ptr<http::exchange> ex) { route(ex, s); },
        [&s](int status, std::string message) {
          if (status == 413) return error_response(payload_too_large(s.max_body_bytes), s);
          return error_response({.status = status,
                                 .message = std::move(message),
                                 .type = status < 500 ? "invalid_request_error" : "server_error"},
                                s);
        });
    const int bound_port = svr.listen(host, static_cast<int>(port));
    const auto& info = model.info();
    std::cerr << "llmkit-server: model " << info.id << " (context " << info.n_ctx << ", vocab " << info.n_vocab << "), "
              << threads << " thread(s), backend " << backend_name
              << (backend_name == "serial" ? " (1 request at a time)"
                                          : " (max batch " + std::to_string(max_batch) + ", KV " + kv_type_name +
                                                (info.kv_layout.empty() ? "" : " " + info.kv_layout) +
                                                (draft.empty() ? "" : ", draft " + draft + " k " + std::to_string(draft_max)) +
                                                ")")
              << ", queue " << max_queue << "\n";
    std::printf("llmkit-server: listening on http://%s:%d\n", host.c_str(), bound_port);
    std::fflush(stdout);
    svr.start();

    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::cerr << "llmkit-server: signal " << signal_number << ": draining (new requests get 503)\n";
    s.draining = true;
    const auto deadline = steady::now() + std::chrono::duration<double>(drain_seconds);
    while (s.in_flight > 0 && steady::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (s.in_flight > 0) {
      std::cerr << "llmkit-server: " << s.in_flight << " request(s) still running at the deadline: cancelled\n";
      model.cancel_all();
      const auto grace = steady::now() + std::chrono::seconds(1);
      while (s.in_flight > 0 && steady::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    svr.stop();  // closes every connection, whatever its client is doing
    model_ptr.reset();  // the backend's callbacks hold exchanges of the server's connections
    std::cerr << "llmkit-server: stopped\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
