// SPDX-License-Identifier: MIT
// libFuzzer target for llmkit-server's HTTP layer (examples/server/
// http_server.hpp) and what follows it: raw request bytes go through the
// server's own parser, limits and head checks (parse_request_bytes), and an
// accepted request to a generation route goes on through the protocol
// (openai_protocol.hpp). Every input must give a request within the limits
// or a refusal with a status the server documents and a short message, then
// a checked request or a 4xx; never a throw, a crash or a sanitizer report.
// Build: clang++-14 -std=c++20 -march=native -fsanitize=fuzzer,address,undefined
//   -Iinclude -Iexamples/server fuzz/http_fuzzer.cpp examples/server/http_server.cpp
//   examples/server/openai_protocol.cpp examples/server/tool_calls.cpp (tests/server_protocol.cmake does it in sanitizer builds).
#include <boost/beast/core/string.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "http_server.hpp"
#include "openai_protocol.hpp"

namespace {

using namespace llmkit_server;

[[noreturn]] void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "http_fuzzer: %s %.*s\n", what, static_cast<int>(std::min<std::size_t>(detail.size(), 300)),
               detail.data());
  std::abort();
}

void check(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

// Small limits, so that the fuzzer reaches them.
constexpr http::limits fuzz_limits{.max_header_bytes = 2048, .max_header_fields = 16, .max_body_bytes = 4096};

void check_request(const http::request& r) {
  check(r.body.size() <= fuzz_limits.max_body_bytes, "a body over the limit was accepted");
  check(r.headers.size() <= fuzz_limits.max_header_fields, "more fields than the limit were accepted");
  check(r.version == 10 || r.version == 11, "an HTTP version other than 1.0 and 1.1 was accepted");
  check(r.path.size() <= r.target.size(), "the path is longer than the target");
  const std::string encoding = r.header("Content-Encoding");
  check(encoding.empty() || boost::beast::iequals(encoding, "identity"), "a compressed body was accepted", encoding);
  const bool completions = r.path == "/v1/completions", chat = r.path == "/v1/chat/completions";
  if (r.method != "POST" || (!completions && !chat)) return;
  const auto parsed = parse_request(chat ? api_kind::chat_completions : api_kind::completions, r.body,
                                    model_limits{.n_ctx = 512, .n_vocab = 1000}, request_limits{});
  if (const auto* e = std::get_if<api_error>(&parsed)) {
    check(e->status >= 400 && e->status < 500, "protocol error outside 4xx", e->message);
    check(e->message.size() <= 600, "protocol error message too long", e->message);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto result = http::parse_request_bytes(bytes, fuzz_limits);
  if (const auto* r = std::get_if<http::request>(&result)) {
    check_request(*r);
    return 0;
  }
  const auto& refused = std::get<http::refusal>(result);
  switch (refused.status) {
    case 400: case 413: case 415: case 417: case 431: case 501: break;
    default: fail("a refusal status the server does not document", std::to_string(refused.status));
  }
  check(!refused.message.empty() && refused.message.size() <= 300, "refusal message empty or too long", refused.message);
  return 0;
}
