// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/core/executor.hpp
/// Where parallel work runs. Kernels never spawn threads; they take an
/// executor and call `parallel_for(n, fn)`, which runs fn(0) ... fn(n - 1)
/// (in any order, possibly concurrently) and returns when all are done. An
/// exception thrown by any fn(i) is rethrown to the caller (the first one;
/// the remaining indices may be skipped).
///
/// Provided: `serial_executor` (the default everywhere), `thread_pool`
/// (persistent std::threads; the calling thread takes part) and, when the
/// translation unit is compiled with OpenMP, `openmp_executor`.

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace llmkit {

/// An executor runs `parallel_for(n, fn)` and tells how many threads it uses.
template <class E>
concept executor = requires(E& e, std::size_t n, void (*fn)(std::size_t)) {
  e.parallel_for(n, fn);
  { e.concurrency() } -> std::convertible_to<std::size_t>;
};

/// Runs every index in order on the calling thread.
struct serial_executor {
  template <class Fn>
  void parallel_for(std::size_t n, Fn&& fn) const {
    for (std::size_t i = 0; i < n; ++i) fn(i);
  }
  constexpr std::size_t concurrency() const noexcept { return 1; }
};

/// A fixed set of worker threads; `parallel_for` hands out indices one at a
/// time (dynamic scheduling), so give it coarse tasks (a head, a tile, a
/// sequence), not single elements. Calls from inside a task run serially
/// (no nested parallelism, no deadlock); calls from several outside threads
/// are serialised. Idle workers spin for 100 us waiting for the next call
/// before they sleep.
class thread_pool {
 public:
  /// @param n_threads total threads including the caller (>= 1); defaults to
  /// the hardware concurrency.
  explicit thread_pool(std::size_t n_threads = std::thread::hardware_concurrency()) {
    if (n_threads == 0) n_threads = 1;
    workers_.reserve(n_threads - 1);
    for (std::size_t t = 0; t + 1 < n_threads; ++t) workers_.emplace_back([this] { worker_loop(); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  std::size_t concurrency() const noexcept { return workers_.size() + 1; }

  template <class Fn>
  void parallel_for(std::size_t n, Fn&& fn) {
    if (n == 0) return;
    if (workers_.empty() || n == 1 || in_task()) {
      for (std::size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    std::lock_guard submit(submit_mutex_);
    {
      std::lock_guard lock(mutex_);
      invoke_ = [](void* context, std::size_t i) { (*static_cast<std::remove_reference_t<Fn>*>(context))(i); };
      context_ = const_cast<void*>(static_cast<const void*>(std::addressof(fn)));
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      busy_ = workers_.size();
      error_ = nullptr;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    in_task() = true;
    run_tasks();
    in_task() = false;
    std::exception_ptr error;
    {
      std::unique_lock lock(mutex_);
      finished_.wait(lock, [this] { return busy_ == 0; });
      error = std::exchange(error_, nullptr);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  static bool& in_task() noexcept {
    thread_local bool flag = false;
    return flag;
  }

  void run_tasks() {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_) return;
      try {
        invoke_(context_, i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_, std::memory_order_relaxed);
      }
    }
  }

  void worker_loop() {
    in_task() = true;
    std::uint64_t seen = 0;
    for (;;) {
      // Spin a little before sleeping: an engine submits its next
      // parallel_for (the next layer, the next decode step) within
      // microseconds, while waking a sleeping thread takes tens of them, and
      // the caller starts on the tasks alone meanwhile.
      const auto spin_end = std::chrono::steady_clock::now() + spin_before_sleep;
      while (published_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_end)
        cpu_relax();
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_tasks();
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) finished_.notify_one();
    }
  }

  static constexpr std::chrono::microseconds spin_before_sleep{100};
  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  std::vector<std::thread> workers_;
  std::atomic<std::uint64_t> published_{0};  // generation_, readable without the mutex
  std::mutex submit_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  void (*invoke_)(void*, std::size_t) = nullptr;
  void* context_ = nullptr;
  std::size_t n_ = 0;
  std::atomic<std::size_t> next_{0};
  std::size_t busy_ = 0;
  std::exception_ptr error_;
};

#if defined(_OPENMP)
/// Adapter onto OpenMP's own thread team (dynamic schedule).
struct openmp_executor {
  template <class Fn>
  void parallel_for(std::size_t n, Fn&& fn) const {
    std::exception_ptr error;
    std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        fn(static_cast<std::size_t>(i));
      } catch (...) {
#pragma omp critical(llmkit_openmp_executor)
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
    if (error) std::rethrow_exception(error);
  }
  std::size_t concurrency() const noexcept { return static_cast<std::size_t>(omp_get_max_threads()); }
};
#endif

}  // namespace llmkit
