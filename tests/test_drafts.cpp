// PromptLookupDraft and the draft-length policies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include <specdec/specdec.hpp>

using namespace specdec;

namespace {
Token proposal(const Logits& logits) {
  const auto last = logits.rows() - 1;
  return logits.row(last).maxCoeff() == logits.row(last).minCoeff() ? -1 : argmax(std::span<const float>(logits.row(last).data(), static_cast<std::size_t>(logits.cols())));
}
}  // namespace

TEST_CASE("prompt lookup proposes what followed the most recent earlier occurrence, longest n-gram first", "[drafts]") {
  PromptLookupDraft draft(20, 3, 1);
  // 1 2 3 4 ... 1 2 3 5 ... 2 3 -> trigram "x 2 3" decides; bigram "2 3" most recent is followed by 5.
  CHECK(proposal(draft.forward(std::vector<Token>{1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 2, 3})) == 5);
  draft.truncate(0);
  CHECK(proposal(draft.forward(std::vector<Token>{1, 2, 3, 4, 9, 7, 2, 3, 5, 8, 1, 2, 3})) == 4);  // trigram 1 2 3 beats bigram
  CHECK(proposal(draft.forward(std::vector<Token>{4})) == 9);  // its own proposals extend the match
  CHECK(draft.context_size() == 14);
  draft.truncate(0);
  const Logits& none = draft.forward(std::vector<Token>{1, 2, 3});
  CHECK(none.rows() == 3);
  CHECK(proposal(none) == -1);  // no match: a flat row
  const auto row = draft.forward(std::vector<Token>{1}).row(0);
  CHECK(row(2) == 0.0f);
  CHECK(row(5) == PromptLookupDraft::kMissing);
}

TEST_CASE("prompt lookup's one-pass search finds the longest match, the most recent among equals", "[drafts]") {
  // Against the plain definition: for n from the largest possible down to min, the most recent earlier
  // occurrence of the last n tokens that some token follows.
  const auto reference = [](const std::vector<Token>& c, std::size_t max_n, std::size_t min_n) {
    const std::size_t length = c.size();
    for (std::size_t n = std::min(max_n, length > 0 ? length - 1 : 0); n >= min_n && n > 0; --n)
      for (std::size_t start = length - n; start-- > 0;)
        if (std::equal(c.end() - static_cast<std::ptrdiff_t>(n), c.end(), c.begin() + static_cast<std::ptrdiff_t>(start)))
          return std::pair<std::optional<Token>, std::size_t>{c[start + n], n};
    return std::pair<std::optional<Token>, std::size_t>{std::nullopt, 0};
  };
  CHECK(PromptLookupDraft(4).lookup_match() == reference({}, 16, 1));  // an empty context matches nothing
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const auto vocab = static_cast<Token>(2 + trial % 4);
    const std::size_t max_n = 1 + static_cast<std::size_t>(trial % 7), min_n = 1 + static_cast<std::size_t>(trial % 3) % max_n;
    PromptLookupDraft draft(static_cast<std::size_t>(vocab), max_n, min_n);
    std::vector<Token> context;
    const std::size_t size = static_cast<std::size_t>(rng() % 40);
    for (std::size_t i = 0; i < size; ++i) {
      context.push_back(static_cast<Token>(rng() % static_cast<unsigned>(vocab)));
      draft.append(std::vector<Token>{context.back()});
      INFO("trial " << trial << ", " << context.size() << " tokens, n-grams " << min_n << ".." << max_n);
      CHECK(draft.lookup_match() == reference(context, max_n, min_n));
    }
  }
}

TEST_CASE("prompt lookup speeds up a repetitive continuation and keeps greedy output exact", "[drafts]") {
  const ToyModelConfig cfg{.vocab = 12, .window = 2, .seed = 4, .scale = 4.0f};
  ToyModel target(cfg);
  PromptLookupDraft lookup(12);
  const std::vector<Token> prompt{1, 2};
  const GenerateOptions options{.max_new_tokens = 120, .draft_length = 5};
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
  const auto fast = SpeculativeDecoder(lookup, target).generate(prompt, options);
  CHECK(fast.tokens == plain.tokens);
  // A window-2 greedy model falls into a cycle, which lookup predicts perfectly.
  CHECK(fast.stats.rounds < plain.stats.rounds / 2);
}

