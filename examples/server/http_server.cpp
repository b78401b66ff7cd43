// SPDX-License-Identifier: MIT
// llmkit-server's HTTP/1.1 layer on Boost.Beast's parser and Asio sockets
// (http_server.hpp says what it promises). Each connection lives on its own
// strand; its replies are formatted here (they are short and few kinds).
#include "http_server.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace llmkit_server::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

std::string request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name)) return v;
  return {};
}

namespace {

// Bytes a connection may buffer beyond the header limit: body pieces pass
// through on their way to the parser, and requests pipelined behind the one
// being answered wait here.
constexpr std::size_t read_slack_bytes = 64 * 1024;
constexpr std::size_t read_piece_bytes = 4096;
// After a reply that closes the connection, what the client still sends is
// read and dropped for this long (at most this many bytes), so that closing
// with unread data does not reset the connection before the reply arrives.
constexpr auto linger_time = std::chrono::milliseconds(1000);
constexpr std::size_t linger_bytes = 1 << 20;
// A client that half-closed while its whole reply is pending: after this
// long it gets an interim 100 (a closed socket answers it with a reset),
// then its socket is looked at this often.
constexpr auto half_close_probe_delay = std::chrono::milliseconds(200);
constexpr auto half_close_poll = std::chrono::milliseconds(50);

std::string status_line(int status, unsigned version) {
  std::string s = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  s += std::to_string(status);
  s += ' ';
  s += std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
  s += "\r\n";
  return s;
}

void add_field(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  out += value;
  out += "\r\n";
}

bool is_http_parse_error(const error_code& ec) { return ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category(); }

// Linux: has the peer reset the connection (state CLOSE) since it half-closed?
bool connection_reset(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
  return info.tcpi_state == TCP_CLOSE;
}

// What the server refuses once a request's head is read (the parser has
// already enforced the byte limits and the framing rules).
template <class Fields>
std::optional<refusal> check_head(const bhttp::request_header<Fields>& h, const limits& lim) {
  if (static_cast<std::size_t>(std::distance(h.begin(), h.end())) > lim.max_header_fields)
    return refusal{431, "more than " + std::to_string(lim.max_header_fields) + " header fields"};
  if (const auto ce = h[bhttp::field::content_encoding]; !ce.empty() && !beast::iequals(ce, "identity"))
    return refusal{415, "Content-Encoding '" + std::string(ce.substr(0, 32)) + "' is not accepted: send the body uncompressed"};
  if (const auto te = h[bhttp::field::transfer_encoding]; !te.empty() && !beast::iequals(te, "chunked"))
    return refusal{501, "Transfer-Encoding '" + std::string(te.substr(0, 32)) + "' is not supported: only chunked"};
  if (const auto expect = h[bhttp::field::expect]; !expect.empty() && !beast::iequals(expect, "100-continue"))
    return refusal{417, "only 'Expect: 100-continue' is supported"};
  return std::nullopt;
}

// The refusal for a parse error, or nullopt when the error is the connection's (closed, reset).
std::optional<refusal> parse_refusal(const error_code& ec, const limits& lim) {
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
    return refusal{431, "request headers larger than " + std::to_string(lim.max_header_bytes) + " bytes"};
  if (ec == bhttp::error::body_limit)
    return refusal{413, "request body larger than " + std::to_string(lim.max_body_bytes) + " bytes"};
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == net::error::eof) return std::nullopt;
  if (is_http_parse_error(ec)) return refusal{400, "malformed HTTP request: " + ec.message()};
  return std::nullopt;
}

request to_request(bhttp::request<bhttp::string_body>& m) {
  request r;
  r.method = std::string(m.method_string());
  r.target = std::string(m.target());
  r.path = r.target.substr(0, r.target.find('?'));
  r.version = m.version();
  for (const auto& f : m) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  r.body = std::move(m.body());
  return r;
}

}  // namespace

std::variant<request, refusal> parse_request_bytes(std::string_view bytes, const limits& lim) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(lim.max_header_bytes));
  parser.body_limit(lim.max_body_bytes);
  parser.eager(true);
  error_code ec;
  bool checked = false;
  while (!parser.is_done()) {
    if (bytes.empty()) return refusal{400, "incomplete request"};
    const std::size_t used = parser.put(net::buffer(bytes.data(), bytes.size()), ec);
    bytes.remove_prefix(used);
    if (ec == bhttp::error::need_more) {
      if (used == 0) return refusal{400, "incomplete request"};
      ec = {};
    }
    if (ec) {
      if (auto r = parse_refusal(ec, lim)) return *r;
      return refusal{400, "incomplete request"};
    }
    if (!checked && parser.is_header_done()) {
      checked = true;
      if (auto r = check_head(parser.get(), lim)) return *r;
    }
  }
  return to_request(parser.get());
}

