// The sampling transform, and the distribution of sampled generations against exact enumeration (chi-squared).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <specdec/specdec.hpp>

#include "support/broken_models.hpp"
#include "support/chi_squared.hpp"

using namespace specdec;
using test::Sequence;

namespace {

constexpr std::size_t kVocab = 6;
constexpr std::size_t kLength = 3;    // generated tokens enumerated
constexpr std::size_t kSamples = 12000;

ToyModelConfig target_config() { return {.vocab = kVocab, .window = 2, .seed = 3, .scale = 1.2f}; }
ToyModelConfig draft_config() { return {.vocab = kVocab, .window = 2, .seed = 3, .scale = 1.2f, .noise_seed = 8, .noise = 0.8f}; }
ToyModelConfig unrelated_config() { return {.vocab = kVocab, .window = 1, .seed = 77, .scale = 1.5f}; }

const std::vector<SamplingParams>& settings() {
  static const std::vector<SamplingParams> all{
      {.temperature = 1.0f}, {.temperature = 0.6f}, {.temperature = 1.7f, .top_k = 3},
      {.temperature = 1.0f, .top_p = 0.7f}, {.temperature = 0.8f, .top_k = 4, .top_p = 0.8f}};
  return all;
}

template <class Generate>
test::ChiSquared run_chi_squared(const SamplingParams& params, Generate&& generate) {
  ToyModel reference(target_config());
  const Sequence prompt{2, 5};
  const auto expected = test::enumerate_sequences(reference, prompt, params, kLength);
  std::map<Sequence, std::size_t> counts;
  for (std::uint64_t seed = 0; seed < kSamples; ++seed) {
    const GenerateOptions options{.max_new_tokens = kLength, .seed = seed};
    ++counts[generate(prompt, options)];
  }
  return test::chi_squared(expected, counts, kSamples);
}

/// A deliberately wrong rejection sampler: on rejection it samples from p instead of max(0, p - q).
struct WrongResidualSampling {
  SamplingParams params{};
  void validate() const {}
  class Session {
   public:
    Session(const WrongResidualSampling& policy, std::size_t vocab, std::uint64_t seed) : right_(RejectionSampling{policy.params}, vocab, seed), params_(policy.params), rng_(seed) {}
    Token propose(std::span<const float> row, std::size_t slot, std::uint64_t position) {
      if (slot >= q_.size()) q_.resize(slot + 1);
      transform_logits(row, params_, q_[slot]);
      return sample_index(q_[slot], rng_.uniform(position, RandomStream::draft));
    }
    Verdict verify(std::span<const float> row, std::size_t slot, Token drafted, std::uint64_t position) {
      transform_logits(row, params_, p_);
      const auto x = static_cast<std::size_t>(drafted);
      if (rng_.uniform(position, RandomStream::accept) * q_[slot][x] < p_[x]) return {true, drafted};
      return {false, sample_index(p_, rng_.uniform(position, RandomStream::target))};  // the bug
    }
    Token sample(std::span<const float> row, std::uint64_t position) { return right_.sample(row, position); }

   private:
    RejectionSampling::Session right_;
    SamplingParams params_;
    CounterRng rng_;
    std::vector<std::vector<double>> q_;
    std::vector<double> p_;
  };
};

}  // namespace

