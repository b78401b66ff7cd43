// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/tuning.hpp
/// The microarchitecture constants of the weight products (`linear()`,
/// model/detail/matmul*.hpp): when a product goes parallel, which products
/// stream W once, how far ahead W is prefetched and how much of W a block or
/// strip keeps in cache. They change speed only, never a result: every
/// output is one fixed-order dot product whatever its block, strip or
/// thread. Each says what it was measured or chosen on.
///
/// Register tile shapes (model/detail/matmul.hpp, matmul_panels.hpp) and
/// the f32 panel height, which is a storage layout, are not here: the
/// kernels' code is written for them.

#include <cstddef>

namespace llmkit::model::detail {

/// Products below this many multiply-adds run on the calling thread: waking
/// a worker (~5-20 us) costs more than they do; 2^16 multiply-adds of f32
/// weights is 256 KiB of W, ~25 us at one core's DRAM bandwidth (chosen on
/// a 2-vCPU Sapphire Rapids VM, 2026-11-29).
inline constexpr double matmul_parallel_min_work = 1 << 16;

/// Products of at most this many tokens (decode, speculative verification,
/// a continuous batch's decode rows) stream W from memory exactly once: for
/// each strip of output rows, every token tile passes over it while it is in
/// L1. Larger products (prefill) are compute-bound and block W in L2 instead
/// (chosen on a 2-vCPU Sapphire Rapids VM, 2026-11-30).
inline constexpr std::size_t matmul_stream_max_tokens = 32;

/// How far ahead of its loads a streaming product asks for W in L2
/// (PREFETCHT1), in bytes of W's storage: once a product does several FMAs
/// per W load the hardware streamer alone keeps too few lines in flight.
/// 12-96 KiB were as fast; 32 KiB is the middle (measured on a 2-vCPU
/// Sapphire Rapids VM, 2026-11-30).
inline constexpr std::size_t matmul_prefetch_bytes = 32 * 1024;

/// Output rows of f16 / Q8_0 W per block of a compute-bound product (more
/// than matmul_stream_max_tokens tokens): 16 tiles of 6 rows, which stay in
/// L2 while every token tile passes over them (chosen on a 2-vCPU Sapphire
/// Rapids VM, 2026-11-30).
inline constexpr std::size_t matmul_dense_block_rows = 96;

/// Output rows per block a Q8_0 x int8 product is split in across the
/// executor (chosen on a 2-vCPU Sapphire Rapids VM, 2026-11-30).
inline constexpr std::size_t matmul_q8_block_rows = 64;

/// Tasks per executor thread a compute-bound product (prefill) is split in,
/// so uneven shares balance; a streaming product takes one contiguous share
/// per thread, one stream over W each (chosen on a 2-vCPU Sapphire Rapids
/// VM, 2026-11-30).
inline constexpr std::size_t matmul_prefill_tasks_per_thread = 4;

/// Bytes of decoded f32 weights per strip of a block-format product: a
/// streaming product's 32 KiB strip stays in L1 while its token tiles pass
/// over it; a prefill's 256 KiB strip stays in L2 and is decoded once for
/// all its token tiles (measured on a 2-vCPU AMD EPYC Zen 5 VM, 2026-12-03).
inline constexpr std::size_t matmul_strip_bytes_streaming = 32 * 1024;
inline constexpr std::size_t matmul_strip_bytes_prefill = 256 * 1024;

/// Bytes of decoded integer weights per strip of a block-format x int8
/// product: a streaming product's strip stays in L1 while its token tiles
/// pass over it; a prefill's stays in L2 and is decoded once for all its
/// token tiles (chosen on a 2-vCPU AMD EPYC Zen 5 VM, 2026-12-03).
inline constexpr std::size_t int8_strip_bytes_streaming = 16 * 1024;
inline constexpr std::size_t int8_strip_bytes_prefill = 128 * 1024;

}  // namespace llmkit::model::detail