namespace {
}  // namespace

class connection;

struct server::impl {
  impl(limits l, handler h, error_reply e)
      : lim(l), on_request(std::move(h)), on_error(std::move(e)), acceptor(ioc), retry_timer(ioc) {}

  limits lim;
  handler on_request;
  error_reply on_error;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer;
  std::vector<std::thread> threads;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::atomic<std::size_t> n_open{0};
  std::atomic<bool> stopping{false};
  std::mutex open_mutex;
  std::list<std::weak_ptr<connection>> open;

  void accept();
  void refuse(tcp::socket socket);
  std::list<std::weak_ptr<connection>>::iterator enlist(const std::shared_ptr<connection>& c) {
    std::lock_guard lock(open_mutex);
    return open.insert(open.end(), c);
  }
  void delist(std::list<std::weak_ptr<connection>>::iterator it) {
    std::lock_guard lock(open_mutex);
    open.erase(it);
  }
};

/// One client connection: reads a request, hands it to the handler, writes
/// its answer, then reads the next one. Every member runs on the socket's strand.
class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(tcp::socket socket, server::impl& srv)
      : socket_(std::move(socket)),
        srv_(srv),
        buffer_(srv.lim.max_header_bytes + read_slack_bytes),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()),
        poll_timer_(socket_.get_executor()) {}

  void start(std::list<std::weak_ptr<connection>>::iterator self_in_list) {
    self_in_list_ = self_in_list;
    listed_ = true;
    error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);  // each SSE event is a small write: send it now
    read_request();
  }

  /// From server::stop, any thread.
  void shut() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->client_gone(); });
  }

  // The exchange's calls, posted onto the strand; `seq` names the request.
  void do_reply(std::uint64_t seq, response r);
  void do_start_stream(std::uint64_t seq, int status, std::string content_type, header_list headers);
  void do_write(std::uint64_t seq, std::string data);
  void do_finish(std::uint64_t seq);
  void do_on_disconnect(std::uint64_t seq, std::function<void()> f);

  net::any_io_executor executor() { return socket_.get_executor(); }

 private:
  enum class phase : std::uint8_t { reading, handling, between, closing, closed };
  enum class answer : std::uint8_t { none, streaming, done };

  void read_request();
  void on_header(error_code ec);
  void read_body();
  void on_body(error_code ec);
  void dispatch();
  void watch();
  void on_watch(error_code ec, std::size_t n);
  void poll_half_closed(bool probed);
  void refuse(int status, std::string message);
  void enqueue(std::string bytes);
  void flush();
  void on_written(error_code ec);
  void answered();
  void linger();
  void client_gone();
  void close_socket();
  void arm_read_timer(std::chrono::milliseconds d);

  tcp::socket socket_;
  server::impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  net::steady_timer read_timer_, write_timer_, poll_timer_;
  std::list<std::weak_ptr<connection>>::iterator self_in_list_;
  bool listed_ = false;

  phase phase_ = phase::reading;
  bool read_timed_out_ = false;
  bool watching_ = false;  // a read is pending while the handler runs (disconnects, pipelined bytes)
  bool peer_eof_ = false;  // the client half-closed (or closed) its side
  bool gone_ = false;

  // The request being answered.
  std::uint64_t seq_ = 0;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  answer answer_ = answer::none;
  bool chunked_ = false;
  std::function<void()> on_disconnect_;

  std::string out_;      // bytes not yet handed to a write
  std::string sending_;  // bytes of the write in flight
  bool writing_ = false;
  bool close_after_ = false;  // close once the answer is written
  std::size_t lingered_ = 0;
};

