// Forward-pass cost of the reference llama (SmolLM2-135M) per weight format and positions per call, against
// the memory-bandwidth floor (weight bytes streamed per forward / read bandwidth measured here) and, for the
// float formats, against the multiply-add peak measured here.
//
//   SPECDEC_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf SPECDEC_THREADS=2 ./bench_llama_forward
//
// BM_LlamaForward_<format>/<n>: with 256 positions in the context (SPECDEC_CONTEXT overrides; the KV cache
// in SPECDEC_KV_FORMAT, f16, f32 or q8, default f16), forward n more
// and truncate back. BM_LlamaForwardCold_<format>/<n> (n = 1, 5, 9; x86 only): the same with every weight
// matrix evicted from the caches before each forward and only the forward timed, so that the weights come from
// memory: back to back, a CPU whose L3 holds part of them reads faster than its memory allows (on the Intel Xeon
// of 2026-12-05, with 300 MiB of L3 reported, the first of ten quantized_dot forwards after an eviction took
// 3.8-4.1 ms and the fifth on 2.4-2.5 ms; this benchmark, evicting before every forward, read 5.0-5.8 ms).
// Counters: weight_bytes (streamed per forward), GB/s (weight bytes / time), bandwidth_GB/s (read bandwidth
// measured just before and just after this benchmark's timed loop, their mean), floor_fraction (bandwidth
// floor time / measured time, against that adjacent bandwidth; 1 = memory-bound at full bandwidth), kv_bytes
// (the KV cache's bytes that attention reads at least once: every row of the context and the new positions, in
// every layer), memory_fraction (floor_fraction with kv_bytes added to the weight bytes), and for f32
// and bf16 fma_fraction (n·weights multiply-adds / time, against the BM_FmaPeak rate measured once at
// start-up; 1 = that rate, two 16-lane FMAs per cycle per core on the Zen 5 of 2026-12-03; 8-lane FMAs on CPUs
// without AVX-512). The shared machine's memory bandwidth drifts by 2x over minutes, so a floor measured once for the
// whole run says little about a benchmark run minutes later.
// With 2 or more threads, round_trip_ns: a cache line's round trip between two threads, before and after, their
// mean (see round_trip_ns below: it tells which placement of the two vCPUs a benchmark ran in).
// BM_MemoryBandwidth: read bandwidth of a 256 MB sum (read_bandwidth: the best of 6 passes). BM_FmaPeak: vector
// FMAs per second (16 lanes, or 8 without AVX-512: the `lanes` counter) with every thread issuing independent FMAs
// from registers.
// BM_VnniPeak: the same for vpdpbusd (64 byte products).
// BM_BlockProducts_{streamed,cached}/<n>: the transformer blocks' weight products alone (quantized_dot, the four
// matmul calls of each layer in the forward's order, W_o and W_down adding into their outputs as the residual
// does, random inputs quantised once beforehand, as the forward's norms, attention and SwiGLU hand them over), n
// positions: `streamed` over the 30 layers' weights as a forward reads them, `cached` over layer 0's weights 30
// times (2.2 MB in quantized_dot and quantized, held in L2 and L3; 7.1 MB in bf16 and bf16_dot and 14.2 MB in
// f32, held in L3). The difference is what fetching the weights from memory instead adds; weight_bytes counts
// the bytes passed through the kernel (30 layers' worth for both); vnni_fraction is the rate of the products'
// vpdpbusd against BM_VnniPeak (one per 64 multiply-adds and input digit), fma_fraction (f32, bf16) that of
// their FMAs against BM_FmaPeak.
// BM_BlockProducts_{streamed,cached}_<format>/<n>: the same for the other formats (the float formats' inputs
// interleaved by each thread, as in the forward).
// BM_BlockProductsCold[_<format>]/<n> (n = 1, 5, 9; x86): `streamed` with the blocks' weights evicted before
// each pass, which alone is timed: the products from memory without attention and the rest of the forward,
// against the floor (floor_fraction) as BM_LlamaForwardCold is.
// On a shared machine run with --benchmark_repetitions=5.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "specdec/llama/llama_model.hpp"
#include "specdec/llama/matmul.hpp"
#include "bench_env.hpp"