TEST_CASE("prompt lookup's round budget follows the length of the match behind its proposal", "[drafts]") {
  PromptLookupDraft draft(20);  // default budgets: 2, 2, 3 and 4 after a 1-, 2-, 3- and 4-token match
  draft.forward(std::vector<Token>{7, 1, 9, 1});  // "1" matched, followed by 9
  CHECK(draft.match_length() == 1);
  CHECK(draft.draft_budget() == 2);
  draft.truncate(0);
  draft.forward(std::vector<Token>{7, 1, 9, 6, 1, 9});  // "1 9" matched
  CHECK(draft.match_length() == 2);
  CHECK(draft.draft_budget() == 2);
  draft.truncate(0);
  draft.forward(std::vector<Token>{5, 7, 1, 9, 6, 5, 7, 1, 9});  // a 4-token match
  CHECK(draft.match_length() == 4);
  CHECK(draft.draft_budget() == 4);
  draft.truncate(0);
  draft.forward(std::vector<Token>{3, 5, 7, 1, 9, 6, 3, 5, 7, 1, 9});  // a 5-token match: no cap
  CHECK(draft.match_length() == 5);
  CHECK(draft.draft_budget() == std::numeric_limits<std::size_t>::max());
  draft.truncate(0);
  draft.forward(std::vector<Token>{1, 2, 3});
  CHECK(draft.draft_budget() == 0);  // no match
  // max_ngram bounds the search, not the budget: a long repeat found as a 2-token match is not capped at 2.
  PromptLookupDraft small(20, 2);
  std::vector<Token> repeated;
  for (int r = 0; r < 3; ++r) repeated.insert(repeated.end(), {3, 5, 7, 1, 9, 6});
  small.forward(repeated);
  CHECK(small.match_length() == 2);
  CHECK(small.draft_budget() == std::numeric_limits<std::size_t>::max());
  small.truncate(0);
  small.forward(std::vector<Token>{8, 7, 1, 9, 6, 2, 7, 1, 9});  // "7 1 9": a 3-token match, found as 2
  CHECK(small.match_length() == 2);
  CHECK(small.draft_budget() == 3);
  small.truncate(0);
  small.forward(std::vector<Token>{2, 7, 1, 9, 6, 2, 7, 1, 9});  // 4 tokens: counted back to the context's start
  CHECK(small.draft_budget() == 4);
  PromptLookupDraft custom(20, 3, 1, {1, 0});
  custom.forward(std::vector<Token>{7, 1, 9, 6, 1, 9});
  CHECK(custom.draft_budget() == 0);
}

namespace {
/// Proposes what a perfect draft would, but advises a fixed budget per round.
struct BudgetedDraft {
  ToyModel model;
  std::size_t budget;
  std::size_t vocab_size() const { return model.vocab_size(); }
  std::size_t context_size() const { return model.context_size(); }
  const Logits& forward(std::span<const Token> t) { return model.forward(t); }
  void truncate(std::size_t n) { model.truncate(n); }
  std::size_t draft_budget() const { return budget; }
};
static_assert(HasDraftBudget<BudgetedDraft>);
}  // namespace

TEST_CASE("the decoder drafts no more per round than the draft's budget, and output stays exact", "[drafts]") {
  const ToyModelConfig cfg{.vocab = 12, .window = 3, .seed = 9, .scale = 3.0f};
  ToyModel target(cfg);
  const std::vector<Token> prompt{1, 2, 3};
  const GenerateOptions options{.max_new_tokens = 60, .draft_length = 6};
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
  for (std::size_t budget : {0u, 1u, 3u, 100u}) {
    BudgetedDraft draft{ToyModel(cfg), budget};
    const auto fast = SpeculativeDecoder(draft, target).generate(prompt, options);
    CHECK(fast.tokens == plain.tokens);
    CHECK(fast.stats.drafted_tokens <= fast.stats.rounds * std::min<std::size_t>(budget, 6));
    if (budget > 0) CHECK(fast.stats.drafted_tokens > 0);
    // A perfect draft: every proposal is accepted, so rounds = ceil(60 / (min(budget, 6) + 1)).
    CHECK(fast.stats.rounds == (60 + std::min<std::size_t>(budget, 6)) / (std::min<std::size_t>(budget, 6) + 1));
  }
}

