// Tests of the thread pool, the packed weight formats, the batch-invariant matrix kernel and attention.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cfenv>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <cerrno>
#include <csignal>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "specdec/llama/detail/attention.hpp"
#include "specdec/llama/matmul.hpp"

namespace {

using specdec::llama::MatmulOutput;
using specdec::llama::PackedMatrix;
using specdec::llama::PanelEncoding;
using specdec::llama::ThreadPool;

std::uint16_t fp16_bits(std::mt19937& rng, bool allow_negative) {
  // Normal half floats with exponents around 2^-6 .. 2^-4: the range of real quant scales.
  std::uint16_t bits = static_cast<std::uint16_t>((9u << 10) + rng() % (3u << 10));
  if (allow_negative && rng() % 2) bits |= 0x8000;
  return bits;
}

/// Random GGUF quant blocks for `rows` rows of `cols` columns.
std::vector<std::byte> random_blocks(PanelEncoding encoding, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  const std::size_t blocks = rows * cols / 32;
  std::vector<std::byte> data;
  for (std::size_t b = 0; b < blocks; ++b) {
    auto put16 = [&](std::uint16_t v) {
      data.push_back(std::byte(v & 0xFF));
      data.push_back(std::byte(v >> 8));
    };
    put16(fp16_bits(rng, false));
    const PanelEncoding type = specdec::llama::block_type(encoding);
    if (type == PanelEncoding::q4_1) put16(fp16_bits(rng, true));
    const std::size_t quant_bytes = type == PanelEncoding::q8_0 ? 32 : 16;
    for (std::size_t j = 0; j < quant_bytes; ++j) data.push_back(std::byte(rng() & 0xFF));
  }
  return data;
}

specdec::gguf::TensorType gguf_type(PanelEncoding e) {
  switch (specdec::llama::block_type(e)) {
    case PanelEncoding::q8_0: return specdec::gguf::TensorType::Q8_0;
    case PanelEncoding::q4_0: return specdec::gguf::TensorType::Q4_0;
    default: return specdec::gguf::TensorType::Q4_1;
  }
}

struct TestMatrix {
  PackedMatrix packed;
  std::vector<float> dense;  // [rows, cols]: the dequantised weights from the reference dequantiser
};

TestMatrix random_matrix(PanelEncoding encoding, std::size_t rows, std::size_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  TestMatrix m;
  m.dense.resize(rows * cols);
  if (specdec::llama::is_float_encoding(encoding)) {
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (auto& v : m.dense) v = normal(rng);
    m.packed = PackedMatrix::from_rows(rows, cols, encoding, [&](std::size_t r, float* out) {
      std::copy_n(m.dense.data() + r * cols, cols, out);
    });
    if (encoding != PanelEncoding::f32)
      for (auto& v : m.dense) v = specdec::gguf::bf16_to_float(specdec::gguf::float_to_bf16(v));
  } else {
    const auto blocks = random_blocks(encoding, rows, cols, rng);
    m.packed = PackedMatrix::from_blocks(rows, cols, encoding, blocks.data());
    const std::size_t row_bytes = blocks.size() / rows;
    for (std::size_t r = 0; r < rows; ++r)
      specdec::gguf::dequantize_row(gguf_type(encoding), blocks.data() + r * row_bytes, m.dense.data() + r * cols, cols);
  }
  return m;
}

std::vector<float> random_inputs(std::size_t positions, std::size_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(positions * cols);
  for (auto& v : x) v = normal(rng);
  return x;
}

const PanelEncoding all_encodings[] = {PanelEncoding::f32,      PanelEncoding::bf16,     PanelEncoding::bf16_dot,
                                       PanelEncoding::q8_0,     PanelEncoding::q4_0,     PanelEncoding::q4_1,
                                       PanelEncoding::q8_0_dot, PanelEncoding::q4_0_dot, PanelEncoding::q4_1_dot};
const PanelEncoding dot_encodings[] = {PanelEncoding::q8_0_dot, PanelEncoding::q4_0_dot, PanelEncoding::q4_1_dot};
const PanelEncoding wide_encodings[] = {PanelEncoding::q8_0, PanelEncoding::q4_0, PanelEncoding::q4_1};
const PanelEncoding block_encodings[] = {PanelEncoding::q8_0_dot, PanelEncoding::q4_0_dot, PanelEncoding::q4_1_dot,
                                         PanelEncoding::q8_0,     PanelEncoding::q4_0,     PanelEncoding::q4_1};

/// The inputs a kernel multiplies, one position's row of cols values: bf16_dot rounds them to bf16; the
/// integer dot encodings quantise them to int8 per 32 columns (scale max|x| / 127, round to nearest even); the
/// other block encodings take them as 24-bit integers, within the reference's tolerance of x itself.
std::vector<double> effective_inputs(PanelEncoding encoding, const float* x, std::size_t cols) {
  std::vector<double> out(x, x + cols);
  if (encoding == PanelEncoding::bf16_dot)
    for (std::size_t k = 0; k < cols; ++k) out[k] = specdec::gguf::bf16_to_float(specdec::gguf::float_to_bf16(x[k]));
  if (specdec::llama::is_dot_encoding(encoding))
    for (std::size_t b = 0; b < cols; b += 32) {
      float amax = 0.0f;
      for (std::size_t k = b; k < b + 32; ++k) amax = std::max(amax, std::abs(x[k]));
      const float scale = amax / 127.0f;
      for (std::size_t k = b; k < b + 32; ++k) {
        const float q = scale == 0.0f ? 0.0f : std::nearbyint(x[k] * (1.0f / scale));
        REQUIRE(std::abs(q) <= 127.0f);
        out[k] = double(q) * double(scale);
      }
    }
  return out;
}

}  // namespace

TEST_CASE("the thread pool runs every task exactly once per job, many jobs in a row", "[kernels]") {
  // Without spinning (0 us) the workers sleep between jobs and often join late or not at all: then the caller
  // runs the tasks assigned to them by join order.
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(0)})
  for (std::size_t threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads, spin);
    REQUIRE(pool.threads() == threads);
    for (std::size_t tasks : {0, 1, 2, 7, 64}) {
      std::vector<std::atomic<int>> hits(tasks);
      std::atomic<bool> bad_slot{false};
      for (int job = 0; job < 500; ++job)
        pool.parallel_for(tasks, [&](std::size_t task, std::size_t slot) {
          if (slot >= threads) bad_slot = true;
          hits[task].fetch_add(1);
        });
      REQUIRE(!bad_slot);
      for (auto& h : hits) REQUIRE(h.load() == 500);
    }
  }
}

TEST_CASE("every task runs under the caller's floating-point controls, set after the pool started", "[kernels]") {
  // A worker keeps the controls it had; a product of subnormals flushed to zero on one thread and not on
  // another would make a row's bits depend on the thread that computed it.
  ThreadPool pool(2);
  pool.parallel_for(2, [](std::size_t, std::size_t) {});  // the worker is started and has run a job
#if defined(__x86_64__) || defined(__i386__)
  // The SSE control register: rounding (bits 13-14), flush-to-zero (15), denormals-are-zero (6).
  const auto controls = [] { return _mm_getcsr() & 0xE040u; };
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0xE040u);  // round toward zero, flush to zero, denormals as zero
  const auto restore = [saved] { _mm_setcsr(saved); };
#else
  const auto controls = [] { return std::fegetround(); };
  const int saved = std::fegetround();
  REQUIRE(std::fesetround(FE_TOWARDZERO) == 0);
  const auto restore = [saved] { std::fesetround(saved); };
#endif
  const auto expected = controls();
  std::vector<decltype(controls())> seen(64);
  std::vector<std::size_t> slots(64);
  pool.parallel_for(64, [&](std::size_t task, std::size_t slot) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // long enough that the worker joins
    seen[task] = controls(), slots[task] = slot;
  });
  restore();
  REQUIRE(std::count(slots.begin(), slots.end(), 1) > 0);
  for (const auto& s : seen) CHECK(s == expected);
}

TEST_CASE("callers on several threads take turns on one pool, and a task calling its own pool gets an error",
          "[kernels]") {
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(0)}) {
    ThreadPool pool(2, spin);
    constexpr int jobs = 2000;
    std::atomic<int> bad{0};
    const auto busy = [] {  // a few microseconds, so that jobs of different callers would overlap
      std::atomic<int> steps{0};
      while (steps.fetch_add(1, std::memory_order_relaxed) < 2000) {
      }
    };
    const auto caller = [&](int id) {
      for (int job = 0; job < jobs; ++job) {
        std::vector<std::atomic<int>> hits(5);
        if (job % 2) {
          pool.parallel_for(hits.size(), [&](std::size_t task, std::size_t) { busy(), hits[task].fetch_add(1); });
        } else {
          pool.run_together([&](std::size_t task, std::size_t) { busy(), hits[task].fetch_add(1 + id); });
        }
        for (std::size_t t = 0; t < hits.size(); ++t)
          if (hits[t].load() != (job % 2 ? 1 : t < 2 ? 1 + id : 0)) ++bad;
      }
    };
    std::thread a(caller, 0), b(caller, 1);
    caller(2);
    a.join();
    b.join();
    CHECK(bad == 0);
  }
  ThreadPool pool(2), other(2);
  CHECK_THROWS_WITH(pool.parallel_for(4, [&](std::size_t, std::size_t) { pool.parallel_for(2, [](std::size_t, std::size_t) {}); }),
                    Catch::Contains("a task of its own called parallel_for or run_together"));
  std::atomic<int> inner{0};  // another pool, or a job of one task (run inline), is fine
  pool.parallel_for(2, [&](std::size_t, std::size_t) {
    pool.parallel_for(1, [&](std::size_t, std::size_t) { inner.fetch_add(1); });
  });
  CHECK(inner == 2);
  pool.parallel_for(2, [&](std::size_t task, std::size_t) {
    if (task == 0) other.parallel_for(3, [&](std::size_t, std::size_t) { inner.fetch_add(1); });
  });
  CHECK(inner == 5);
}

