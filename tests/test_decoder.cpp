// Greedy exactness, stop rules, streaming, reuse and argument errors of SpeculativeDecoder.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <optional>

#include <cmath>
#include <limits>
#include <specdec/specdec.hpp>

#include "support/broken_models.hpp"

using namespace specdec;

namespace {

constexpr std::size_t kVocab = 32;

ToyModelConfig target_config() { return {.vocab = kVocab, .window = 3, .seed = 11, .scale = 2.0f}; }
ToyModelConfig good_draft_config() { return {.vocab = kVocab, .window = 3, .seed = 11, .scale = 2.0f, .noise_seed = 5, .noise = 0.25f}; }
ToyModelConfig bad_draft_config() { return {.vocab = kVocab, .window = 2, .seed = 99, .scale = 2.0f}; }

std::vector<std::vector<Token>> prompts(std::size_t count) {
  std::vector<std::vector<Token>> out;
  const CounterRng rng(2024);
  for (std::size_t p = 0; p < count; ++p) {
    std::vector<Token> prompt(1 + p % 7);
    for (std::size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<Token>(rng.block(p, RandomStream::target, static_cast<std::uint32_t>(i))[0] % kVocab);
    out.push_back(prompt);
  }
  return out;
}

/// A toy model whose context holds at most `cap` tokens (HasMaxContext), like LlamaModel's max_context; one
/// that does not `enforce` it only declares it.
struct CappedModel {
  ToyModel inner;
  std::size_t cap;
  bool enforce = true;
  std::size_t vocab_size() const { return inner.vocab_size(); }
  std::size_t context_size() const { return inner.context_size(); }
  std::size_t max_context() const { return cap; }
  std::uint64_t revision() const { return inner.revision(); }
  void truncate(std::size_t n) { inner.truncate(n); }
  const Logits& forward(std::span<const Token> tokens) {
    if (enforce && tokens.size() > cap - inner.context_size())
      detail::fail("context overflow: holds ", inner.context_size(), " of ", cap, ", cannot append ", tokens.size());
    return inner.forward(tokens);
  }
};
static_assert(HasMaxContext<CappedModel>);

/// The tokens of a generation, or nullopt when it threw specdec::Error.
template <class F>
std::optional<std::vector<Token>> tokens_or_error(F&& generate) {
  try {
    return generate().tokens;
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

TEST_CASE("greedy speculative output equals plain greedy output for every draft and draft length", "[decoder]") {
  ToyModel target(target_config());
  ToyModel perfect(target_config()), good(good_draft_config()), bad(bad_draft_config());
  PromptLookupDraft lookup(kVocab);
  for (const auto& prompt : prompts(12)) {
    GenerateOptions options{.max_new_tokens = 40};
    const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
    REQUIRE(plain.tokens.size() == 40);
    for (std::size_t k = 1; k <= 8; ++k) {
      options.draft_length = k;
      CAPTURE(k, prompt);
      CHECK(SpeculativeDecoder(perfect, target).generate(prompt, options).tokens == plain.tokens);
      CHECK(SpeculativeDecoder(good, target).generate(prompt, options).tokens == plain.tokens);
      CHECK(SpeculativeDecoder(bad, target).generate(prompt, options).tokens == plain.tokens);
      CHECK(SpeculativeDecoder(lookup, target).generate(prompt, options).tokens == plain.tokens);
    }
  }
}

TEST_CASE("a perfect draft needs about n/(k+1) target calls and every proposal is accepted", "[decoder]") {
  ToyModel target(target_config()), perfect(target_config());
  const std::vector<Token> prompt{3, 1, 4, 1, 5};
  for (std::size_t k = 1; k <= 8; ++k) {
    const GenerateOptions options{.max_new_tokens = 60, .draft_length = k};
    const auto result = SpeculativeDecoder(perfect, target).generate(prompt, options);
    const std::size_t rounds = (60 + k) / (k + 1);
    CAPTURE(k);
    CHECK(result.stats.rounds == rounds);
    CHECK(result.stats.target_forward_calls == rounds + 1);  // + the prompt
    CHECK(result.stats.accepted_tokens == result.stats.drafted_tokens);
    CHECK(result.stats.acceptance_rate() == 1.0);
    CHECK(result.stats.tokens_per_target_call() == Approx(60.0 / static_cast<double>(rounds)));
    // One entry per round: the verify width (the last final token and the proposals) and its time.
    const auto& s = result.stats;
    REQUIRE(s.verify_widths.size() == rounds);
    REQUIRE(s.verify_seconds.size() == rounds);
    CHECK(std::accumulate(s.verify_widths.begin(), s.verify_widths.end(), std::size_t{0}) == rounds + s.drafted_tokens);
    const double verify = std::accumulate(s.verify_seconds.begin(), s.verify_seconds.end(), 0.0);
    CHECK(std::all_of(s.verify_seconds.begin(), s.verify_seconds.end(), [](double t) { return t >= 0.0; }));
    CHECK(verify <= s.target_seconds + 1e-9);  // the rest is the prompt
    // Every round after the first starts by feeding the draft the last round's last proposal, which it never
    // saw; the other draft calls are the prompt's and one per proposal.
    CHECK(s.draft_catch_up_calls == rounds - 1);
    CHECK(s.draft_forward_calls == 1 + s.draft_catch_up_calls + s.drafted_tokens);
  }
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 60});
  CHECK(plain.stats.verify_widths == std::vector<std::size_t>(60, 1));
  CHECK(plain.stats.verify_seconds.size() == 60);
}

namespace {
/// Plain decoding every third round (k = 0), two proposals in the others.
struct PlainEveryThirdRound {
  std::size_t round = 0;
  std::size_t next(const GenerateOptions&) { return round++ % 3 == 0 ? 0 : 2; }
  void observe(const RoundReport&) const {}
};
}  // namespace

TEST_CASE("a draft is caught up in one call after rounds without drafting and after fully accepted rounds",
          "[decoder]") {
  ToyModel target(target_config()), perfect(target_config());
  const std::vector<Token> prompt{3, 1, 4, 1, 5};
  const GenerateOptions options{.max_new_tokens = 40};
  const auto out = SpeculativeDecoder(perfect, target, Greedy{}, PlainEveryThirdRound{}).generate(prompt, options);
  CHECK(out.tokens == generate_autoregressive(target, Greedy{}, prompt, options).tokens);
  const auto& s = out.stats;
  const auto drafting = static_cast<std::size_t>(
      std::count_if(s.verify_widths.begin(), s.verify_widths.end(), [](std::size_t w) { return w > 1; }));
  CHECK(drafting > 5);
  CHECK(drafting < s.rounds);
  // Every drafting round follows a round without drafting (the first round is one) or a fully accepted round:
  // the draft has not seen the last token or tokens, and is fed them in one call first.
  CHECK(s.draft_catch_up_calls == drafting);
  CHECK(s.draft_forward_calls == 1 + s.draft_catch_up_calls + s.drafted_tokens);
}

namespace {
/// The target's own logits over the whole context, made wrong on purpose where they predict a token whose index
/// is a multiple of 4: every other proposal is right only if the draft holds exactly the final tokens before it.
struct SabotagedDraft {
  ToyModel inner;
  Logits rows;
  std::size_t vocab_size() const { return inner.vocab_size(); }
  std::size_t context_size() const { return inner.context_size(); }
  void truncate(std::size_t n) { inner.truncate(n); }
  const Logits& forward(std::span<const Token> tokens) {
    const std::size_t before = inner.context_size();
    rows = inner.forward(tokens);
    for (Eigen::Index j = 0; j < rows.rows(); ++j) {
      if ((before + static_cast<std::size_t>(j) + 1) % 4 != 0) continue;
      Eigen::Index best = 0;
      rows.row(j).maxCoeff(&best);
      rows(j, (best + 1) % rows.cols()) = rows(j, best) + 1.0f;
    }
    return rows;
  }
};

/// Draft lengths from a cycle (0: a round without drafting), and every round's report.
struct CycleOfLengths {
  std::vector<std::size_t> cycle;
  std::size_t round = 0;
  std::vector<RoundReport> reports;
  std::size_t next(const GenerateOptions&) { return cycle[round++ % cycle.size()]; }
  void observe(const RoundReport& report) { reports.push_back(report); }
};
}  // namespace

TEST_CASE("after every rollback and catch-up the draft holds the final tokens, and no stale one", "[decoder]") {
  // Both models see the whole context (a window longer than any sequence here): one stale token left in the
  // draft (a rejected proposal kept, a catch-up skipped) would change all its later rows.
  const ToyModelConfig config{.vocab = kVocab, .window = 1000, .seed = 17, .scale = 2.0f};
  ToyModel target(config);
  for (const std::size_t k : {1u, 2u, 3u, 5u, 8u}) {
    SabotagedDraft draft{ToyModel(config), {}};
    SpeculativeDecoder decoder(draft, target, Greedy{}, CycleOfLengths{{k, 0, k, k, 0, 0, k}, 0, {}});
    std::size_t accepted = 0;
    for (const auto& prompt : prompts(6)) {  // one decoder: later prompts reuse what the models hold
      CAPTURE(k, prompt);
      const GenerateOptions options{.max_new_tokens = 30};
      const std::size_t first = decoder.draft_length_policy().reports.size();
      const auto out = decoder.generate(prompt, options);
      REQUIRE(out.tokens == generate_autoregressive(target, Greedy{}, prompt, options).tokens);
      // Proposal i of a round after n final tokens predicts the token at index n + i: it is wrong exactly
      // where n + i is a multiple of 4, so the round accepts up to the first such index.
      std::size_t n = prompt.size();
      const auto& reports = decoder.draft_length_policy().reports;
      for (std::size_t r = first; r < reports.size(); ++r) {
        std::size_t expected = 0;
        while (expected < reports[r].drafted && (n + expected) % 4 != 0) ++expected;
        CAPTURE(r, n);
        REQUIRE(reports[r].drafted == reports[r].requested);
        REQUIRE(reports[r].accepted == expected);
        accepted += expected;
        n += reports[r].accepted + 1;
      }
    }
    CHECK(accepted > 20);
  }
}

TEST_CASE("a draft that will not be asked to propose is not fed the prompt", "[decoder]") {
  ToyModel target(target_config()), draft(good_draft_config());
  SpeculativeDecoder decoder(draft, target);
  const std::vector<Token> prompt{3, 1, 4, 1, 5};
  const auto none = decoder.generate(prompt, {.max_new_tokens = 0, .draft_length = 4});
  CHECK(none.tokens.empty());
  CHECK(none.stats.draft_forward_calls == 0);
  CHECK(draft.context_size() == 0);
  const auto one = decoder.generate(prompt, {.max_new_tokens = 1, .draft_length = 4});
  CHECK(one.stats.draft_forward_calls == 0);
  CHECK(draft.context_size() == 0);
  CHECK(one.tokens == generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 1}).tokens);
  const GenerateOptions plain_rounds{.max_new_tokens = 12, .draft_length = 0};
  const auto plain = decoder.generate(prompt, plain_rounds);
  CHECK(plain.stats.draft_forward_calls == 0);
  CHECK(plain.tokens == generate_autoregressive(target, Greedy{}, prompt, plain_rounds).tokens);
  // A later call that drafts brings the draft up to the prompt first.
  const GenerateOptions drafting{.max_new_tokens = 12, .draft_length = 4};
  const auto fast = decoder.generate(prompt, drafting);
  CHECK(fast.stats.draft_forward_calls > 1);
  CHECK(fast.stats.drafted_tokens > 0);
  CHECK(fast.tokens == generate_autoregressive(target, Greedy{}, prompt, drafting).tokens);
}

