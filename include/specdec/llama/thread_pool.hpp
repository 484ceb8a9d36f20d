// specdec/llama/thread_pool.hpp — a persistent thread pool for the forward pass's many short parallel loops.
// Entry point: specdec::llama::ThreadPool::run. Read next: matmul.hpp (its main user).
//
// A forward pass issues a few hundred parallel loops of tens of microseconds each, so waking threads through
// a condition variable per loop costs more than the extra core gains. Workers instead spin on an atomic
// generation counter for a short while after each job and only then block (std::atomic::wait, a futex on
// Linux), so a busy pool reacts in well under a microsecond while an idle pool leaves its cores to others.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif

#include "specdec/error.hpp"

namespace specdec::llama {

namespace detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Spins until `pred()` holds, for at most `spin`, then blocks on `word` until it changes from `seen`.
/// requires: whoever makes pred() true changes `word` and calls word.notify_all().
template <class Pred, class Word>
void spin_then_wait(const std::atomic<Word>& word, Pred pred, std::chrono::microseconds spin) {
  const auto deadline = std::chrono::steady_clock::now() + spin;
  for (unsigned i = 1;; ++i) {
    if (pred()) return;
    detail::cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
  }
  for (;;) {
    const Word seen = word.load(std::memory_order_acquire);
    if (pred()) return;
    word.wait(seen, std::memory_order_acquire);
  }
}

}  // namespace detail

/// A fixed set of threads that run one job at a time: run(fn) calls fn(index, count) once on each of
/// `count` threads, the calling thread being index 0, and returns when all calls have returned.
/// threads = 1 creates no threads and runs fn inline. One pool may serve several models that run
/// alternately (a target and its draft); run() must not be called concurrently or recursively.
///
///   ThreadPool pool(2);
///   pool.run([&](std::size_t i, std::size_t n) { work(split(rows, i, n)); });
class ThreadPool {
 public:
  /// requires: threads >= 1. `spin` is how long an idle worker polls before it blocks.
  explicit ThreadPool(std::size_t threads = 1, std::chrono::microseconds spin = std::chrono::microseconds(300))
      : count_(threads), spin_(spin) {
    if (threads == 0) specdec::detail::fail("thread pool needs at least 1 thread, got 0");
    workers_.reserve(threads - 1);
    for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  ~ThreadPool() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  /// Threads that run each job, the caller included.
  std::size_t threads() const { return count_; }

  /// Calls fn(index, threads()) for every index in [0, threads()) in parallel; fn must not throw.
  template <class Fn>
  void run(Fn&& fn) {
    if (count_ == 1) {
      fn(std::size_t{0}, std::size_t{1});
      return;
    }
    using F = std::remove_reference_t<Fn>;
    job_ = [](void* context, std::size_t index, std::size_t count) { (*static_cast<F*>(context))(index, count); };
    context_ = const_cast<void*>(static_cast<const void*>(std::addressof(fn)));
    pending_.store(count_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(std::size_t{0}, count_);
    detail::spin_then_wait(pending_, [this] { return pending_.load(std::memory_order_acquire) == 0; }, spin_);
  }

 private:
  void work(std::size_t index) {
    std::uint64_t seen = 0;
    for (;;) {
      detail::spin_then_wait(generation_, [&] { return generation_.load(std::memory_order_acquire) != seen; },
                             spin_);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) return;
      job_(context_, index, count_);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_all();
    }
  }

  std::size_t count_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;             // [count_ - 1]
  std::atomic<std::uint64_t> generation_{0};     // bumped once per job (and once at shutdown)
  std::atomic<std::size_t> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  void (*job_)(void*, std::size_t, std::size_t) = nullptr;
  void* context_ = nullptr;
};

/// The half-open share [begin, end) of `total` items that part `index` of `parts` takes, in whole units of
/// `grain` items (the last share takes the remainder).
inline std::pair<std::size_t, std::size_t> split(std::size_t total, std::size_t index, std::size_t parts,
                                                 std::size_t grain = 1) {
  const std::size_t units = (total + grain - 1) / grain;
  const std::size_t begin = units * index / parts * grain;
  const std::size_t end = units * (index + 1) / parts * grain;
  return {std::min(begin, total), std::min(end, total)};
}

}  // namespace specdec::llama
