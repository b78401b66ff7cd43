// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/rng.hpp
/// Philox4x32-10, the counter-based random generator of Salmon et al.
/// ("Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123). A
/// counter-based generator is a pure function of (key, counter): the draw for
/// (seed, request, step) never depends on which other requests share the
/// batch, on the thread that runs it, or on the order rows are processed.

#include <array>
#include <cstdint>

namespace llmkit::sampling {

/// Philox4x32 with 10 rounds: maps a 128-bit counter and a 64-bit key to 128
/// random bits. Stateless; `operator()` is a pure function.
struct philox4x32 {
  using counter_type = std::array<std::uint32_t, 4>;
  using key_type = std::array<std::uint32_t, 2>;

  /// The 4 x 32 random bits of block `counter` under `key`.
  static constexpr counter_type generate(counter_type counter, key_type key) noexcept {
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * counter[0];
      const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * counter[2];
      counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
                 static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
      key[0] += w0;
      key[1] += w1;
    }
    return counter;
  }
};

/// A 53-bit uniform double in [0, 1) from two 32-bit words.
constexpr double uniform_from_bits(std::uint32_t hi, std::uint32_t lo) noexcept {
  const std::uint64_t bits = (static_cast<std::uint64_t>(hi) << 21) ^ (lo >> 11);  // 53 bits
  return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

/// The uniform draw number `draw` (0, 1, ...) of decoding step `step` of request
/// `request_id` under `seed`, in [0, 1). Key = seed; counter = (draw, step,
/// request_id low, request_id high); every (seed, request_id, step, draw)
/// gives an independent draw.
/// @pre step and draw below 2^32 (they wrap otherwise).
constexpr double philox_uniform(std::uint64_t seed, std::uint64_t request_id, std::uint64_t step,
                                std::uint32_t draw = 0) noexcept {
  const auto r = philox4x32::generate(
      {draw, static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(request_id),
       static_cast<std::uint32_t>(request_id >> 32)},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return uniform_from_bits(r[0], r[1]);
}

}  // namespace llmkit::sampling