TEST_CASE("a bad draft is mostly rejected and the good draft sits in between", "[decoder]") {
  ToyModel target(target_config()), good(good_draft_config()), bad(bad_draft_config());
  const std::vector<Token> prompt{1, 2, 3};
  const GenerateOptions options{.max_new_tokens = 200, .draft_length = 4};
  const auto with_good = SpeculativeDecoder(good, target).generate(prompt, options);
  const auto with_bad = SpeculativeDecoder(bad, target).generate(prompt, options);
  CHECK(with_good.stats.acceptance_rate() > 0.4);
  CHECK(with_bad.stats.acceptance_rate() < 0.2);
  REQUIRE(with_good.stats.drafted_at.size() == 4);
  CHECK(with_good.stats.drafted_at[0] + 1 >= with_good.stats.rounds);  // the last round may have no room to draft
  CHECK(with_good.stats.acceptance_rate_at(0) >= with_good.stats.acceptance_rate_at(3) - 0.2);
}

TEST_CASE("generation ends right after a stop token, even in the middle of an accepted block", "[decoder]") {
  ToyModel target(target_config()), perfect(target_config());
  const std::vector<Token> prompt{7, 7, 2};
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 30});
  // Stop on the third token: with k = 8 and a perfect draft it sits inside the first accepted block.
  const Token stop = plain.tokens[2];
  const auto first = static_cast<std::size_t>(std::find(plain.tokens.begin(), plain.tokens.end(), stop) - plain.tokens.begin());
  GenerateOptions options{.max_new_tokens = 30, .draft_length = 8, .stop_tokens = {stop}};
  const auto result = SpeculativeDecoder(perfect, target).generate(prompt, options);
  CHECK(result.stop_reason == StopReason::stop_token);
  CHECK(result.tokens == std::vector<Token>(plain.tokens.begin(), plain.tokens.begin() + static_cast<std::ptrdiff_t>(first + 1)));
  CHECK(result.tokens.back() == stop);
  const auto plain_stopped = generate_autoregressive(target, Greedy{}, prompt, options);
  CHECK(plain_stopped.tokens == result.tokens);
  CHECK(plain_stopped.stop_reason == StopReason::stop_token);
}