namespace {

using specdec::llama::LlamaModel;
using specdec::llama::WeightFormat;

/// The most positions a BM_LlamaForward benchmark forwards at once (see positions()).
constexpr std::size_t max_positions = 16;

/// The run's settings, read once from the environment (see the file comment): SPECDEC_MODEL, SPECDEC_THREADS (1),
/// SPECDEC_CONTEXT (256) and SPECDEC_KV_FORMAT (f16, f32 or q8, default the library's). A bad value throws
/// std::invalid_argument naming it; main reads them before any benchmark runs.
struct Settings {
  std::string model = specdec::bench::env_text("SPECDEC_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  std::size_t threads = specdec::bench::env_count("SPECDEC_THREADS", 1, 1, 1024);
  std::size_t context = specdec::bench::env_count("SPECDEC_CONTEXT", 256, 0, std::size_t{1} << 20);
  specdec::llama::KvFormat kv_format = read_kv_format();

  static specdec::llama::KvFormat read_kv_format() {
    const std::string name = specdec::bench::env_text("SPECDEC_KV_FORMAT", "");
    if (name.empty()) return specdec::llama::LoadOptions{}.kv_format;
    if (const auto f = specdec::llama::kv_format_from_string(name)) return *f;
    throw std::invalid_argument("SPECDEC_KV_FORMAT '" + name + "' is not f16, f32 or q8");
  }
};

const Settings& settings() {
  static const Settings s;
  return s;
}

std::size_t threads() { return settings().threads; }

std::shared_ptr<specdec::llama::ThreadPool> shared_pool() {
  static auto pool = std::make_shared<specdec::llama::ThreadPool>(threads());
  return pool;
}

#if defined(__x86_64__) || defined(_M_X64)
constexpr bool can_evict = true;
/// Writes back and drops every cache line of `bytes` bytes at `data` from every level of the cache hierarchy
/// (clflushopt where the build targets CPUs that have it, else clflush), so that the next read comes from memory.
void evict_from_caches(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
#if defined(__CLFLUSHOPT__)
  for (std::size_t offset = 0; offset < bytes; offset += 64) _mm_clflushopt(const_cast<char*>(p + offset));
#else
  for (std::size_t offset = 0; offset < bytes; offset += 64) _mm_clflush(p + offset);
#endif
  _mm_mfence();
}
#else
constexpr bool can_evict = false;  // no portable way to drop lines from the caches: no cold benchmarks
void evict_from_caches(const void*, std::size_t) {}
#endif

/// Bytes per second of summing a 256 MB buffer (allocated once) on the configured threads: the best of 3 passes
/// of the plain loop and 3 of the loop asking for each line 4 KB ahead into L2 (GCC and Clang), in turn. Each pass
/// reads from memory: the buffer is evicted from the caches before it (where evict_from_caches can). Read
/// repeatedly without that, part of it came from the L3 on a CPU with a large one: on the Intel Xeon of
/// 2026-12-05 (300 MiB of L3 reported) buffers of 32-160 MB read 34-52 GB/s on two threads that way and 25-32
/// GB/s evicted; 256 MB read 26-35 warm and 26-31 evicted. On the same CPU the loop below read 8-27% more with
/// the requests than without, which leaves the hardware prefetcher alone (best of 3 passes each, three runs: 27.9,
/// 28.6 and 30.0 GB/s against 23.8, 22.6 and 27.7).
double read_bandwidth() {
  const std::size_t count = (std::size_t{256} << 20) / sizeof(float);
  // Huge pages, as the packed weights use: with 4 KiB pages this measured 25-30% less than the weights stream.
  static std::vector<float, specdec::llama::detail::HugePageAllocator<float>> buffer(count, 1.0f);
  auto& pool = *shared_pool();
  std::vector<float> sums(pool.threads());
  double best = 0.0;
  constexpr std::size_t chunk = std::size_t{1} << 18;  // floats per task (1 MB)
  constexpr std::size_t ahead = 1024;                   // floats (4 KB)
  for (int pass = 0; pass < 6; ++pass) {
    const bool ask = pass % 2 == 1;
    evict_from_caches(buffer.data(), count * sizeof(float));
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(count / chunk, [&](std::size_t task, std::size_t slot) {
      float lanes[32] = {};
      const std::size_t end = (task + 1) * chunk;
      for (std::size_t i = task * chunk; i < end; i += 32) {
#if defined(__GNUC__)
        if (ask && i + ahead + 32 <= end) {  // the two lines 4 KB ahead, within the task
          __builtin_prefetch(&buffer[i + ahead], 0, 2);
          __builtin_prefetch(&buffer[i + ahead + 16], 0, 2);
        }
#endif
        for (std::size_t l = 0; l < 32; ++l) lanes[l] += buffer[i + l];
      }
      for (float v : lanes) sums[slot] += v;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    benchmark::DoNotOptimize(sums.data());
    best = std::max(best, double(count * sizeof(float)) / seconds);
  }
  return best;
}

/// Nanoseconds for a cache line to go from this thread to another and back (a median of 5 runs of 20,000 round
/// trips of an atomic flag between two threads that spin). On the 2-vCPU machine of 2026-12-02 it read
/// 100-185 ns most of the time and 418-472 ns while the read bandwidth of two threads was 65-75 GB/s instead of
/// 40-50: apparently the two vCPUs then sit on different core complexes (each with its own path to memory and
/// its own L3), which doubles what two streams read but slows every hand-over between the threads (see
/// docs/measurements.md; the correlation was not perfect).
double round_trip_ns() {
  constexpr int trips = 20'000;
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    alignas(64) std::atomic<int> flag{0};
    std::thread other([&] {
      for (int i = 0; i < trips; ++i) {
        while (flag.load(std::memory_order_acquire) != 2 * i + 1) {}
        flag.store(2 * i + 2, std::memory_order_release);
      }
    });
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < trips; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      while (flag.load(std::memory_order_acquire) != 2 * i + 2) {}
    }
    runs.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / trips);
    other.join();
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

/// Instructions per second with every thread of the pool running `kernel(loops)`, which issues 12 independent
/// instructions a loop from registers, 15 million loops (26 ms at two a cycle and 3.5 GHz), best of 3. The
/// threads start together (a StepBarrier step first): with a plain parallel_for, a worker that joined late left
/// its task to the caller, which ran both one after the other, and the peak read half (7.2 instead of 14.0 FMAs
/// per ns on 2 threads, 2026-12-03).
template <class Kernel>
double issue_rate(Kernel kernel) {
  auto& pool = *shared_pool();
  constexpr long loops = 15'000'000;
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    specdec::llama::StepBarrier together(pool.threads());
    const auto start = std::chrono::steady_clock::now();
    pool.run_together([&](std::size_t task, std::size_t) {
      together.wait(task);
      kernel(loops);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, double(loops) * 12 * double(pool.threads()) / seconds);
  }
  return best;
}

#if defined(__AVX512F__) && defined(__GNUC__)
// The loop of issue_rate for one zmm instruction `op src1, src2, acc`: zmm0..zmm11 are 12 independent
// accumulators, zmm12 and zmm13 the sources (all zeroed first).
#define SPECDEC_PEAK_LOOP(op)                                                                                     \
  __asm__ volatile(                                                                                              \
      "vpxord %%zmm0, %%zmm0, %%zmm0\n vmovdqa64 %%zmm0, %%zmm1\n vmovdqa64 %%zmm0, %%zmm2\n"                 \
      "vmovdqa64 %%zmm0, %%zmm3\n vmovdqa64 %%zmm0, %%zmm4\n vmovdqa64 %%zmm0, %%zmm5\n"                        \
      "vmovdqa64 %%zmm0, %%zmm6\n vmovdqa64 %%zmm0, %%zmm7\n vmovdqa64 %%zmm0, %%zmm8\n"                        \
      "vmovdqa64 %%zmm0, %%zmm9\n vmovdqa64 %%zmm0, %%zmm10\n vmovdqa64 %%zmm0, %%zmm11\n"                      \
      "vmovdqa64 %%zmm0, %%zmm12\n vmovdqa64 %%zmm0, %%zmm13\n"                                                  \
      "1:\n" op " %%zmm12, %%zmm13, %%zmm0\n" op " %%zmm12, %%zmm13, %%zmm1\n" op " %%zmm12, %%zmm13, %%zmm2\n" \
      op " %%zmm12, %%zmm13, %%zmm3\n" op " %%zmm12, %%zmm13, %%zmm4\n" op " %%zmm12, %%zmm13, %%zmm5\n"          \
      op " %%zmm12, %%zmm13, %%zmm6\n" op " %%zmm12, %%zmm13, %%zmm7\n" op " %%zmm12, %%zmm13, %%zmm8\n"          \
      op " %%zmm12, %%zmm13, %%zmm9\n" op " %%zmm12, %%zmm13, %%zmm10\n" op " %%zmm12, %%zmm13, %%zmm11\n"        \
      "dec %0\n jnz 1b\n"                                                                                        \
      : "+r"(n)                                                                                                  \
      :                                                                                                          \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",  \
        "xmm13", "cc")
#elif defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)
// The same loop on ymm registers, for the AVX2 kernels.
#define SPECDEC_PEAK_LOOP_YMM(op)                                                                                 \
  __asm__ volatile(                                                                                              \
      "vpxor %%ymm0, %%ymm0, %%ymm0\n vmovdqa %%ymm0, %%ymm1\n vmovdqa %%ymm0, %%ymm2\n"                         \
      "vmovdqa %%ymm0, %%ymm3\n vmovdqa %%ymm0, %%ymm4\n vmovdqa %%ymm0, %%ymm5\n"                                \
      "vmovdqa %%ymm0, %%ymm6\n vmovdqa %%ymm0, %%ymm7\n vmovdqa %%ymm0, %%ymm8\n"                                \
      "vmovdqa %%ymm0, %%ymm9\n vmovdqa %%ymm0, %%ymm10\n vmovdqa %%ymm0, %%ymm11\n"                              \
      "vmovdqa %%ymm0, %%ymm12\n vmovdqa %%ymm0, %%ymm13\n"                                                      \
      "1:\n" op " %%ymm12, %%ymm13, %%ymm0\n" op " %%ymm12, %%ymm13, %%ymm1\n" op " %%ymm12, %%ymm13, %%ymm2\n" \
      op " %%ymm12, %%ymm13, %%ymm3\n" op " %%ymm12, %%ymm13, %%ymm4\n" op " %%ymm12, %%ymm13, %%ymm5\n"          \
      op " %%ymm12, %%ymm13, %%ymm6\n" op " %%ymm12, %%ymm13, %%ymm7\n" op " %%ymm12, %%ymm13, %%ymm8\n"          \
      op " %%ymm12, %%ymm13, %%ymm9\n" op " %%ymm12, %%ymm13, %%ymm10\n" op " %%ymm12, %%ymm13, %%ymm11\n"        \
      "dec %0\n jnz 1b\n vzeroupper\n"                                                                           \
      : "+r"(n)                                                                                                  \
      :                                                                                                          \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",  \
        "xmm13", "cc")
#endif

/// Float lanes of the vector FMA that the float kernels use: 16 with AVX-512, 8 with AVX2.
#if defined(__AVX512F__)
constexpr double fma_lanes = 16;
#else
constexpr double fma_lanes = 8;
#endif

/// Vector float multiply-adds per second (issue_rate of vfmadd231ps on zmm with AVX-512, on ymm with AVX2): the
/// machine's compute peak for the float kernels. 0 without either.
double measure_fma_peak() {
#if defined(__AVX512F__) && defined(__GNUC__)
  return issue_rate([](long n) { SPECDEC_PEAK_LOOP("vfmadd231ps"); });
#elif defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)
  return issue_rate([](long n) { SPECDEC_PEAK_LOOP_YMM("vfmadd231ps"); });
#else
  return 0.0;
#endif
}

/// vpdpbusd (zmm: 64 byte products each) per second (issue_rate): the peak of the quantized_dot kernels'
/// integer dot products. 0 without AVX-512 VNNI.
double measure_vnni_peak() {
#if defined(__AVX512VNNI__) && defined(__GNUC__)
  return issue_rate([](long n) { SPECDEC_PEAK_LOOP("vpdpbusd"); });
#else
  return 0.0;
#endif
}

/// measure_fma_peak() and measure_vnni_peak(), each once per process.
double fma_peak() {
  static const double peak = measure_fma_peak();
  return peak;
}
double vnni_peak() {
  static const double peak = measure_vnni_peak();
  return peak;
}

LlamaModel& model(WeightFormat format) {
  static std::map<WeightFormat, std::unique_ptr<LlamaModel>> models;
  auto& m = models[format];
  if (!m) {
    specdec::llama::LoadOptions options;
    options.format = format;
    options.max_context = settings().context + max_positions;
    options.threads = threads();
    auto loaded = LlamaModel::load(settings().model, options);
    m = std::make_unique<LlamaModel>(loaded.weights(), options.max_context, shared_pool(), settings().kv_format);
  }
  return *m;
}

/// Every weight matrix a forward reads, evicted from the caches (evict_from_caches).
void evict_weights(const specdec::llama::LlamaWeights& weights) {
  const auto evict = [](const specdec::llama::PackedMatrix& w) { evict_from_caches(w.panel(0), w.stored_bytes()); };
  for (std::size_t l = 0; l < weights.config().layers; ++l)
    for (const auto* w : weights.layer(l).matrices()) evict(*w);
  evict(weights.output());
}

/// BM_LlamaForward (cold: BM_LlamaForwardCold, the weights evicted before each forward, which alone is timed).
void forward(benchmark::State& state, WeightFormat format, bool cold) {
  const std::size_t context = settings().context;
  LlamaModel& m = model(format);
  std::mt19937 rng(7);
  std::vector<specdec::Token> tokens(context + static_cast<std::size_t>(state.range(0)));
  for (auto& t : tokens) t = static_cast<specdec::Token>(rng() % m.vocab_size());
  m.truncate(0);
  m.append(std::span(tokens.data(), context));  // no logits: a [context, vocab] buffer would slow the next call
  const std::span<const specdec::Token> step(tokens.data() + context, tokens.size() - context);
  const double round_trip = threads() > 1 ? round_trip_ns() : 0.0;
  const double bandwidth_before = read_bandwidth();
  for (auto _ : state) {
    if (cold) evict_weights(*m.weights());
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(m.forward(step).data());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    m.truncate(context);
  }
  const double bandwidth = (bandwidth_before + read_bandwidth()) / 2;
  if (threads() > 1) state.counters["round_trip_ns"] = (round_trip + round_trip_ns()) / 2;
  const double bytes = double(m.weight_bytes_per_forward());
  // The KV cache's bytes that attention reads at least once: every position's key and value rows in every layer.
  const auto& config = m.config();
  const auto kv = m.kv_format();
  const double row_bytes = kv == specdec::llama::KvFormat::q8    ? double(config.head_dim) + 4.0  // and its scale
                           : kv == specdec::llama::KvFormat::f16 ? 2.0 * double(config.head_dim)
                                                                 : 4.0 * double(config.head_dim);
  const double kv_bytes = double(context + step.size()) * double(config.layers * config.kv_heads) * 2.0 * row_bytes;
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["weight_bytes"] = bytes;
  state.counters["kv_bytes"] = kv_bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bandwidth_GB/s"] = bandwidth / 1e9;
  state.counters["floor_fraction"] = benchmark::Counter(bytes / bandwidth, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memory_fraction"] =
      benchmark::Counter((bytes + kv_bytes) / bandwidth, benchmark::Counter::kIsIterationInvariantRate);
  const double bytes_per_weight = format == WeightFormat::f32 ? 4.0 : format == WeightFormat::bf16 ? 2.0 : 0.0;
  if (bytes_per_weight > 0 && fma_peak() > 0) {
    const double vector_fmas = bytes / bytes_per_weight * double(state.range(0)) / fma_lanes;
    state.counters["fma_fraction"] =
        benchmark::Counter(vector_fmas / fma_peak(), benchmark::Counter::kIsIterationInvariantRate);
  }
  state.counters["threads"] = double(threads());
}

/// The blocks' weight products of one forward of n positions in `format`, alone: layer l's weights for every l
/// (`streamed`) or layer 0's thirty times (`cached`); `cold`: streamed, with those weights evicted before each
/// pass, which alone is timed. See the file comment.
void block_products(benchmark::State& state, WeightFormat format, bool streamed, bool cold = false) {
  using specdec::llama::MatmulOutput;
  const auto& weights = *model(format).weights();
  const auto& c = weights.config();
  const std::size_t n = static_cast<std::size_t>(state.range(0)), e = c.embedding, ffn = c.ffn;
  const std::size_t qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(n * std::max({e, ffn, qw})), q(n * qw), k(n * kw), v(n * kw), o(n * e), gate(n * ffn), up(n * ffn);
  for (auto& value : x) value = uniform(rng);
  // The inputs quantised once per width, as the forward's norms, attention and SwiGLU hand them to the products.
  const int digits = specdec::llama::quantized_input_digits(weights.format());
  std::vector<std::byte> bytes_e, bytes_qw, bytes_ffn;
  const auto inputs = [&](std::vector<std::byte>& bytes, std::size_t width) {
    if (digits == 0) return specdec::llama::QuantizedInputs{};  // float formats: each thread interleaves x itself
    bytes.resize(n * (width / 32) * specdec::llama::detail::entry_bytes(digits));
    specdec::llama::detail::quantize_inputs(digits, x.data(), width, n, width, bytes.data());
    return specdec::llama::QuantizedInputs{bytes.data(), digits};
  };
  const auto x_e = inputs(bytes_e, e), x_qw = inputs(bytes_qw, qw), x_ffn = inputs(bytes_ffn, ffn);
  auto& pool = *shared_pool();
  double macs = 0.0, bytes = 0.0;
  for (std::size_t l = 0; l < c.layers; ++l) {
    const auto& w = weights.layer(streamed ? l : 0);
    for (const auto* m : w.matrices()) macs += double(m->rows()) * double(m->cols());
    bytes += double(w.bytes());
  }
  const double bandwidth_before = read_bandwidth();
  for (auto _ : state) {
    if (cold) evict_weights(weights);
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t l = 0; l < c.layers; ++l) {
      const auto& w = weights.layer(streamed ? l : 0);
      const MatmulOutput qkv[] = {{&w.q, q.data(), qw, false}, {&w.k, k.data(), kw, false}, {&w.v, v.data(), kw, false}};
      specdec::llama::matmul(qkv, x.data(), e, n, pool, false, x_e);
      specdec::llama::matmul(MatmulOutput{&w.o, o.data(), e, true}, x.data(), qw, n, pool, false, x_qw);
      const MatmulOutput gate_up[] = {{&w.gate, gate.data(), ffn, false}, {&w.up, up.data(), ffn, false}};
      specdec::llama::matmul(gate_up, x.data(), e, n, pool, false, x_e);
      specdec::llama::matmul(MatmulOutput{&w.down, o.data(), e, true}, x.data(), ffn, n, pool, false, x_ffn);
    }
    benchmark::DoNotOptimize(o.data());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double bandwidth = (bandwidth_before + read_bandwidth()) / 2;
  state.counters["weight_bytes"] = bytes;
  state.counters["bandwidth_GB/s"] = bandwidth / 1e9;
  if (streamed)
    state.counters["floor_fraction"] = benchmark::Counter(bytes / bandwidth, benchmark::Counter::kIsIterationInvariantRate);
  if (digits > 0 && vnni_peak() > 0)  // one vpdpbusd per 64 multiply-adds and input digit
    state.counters["vnni_fraction"] = benchmark::Counter(macs * double(n) * digits / 64 / vnni_peak(),
                                                         benchmark::Counter::kIsIterationInvariantRate);
  if ((format == WeightFormat::f32 || format == WeightFormat::bf16) && fma_peak() > 0)
    state.counters["fma_fraction"] = benchmark::Counter(macs * double(n) / fma_lanes / fma_peak(),
                                                        benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = double(threads());
}

/// Reports peak_fn() (instructions per second) as `counter` per ns, or skips with `missing` where it is 0.
void report_peak(benchmark::State& state, double (*peak_fn)(), const char* counter, const char* missing) {
  double peak = 0.0;
  for (auto _ : state) peak = peak_fn();
  if (peak == 0.0) state.SkipWithError(missing);
  state.counters[counter] = peak / 1e9;
  state.counters["threads"] = double(threads());
}

void BM_VnniPeak(benchmark::State& state) {
  report_peak(state, vnni_peak, "vpdpbusd_per_ns", "needs AVX-512 VNNI and GCC-style inline assembly");
}

void BM_MemoryBandwidth(benchmark::State& state) {
  double bandwidth = 0.0;
  for (auto _ : state) bandwidth = read_bandwidth();
  state.counters["GB/s"] = bandwidth / 1e9;
  state.counters["threads"] = double(threads());
}

void BM_FmaPeak(benchmark::State& state) {
  report_peak(state, fma_peak, "vector_FMA_per_ns", "needs AVX-512 or AVX2 and FMA, and GCC-style inline assembly");
  state.counters["lanes"] = fma_lanes;
}

// "min" beside mean/median/stddev when run with --benchmark_repetitions: the figure least disturbed by other
// processes on a shared machine.
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void positions(benchmark::internal::Benchmark* b) {
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) b->Arg(n);  // up to max_positions
  b->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", minimum);
}

/// The cold benchmarks' positions (one, and verify passes of 5 and 9), each forward or pass timed alone.
void cold_positions(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(5)->Arg(9)->Unit(benchmark::kMillisecond)->UseManualTime()->ComputeStatistics("min", minimum);
}

BENCHMARK(BM_MemoryBandwidth)->Iterations(1)->Repetitions(1);
BENCHMARK(BM_FmaPeak)->Iterations(1)->Repetitions(1);
BENCHMARK(BM_VnniPeak)->Iterations(1)->Repetitions(1);
// BM_BlockProducts_{streamed,cached}/<n> and BM_BlockProductsCold/<n> (quantized_dot), then the same with
// _<format> for the other formats; the cold ones where the weights can be evicted (x86).
const bool block_products_registered = [] {
  for (auto format : {WeightFormat::quantized_dot, WeightFormat::f32, WeightFormat::bf16, WeightFormat::bf16_dot,
                      WeightFormat::quantized}) {
    const std::string suffix =
        format == WeightFormat::quantized_dot ? "" : "_" + std::string(specdec::llama::to_string(format));
    for (bool streamed : {true, false}) {
      const std::string name = (streamed ? "BM_BlockProducts_streamed" : "BM_BlockProducts_cached") + suffix;
      benchmark::RegisterBenchmark(name.c_str(), [format, streamed](benchmark::State& state) {
        block_products(state, format, streamed);
      })->Apply(positions);
    }
    if (can_evict)
      benchmark::RegisterBenchmark(("BM_BlockProductsCold" + suffix).c_str(), [format](benchmark::State& state) {
        block_products(state, format, true, true);
      })->Apply(cold_positions);
  }
  return true;
}();
// BM_LlamaForward_<format>/<n>, then BM_LlamaForwardCold_<format>/<n> for n = 1, 5 and 9 where the weights can be
// evicted (x86).
const bool forwards_registered = [] {
  for (bool cold : {false, true}) {
    if (cold && !can_evict) continue;
    for (auto format : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::bf16_dot, WeightFormat::quantized,
                        WeightFormat::quantized_dot}) {
      const std::string name = std::string(cold ? "BM_LlamaForwardCold_" : "BM_LlamaForward_") +
                               std::string(specdec::llama::to_string(format));
      benchmark::RegisterBenchmark(name.c_str(), [format, cold](benchmark::State& state) {
        forward(state, format, cold);
      })->Apply(cold ? cold_positions : positions);
    }
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    settings();  // a bad setting or model path ends the run here, before any benchmark
    (void)specdec::gguf::File::open(settings().model);
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_llama_forward: %s\n", e.what());
    return 2;
  }
  benchmark::Shutdown();
  return 0;
}