TEST_CASE("transform applies temperature, then top-k, then top-p, and renormalises", "[sampling]") {
  const std::vector<float> row{1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  std::vector<double> p;
  transform_logits(row, {.temperature = 0.0f}, p);
  CHECK(p == std::vector<double>{0, 1, 0, 0, 0});  // argmax, lowest index on a tie
  transform_logits(row, {.temperature = 1.0f}, p);
  double z = 0;
  for (float l : row) z += std::exp(l);
  for (std::size_t i = 0; i < row.size(); ++i) CHECK(p[i] == Approx(std::exp(row[i]) / z));
  transform_logits(row, {.temperature = 2.0f, .top_k = 2}, p);  // ties at the k-th value are kept: tokens 1 and 3
  CHECK(p[1] == Approx(0.5));
  CHECK(p[3] == Approx(0.5));
  CHECK(p[0] + p[2] + p[4] == 0.0);
  transform_logits(row, {.temperature = 1.0f, .top_k = 3}, p);  // 1, 2, 3 kept
  const double z3 = 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(p[2] == Approx(std::exp(2.0) / z3));
  CHECK(p[0] == 0.0);
  // top-p: masses e^3, e^3, e^2, e^1, e^-1 over z: 0.397, 0.397, 0.146, 0.054, 0.007.
  transform_logits(row, {.temperature = 1.0f, .top_p = 0.3f}, p);  // one token; the lower index first on a tie
  CHECK(p[1] == 1.0);
  transform_logits(row, {.temperature = 1.0f, .top_p = 0.5f}, p);
  CHECK(p[1] == Approx(0.5));
  CHECK(p[3] == Approx(0.5));
  CHECK(p[2] == 0.0);
  transform_logits(row, {.temperature = 1.0f, .top_p = 0.8f}, p);  // 0.793 < 0.8: needs the third token too
  CHECK(p[2] == Approx(std::exp(2.0) / z3));
  CHECK(p[0] == 0.0);
  transform_logits(row, {.temperature = 1.0f, .top_k = 4, .top_p = 1.0f}, p);
  CHECK(p[4] == 0.0);
  CHECK(p[0] > 0.0);
}

TEST_CASE("equal logits get equal probabilities at every row length, and top-p keeps the lower indices of a tie",
          "[sampling]") {
  // A row's last n % lanes weights once took another exp than the rest (Eigen's scalar tail): the tied tokens'
  // probabilities then differed in their last bits, and top-p kept a higher index before a lower one.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-20.0f, 0.0f);
  for (std::size_t n = 2; n <= 40; ++n) {
    for (int trial = 0; trial < 25; ++trial) {
      const float tied = trial == 0 ? -13.8758507f : uniform(rng);
      std::vector<float> row(n, tied);
      row[0] = 0.0f;
      for (const float temperature : {1.0f, 0.7f}) {
        CAPTURE(n, tied, temperature);
        std::vector<double> p;
        transform_logits(row, {.temperature = temperature}, p);
        for (std::size_t i = 2; i < n; ++i) REQUIRE(p[i] == p[1]);
        if (n < 4 || p[1] == 0.0) continue;
        // Mass enough for token 0 and one and a half tied tokens: the top two of the tie, 1 and 2, are kept.
        const double top_p = p[0] + 1.5 * p[1];
        if (!(top_p < 0.999)) continue;
        transform_logits(row, {.temperature = temperature, .top_p = static_cast<float>(top_p)}, p);
        for (std::size_t i = 0; i < n; ++i) REQUIRE((p[i] > 0.0) == (i < 3));
      }
    }
  }
}

TEST_CASE("top-p keeps a prefix whose mass reaches top_p exactly, and matches a sort-based reference on random rows",
          "[sampling]") {
  std::vector<double> p;
  transform_logits(std::vector<float>(4, 1.0f), {.temperature = 1.0f, .top_p = 0.5f}, p);  // 0.25 + 0.25 = 0.5
  CHECK(p == std::vector<double>{0.5, 0.5, 0.0, 0.0});
  transform_logits(std::vector<float>(4, 1.0f), {.temperature = 1.0f, .top_p = 0.75f}, p);
  CHECK(p == std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3, 0.0});
  // The reference: weights in double, a stable sort by probability (lower index first on a tie), then the
  // shortest prefix that reaches top_p. Rows draw logits from a few values, so that ties are common.
  std::mt19937 rng(12);
  int compared = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t n = 1 + rng() % 70;
    const SamplingParams params{.temperature = std::array{0.5f, 1.0f, 1.9f}[rng() % 3],
                                .top_k = static_cast<std::size_t>(rng() % 4 == 0 ? 1 + rng() % n : 0),
                                .top_p = std::array{0.1f, 0.5f, 0.9f, 0.99f, 1.0f}[rng() % 5]};
    std::vector<float> row(n);
    for (auto& l : row) l = rng() % 8 == 0 ? -INFINITY : static_cast<float>(rng() % 9) * 0.75f - 3.0f;
    row[rng() % n] = 1.0f;
    std::vector<float> sorted(row);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    std::vector<double> reference(n, 0.0);
    for (std::size_t i = 0; i < n; ++i)
      if (params.top_k == 0 || row[i] >= sorted[params.top_k - 1])
        reference[i] = std::exp((static_cast<double>(row[i]) - sorted[0]) / params.temperature);
    const double total = std::accumulate(reference.begin(), reference.end(), 0.0);
    for (auto& r : reference) r /= total;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return reference[a] > reference[b]; });
    double mass = 0.0;
    std::size_t kept = 0;
    while (kept < n && mass < params.top_p) mass += reference[order[kept++]];
    // A prefix whose mass lies within rounding of top_p could end on either side: not compared.
    if (params.top_p < 1.0f && std::abs(mass - reference[order[kept - 1]] - params.top_p) < 1e-5) continue;
    if (params.top_p < 1.0f && std::abs(mass - params.top_p) < 1e-5) continue;
    for (std::size_t i = kept; i < n; ++i) reference[order[i]] = 0.0;
    for (auto& r : reference) r /= mass;
    transform_logits(row, params, p);
    CAPTURE(trial, n, params.temperature, params.top_k, params.top_p);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      REQUIRE((p[i] > 0.0) == (reference[i] > 0.0));
      REQUIRE(p[i] == Approx(reference[i]).margin(1e-6).epsilon(1e-5));
    }
    ++compared;
  }
  CHECK(compared > 2500);
}