TEST_CASE("a pool wakes only its own sleeping threads, and only when it has some", "[kernels]") {
  // When the pools blocked through std::atomic<std::uint64_t>::wait, libstdc++'s one table of 16 waiter entries
  // for every such atomic made every job of the busy pool find the idle pool's worker there and make a futex
  // system call. Each pool's threads now block on the pool's own futex words, marked when a thread may be
  // blocked there (detail::Signal), and a job makes the wake call only then.
  ThreadPool idle(2), busy(2);
  idle.parallel_for(2, [](std::size_t, std::size_t) {});
  busy.parallel_for(2, [](std::size_t, std::size_t) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well past the 300 us spin: both workers block
  const std::uint64_t idle_before = idle.wakes(), asleep = busy.wakes();
  // Jobs until the busy pool's worker runs a task: it has woken (each job until then may wake it again).
  for (std::atomic<bool> worker_ran{false}; !worker_ran;)
    busy.parallel_for(2, [&](std::size_t, std::size_t slot) { worker_ran = worker_ran || slot == 1; });
  const std::uint64_t awake = busy.wakes();
  CHECK(awake - asleep >= 1);
  std::atomic<int> ran{0};
  constexpr int jobs = 2000;
  for (int job = 0; job < jobs; ++job) busy.parallel_for(2, [&](std::size_t, std::size_t) { ran.fetch_add(1); });
  CHECK(ran.load() == 2 * jobs);
  CHECK(busy.wakes() - awake < jobs / 4);  // about 0; a busy machine may make the threads block now and then
  CHECK(idle.wakes() == idle_before);
  std::atomic<int> later{0};  // the idle pool wakes its worker for its own next job
  idle.parallel_for(4, [&](std::size_t, std::size_t) { later.fetch_add(1); });
  CHECK(later.load() == 4);
  CHECK(idle.wakes() - idle_before >= 1);
}

TEST_CASE("a task that throws ends its job: the caller rethrows, and the pool runs the next job", "[kernels]") {
  for (std::size_t threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 200; ++job) {
      CAPTURE(threads, job);
      const std::size_t tasks = 16, bad = static_cast<std::size_t>(job) % tasks;
      std::atomic<int> ran{0};
      REQUIRE_THROWS_WITH(pool.parallel_for(tasks,
                                            [&](std::size_t task, std::size_t) {
                                              ran.fetch_add(1);
                                              if (task == bad) throw std::runtime_error("task " + std::to_string(task));
                                            }),
                          "task " + std::to_string(bad));
      REQUIRE(ran.load() >= 1);
      std::vector<std::atomic<int>> hits(tasks);
      pool.parallel_for(tasks, [&](std::size_t task, std::size_t) { hits[task].fetch_add(1); });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
  }
}

TEST_CASE("tasks run together each get a thread, wait for each other at every step, and an abort frees them",
          "[kernels]") {
  // Without spinning (0 us) the workers sleep between jobs: the caller's task waits for them to wake and join.
  using specdec::llama::StepBarrier;
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(0)})
    for (std::size_t threads : {1, 2, 3, 4}) {
      CAPTURE(spin.count(), threads);
      ThreadPool pool(threads, spin);
      constexpr std::size_t steps = 200;
      const std::vector<std::byte> next(1 << 20);  // every other wait asks for its lines while it waits
      for (int job = 0; job < 20; ++job) {
        StepBarrier barrier(threads);
        std::vector<std::atomic<std::size_t>> done(threads), slot_tasks(threads);
        std::atomic<int> early{0}, ran{0};
        pool.run_together([&](std::size_t task, std::size_t slot) {
          ran.fetch_add(1);
          slot_tasks[slot].fetch_add(1);
          for (std::size_t s = 1; s <= steps; ++s) {
            done[task].store(s, std::memory_order_relaxed);
            specdec::llama::ReadAhead ahead;
            if (s % 2 == 1) ahead.add(next);
            barrier.wait(task, ahead);
            for (std::size_t other = 0; other < threads; ++other)  // every task has finished step s, none s + 2
              if (const std::size_t d = done[other].load(std::memory_order_relaxed); d < s || d > s + 1) early.fetch_add(1);
          }
        });
        REQUIRE(ran.load() == int(threads));
        for (auto& t : slot_tasks) REQUIRE(t.load() == 1);  // one task per thread
        REQUIRE(early.load() == 0);
      }
      // A task that cannot go on aborts at step 3: every other task's next wait throws, and the job ends.
      for (std::size_t failing = 0; failing < threads; ++failing) {
        StepBarrier barrier(threads);
        std::atomic<int> aborted{0}, finished{0}, passed_late{0};
        pool.run_together([&](std::size_t task, std::size_t) {
          try {
            for (std::size_t s = 1; s <= steps; ++s) {
              if (task == failing && s == 3) return barrier.abort();
              barrier.wait(task);
              if (s >= 3) passed_late.fetch_add(1);  // no wait passes once the failing task stopped at step 3
            }
            finished.fetch_add(1);
          } catch (const StepBarrier::Aborted&) {
            aborted.fetch_add(1);
          }
        });
        REQUIRE(aborted.load() == int(threads) - 1);
        REQUIRE(finished.load() == 0);
        REQUIRE(passed_late.load() == 0);
      }
    }
}

TEST_CASE("a failing task's own exception reaches run_together's caller, and every task gets its own thread",
          "[kernels]") {
  using specdec::llama::StepBarrier;
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(0)})
    for (std::size_t threads : {2, 3, 4}) {
      CAPTURE(spin.count(), threads);
      ThreadPool pool(threads, spin);
      // The failing task aborts, as it must, then throws: the tasks it releases throw Aborted, often before its
      // own exception leaves it. The caller gets the real error every time (it got Aborted in a third of the
      // jobs when the first exception won).
      int aborted_won = 0;
      for (int job = 0; job < 300; ++job) {
        const std::size_t failing = static_cast<std::size_t>(job) % threads;
        StepBarrier barrier(threads);
        try {
          pool.run_together([&](std::size_t task, std::size_t) {
            if (task == failing) {
              barrier.abort();
              throw std::runtime_error("task " + std::to_string(task) + " failed");
            }
            barrier.wait(task);
          });
          FAIL("the job did not throw");
        } catch (const std::runtime_error& e) {
          REQUIRE(std::string(e.what()) == "task " + std::to_string(failing) + " failed");
        } catch (const StepBarrier::Aborted&) {
          ++aborted_won;
        }
      }
      CHECK(aborted_won == 0);
      // Task 0 returns at once and the others wait for each other, not for it: each still needs a thread of its
      // own (the caller used to run a late worker's task itself, after its own, and two such tasks then waited
      // for each other forever). A wait gives up after 5 s, so that a regression fails instead of hanging.
      std::atomic<int> timed_out{0};  // written by the tasks that give up
      for (int job = 0; job < 200; ++job) {
        std::this_thread::sleep_for(std::chrono::microseconds(job % 2 ? 400 : 0));  // workers asleep or spinning
        std::atomic<std::size_t> arrived{0};
        std::vector<std::atomic<int>> slot_tasks(threads);
        pool.run_together([&](std::size_t task, std::size_t slot) {
          slot_tasks[slot].fetch_add(1);
          if (task == 0) return;
          arrived.fetch_add(1);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (arrived.load() < threads - 1)
            if (std::chrono::steady_clock::now() > deadline) return void(timed_out.fetch_add(1));
        });
        for (auto& t : slot_tasks) REQUIRE(t.load() == 1);
      }
      CHECK(timed_out.load() == 0);
    }
}