TEST_CASE("prompt lookup rejects bad settings and tokens", "[drafts][errors]") {
  CHECK_THROWS_WITH(PromptLookupDraft(10, 2, 3), "prompt lookup n-gram sizes need 1 <= min <= max <= 1024, got min 3, max 2");
  CHECK_THROWS_WITH(PromptLookupDraft(10, 1025), "prompt lookup n-gram sizes need 1 <= min <= max <= 1024, got min 1, max 1025");
  CHECK_THROWS_WITH(PromptLookupDraft(0), "prompt lookup draft needs a vocabulary of 1 to 2147483647 tokens, got 0");
  CHECK_THROWS_WITH(PromptLookupDraft(std::size_t{1} << 31),
                    "prompt lookup draft needs a vocabulary of 1 to 2147483647 tokens, got 2147483648");
  PromptLookupDraft draft(10);
  CHECK_THROWS_WITH(draft.forward(std::vector<Token>{10}),
                    "prompt lookup draft got token 10 at index 0, outside the vocabulary of 10 tokens");
  // A call with a bad token changes nothing, not even with good tokens before it.
  draft.append(std::vector<Token>{4, 5});
  const auto revision = draft.revision();
  CHECK_THROWS_WITH(draft.forward(std::vector<Token>{1, 2, -1}),
                    "prompt lookup draft got token -1 at index 2, outside the vocabulary of 10 tokens");
  CHECK_THROWS_WITH(draft.append(std::vector<Token>{1, 10}),
                    "prompt lookup draft got token 10 at index 1, outside the vocabulary of 10 tokens");
  CHECK(draft.context_size() == 2);
  CHECK(draft.revision() == revision);
}

TEST_CASE("adaptive draft length grows k when drafts are accepted and cheap", "[draft_length]") {
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 8};
  CHECK(policy.next(options) == 1);  // the first round drafts one token
  for (int round = 0; round < 50; ++round) {
    const std::size_t k = policy.next(options);
    policy.observe({.requested = k, .drafted = k, .accepted = k, .draft_steps = k, .draft_seconds = 0.01 * static_cast<double>(k),
                    .verify_width = k + 1, .verify_seconds = 1.0});
  }
  CHECK(policy.next(options) == 8);
}

TEST_CASE("a round timed as NaN, infinite or negative teaches acceptance but no cost", "[draft_length]") {
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 4};
  for (const double broken : {std::nan(""), double(INFINITY), -1.0}) {
    policy.observe({.requested = 2, .drafted = 2, .accepted = 2, .draft_steps = 2, .draft_seconds = 0.0,
                    .verify_width = 3, .verify_seconds = broken, .round_seconds = 1.0});
  }
  for (int round = 0; round < 20; ++round)
    policy.observe({.requested = 2, .drafted = 2, .accepted = 2, .draft_steps = 2, .draft_seconds = 0.02,
                    .verify_width = 3, .verify_seconds = 1.0, .round_seconds = 1.05});
  CHECK(std::isfinite(policy.verify_seconds(3)));
  CHECK(policy.verify_seconds(3) == Approx(1.0).epsilon(0.01));
  CHECK(std::isfinite(policy.rate(2)));
  CHECK(policy.rate(2) > policy.rate(0));
  CHECK(policy.next(options) >= 2);
}

TEST_CASE("adaptive draft length with a huge draft_length asks for at most max_draft_length, and visits each k once",
          "[draft_length]") {
  // next() compares rate(k) for every k up to min(draft_length, max_draft_length) in one pass (for_each_rate):
  // computed one k at a time it was cubic in draft_length, and before the cap 200,000 was a hang. rate(k) is
  // for_each_rate's k-th value by construction, so their agreement below checks the visiting order, not the sums.
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 200'000};
  for (int round = 0; round < 10; ++round) {
    const std::size_t k = policy.next(options);
    REQUIRE(k <= AdaptiveDraftLength::max_draft_length);
    const std::size_t drafted = std::min<std::size_t>(k, 6);
    policy.observe({.requested = k, .drafted = drafted, .accepted = drafted / 2, .draft_steps = drafted + 1,
                    .draft_seconds = 0.001, .verify_width = drafted + 1,
                    .verify_seconds = 0.01 * (1.0 + 0.1 * double(drafted)), .round_seconds = 0.012});
  }
  std::vector<double> rates;
  policy.for_each_rate(40, [&](std::size_t k, double r) { CHECK(k == rates.size()); rates.push_back(r); });
  REQUIRE(rates.size() == 41);
  for (std::size_t k : {0, 1, 2, 7, 40}) CHECK(rates[k] == policy.rate(k));
}