TEST_CASE("a row with one clear winner transforms to the same one-hot result on both sides of the shortcut", "[sampling]") {
  // The shortcut takes rows whose runner-up is more than 100·T below the winner; at 99·T the full computation
  // runs. Both must give exactly one-hot on the winner when top_p < 1 (a loser's e^-99 cannot reach 1 - top_p).
  for (const float temperature : {0.7f, 1.0f, 3.0f}) {
    for (const float gap : {99.0f, 101.0f, 1e30f}) {
      std::vector<float> row(1000, -gap * temperature);
      row[617] = 0.0f;
      if (gap < 1e30f) row[3] = -gap * temperature;  // the runner-up, before the winner
      std::vector<double> p;
      transform_logits(row, {.temperature = temperature, .top_p = 0.95f}, p);
      std::vector<double> one_hot(1000, 0.0);
      one_hot[617] = 1.0;
      CHECK(p == one_hot);
      transform_logits(row, {.temperature = temperature, .top_k = 5, .top_p = 0.5f}, p);
      CHECK(p == one_hot);
    }
  }
}

TEST_CASE("argmax returns the lowest index of the maximum and is_flat tells a flat row, at every length and position", "[sampling]") {
  std::mt19937 rng(5);
  for (std::size_t n : {1u, 7u, 511u, 512u, 513u, 1024u, 1500u, 49152u}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Few distinct values, so that ties are common, also across the 512-value blocks argmax works in.
      std::vector<float> row(n);
      std::uniform_int_distribution<int> value(-3, trial % 2 ? 3 : 0);
      for (float& v : row) v = static_cast<float>(value(rng));
      if (trial % 5 == 0) row[rng() % n] = 9.0f;  // a single winner anywhere, the last position included
      if (trial % 7 == 0) row[n - 1] = 10.0f;
      const auto expected = static_cast<Token>(std::max_element(row.begin(), row.end()) - row.begin());
      REQUIRE(argmax(row) == expected);
      const bool flat = std::all_of(row.begin(), row.end(), [&](float v) { return v == row[0]; });
      REQUIRE(is_flat(row) == flat);
    }
    std::vector<float> row(n, -1e30f);
    CHECK(is_flat(row));
    if (n > 1300) {  // the maximum tied across blocks, the later block first to be seen as greater than block 0
      row[1300] = row[700] = 9.0f;
      CHECK(argmax(row) == 700);
      row[700] = -1e30f;
      row[n - 1] = 9.0f;  // tied between a full block and the tail
      CHECK(argmax(row) == 1300);
      row[1300] = row[n - 1] = -1e30f;
    }
    CHECK(argmax(row) == 0);
    row[n - 1] = 0.0f;  // one-hot at the end: the only differing value is the last one
    CHECK(is_flat(row) == (n == 1));
    CHECK(argmax(row) == static_cast<Token>(n - 1));
  }
}

TEST_CASE("inverse-cdf sampling picks the first index whose cumulative mass exceeds u", "[sampling]") {
  const std::vector<double> p{0.0, 0.25, 0.0, 0.5, 0.25};
  CHECK(sample_index(p, 0.1) == 1);
  CHECK(sample_index(p, 0.26) == 3);
  CHECK(sample_index(p, 0.74) == 3);
  CHECK(sample_index(p, 0.76) == 4);
  CHECK(sample_index(p, 0.9999999) == 4);
}