TEST_CASE("a pool reached again through another pool's task on the same thread refuses the call, and spin is checked",
          "[kernels]") {
  ThreadPool a(2), b(2);
  // a's task 0 runs on this thread, calls b, whose task 0 runs here too and calls a: a's caller mutex is held
  // by this very thread (locking it again is undefined; it hung).
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(a.parallel_for(2,
                                   [&](std::size_t task, std::size_t) {
                                     if (task == 0)
                                       b.parallel_for(2, [&](std::size_t inner, std::size_t) {
                                         if (inner == 0) a.parallel_for(2, [&](std::size_t, std::size_t) { ++ran; });
                                       });
                                   }),
                    Catch::Contains("a task of its own called parallel_for or run_together"));
  CHECK(ran == 0);
  a.parallel_for(2, [&](std::size_t, std::size_t) { ++ran; });  // both pools still work
  b.parallel_for(2, [&](std::size_t, std::size_t) { ++ran; });
  CHECK(ran == 4);
  CHECK_THROWS_WITH(ThreadPool(2, std::chrono::microseconds(-1)), "thread pool spin must be in 0 us..1 s, got -1 us");
  CHECK_THROWS_WITH(ThreadPool(2, std::chrono::hours(1)), "thread pool spin must be in 0 us..1 s, got 3600000000 us");
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define SPECDEC_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPECDEC_TEST_SANITIZED 1
#endif
#if defined(__linux__) && !defined(SPECDEC_TEST_SANITIZED)  // sanitizers reserve terabytes of address space
constexpr int cap_above_hard_limit = 202;  // the child's exit code where RLIMIT_AS's hard limit is below the cap

/// In a child process whose address space is capped `room` thread stacks above its current size: constructs a
/// pool of 4 threads and returns how many it said it started (the error's "could start only K of 4"), 0 if it
/// started them all, cap_above_hard_limit if the cap cannot be set, -1 for any other outcome. The child's exit
/// code carries the result back.
int threads_started_under_cap(int room) {
  const pid_t child = fork();
  if (child < 0) return -2;
  if (child == 0) {
    for (int signal : {SIGABRT, SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGTERM, SIGINT, SIGALRM})
      std::signal(signal, SIG_DFL);  // the test framework's handlers would report the child's death as its own
    alarm(60);                       // a hang ends the child with SIGALRM, which the parent reports as a failure
    // Threads' stacks of 64 MiB: glibc keeps at most 40 MiB of stacks that ended threads left, and reuses one only
    // if it is at least as large, so every stack here is a new mapping that the cap counts.
    const std::size_t stack = std::size_t{64} << 20;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) _exit(200);
    const bool set = pthread_attr_setstacksize(&attr, stack) == 0 && pthread_setattr_default_np(&attr) == 0;
    pthread_attr_destroy(&attr);
    if (!set) _exit(200);
    long vm_kib = -1;
    if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmSize: %ld kB", &vm_kib) == 1) break;
      std::fclose(f);
    }
    if (vm_kib <= 0) _exit(201);
    // Room for `room` stacks and their guard pages, plus 1 MiB for the allocations along the way.
    const rlim_t cap = static_cast<rlim_t>(vm_kib) * 1024 + static_cast<rlim_t>(room) * (stack + (64 << 10)) +
                       (1 << 20);
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) != 0) _exit(201);
    if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < cap) _exit(cap_above_hard_limit);
    limit = {cap, cap};
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(201);
    try {
      ThreadPool pool(4);
      _exit(0);
    } catch (const specdec::Error& e) {
      int started = -1, wanted = -1;
      if (std::sscanf(e.what(), "thread pool could start only %d of %d threads", &started, &wanted) == 2 &&
          wanted == 4)
        _exit(started);
      _exit(203);
    } catch (...) {
      _exit(204);
    }
  }
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited != child || !WIFEXITED(status)) return -1;
  const int code = WEXITSTATUS(status);
  return code <= 4 || code == cap_above_hard_limit ? code : -1;
}

TEST_CASE("a pool that cannot start all its threads joins those it started and says how many", "[kernels]") {
  // Without room for a thread's stack no worker starts; with room for one or two, those that started are
  // joined before the error (a joinable std::thread destroyed would terminate the child instead).
  const int alone = threads_started_under_cap(0);
  if (alone == cap_above_hard_limit) {
    WARN("not checked: this process's hard RLIMIT_AS is below the cap the test needs");
    return;
  }
  REQUIRE(alone == 1);
  for (int room : {1, 2}) {
    CAPTURE(room);
    const int started = threads_started_under_cap(room);
    REQUIRE(started >= 2);
    REQUIRE(started <= 3);
  }
}
#endif

TEST_CASE("a thread blocked on a Signal wakes at its next advance, and an advance with none blocked makes no call",
          "[kernels]") {
  using specdec::llama::detail::Signal;
  struct Shared {
    Signal signal;
    std::atomic<bool> done{false};
  };
  const auto shared = std::make_shared<Shared>();
  CHECK_FALSE(shared->signal.advance());
  CHECK(shared->signal.count() == 1);
  std::thread sleeper([shared] {
    shared->signal.wait_until([&] { return shared->signal.count() != 1; }, std::chrono::microseconds(0),
                              std::chrono::hours(1));
    shared->done = true;
  });
  for (int i = 0; i < 1000 && !shared->signal.marked(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(shared->signal.marked());  // it has marked the count, and blocks on it now or soon
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(shared->done.load());
  CHECK(shared->signal.advance());  // it found the thread blocked: the wake's one system call
  for (int i = 0; i < 500 && !shared->done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(shared->done.load());
  if (shared->done) sleeper.join();
  else sleeper.detach();  // a thread that slept on (a failure) keeps `shared` alive
}

TEST_CASE("no wake is lost: thousands of jobs, each after an idle gap past the spin, all run", "[kernels]") {
  // The workers spin 20 us and then block; the gaps between jobs (0-80 us, plus the sleep's own slack) end
  // before or after that, so the jobs open with the workers spinning, about to block or blocked, and the
  // caller's wait at a job's end (the parallel_for jobs' tasks take up to 60 us) blocks as well. `recheck` is an
  // hour: a lost wake would hang a job, and the watchdog then ends the run with a message instead of the test
  // timing out. (A race such as the one of 2026-12-04, see detail::Signal, needs a descheduling in a window
  // of a few instructions, which this rarely meets: it catches coarser faults, such as a wake left out.)
  using specdec::llama::StepBarrier;
  CHECK_THROWS_WITH(ThreadPool(2, std::chrono::microseconds(20), std::chrono::milliseconds(0)),
                    "thread pool recheck must be at least 1 ms, got 0 ms");
  CHECK_THROWS_WITH(ThreadPool(0), "thread pool needs at least 1 thread, got 0");
  std::atomic<long> finished{0};
  struct Watchdog {  // stopped and joined however the test ends
    std::atomic<bool> over{false};
    std::thread thread;
    ~Watchdog() {
      over = true;
      thread.join();
    }
  } watchdog;
  watchdog.thread = std::thread([&] {
    long last = -1;
    for (auto still = std::chrono::milliseconds(0); !watchdog.over.load();
         std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
      const long now = finished.load();
      still = now == last ? still + std::chrono::milliseconds(50) : std::chrono::milliseconds(0);
      last = now;
      if (still > std::chrono::seconds(60)) {
        std::fprintf(stderr, "job %ld of the lost-wake test has not ended in 60 s: a wake was lost\n", now);
        std::abort();
      }
    }
  });
  std::mt19937 rng(7);
  for (std::size_t threads : {2, 3}) {
    ThreadPool pool(threads, std::chrono::microseconds(20), std::chrono::hours(1));
    std::vector<std::atomic<int>> hits(8);
    long expected = 0;
    for (int job = 0; job < 6000; ++job, finished.fetch_add(1)) {
      if (job % 2 == 0) {
        StepBarrier barrier(threads);
        pool.run_together([&](std::size_t task, std::size_t) {
          for (int step = 0; step < 3; ++step) barrier.wait(task);
          hits[task].fetch_add(1);
        });
        expected += static_cast<long>(threads);
      } else {
        const std::size_t tasks = 2 + rng() % 6;
        const auto busy = std::chrono::microseconds(rng() % 60);
        pool.parallel_for(tasks, [&](std::size_t task, std::size_t) {
          const auto until = std::chrono::steady_clock::now() + (task == 1 ? busy : busy / 4);
          while (std::chrono::steady_clock::now() < until) {
          }
          hits[task].fetch_add(1);
        });
        expected += static_cast<long>(tasks);
      }
      if (const auto gap = std::chrono::microseconds(rng() % 81); gap.count() > 10) std::this_thread::sleep_for(gap);
    }
    long ran = 0;
    for (auto& h : hits) ran += h.load();
    CHECK(ran == expected);
  }
}

TEST_CASE("a packed matrix gives back the dequantised rows it was built from", "[kernels]") {
  for (auto encoding : all_encodings) {
    CAPTURE(static_cast<int>(encoding));
    const auto m = random_matrix(encoding, 37, 96, 11);
    std::vector<float> row(96);
    for (std::size_t r = 0; r < 37; ++r) {
      m.packed.row(r, row.data());
      for (std::size_t k = 0; k < 96; ++k) REQUIRE(row[k] == Approx(m.dense[r * 96 + k]).margin(1e-6));
    }
  }
}

TEST_CASE("matmul matches a double-precision reference for every encoding and kernel path", "[kernels]") {
  ThreadPool pool(2);
  const std::size_t rows = 83;  // not a multiple of 16: exercises the padded last panel
  for (auto encoding : all_encodings)
    for (std::size_t cols : {160, 45})  // 45: an odd column count, for the float encodings only
      for (bool portable : {false, true})
        for (std::size_t n : {1, 2, 3, 5, 9, 16}) {
          if (cols % 32 != 0 && !specdec::llama::is_float_encoding(encoding)) continue;
          CAPTURE(static_cast<int>(encoding), cols, portable, n);
          const auto m = random_matrix(encoding, rows, cols, 5);
          const auto x = random_inputs(n, cols, 7);
          std::vector<float> y(n * rows, 0.0f);
          specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, false}, x.data(), cols, n, pool, portable);
          for (std::size_t p = 0; p < n; ++p) {
            const auto xe = effective_inputs(encoding, x.data() + p * cols, cols);
            for (std::size_t r = 0; r < rows; ++r) {
              double expected = 0.0, magnitude = 0.0;
              for (std::size_t k = 0; k < cols; ++k) {
                const double xk = xe[k];
                expected += double(m.dense[r * cols + k]) * xk;
                magnitude += std::abs(double(m.dense[r * cols + k]) * xk);
              }
              REQUIRE(std::abs(y[p * rows + r] - expected) <= 1e-5 * magnitude + 1e-6);
            }
          }
        }
}

// bf16_dot where the CPU has AVX-512 BF16 is not compared: vdpbf16ps adds a column pair in its own order and
// flushes denormals, so it is held only to the double-precision reference ("matmul matches a double-precision
// reference ...") and to its own batch invariance.
TEST_CASE("every encoding gives the same bits on the vector and portable paths, but bf16_dot with AVX-512 BF16",
          "[kernels]") {
  ThreadPool pool(2);
  for (std::size_t rows : {83, 75})  // 6 panels, and 5: bf16's last panel is paired with padding
    for (auto encoding : all_encodings)
      for (std::size_t cols : {256, 45}) {  // 45: an odd column count, for the float encodings only
#if defined(__AVX512BF16__)
        if (encoding == PanelEncoding::bf16_dot) continue;  // vdpbf16ps rounds differently from the portable emulation
#endif
        if (cols % 32 != 0 && !specdec::llama::is_float_encoding(encoding)) continue;
        const auto m = random_matrix(encoding, rows, cols, 23);
        auto x = random_inputs(16, cols, 29);
        std::fill(x.begin() + 32, x.begin() + 96, 0.0f);  // an all-zero block: scale 0
        x[70] = 3e-39f;                                   // a block whose largest input is subnormal: the largest shift
        std::fill(x.begin() + 96, x.begin() + 128, 1e-30f);
        x[96] = -1e30f;                                   // a block that spans 60 binades: its small inputs round to 0
        for (std::size_t n : {1, 2, 3, 5, 7, 9, 16}) {
          CAPTURE(rows, static_cast<int>(encoding), cols, n);
          std::vector<float> fast(n * rows), portable(n * rows);
          specdec::llama::matmul(MatmulOutput{&m.packed, portable.data(), rows, false}, x.data(), cols, n, pool, true);
          // The block kernels asking for the next panel at every width, and at none (detail::quiet_dot_products);
          // the kernels asking with either hint (detail::requests_into_l2); the float kernels at 1 and 2
          // positions stepping by one panel or by their most (detail::single_stream_steps), and asking for their
          // own panels' lines ahead or not (detail::near_request_lines: none, 32, one); the AVX2 float kernels
          // asking for nothing ahead at any width (detail::quiet_float_positions_avx2) in the last variant.
          const auto saved = specdec::llama::detail::quiet_dot_products;
          const bool saved_hint = specdec::llama::detail::requests_into_l2;
          const bool saved_steps = specdec::llama::detail::single_stream_steps;
          const std::size_t saved_near = specdec::llama::detail::near_request_lines;
          const std::size_t saved_quiet_floats = specdec::llama::detail::quiet_float_positions_avx2;
          for (bool single : {false, true})
            for (int variant : {0, 1, 2}) {  // ask with NTA, ask into L2, never ask (the float kernels: into L2)
              CAPTURE(single, variant);
              const int quiet = variant == 2 ? 3 * 16 : 0;
              specdec::llama::detail::quiet_dot_products = {quiet, quiet};
              specdec::llama::detail::requests_into_l2 = variant != 0;
              specdec::llama::detail::single_stream_steps = single;
              specdec::llama::detail::near_request_lines = std::array<std::size_t, 3>{0, 32, 1}[variant];
              specdec::llama::detail::quiet_float_positions_avx2 = variant == 2 ? 16 : 0;
              std::fill(fast.begin(), fast.end(), std::numeric_limits<float>::quiet_NaN());  // no earlier variant's rows
              specdec::llama::matmul(MatmulOutput{&m.packed, fast.data(), rows, false}, x.data(), cols, n, pool, false);
              REQUIRE(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)) == 0);
            }
          specdec::llama::detail::quiet_dot_products = saved;
          specdec::llama::detail::requests_into_l2 = saved_hint;
          specdec::llama::detail::single_stream_steps = saved_steps;
          specdec::llama::detail::near_request_lines = saved_near;
          specdec::llama::detail::quiet_float_positions_avx2 = saved_quiet_floats;
        }
      }
}

