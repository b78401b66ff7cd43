// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/amx.hpp
/// Intel AMX tiles for the int8 decode kernel (decode_kernels::scores_amx):
/// whether this build and this process may use them, and a tile
/// configuration that a thread loads for the span of one task.
///
/// AMX is used only when the compiler targets it (`-march=sapphirerapids`
/// or `-march=native` on such a CPU defines `__AMX_TILE__` and
/// `__AMX_INT8__`) and Linux grants the process the tile data state (the
/// first use asks once: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
/// Linux 5.16 or newer). Otherwise, or with `decode_tuning::use_amx = false`, the
/// AVX-512 VNNI kernel runs; both give bit-identical results.
///
/// `LLMKIT_ATTENTION_AMX_INT8` (a configuration macro, docs/getting-started.md)
/// is 1 where the build can use AMX and 0 otherwise; a program may define it
/// 0 to build the int8 decode kernels without AMX on an AMX target.

#include <cstdint>

#if !defined(LLMKIT_ATTENTION_AMX_INT8)
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define LLMKIT_ATTENTION_AMX_INT8 1
#else
#define LLMKIT_ATTENTION_AMX_INT8 0
#endif
#elif LLMKIT_ATTENTION_AMX_INT8 && !(defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__))
#error "LLMKIT_ATTENTION_AMX_INT8=1 needs an AMX-INT8 and AVX-512 target on Linux"
#endif

#if LLMKIT_ATTENTION_AMX_INT8
#include "llmkit/simd/detail/intrinsics.hpp"
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace llmkit::attention::detail {

#if LLMKIT_ATTENTION_AMX_INT8

/// The 64-byte operand of LDTILECFG (palette 1): rows and bytes per row of
/// each of the 8 tile registers (unused ones left 0).
struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(tile_config) == 64);

/// Whether this process may use the AMX tiles: asks Linux once for the
/// tile data state (false on kernels without AMX support or when refused).
inline bool amx_tiles_usable() noexcept {
  static const bool usable = [] {
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return usable;
}

/// Loads a tile configuration into this thread for its lifetime and
/// releases the tiles after (so a context switch does not save 8 KiB of
/// tile data for a thread that is done with them).
class tile_scope {
 public:
  explicit tile_scope(const tile_config& config) noexcept { _tile_loadconfig(&config); }
  ~tile_scope() { _tile_release(); }
  tile_scope(const tile_scope&) = delete;
  tile_scope& operator=(const tile_scope&) = delete;
};

#else

inline bool amx_tiles_usable() noexcept { return false; }

#endif

}  // namespace llmkit::attention::detail