TEST_CASE("adaptive draft length drafts at most max_draft_length whatever draft_length allows", "[draft_length]") {
  // With draft_length = SIZE_MAX the rates vector once wrapped to size 0 (a crash in the second round), and
  // 10^7 took a second a round.
  for (const std::size_t limit : {std::size_t{300}, std::size_t{10'000'000}, std::numeric_limits<std::size_t>::max()}) {
    AdaptiveDraftLength policy;
    const GenerateOptions options{.draft_length = limit};
    for (int round = 0; round < 40; ++round) {
      const std::size_t k = policy.next(options);
      REQUIRE(k <= AdaptiveDraftLength::max_draft_length);
      policy.observe({.requested = k, .drafted = k, .accepted = k, .draft_steps = k, .draft_seconds = 0.0,
                      .verify_width = k + 1, .verify_seconds = 1.0, .round_seconds = 1.0});
    }
    CHECK(policy.next(options) > AdaptiveDraftLength::max_draft_length / 2);  // every draft accepted, for free: k grows
  }
  ToyModel target({.vocab = 50}), draft({.vocab = 50, .noise_seed = 7, .noise = 0.5f});
  SpeculativeDecoder decoder(draft, target, Greedy{}, AdaptiveDraftLength{});
  const std::vector<Token> prompt{1, 2, 3, 4};
  const auto out = decoder.generate(prompt, {.max_new_tokens = 8, .draft_length = std::numeric_limits<std::size_t>::max()});
  CHECK(out.tokens == generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 8}).tokens);
}

TEST_CASE("adaptive draft length refuses a round report whose counts no decoder gives", "[draft_length][errors]") {
  AdaptiveDraftLength policy;
  const std::string message = "round report needs accepted <= drafted <= requested <= 256, got accepted ";
  CHECK_THROWS_WITH(policy.observe({.requested = 2, .drafted = 3}), message + "0, drafted 3, requested 2");
  CHECK_THROWS_WITH(policy.observe({.requested = 3, .drafted = 1, .accepted = 2}), message + "2, drafted 1, requested 3");
  CHECK_THROWS_WITH(policy.observe({.requested = std::size_t{1} << 40}), message + "0, drafted 0, requested 1099511627776");
  CHECK_THROWS_WITH(policy.observe_acceptance({.requested = 1, .drafted = 2}), message + "0, drafted 2, requested 1");
  // A verify pass wider than any round drafts (a catch-up) is left out of the cost line, not sized for: the
  // policy learns what one without a verify pass teaches, and one of width 2 teaches something else.
  const auto after = [](std::size_t width) {
    AdaptiveDraftLength p;
    for (int round = 0; round < 3; ++round) {
      p.observe({.requested = 1, .drafted = 1, .accepted = 1, .draft_steps = 1, .draft_seconds = 1e-3,
                 .verify_width = 2, .verify_seconds = 2e-3, .round_seconds = 4e-3});
      p.observe({.requested = 1, .drafted = 1, .accepted = 1, .draft_steps = 1, .draft_seconds = 1e-3,
                 .verify_width = width, .verify_seconds = 9e-3, .round_seconds = 11e-3});
    }
    return p.rate(1);
  };
  CHECK(after(std::numeric_limits<std::size_t>::max()) == after(0));
  CHECK(after(2) != after(0));
}

TEST_CASE("adaptive draft length names a tuning field out of range", "[draft_length][errors]") {
  const GenerateOptions options{.draft_length = 4};
  const auto rejects = [&](auto&& set, const std::string& message) {
    AdaptiveDraftLength policy;
    set(policy);
    CHECK_THROWS_WITH(policy.next(options), message);
  };
  rejects([](auto& p) { p.smoothing = 0.0; }, "AdaptiveDraftLength::smoothing must be in (0, 1], got 0");
  rejects([](auto& p) { p.smoothing = 5.0; }, "AdaptiveDraftLength::smoothing must be in (0, 1], got 5");
  rejects([](auto& p) { p.smoothing = std::nan(""); }, "AdaptiveDraftLength::smoothing must be in (0, 1], got nan");
  rejects([](auto& p) { p.prior_weight = -1.0; }, "AdaptiveDraftLength::prior_weight must be finite and >= 0, got -1");
  rejects([](auto& p) { p.hysteresis = INFINITY; }, "AdaptiveDraftLength::hysteresis must be finite and >= 0, got inf");
  rejects([](auto& p) { p.probe_budget = -0.5; }, "AdaptiveDraftLength::probe_budget must be finite and >= 0, got -0.5");
  rejects([](auto& p) { p.probe_interval = 0; }, "AdaptiveDraftLength::probe_interval must be at least 1, got 0");
  rejects([](auto& p) { p.max_probe_interval = 4; },
          "AdaptiveDraftLength::max_probe_interval must be at least probe_interval (8), got 4");
  AdaptiveDraftLength fine;
  fine.smoothing = 1.0, fine.prior_weight = 0.0, fine.hysteresis = 0.0, fine.probe_interval = 1, fine.max_probe_interval = 1;
  CHECK_NOTHROW(fine.next(options));
  // The decoder's constructor asks, before any prompt is processed.
  ToyModel target({.vocab = 20}), draft({.vocab = 20, .noise_seed = 3, .noise = 0.5f});
  AdaptiveDraftLength wrong;
  wrong.probe_interval = 0;
  CHECK_THROWS_WITH(SpeculativeDecoder(draft, target, Greedy{}, wrong),
                    "AdaptiveDraftLength::probe_interval must be at least 1, got 0");
}