namespace {

class exchange_impl final : public exchange {
 public:
  exchange_impl(std::shared_ptr<connection> c, std::uint64_t seq, request r)
      : conn_(std::move(c)), seq_(seq), req_(std::move(r)) {}
  const request& req() const override { return req_; }
  void reply(response r) override {
    net::post(conn_->executor(), [c = conn_, s = seq_, r = std::move(r)]() mutable { c->do_reply(s, std::move(r)); });
  }
  void start_stream(int status, std::string content_type, header_list headers) override {
    net::post(conn_->executor(), [c = conn_, s = seq_, status, ct = std::move(content_type), h = std::move(headers)]() mutable {
      c->do_start_stream(s, status, std::move(ct), std::move(h));
    });
  }
  void write(std::string data) override {
    if (data.empty()) return;
    net::post(conn_->executor(), [c = conn_, s = seq_, d = std::move(data)]() mutable { c->do_write(s, std::move(d)); });
  }
  void finish() override {
    net::post(conn_->executor(), [c = conn_, s = seq_] { c->do_finish(s); });
  }
  void on_disconnect(std::function<void()> f) override {
    net::post(conn_->executor(), [c = conn_, s = seq_, f = std::move(f)]() mutable { c->do_on_disconnect(s, std::move(f)); });
  }

 private:
  std::shared_ptr<connection> conn_;
  std::uint64_t seq_;
  request req_;
};

}  // namespace

void connection::arm_read_timer(std::chrono::milliseconds d) {
  read_timed_out_ = false;
  read_timer_.expires_after(d);
  read_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->phase_ != phase::reading) return;
    self->read_timed_out_ = true;
    error_code ignored;
    self->socket_.cancel(ignored);
  });
}

void connection::read_request() {
  if (gone_) return;
  phase_ = phase::reading;
  if (peer_eof_ && buffer_.size() == 0) return close_socket();
  if (srv_.stopping) return close_socket();
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(srv_.lim.max_header_bytes));
  parser_->body_limit(srv_.lim.max_body_bytes);
  arm_read_timer(srv_.lim.header_timeout);
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
}

void connection::on_header(error_code ec) {
  read_timer_.cancel();
  if (gone_) return;
  if (ec) {
    if (read_timed_out_) {
      // Idle between requests: close quietly; a request begun too slowly: 408.
      if (buffer_.size() == 0 && !parser_->got_some()) return close_socket();
      return refuse(408, "the request's headers did not arrive within " +
                             std::to_string(srv_.lim.header_timeout.count()) + " ms");
    }
    if (auto r = parse_refusal(ec, srv_.lim)) return refuse(r->status, std::move(r->message));
    return client_gone();
  }
  const auto& h = parser_->get();
  if (auto r = check_head(h, srv_.lim)) return refuse(r->status, std::move(r->message));
  if (const auto expect = h[bhttp::field::expect]; !expect.empty()) {
    if (h.version() == 11 && !parser_->is_done()) {
      // The client waits for this before it sends the body.
      sending_ = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(socket_, net::buffer(sending_), [self = shared_from_this()](error_code wec, std::size_t) {
        if (wec) return self->client_gone();
        self->read_body();
      });
    }
  }
  read_body();
}

void connection::read_body() {
  if (gone_) return;
  if (parser_->is_done()) return dispatch();
  arm_read_timer(srv_.lim.body_timeout);
  bhttp::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
}

void connection::on_body(error_code ec) {
  read_timer_.cancel();
  if (gone_) return;
  if (ec) {
    if (read_timed_out_)
      return refuse(408, "the request's body did not arrive within " + std::to_string(srv_.lim.body_timeout.count()) + " ms");
    if (auto r = parse_refusal(ec, srv_.lim)) return refuse(r->status, std::move(r->message));
    return client_gone();
  }
  dispatch();
}

void connection::dispatch() {
  auto& m = parser_->get();
  version_ = m.version();
  keep_alive_ = m.keep_alive();
  request r = to_request(m);
  parser_.reset();

  ++seq_;
  phase_ = phase::handling;
  answer_ = answer::none;
  chunked_ = false;
  close_after_ = !keep_alive_;
  on_disconnect_ = {};
  watch();
  auto ex = std::make_shared<exchange_impl>(shared_from_this(), seq_, std::move(r));
  try {
    srv_.on_request(ex);
  } catch (const std::exception& e) {
    do_reply(seq_, srv_.on_error(500, e.what()));
  } catch (...) {
    do_reply(seq_, srv_.on_error(500, "unknown exception"));
  }
}

