// specdec/llama/thread_pool.hpp — a persistent thread pool for the forward pass's many short parallel loops.
// Entry point: specdec::llama::ThreadPool::parallel_for. Read next: matmul.hpp (its main user).
//
// A forward pass issues a few hundred parallel loops of tens of microseconds each, so waking threads through
// a condition variable per loop costs more than the extra core gains. Workers instead spin on an atomic
// generation counter for a short while after each job and only then block (detail::Signal: a futex with a
// timeout on 64-bit Linux, std::atomic::wait elsewhere), so a busy pool reacts in well under a microsecond while
// an idle pool leaves its cores to others.
// Each thread's first task goes by the order in which it joined the job and the rest are claimed dynamically,
// so a worker that wakes late (a busy machine) only means fewer helpers. Against claiming every task from the
// shared counter, quantized_dot forwards of one position took 0.998x the time while the two vCPUs shared an L3
// (round_trip_ns ~100) and 0.993x while they did not (~420 ns): medians of 64 and 86 rounds of 100 calls each,
// alternating call by call, 2026-12-02.
//
// run_together and StepBarrier serve a longer job instead: one task per thread, all running at once and
// waiting for each other between steps (the layers of a forward of up to 16 positions, detail/transformer.hpp),
// which saves the job's hand-over at each step.
#pragma once

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif
// The pool's threads block on a futex directly where the kernel's futex call takes this ABI's timespec.
#if defined(__linux__) && defined(__LP64__)
#define SPECDEC_THREAD_POOL_FUTEX 1
#endif

#if defined(SPECDEC_THREAD_POOL_FUTEX)
#include <climits>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#include "specdec/error.hpp"

namespace specdec::llama {

namespace detail {

/// Polls of a wait for another thread after which each poll gives the core up instead of pausing: past a few
/// thousand (tens of µs) the awaited thread is likely not running (more threads than free cores).
inline constexpr unsigned yield_after_polls = 4096;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// The floating-point controls that decide a result's bits: on x86 the SSE control register without its sticky
/// exception flags (rounding, flush-to-zero and denormals-are-zero, which a program may set for speed, and the
/// exception masks), elsewhere the rounding mode only (not, say, AArch64's flush-to-zero bit). A worker takes the
/// caller's when it joins a job, so a task gives the same bits on whichever thread runs it.
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
using FpControl = unsigned;
inline constexpr unsigned fp_exception_flags = 0x3F;
inline FpControl fp_control() { return _mm_getcsr() & ~fp_exception_flags; }
inline void set_fp_control(FpControl control) {
  if (const unsigned now = _mm_getcsr(); (now & ~fp_exception_flags) != control)
    _mm_setcsr(control | (now & fp_exception_flags));
}
#else
using FpControl = int;
inline FpControl fp_control() { return std::fegetround(); }
inline void set_fp_control(FpControl control) {
  if (std::fegetround() != control) std::fesetround(control);
}
#endif

/// Cores this process may run on: its CPU affinity mask on Linux (taskset, a container's cpuset), else what
/// std::thread::hardware_concurrency() reports; at least 1.
inline std::size_t usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<std::size_t>(CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

#if defined(SPECDEC_THREAD_POOL_FUTEX)
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free,
              "the futex calls below take a std::atomic<std::uint32_t> for the 32-bit word it holds");
#endif

/// A count of changes that threads may block on until it moves: a 32-bit futex word holding the count in its
/// upper 31 bits and, in bit 0, whether a thread may be blocked on the present count. advance() moves the count
/// and clears the bit in one atomic step, and makes the wake system call only if the bit was set; a thread
/// sets the bit on the count it saw, again in one step, before it blocks on that count. So a wake cannot be
/// lost: if the advance comes first, the thread's bit-setting fails or its block finds the word changed; if
/// the bit comes first, the advance sees it. And a job makes no system call while its threads spin.
/// Until 2026-12-05 the pool kept the sleepers in a separate counter that each wake took to 0: a wake that
/// came between a thread's count and its block (the caller descheduled between opening a job and waking, the
/// thread meanwhile through that job and into its next wait) used up the count that the next job needed, and
/// a run_together job waited for that thread forever. One CI run hung so; the std::atomic::wait of then
/// (libstdc++ 12) spun and yielded the core in that gap. With a 1 ms pause put into both gaps a throwaway
/// loop of jobs hung at its 186th; the same loop with this word ran its 20,000.
class Signal {
 public:
  /// The changes counted so far, modulo 2^31.
  std::uint32_t count() const { return word_.load(std::memory_order_acquire) >> 1; }