TEST_CASE("rounds stay within both models' max_context: speculative decoding runs wherever plain decoding does",
          "[decoder]") {
  const std::vector<Token> prompt{3, 1, 4, 1, 5};
  ToyModel free_target(target_config());
  const Token stop = generate_autoregressive(free_target, Greedy{}, prompt, {.max_new_tokens = 12}).tokens[6];
  std::size_t stopped_short = 0;  // plain runs that ended on the stop token with less room than max_new_tokens
  for (std::size_t cap = 1; cap <= prompt.size() + 13; ++cap)
    for (std::size_t draft_cap : {cap, cap / 2 + 1, cap + 3, std::size_t{2}})
      for (std::size_t k : {1, 3, 8})
        for (bool with_stop : {false, true}) {
          CAPTURE(cap, draft_cap, k, with_stop);
          GenerateOptions options{.max_new_tokens = 12, .draft_length = k};
          if (with_stop) options.stop_tokens = {stop};
          CappedModel target{ToyModel(target_config()), cap};
          const auto plain = tokens_or_error([&] { return generate_autoregressive(target, Greedy{}, prompt, options); });
          if (plain && with_stop && cap < prompt.size() + options.max_new_tokens) ++stopped_short;
          CappedModel perfect{ToyModel(target_config()), draft_cap};
          CHECK(tokens_or_error([&] { return SpeculativeDecoder(perfect, target).generate(prompt, options); }) == plain);
          CappedModel good{ToyModel(good_draft_config()), draft_cap};
          CHECK(tokens_or_error([&] { return SpeculativeDecoder(good, target).generate(prompt, options); }) == plain);
          PromptLookupDraft lookup(kVocab);
          CHECK(tokens_or_error([&] { return SpeculativeDecoder(lookup, target).generate(prompt, options); }) == plain);
        }
  CHECK(stopped_short > 0);

  // A prompt longer than the target's context is refused up front, naming both (speculative and plain alike).
  CappedModel small{ToyModel(target_config()), 4}, any{ToyModel(target_config()), 64};
  const std::string too_long = "prompt of 5 tokens exceeds the target's max_context of 4 positions";
  CHECK_THROWS_WITH(generate_autoregressive(small, Greedy{}, prompt, {}), too_long);
  CHECK_THROWS_WITH(SpeculativeDecoder(any, small).generate(prompt, {}), too_long);
  CHECK(small.context_size() == 0);  // before any forward call

  // A draft too small for the prompt sits out; the target's prompt processing is still timed as prefill.
  CappedModel target{ToyModel(target_config()), 64}, tiny{ToyModel(target_config()), 2};
  const auto sat_out = SpeculativeDecoder(tiny, target).generate(prompt, {.max_new_tokens = 4, .draft_length = 3});
  CHECK(sat_out.stats.drafted_tokens == 0);
  CHECK(sat_out.stats.prefill_seconds > 0.0);
  CHECK(sat_out.tokens == generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 4}).tokens);
}