TEST_CASE("the sampling functions reject bad input with a specdec::Error that names it", "[sampling]") {
  const std::vector<float> row{0.0f, 100.0f, -100.0f, 50.0f};
  std::vector<double> out;
  CHECK_THROWS_WITH(transform_logits(row, {.temperature = -1.0f}, out), "temperature must be a finite number >= 0, got -1");
  CHECK_THROWS_WITH(transform_logits(row, {.temperature = std::nanf("")}, out),
                    Catch::StartsWith("temperature must be a finite number >= 0, got "));
  CHECK_THROWS_WITH(transform_logits(row, {.temperature = 1e-45f}, out),
                    "temperature must be 0 (greedy) or at least 1.17549435e-38, got 1.40129846e-45");
  // Every digit of the rejected value: 1 + 2^-23 is not "1".
  CHECK_THROWS_WITH(transform_logits(row, {.top_p = std::nextafter(1.0f, 2.0f)}, out),
                    "top_p must be in (0, 1], got 1.00000012");
  CHECK_THROWS_WITH(transform_logits({}, {}, out), "transform_logits of an empty logits row");
  CHECK_THROWS_WITH(argmax({}), "argmax of an empty logits row");

  const std::vector<double> zero{0.0, 0.0}, nan{0.5, std::nan("")}, p{0.25, 0.75};
  CHECK_THROWS_WITH(sample_index(zero, 0.5), "sample_index needs probabilities with a positive, finite sum, got 0 over 2 entries");
  CHECK_THROWS_WITH(sample_index(nan, 0.5), Catch::StartsWith("sample_index needs probabilities with a positive, finite sum, got "));
  CHECK_THROWS_WITH(sample_index({}, 0.5), "sample_index needs probabilities with a positive, finite sum, got 0 over 0 entries");
  CHECK_THROWS_WITH(sample_index(p, 1.0), "sample_index needs u in [0, 1), got 1");
  CHECK_THROWS_WITH(sample_index(p, -0.25), "sample_index needs u in [0, 1), got -0.25");
  CHECK_THROWS_AS(sample_index(p, std::nan("")), Error);
  CHECK(sample_index(p, 0.0) == 0);

  // A NaN or +inf logit has no distribution; -inf is a token masked out.
  const std::vector<float> with_nan{0.0f, std::nanf(""), 1.0f}, with_inf{0.0f, 1.0f, INFINITY}, masked{-INFINITY, 2.0f};
  CHECK_THROWS_WITH(transform_logits(with_nan, {}, out), "transform_logits needs logits that are numbers or -inf, got nan at column 1");
  CHECK_THROWS_WITH(transform_logits(with_inf, {.temperature = 0.0f}, out),
                    "transform_logits needs logits that are numbers or -inf, got inf at column 2");
  transform_logits(masked, {}, out);
  CHECK(out == std::vector<double>{0.0, 1.0});
  CHECK_THROWS_WITH(top_probability({}), "top_probability of an empty logits row");
  CHECK_THROWS_WITH(top_probability(with_nan), Catch::StartsWith("top_probability of a logits row with no distribution"));
  CHECK(top_probability(masked) == 1.0);
  const std::vector<float> all_masked{-INFINITY, -INFINITY};
  CHECK_THROWS_WITH(transform_logits(all_masked, {}, out), "transform_logits of a row with no finite logit: every token masked out");
  CHECK_THROWS_WITH(top_probability(with_inf), Catch::StartsWith("top_probability of a logits row with no distribution"));
  CHECK_THROWS_WITH(top_probability(all_masked), Catch::StartsWith("top_probability of a logits row with no distribution"));
  CHECK_THROWS_WITH(one_hot_index(row, {.temperature = -1.0f}), "temperature must be a finite number >= 0, got -1");
}

TEST_CASE("every policy's session refuses a row with a NaN or +inf, or with no number, naming the policy",
          "[sampling][errors]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> bad{{0.5f, nan, 1.0f}, {0.5f, INFINITY, 1.0f}, {-INFINITY, -INFINITY, -INFINITY}};
  const std::vector<float> good{0.5f, -INFINITY, 1.0f};
  const auto each_call = [&](auto policy, const std::string& name) {
    for (const auto& row : bad) {
      CAPTURE(name, row);
      typename decltype(policy)::Session session(policy, 3, 7);
      const auto refused = [&](auto&& call) {  // a specdec::Error naming the policy and what is wrong
        try {
          call();
        } catch (const Error& e) {
          const std::string m = e.what();
          return m.starts_with(name) && (m.find(" needs logits that are numbers or -inf, got ") != std::string::npos ||
                                         m.find(" got a logits row with no number in it (3 columns") != std::string::npos);
        }
        return false;
      };
      CHECK(refused([&] { session.propose(row, 0, 4); }));
      session.propose(good, 0, 4);  // so that verify has a proposal in slot 0
      CHECK(refused([&] { session.verify(row, 0, 2, 4); }));
      CHECK(refused([&] { session.sample(row, 5); }));
    }
  };
  each_call(Greedy{}, "Greedy");
  for (const float t : {0.0f, 1.0f}) {
    CAPTURE(t);
    each_call(RejectionSampling{{.temperature = t}}, "RejectionSampling");
    each_call(CoupledSampling{{.temperature = t}}, "CoupledSampling");
  }
}