TEST_CASE("an infinity or a NaN among a position's inputs makes its outputs non-finite in every encoding and path",
          "[kernels]") {
  namespace d = specdec::llama::detail;
  ThreadPool pool(1);
  const std::size_t rows = 40, cols = 96;
  const float inf = std::numeric_limits<float>::infinity();
  for (auto encoding : all_encodings)
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
      CAPTURE(static_cast<int>(encoding), bad);
      const auto m = random_matrix(encoding, rows, cols, 41);
      auto x = random_inputs(3, cols, 43);
      x[cols + 50] = bad;  // position 1, in its second block of 32
      for (const bool portable : {false, true}) {
        CAPTURE(portable);
        std::vector<float> y(3 * rows);
        specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, false}, x.data(), cols, 3, pool, portable);
        for (std::size_t r = 0; r < rows; ++r) {
          REQUIRE(!std::isfinite(y[rows + r]));
          REQUIRE(std::isfinite(y[r]));
          REQUIRE(std::isfinite(y[2 * rows + r]));
        }
      }
    }
  // The quantised entry of such a block: the same bytes on the vector and portable paths, zero digits, NaN scale.
  auto block = random_inputs(1, 32, 47);
  block[17] = std::numeric_limits<float>::quiet_NaN();
  std::byte fast[d::wide_entry_bytes], portable[d::wide_entry_bytes];
  d::quantize_block_wide(block.data(), fast);
  d::quantize_block_wide_portable(block.data(), portable);
  REQUIRE(std::memcmp(fast, portable, sizeof fast) == 0);
  REQUIRE(std::all_of(portable, portable + 96, [](std::byte b) { return b == std::byte{0}; }));
  float scale;
  std::memcpy(&scale, portable + 108, 4);
  REQUIRE(std::isnan(scale));
}

TEST_CASE("a run of panels may start or end inside a pair of bf16 panels: its rows, with the bits of all panels",
          "[kernels]") {
  // bf16 stores its panels in interleaved pairs; a thread's run of panels can start on the second panel of a
  // pair or end on the first (matmul's runs are whole pairs, but start mid-pair after an output of odd panels).
  const std::size_t rows = 75, cols = 64;  // 5 panels
  for (auto encoding : {PanelEncoding::f32, PanelEncoding::bf16, PanelEncoding::bf16_dot}) {
    const auto m = random_matrix(encoding, rows, cols, 31);
    const std::size_t panels = m.packed.panels();
    const auto x = random_inputs(3, cols, 37);
    const bool saved_steps = specdec::llama::detail::single_stream_steps;
    for (bool portable : {false, true})
      for (std::size_t n : {1, 2, 3})
        for (bool single : {false, true}) {  // the vector kernels' steps of one stream, or of several panels
          specdec::llama::detail::single_stream_steps = single;
          const auto run = [&](std::size_t first, std::size_t last) {
            std::vector<float> y(n * rows, std::numeric_limits<float>::quiet_NaN());
            specdec::llama::detail::matmul_panels(MatmulOutput{&m.packed, y.data(), rows, false}, first, last, x.data(),
                                                  cols, n, portable, specdec::llama::detail::next_call(), {});
            return y;
          };
          const auto whole = run(0, panels);
          for (std::size_t first = 0; first < panels; ++first)
            for (std::size_t last = first + 1; last <= panels; ++last) {
              CAPTURE(static_cast<int>(encoding), portable, n, single, first, last);
              const auto y = run(first, last);
              for (std::size_t p = 0; p < n; ++p)
                for (std::size_t r = 0; r < rows; ++r) {
                  const float v = y[p * rows + r];
                  if (r >= first * 16 && r < last * 16) REQUIRE(std::memcmp(&v, &whole[p * rows + r], sizeof v) == 0);
                  else REQUIRE(std::isnan(v));
                }
            }
          specdec::llama::detail::single_stream_steps = saved_steps;
        }
  }
}

TEST_CASE("stored_bytes covers every panel's bytes, the last of an odd number of interleaved bf16 panels too",
          "[kernels]") {
  const std::size_t rows = 75, cols = 64;  // 5 panels
  for (auto encoding : {PanelEncoding::f32, PanelEncoding::bf16, PanelEncoding::bf16_dot, PanelEncoding::q8_0_dot}) {
    CAPTURE(static_cast<int>(encoding));
    const auto m = random_matrix(encoding, rows, cols, 43);
    const auto& w = m.packed;
    const std::byte* last = w.panel(w.panels() - 1);
    const bool pairs = specdec::llama::detail::interleaves_panel_pairs(encoding);
    // The last panel's last byte: its last column pair's 64 bytes where pairs interleave, else panel_bytes on.
    const std::byte* end = pairs ? last + ((cols + 1) / 2 - 1) * specdec::llama::detail::bf16_pair_stride(encoding) + 64
                                 : last + w.panel_bytes();
    CHECK(end <= w.panel(0) + w.stored_bytes());
    CHECK(w.stored_bytes() == (pairs ? w.bytes() + w.panel_bytes() : w.bytes()));
  }
}