TEST_CASE("max_new_tokens is never exceeded", "[decoder]") {
  ToyModel target(target_config()), perfect(target_config()), good(good_draft_config());
  const std::vector<Token> prompt{4, 4};
  for (std::size_t max = 0; max <= 13; ++max)
    for (std::size_t k : {1, 3, 8}) {
      const GenerateOptions options{.max_new_tokens = max, .draft_length = k};
      CAPTURE(max, k);
      const auto a = SpeculativeDecoder(perfect, target).generate(prompt, options);
      const auto b = SpeculativeDecoder(good, target).generate(prompt, options);
      CHECK(a.tokens.size() == max);
      CHECK(b.tokens.size() == max);
      CHECK(a.stop_reason == StopReason::max_tokens);
      CHECK(a.tokens == generate_autoregressive(target, Greedy{}, prompt, options).tokens);
    }
}

TEST_CASE("on_token streams each final token in order as soon as it is final, and false stops", "[decoder]") {
  ToyModel target(target_config()), perfect(target_config());
  const std::vector<Token> prompt{9};
  std::vector<Token> streamed;
  std::vector<std::size_t> calls_when_streamed;
  GenerateOptions options{.max_new_tokens = 40, .draft_length = 3};
  options.on_token = [&](Token t) {
    streamed.push_back(t);
    calls_when_streamed.push_back(target.forward_calls());
    return streamed.size() < 10;
  };
  const std::size_t calls_before = target.forward_calls();
  const auto result = SpeculativeDecoder(perfect, target).generate(prompt, options);
  CHECK(result.stop_reason == StopReason::callback);
  CHECK(result.tokens.size() == 10);
  CHECK(streamed == result.tokens);
  // Tokens of the first round stream right after the first verify call (one-token prompt: no prefill call).
  CHECK(calls_when_streamed[0] == calls_before + 1);
  CHECK(calls_when_streamed[3] == calls_before + 1);
  CHECK(calls_when_streamed[4] == calls_before + 2);
}

