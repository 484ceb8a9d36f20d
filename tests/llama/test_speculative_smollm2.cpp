// Speculative decoding on the real SmolLM2 weights: greedy output equals plain greedy output token for token
// with every shipped draft, draft_length 1..12, threads 1 and 2; coupled sampling equals plain coupled sampling.
#include <catch2/catch.hpp>
#include <vector>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <specdec/llama/llama.hpp>
#include <specdec/specdec.hpp>

using namespace specdec;
using llama::LlamaModel;

namespace {

struct Real {
  gguf::File file = open();
  llama::Tokenizer tokenizer = llama::Tokenizer::from_gguf(file);
  std::shared_ptr<const llama::LlamaWeights> weights = llama::LlamaWeights::load(file, llama::WeightFormat::quantized);

  static gguf::File open() {
    if (!std::filesystem::exists(SPECDEC_MODEL_PATH))
      FAIL("model file missing: " SPECDEC_MODEL_PATH " (run scripts/fetch-model)");
    return gguf::File::open(SPECDEC_MODEL_PATH);
  }
  static Real& get() {
    static Real real;
    return real;
  }
  LlamaModel model(std::size_t threads) const {
    return LlamaModel(weights, 512, std::make_shared<llama::ThreadPool>(threads));
  }
  std::vector<Token> prompt(const std::string& text, bool chat) const {
    return tokenizer.encode(chat ? llama::Tokenizer::chat_prompt(text) : text);
  }
};

const std::vector<std::pair<std::string, bool>> kPrompts{
    {"Copy this list and add one more fruit: apple, banana, cherry, apple, banana, cherry.", true},
    {"def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", false},
};

}  // namespace

TEST_CASE("greedy speculative output equals plain greedy output on SmolLM2 for every draft, k 1..12, threads 1 and 2",
          "[llama][smollm2][speculative]") {
  Real& real = Real::get();
  for (std::size_t threads : {1, 2}) {
    LlamaModel target = real.model(threads);
    for (const auto& [text, chat] : kPrompts) {
      const auto prompt = real.prompt(text, chat);
      GenerateOptions options{.max_new_tokens = 24, .stop_tokens = real.tokenizer.stop_tokens()};
      const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
      REQUIRE(plain.tokens.size() > 4);
      PromptLookupDraft lookup(target.vocab_size());
      llama::EarlyExitDraft shallow(target, 4), deep(target, 22);
      SpeculativeDecoder with_lookup(lookup, target);
      SpeculativeDecoder with_shallow(shallow, target);
      SpeculativeDecoder with_deep(deep, target);
      std::size_t accepted = 0;
#if defined(__SANITIZE_ADDRESS__)
      // ASan runs ~15x slower (18 minutes for k = 1, 2, 5, 12 on a 2-core AVX2 machine): a thinner sweep there
      const std::vector<std::size_t> ks = {2, 12};
#else
      const std::vector<std::size_t> ks = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
#endif
      for (std::size_t k : ks) {
        options.draft_length = k;
        CAPTURE(threads, text, k);
        const auto a = with_lookup.generate(prompt, options);
        const auto b = with_shallow.generate(prompt, options);
        const auto c = with_deep.generate(prompt, options);
        CHECK(a.tokens == plain.tokens);
        CHECK(b.tokens == plain.tokens);
        CHECK(c.tokens == plain.tokens);
        accepted += a.stats.accepted_tokens + c.stats.accepted_tokens;
      }
      CHECK(accepted > 0);  // the comparison covered accepted blocks, not only rejections
    }
  }
}

namespace {
/// The real file with the f32 norm weights of its last four ffn blocks scaled at random: a second llama model,
/// with the same vocabulary, that agrees with the target often but not always.
gguf::File perturbed_copy(const gguf::File& file) {
  std::vector<std::byte> bytes(file.bytes().begin(), file.bytes().end());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> scale(0.0f, 2.0f);
  for (int layer = 26; layer < 30; ++layer) {
    const auto& t = file.tensor("blk." + std::to_string(layer) + ".ffn_norm.weight");
    REQUIRE(t.type == gguf::TensorType::F32);
    std::byte* values = bytes.data() + (t.data.data() - file.bytes().data());
    for (std::size_t i = 0; i < t.elements(); ++i) {
      float v;
      std::memcpy(&v, values + 4 * i, 4);
      v *= scale(rng);
      std::memcpy(values + 4 * i, &v, 4);
    }
  }
  return gguf::File::from_bytes(std::move(bytes), "perturbed.gguf");
}
}  // namespace