TEST_CASE("a read-ahead asks for every line of its first four ranges once, in order, then for nothing",
          "[kernels]") {
  using specdec::llama::ReadAhead;
  static_assert(ReadAhead::can_request, "GCC and Clang builds ask");
  alignas(64) static const std::byte bytes[1024] = {};
  const std::span<const std::byte> all(bytes);
  const auto fill = [&](ReadAhead& ahead) {
    ahead.add(all.subspan(0, 100));    // lines 0-1
    ahead.add({});                     // nothing
    ahead.add(all.subspan(200, 64));   // lines 3-4: a range that starts inside a line
    ahead.add(all.subspan(300, 1));    // line 4 again
    ahead.add(all.subspan(384, 128));  // lines 6-7: a range that ends on a line's end
    ahead.add(all.subspan(600, 64));   // a fifth range: left out
  };
  ReadAhead one_by_one;
  fill(one_by_one);
  const auto base = reinterpret_cast<std::uintptr_t>(bytes);
  for (std::size_t line : {0, 1, 3, 4, 4, 6, 7}) {
    CAPTURE(line);
    CHECK(one_by_one.next() == base + 64 * line);
    CHECK(one_by_one.request(1) == 1);
  }
  CHECK(one_by_one.next() == 0);
  CHECK(one_by_one.request(1) == 0);
  ReadAhead in_fours;
  fill(in_fours);
  CHECK(in_fours.request(4) == 4);
  CHECK(in_fours.request(4) == 3);
  CHECK(in_fours.request(4) == 0);
  CHECK(ReadAhead{}.request(1) == 0);
  // At most max_lines lines, however many the ranges hold.
  const std::vector<std::byte> big(4 * 64 * ReadAhead::max_lines);
  ReadAhead capped;
  capped.add(big);
  std::size_t asked = 0;
  while (const std::size_t n = capped.request(100)) asked += n;
  CHECK(asked == ReadAhead::max_lines);
}

TEST_CASE("panel_span holds panels first to last, whole pairs for bf16, and the tasks' weights are every panel once",
          "[kernels]") {
  const std::size_t rows = 75, cols = 64;  // 5 panels
  for (auto encoding : {PanelEncoding::f32, PanelEncoding::bf16, PanelEncoding::bf16_dot, PanelEncoding::q4_1_dot}) {
    CAPTURE(static_cast<int>(encoding));
    const auto m = random_matrix(encoding, rows, cols, 47);
    const auto& w = m.packed;
    const bool pairs = specdec::llama::detail::interleaves_panel_pairs(encoding);
    const std::size_t pair = pairs ? 2 : 1;
    for (std::size_t first = 0; first <= w.panels(); ++first)
      for (std::size_t last = first; last <= w.panels(); ++last) {
        CAPTURE(first, last);
        const auto span = w.panel_span(first, last);
        // From the first panel's pair to the end of the last one's, within the stored bytes.
        if (first == last) {
          CHECK(span.empty());
          continue;
        }
        CHECK(span.data() == w.panel(first / pair * pair));
        CHECK(span.size() == ((last + pair - 1) / pair - first / pair) * pair * w.panel_bytes());
        CHECK(span.data() + span.size() <= w.panel(0) + w.stored_bytes());
      }
    CHECK(w.panel_span(0, w.panels()).size() == w.stored_bytes());
  }
  // Split between 5 tasks, three outputs of 36 panels in sequence (runs of 22 panels, so that the second and
  // fourth tasks span two outputs each): each line of all three, asked for once.
  const auto f32 = random_matrix(PanelEncoding::f32, 36 * 16, 32, 41);
  const auto bf16 = random_matrix(PanelEncoding::bf16, 36 * 16, 32, 41);
  const auto q8 = random_matrix(PanelEncoding::q8_0_dot, 36 * 16, 32, 41);
  const MatmulOutput outputs[] = {{&f32.packed, nullptr, 0, false}, {&bf16.packed, nullptr, 0, false},
                                  {&q8.packed, nullptr, 0, false}};
  const std::size_t chunk = specdec::llama::detail::matmul_chunk(outputs, 5);
  CHECK(chunk == 22);
  std::size_t lines = 0;
  for (std::size_t task = 0; task < 5; ++task) {
    auto ahead = specdec::llama::detail::task_weights(outputs, task, chunk);
    while (const std::size_t asked = ahead.request(16)) lines += asked;
  }
  CHECK(lines == (f32.packed.stored_bytes() + bf16.packed.stored_bytes() + q8.packed.stored_bytes()) / 64);
}

TEST_CASE("matmul's runs: whole pairs of panels for bf16 only, an even split for every other encoding", "[kernels]") {
  using specdec::llama::detail::matmul_chunk;
  const auto f32 = random_matrix(PanelEncoding::f32, 36 * 16, 32, 41);  // 36 panels
  const auto bf16 = random_matrix(PanelEncoding::bf16, 36 * 16, 32, 41);
  const auto q8 = random_matrix(PanelEncoding::q8_0_dot, 36 * 16, 32, 41);
  const MatmulOutput outputs[] = {{&f32.packed, nullptr, 0, false}, {&bf16.packed, nullptr, 0, false},
                                  {&q8.packed, nullptr, 0, false}};
  for (std::size_t i : {0, 2}) {
    CHECK(matmul_chunk(std::span(&outputs[i], 1), 2) == 18);
    CHECK(matmul_chunk(std::span(&outputs[i], 1), 4) == 9);
    CHECK(matmul_chunk(std::span(&outputs[i], 1), 16) == 4);  // never below 4 panels
  }
  CHECK(matmul_chunk(std::span(&outputs[1], 1), 2) == 18);
  CHECK(matmul_chunk(std::span(&outputs[1], 1), 4) == 10);
  CHECK(matmul_chunk(std::span(outputs, 2), 8) == 10);  // 72 panels, one output bf16: 9, rounded up to pairs
}

TEST_CASE("a matrix with no columns gives zeros, or leaves accumulated outputs as they were", "[kernels]") {
  ThreadPool pool(2);
  const std::size_t rows = 20;
  for (auto encoding : all_encodings)
    for (bool portable : {false, true})
      for (std::size_t n : {1, 2, 9}) {
        CAPTURE(static_cast<int>(encoding), portable, n);
        const auto m = random_matrix(encoding, rows, 0, 3);
        const float x[1] = {0.0f};
        std::vector<float> y(n * rows, 5.0f);
        specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, true}, x, 0, n, pool, portable);
        REQUIRE(std::all_of(y.begin(), y.end(), [](float v) { return v == 5.0f; }));
        specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, false}, x, 0, n, pool, portable);
        REQUIRE(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
      }
}

TEST_CASE("the integer dot encodings stay within int8 input rounding of the exact float product", "[kernels]") {
  ThreadPool pool(1);
  const std::size_t rows = 64, cols = 576;
  for (auto encoding : dot_encodings) {
    CAPTURE(static_cast<int>(encoding));
    const auto m = random_matrix(encoding, rows, cols, 31);
    const auto x = random_inputs(4, cols, 37);
    std::vector<float> y(4 * rows);
    specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, false}, x.data(), cols, 4, pool);
    for (std::size_t p = 0; p < 4; ++p)
      for (std::size_t r = 0; r < rows; ++r) {
        double exact = 0.0, bound = 0.0;
        for (std::size_t k = 0; k < cols; ++k) {
          exact += double(m.dense[r * cols + k]) * x[p * cols + k];
          bound += std::abs(double(m.dense[r * cols + k]));
        }
        // each input moves by at most half a step, max|x| / 254, and max|x| < 6 for these inputs
        REQUIRE(std::abs(y[p * rows + r] - exact) <= bound * 6.0 / 254.0);
      }
  }
}

TEST_CASE("the 24-bit input encodings are as precise as float products", "[kernels]") {
  // The same weights as exact floats (f32) and as blocks with 24-bit inputs: the largest relative error over
  // every output, against a double-precision product, is no larger than the f32 kernel's (measured: a third of
  // it, as the integer sums round only once per block; with 8-bit inputs it is far larger).
  ThreadPool pool(1);
  const std::size_t rows = 64, cols = 576, n = 4;
  const auto x = random_inputs(n, cols, 41);
  for (auto encoding : wide_encodings) {
    CAPTURE(static_cast<int>(encoding));
    const auto m = random_matrix(encoding, rows, cols, 43);
    const auto f32 = PackedMatrix::from_rows(rows, cols, PanelEncoding::f32, [&](std::size_t r, float* out) {
      std::copy_n(m.dense.data() + r * cols, cols, out);
    });
    std::vector<float> y(n * rows), yf(n * rows);
    specdec::llama::matmul(MatmulOutput{&m.packed, y.data(), rows, false}, x.data(), cols, n, pool);
    specdec::llama::matmul(MatmulOutput{&f32, yf.data(), rows, false}, x.data(), cols, n, pool);
    double worst = 0.0, worst_f32 = 0.0;
    for (std::size_t p = 0; p < n; ++p)
      for (std::size_t r = 0; r < rows; ++r) {
        double exact = 0.0, magnitude = 0.0;
        for (std::size_t k = 0; k < cols; ++k) {
          exact += double(m.dense[r * cols + k]) * x[p * cols + k];
          magnitude += std::abs(double(m.dense[r * cols + k]) * x[p * cols + k]);
        }
        worst = std::max(worst, std::abs(y[p * rows + r] - exact) / magnitude);
        worst_f32 = std::max(worst_f32, std::abs(yf[p * rows + r] - exact) / magnitude);
      }
    CAPTURE(worst, worst_f32);
    REQUIRE(worst_f32 > 0.0);
    REQUIRE(worst <= worst_f32);
  }
}

