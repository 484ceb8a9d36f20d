// Forward-pass cost of the reference llama (SmolLM2-135M) per weight format and positions per call, against
// the memory-bandwidth floor (weight bytes streamed per forward / read bandwidth measured here).
//
//   SPECDEC_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf SPECDEC_THREADS=2 ./bench_llama_forward
//
// BM_LlamaForward_<format>/<n>: with 256 positions in the context (SPECDEC_CONTEXT overrides), forward n more
// and truncate back.
// Counters: weight_bytes (streamed per forward), GB/s (weight bytes / time), floor_fraction (bandwidth floor
// time / measured time; 1 = memory-bound at full bandwidth), all per wall-clock time. BM_MemoryBandwidth: read
// bandwidth of a 512 MB sum. On a shared machine run with --benchmark_repetitions=5 and read the _min rows.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "specdec/llama/llama_model.hpp"

namespace {

using specdec::llama::LlamaModel;
using specdec::llama::WeightFormat;

std::string model_path() {
  const char* env = std::getenv("SPECDEC_MODEL");
  return env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::size_t threads() {
  const char* env = std::getenv("SPECDEC_THREADS");
  return env ? std::max(1, std::atoi(env)) : 1;
}

std::shared_ptr<specdec::llama::ThreadPool> shared_pool() {
  static auto pool = std::make_shared<specdec::llama::ThreadPool>(threads());
  return pool;
}

/// Bytes per second of summing a 512 MB buffer, best of 5, on the configured threads.
double read_bandwidth() {
  static const double bandwidth = [] {
    const std::size_t count = (std::size_t{512} << 20) / sizeof(float);
    // Huge pages, as the packed weights use: with 4 KiB pages this measured 25-30% less than the weights stream.
    std::vector<float, specdec::llama::detail::HugePageAllocator<float>> buffer(count, 1.0f);
    auto& pool = *shared_pool();
    std::vector<float> sums(pool.threads());
    double best = 0.0;
    constexpr std::size_t chunk = std::size_t{1} << 18;  // floats per task (1 MB)
    for (int rep = 0; rep < 5; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      pool.parallel_for(count / chunk, [&](std::size_t task, std::size_t slot) {
        float lanes[32] = {};
        for (std::size_t i = task * chunk; i < (task + 1) * chunk; i += 32)
          for (std::size_t l = 0; l < 32; ++l) lanes[l] += buffer[i + l];
        for (float v : lanes) sums[slot] += v;
      });
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      benchmark::DoNotOptimize(sums.data());
      best = std::max(best, double(count * sizeof(float)) / seconds);
    }
    return best;
  }();
  return bandwidth;
}

LlamaModel& model(WeightFormat format) {
  static std::map<WeightFormat, std::unique_ptr<LlamaModel>> models;
  auto& m = models[format];
  if (!m) {
    specdec::llama::LoadOptions options;
    options.format = format;
    options.max_context = 512;
    options.threads = threads();
    auto loaded = LlamaModel::load(model_path(), options);
    m = std::make_unique<LlamaModel>(loaded.weights(), options.max_context, shared_pool());
  }
  return *m;
}

void forward(benchmark::State& state, WeightFormat format) {
  const std::size_t context = std::getenv("SPECDEC_CONTEXT") ? std::size_t(std::atoi(std::getenv("SPECDEC_CONTEXT"))) : 256;
  LlamaModel& m = model(format);
  std::mt19937 rng(7);
  std::vector<specdec::Token> tokens(context + static_cast<std::size_t>(state.range(0)));
  for (auto& t : tokens) t = static_cast<specdec::Token>(rng() % m.vocab_size());
  m.truncate(0);
  m.forward(std::span(tokens.data(), context));
  const std::span<const specdec::Token> step(tokens.data() + context, tokens.size() - context);
  for (auto _ : state) {
    benchmark::DoNotOptimize(m.forward(step).data());
    m.truncate(context);
  }
  const double bytes = double(m.weight_bytes_per_forward());
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["weight_bytes"] = bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor_fraction"] =
      benchmark::Counter(bytes / read_bandwidth(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = double(threads());
}

void BM_LlamaForward_f32(benchmark::State& state) { forward(state, WeightFormat::f32); }
void BM_LlamaForward_bf16(benchmark::State& state) { forward(state, WeightFormat::bf16); }
void BM_LlamaForward_bf16_dot(benchmark::State& state) { forward(state, WeightFormat::bf16_dot); }
void BM_LlamaForward_quantized(benchmark::State& state) { forward(state, WeightFormat::quantized); }
void BM_LlamaForward_quantized_dot(benchmark::State& state) { forward(state, WeightFormat::quantized_dot); }

void BM_MemoryBandwidth(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(read_bandwidth());
  state.counters["GB/s"] = read_bandwidth() / 1e9;
  state.counters["threads"] = double(threads());
}

// "min" beside mean/median/stddev when run with --benchmark_repetitions: the figure least disturbed by other
// processes on a shared machine.
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void positions(benchmark::internal::Benchmark* b) {
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) b->Arg(n);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", minimum);
}

BENCHMARK(BM_MemoryBandwidth)->Iterations(1)->Repetitions(1);
BENCHMARK(BM_LlamaForward_f32)->Apply(positions);
BENCHMARK(BM_LlamaForward_bf16)->Apply(positions);
BENCHMARK(BM_LlamaForward_bf16_dot)->Apply(positions);
BENCHMARK(BM_LlamaForward_quantized)->Apply(positions);
BENCHMARK(BM_LlamaForward_quantized_dot)->Apply(positions);

}  // namespace
