// specdec/llama/thread_pool.hpp — a persistent thread pool for the forward pass's many short parallel loops.
// Entry point: specdec::llama::ThreadPool::parallel_for. Read next: matmul.hpp (its main user).
//
// A forward pass issues a few hundred parallel loops of tens of microseconds each, so waking threads through
// a condition variable per loop costs more than the extra core gains. Workers instead spin on an atomic
// generation counter for a short while after each job and only then block (std::atomic::wait, a futex on
// Linux), so a busy pool reacts in well under a microsecond while an idle pool leaves its cores to others.
// Tasks are claimed dynamically, so a worker that wakes late (a busy machine) only means fewer helpers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
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

/// A fixed set of threads that run one job at a time. parallel_for(tasks, fn) calls fn(task, slot) once for
/// every task; the caller and the workers claim tasks one by one from a shared counter, so a worker that the
/// OS has descheduled (other processes on the machine) never holds the caller up: a worker joins a job only
/// while it is open, and the caller closes it as soon as every task is claimed, then waits only for the
/// workers that joined. threads = 1 creates no threads and runs tasks inline, in order. A task that throws
/// (std::bad_alloc when a scratch buffer grows) ends the job: tasks not yet claimed are skipped, and the caller
/// rethrows the first exception once every thread has left the job, so the pool stays usable. One pool may serve
/// several models that run alternately (a target and its draft); calls must not be concurrent or nested.
///
///   ThreadPool pool(2);
///   pool.parallel_for(blocks, [&](std::size_t block, std::size_t slot) { work(block, scratch[slot]); });
class ThreadPool {
 public:
  /// requires: threads >= 1. `spin` is how long an idle thread polls before it blocks.
  explicit ThreadPool(std::size_t threads = 1, std::chrono::microseconds spin = std::chrono::microseconds(300))
      : count_(threads), spin_(spin) {
    if (threads == 0) specdec::detail::fail("thread pool needs at least 1 thread, got 0");
    if (threads > count_mask) specdec::detail::fail("thread pool supports at most ", count_mask, " threads, got ", threads);
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

  /// Threads that may run tasks, the caller included; slots passed to tasks are below this.
  std::size_t threads() const { return count_; }

  /// Calls fn(task, slot) once for each task in [0, tasks) and returns when all have returned. `slot`
  /// (0 for the caller) is the running thread's index, for per-thread scratch. If a task throws, the first
  /// exception is rethrown here after the job ends; some other tasks may then not have run.
  template <class Fn>
  void parallel_for(std::size_t tasks, Fn&& fn) {
    if (count_ == 1 || tasks <= 1) {
      for (std::size_t t = 0; t < tasks; ++t) fn(t, std::size_t{0});
      return;
    }
    using F = std::remove_reference_t<Fn>;
    job_ = [](void* context, std::size_t task, std::size_t slot) { (*static_cast<F*>(context))(task, slot); };
    context_ = const_cast<void*>(static_cast<const void*>(std::addressof(fn)));
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    const std::uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
    ticket_.store(generation << generation_shift, std::memory_order_release);  // open, nobody joined
    generation_.store(generation, std::memory_order_release);
    generation_.notify_all();
    claim_tasks(0);
    // Every task is claimed: close the job and wait for the workers that joined it.
    if (ticket_.fetch_or(closed_bit, std::memory_order_acq_rel) & count_mask)
      detail::spin_then_wait(ticket_, [this] { return (ticket_.load(std::memory_order_acquire) & count_mask) == 0; },
                             spin_);
    if (failed_.load(std::memory_order_acquire)) {
      failed_.store(false, std::memory_order_relaxed);
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

 private:
  // ticket_ = generation << generation_shift | closed_bit (no more joins) | number of workers in the job.
  static constexpr std::uint64_t closed_bit = std::uint64_t{1} << 16;
  static constexpr std::uint64_t count_mask = closed_bit - 1;
  static constexpr int generation_shift = 17;

  void claim_tasks(std::size_t slot) {
    for (std::size_t t; (t = next_.fetch_add(1, std::memory_order_acq_rel)) < tasks_;) {
      try {
        job_(context_, t, slot);
      } catch (...) {
        next_.store(tasks_, std::memory_order_relaxed);  // skip the rest; the caller rethrows
        if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
      }
    }
  }

  void work(std::size_t slot) {
    std::uint64_t seen = 0;
    for (;;) {
      detail::spin_then_wait(generation_, [&] { return generation_.load(std::memory_order_acquire) != seen; },
                             spin_);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) return;
      std::uint64_t ticket = ticket_.load(std::memory_order_acquire);
      bool joined = false;
      while (!joined && (ticket >> generation_shift) == seen && !(ticket & closed_bit))
        joined = ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel);
      if (!joined) continue;  // woke after the caller finished this job alone
      claim_tasks(slot);
      const std::uint64_t left = ticket_.fetch_sub(1, std::memory_order_acq_rel) - 1;
      if ((left & closed_bit) && (left & count_mask) == 0) ticket_.notify_all();
    }
  }

  std::size_t count_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;          // [count_ - 1]
  std::atomic<std::uint64_t> generation_{0};  // bumped once per job (and once at shutdown)
  std::atomic<std::uint64_t> ticket_{0};      // see closed_bit
  std::atomic<std::size_t> next_{0};          // next unclaimed task of the current job
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};           // a task of the current job threw; error_ holds the first exception
  std::exception_ptr error_;
  std::size_t tasks_ = 0;                     // tasks of the current job
  void (*job_)(void*, std::size_t, std::size_t) = nullptr;
  void* context_ = nullptr;
};

}  // namespace specdec::llama