namespace {
/// Asks for one token more than any decoder drafts.
struct OverlongDraftLength {
  std::size_t next(const GenerateOptions&) const { return max_draft_length + 1; }
  void observe(const RoundReport&) const {}
};
}  // namespace

TEST_CASE("a round drafts at most max_draft_length tokens: more is an error, not a huge verify pass", "[draft_length][errors]") {
  ToyModel target({.vocab = 20}), draft({.vocab = 20, .noise_seed = 3, .noise = 0.5f});
  const std::vector<Token> prompt{1, 2, 3};
  SpeculativeDecoder fixed(draft, target);
  CHECK_THROWS_WITH(fixed.generate(prompt, {.max_new_tokens = 1000, .draft_length = max_draft_length + 1}),
                    "draft_length 257 is above max_draft_length, 256");
  CHECK(target.context_size() == 0);  // refused before the prompt was processed
  const auto out = fixed.generate(prompt, {.max_new_tokens = 600, .draft_length = max_draft_length});
  CHECK(out.tokens == generate_autoregressive(target, Greedy{}, prompt, {.max_new_tokens = 600}).tokens);
  SpeculativeDecoder asking(draft, target, Greedy{}, OverlongDraftLength{});
  CHECK_THROWS_WITH(asking.generate(prompt, {.max_new_tokens = 10}),
                    "the draft-length policy asked for 257 tokens, above max_draft_length, 256");
}

TEST_CASE("adaptive draft length learns a verify cost that is not linear in the width", "[draft_length]") {
  // A prompt-lookup draft's rounds verify 1, 3, 5 or 9 positions, and the ninth position costs far more than
  // the others (as when a kernel's register budget runs out): a line through those passes misjudges t_v(1) by
  // a third; each width's own offset from the line gets it right.
  AdaptiveDraftLength policy;
  const std::map<std::size_t, double> cost{{1, 1.0}, {3, 1.1}, {5, 1.2}, {9, 3.0}};
  for (int round = 0; round < 800; ++round) {
    const auto& [width, seconds] = *std::next(cost.begin(), round % 4);
    const std::size_t k = width - 1;
    policy.observe({.requested = k, .drafted = k, .accepted = k, .draft_steps = k, .draft_seconds = 0.0,
                    .verify_width = width, .verify_seconds = seconds});
  }
  for (const auto& [width, seconds] : cost) CHECK(policy.verify_seconds(width) == Approx(seconds).epsilon(0.02));
  // A width never verified falls back to the line, between its neighbours' costs.
  CHECK(policy.verify_seconds(7) > 1.2);
  CHECK(policy.verify_seconds(7) < 3.0);
}

TEST_CASE("adaptive draft length falls back to plain decoding when drafts are rejected, and probes again", "[draft_length]") {
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 6};
  std::size_t zeros = 0, probes = 0;
  std::vector<int> probe_rounds;
  for (int round = 0; round < 400; ++round) {
    const std::size_t k = policy.next(options);
    (k == 0 ? zeros : probes) += 1;
    if (k > 0) probe_rounds.push_back(round);
    policy.observe({.requested = k, .drafted = k, .accepted = 0, .draft_steps = k, .draft_seconds = 0.3 * static_cast<double>(k),
                    .verify_width = k + 1, .verify_seconds = 1.0 + 0.05 * static_cast<double>(k)});
  }
  CHECK(zeros > 380);
  CHECK(probes >= 4);  // it keeps probing...
  REQUIRE(probe_rounds.size() >= 4);
  const auto n = probe_rounds.size();  // ...less and less often while probes keep failing
  CHECK(probe_rounds[n - 1] - probe_rounds[n - 2] > probe_rounds[n - 3] - probe_rounds[n - 4]);
  CHECK(policy.rate(0) > policy.rate(1));
}