TEST_CASE("a reused decoder gives what fresh models give and reuses the shared prompt prefix", "[decoder]") {
  ToyModel target(target_config()), good(good_draft_config());
  SpeculativeDecoder decoder(good, target);
  const std::vector<Token> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 9}, c{8};
  const GenerateOptions options{.max_new_tokens = 25, .draft_length = 3};
  for (const auto& prompt : {a, b, a, c, b}) {
    ToyModel fresh_target(target_config()), fresh_draft(good_draft_config());
    const auto expected = SpeculativeDecoder(fresh_draft, fresh_target).generate(prompt, options);
    const auto got = decoder.generate(prompt, options);
    CHECK(got.tokens == expected.tokens);
    CHECK(got.stats.rounds == expected.stats.rounds);
  }
  const auto again = decoder.generate(b, options);
  CHECK(again.stats.reused_prompt_tokens == 4);  // b minus its last token; the rest of the context is rolled back
  // A model changed behind the decoder's back is detected and started over.
  target.truncate(2);
  const auto after_external_change = decoder.generate(a, options);
  ToyModel fresh_target(target_config());
  CHECK(after_external_change.tokens == generate_autoregressive(fresh_target, Greedy{}, a, options).tokens);
  // So is another user that leaves the model holding as many tokens as the decoder left in it: plain decoding
  // on the same target, whose context then has a's length but none of a's tokens (a model with revision()).
  const auto first = decoder.generate(a, options);
  REQUIRE(target.context_size() == a.size() + options.max_new_tokens - 1);
  const std::vector<Token> other{9, 9, 9, 9, 9};
  generate_autoregressive(target, Greedy{}, other, {.max_new_tokens = a.size() + options.max_new_tokens - 1 - other.size() + 1});
  REQUIRE(target.context_size() == a.size() + options.max_new_tokens - 1);
  const auto second = decoder.generate(a, options);
  CHECK(second.tokens == first.tokens);
  CHECK(second.stats.reused_prompt_tokens == 0);
}

TEST_CASE("draft_p_min ends drafting when the draft is unsure", "[decoder]") {
  ToyModel target(target_config()), bad(bad_draft_config());
  const std::vector<Token> prompt{1, 2, 3};
  GenerateOptions options{.max_new_tokens = 50, .draft_length = 6};
  const auto eager = SpeculativeDecoder(bad, target).generate(prompt, options);
  options.draft_p_min = 0.9f;
  const auto careful = SpeculativeDecoder(bad, target).generate(prompt, options);
  CHECK(careful.tokens == eager.tokens);
  CHECK(careful.stats.drafted_tokens < eager.stats.drafted_tokens / 2);
  CHECK(careful.stats.draft_forward_calls < eager.stats.draft_forward_calls);
  options.draft_p_min = 1.5f;
  CHECK_THROWS_WITH(SpeculativeDecoder(bad, target).generate(prompt, options), "draft_p_min must be in [0, 1], got 1.5");
  options.draft_p_min = std::nextafter(1.0f, 2.0f);  // printed with 6 digits, this read "got 1"
  CHECK_THROWS_WITH(SpeculativeDecoder(bad, target).generate(prompt, options),
                    "draft_p_min must be in [0, 1], got 1.00000012");
}