TEST_CASE("on long sparse rows inverse-cdf sampling and top-p keep what plain scans would, in every block", "[sampling]") {
  // Both skip zero or negligible entries 64 at a time by bit masks; the row lengths put the kept entries in
  // full blocks, in a partial last block and on the blocks' edges.
  std::mt19937 rng(11);
  for (const std::size_t n : {5u, 63u, 64u, 65u, 127u, 128u, 1000u, 4099u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> probs(n, 0.0);
      const std::size_t kept = 1 + rng() % std::min<std::size_t>(n, 9);
      for (std::size_t j = 0; j < kept; ++j) probs[trial % 3 == 0 && j == 0 ? n - 1 : rng() % n] += 1.0 + rng() % 4;
      const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
      for (const double u : {0.001, 0.3, 0.5, 0.77, 0.999999}) {
        // Reference: the first index whose running sum of the positive entries exceeds u·total.
        double cumulative = 0.0;
        Token expected = -1;
        for (std::size_t i = 0; i < n && expected < 0; ++i)
          if (probs[i] > 0.0 && (cumulative += probs[i]) > u * total) expected = static_cast<Token>(i);
        REQUIRE(sample_index(probs, u) == expected);
      }
    }
    // Top-p over a row whose mass sits in a few tokens scattered over the blocks (and the last position):
    // the kept set is the smallest set of most probable tokens reaching top_p, renormalised.
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> row(n, -40.0f);
      for (int j = 0; j < 6; ++j) row[rng() % n] = static_cast<float>(rng() % 8);
      if (trial % 2) row[n - 1] = 8.5f;
      const float top_p = trial % 4 < 2 ? 0.9f : 0.6f;
      std::vector<double> p;
      transform_logits(row, {.temperature = 1.0f, .top_p = top_p}, p);
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return row[a] > row[b]; });
      double z = 0.0;
      for (float l : row) z += std::exp(static_cast<double>(l));
      std::vector<bool> in(n, false);
      double mass = 0.0, kept_mass = 0.0;
      for (std::size_t i : order) {
        if (mass >= top_p) break;
        in[i] = true;
        mass += std::exp(static_cast<double>(row[i])) / z;
        kept_mass += std::exp(static_cast<double>(row[i]));
      }
      for (std::size_t i = 0; i < n; ++i) {
        INFO("n " << n << ", trial " << trial << ", index " << i);
        if (in[i]) REQUIRE(p[i] == Approx(std::exp(static_cast<double>(row[i])) / kept_mass).epsilon(1e-5));
        else REQUIRE(p[i] == 0.0);
      }
    }
  }
}

TEST_CASE("plain sampling matches the exact distribution of the first three tokens", "[sampling][chi2]") {
  for (const auto& params : settings()) {
    ToyModel target(target_config());
    const auto chi = run_chi_squared(params, [&](const Sequence& prompt, const GenerateOptions& options) {
      return generate_autoregressive(target, RejectionSampling{params}, prompt, options).tokens;
    });
    CAPTURE(params.temperature, params.top_k, params.top_p, chi.statistic, chi.critical, chi.degrees);
    CHECK(chi.passes());
  }
}

TEST_CASE("speculative rejection sampling matches the exact distribution for several drafts and k", "[sampling][chi2]") {
  for (const auto& params : settings()) {
    for (const auto& [draft_config, k] : {std::pair{draft_config(), std::size_t{2}}, std::pair{unrelated_config(), std::size_t{3}}}) {
      ToyModel target(target_config()), draft(draft_config);
      SpeculativeDecoder decoder(draft, target, RejectionSampling{params});
      const auto chi = run_chi_squared(params, [&](const Sequence& prompt, GenerateOptions options) {
        options.draft_length = k;
        return decoder.generate(prompt, options).tokens;
      });
      CAPTURE(params.temperature, params.top_k, params.top_p, k, chi.statistic, chi.critical, chi.degrees);
      CHECK(chi.passes());
    }
  }
}

TEST_CASE("speculative rejection sampling with a one-hot prompt-lookup draft matches the exact distribution", "[sampling][chi2]") {
  // top_p = 1: the draft's rows go through the full transform; top_p < 1: the policy keeps them as an index.
  const SamplingParams params = GENERATE(SamplingParams{.temperature = 0.9f}, SamplingParams{.temperature = 0.9f, .top_p = 0.9f});
  ToyModel target(target_config());
  PromptLookupDraft lookup(kVocab, 2, 1);
  SpeculativeDecoder decoder(lookup, target, RejectionSampling{params});
  std::size_t drafted = 0;
  const auto chi = run_chi_squared(params, [&](const Sequence& prompt, GenerateOptions options) {
    options.draft_length = 2;
    auto result = decoder.generate(prompt, options);
    drafted += result.stats.drafted_tokens;
    return result.tokens;
  });
  CAPTURE(chi.statistic, chi.critical);
  CHECK(drafted > kSamples / 4);  // the draft really proposed
  CHECK(chi.passes());
}

