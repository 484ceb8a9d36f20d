// specdec/toy_models.hpp — small context-dependent language models for tests, examples and benchmarks.
// Entry point: specdec::ToyModel, a specdec::Model whose next-token logits are a pseudo-random function
// of the last few tokens. A second ToyModel built from the same seed plus some noise is a draft that agrees
// with it often: noise 0 gives a perfect draft, another seed an unrelated (bad) one.
// Read next: decoder.hpp, examples/quickstart.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/model.hpp"
#include "specdec/random.hpp"

namespace specdec {

/// Settings of a ToyModel.
struct ToyModelConfig {
  std::size_t vocab = 16;        // vocabulary size
  std::size_t window = 2;        // the logits depend on the last `window` tokens
  std::uint64_t seed = 1;        // picks the model
  float scale = 3.0f;            // spread of the logits: larger means more peaked distributions
  std::uint64_t noise_seed = 0;  // a second model mixed in, to make an imperfect draft of the seed model
  float noise = 0.0f;            // weight of that second model (0 = exactly the seed model)
};

/// logits(context) = scale * (z(seed, last window tokens) + noise * z(noise_seed, last window tokens)),
/// z a vector of standard normal deviates from a counter-based generator. Deterministic and batch-invariant.
class ToyModel {
 public:
  explicit ToyModel(ToyModelConfig config) : config_(config) {
    if (config.vocab == 0 || config.window == 0)
      detail::fail("toy model needs vocab and window > 0, got ", config.vocab, " and ", config.window);
    if (config.vocab >= max_vocab_size)
      detail::fail("toy model vocabulary of ", config.vocab, " tokens, at most ", max_vocab_size - 1, " supported");
  }

  std::size_t vocab_size() const { return config_.vocab; }
  std::size_t context_size() const { return context_.size(); }
  const ToyModelConfig& config() const { return config_; }
  std::size_t forward_calls() const { return forward_calls_; }

  /// Changes with every forward and truncate (see specdec::HasRevision).
  std::uint64_t revision() const { return revision_; }

  const Logits& forward(std::span<const Token> tokens) {
    ++forward_calls_;
    revision_ = next_revision();
    logits_.resize(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(config_.vocab));
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      push(tokens[j]);
      auto row = logits_.row(static_cast<Eigen::Index>(j));
      const std::uint64_t key = context_key();
      for (std::size_t i = 0; i < config_.vocab; ++i) {
        float z = normal(config_.seed, key, i);
        if (config_.noise != 0.0f) z += config_.noise * normal(config_.noise_seed, key, i);
        row(static_cast<Eigen::Index>(i)) = config_.scale * z;
      }
    }
    return logits_;
  }

  void truncate(std::size_t n) {
    revision_ = next_revision();
    context_.resize(std::min(n, context_.size()));
  }

 private:
  void push(Token t) {
    if (t < 0 || static_cast<std::size_t>(t) >= config_.vocab)
      detail::fail("toy model got token ", t, ", outside the vocabulary of ", config_.vocab, " tokens");
    context_.push_back(t);
  }
  /// A hash of the last `window` tokens (fewer at the start of the context).
  std::uint64_t context_key() const {
    std::uint64_t key = 0x9E3779B97F4A7C15ull;
    const std::size_t first = context_.size() > config_.window ? context_.size() - config_.window : 0;
    for (std::size_t i = first; i < context_.size(); ++i)
      key = (key ^ static_cast<std::uint64_t>(context_[i] + 1)) * std::uint64_t{0x100000001B3} + (key >> 29);
    return key ^ (context_.size() - first);
  }
  /// A standard normal deviate by Box-Muller from two counter-based uniforms.
  static float normal(std::uint64_t seed, std::uint64_t key, std::size_t i) {
    const auto block = CounterRng(seed).block(key, RandomStream::target, static_cast<std::uint32_t>(i));
    const double u1 = CounterRng::to_unit(block[0], block[1]), u2 = CounterRng::to_unit(block[2], block[3]);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

  ToyModelConfig config_;
  std::vector<Token> context_;  // [tokens held]
  Logits logits_;               // [positions of the last call, vocab]
  std::size_t forward_calls_ = 0;
  std::uint64_t revision_ = 0;  // see revision()
};

static_assert(Model<ToyModel>);
static_assert(HasRevision<ToyModel>);

}  // namespace specdec
