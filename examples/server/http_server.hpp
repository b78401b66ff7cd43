// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/http_server.hpp
/// llmkit-server's HTTP/1.1 layer: an asynchronous server on Boost.Beast and
/// Asio (http_server.cpp) that holds its limits for every way a request can
/// arrive. Connections cost no thread: a few I/O threads serve them all, so a
/// slow or idle client never holds a worker another client needs. Headers,
/// bodies (by Content-Length or chunked) and the time to send them are
/// bounded; compressed bodies are refused; requests pipelined on one
/// connection are answered in order; a client that goes away while its
/// request runs is reported to the handler (on_disconnect), and a client
/// that only half-closes still gets its reply. No Range handling, no
/// compression, no TLS. Beast stays inside http_server.cpp.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace llmkit_server::http {

/// What a client may send and how long it may take (docs/serving.md, "Limits").
struct limits {
  std::size_t max_header_bytes = 16 * 1024;  ///< request line + fields; larger: 431
  std::size_t max_header_fields = 100;       ///< fields per request; more: 431
  std::size_t max_body_bytes = 1 << 20;      ///< decoded body (Content-Length or chunked); larger: 413
  /// From the first byte a connection may send (or the end of its previous
  /// reply, on keep-alive) to the end of the request's headers: a connection
  /// idle or trickling for longer is closed.
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};   ///< from the end of the headers to the end of the body
  std::chrono::milliseconds write_timeout{30'000};  ///< each write of a reply or of a stream's pending events
  std::size_t max_connections = 512;                ///< open at once; past it a new one gets 503 and is closed
  std::size_t io_threads = 2;                       ///< threads running every connection's I/O
};

using header_list = std::vector<std::pair<std::string, std::string>>;

/// One request, read in full and within the limits.
struct request {
  std::string method;   ///< "GET", "POST", ...
  std::string target;   ///< as sent: path and query
  std::string path;     ///< target without the query
  unsigned version = 11;  ///< 10 = HTTP/1.0, 11 = HTTP/1.1
  header_list headers;
  std::string body;
  /// The first field named `name` (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

/// Why the HTTP layer refuses a request before the application sees it.
struct refusal {
  int status = 400;  ///< 400, 408, 413, 415, 417, 431, 501
  std::string message;
};

/// Parses one whole request from `bytes` with the server's parser, limits
/// and checks, as if it had arrived on a connection (for the protocol
/// fuzzer and tests): the request, or what the server would answer.
/// Bytes after the request are ignored; an incomplete request is a 400.
std::variant<request, refusal> parse_request_bytes(std::string_view bytes, const limits& lim);

/// A whole reply (Content-Length framing).
struct response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  header_list headers{};  ///< extra fields (e.g. Retry-After)
};

/// One request's way back to its client. The handler may answer at once or
/// keep the pointer and answer later from any thread: either `reply` once, or
/// `start_stream`, `write`... and `finish`. Every call is thread-safe and
/// never blocks (bytes are queued for the connection's I/O thread); calls
/// after the client went away, or after the answer ended, do nothing.
class exchange {
 public:
  virtual ~exchange() = default;
  virtual const request& req() const = 0;
  virtual void reply(response r) = 0;
  /// Starts a streamed reply: chunked for HTTP/1.1 clients, delimited by
  /// closing the connection for HTTP/1.0 ones.
  virtual void start_stream(int status, std::string content_type, header_list headers = {}) = 0;
  virtual void write(std::string data) = 0;
  virtual void finish() = 0;
  /// `f` runs once (on an I/O thread; at once if it already happened) when the
  /// client is gone before the answer ended: its socket reset, a write failed
  /// or timed out, or the server stops.
  virtual void on_disconnect(std::function<void()> f) = 0;
};

/// Called on an I/O thread for each request; must not block.
using handler = std::function<void(std::shared_ptr<exchange>)>;

/// Builds the reply to a request the HTTP layer refuses itself (400, 408,
/// 413, 415, 431, 503), so the application can give it its own body format.
using error_reply = std::function<response(int status, std::string message)>;

/// The server: listen, start, stop. Not copyable.
class server {
 public:
  server(limits lim, handler on_request, error_reply on_error);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds and listens (backlog 1024); returns the port (`port` 0: any free one).
  /// Throws std::runtime_error naming the address when it cannot.
  int listen(const std::string& host, int port);
  /// Starts accepting on `limits::io_threads` threads.
  void start();
  /// Stops accepting, closes every connection (their handlers' on_disconnect
  /// run) and joins the I/O threads. Idempotent.
  void stop();
  /// Connections open now.
  std::size_t n_connections() const;

  struct impl;  ///< defined in http_server.cpp

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace llmkit_server::http