TEST_CASE("speculative rejection sampling with masked (-inf) tokens matches the exact distribution", "[sampling][chi2]") {
  // The target masks a token the draft proposes, the draft one the target can choose (q = 0 there).
  const SamplingParams params = GENERATE(SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.8f, .top_k = 4, .top_p = 0.8f});
  test::MaskedModel target(target_config(), {1}), draft(draft_config(), {3});
  test::MaskedModel reference(target_config(), {1});
  SpeculativeDecoder decoder(draft, target, RejectionSampling{params});
  const Sequence prompt{2, 5};
  const auto expected = test::enumerate_sequences(reference, prompt, params, kLength);
  std::map<Sequence, std::size_t> counts;
  for (std::uint64_t seed = 0; seed < kSamples; ++seed)
    ++counts[decoder.generate(prompt, {.max_new_tokens = kLength, .draft_length = 2, .seed = seed}).tokens];
  const auto chi = test::chi_squared(expected, counts, kSamples);
  CAPTURE(params.temperature, params.top_k, params.top_p, chi.statistic, chi.critical, chi.degrees);
  CHECK(chi.passes());
}

TEST_CASE("rejection sampling keeps a one-hot draft row as its index and decides as the dense formula does", "[sampling]") {
  // The textbook computation on dense rows: q = transform(draft row), p = transform(target row); accept x when
  // u·q(x) < p(x), else sample max(0, p - q) (p itself when that is all zero), with the policy's counter-based
  // draws. A prompt-lookup row under top_p < 1 is one-hot, and the policy keeps only its index.
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::size_t vocab = 300;
  std::size_t rejected = 0, accepted = 0;
  for (const SamplingParams params : {SamplingParams{.temperature = 0.7f, .top_p = 0.95f},
                                      SamplingParams{.temperature = 1.3f, .top_k = 20, .top_p = 0.6f}}) {
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      RejectionSampling::Session session(RejectionSampling{params}, vocab, seed);
      const CounterRng draws(seed);
      for (std::uint64_t position = 0; position < 8; ++position) {
        std::vector<float> draft_row(vocab, -1e30f), target_row(vocab);
        for (auto& l : target_row) l = normal(rng);
        const auto t = static_cast<std::size_t>(rng() % vocab);
        if (position % 4 == 3) target_row[t] += 8.0f;  // now and then p(t) near 1: an acceptance
        draft_row[t] = 0.0f;
        REQUIRE(one_hot_index(draft_row, params) == std::optional<std::size_t>(t));
        const std::size_t slot = position % 3;
        const Token proposed = session.propose(draft_row, slot, position);
        REQUIRE(proposed == static_cast<Token>(t));
        const Verdict verdict = session.verify(target_row, slot, proposed, position);

        std::vector<double> q, p;
        transform_logits(draft_row, params, q);
        transform_logits(target_row, params, p);
        if (draws.uniform(position, RandomStream::accept) * q[t] < p[t]) {
          CHECK((verdict.accepted && verdict.token == proposed));
          ++accepted;
          continue;
        }
        std::vector<double> residual(vocab);
        for (std::size_t i = 0; i < vocab; ++i) residual[i] = std::max(0.0, p[i] - q[i]);
        if (std::all_of(residual.begin(), residual.end(), [](double r) { return r == 0.0; })) residual = p;
        CHECK_FALSE(verdict.accepted);
        CHECK(verdict.token == sample_index(residual, draws.uniform(position, RandomStream::target)));
        ++rejected;
      }
    }
  }
  CHECK(accepted > 20);
  CHECK(rejected > 200);
}

TEST_CASE("taking the residual as p instead of max(0, p - q) fails the same test", "[sampling][chi2]") {
  const SamplingParams params{.temperature = 1.0f};
  ToyModel target(target_config()), draft(unrelated_config());
  SpeculativeDecoder decoder(draft, target, WrongResidualSampling{params});
  const auto chi = run_chi_squared(params, [&](const Sequence& prompt, GenerateOptions options) {
    options.draft_length = 3;
    return decoder.generate(prompt, options).tokens;
  });
  CAPTURE(chi.statistic, chi.critical);
  CHECK_FALSE(chi.passes());
  CHECK(chi.statistic > 3 * chi.critical);
}

TEST_CASE("the same seed gives the same sampled tokens, and another seed other tokens", "[sampling]") {
  ToyModel target(target_config()), draft(draft_config());
  SpeculativeDecoder decoder(draft, target, RejectionSampling{{.temperature = 1.0f}});
  const Sequence prompt{1, 2};
  const auto a = decoder.generate(prompt, {.max_new_tokens = 64, .seed = 42});
  const auto b = decoder.generate(prompt, {.max_new_tokens = 64, .seed = 42});
  const auto c = decoder.generate(prompt, {.max_new_tokens = 64, .seed = 43});
  CHECK(a.tokens == b.tokens);
  CHECK(a.tokens != c.tokens);
}