  /// Whether a thread has marked the present count as one it may block on (it may not have blocked yet, or
  /// have stopped waiting since): what the next advance() looks at.
  bool marked() const { return (word_.load(std::memory_order_acquire) & 1) != 0; }

  /// Counts a change (sequentially consistent: whatever the caller wrote before is seen by a thread that sees
  /// the new count) and wakes the threads blocked on the old count; returns whether it made that system call.
  bool advance() {
    std::uint32_t word = word_.load(std::memory_order_relaxed);
    while (!word_.compare_exchange_weak(word, (word | 1) + 1, std::memory_order_seq_cst)) {
    }
    if (!(word & 1)) return false;
    wake_all(word_);
    return true;
  }

  /// Spins until `pred()` holds, for at most `spin`, then blocks until the count moves, looks again, and so on;
  /// a blocked thread also looks again every `recheck` by itself (on 64-bit Linux).
  /// requires: whoever makes pred() true then calls advance(); recheck >= 1 ms.
  template <class Pred>
  void wait_until(Pred pred, std::chrono::microseconds spin, std::chrono::milliseconds recheck) {
    const auto deadline = std::chrono::steady_clock::now() + spin;
    for (unsigned i = 1;; ++i) {
      if (pred()) return;
      detail::cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    for (;;) {
      std::uint32_t word = word_.load(std::memory_order_seq_cst);
      if (pred()) return;
      if (!(word & 1) && !word_.compare_exchange_strong(word, word | 1, std::memory_order_seq_cst)) continue;
      wait_while(word_, word | 1, recheck);
    }
  }

 private:
  /// Blocks while `word` holds `seen`, for at most about `limit`; may return early (a wake meant for another
  /// change, a signal). On 64-bit Linux a futex on the word itself; elsewhere std::atomic::wait, without the limit.
  static void wait_while(const std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::milliseconds limit) {
#if defined(SPECDEC_THREAD_POOL_FUTEX)
    timespec timeout{static_cast<time_t>(limit.count() / 1000), static_cast<long>(limit.count() % 1000) * 1000000L};
    syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, &timeout, nullptr, 0);
#else
    (void)limit;
    word.wait(seen, std::memory_order_acquire);
#endif
  }

  /// Wakes every thread blocked in wait_while on `word`.
  static void wake_all(std::atomic<std::uint32_t>& word) {
#if defined(SPECDEC_THREAD_POOL_FUTEX)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    word.notify_all();
#endif
  }