void connection::watch() {
  if (watching_ || peer_eof_ || gone_) return;
  if (phase_ != phase::handling && phase_ != phase::closing) return;
  if (buffer_.size() + read_piece_bytes > buffer_.max_size()) return;  // pipelined bytes wait
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(read_piece_bytes),
                          [self = shared_from_this()](error_code ec, std::size_t n) { self->on_watch(ec, n); });
}

void connection::on_watch(error_code ec, std::size_t n) {
  watching_ = false;
  if (gone_) return;
  if (phase_ == phase::closing) {
    // Lingering: drop what arrives until the client closes or time runs out.
    buffer_.consume(buffer_.size());
    lingered_ += n;
    if (ec || lingered_ > linger_bytes) return close_socket();
    return watch();
  }
  if (!ec) buffer_.commit(n);
  if (ec == net::error::eof) {
    peer_eof_ = true;
    // Half-closed or gone? Only a write tells: an HTTP/1.1 client takes an
    // interim 100 and still gets its reply; a closed socket answers with a reset.
    if (phase_ == phase::handling && answer_ == answer::none && version_ == 11) poll_half_closed(false);
  } else if (ec && ec != net::error::operation_aborted) {
    return client_gone();
  }
  if (phase_ == phase::between) return read_request();
  if (phase_ == phase::handling) watch();
}

void connection::poll_half_closed(bool probed) {
  poll_timer_.expires_after(probed ? half_close_poll : half_close_probe_delay);
  poll_timer_.async_wait([self = shared_from_this(), probed](error_code ec) {
    if (ec || self->gone_ || self->phase_ != phase::handling || self->answer_ != answer::none) return;
    if (!probed) self->enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    else if (connection_reset(self->socket_.native_handle())) return self->client_gone();
    self->poll_half_closed(true);
  });
}

void connection::refuse(int status, std::string message) {
  ++seq_;
  phase_ = phase::handling;
  answer_ = answer::none;
  version_ = parser_ && parser_->get().version() == 10 ? 10 : 11;
  parser_.reset();
  keep_alive_ = false;
  close_after_ = true;
  do_reply(seq_, srv_.on_error(status, std::move(message)));
}

void connection::do_reply(std::uint64_t seq, response r) {
  if (seq != seq_ || gone_ || answer_ != answer::none || phase_ != phase::handling) return;
  answer_ = answer::done;
  if (srv_.stopping) close_after_ = true;
  std::string head = status_line(r.status, version_);
  add_field(head, "Content-Type", r.content_type);
  add_field(head, "Content-Length", std::to_string(r.body.size()));
  for (const auto& [k, v] : r.headers) add_field(head, k, v);
  if (close_after_)
    add_field(head, "Connection", "close");
  else if (version_ == 10)
    add_field(head, "Connection", "keep-alive");
  head += "\r\n";
  head += r.body;
  enqueue(std::move(head));
}

void connection::do_start_stream(std::uint64_t seq, int status, std::string content_type, header_list headers) {
  if (seq != seq_ || gone_ || answer_ != answer::none || phase_ != phase::handling) return;
  answer_ = answer::streaming;
  chunked_ = version_ == 11;
  if (!chunked_ || srv_.stopping) close_after_ = true;  // HTTP/1.0: the stream ends when the connection does
  std::string head = status_line(status, version_);
  add_field(head, "Content-Type", content_type);
  for (const auto& [k, v] : headers) add_field(head, k, v);
  if (chunked_) add_field(head, "Transfer-Encoding", "chunked");
  if (close_after_) add_field(head, "Connection", "close");
  head += "\r\n";
  enqueue(std::move(head));
}

void connection::do_write(std::uint64_t seq, std::string data) {
  if (seq != seq_ || gone_ || answer_ != answer::streaming || data.empty()) return;
  if (!chunked_) return enqueue(std::move(data));
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string chunk = size;
  chunk += data;
  chunk += "\r\n";
  enqueue(std::move(chunk));
}

void connection::do_finish(std::uint64_t seq) {
  if (seq != seq_ || gone_ || answer_ != answer::streaming) return;
  answer_ = answer::done;
  if (chunked_)
    enqueue("0\r\n\r\n");
  else
    flush();
}

void connection::do_on_disconnect(std::uint64_t seq, std::function<void()> f) {
  if (seq != seq_ || answer_ == answer::done) return;
  if (gone_) return f();
  on_disconnect_ = std::move(f);
}

void connection::enqueue(std::string bytes) {
  out_ += bytes;
  flush();
}