TEST_CASE("24-bit inputs: the vector and scalar quantisers write the same bytes, and the digits give back X", "[kernels]") {
  namespace d = specdec::llama::detail;
  std::vector<std::vector<float>> blocks;
  const auto normal = random_inputs(1, 32 * 8, 47);
  for (std::size_t b = 0; b < 8; ++b) blocks.emplace_back(normal.begin() + 32 * b, normal.begin() + 32 * (b + 1));
  std::vector<float> edge(32, 0.0f);  // the extreme digits and exact ties at shift 0
  const float values[] = {-8355711.0f, 8355711.0f, 128.0f, -128.0f, 127.5f, -127.5f, 0.5f, -0.5f, 1.5f, -2.5f,
                          65535.5f, -65536.0f, 32768.0f, -32896.0f, 1e-45f, 0.0f};
  std::copy(std::begin(values), std::end(values), edge.begin());
  blocks.push_back(edge);
  std::vector<float> shifted(32, 0.25f);  // a largest mantissa just under 2: one shift less
  shifted[3] = 0x1.fffffep0f;
  shifted[9] = -0x1.fffffep-1f;
  blocks.push_back(shifted);
  std::vector<float> subnormal(32, 0.0f);  // the largest shift, 149: subnormals stay exact
  for (std::size_t j = 0; j < 32; ++j) subnormal[j] = (j % 2 ? -1.0f : 1.0f) * 1e-45f * static_cast<float>(j * 977 % 4096);
  blocks.push_back(subnormal);
  blocks.push_back(std::vector<float>(32, 0.0f));
  std::vector<float> spread(32, 1e-30f);  // 60 binades: the small inputs round to 0
  spread[5] = -1e30f;
  blocks.push_back(spread);
  std::vector<float> huge(32, 3e-30f);  // the smallest shift, -105 (scaled down past a float's exponents)
  huge[7] = 3.0e38f, huge[8] = -2.5e38f, huge[9] = 1e32f;
  blocks.push_back(huge);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    CAPTURE(b);
    std::byte fast[d::wide_entry_bytes], portable[d::wide_entry_bytes];
    d::quantize_block_wide(blocks[b].data(), fast);
    d::quantize_block_wide_portable(blocks[b].data(), portable);
    REQUIRE(std::memcmp(fast, portable, sizeof fast) == 0);
    float scale;
    std::memcpy(&scale, portable + 108, 4);
    const int s = -std::ilogb(scale);
    std::int32_t sums[3] = {0, 0, 0}, total = 0;
    for (std::size_t j = 0; j < 32; ++j) {
      const std::int32_t l = static_cast<std::int8_t>(portable[j]), m = static_cast<std::int8_t>(portable[32 + j]),
                         h = static_cast<std::int8_t>(portable[64 + j]);
      const std::int32_t X = h * 65536 + m * 256 + l;
      REQUIRE(std::abs(static_cast<double>(X) - std::ldexp(static_cast<double>(blocks[b][j]), s)) <= 0.5);
      REQUIRE(std::abs(X) <= d::wide_max);
      sums[0] += l, sums[1] += m, sums[2] += h, total += X;
    }
    std::int32_t stored[3];
    std::memcpy(stored, portable + 96, 12);
    REQUIRE(std::equal(stored, stored + 3, sums));
    float sx;
    std::memcpy(&sx, portable + 112, 4);
    REQUIRE(sx == static_cast<float>(total) * scale);
  }
  REQUIRE(d::wide_shift(8355711.0f) == 0);
  REQUIRE(d::wide_shift(0x1.fffffep0f) == 21);  // 2^22 · 1.99999988 would exceed wide_max
  REQUIRE(d::wide_shift(1.5f) == 22);
  REQUIRE(d::wide_shift(1e-45f) == 149);
}

TEST_CASE("24-bit inputs: the shift and scale from the float's bits equal their definitions for every binade",
          "[kernels]") {
  namespace d = specdec::llama::detail;
  // The definition: the largest s with amax·2^s <= wide_max, at most 149; 0 for zero and non-finite maxima.
  const auto defined_shift = [](float amax) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;
    int s = 22 - std::ilogb(amax);
    if (std::ldexp(static_cast<double>(amax), s) > d::wide_max) --s;
    return std::min(s, 149);
  };
  std::mt19937 rng(5);
  // The stored significand bits around 2·wide_max = 2^23 + 0x7EFEFE, where the shift drops by one, and random ones.
  std::vector<std::uint32_t> significands = {0, 1, 0x7EFEFD, 0x7EFEFE, 0x7EFEFF, 0x7FFFFF};
  for (int i = 0; i < 16; ++i) significands.push_back(rng() & 0x7FFFFF);
  for (std::uint32_t exponent = 0; exponent < 256; ++exponent)
    for (const std::uint32_t significand : significands) {
      const float amax = std::bit_cast<float>(exponent << 23 | significand);
      CAPTURE(exponent, significand);
      REQUIRE(d::wide_shift(amax) == defined_shift(amax));
    }
  for (int s = -106; s <= 149; ++s) {
    CAPTURE(s);
    REQUIRE(d::wide_scale(s) == std::ldexp(1.0f, -s));
  }
}

TEST_CASE("matmul of n positions is bit-identical to n single-position products, any thread count", "[kernels]") {
  const std::size_t most = 35;  // past 16 positions the kernels split them into groups
  // 200 rows end on a whole 8-row half panel, 203 on 3 rows of one; 45 columns (float encodings only) on an odd
  // column of a bf16 pair and a partial vector.
  for (const auto& [rows, cols] : {std::pair<std::size_t, std::size_t>{200, 128}, {203, 96}, {203, 45}})
  for (auto encoding : all_encodings)
    for (bool portable : {false, true}) {
      if (cols % 32 != 0 && !specdec::llama::is_float_encoding(encoding)) continue;
      CAPTURE(rows, cols);
      const auto m = random_matrix(encoding, rows, cols, 17);
      const auto x = random_inputs(most, cols, 19);
      std::vector<float> single(most * rows);
      ThreadPool one(1);
      for (std::size_t p = 0; p < most; ++p)
        specdec::llama::matmul(MatmulOutput{&m.packed, single.data() + p * rows, rows, false}, x.data() + p * cols,
                               cols, 1, one, portable);
      for (std::size_t threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (std::size_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 23, 35}) {
          CAPTURE(static_cast<int>(encoding), portable, threads, n);
          std::vector<float> batch(n * rows);
          specdec::llama::matmul(MatmulOutput{&m.packed, batch.data(), rows, false}, x.data(), cols, n, pool, portable);
          REQUIRE(std::memcmp(batch.data(), single.data(), n * rows * sizeof(float)) == 0);
        }
      }
    }
}