TEST_CASE("bad arguments and misbehaving models raise specdec::Error naming the values", "[decoder][errors]") {
  ToyModel target(target_config());
  ToyModel small({.vocab = 16});
  CHECK_THROWS_WITH(SpeculativeDecoder(small, target), "draft vocabulary has 16 tokens, target has 32");
  CHECK_THROWS_WITH(SpeculativeDecoder(target, target), Catch::Contains("same model object"));
  ToyModel draft(good_draft_config());
  SpeculativeDecoder decoder(draft, target);
  CHECK_THROWS_WITH(decoder.generate({}, {}), "prompt is empty: generation needs at least one token");
  const std::vector<Token> outside{1, 32}, negative{-1};
  CHECK_THROWS_WITH(decoder.generate(outside, {}), "prompt token 1 is 32, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(decoder.generate(negative, {}), "prompt token 0 is -1, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(decoder.generate(std::vector<Token>{1}, {.stop_tokens = {40}}),
                    "stop token 40 is outside the vocabulary of 32 tokens");
  CHECK_THROWS_AS(decoder.generate(outside, {}), Error);

  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, RejectionSampling{{.temperature = -1.0f}}),
                    "temperature must be a finite number >= 0, got -1");
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, RejectionSampling{{.temperature = std::nanf("")}}),
                    Catch::StartsWith("temperature must be a finite number >= 0, got "));
  // Below the smallest normal float, 1/temperature overflows and the probabilities would be NaN.
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, CoupledSampling{{.temperature = 1e-40f}}),
                    Catch::StartsWith("temperature must be 0 (greedy) or at least 1.17549435e-38, got "));
  CHECK_NOTHROW(SpeculativeDecoder(draft, target, CoupledSampling{{.temperature = 2e-38f}}));
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, RejectionSampling{{.top_p = 0.0f}}), "top_p must be in (0, 1], got 0");
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, CoupledSampling{{.top_p = 1.5f}}), "top_p must be in (0, 1], got 1.5");
  CHECK_THROWS_WITH(generate_autoregressive(target, RejectionSampling{{.top_p = -0.5f}}, std::vector<Token>{1}, {}),
                    "top_p must be in (0, 1], got -0.5");

  using Fault = test::BrokenModel::Fault;
  const std::vector<Token> prompt{1, 2, 3};
  test::BrokenModel extra(target_config(), Fault::extra_row), narrow(target_config(), Fault::missing_column);
  test::BrokenModel nan(target_config(), Fault::nan, 1), inf(target_config(), Fault::infinity);
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, extra).generate(prompt, {}), "target returned logits of shape [3, 32], expected [2, 32]");
  CHECK_THROWS_WITH(generate_autoregressive(narrow, Greedy{}, prompt, {}), "target returned logits of shape [2, 31], expected [2, 32]");
  CHECK_THROWS_WITH(SpeculativeDecoder(nan, target).generate(prompt, {}), "draft returned a non-finite logit (nan) at row 0, column 3");
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, inf).generate(prompt, {}), "target returned a non-finite logit (inf) at row 0, column 1");
  test::BrokenModel all_masked(target_config(), Fault::all_masked, 1);
  CHECK_THROWS_WITH(generate_autoregressive(all_masked, Greedy{}, prompt, {}),
                    "target returned -inf for every token at row 0: no token left to choose");
  test::BrokenModel masked_draft(good_draft_config(), Fault::all_masked, 1), masked_verify(target_config(), Fault::all_masked, 1);
  CHECK_THROWS_WITH(SpeculativeDecoder(masked_draft, target).generate(prompt, {}),
                    "draft returned -inf for every token at row 0: no token left to choose");
  ToyModel good_draft(good_draft_config());  // proposes 3: the verify pass's last row of 4 is the masked one
  CHECK_THROWS_WITH(SpeculativeDecoder(good_draft, masked_verify).generate(prompt, {.draft_length = 3}),
                    "target returned -inf for every token at row 3: no token left to choose");
  ToyModel fine(target_config());
  CHECK_THROWS_WITH(fine.forward(std::vector<Token>{33}), "toy model got token 33, outside the vocabulary of 32 tokens");
}

