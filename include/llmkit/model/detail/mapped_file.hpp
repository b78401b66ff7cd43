// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/mapped_file.hpp
/// A read-only POSIX memory mapping of a whole file (internal to the GGUF
/// reader).

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmkit/core/error.hpp"

namespace llmkit::model::detail {

/// Maps `path` read-only for its lifetime. An empty file maps to an empty span.
class mapped_file {
 public:
  explicit mapped_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LLMKIT_CHECK(fd >= 0, "gguf: cannot open '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd);
      detail_throw(path, err ? std::strerror(err) : "not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        detail_throw(path, std::strerror(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  /// [size] the file's bytes.
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

 private:
  [[noreturn]] static void detail_throw(const std::string& path, const char* why) {
    ::llmkit::detail::throw_error("gguf: cannot map '", path, "': ", why);
  }
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace llmkit::model::detail