TEST_CASE("a second llama model as the draft keeps greedy output exact, and its cache right after its rollbacks",
          "[llama][smollm2][speculative]") {
  Real& real = Real::get();
  LlamaModel target = real.model(1);
  const auto prompt = real.prompt(kPrompts[0].first, true);
  const GenerateOptions options{.max_new_tokens = 30, .draft_length = 5, .stop_tokens = real.tokenizer.stop_tokens()};
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
  {
    LlamaModel twin(real.weights, 512, target.pool());  // the same network loaded twice: a perfect draft
    const auto fast = SpeculativeDecoder(twin, target).generate(prompt, options);
    CHECK(fast.tokens == plain.tokens);
    CHECK(fast.stats.acceptance_rate() == 1.0);
    CHECK(fast.stats.rounds * 6 >= fast.tokens.size());
    CHECK(fast.stats.rounds <= (fast.tokens.size() + 5) / 6 + 1);
  }
  // Another network: some proposals are rejected, and the draft's cache is rolled back past them.
  const gguf::File other_file = perturbed_copy(real.file);
  llama::check_same_vocabulary(llama::Tokenizer::from_gguf(other_file), real.tokenizer);
  const auto other_weights = llama::LlamaWeights::load(other_file, llama::WeightFormat::quantized);
  LlamaModel other(other_weights, 512, target.pool());
  SpeculativeDecoder decoder(other, target);
  const auto fast = decoder.generate(prompt, options);
  CHECK(fast.tokens == plain.tokens);
  CHECK(fast.stats.accepted_tokens > 0);
  CHECK(fast.stats.accepted_tokens < fast.stats.drafted_tokens);
  // A call that drafts one token after the whole output brings the draft to hold exactly that (its one proposal
  // is never fed to it); then, taking back the last token, its next logits are bit for bit those of a fresh
  // model given the same tokens at once.
  std::vector<Token> sequence(prompt);
  sequence.insert(sequence.end(), fast.tokens.begin(), fast.tokens.end());
  decoder.generate(sequence, {.max_new_tokens = 2, .draft_length = 1});
  REQUIRE(other.context_size() == sequence.size());
  other.truncate(sequence.size() - 1);
  const Logits next = other.forward(std::span(sequence).last(1));
  LlamaModel fresh(other_weights, 512, target.pool());
  const Logits& expected = fresh.forward(sequence);
  REQUIRE(next.rows() == 1);
  CHECK(std::memcmp(next.data(), expected.row(expected.rows() - 1).data(), sizeof(float) * next.size()) == 0);
}

TEST_CASE("coupled sampling on SmolLM2 gives the plain coupled tokens for every draft and k, and adaptive k",
          "[llama][smollm2][coupled]") {
  Real& real = Real::get();
  LlamaModel target = real.model(2);
  const auto prompt = real.prompt("Write one sentence about the sea.", true);
  PromptLookupDraft lookup(target.vocab_size());
  llama::EarlyExitDraft early(target, 12);
  for (std::uint64_t seed : {1u, 2u}) {
    const CoupledSampling policy{{.temperature = 0.8f, .top_p = 0.95f}};
    GenerateOptions options{.max_new_tokens = 24, .stop_tokens = real.tokenizer.stop_tokens(), .seed = seed};
    const auto plain = generate_autoregressive(target, policy, prompt, options);
    for (std::size_t k : {1, 3, 6, 9}) {
      options.draft_length = k;
      CAPTURE(seed, k);
      CHECK(SpeculativeDecoder(lookup, target, policy).generate(prompt, options).tokens == plain.tokens);
      CHECK(SpeculativeDecoder(early, target, policy).generate(prompt, options).tokens == plain.tokens);
    }
    options.draft_length = 8;
    SpeculativeDecoder adaptive(early, target, policy, AdaptiveDraftLength{});
    CHECK(adaptive.generate(prompt, options).tokens == plain.tokens);
    CHECK(adaptive.generate(prompt, options).tokens == plain.tokens);
  }
}

TEST_CASE("a second model with another vocabulary is refused with the first difference named", "[llama][errors]") {
  llama::Tokenizer::Vocabulary a{.tokens = {"a", "b", "c"}}, b{.tokens = {"a", "x", "c"}}, c{.tokens = {"a", "b"}};
  llama::Tokenizer::Vocabulary d{.tokens = {"a", "x"}};
  CHECK_THROWS_WITH(llama::check_same_vocabulary(llama::Tokenizer(b), llama::Tokenizer(a)),
                    "draft token 1 is 'x', target token 1 is 'b'");
  CHECK_THROWS_WITH(llama::check_same_vocabulary(llama::Tokenizer(c), llama::Tokenizer(a)),
                    "draft vocabulary has 2 tokens, target has 3: the first extra is target token 2, 'c'");
  CHECK_THROWS_WITH(llama::check_same_vocabulary(llama::Tokenizer(a), llama::Tokenizer(c)),
                    "draft vocabulary has 3 tokens, target has 2: the first extra is draft token 2, 'c'");
  CHECK_THROWS_WITH(llama::check_same_vocabulary(llama::Tokenizer(d), llama::Tokenizer(a)),
                    "draft token 1 is 'x', target token 1 is 'b'");  // a token that differs comes first
}

TEST_CASE("append (no logits) leaves the same cache as forward: the next logits are bit-identical", "[llama][smollm2]") {
  Real& real = Real::get();
  LlamaModel a = real.model(1), b = real.model(2);
  llama::EarlyExitDraft draft_a(a, 7), draft_b(b, 7);
  const auto prompt = real.prompt("The quick brown fox jumps over the lazy dog.", false);
  const std::span<const Token> head(prompt.data(), prompt.size() - 1), last(&prompt.back(), 1);
  const Logits full = a.forward(prompt).bottomRows(1);
  b.append(head);
  CHECK(b.context_size() == prompt.size() - 1);
  const Logits& next = b.forward(last);
  REQUIRE(next.rows() == 1);
  CHECK(std::memcmp(full.data(), next.data(), sizeof(float) * full.size()) == 0);
  const Logits draft_full = draft_a.forward(prompt).bottomRows(1);
  draft_b.append(head);
  CHECK(std::memcmp(draft_full.data(), draft_b.forward(last).data(), sizeof(float) * draft_full.size()) == 0);
}