namespace {

/// A model whose row depends on the last token only: table[last token] are its logits.
struct TableModel {
  std::vector<std::vector<float>> table;  // [token][vocab]
  std::vector<Token> context{};
  Logits logits{};
  std::size_t vocab_size() const { return table.size(); }
  std::size_t context_size() const { return context.size(); }
  void truncate(std::size_t n) { context.resize(std::min(n, context.size())); }
  const Logits& forward(std::span<const Token> tokens) {
    logits.resize(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(table.size()));
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      context.push_back(tokens[j]);
      for (std::size_t i = 0; i < table.size(); ++i)
        logits(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(i)) = table[static_cast<std::size_t>(tokens[j])][i];
    }
    return logits;
  }
};

std::vector<float> log_probabilities(std::vector<double> p) {
  std::vector<float> out;
  for (double x : p) out.push_back(x > 0 ? static_cast<float>(std::log(x)) : -1e30f);
  return out;
}

/// A legal draft-length policy that reacts to the last round: k = 3 while the draft went the whole way, else 0.
struct FollowsTheDraft {
  bool first = true;
  std::size_t last = 0;
  void begin_generation() { first = true; }
  std::size_t next(const GenerateOptions&) {
    if (first) return first = false, 3;
    return last == 3 ? 3 : 0;
  }
  void observe(const RoundReport& r) { last = r.drafted; }
};

}  // namespace

TEST_CASE("rejection sampling stays exact when the draft length follows the last round", "[sampling]") {
  // After a rejection, the positions just discarded are proposed again. With the draft's draw keyed on the
  // position alone, the new proposal repeated the discarded one's draw, whose outcome (the draft stopping at
  // draft_p_min after it) had set this round's k: P(t2 | t1 = 2) came out 0.37 / 0.13 / 0.25 / 0.25.
  TableModel draft{{log_probabilities({0.02, 0.94, 0.02, 0.02}), log_probabilities({0.5, 0, 0, 0.5}),
                    log_probabilities({0.5, 0.5, 0, 0}), log_probabilities({0.25, 0.25, 0.25, 0.25})}};
  TableModel target{{log_probabilities({0.02, 0.3, 0.66, 0.02}), log_probabilities({0.25, 0.25, 0.25, 0.25}),
                     log_probabilities({0.25, 0.25, 0.25, 0.25}), log_probabilities({0.25, 0.25, 0.25, 0.25})}};
  SpeculativeDecoder decoder(draft, target, RejectionSampling{}, FollowsTheDraft{});
  std::map<Token, double> after_two;
  double n = 0;
  for (std::uint64_t seed = 0; seed < 20000; ++seed) {
    const auto g = decoder.generate(Sequence{0}, {.max_new_tokens = 5, .draft_length = 3, .seed = seed, .draft_p_min = 0.45f});
    if (g.tokens[0] == 2) after_two[g.tokens[1]] += 1, n += 1;
  }
  REQUIRE(n > 12000);  // P(t1 = 2) = 0.66
  for (Token t = 0; t < 4; ++t) {
    CAPTURE(t, after_two[t] / n);
    CHECK(std::abs(after_two[t] / n - 0.25) < 0.02);  // 5 standard deviations
  }
}

TEST_CASE("coupled sampling's noise never lets a token win against its probability", "[sampling][coupled]") {
  // One token holds all but 1e-10 of the mass. Its noise used to be 24 bits in float, and once in 2^24 draws
  // a token's u rounded to 1, its Exp(1) deviate to 0, and it won whatever its probability: at 1024 tokens
  // about 6 of 100k positions.
  CHECK(CounterRng::unit_from_bits(~std::uint64_t{0}) < 1.0);
  CHECK(CounterRng::unit_from_bits(0) > 0.0);
  CHECK(CounterRng::to_unit(~0u, ~0u) < 1.0);
  constexpr std::size_t vocab = 1024;
  std::vector<float> row(vocab, -32.0f);
  row[700] = 0.0f;
  CoupledSampling::Session coupled(CoupledSampling{}, vocab, 7);
  std::size_t others = 0;
  for (std::uint64_t position = 0; position < 100000; ++position) others += coupled.sample(row, position) != 700;
  CHECK(others == 0);  // expected 1e-5
}

