// SPDX-License-Identifier: MIT
// llmkit-server tried as an attacker would, over raw loopback sockets: one
// test case per class of hostile input (headers, bodies in every framing,
// slow and idle clients, shutdown, disconnects, ranges, pipelining,
// half-closes, HTTP/1.0, conflicting framing), each with several payloads.
// The memory classes bound the server's resident-memory growth
// (/proc/PID/status). Every loop and wait is bounded.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "server_process.hpp"

#include <sys/socket.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using llmkit_server_test::raw_connection;
using llmkit_server_test::resident_bytes;
using llmkit_server_test::server_process;
using json = nlohmann::json;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

const std::string completion_body = R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})";

std::string post_request(const std::string& body, const std::string& extra_headers = "") {
  return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

/// The status code of the first response in `reply` ("HTTP/1.x NNN ..."), or 0.
int status_of(const std::string& reply) {
  const auto at = reply.find("HTTP/1.");
  if (at == std::string::npos || reply.size() < at + 12) return 0;
  return std::stoi(reply.substr(at + 9, 3));
}

/// The status of the first final (non-1xx) response in `reply`, or 0.
int final_status_of(std::string reply) {
  while (true) {
    const int status = status_of(reply);
    if (status < 100 || status >= 200) return status;
    const auto end = reply.find("\r\n\r\n");
    if (end == std::string::npos) return 0;
    reply = reply.substr(end + 4);
  }
}

/// One request on a fresh connection: the whole reply (until the server
/// closes, or `until` appears).
std::string exchange(int port, const std::string& bytes, std::string_view until = "\r\n\r\n") {
  raw_connection c(port);
  c.send(bytes);
  return c.read(10s, until);
}

/// GET /health on a fresh connection: its status and how long it took.
std::pair<int, double> timed_health(int port) {
  const auto t0 = clock_type::now();
  raw_connection c(port);
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string reply = c.read(5s, "}");
  return {status_of(reply), std::chrono::duration<double>(clock_type::now() - t0).count()};
}

}  // namespace