TEST_CASE("a probe capped to k = 0 does not make probes look cheap", "[draft_length]") {
  // Near the end of the context the decoder may cap a probe round to k = 0: it drafts nothing and costs
  // nothing. Learned as a cheap probe, it used to reset the doubled wait between dear probes to probe_interval.
  for (const bool cap_one : {false, true}) {
    AdaptiveDraftLength policy;
    std::vector<int> probe_rounds;  // rounds that draft after a round that did not
    std::size_t last_k = 1;
    for (int round = 0; round < 1200; ++round) {
      std::size_t k = policy.next({.draft_length = 6});
      if (k > 0 && last_k == 0) {
        probe_rounds.push_back(round);
        if (cap_one && probe_rounds.size() == 3) k = 0;
      }
      last_k = k;
      policy.observe({.requested = k, .drafted = k, .accepted = 0, .draft_steps = k,
                      .draft_seconds = 0.3 * static_cast<double>(k), .verify_width = k + 1,
                      .verify_seconds = 1.0 + 0.05 * static_cast<double>(k), .round_seconds = 1.0 + 0.4 * static_cast<double>(k)});
    }
    CAPTURE(cap_one, probe_rounds);
    REQUIRE(probe_rounds.size() >= 6);
    for (std::size_t i = 2; i < probe_rounds.size(); ++i)  // the wait never shrinks while probes stay dear
      CHECK(probe_rounds[i] - probe_rounds[i - 1] >= probe_rounds[i - 1] - probe_rounds[i - 2]);
  }
}

namespace {

/// What a simulated round costs (in verify passes) and how many of its k proposals are accepted.
struct SimulatedRound {
  double draft, verify, outside;
  std::size_t accepted;
};

/// Runs `rounds` rounds of `policy` (k up to max_k) against costs(round, k) -> SimulatedRound, and returns how
/// many of them drafted.
template <class Costs>
std::size_t drafted_rounds(AdaptiveDraftLength& policy, std::size_t max_k, int rounds, Costs&& costs) {
  std::size_t drafted = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::size_t k = policy.next({.draft_length = max_k});
    if (k > 0) ++drafted;
    const SimulatedRound r = costs(round, k);
    policy.observe({.requested = k, .drafted = k, .accepted = r.accepted, .draft_steps = k, .draft_seconds = r.draft,
                    .verify_width = k + 1, .verify_seconds = r.verify, .round_seconds = r.draft + r.verify + r.outside});
  }
  return drafted;
}

}  // namespace

TEST_CASE("one stalled plain round does not keep the policy drafting at a loss", "[draft_length]") {
  // Rejected drafts that cost 0.6 of a pass each: plain decoding is best. A stall of the machine in the first plain
  // round (50 passes outside the model calls) is that average's first sample, which nothing caps; while the
  // policy drafts, no plain round comes to correct it. A plain round's time outside the model calls is bounded
  // by a drafting round's, which drafting keeps measuring, so the policy returns to k = 0.
  for (int stall_round : {-1, 1, 2, 30}) {
    CAPTURE(stall_round);
    AdaptiveDraftLength policy;
    const auto drafted = drafted_rounds(policy, 2, 400, [&](int round, std::size_t k) {
      const auto n = static_cast<double>(k);
      return SimulatedRound{0.6 * n, 1.0 + 0.05 * n, round == stall_round ? 50.0 : 0.01, 0};
    });
    CHECK(drafted < 20);
    CHECK(policy.current() == 0);
  }
}

TEST_CASE("a slow first verify pass does not leave rejected drafts looking cheap", "[draft_length]") {
  // Rejected drafts that cost 0.58 of a pass, over six generations: plain decoding is best. The first round
  // (drafting one token) runs 1.7x or 50x slow, as in a slow phase of the machine or a stall. A verify-cost line
  // started from that one pass and moving 1.25% a pass stayed high for hundreds of passes, and the offset of
  // width 3, measured against it at the first probe, went stale as the line came down: t_v(3) looked cheaper
  // than t_v(1) and the policy drafted 624 of 720 rounds (1.7x). The line is the plain mean of its first passes,
  // and starts again when a pass lands far below it while it is young (50x: 715 of 720 without that).
  for (double slow_first : {1.7, 50.0}) {
    CAPTURE(slow_first);
    AdaptiveDraftLength policy;
    std::size_t drafted = 0;
    for (int generation = 0; generation < 6; ++generation) {
      policy.begin_generation();
      drafted += drafted_rounds(policy, 2, 120, [&](int round, std::size_t k) {
        const double slow = generation == 0 && round == 0 ? slow_first : 1.0;
        const auto n = static_cast<double>(k);
        return SimulatedRound{slow * 0.58 * n, slow * (1.0 + 0.065 * n), 0.002, 0};
      });
    }
    CHECK(drafted < 30);
    CHECK(policy.rate(0) > policy.rate(2));
  }
}

