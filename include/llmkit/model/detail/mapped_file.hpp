// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/mapped_file.hpp
/// A read-only POSIX memory mapping of a whole file (internal to the GGUF
/// reader).

#include <cerrno>
#include <cstddef>
#include <cstdint>
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

/// What advise_pages asks of the kernel.
enum class page_hint : std::uint8_t { will_need, dont_need };

/// The whole pages inside `range` ([begin rounded up, end rounded down]):
/// pages shared with neighbouring bytes are left alone.
inline std::span<const std::byte> whole_pages(std::span<const std::byte> range) noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(range.data());
  const std::uintptr_t first = (begin + page - 1) / page * page, last = (begin + range.size()) / page * page;
  if (range.empty() || last <= first) return {};
  return {reinterpret_cast<const std::byte*>(first), last - first};
}

/// madvise over the whole pages of `range`, a part of a read-only mapping;
/// best effort (a refused hint changes nothing that matters).
inline void advise_pages(std::span<const std::byte> range, page_hint hint) noexcept {
  const auto pages = whole_pages(range);
  if (pages.empty()) return;
  (void)::madvise(const_cast<std::byte*>(pages.data()), pages.size(),
                  hint == page_hint::will_need ? MADV_WILLNEED : MADV_DONTNEED);
}

/// mlock over `range` (the kernel rounds to pages); 0 or the errno.
inline int lock_pages(std::span<const std::byte> range) noexcept {
  if (range.empty()) return 0;
  return ::mlock(range.data(), range.size()) == 0 ? 0 : errno;
}

}  // namespace llmkit::model::detail
