// The smallest complete specdec program: a model type, a decoder, generate(), printed statistics.
// No downloads: the "model" is a tiny pseudo-random language model defined right here.
#include <cmath>
#include <iostream>
#include <specdec/specdec.hpp>

// 1. A model: anything with vocab_size(), context_size(), forward() and truncate() satisfies specdec::Model.
//    This one prefers the token (last + 1) mod vocab.
class CountingModel {
 public:
  CountingModel(std::size_t vocab, bool skips) : vocab_(vocab), skips_(skips) {}
  std::size_t vocab_size() const { return vocab_; }
  std::size_t context_size() const { return context_.size(); }
  const specdec::Logits& forward(std::span<const specdec::Token> tokens) {
    logits_.setZero(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(vocab_));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      context_.push_back(tokens[i]);
      const auto next = static_cast<Eigen::Index>((tokens[i] + 1) % static_cast<specdec::Token>(vocab_));
      const auto skip = static_cast<Eigen::Index>((tokens[i] + 2) % static_cast<specdec::Token>(vocab_));
      logits_(static_cast<Eigen::Index>(i), next) = 4.0f;
      // Every 7th position the model prefers to skip a number: a draft without this rule gets it wrong.
      if (skips_ && context_.size() % 7 == 0) logits_(static_cast<Eigen::Index>(i), skip) = 5.0f;
    }
    return logits_;
  }
  void truncate(std::size_t n) { context_.resize(std::min(n, context_.size())); }

 private:
  std::size_t vocab_;
  bool skips_;
  std::vector<specdec::Token> context_;
  specdec::Logits logits_;  // [positions, vocab]
};
static_assert(specdec::Model<CountingModel>);

int main() {
  CountingModel target(100, /*skips=*/true);
  CountingModel draft(100, /*skips=*/false);  // a cheap approximation: right 6 times out of 7

  // 2. A decoder: greedy acceptance, 4 draft tokens per round.
  specdec::SpeculativeDecoder decoder(draft, target);
  const std::vector<specdec::Token> prompt{10, 11, 12};

  // 3. Generate, streaming tokens as they become final.
  specdec::GenerateOptions options{.max_new_tokens = 40, .draft_length = 4};
  options.on_token = [](specdec::Token t) { std::cout << t << ' '; return true; };
  const specdec::Generation result = decoder.generate(prompt, options);
  std::cout << "\n";

  // 4. Statistics, and the guarantee: the same tokens as plain greedy decoding with the target alone.
  const auto& s = result.stats;
  const auto plain = specdec::generate_autoregressive(target, specdec::Greedy{}, prompt, {.max_new_tokens = 40});
  std::cout << "tokens: " << result.tokens.size() << ", rounds: " << s.rounds << ", drafted: " << s.drafted_tokens
            << ", accepted: " << s.accepted_tokens << " (" << std::round(100 * s.acceptance_rate()) << "%)\n"
            << "tokens per target call: " << s.tokens_per_target_call() << " (plain decoding: 1)\n"
            << "identical to plain greedy decoding: " << (result.tokens == plain.tokens ? "yes" : "no") << "\n";
  return result.tokens == plain.tokens ? 0 : 1;
}
