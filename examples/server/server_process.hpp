// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/server_process.hpp
/// For the server's tests: llmkit-server (the compile definition
/// LLMKIT_SERVER_BIN, or the environment variable of that name) as a child
/// process on a free loopback port with the vendored stories260K, stopped
/// with SIGTERM. Every wait is bounded.

#include <httplib.h>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace llmkit_server_test {

using namespace std::chrono_literals;

/// llmkit-server as a child process, listening on a port it picked.
class server_process {
 public:
  explicit server_process(std::vector<std::string> extra = {}) {
    // LLMKIT_SERVER_BIN in the environment tests another build of the program.
    const char* bin = std::getenv("LLMKIT_SERVER_BIN") != nullptr ? std::getenv("LLMKIT_SERVER_BIN") : LLMKIT_SERVER_BIN;
    std::vector<std::string> args{bin, "--port", "0"};
    if (std::find(extra.begin(), extra.end(), "--drain-seconds") == extra.end()) extra.insert(extra.end(), {"--drain-seconds", "5"});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    const int rc = posix_spawn(&pid_, bin, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    REQUIRE(rc == 0);
    // Read stdout until the address line (30 s at most).
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    const std::string marker = "listening on http://127.0.0.1:";
    while (out.find('\n', out.find(marker)) == std::string::npos || out.find(marker) == std::string::npos) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      REQUIRE(n > 0);
      out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
    port_ = std::stoi(out.substr(out.find(marker) + marker.size()));
  }
  ~server_process() {
    if (pid_ > 0 && stop() < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  /// SIGTERM, then the exit status (-1 when it still runs after 20 s).
  int stop() {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_status_;
      }
      std::this_thread::sleep_for(100ms);
    }
    return -1;
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(5);
    c.set_read_timeout(60);
    c.set_write_timeout(10);
    return c;
  }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  int exit_status_ = -1;
};

/// A plain TCP connection to the server, for what an HTTP client library
/// would not send: raw bytes, trickles, half-closes.
class raw_connection {
 public:
  explicit raw_connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~raw_connection() { close(); }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;

  int fd() const { return fd_; }
  /// Sends all of `bytes`; false when the server closed or reset the connection.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  /// Reads until the server closes the connection, `until` appears in what
  /// was read, or `timeout` passes; returns what was read.
  std::string read(std::chrono::milliseconds timeout, std::string_view until = {}) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!until.empty() && got.find(until) != std::string::npos) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
  }
  /// Whether the last read ended because the server closed (or reset) the connection.
  bool closed_by_server() const { return closed_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
};

/// The resident memory of process `pid` in bytes (VmRSS), or 0.
inline std::size_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace llmkit_server_test