void connection::flush() {
  if (writing_ || gone_) return;
  if (out_.empty()) {
    if (answer_ == answer::done && phase_ == phase::handling) answered();
    return;
  }
  writing_ = true;
  sending_.swap(out_);
  out_.clear();
  write_timer_.expires_after(srv_.lim.write_timeout);
  write_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec && self->writing_) self->client_gone();  // the client does not read what it asked for
  });
  net::async_write(socket_, net::buffer(sending_),
                   [self = shared_from_this()](error_code ec, std::size_t) { self->on_written(ec); });
}

void connection::on_written(error_code ec) {
  writing_ = false;
  write_timer_.cancel();
  if (gone_) return;
  if (ec) return client_gone();
  sending_.clear();
  flush();
}

// The whole answer is on the wire: the next request, or the end.
void connection::answered() {
  on_disconnect_ = {};
  poll_timer_.cancel();
  if (close_after_) return linger();
  phase_ = phase::between;
  if (!watching_) return read_request();
  error_code ignored;
  socket_.cancel(ignored);  // the pending watch read ends, and on_watch reads the next request
}

void connection::linger() {
  phase_ = phase::closing;
  buffer_.consume(buffer_.size());
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  if (peer_eof_) return close_socket();
  read_timer_.expires_after(linger_time);
  read_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->close_socket();
  });
  watch();
}

void connection::client_gone() {
  if (gone_) return;
  auto f = std::move(on_disconnect_);
  on_disconnect_ = {};
  const bool unanswered = phase_ == phase::handling && answer_ != answer::done;
  close_socket();
  if (unanswered && f) f();
}

void connection::close_socket() {
  if (gone_) return;
  gone_ = true;
  phase_ = phase::closed;
  error_code ignored;
  read_timer_.cancel();
  write_timer_.cancel();
  poll_timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (listed_) {
    listed_ = false;
    srv_.delist(self_in_list_);
    --srv_.n_open;
  }
}

void server::impl::refuse(tcp::socket socket) {
  // Too many connections: a short 503 if the socket takes it at once, then close.
  static constexpr std::string_view busy =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 22\r\nRetry-After: 1\r\n"
      "Connection: close\r\n\r\ntoo many connections\r\n";
  error_code ec;
  socket.non_blocking(true, ec);
  (void)::send(socket.native_handle(), busy.data(), busy.size(), MSG_NOSIGNAL);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void server::impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors or memory: try again shortly instead of spinning.
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait([this](error_code wec) {
        if (!wec && !stopping) accept();
      });
      return;
    }
    if (n_open >= lim.max_connections) {
      refuse(std::move(socket));
    } else {
      ++n_open;
      auto c = std::make_shared<connection>(std::move(socket), *this);
      const auto it = enlist(c);
      net::dispatch(c->executor(), [c, it] { c->start(it); });
    }
    accept();
  });
}

server::server(limits lim, handler on_request, error_reply on_error)
    : impl_(std::make_unique<impl>(lim, std::move(on_request), std::move(on_error))) {}

server::~server() { stop(); }

int server::listen(const std::string& host, int port) {
  // Every connection is a descriptor: make room for the cap (and a margin).
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, std::max<rlim_t>(nofile.rlim_cur, impl_->lim.max_connections + 256));
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  error_code ec;
  const auto address = net::ip::make_address(host, ec);
  if (ec) throw std::runtime_error("cannot listen on '" + host + "': not an IP address");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  auto& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(1024, ec);
  if (ec) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  return a.local_endpoint().port();
}

void server::start() {
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->accept();
  for (std::size_t i = 0; i < std::max<std::size_t>(1, impl_->lim.io_threads); ++i)
    impl_->threads.emplace_back([this] {
      // A handler that throws loses its connection, never the server.
      while (true) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "llmkit-server: an I/O handler threw: %s\n", e.what());
        }
      }
    });
}

void server::stop() {
  if (impl_->stopping.exchange(true)) return;
  net::post(impl_->ioc, [this] {
    error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->retry_timer.cancel();
  });
  {
    std::lock_guard lock(impl_->open_mutex);
    for (auto& w : impl_->open)
      if (auto c = w.lock()) c->shut();
  }
  // Let the closes run, then end the loop (at most a moment either way).
  for (int i = 0; i < 50 && impl_->n_open > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

std::size_t server::n_connections() const { return impl_->n_open; }

}  // namespace llmkit_server::http