namespace {

/// A target that carries its own draft as its first member: two distinct models at one address.
struct TargetWithDraft {
  ToyModel draft{good_draft_config()};
  ToyModel net{target_config()};
  std::size_t vocab_size() const { return net.vocab_size(); }
  std::size_t context_size() const { return net.context_size(); }
  void truncate(std::size_t n) { net.truncate(n); }
  const Logits& forward(std::span<const Token> tokens) { return net.forward(tokens); }
};
static_assert(Model<TargetWithDraft>);

/// A target that is a ToyModel: its ToyModel part is the same model object, not a second one.
struct DerivedTarget : ToyModel {
  DerivedTarget() : ToyModel(target_config()) {}
};

/// The same through a private base, which no conversion outside the class reaches.
class PrivatelyDerivedTarget : private ToyModel {
 public:
  PrivatelyDerivedTarget() : ToyModel(target_config()) {}
  using ToyModel::context_size, ToyModel::forward, ToyModel::truncate, ToyModel::vocab_size;
  ToyModel& base() { return *this; }
};

}  // namespace

TEST_CASE("a draft at the target's address is refused only when it is the same model object", "[decoder][errors]") {
  TargetWithDraft bundle;
  REQUIRE(static_cast<const void*>(&bundle.draft) == static_cast<const void*>(&bundle));
  ToyModel plain_target(target_config());
  const std::vector<Token> prompt{1, 2, 3};
  const auto expected = generate_autoregressive(plain_target, Greedy{}, prompt, {.max_new_tokens = 24}).tokens;
  const auto out = SpeculativeDecoder(bundle.draft, bundle).generate(prompt, {.max_new_tokens = 24, .draft_length = 4});
  CHECK(out.tokens == expected);
  CHECK(out.stats.accepted_tokens > 0);

  DerivedTarget derived;
  CHECK_THROWS_WITH(SpeculativeDecoder(static_cast<ToyModel&>(derived), derived), Catch::Contains("same model object"));
  CHECK_THROWS_WITH(SpeculativeDecoder(derived, static_cast<ToyModel&>(derived)), Catch::Contains("same model object"));
  PrivatelyDerivedTarget hidden;
  CHECK_THROWS_WITH(SpeculativeDecoder(hidden.base(), hidden), Catch::Contains("same model object"));
}

namespace {

/// A ToyModel whose forward returns its logits as a new matrix of type Result (by value): the Model concept
/// allows anything that converts to const Logits&.
template <class Result>
struct ByValueModel {
  ToyModel inner;
  std::size_t vocab_size() const { return inner.vocab_size(); }
  std::size_t context_size() const { return inner.context_size(); }
  void truncate(std::size_t n) { inner.truncate(n); }
  Result forward(std::span<const Token> tokens) { return Result(inner.forward(tokens)); }
};
static_assert(Model<ByValueModel<Logits>> && Model<ByValueModel<Eigen::MatrixXf>>);

/// Greedy, but one of its three answers is a token id outside the vocabulary.
struct OutOfRangePolicy {
  enum class Where { propose, verify, sample } where;
  void validate() const {}
  class Session {
   public:
    Session(const OutOfRangePolicy& p, std::size_t vocab, std::uint64_t) : where_(p.where), vocab_(static_cast<Token>(vocab)) {}
    Token propose(std::span<const float> row, std::size_t, std::uint64_t) { return where_ == Where::propose ? vocab_ : argmax(row); }
    Verdict verify(std::span<const float> row, std::size_t, Token, std::uint64_t) {
      return where_ == Where::verify ? Verdict{false, vocab_ + 2} : Verdict{false, argmax(row)};
    }
    Token sample(std::span<const float> row, std::uint64_t) { return where_ == Where::sample ? Token{-1} : argmax(row); }

   private:
    Where where_;
    Token vocab_;
  };
};
static_assert(AcceptancePolicy<OutOfRangePolicy>);

}  // namespace

