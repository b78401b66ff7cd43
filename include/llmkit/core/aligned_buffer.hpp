// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/aligned_buffer.hpp
/// Cache-line (64-byte) aligned storage: an allocator for std containers and
/// the `aligned_vector` alias used for every buffer llmkit owns.

#include <cstddef>
#include <limits>
#include <new>
#include <vector>

namespace llmkit {

/// Alignment of every buffer llmkit allocates: one cache line, and a full
/// AVX-512 register.
inline constexpr std::size_t buffer_alignment = 64;

/// Standard allocator returning `Alignment`-aligned storage.
template <class T, std::size_t Alignment = buffer_alignment>
struct aligned_allocator {
  static_assert(Alignment >= alignof(T) && (Alignment & (Alignment - 1)) == 0,
                "aligned_allocator: Alignment must be a power of two >= alignof(T)");
  using value_type = T;
  template <class U>
  struct rebind {
    using other = aligned_allocator<U, Alignment>;
  };

  aligned_allocator() noexcept = default;
  template <class U>
  aligned_allocator(const aligned_allocator<U, Alignment>&) noexcept {}

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Alignment}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{Alignment}); }

  template <class U>
  bool operator==(const aligned_allocator<U, Alignment>&) const noexcept {
    return true;
  }
};

/// A std::vector whose data() is 64-byte aligned.
template <class T>
using aligned_vector = std::vector<T, aligned_allocator<T>>;

/// Rounds `n` up to a multiple of `multiple` (> 0).
constexpr std::size_t round_up(std::size_t n, std::size_t multiple) noexcept {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace llmkit