TEST_CASE("a stall in the first rounds does not price good drafts out", "[draft_length]") {
  // Drafts that are always accepted and cost 5% of a pass: drafting is best. A stall (50 passes outside the model
  // calls) in one of the first rounds is an average's first samples, which nothing caps; probes from k = 0 would
  // move it 5% each. The first few samples give their minimum, so the policy keeps drafting.
  for (int stall_round : {-1, 0, 1, 3}) {
    CAPTURE(stall_round);
    AdaptiveDraftLength policy;
    const auto drafted = drafted_rounds(policy, 4, 400, [&](int round, std::size_t k) {
      const auto n = static_cast<double>(k);
      return SimulatedRound{0.05 * n, 1.0 + 0.05 * n, round == stall_round ? 50.0 : 0.01, k};
    });
    CHECK(drafted > 380);
    CHECK(policy.current() == 4);
  }
}

TEST_CASE("after the first samples a lasting change of cost comes through", "[draft_length]") {
  // Good, cheap drafts for 100 rounds, then drafts as good that cost 3 passes a step: the draft-step estimate,
  // which gave its first samples' minimum, must follow, and the policy give up drafting.
  AdaptiveDraftLength policy;
  CHECK(drafted_rounds(policy, 4, 100, [](int, std::size_t k) {
          const auto n = static_cast<double>(k);
          return SimulatedRound{0.05 * n, 1.0 + 0.05 * n, 0.01, k};
        }) > 90);
  drafted_rounds(policy, 4, 200, [](int, std::size_t k) {  // capped samples raise an average 2.5% a round
    const auto n = static_cast<double>(k);
    return SimulatedRound{3.0 * n, 1.0 + 0.05 * n, 0.01, k};
  });
  CHECK(drafted_rounds(policy, 4, 200, [](int, std::size_t k) {
          const auto n = static_cast<double>(k);
          return SimulatedRound{3.0 * n, 1.0 + 0.05 * n, 0.01, k};
        }) < 20);
  CHECK(policy.current() == 0);
}

TEST_CASE("a draft that is dear to catch up is probed only in a generation's first round", "[draft_length]") {
  // Rejected drafts at k = 0; feeding the draft each token it missed costs 10% of a plain round (a model draft),
  // above the 2% probe budget: after the one mid-generation probe that measures that, none until the next
  // generation, whose first round probes (the draft holds the whole context then).
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 4};
  std::size_t missed = 0;
  const auto round = [&] {
    const std::size_t k = policy.next(options);
    policy.observe({.requested = k, .drafted = k, .accepted = 0, .draft_steps = k,
                    .draft_seconds = k ? 0.3 * static_cast<double>(k) + 0.1 * static_cast<double>(missed) : 0.0,
                    .caught_up = k ? missed : 0, .catch_up_seconds = k ? 0.1 * static_cast<double>(missed) : 0.0,
                    .verify_width = k + 1, .verify_seconds = 1.0 + 0.05 * static_cast<double>(k)});
    missed = k ? 0 : missed + 1;
    return k;
  };
  std::vector<int> probes;
  for (int r = 0; r < 400; ++r)
    if (round() > 0) probes.push_back(r);
  REQUIRE(probes.size() >= 2);
  CHECK(probes.back() < 100);  // the probes before the catch-up cost was known, then none
  policy.begin_generation();
  CHECK(round() > 0);
  for (int r = 0; r < 300; ++r) CHECK(round() == 0);
}

TEST_CASE("adaptive draft length prices the catch-up a fully accepted round leaves the draft", "[draft_length]") {
  // Every proposal accepted: the draft must read the round's last proposal before the next round. Two policies
  // see the same rounds, one with that catch-up free and one where it costs 0.5; the draft step costs 0.1 in
  // both (catch-up time is not a draft step), so they differ by exactly 0.5 per round of E(2) = 3 tokens.
  AdaptiveDraftLength free_catch_up, dear_catch_up;
  for (int round = 0; round < 50; ++round) {
    for (double catch_up : {0.0, 0.5})
      (catch_up > 0 ? dear_catch_up : free_catch_up)
          .observe({.requested = 2, .drafted = 2, .accepted = 2, .draft_steps = 2, .draft_seconds = 0.2 + catch_up,
                    .caught_up = 1, .catch_up_seconds = catch_up, .verify_width = 3, .verify_seconds = 1.0});
  }
  CHECK(free_catch_up.rate(0) == Approx(dear_catch_up.rate(0)));
  CHECK(1.0 / dear_catch_up.rate(2) - 1.0 / free_catch_up.rate(2) == Approx(0.5 / 3.0));
  CHECK(1.0 / free_catch_up.rate(2) == Approx((2 * 0.1 + 1.0) / 3.0));
}

