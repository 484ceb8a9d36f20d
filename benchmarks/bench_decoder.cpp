// The decoder's own cost, and speculative vs plain decoding on toy models whose cost is a memory read.
//   BM_DecoderOverhead_<policy>/<vocab>: per-token cost of the decoder with models that only write their logits
//   rows (a background row and two entries; 200 KB a row at 50k).
//   BM_ToyPlain / BM_ToySpeculative/<k>: a 128 MiB target and a 4 MiB draft whose forward cost is one pass over
//   their "weights", whatever the number of positions — like a memory-bound transformer. Both time generation
//   alone, prompt processing excluded (tokens/s as DecodeStats::tokens_per_second).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <specdec/specdec.hpp>

namespace {

using namespace specdec;

/// Next token = a hash of the last token, on top of a fixed Zipf-like background (logit -1.1 log rank, as in
/// natural-language distributions). Draft and target built alike agree always,
/// and `disagree_every` > 0 makes the draft wrong at every n-th context length.
class CheapModel {
 public:
  CheapModel(std::size_t vocab, std::size_t disagree_every = 0, std::size_t weight_bytes = 0)
      : vocab_(vocab), disagree_every_(disagree_every), weights_(weight_bytes / sizeof(std::uint32_t), 1), background_(vocab) {
    for (std::size_t i = 0; i < vocab; ++i)
      background_[static_cast<Eigen::Index>(i)] = -1.1f * std::log(1.0f + static_cast<float>((i * 7919) % vocab));
  }
  std::size_t vocab_size() const { return vocab_; }
  std::size_t context_size() const { return context_.size(); }
  void truncate(std::size_t n) { context_.resize(std::min(n, context_.size())); }
  const Logits& forward(std::span<const Token> tokens) {
    if (!weights_.empty()) benchmark::DoNotOptimize(read_weights());
    logits_.resize(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(vocab_));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      context_.push_back(tokens[i]);
      logits_.row(static_cast<Eigen::Index>(i)) = background_.transpose();
      std::size_t next = (static_cast<std::size_t>(tokens[i]) * 2654435761u + 12345u) % vocab_;
      if (disagree_every_ && context_.size() % disagree_every_ == 0) next = (next + 1) % vocab_;
      logits_(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(next)) = 3.0f;
      logits_(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>((next + 7) % vocab_)) = 2.0f;
    }
    return logits_;
  }

 private:
  /// One pass over the weights, bound by memory: 16 integer sums in turn, which the compiler keeps in vector
  /// registers. (A float std::accumulate is one chain of additions, bound by their latency: 128 MiB took 35 ms
  /// so, 9-11 ms so on the Zen 3 of 2026-12-06.)
  std::uint32_t read_weights() const {
    std::uint32_t sums[16] = {};
    const std::size_t whole = weights_.size() / 16 * 16;
    for (std::size_t i = 0; i < whole; i += 16)
      for (std::size_t j = 0; j < 16; ++j) sums[j] += weights_[i + j];
    std::uint32_t total = std::accumulate(weights_.begin() + static_cast<std::ptrdiff_t>(whole), weights_.end(), 0u);
    for (std::uint32_t s : sums) total += s;
    return total;
  }

  std::size_t vocab_;
  std::size_t disagree_every_;
  std::vector<std::uint32_t> weights_;
  Eigen::VectorXf background_;  // [vocab]
  std::vector<Token> context_;
  Logits logits_;
};

template <class Policy>
void decoder_overhead(benchmark::State& state, Policy policy) {
  const auto vocab = static_cast<std::size_t>(state.range(0));
  CheapModel target(vocab), draft(vocab, 5);
  SpeculativeDecoder decoder(draft, target, policy);
  const std::vector<Token> prompt{1, 2, 3};
  const GenerateOptions options{.max_new_tokens = 64, .draft_length = 4};
  std::size_t tokens = 0;
  double acceptance = 0;
  for (auto _ : state) {
    const auto result = decoder.generate(prompt, options);
    tokens += result.tokens.size();
    acceptance = result.stats.acceptance_rate();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(tokens));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["us/token"] = benchmark::Counter(static_cast<double>(tokens) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["acceptance"] = acceptance;
}

void BM_DecoderOverhead_Greedy(benchmark::State& state) { decoder_overhead(state, Greedy{}); }
void BM_DecoderOverhead_RejectionSampling(benchmark::State& state) { decoder_overhead(state, RejectionSampling{{.temperature = 0.8f, .top_p = 0.95f}}); }
void BM_DecoderOverhead_CoupledSampling(benchmark::State& state) { decoder_overhead(state, CoupledSampling{{.temperature = 0.8f, .top_p = 0.95f}}); }
BENCHMARK(BM_DecoderOverhead_Greedy)->Arg(32000)->Arg(50000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecoderOverhead_RejectionSampling)->Arg(32000)->Arg(50000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecoderOverhead_CoupledSampling)->Arg(32000)->Arg(50000)->Unit(benchmark::kMicrosecond);

constexpr std::size_t kToyVocab = 32000;
constexpr std::size_t kTargetBytes = std::size_t{128} << 20, kDraftBytes = std::size_t{4} << 20;

/// Counters of a toy run; the iteration's time is its generation's, prompt processing excluded: plain decoding
/// processes the prompt again each iteration, the speculative decoder finds it held from the last.
void report(benchmark::State& state, std::size_t tokens, const DecodeStats& stats) {
  state.SetItemsProcessed(static_cast<std::int64_t>(tokens));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["acceptance"] = stats.acceptance_rate();
  state.counters["tokens/round"] = stats.tokens_per_target_call();
}

void BM_ToyPlain(benchmark::State& state) {
  CheapModel target(kToyVocab, 0, kTargetBytes);
  const std::vector<Token> prompt{1, 2, 3};
  std::size_t tokens = 0;
  DecodeStats stats;
  for (auto _ : state) {
    const auto result = generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 32});
    state.SetIterationTime(result.stats.total_seconds - result.stats.prefill_seconds);
    tokens += result.tokens.size();
    stats = result.stats;
  }
  report(state, tokens, stats);
}
BENCHMARK(BM_ToyPlain)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_ToySpeculative(benchmark::State& state) {
  CheapModel target(kToyVocab, 0, kTargetBytes), draft(kToyVocab, 6, kDraftBytes);
  SpeculativeDecoder decoder(draft, target);
  const std::vector<Token> prompt{1, 2, 3};
  const GenerateOptions options{.max_new_tokens = 32, .draft_length = static_cast<std::size_t>(state.range(0))};
  std::size_t tokens = 0;
  DecodeStats stats;
  for (auto _ : state) {
    const auto result = decoder.generate(prompt, options);
    state.SetIterationTime(result.stats.total_seconds - result.stats.prefill_seconds);
    tokens += result.tokens.size();
    stats = result.stats;
  }
  report(state, tokens, stats);
}
BENCHMARK(BM_ToySpeculative)->DenseRange(1, 8)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
