// A separate project using the installed specdec package: the core on toy models (run), and the reference
// model's API (compiled; run only when given a GGUF file). Built with a demanding user's warnings and -Werror (and
// -march=native where the compiler has it), so that such a user's build finds nothing in specdec's headers.
#include <iostream>
#include <specdec/llama/llama.hpp>
#include <specdec/specdec.hpp>

namespace {

// Greedy speculative decoding with an early-exit draft of the model at `path`: the same tokens as plain decoding.
bool real_model_agrees(const char* path) {
  using namespace specdec;
  const gguf::File file = gguf::File::open(path);
  const llama::Tokenizer tokenizer = llama::Tokenizer::from_gguf(file);
  llama::LlamaModel target = llama::LlamaModel::load(path, {.max_context = 128, .threads = 1});
  llama::EarlyExitDraft draft(target, 4);
  const std::vector<Token> prompt = tokenizer.encode("The capital of France is");
  const GenerateOptions options{.max_new_tokens = 8};
  const auto fast = SpeculativeDecoder(draft, target).generate(prompt, options);
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
  std::cout << "continuation: " << tokenizer.decode(plain.tokens) << "\n";
  return fast.tokens == plain.tokens;
}

}  // namespace

int main(int argc, char** argv) {
  specdec::ToyModel target({.vocab = 64, .seed = 1}), draft({.vocab = 64, .seed = 1, .noise_seed = 2, .noise = 0.3f});
  const std::vector<specdec::Token> prompt{1, 2, 3};
  const specdec::GenerateOptions options{.max_new_tokens = 32};
  const auto fast = specdec::SpeculativeDecoder(draft, target).generate(prompt, options);
  const auto plain = specdec::generate_autoregressive(target, specdec::Greedy{}, prompt, options);
  bool identical = fast.tokens == plain.tokens;
  if (argc > 1) identical = identical && real_model_agrees(argv[1]);
  std::cout << "identical: " << (identical ? "yes" : "no") << "\n";
  return identical ? 0 : 1;
}