TEST_CASE("masked tokens get exactly zero probability, and a tiny top_p keeps the top token", "[sampling]") {
  // Eigen's vectorised exp clamps at about -88.7: masked tokens in whole vector packets used to get 3e-39.
  for (const std::size_t n : {16u, 67u}) {
    std::vector<float> row(n, -200.0f);  // e^-200: 0 in float, not 4e-39
    row[5] = 0.0f;
    row[n - 1] = -1e30f;
    row[n - 2] = -INFINITY;
    std::vector<double> p;
    transform_logits(row, {.temperature = 1.0f}, p);
    CAPTURE(n);
    CHECK(std::count_if(p.begin(), p.end(), [](double x) { return x != 0.0; }) == 1);
    CHECK(p[5] == 1.0);
  }
  // With 1 - top_p rounding to 1, no probability of a flat row exceeded the floor (1 - top_p)/n: all zeros.
  std::vector<double> p;
  transform_logits(std::vector<float>(1000, 0.5f), {.temperature = 1.0f, .top_p = 1e-20f}, p);
  CHECK(std::accumulate(p.begin(), p.end(), 0.0) == 1.0);
  CHECK(p[0] == 1.0);
}

TEST_CASE("temperature 0 sampling policies are greedy", "[sampling]") {
  ToyModel target(target_config()), draft(draft_config());
  const Sequence prompt{3, 3, 1};
  const GenerateOptions options{.max_new_tokens = 30, .draft_length = 3};
  const auto greedy = generate_autoregressive(target, Greedy{}, prompt, options);
  CHECK(generate_autoregressive(target, RejectionSampling{{.temperature = 0.0f}}, prompt, options).tokens == greedy.tokens);
  CHECK(SpeculativeDecoder(draft, target, RejectionSampling{{.temperature = 0.0f}}).generate(prompt, options).tokens == greedy.tokens);
  CHECK(SpeculativeDecoder(draft, target, CoupledSampling{{.temperature = 0.0f}}).generate(prompt, options).tokens == greedy.tokens);
}

TEST_CASE("plain coupled sampling matches the exact distribution of the first three tokens", "[sampling][coupled][chi2]") {
  for (const auto& params : settings()) {
    ToyModel target(target_config());
    const auto chi = run_chi_squared(params, [&](const Sequence& prompt, const GenerateOptions& options) {
      return generate_autoregressive(target, CoupledSampling{params}, prompt, options).tokens;
    });
    CAPTURE(params.temperature, params.top_k, params.top_p, chi.statistic, chi.critical);
    CHECK(chi.passes());
  }
}

TEST_CASE("coupled speculative sampling gives the plain coupled tokens for every draft, k and adaptive k", "[sampling][coupled]") {
  constexpr std::size_t vocab = 40;
  const ToyModelConfig target_cfg{.vocab = vocab, .window = 3, .seed = 21, .scale = 1.5f};
  ToyModel target(target_cfg);
  ToyModel perfect(target_cfg), good({.vocab = vocab, .window = 3, .seed = 21, .scale = 1.5f, .noise_seed = 4, .noise = 0.5f});
  ToyModel bad({.vocab = vocab, .window = 1, .seed = 5});
  PromptLookupDraft lookup(vocab);
  for (const auto& params : settings()) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const Sequence prompt{1, 2, 3, 1, 2};
      GenerateOptions options{.max_new_tokens = 40, .seed = seed};
      const auto plain = generate_autoregressive(target, CoupledSampling{params}, prompt, options);
      for (std::size_t k = 1; k <= 8; ++k) {
        options.draft_length = k;
        CAPTURE(params.temperature, params.top_k, params.top_p, seed, k);
        CHECK(SpeculativeDecoder(perfect, target, CoupledSampling{params}).generate(prompt, options).tokens == plain.tokens);
        CHECK(SpeculativeDecoder(good, target, CoupledSampling{params}).generate(prompt, options).tokens == plain.tokens);
        CHECK(SpeculativeDecoder(bad, target, CoupledSampling{params}).generate(prompt, options).tokens == plain.tokens);
        CHECK(SpeculativeDecoder(lookup, target, CoupledSampling{params}).generate(prompt, options).tokens == plain.tokens);
      }
      options.draft_length = 8;
      SpeculativeDecoder adaptive(good, target, CoupledSampling{params}, AdaptiveDraftLength{});
      CHECK(adaptive.generate(prompt, options).tokens == plain.tokens);
    }
  }
}

TEST_CASE("coupled sampling with a good draft accepts more than rejection sampling's coupling would need", "[sampling][coupled]") {
  const ToyModelConfig cfg{.vocab = 40, .window = 3, .seed = 21, .scale = 1.5f};
  ToyModel target(cfg), good({.vocab = 40, .window = 3, .seed = 21, .scale = 1.5f, .noise_seed = 4, .noise = 0.3f});
  const auto result = SpeculativeDecoder(good, target, CoupledSampling{{.temperature = 1.0f}})
                          .generate(Sequence{1, 2, 3}, {.max_new_tokens = 300, .draft_length = 4, .seed = 9});
  CHECK(result.stats.acceptance_rate() > 0.5);
}
