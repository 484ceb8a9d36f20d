// A separate project using the installed specdec package.
#include <iostream>
#include <specdec/specdec.hpp>

int main() {
  specdec::ToyModel target({.vocab = 64, .seed = 1}), draft({.vocab = 64, .seed = 1, .noise_seed = 2, .noise = 0.3f});
  const std::vector<specdec::Token> prompt{1, 2, 3};
  const specdec::GenerateOptions options{.max_new_tokens = 32};
  const auto fast = specdec::SpeculativeDecoder(draft, target).generate(prompt, options);
  const auto plain = specdec::generate_autoregressive(target, specdec::Greedy{}, prompt, options);
  std::cout << "identical: " << (fast.tokens == plain.tokens ? "yes" : "no") << "\n";
  return fast.tokens == plain.tokens ? 0 : 1;
}