TEST_CASE("matmul on inputs the caller quantised, row by row and block by block, gives the same bits", "[kernels]") {
  // The model quantises each row (or block) as the step that writes it finishes; the kernels must take those
  // bytes for exactly the quantisation they would compute, over one position group (n <= 16) and several.
  namespace d = specdec::llama::detail;
  const std::size_t rows = 40, cols = 96, blocks = cols / 32;
  ThreadPool pool(2);
  for (auto encoding : all_encodings) {
    if (specdec::llama::is_float_encoding(encoding)) continue;
    const int digits = specdec::llama::is_dot_encoding(encoding) ? 1 : 3;
    const auto m = random_matrix(encoding, rows, cols, 23);
    for (std::size_t n : {1, 5, 16, 17, 35}) {
      CAPTURE(static_cast<int>(encoding), n);
      const auto x = random_inputs(n, cols, 29);
      std::vector<std::byte> whole(n * blocks * d::entry_bytes(digits)), pieces(whole.size(), std::byte{0x5a});
      d::quantize_inputs(digits, x.data(), cols, n, cols, whole.data());
      for (std::size_t b = blocks; b-- > 0;)  // blocks in reverse, positions in any order: each entry has one place
        for (std::size_t i = 0; i < n; ++i) d::quantize_row_blocks(digits, x.data() + i * cols, i, b, b + 1, n, blocks, pieces.data());
      REQUIRE(pieces == whole);
      // Other inputs' bytes handed over with x's floats: the product is the other inputs' (the bytes are used).
      const auto other = random_inputs(n, cols, 31);
      std::vector<std::byte> other_bytes(whole.size());
      d::quantize_inputs(digits, other.data(), cols, n, cols, other_bytes.data());
      std::vector<float> own(n * rows), given(n * rows), ignored(n * rows);
      for (bool portable : {false, true}) {
        specdec::llama::matmul(MatmulOutput{&m.packed, own.data(), rows, false}, other.data(), cols, n, pool, portable);
        specdec::llama::matmul(MatmulOutput{&m.packed, given.data(), rows, false}, x.data(), cols, n, pool, portable,
                               specdec::llama::QuantizedInputs{other_bytes.data(), digits});
        REQUIRE(std::memcmp(own.data(), given.data(), own.size() * sizeof(float)) == 0);
        specdec::llama::matmul(MatmulOutput{&m.packed, own.data(), rows, false}, x.data(), cols, n, pool, portable);
        // Bytes for the other digit count are not these inputs' quantisation for this encoding: ignored.
        std::vector<std::byte> junk(n * blocks * 128, std::byte{0x7f});
        specdec::llama::matmul(MatmulOutput{&m.packed, ignored.data(), rows, false}, x.data(), cols, n, pool, portable,
                               specdec::llama::QuantizedInputs{junk.data(), 4 - digits});
        REQUIRE(std::memcmp(own.data(), ignored.data(), own.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("matmul with several outputs and accumulation equals separate products plus the old values", "[kernels]") {
  ThreadPool pool(2);
  const std::size_t cols = 64;
  const auto a = random_matrix(PanelEncoding::q4_1, 48, cols, 1);
  const auto b = random_matrix(PanelEncoding::f32, 20, cols, 2);
  const auto x = random_inputs(3, cols, 3);
  std::vector<float> ya(3 * 48, 0.0f), yb(3 * 20, 1.5f), sa(3 * 48), sb(3 * 20);
  const MatmulOutput outputs[] = {{&a.packed, ya.data(), 48, false}, {&b.packed, yb.data(), 20, true}};
  specdec::llama::matmul(outputs, x.data(), cols, 3, pool);
  specdec::llama::matmul(MatmulOutput{&a.packed, sa.data(), 48, false}, x.data(), cols, 3, pool);
  specdec::llama::matmul(MatmulOutput{&b.packed, sb.data(), 20, false}, x.data(), cols, 3, pool);
  REQUIRE(ya == sa);
  for (std::size_t i = 0; i < sb.size(); ++i) REQUIRE(yb[i] == 1.5f + sb[i]);
}

TEST_CASE("exp_approx is within a few ulp of std::exp and its vector twin gives the same bits", "[kernels]") {
  std::vector<float> x;
  for (float v = -90.0f; v < 90.0f; v += 0.0137f) x.push_back(v);
  x.resize(x.size() / 16 * 16 + 7);  // a tail after the vector body
  std::vector<float> vectorised = x;  // softmax_row's weights: e^(x − max) by exp16, or exp_approx in a tail
  specdec::llama::detail::softmax_row(vectorised.data(), vectorised.size());
  const float max = *std::max_element(x.begin(), x.end());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float weight = specdec::llama::detail::exp_approx(x[i] - max);
    REQUIRE(std::memcmp(&weight, &vectorised[i], sizeof(float)) == 0);
    const float scalar = specdec::llama::detail::exp_approx(x[i]);
    if (x[i] > -87.0f && x[i] < 88.0f) REQUIRE(std::abs(scalar - std::exp(x[i])) <= 4e-7f * std::exp(x[i]));
  }
  REQUIRE(specdec::llama::detail::exp_approx(-1000.0f) < 1e-37f);
  REQUIRE(specdec::llama::detail::exp_approx(0.0f) == 1.0f);
}

TEST_CASE("softmax_row gives the bits of the reference sequence for every length, ties, zeros and NaN", "[kernels]") {
  // softmax_row folds the max and the sum in vector lanes; softmax_row_portable is the scalar reference
  // (max_by_lanes, exp_approx, sum_by_lanes). Lengths cover empty rows, tails of every size and several blocks.
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (std::size_t n = 0; n <= 300; n += (n < 70 ? 1 : 23)) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> s(n);
      for (auto& v : s) v = normal(rng);
      if (kind == 1) for (auto& v : s) v = std::round(v);             // ties for the max
      if (kind == 2) for (std::size_t j = 0; j < n; ++j) s[j] = (j % 3 == 0) ? 0.0f : -0.0f;  // ±0 only
      if (kind == 3 && n > 0) s[rng() % n] = std::nanf(""), s[rng() % n] = -INFINITY;
      std::vector<float> fast = s, reference = s;
      const float sum = specdec::llama::detail::softmax_row(fast.data(), n);
      const float expected = specdec::llama::detail::softmax_row_portable(reference.data(), n);
      INFO("n = " << n << ", kind " << kind);
      REQUIRE(std::memcmp(&sum, &expected, sizeof(float)) == 0);
      REQUIRE((n == 0 || std::memcmp(fast.data(), reference.data(), n * sizeof(float)) == 0));  // data() may be null at 0
    }
  }
}

TEST_CASE("input quantisation for the dot kernels: the vector path writes the same bytes as the scalar one",
          "[kernels]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    float x[32];
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (float& v : x) v = normal(rng) * scale;
    if (trial % 7 == 0) std::fill(x, x + 32, 0.0f);                          // dx = 0
    if (trial % 5 == 1) for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.5f;  // exact halves: ties to even
    if (trial % 11 == 3) x[rng() % 32] = std::numeric_limits<float>::quiet_NaN();  // a NaN scale, zero digits
    if (trial % 13 == 4) x[rng() % 32] = (trial % 2 ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
    const bool tiny = trial % 17 == 5;  // max|x|/127 below the normal floats, zeros among the inputs: digits 0
    if (tiny) for (int j = 0; j < 32; ++j) x[j] = j % 3 ? 0.0f : std::ldexp(normal(rng), -128 - trial % 20);
    std::byte fast[48], scalar[48];
    specdec::llama::detail::quantize_block(x, fast);
    specdec::llama::detail::quantize_block_portable(x, scalar);
    REQUIRE(std::memcmp(fast, scalar, 48) == 0);
    if (tiny) REQUIRE(std::all_of(scalar, scalar + 32, [](std::byte b) { return b == std::byte{0}; }));
  }
}

/// A float as the stored element of a cache: itself, half-precision bits, or (std::int8_t) x·40 rounded into
/// ±127, a row scale of about 1/40 then making it a value of about x.
template <class T>
T store_as(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return specdec::gguf::float_to_fp16(x);
  else return static_cast<std::int8_t>(std::clamp(std::nearbyint(x * 40.0f), -127.0f, 127.0f));
}

/// Row scales for n stored rows of element T: random near 1/40 for std::int8_t (KvFormat::q8), none otherwise
/// (every scale 1 for the exact reference).
template <class T>
std::vector<float> row_scales(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> near(0.02f, 0.03f);
  std::vector<float> scales(n, 1.0f);
  if constexpr (std::is_same_v<T, std::int8_t>)
    for (auto& x : scales) x = near(rng);
  return scales;
}

/// Gives a the row scales of element T (std::int8_t only).
template <class T>
void set_scales(specdec::llama::detail::AttentionGroup<T>& a, const std::vector<float>& keys, const std::vector<float>& values) {
  if constexpr (std::is_same_v<T, std::int8_t>) a.key_scales = keys.data(), a.value_scales = values.data();
}

TEST_CASE("a q8 cache row: scale max|x|/127, each value within half a scale, ties to even, edge rows defined",
          "[kernels]") {
  using specdec::llama::detail::quantize_kv_row;
  std::int8_t q[64];
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 200; ++trial) {
    float x[64];
    for (float& v : x) v = normal(rng);
    const float scale = quantize_kv_row(x, 64, q);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    REQUIRE(scale == amax / 127.0f);
    for (int i = 0; i < 64; ++i) REQUIRE(std::fabs(float(q[i]) * scale - x[i]) <= 0.5f * scale * (1.0f + 1e-5f));
  }
  const float ties[] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, -127.0f};  // scale 1: halves round to even
  REQUIRE(quantize_kv_row(ties, 7, q) == 1.0f);
  const int expected[] = {127, 2, 4, -2, 0, 0, -127};
  for (int i = 0; i < 7; ++i) REQUIRE(q[i] == expected[i]);
  const float zeros[4] = {};
  REQUIRE(quantize_kv_row(zeros, 4, q) == 0.0f);
  for (int i = 0; i < 4; ++i) REQUIRE(q[i] == 0);
  const float odd[] = {1.0f, INFINITY, NAN, -2.0f};  // an infinity: infinite scale, zeros; NaN stored as 0
  REQUIRE(std::isinf(quantize_kv_row(odd, 4, q)));
  for (int i = 0; i < 4; ++i) REQUIRE(q[i] == 0);
  const float tiny[] = {1e-38f, 1e-39f, 0.0f, -3e-39f};  // a subnormal scale: each value still within half a step
  const float tiny_scale = quantize_kv_row(tiny, 4, q);
  REQUIRE(tiny_scale == 1e-38f / 127.0f);
  for (int i = 0; i < 4; ++i) REQUIRE(std::fabs(float(q[i]) * tiny_scale - tiny[i]) <= 0.5f * tiny_scale * (1.0f + 1e-5f));
  const float with_nan[] = {NAN, 63.5f, -127.0f};
  REQUIRE(quantize_kv_row(with_nan, 3, q) == 1.0f);
  REQUIRE((q[0] == 0 && q[1] == 64 && q[2] == -127));
}

TEMPLATE_TEST_CASE("grouped attention: the vector kernels and the portable path give the same bits, close to exact",
                   "[kernels]", float, std::uint16_t, std::int8_t) {
  // TestType: the stored keys' and values' element (std::uint16_t: half-precision bits, KvFormat::f16;
  // std::int8_t: integers with a scale per row, KvFormat::q8). The exact result is computed from the stored
  // values, so every element type meets the same tolerance.
  using specdec::llama::detail::AttentionGroup;
  using specdec::llama::detail::key_block;
  using specdec::llama::detail::kv_to_float;
  const auto store = store_as<TestType>;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t d : {std::size_t{64}, std::size_t{128}, std::size_t{256}, std::size_t{20}}) {
    for (std::size_t heads : {std::size_t{1}, std::size_t{3}, std::size_t{5}, std::size_t{6}}) {
      for (std::size_t keys : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{37}, std::size_t{200}}) {
        const std::size_t blocks = (keys + key_block - 1) / key_block, stride = blocks * key_block;
        std::vector<float> q(heads * d);
        std::vector<TestType> k(keys * d), v(keys * d), kt(blocks * key_block * d, TestType{});
        for (auto& x : q) x = normal(rng);
        for (auto& x : k) x = store(normal(rng));
        for (auto& x : v) x = store(normal(rng));
        for (std::size_t j = 0; j < keys; ++j)
          for (std::size_t c = 0; c < d; ++c) kt[(j / key_block) * d * key_block + c * key_block + j % key_block] = k[j * d + c];
        const std::vector<float> key_scales = row_scales<TestType>(stride, rng), value_scales = row_scales<TestType>(keys, rng);
        std::vector<float> fast(heads * d), portable(heads * d), scores(heads * stride);
        AttentionGroup<TestType> a{q.data(), d, heads, kt.data(), v.data(), keys, d, 1.0f / std::sqrt(float(d)),
                         scores.data(), stride, fast.data(), d};
        set_scales(a, key_scales, value_scales);
        specdec::llama::detail::attend_group(a);
        a.out = portable.data();
        specdec::llama::detail::attend_group(a, /*portable=*/true);
        REQUIRE(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)) == 0);
        for (std::size_t h = 0; h < heads; ++h) {
          std::vector<double> p(keys);
          double max = -1e300, sum = 0.0;
          for (std::size_t j = 0; j < keys; ++j) {
            double s = 0.0;
            for (std::size_t c = 0; c < d; ++c) s += double(q[h * d + c]) * double(kv_to_float(k[j * d + c]));
            p[j] = s * key_scales[j] / std::sqrt(double(d));
            max = std::max(max, p[j]);
          }
          for (auto& x : p) sum += (x = std::exp(x - max));
          for (std::size_t c = 0; c < d; ++c) {
            double exact = 0.0;
            for (std::size_t j = 0; j < keys; ++j) exact += p[j] / sum * double(kv_to_float(v[j * d + c])) * value_scales[j];
            REQUIRE(std::abs(fast[h * d + c] - exact) <= 1e-5 * (1.0 + std::abs(exact)));
          }
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("grouped attention over several positions gives each position the bits of its own call",
                   "[kernels]", float, std::uint16_t, std::int8_t) {
  // A verify pass attends for several consecutive positions in one call (position p seeing keys + p keys);
  // each row must come out as it does alone, on the vector and the portable path. The transposed keys past
  // the last one hold NaN, as stale cache entries might (for std::int8_t, whose integers have no NaN, their
  // row scales do): no row may use them.
  using specdec::llama::detail::AttentionGroup;
  using specdec::llama::detail::key_block;
  const auto store = store_as<TestType>;
  const TestType nan = std::is_same_v<TestType, float>      ? TestType(NAN)
                       : std::is_same_v<TestType, std::int8_t> ? TestType(127)
                                                               : TestType(0x7E00);
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t d : {std::size_t{64}, std::size_t{20}}) {
    for (std::size_t heads : {std::size_t{1}, std::size_t{3}, std::size_t{5}, std::size_t{6}}) {
      for (std::size_t positions : {std::size_t{2}, std::size_t{3}, std::size_t{5}}) {
        for (std::size_t keys : {std::size_t{1}, std::size_t{15}, std::size_t{37}, std::size_t{200}}) {
          const std::size_t total = keys + positions - 1, blocks = (total + key_block - 1) / key_block;
          const std::size_t stride = blocks * key_block, width = heads * d;
          std::vector<float> q(positions * width);
          std::vector<TestType> v(total * d), kt(blocks * key_block * d, nan);
          for (auto& x : q) x = normal(rng);
          for (auto& x : v) x = store(normal(rng));
          for (std::size_t j = 0; j < total; ++j)
            for (std::size_t c = 0; c < d; ++c) kt[(j / key_block) * d * key_block + c * key_block + j % key_block] = store(normal(rng));
          std::vector<float> key_scales = row_scales<TestType>(stride, rng), value_scales = row_scales<TestType>(stride, rng);
          std::fill(key_scales.begin() + std::ptrdiff_t(total), key_scales.end(), NAN);
          std::fill(value_scales.begin() + std::ptrdiff_t(total), value_scales.end(), NAN);
          std::vector<float> fast(positions * width), portable(positions * width), alone(positions * width);
          std::vector<float> scores(positions * heads * stride);
          AttentionGroup<TestType> a{q.data(), d, heads, kt.data(), v.data(), keys, d, 1.0f / std::sqrt(float(d)),
                                     scores.data(), stride, fast.data(), d, positions, width, width};
          set_scales(a, key_scales, value_scales);
          specdec::llama::detail::attend_group(a);
          a.out = portable.data();
          specdec::llama::detail::attend_group(a, /*portable=*/true);
          for (std::size_t p = 0; p < positions; ++p) {
            AttentionGroup<TestType> one{q.data() + p * width, d, heads, kt.data(), v.data(), keys + p, d,
                                         1.0f / std::sqrt(float(d)), scores.data(), stride, alone.data() + p * width, d};
            set_scales(one, key_scales, value_scales);
            specdec::llama::detail::attend_group(one);
          }
          CAPTURE(d, heads, positions, keys);
          REQUIRE(std::none_of(alone.begin(), alone.end(), [](float x) { return std::isnan(x); }));
          REQUIRE(std::memcmp(fast.data(), alone.data(), fast.size() * sizeof(float)) == 0);
          REQUIRE(std::memcmp(portable.data(), alone.data(), fast.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

#if defined(__AVX512F__)
TEST_CASE("the f16 cache's widening: vcvtph2ps and fp16_to_float agree on every half, and round trips hold",
          "[kernels]") {
  // Every 16-bit pattern but the signalling NaNs (which vcvtph2ps quietens; float_to_fp16 never makes one).
  std::vector<std::uint16_t> halves;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const bool signalling_nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0 && !(h & 0x200u);
    if (!signalling_nan) halves.push_back(static_cast<std::uint16_t>(h));
  }
  halves.resize((halves.size() + 15) / 16 * 16, 0);
  for (std::size_t i = 0; i < halves.size(); i += 16) {
    float wide[16];
    _mm512_storeu_ps(wide, specdec::llama::detail::load16(&halves[i]));
    for (std::size_t l = 0; l < 16; ++l) {
      const float scalar = specdec::gguf::fp16_to_float(halves[i + l]);
      REQUIRE(std::memcmp(&wide[l], &scalar, sizeof(float)) == 0);
      if (!std::isnan(scalar)) REQUIRE(specdec::gguf::float_to_fp16(scalar) == halves[i + l]);
    }
  }
}
#endif

TEST_CASE("swiglu gives an element the same bits wherever it falls in the call, and the portable loop's",
          "[kernels]") {
  // The vector builds send a call's last n % lanes elements through the vector kernel, zero-padded; a scalar
  // tail gave the same bits with these flags too (and GCC and Clang at -O1 to -O3, a reviewer found), so this
  // guards against a compiler fusing a multiply-add in one path only. The tiny-model batch test fails when the
  // tail's bits differ. The portable loop's expression, written here, must agree as well.
  const auto gate = random_inputs(1, 40, 8), up = random_inputs(1, 40, 9);
  std::vector<float> all = gate;
  specdec::llama::detail::swiglu(all.data(), up.data(), 40);
  for (std::size_t i = 0; i < 40; ++i) {
    float one = gate[i];
    specdec::llama::detail::swiglu(&one, &up[i], 1);
    REQUIRE(std::memcmp(&one, &all[i], sizeof(float)) == 0);
    const float portable = gate[i] / (1.0f + specdec::llama::detail::exp_approx(-gate[i])) * up[i];
    REQUIRE(std::memcmp(&one, &portable, sizeof(float)) == 0);
    REQUIRE(one == Approx(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]).epsilon(1e-5));
  }
  for (std::size_t start = 0; start < 40; start += 3)  // calls of every length from every third element
    for (std::size_t n = 1; start + n <= 40; ++n) {
      std::vector<float> part(gate.begin() + std::ptrdiff_t(start), gate.begin() + std::ptrdiff_t(start + n));
      specdec::llama::detail::swiglu(part.data(), up.data() + start, n);
      REQUIRE(std::memcmp(part.data(), all.data() + start, n * sizeof(float)) == 0);
    }
}

TEST_CASE("an attention group of more rows than its kernels hold is an error, before any memory is touched",
          "[kernels]") {
  using specdec::llama::detail::AttentionGroup;
  using specdec::llama::detail::max_attention_rows;
  // 13 heads at 5 positions: 65 rows. The pointers are null: nothing may be read or written.
  AttentionGroup<float> a{nullptr, 64, 13, nullptr, nullptr, 16, 64, 0.125f, nullptr, 16, nullptr, 64, 5};
  REQUIRE(a.rows() == max_attention_rows + 1);
  const std::string message = "attention group of 13 heads at 5 positions has 65 rows, at most 64 allowed";
  CHECK_THROWS_WITH(specdec::llama::detail::attend_group(a), message);
  CHECK_THROWS_WITH(specdec::llama::detail::attend_group(a, /*portable=*/true), message);
  CHECK_THROWS_WITH(specdec::llama::detail::attend_group_portable(a), message);
}