  std::atomic<std::uint32_t> word_{0};
};

/// The pools whose tasks this thread is running, innermost first: a task of pool B called from a task of pool A
/// on the same thread (B's caller runs B's task 0) links to A's. ThreadPool::parallel_for refuses a call from
/// inside a task of its own pool anywhere in the chain: that call would wait for the job it is part of (and lock
/// the pool's caller mutex a second time on this thread).
struct RunningTask {
  const void* pool;
  const RunningTask* outer;
};
inline thread_local const RunningTask* running_task = nullptr;

/// What StepBarrier::wait throws after StepBarrier::abort() (declared here so that ThreadPool knows it).
struct StepBarrierAborted {};

}  // namespace detail

/// A fixed set of threads that run one job at a time. parallel_for(tasks, fn) calls fn(task, slot) once for every
/// task. The first tasks go one to each thread: task 0 to the caller, task k to the k-th worker to join the job (so
/// a job of `threads` tasks, a matmul's, hands nothing over but the job itself); the rest are claimed one by one
/// from a shared counter. A worker that the OS has descheduled (other processes on the machine) never holds the
/// caller up: a worker joins a job only while it is open, and the caller closes it as soon as every task is
/// claimed, runs the first tasks of threads that did not join, then waits only for the workers that did. threads =
/// 1 creates no threads and runs tasks inline, in order. A task that throws (std::bad_alloc when a scratch buffer
/// grows) ends the job: tasks not yet claimed are skipped, and the caller rethrows the first exception (but a
/// StepBarrier::Aborted gives way to any other) once every thread has left the job, so the pool stays usable. One
/// pool may serve several models (a target and its draft, a model and its copies). Calls from several threads take
/// turns: one job runs at a time and the other callers wait for it, so models that share a pool may be used on two
/// threads, though not faster than one after the other. A call from inside one of the pool's own tasks throws
/// specdec::Error: it would wait for itself, and so does one that reaches this pool again through another pool's
/// task on the same thread. (A cycle through another pool's worker thread, a task of this pool calling one whose
/// task on a worker calls this one, is not detected: it waits forever.) Every task runs under the caller's
/// floating-point controls (rounding; on x86 also flush-to-zero, denormals-are-zero and the exception masks),
/// whichever thread runs it.
///
///   ThreadPool pool(2);
///   pool.parallel_for(blocks, [&](std::size_t block, std::size_t slot) { work(block, scratch[slot]); });
class ThreadPool {
 public:
  /// requires: threads >= 1, 0 <= spin <= 1 s, recheck >= 1 ms. `spin` is how long an idle thread polls before
  /// it blocks; `recheck`, how often a blocked thread looks again by itself on 64-bit Linux (see detail::Signal):
  /// an idle pool's thread wakes that often, and a lost wake, were there one, would cost a job that much.
  explicit ThreadPool(std::size_t threads = 1, std::chrono::microseconds spin = std::chrono::microseconds(300),
                      std::chrono::milliseconds recheck = std::chrono::milliseconds(100))
      : count_(threads), spin_(spin), recheck_(recheck) {
    if (threads == 0) specdec::detail::fail("thread pool needs at least 1 thread, got 0");
    if (threads > active_mask) specdec::detail::fail("thread pool supports at most ", active_mask, " threads, got ", threads);
    if (recheck.count() < 1) specdec::detail::fail("thread pool recheck must be at least 1 ms, got ", recheck.count(), " ms");
    if (spin.count() < 0 || spin > std::chrono::seconds(1))
      specdec::detail::fail("thread pool spin must be in 0 us..1 s, got ", spin.count(), " us");
    workers_.reserve(threads - 1);
    try {
      for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
    } catch (const std::system_error& e) {  // the system's thread limit: the threads started so far are joined
      stop_workers();
      specdec::detail::fail("thread pool could start only ", workers_.size() + 1, " of ", threads, " threads: ", e.what());
    } catch (...) {  // std::bad_alloc: joined all the same, or their std::thread destructors would terminate
      stop_workers();
      throw;
    }
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  ~ThreadPool() { stop_workers(); }

  /// Threads that may run tasks, the caller included; slots passed to tasks are below this.
  std::size_t threads() const { return count_; }

  /// How many times a job's opening or end found that a thread of this pool may have blocked (idle past
  /// `spin`) and made the wake call, since construction: a system call each. A pool that runs jobs back to back
  /// keeps this near 0; if it grows by about one a job, `spin` is shorter than the gaps between this program's jobs.
  std::uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  /// Calls fn(task, slot) once for each task in [0, threads()), each on its own thread and all at the same
  /// time (task 0 on the caller), so that the tasks may wait for each other (StepBarrier): the caller does not
  /// run a late worker's task itself, as parallel_for does, but waits for every worker to join, even after its
  /// own task returned. A task that throws must first release the others (StepBarrier::abort), or they wait for
  /// it forever; the caller then rethrows its exception, not the StepBarrier::Aborted of the tasks it released.
  template <class Fn>
  void run_together(Fn&& fn) {
    run_job(count_, std::forward<Fn>(fn), true);
  }

  /// Calls fn(task, slot) once for each task in [0, tasks) and returns when all have returned. `slot`
  /// (0 for the caller) is the running thread's index, for per-thread scratch. If a task throws, the first
  /// exception is rethrown here after the job ends; some other tasks may then not have run.
  template <class Fn>
  void parallel_for(std::size_t tasks, Fn&& fn) {
    run_job(tasks, std::forward<Fn>(fn), false);
  }

 private:
  /// parallel_for, or with `together` run_together.
  template <class Fn>
  void run_job(std::size_t tasks, Fn&& fn, bool together) {
    if (count_ == 1 || tasks <= 1) {
      for (std::size_t t = 0; t < tasks; ++t) fn(t, std::size_t{0});
      return;
    }
    for (const detail::RunningTask* running = detail::running_task; running; running = running->outer)
      if (running->pool == this)
        specdec::detail::fail("thread pool: a task of its own called parallel_for or run_together, which would wait ",
                              "for the job it is part of");
    const std::lock_guard turn(caller_);  // one job at a time; other callers wait here
    using F = std::remove_reference_t<Fn>;
    job_.run = [](void* context, std::size_t task, std::size_t slot) { (*static_cast<F*>(context))(task, slot); };
    job_.context = const_cast<void*>(static_cast<const void*>(std::addressof(fn)));
    job_.tasks = tasks;
    job_.assigned = std::min(count_, tasks);
    job_.fp_control = detail::fp_control();
    next_.store(job_.assigned, std::memory_order_relaxed);
    const std::uint64_t generation = (job_.generation.count() + 1) & generation_mask;
    job_.ticket.store(generation << generation_shift, std::memory_order_release);  // open
    if (job_.generation.advance()) wakes_.fetch_add(1, std::memory_order_relaxed);
    run_task(0, 0);
    claim_tasks(0);
    // Tasks run together need a thread each: wait for the workers that have not joined (after a task 0 that
    // waits for the others at a StepBarrier, all have).
    if (together)
      while (joined(job_.ticket.load(std::memory_order_acquire)) + 1 < job_.assigned) std::this_thread::yield();
    // Every task is claimed: close the job (no more joins), run the assigned tasks of threads that did not join
    // (descheduled, say), and wait for the workers that did.
    const std::uint64_t ticket = job_.ticket.fetch_or(closed_bit, std::memory_order_acq_rel);
    for (std::size_t t = 1 + joined(ticket); t < job_.assigned; ++t) run_task(t, 0);
    if (ticket & active_mask)
      job_.finished.wait_until([this] { return (job_.ticket.load(std::memory_order_acquire) & active_mask) == 0; }, spin_,
                               recheck_);
    if (failed_.load(std::memory_order_acquire)) {
      failed_.store(false, std::memory_order_relaxed);
      error_is_abort_ = false;
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

  void stop_workers() {
    stop_.store(true, std::memory_order_release);
    job_.generation.advance();
    for (auto& worker : workers_) worker.join();
  }

  // Job::ticket = generation << generation_shift | closed_bit (no more joins) | workers that joined the job so
  // far << joined_shift | workers still in it. A worker's place in the join order (1, 2, ...) names the task it
  // runs first: task 0 is the caller's, tasks 1..assigned-1 go to the first workers to join, without a shared
  // counter; the rest are claimed one by one from next_. The generation names the job that a worker joins, so
  // that it joins each job once; it repeats after 2^31 jobs, which a worker would have to sleep through between
  // reading the generation and joining.
  static constexpr int joined_shift = 12;
  static constexpr std::uint64_t active_mask = (std::uint64_t{1} << joined_shift) - 1;
  static constexpr std::uint64_t closed_bit = std::uint64_t{1} << (2 * joined_shift);
  static constexpr int generation_shift = 2 * joined_shift + 1;
  static constexpr std::uint64_t generation_mask = (std::uint64_t{1} << 31) - 1;  // what Signal counts
  static std::size_t joined(std::uint64_t ticket) { return (ticket >> joined_shift) & active_mask; }

  /// Runs task t unless a task of the job has thrown; records the first exception and ends the job.
  void run_task(std::size_t t, std::size_t slot) {
    if (failed_.load(std::memory_order_relaxed)) return;
    const detail::RunningTask running{this, detail::running_task};
    detail::running_task = &running;
    try {
      job_.run(job_.context, t, slot);
    } catch (const detail::StepBarrierAborted&) {
      fail_job(std::current_exception(), true);
    } catch (...) {
      fail_job(std::current_exception(), false);
    }
    detail::running_task = running.outer;
  }

  /// Ends the job with `error`: tasks not yet claimed are skipped and the caller rethrows the job's error. That
  /// is the first exception, but a StepBarrier::Aborted gives way to any other: a task that fails aborts the
  /// barrier before it throws, so the tasks it releases may get there first with only the news of its failure.
  void fail_job(std::exception_ptr error, bool released_by_abort) {
    next_.store(job_.tasks, std::memory_order_relaxed);
    const std::lock_guard lock(error_mutex_);  // the exceptional path only
    if (!error_ || (error_is_abort_ && !released_by_abort)) {
      error_ = std::move(error);
      error_is_abort_ = released_by_abort;
    }
    failed_.store(true, std::memory_order_release);
  }

  void claim_tasks(std::size_t slot) {
    for (std::size_t t; (t = next_.fetch_add(1, std::memory_order_acq_rel)) < job_.tasks;) run_task(t, slot);
  }

  void work(std::size_t slot) {
    std::uint32_t seen = 0;
    for (;;) {
      job_.generation.wait_until([&] { return job_.generation.count() != seen; }, spin_, recheck_);
      seen = job_.generation.count();
      if (stop_.load(std::memory_order_acquire)) return;
      std::uint64_t ticket = job_.ticket.load(std::memory_order_acquire);
      bool joined_job = false;
      while (!joined_job && (ticket >> generation_shift) == seen && !(ticket & closed_bit))
        joined_job = job_.ticket.compare_exchange_weak(ticket, ticket + (std::uint64_t{1} << joined_shift) + 1,
                                                       std::memory_order_acq_rel);
      if (!joined_job) continue;  // woke after the caller closed this job
      detail::set_fp_control(job_.fp_control);
      if (const std::size_t first = joined(ticket) + 1; first < job_.assigned) run_task(first, slot);
      claim_tasks(slot);
      const std::uint64_t left = job_.ticket.fetch_sub(1, std::memory_order_seq_cst) - 1;
      if ((left & closed_bit) && (left & active_mask) == 0) {  // the last to leave a closed job
        if (job_.finished.advance()) wakes_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  // What a worker reads to start a job, on one cache line: written by the caller once per job, read by the workers.
  struct alignas(64) Job {
    detail::Signal generation;        // advanced once per job (and once at shutdown); the workers block on it
    detail::Signal finished;          // advanced when the last worker leaves a closed job; the caller blocks on it
    std::atomic<std::uint64_t> ticket{0};  // see joined_shift
    std::size_t tasks = 0;                 // tasks of the current job
    std::size_t assigned = 0;              // tasks 0..assigned-1 go by join order, not through next_
    void (*run)(void*, std::size_t, std::size_t) = nullptr;
    void* context = nullptr;
    detail::FpControl fp_control{};        // the caller's, which the workers take (detail::fp_control)
  };
  std::atomic<std::uint64_t> wakes_{0};  // see wakes()
  std::size_t count_;
  std::chrono::microseconds spin_;
  std::chrono::milliseconds recheck_;
  std::vector<std::thread> workers_;  // [count_ - 1]
  Job job_;
  alignas(64) std::atomic<std::size_t> next_{0};  // next unclaimed task of the current job, past the assigned ones
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};   // a task of the current job threw; error_ holds the exception to rethrow
  std::mutex error_mutex_;            // guards error_ and error_is_abort_ while tasks fail
  std::exception_ptr error_;
  bool error_is_abort_ = false;       // error_ is a StepBarrier::Aborted
  std::mutex caller_;  // held by the caller of the job that runs; callers on other threads wait for it
};

/// Memory a task reads first in its next step (up to max_ranges byte ranges, in order, and at most max_lines
/// cache lines of them, well within an L2), for StepBarrier::wait to ask for into L2 while the task waits for the
/// others, so that the memory does not idle through the wait and the step starts on lines already fetched or on
/// their way. The requests are hints: they change no result. Where the compiler offers no prefetch (GCC and
/// Clang do), nothing is asked for.
class ReadAhead {
 public:
  static constexpr std::size_t max_ranges = 4;
  static constexpr std::size_t line = 64;
  static constexpr std::size_t max_lines = 4096;  // 256 KiB
#if defined(__GNUC__)
  static constexpr bool can_request = true;
#else
  static constexpr bool can_request = false;
#endif

  /// Appends the cache lines that `bytes` touch; nothing when it is empty or max_ranges ranges are held already.
  void add(std::span<const std::byte> bytes) {
    if (!can_request || bytes.empty() || count_ == max_ranges) return;
    const auto address = reinterpret_cast<std::uintptr_t>(bytes.data());
    ranges_[count_++] = {address - address % line, bytes.size() + address % line};
  }

  /// The next line request() asks for (its address), 0 once there is none.
  std::uintptr_t next() const { return range_ < count_ && asked_ < max_lines ? ranges_[range_].begin + offset_ : 0; }

  /// Asks for the next `lines` cache lines (fewer at the end) into L2; returns how many it asked for, 0 once
  /// every line has been.
  std::size_t request(std::size_t lines) {
    std::size_t asked = 0;
    for (; asked < lines && next() != 0; ++asked, ++asked_) {
#if defined(__GNUC__)
      __builtin_prefetch(reinterpret_cast<const void*>(next()), 0, 2);  // prefetcht1 on x86
#endif
      if ((offset_ += line) >= ranges_[range_].bytes) ++range_, offset_ = 0;
    }
    return asked;
  }

 private:
  struct Range {
    std::uintptr_t begin = 0;  // a line's first byte
    std::size_t bytes = 0;
  };
  Range ranges_[max_ranges];
  std::size_t count_ = 0, range_ = 0, offset_ = 0, asked_ = 0;  // ranges held; the next line: range, offset; lines asked
};

/// Lets the tasks of one ThreadPool::run_together job wait for each other between the steps of their work:
/// wait(task) returns once every task has called it as often as this one. The tasks spin (they run together
/// and the steps are microseconds apart). If a task cannot go on (an exception), abort() makes every wait, now
/// or later, throw StepBarrier::Aborted instead, so that no task waits for it forever.
///
///   StepBarrier barrier(pool.threads());
///   pool.run_together([&](std::size_t task, std::size_t) { step_one(task); barrier.wait(task); step_two(task); });
class StepBarrier {
 public:
  using Aborted = detail::StepBarrierAborted;

  /// requires: tasks >= 1, the number of tasks of the job.
  explicit StepBarrier(std::size_t tasks) : tasks_(tasks), passed_(std::make_unique<Count[]>(tasks)) {}

  /// Task `task` has finished a step: waits until every task has finished as many. Throws Aborted after abort().
  /// While it waits, it asks for the lines of `ahead` (what the task reads next), a few each poll.
  void wait(std::size_t task, ReadAhead ahead = {}) {
    const std::uint64_t steps = passed_[task].steps.load(std::memory_order_relaxed) + 1;
    passed_[task].steps.store(steps, std::memory_order_release);
    for (std::size_t other = 0, spins = 0; other < tasks_; ++other)
      while (passed_[other].steps.load(std::memory_order_acquire) < steps) {
        if (aborted_.load(std::memory_order_acquire)) throw Aborted{};
        // Past a few thousand polls (tens of µs) the other task's thread is likely not running (more threads
        // than free cores): give the core up in each poll, so that it may run here. Before that, a poll asks
        // for some of `ahead` in place of the pause while any is left.
        if (++spins >= detail::yield_after_polls) std::this_thread::yield();
        else if (ahead.request(lines_per_poll) == 0) detail::cpu_relax();
      }
    if (aborted_.load(std::memory_order_acquire)) throw Aborted{};
  }

  /// Releases every task waiting in wait() now or later: they throw Aborted.
  void abort() { aborted_.store(true, std::memory_order_release); }

 private:
  static constexpr std::size_t lines_per_poll = 4;  // 8 and 16 were no better in every format (Xeon, 2026-12-05)
  struct alignas(64) Count {
    std::atomic<std::uint64_t> steps{0};  // steps this task has finished; written by its task only
  };
  std::size_t tasks_;
  std::unique_ptr<Count[]> passed_;  // [tasks]
  alignas(64) std::atomic<bool> aborted_{false};
};

}  // namespace specdec::llama