TEST_CASE("header limits: too many fields or too many bytes get 431, however they are sent") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  SECTION("101 small fields") {
    std::string fields;
    for (int i = 0; i < 101; ++i) fields += "X-F" + std::to_string(i) + ": v\r\n";
    CHECK(status_of(exchange(s.port(), "GET /health HTTP/1.1\r\n" + fields + "\r\n")) == 431);
  }
  SECTION("100 fields are accepted") {
    std::string fields;
    for (int i = 0; i < 99; ++i) fields += "X-F" + std::to_string(i) + ": v\r\n";
    CHECK(status_of(exchange(s.port(), "GET /health HTTP/1.1\r\nHost: x\r\n" + fields + "\r\n")) == 200);
  }
  SECTION("one 20 KB field") {
    CHECK(status_of(exchange(s.port(), "GET /health HTTP/1.1\r\nX-Big: " + std::string(20'000, 'a') + "\r\n\r\n")) == 431);
  }
  SECTION("a 20 KB request target") {
    CHECK(status_of(exchange(s.port(), "GET /" + std::string(20'000, 'a') + " HTTP/1.1\r\n\r\n")) == 431);
  }
  SECTION("420k tiny fields streamed: refused before they are all read") {
    raw_connection c(s.port());
    c.send("GET /health HTTP/1.1\r\n");
    std::string batch;
    for (int i = 0; i < 1000; ++i) batch += "a:b\r\n";
    bool refused = false;
    for (int i = 0; i < 420 && !refused; ++i) refused = !c.send(batch) || c.read(1ms).size() > 0;
    const std::string reply = c.read(2s, "\r\n\r\n");
    CHECK((refused || status_of(reply) == 431));
  }
  CHECK(resident_bytes(s.pid()) < rss0 + (8u << 20));
  CHECK(timed_health(s.port()).first == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("body limits hold for every framing: Content-Length, chunked, none, compressed") {
  server_process s({"--max-body-bytes", "65536"});
  const std::size_t rss0 = resident_bytes(s.pid());
  SECTION("Content-Length over the limit: 413 before the body is sent") {
    const std::string head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 134217728\r\n\r\n";
    const std::string reply = exchange(s.port(), head);
    CHECK(status_of(reply) == 413);
  }
  SECTION("a body exactly at the limit is read (and parsed: 400, not 413)") {
    std::string body = R"({"prompt": "Once", "max_tokens": 1, "user": ")";
    body += std::string(65536 - body.size() - 2, 'x') + "\"}";
    REQUIRE(body.size() == 65536);
    const int status = status_of(exchange(s.port(), post_request(body)));
    CHECK(status != 413);
    CHECK(status != 0);
  }
  SECTION("128 MB chunked: 413 after the limit, memory stays bounded") {
    raw_connection c(s.port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "10000\r\n" + std::string(0x10000, ' ') + "\r\n";
    std::string reply;
    for (int i = 0; i < 2048 && reply.empty(); ++i) {  // 2048 x 64 KB = 128 MB
      if (!c.send(chunk)) break;
      reply = c.read(0ms);
    }
    reply += c.read(3s, "\r\n\r\n");
    CHECK(status_of(reply) == 413);
    CHECK(resident_bytes(s.pid()) < rss0 + (8u << 20));
  }
  SECTION("many small chunks, and a chunk-size line that never ends") {
    raw_connection c(s.port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string reply;
    for (int i = 0; i < 100'000 && reply.empty(); ++i) {
      if (!c.send("1\r\n \r\n")) break;
      if (i % 1000 == 0) reply = c.read(0ms);
    }
    reply += c.read(3s, "\r\n\r\n");
    CHECK(status_of(reply) == 413);
    const std::string endless = exchange(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                                                       std::string(100'000, '1'));
    CHECK(status_of(endless) / 100 == 4);
  }
  SECTION("compressed bodies are refused: 415") {
    for (const char* coding : {"gzip", "br", "deflate", "x-gzip", "gzip, identity"}) {
      INFO(coding);
      const std::string reply =
          exchange(s.port(), post_request(std::string(300, 'z'), std::string("Content-Encoding: ") + coding + "\r\n"));
      CHECK(status_of(reply) == 415);
    }
    CHECK(status_of(exchange(s.port(), post_request(completion_body, "Content-Encoding: identity\r\n"))) == 200);
  }
  SECTION("no length at all: the request has no body (400), what follows is not a request (400)") {
    const std::string reply = exchange(s.port(),
                                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n" +
                                           std::string(1'000'000, '{'),
                                       "never");
    CHECK(status_of(reply) == 400);
    CHECK(resident_bytes(s.pid()) < rss0 + (8u << 20));
  }
  CHECK(timed_health(s.port()).first == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("conflicting framing gets 400: two Content-Lengths, Content-Length with Transfer-Encoding") {
  server_process s;
  const std::string body = completion_body;
  const std::string cl = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  const std::vector<std::string> heads{
      "Content-Length: 5\r\n" + cl,
      cl + "Content-Length: 5\r\n",
      cl + "Transfer-Encoding: chunked\r\n",
      "Transfer-Encoding: chunked\r\n" + cl,
      "Content-Length: -1\r\n",
      "Content-Length: 1e3\r\n",
      "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
  };
  for (const auto& h : heads) {
    INFO(h);
    const std::string reply = exchange(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + h + "\r\n" + body);
    CHECK(status_of(reply) == 400);
  }
  CHECK(status_of(exchange(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")) == 501);
  CHECK(s.stop() == 0);
}

TEST_CASE("slow and idle clients hold no worker: 300 trickling connections, /health under 1 s, a completion runs") {
  server_process s({"--header-timeout", "30"});
  std::vector<std::unique_ptr<raw_connection>> slow;
  for (int i = 0; i < 300; ++i) slow.push_back(std::make_unique<raw_connection>(s.port()));
  const std::string request = post_request(completion_body);
  // Every connection sends one more byte of its request each second, for 3 s.
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (std::size_t byte = 0; byte < 4 && !stop; ++byte) {
      for (auto& c : slow) c->send(request.substr(byte, 1));
      for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(1500ms);
  for (int i = 0; i < 3; ++i) {
    const auto [status, seconds] = timed_health(s.port());
    CHECK(status == 200);
    CHECK(seconds < 1.0);
  }
  const std::string reply = exchange(s.port(), request, "}}");
  CHECK(status_of(reply) == 200);
  CHECK(reply.find("\"completion_tokens\":8") != std::string::npos);
  stop = true;
  trickle.join();
  CHECK(s.stop() == 0);
}

TEST_CASE("deadlines: a request's headers and body must arrive in time, and idle keep-alive connections close") {
  server_process s({"--header-timeout", "1", "--body-timeout", "1"});
  SECTION("headers trickled past the deadline: 408 and closed") {
    raw_connection c(s.port());
    const auto t0 = clock_type::now();
    std::string reply;
    for (int i = 0; i < 40 && !c.closed_by_server(); ++i) {
      c.send("X");
      reply += c.read(100ms);
    }
    CHECK(c.closed_by_server());
    CHECK(std::chrono::duration<double>(clock_type::now() - t0).count() < 3.0);
    CHECK(status_of(reply) == 408);
  }
  SECTION("a body that stops arriving") {
    raw_connection c(s.port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
    const std::string reply = c.read(4s);
    CHECK(c.closed_by_server());
    CHECK(status_of(reply) == 408);
  }
  SECTION("an idle connection, before and after a request") {
    raw_connection idle(s.port());
    idle.read(3s);
    CHECK(idle.closed_by_server());
    raw_connection kept(s.port());
    kept.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string reply = kept.read(4s);
    CHECK(status_of(reply) == 200);
    CHECK(kept.closed_by_server());
  }
  CHECK(s.stop() == 0);
}

TEST_CASE("connections past --max-connections get 503 and the server keeps serving") {
  server_process s({"--max-connections", "20"});
  std::vector<std::unique_ptr<raw_connection>> held;
  for (int i = 0; i < 20; ++i) held.push_back(std::make_unique<raw_connection>(s.port()));
  std::this_thread::sleep_for(200ms);
  raw_connection extra(s.port());
  const std::string reply = extra.read(3s);
  CHECK(status_of(reply) == 503);
  CHECK(extra.closed_by_server());
  held.clear();
  std::this_thread::sleep_for(300ms);
  CHECK(timed_health(s.port()).first == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("SIGTERM ends the process within --drain-seconds + 2 s whatever clients do") {
  server_process s({"--drain-seconds", "1"});
  raw_connection trickler(s.port());
  trickler.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{");
  raw_connection idle(s.port());
  raw_connection reader(s.port());  // a stream it never reads
  reader.send(post_request(R"({"prompt": "Once", "max_tokens": 2000, "stream": true, "logit_bias": {"2": -100}})"));
  raw_connection waiting(s.port());  // a long non-streamed request
  waiting.send(post_request(R"({"prompt": "Once", "max_tokens": 2000, "n": 8, "logit_bias": {"2": -100}})"));
  std::this_thread::sleep_for(300ms);
  const auto t0 = clock_type::now();
  CHECK(s.stop() == 0);
  CHECK(std::chrono::duration<double>(clock_type::now() - t0).count() < 3.0);
}

TEST_CASE("a non-streamed request whose client goes away is cancelled and frees its KV blocks") {
  server_process s;
  {
    raw_connection c(s.port());
    c.send(post_request(R"({"prompt": "Once upon a time", "max_tokens": 2000, "n": 8, "logit_bias": {"2": -100}})"));
    std::this_thread::sleep_for(300ms);
  }  // closed
  auto metric = [&](const std::string& name) {
    const std::string reply = exchange(s.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "never");
    const auto at = reply.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(reply.substr(at + name.size() + 2));
  };
  double cancelled = 0;
  for (int i = 0; i < 100 && cancelled < 8; ++i) {
    std::this_thread::sleep_for(20ms);
    cancelled = metric("llmkit_requests_total{finish_reason=\"cancelled\"}");
  }
  CHECK(cancelled == 8);
  CHECK(metric("llmkit_kv_blocks_used") == 0);
  CHECK(metric("llmkit_generated_tokens_total") < 16000);
  CHECK(s.stop() == 0);
}

TEST_CASE("a client that half-closes still gets its reply, streamed or not") {
  server_process s;
  for (const bool stream : {false, true}) {
    INFO("stream " << stream);
    raw_connection c(s.port());
    const std::string body = stream ? R"({"prompt": "Once upon a time", "max_tokens": 8, "stream": true})" : completion_body;
    c.send(post_request(body, "Connection: close\r\n"));
    c.shutdown_write();
    const std::string reply = c.read(10s);
    CHECK(final_status_of(reply) == 200);
    CHECK(reply.find(stream ? "data: [DONE]" : "\"completion_tokens\":8") != std::string::npos);
  }
  // A long request: the server probes the half-closed socket (an interim 100) and still answers.
  raw_connection c(s.port());
  c.send(post_request(R"({"prompt": "Once", "max_tokens": 1000, "n": 2, "logit_bias": {"2": -100}})", "Connection: close\r\n"));
  c.shutdown_write();
  const std::string reply = c.read(30s);
  CHECK(final_status_of(reply) == 200);
  CHECK(reply.find("\"completion_tokens\":2000") != std::string::npos);
  CHECK(s.stop() == 0);
}

TEST_CASE("no Range handling: ranges get the whole reply") {
  server_process s;
  std::string ranges = "bytes=0-0";
  while (ranges.size() < 8000) ranges += ",0-0";
  for (const std::string& r : {std::string("bytes=0-10"), std::string("bytes=-5"), ranges}) {
    const std::string reply = exchange(s.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nRange: " + r + "\r\nConnection: close\r\n\r\n", "never");
    CHECK(status_of(reply) == 200);
    CHECK(reply.find("Content-Range") == std::string::npos);
    CHECK(reply.size() < 64 * 1024);
  }
  CHECK(s.stop() == 0);
}

TEST_CASE("pipelined requests are answered in order") {
  server_process s;
  raw_connection c(s.port());
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post_request(completion_body) +
         "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string reply = c.read(10s);
  const auto health = reply.find("\"status\":\"ok\"");
  const auto completion = reply.find("\"text_completion\"");
  const auto models = reply.find("\"object\":\"list\"");
  const auto nope = reply.find("404 Not Found");
  REQUIRE(health != std::string::npos);
  REQUIRE(completion != std::string::npos);
  REQUIRE(models != std::string::npos);
  REQUIRE(nope != std::string::npos);
  CHECK(health < completion);
  CHECK(completion < models);
  CHECK(models < nope);
  CHECK(c.closed_by_server());
  CHECK(s.stop() == 0);
}

TEST_CASE("HTTP/1.0 clients get no chunked encoding: a stream ends when the connection does") {
  server_process s;
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 8, "stream": true})";
  raw_connection c(s.port());
  c.send("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string reply = c.read(10s);
  CHECK(reply.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(reply.find("Transfer-Encoding") == std::string::npos);
  CHECK(reply.find("data: [DONE]") != std::string::npos);
  CHECK(c.closed_by_server());
  // Non-streamed 1.0: a Content-Length and the connection closed (no keep-alive asked).
  const std::string plain = exchange(s.port(), "GET /health HTTP/1.0\r\n\r\n", "never");
  CHECK(plain.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(plain.find("Content-Length:") != std::string::npos);
  CHECK(s.stop() == 0);
}

TEST_CASE("deep nesting anywhere in a body gets 400 with a short message, and the server lives") {
  server_process s;
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const std::vector<std::string> bodies{
      R"({"prompt": "Once", "temperature": )" + deep + "}",
      R"({"prompt": "Once", "stop": )" + deep + "}",
      R"({"prompt": "Once", "seed": )" + deep + "}",
      R"({"prompt": "Once", "unknown_field": )" + deep + "}",
      R"({"prompt": )" + std::string(50'000, '{') + "}",
      deep,
  };
  for (const auto& body : bodies) {
    const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
    CHECK(status_of(reply) == 400);
    CHECK(reply.size() < 2048);
  }
  const std::string chat = R"({"messages": [{"role": "user", "content": )" + deep + "}]}";
  const std::string reply = exchange(s.port(),
                                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                                         std::to_string(chat.size()) + "\r\n\r\n" + chat,
                                     "never");
  CHECK(status_of(reply) == 400);
  CHECK(timed_health(s.port()).first == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("numbers whose effect overflows are refused with the parameter named, and no NaN reaches a reply") {
  server_process s;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"repetition_penalty", "1e-40"}, {"top_p", "1e-300"}, {"temperature", "1e-30"},
      {"min_p", "1e-300"},             {"frequency_penalty", "1e39"}};
  for (const auto& [name, value] : cases) {
    INFO(name << " = " << value);
    const std::string body = R"({"prompt": "Once", "max_tokens": 4, ")" + name + "\": " + value + "}";
    const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
    CHECK(status_of(reply) == 400);
    CHECK(reply.find("\"param\":\"" + name + "\"") != std::string::npos);
  }
  // A number no double holds is a JSON error: 400 too.
  CHECK(status_of(exchange(s.port(), post_request(R"({"prompt": "Once", "temperature": 1e400})", "Connection: close\r\n"),
                           "never")) == 400);
  // The extremes that are accepted give finite logprobs.
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 16, "logprobs": 5, "temperature": 0.01, "repetition_penalty": 0.01, "logit_bias": {"2": -100, "5": 100}})";
  const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
  CHECK(status_of(reply) == 200);
  for (const char* bad : {"NaN", "nan", "Infinity", "inf", "null,\"finish"}) CHECK(reply.find(bad) == std::string::npos);
  CHECK(s.stop() == 0);
}

TEST_CASE("a user's text is text: </s> in a prompt does not end the completion") {
  server_process s;
  const std::string body = R"({"prompt": "Once upon a time</s>", "max_tokens": 8, "temperature": 0, "logprobs": 1})";
  const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
  REQUIRE(status_of(reply) == 200);
  const json r = json::parse(reply.substr(reply.find("\r\n\r\n") + 4));
  // Typed as text, "</s>" is several ordinary tokens: the prompt is longer than "Once upon a time" + 1.
  CHECK(r.at("usage").at("prompt_tokens").get<int>() > 6);
  CHECK(s.stop() == 0);
}

namespace {

/// Posts `{"prompt": "Once", "max_tokens": 8, <field>}` and requires a 400
/// naming `param` within `max_seconds`; returns the error message.
std::string require_grammar_400(int port, const std::string& field, const std::string& param,
                                double max_seconds = 10.0) {
  const std::string body = R"({"prompt": "Once", "max_tokens": 8, )" + field + "}";
  const auto t0 = clock_type::now();
  const std::string reply = exchange(port, post_request(body, "Connection: close\r\n"), "never");
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  INFO("payload of " << body.size() << " bytes: " << body.substr(0, 160) << " -> " << reply.substr(0, 400));
  CHECK(status_of(reply) == 400);
  CHECK(seconds < max_seconds);  // a hung compile would hold the reply (bounded wait, not a timing test)
  CHECK(reply.find("\"param\":\"" + param) != std::string::npos);
  CHECK(reply.size() < 4096);
  const auto at = reply.find("\r\n\r\n");
  if (at == std::string::npos) return {};
  const json r = json::parse(reply.substr(at + 4), nullptr, false);
  return r.is_discarded() ? std::string() : r.at("error").at("message").get<std::string>();
}

std::string schema_field(const std::string& schema) {
  return R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": )" +
         schema + "}}";
}
std::string grammar_field(const std::string& gbnf) { return R"("grammar": )" + json(gbnf).dump(); }

/// After an attack class: memory grew by less than `max_growth`, /health
/// answers, and a constrained request still completes.
void require_serving(server_process& s, std::size_t rss0, std::size_t max_growth = 64u << 20) {
#if defined(__SANITIZE_ADDRESS__)
  max_growth += std::size_t{256} << 20;  // ASan's quarantine (256 MiB by default) keeps freed blocks resident
#endif
  CHECK(resident_bytes(s.pid()) < rss0 + max_growth);
  CHECK(timed_health(s.port()).first == 200);
  const std::string body =
      R"({"prompt": "Once", "max_tokens": 64, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}})";
  const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
  REQUIRE(status_of(reply) == 200);
  const json r = json::parse(reply.substr(reply.find("\r\n\r\n") + 4));
  const std::string text = r.at("choices")[0].at("text").get<std::string>();
  CHECK((text == "true" || text == "false"));
  CHECK(r.at("choices")[0].at("finish_reason") == "stop");
}

}  // namespace

TEST_CASE("structured output: deep and cyclic $ref chains get 400 naming where, the server lives") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  // Cycles that consume nothing (left recursion), through one, two and many definitions.
  CHECK_THAT(require_grammar_400(s.port(), schema_field(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})"),
                                 "response_format.json_schema.schema"),
             Catch::Contains("recurs"));
  require_grammar_400(s.port(),
                      schema_field(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}})"),
                      "response_format.json_schema.schema");
  std::string defs;
  for (int i = 0; i < 3000; ++i)
    defs += (i ? ", " : "") + ("\"d" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" + std::to_string((i + 1) % 3000) + "\"}");
  require_grammar_400(s.port(), schema_field(R"({"$ref": "#/$defs/d0", "$defs": {)" + defs + "}}"),
                      "response_format.json_schema.schema");
  // A chain of 3000 definitions, each an array of the next: deeper than allowed.
  defs.clear();
  for (int i = 0; i < 3000; ++i)
    defs += (i ? ", " : "") + ("\"d" + std::to_string(i) + "\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/d" +
                               std::to_string(i + 1) + "\"}}");
  defs += R"(, "d3000": {"type": "integer"})";
  CHECK_THAT(require_grammar_400(s.port(), R"("json_schema": {"$ref": "#/$defs/d0", "$defs": {)" + defs + "}}", "json_schema"),
             Catch::Contains("deeper"));
  // The same cycles in GBNF.
  require_grammar_400(s.port(), grammar_field("root ::= a\na ::= b\nb ::= a | \"x\"\n"), "grammar");
  require_serving(s, rss0);
  CHECK(s.stop() == 0);
}

TEST_CASE("structured output: huge repetition counts get 400, in GBNF, schemas and patterns") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  for (const char* g : {"root ::= \"a\"{1000000}\n", "root ::= [a-z]{0,99999999}\n", "root ::= \"a\"{5,4294967296}\n",
                        "root ::= (\"ab\"{1000} \"c\"){1025}\n"})
    require_grammar_400(s.port(), grammar_field(g), "grammar");
  for (const char* schema : {R"({"type": "string", "minLength": 5000000})", R"({"type": "string", "maxLength": 100000})",
                             R"({"type": "array", "items": {"type": "integer"}, "maxItems": 99999})",
                             R"({"type": "array", "minItems": 18446744073709551615})",
                             R"({"type": "string", "pattern": "^a{100000}$"})"})
    require_grammar_400(s.port(), schema_field(schema), "response_format.json_schema.schema");
  require_serving(s, rss0);
  CHECK(s.stop() == 0);
}

TEST_CASE("structured output: exponential alternations get 400 when compiled, not a swollen server") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  // Each 'a' multiplies the live parses by 16: past --grammar-max-stacks within four bytes.
  std::string g = "root ::= s\ns ::= \"\"";
  for (const char c : std::string("0123456789abcdef")) g += std::string(" | \"a\" s \"") + c + "\"";
  require_grammar_400(s.port(), grammar_field(g + "\n"), "grammar");
  // 2000 alternatives sharing every prefix.
  std::string alts = "root ::= \"x\"";
  for (int i = 0; i < 2000; ++i) alts += " | \"xx" + std::to_string(i) + "\"";
  require_grammar_400(s.port(), grammar_field(alts + "\n"), "grammar");
  std::string consts;
  for (int i = 0; i < 2000; ++i) consts += (i ? ", " : "") + ("{\"const\": \"item " + std::to_string(i) + "\"}");
  require_grammar_400(s.port(), schema_field(R"({"anyOf": [)" + consts + "]}"), "response_format.json_schema.schema");
  // Doubling rules: r20 is 2^20 ambiguous ways of one string.
  std::string doubling = "root ::= r20\nr0 ::= \"a\" | \"a\"\n";
  for (int i = 1; i <= 20; ++i)
    doubling += "r" + std::to_string(i) + " ::= r" + std::to_string(i - 1) + " r" + std::to_string(i - 1) + " | r" +
                std::to_string(i - 1) + " \"b\" r" + std::to_string(i - 1) + "\n";
  const std::string body = R"({"prompt": "Once", "max_tokens": 8, )" + grammar_field(doubling) + "}";
  const std::string reply = exchange(s.port(), post_request(body, "Connection: close\r\n"), "never");
  CHECK((status_of(reply) == 400 || status_of(reply) == 200));  // a 200 ends within its 8 tokens
  require_serving(s, rss0);
  CHECK(s.stop() == 0);
}

TEST_CASE("structured output: enormous enums and alternations get 400 for their size") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  std::string values;
  for (int i = 0; i < 60000; ++i) values += (i ? ", " : "") + ("\"v" + std::to_string(i) + "\"");
  CHECK_THAT(require_grammar_400(s.port(), schema_field(R"({"enum": [)" + values + "]}"),
                                 "response_format.json_schema.schema"),
             Catch::Contains("bytes"));
  require_grammar_400(s.port(), R"("json_schema": {"type": "string", "enum": [)" + values + "]}", "json_schema");
  std::string alts = "root ::= \"v0\"";
  for (int i = 1; i < 30000; ++i) alts += " | \"v" + std::to_string(i) + "\"";
  require_grammar_400(s.port(), grammar_field(alts + "\n"), "grammar");
  require_serving(s, rss0);
  CHECK(s.stop() == 0);
}

TEST_CASE("structured output: 100k-deep nesting in GBNF and patterns, long rule chains, deep schemas get 400") {
  server_process s;
  const std::size_t rss0 = resident_bytes(s.pid());
  const std::size_t depth = 100'000;
  require_grammar_400(s.port(), grammar_field("root ::= " + std::string(depth, '(') + "\"a\"" + std::string(depth, ')') + "\n"),
                      "grammar");
  std::string chain;
  for (int i = 0; i < 30000; ++i) {
    chain += 'r';
    chain += std::to_string(i) + " ::= \"(\" r" + std::to_string(i + 1) + " \")\"\n";
  }
  require_grammar_400(s.port(), grammar_field("root ::= r0\n" + chain + "r30000 ::= \"x\"\n"), "grammar");
  require_grammar_400(s.port(),
                      schema_field(R"({"type": "string", "pattern": ")" + std::string(depth, '(') + "a" + std::string(depth, ')') + "\"}"),
                      "response_format.json_schema.schema");
  // A schema nested 30k deep (a 1 MiB body) is refused by the body's own depth limit.
  std::string nested;
  for (std::size_t i = 0; i < 30'000; ++i) nested += R"({"type": "array", "items": )";
  nested += "{}" + std::string(30'000, '}');
  const std::string body = R"({"prompt": "Once", )" + schema_field(nested) + "}";
  CHECK(status_of(exchange(s.port(), post_request(body, "Connection: close\r\n"), "never")) == 400);
  // A grammar that nests rules as it reads reaches --grammar-max-stack-depth when compiled; sent again, it is
  // compiled again (a grammar that failed is not cached) and refused again.
  for (int attempt = 0; attempt < 2; ++attempt)
    CHECK_THAT(require_grammar_400(s.port(), grammar_field("root ::= \"(\" root \")\" | \"(\" root | \"x\"\n"), "grammar"),
               Catch::Contains("deeper than"));
  require_serving(s, rss0);
  CHECK(s.stop() == 0);
}