TEST_CASE("masked tokens (-inf logits) are never chosen, and speculative output still equals plain output", "[decoder]") {
  // The target masks some of the tokens the draft likes best, the draft one the target likes.
  const std::vector<Token> target_masked{0, 5, 7, 11, 19}, draft_masked{3, 5, 26};
  const auto allowed = [&](const std::vector<Token>& tokens) {
    return std::none_of(tokens.begin(), tokens.end(), [&](Token t) {
      return std::find(target_masked.begin(), target_masked.end(), t) != target_masked.end();
    });
  };
  const GenerateOptions options{.max_new_tokens = 40, .draft_length = 3, .seed = 4};
  const SamplingParams params{.temperature = 1.0f};
  std::size_t accepted = 0;
  for (const auto& prompt : prompts(6)) {
    test::MaskedModel target(target_config(), target_masked), draft(good_draft_config(), draft_masked);
    const auto plain = generate_autoregressive(target, Greedy{}, prompt, options).tokens;
    const auto greedy = SpeculativeDecoder(draft, target).generate(prompt, options);
    CHECK(greedy.tokens == plain);
    accepted += greedy.stats.accepted_tokens;
    CHECK(allowed(plain));
    const auto coupled_plain = generate_autoregressive(target, CoupledSampling{params}, prompt, options).tokens;
    CHECK(SpeculativeDecoder(draft, target, CoupledSampling{params}).generate(prompt, options).tokens == coupled_plain);
    CHECK(allowed(coupled_plain));
    CHECK(allowed(SpeculativeDecoder(draft, target, RejectionSampling{params}).generate(prompt, options).tokens));
  }
  CHECK(accepted > 0);  // the draft's proposals were verified, not all refused
}

TEST_CASE("a model whose forward returns its logits by value decodes as one that returns a reference", "[decoder]") {
  const std::vector<Token> prompt{3, 1, 4};
  const GenerateOptions options{.max_new_tokens = 20, .draft_length = 3};
  ToyModel reference_target(target_config()), reference_draft(good_draft_config());
  const auto expected = SpeculativeDecoder(reference_draft, reference_target).generate(prompt, options).tokens;
  ByValueModel<Logits> row_major{ToyModel(target_config())};
  ByValueModel<Eigen::MatrixXf> column_major{ToyModel(good_draft_config())};
  CHECK(SpeculativeDecoder(column_major, row_major).generate(prompt, options).tokens == expected);
  CHECK(generate_autoregressive(column_major, Greedy{}, prompt, {.max_new_tokens = 20}).tokens ==
        generate_autoregressive(reference_draft, Greedy{}, prompt, {.max_new_tokens = 20}).tokens);
}

TEST_CASE("the decoder holds a model to the max_context it declares, and the policy to the vocabulary",
          "[decoder][errors]") {
  const std::vector<Token> prompt{3, 1, 4};
  CappedModel target{ToyModel(target_config()), 6, false};  // declares its limit, does not keep to it
  CHECK_THROWS_WITH(generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 10}),
                    "target holds 6 tokens: 1 more would pass its max_context of 6");
  ToyModel draft(good_draft_config());
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target).generate(prompt, {.max_new_tokens = 10, .draft_length = 4}),
                    Catch::Contains("more would pass its max_context of 6"));

  ToyModel t(target_config()), d(good_draft_config());
  using Where = OutOfRangePolicy::Where;
  CHECK_THROWS_WITH(SpeculativeDecoder(d, t, OutOfRangePolicy{Where::propose}).generate(prompt, {}),
                    "the acceptance policy's propose() returned token 32, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(SpeculativeDecoder(d, t, OutOfRangePolicy{Where::verify}).generate(prompt, {}),
                    "the acceptance policy's verify() returned token 34, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(SpeculativeDecoder(d, t, OutOfRangePolicy{Where::sample}).generate(prompt, {.draft_length = 0}),
                    "the acceptance policy's sample() returned token -1, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(generate_autoregressive(t, OutOfRangePolicy{Where::sample}, prompt, {}),
                    "the acceptance policy's sample() returned token -1, outside the vocabulary of 32 tokens");
  CHECK_THROWS_WITH(ToyModel({.vocab = std::size_t{1} << 31}),
                    "toy model vocabulary of 2147483648 tokens, at most 2147483647 supported");
}