TEST_CASE("the decoder reports the tokens a draft catches up on after rounds without drafting", "[draft_length]") {
  // A policy that skips drafting for 5 rounds, then drafts: the draft missed the 5 tokens of those rounds.
  struct Scripted {
    std::size_t rounds = 0;
    std::vector<RoundReport> reports;
    std::size_t next(const GenerateOptions&) { return rounds++ < 5 ? 0 : 2; }
    void observe(const RoundReport& r) { reports.push_back(r); }
  };
  const ToyModelConfig cfg{.vocab = 16, .window = 2, .seed = 4, .scale = 3.0f};
  ToyModel target(cfg), draft(cfg);
  SpeculativeDecoder decoder(draft, target, Greedy{}, Scripted{});
  const auto out = decoder.generate(std::vector<Token>{1, 2, 3}, {.max_new_tokens = 12});
  const auto& reports = decoder.draft_length_policy().reports;
  REQUIRE(reports.size() > 6);
  for (std::size_t i = 0; i < 5; ++i) CHECK(reports[i].caught_up == 0);
  CHECK(reports[5].caught_up == 5);
  CHECK(reports[5].catch_up_seconds <= reports[5].draft_seconds);
  CHECK(reports[6].caught_up == (reports[5].accepted == 2 ? 1u : 0u));  // the last proposal, never fed to the draft
  CHECK(out.tokens.size() == 12);
}

TEST_CASE("adaptive draft length settles between the extremes when acceptance is moderate", "[draft_length]") {
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 8};
  // Acceptance 0.6 per position, draft step 10% of a verify: the best k maximises (1-0.6^(k+1))/0.4 / (0.1k + 1).
  const CounterRng rng(5);
  for (std::uint64_t round = 0; round < 400; ++round) {
    const std::size_t k = policy.next(options);
    std::size_t accepted = 0;
    while (accepted < k && rng.uniform(round, RandomStream::accept, static_cast<std::uint32_t>(accepted)) < 0.6) ++accepted;
    policy.observe({.requested = k, .drafted = k, .accepted = accepted, .draft_steps = k, .draft_seconds = 0.1 * static_cast<double>(k),
                    .verify_width = k + 1, .verify_seconds = 1.0});
  }
  const std::size_t k = policy.current();
  CHECK(k >= 2);
  CHECK(k <= 5);
}

TEST_CASE("greedy output with an adaptive draft length equals plain greedy output", "[draft_length]") {
  const ToyModelConfig cfg{.vocab = 32, .window = 3, .seed = 11, .scale = 2.0f};
  ToyModel target(cfg), good({.vocab = 32, .window = 3, .seed = 11, .scale = 2.0f, .noise_seed = 5, .noise = 0.4f});
  ToyModel bad({.vocab = 32, .window = 1, .seed = 3});
  const std::vector<Token> prompt{5, 6, 7};
  const GenerateOptions options{.max_new_tokens = 150, .draft_length = 8};
  const auto plain = generate_autoregressive(target, Greedy{}, prompt, options);
  SpeculativeDecoder with_good(good, target, Greedy{}, AdaptiveDraftLength{});
  SpeculativeDecoder with_bad(bad, target, Greedy{}, AdaptiveDraftLength{});
  for (int call = 0; call < 3; ++call) {
    const auto a = with_good.generate(prompt, options);
    const auto b = with_bad.generate(prompt, options);
    CHECK(a.tokens == plain.tokens);
    CHECK(b.tokens == plain.tokens);
    CHECK(a.stats.draft_lengths.size() == a.stats.rounds);
  }
}

TEST_CASE("adaptive draft length learns how often a draft stops itself, and drafts long when that is cheap",
          "[draft_length]") {
  // Half the rounds the draft has a strong guess (all k accepted); the other half a weak one, and it stops
  // after one proposal, which is rejected. Expected rate (1 + k/2) / (1.125 + 0.125 k) grows with k.
  AdaptiveDraftLength policy;
  const GenerateOptions options{.draft_length = 8};
  std::mt19937 rng(3);
  for (int round = 0; round < 2000; ++round) {
    const std::size_t k = policy.next(options);
    const bool strong = rng() % 2 == 0;
    const std::size_t drafted = strong ? k : std::min<std::size_t>(k, 1);
    policy.observe({.requested = k, .drafted = drafted, .accepted = strong ? k : 0,
                    .draft_steps = drafted + (drafted < k), .draft_seconds = 0.0, .verify_width = drafted + 1,
                    .verify_seconds = 1.0 + 0.25 * static_cast<double>(drafted)});
  }
  CHECK(policy.continues(0) == Approx(1.0));
  CHECK(policy.continues(1) == Approx(0.5).margin(0.25));
  CHECK(policy.current() >= 6);
}
