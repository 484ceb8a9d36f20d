// specdec/acceptance.hpp — acceptance policies: how a draft proposes and how the target accepts.
// Entry points: Greedy, RejectionSampling, CoupledSampling, and the AcceptancePolicy concept.
// A policy is a small value type; its Session holds per-generation scratch and works on logits rows and
// tokens only — it never sees a model — so it is testable with hand-made rows. The Sessions here check each row
// they are given (numbers or -inf, at least one number), as the decoder does before them: a few microseconds a
// row, so that a hand-made row with a NaN is an error rather than a token.
// Read next: decoder.hpp (who drives a Session).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "specdec/random.hpp"
#include "specdec/sampling.hpp"

namespace specdec {

/// The outcome of verifying one drafted token: accepted (token == drafted) or replaced by `token`.
struct Verdict {
  bool accepted;
  Token token;
};

/// What the decoder needs from an acceptance policy. `position` is the absolute position of the token being
/// chosen (prompt length + index among the new tokens); `slot` is its index within the round's drafts.
template <class P>
concept AcceptancePolicy = requires(const P& policy, typename P::Session& session, std::span<const float> row,
                                    std::size_t slot, Token token, std::uint64_t position) {
  // The decoder checks the parameters once, when it is built, so a bad temperature fails before any model call.
  policy.validate();  // throws specdec::Error on bad parameters
  // A generation's state (the draft's distributions for the round, the seed) lives in a session that each
  // generate() call makes anew, so the policy itself stays const and one decoder can run many generations.
  typename P::Session;
  { typename P::Session(policy, std::size_t{}, std::uint64_t{}) };  // (policy, vocab size, seed)
  // Drafting: the token the draft proposes from its row (the session keeps what verify() needs of that row).
  { session.propose(row, slot, position) } -> std::same_as<Token>;
  // Verifying: the target's verdict on a proposal; on rejection, the token that replaces it.
  { session.verify(row, slot, token, position) } -> std::same_as<Verdict>;
  // The target's own token: after a round whose proposals were all accepted, and in plain decoding.
  { session.sample(row, position) } -> std::same_as<Token>;
};

/// Greedy decoding: the draft proposes its argmax; the target accepts while its argmax agrees.
struct Greedy {
  void validate() const {}

  class Session {
   public:
    Session(const Greedy&, std::size_t, std::uint64_t) {}
    Token propose(std::span<const float> row, std::size_t, std::uint64_t) { return choose(row); }
    Verdict verify(std::span<const float> row, std::size_t, Token drafted, std::uint64_t) {
      const Token chosen = choose(row);
      return {chosen == drafted, chosen};
    }
    Token sample(std::span<const float> row, std::uint64_t) { return choose(row); }

   private:
    static Token choose(std::span<const float> row) {
      detail::check_logits_row(row, "Greedy");
      return argmax(row);
    }
  };
};

/// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023). With p the target's and q the draft's
/// transformed distribution at a position:
///   the draft samples x ~ q;  accept x with probability min(1, p(x) / q(x));
///   on rejection sample from normalise(max(0, p - q));  after k acceptances sample the extra token from p.
/// The output has exactly the distribution of sampling from p token by token.
struct RejectionSampling {
  SamplingParams params{};

  void validate() const { specdec::validate(params); }

  class Session {
   public:
    Session(const RejectionSampling& policy, std::size_t, std::uint64_t seed) : params_(policy.params), rng_(seed) {}

    Token propose(std::span<const float> row, std::size_t slot, std::uint64_t position) {
      detail::check_logits_row(row, "RejectionSampling");
      if (slot >= q_.size()) q_.resize(slot + 1), one_hot_.resize(slot + 1);
      // A one-hot q (a prompt-lookup draft's row) is kept as its index: no dense row to fill (49k doubles) or to
      // subtract on rejection. Its sample is that index whatever the draw, and the draws are counter-based, so
      // skipping one changes no other.
      if (const auto one = one_hot_index(row, params_)) {
        one_hot_[slot] = *one;
        return static_cast<Token>(*one);
      }
      one_hot_[slot] = dense;
      detail::transform_dense(row, params_, q_[slot]);
      // A fresh draw per proposal, not per position: after a rejection the next round proposes at the positions
      // just discarded again, and a draw keyed on the position alone would repeat the discarded proposal's. Its
      // outcome (how far the draft went before stopping itself) reaches a draft-length policy through the round
      // report, so the policy's next k would depend on the very draw the new proposal uses, and the output would
      // no longer follow p.
      return sample_index(q_[slot], rng_.uniform(position, RandomStream::draft, proposals_++));
    }

    Verdict verify(std::span<const float> row, std::size_t slot, Token drafted, std::uint64_t position) {
      detail::check_logits_row(row, "RejectionSampling");
      detail::transform_row(row, params_, p_);
      const std::size_t one = one_hot_.at(slot);
      const auto x = static_cast<std::size_t>(drafted);
      const double q_x = one == dense ? q_[slot][x] : (x == one ? 1.0 : 0.0);
      // Accept with probability min(1, p(x)/q(x)), written without the division; q(x) > 0 since x ~ q.
      if (rng_.uniform(position, RandomStream::accept) * q_x < p_[x]) return {true, drafted};
      // The residual max(0, p - q). Its mass is only tested for being positive, so a count of positive entries
      // does (a running sum was a serial chain of 49k dependent adds per rejection, 50 us). A one-hot q changes p
      // at its index only (elsewhere max(0, p_i - 0) = p_i).
      std::size_t positive = 0;
      if (one == dense) {
        const auto& q = q_[slot];
        for (std::size_t i = 0; i < p_.size(); ++i) {
          const double r = std::max(0.0, p_[i] - q[i]);
          p_[i] = r;
          positive += r > 0.0;
        }
      } else {
        p_[one] = std::max(0.0, p_[one] - 1.0);
        for (std::size_t i = 0; i < p_.size(); ++i) positive += p_[i] > 0.0;
      }
      if (positive == 0) detail::transform_row(row, params_, p_);  // p == q up to rounding: the residual is p itself
      return {false, sample_index(p_, rng_.uniform(position, RandomStream::target))};
    }

    Token sample(std::span<const float> row, std::uint64_t position) {
      detail::check_logits_row(row, "RejectionSampling");
      detail::transform_row(row, params_, p_);
      return sample_index(p_, rng_.uniform(position, RandomStream::target));
    }

   private:
    SamplingParams params_;
    CounterRng rng_;
    std::uint32_t proposals_ = 0;  // dense proposals drawn in this session: the draft draw's index
    static constexpr std::size_t dense = std::numeric_limits<std::size_t>::max();
    std::vector<std::vector<double>> q_;  // per draft slot: [vocab] (unused while the slot's q is one-hot)
    std::vector<std::size_t> one_hot_;    // per draft slot: the index of a one-hot q, or `dense`
    std::vector<double> p_;               // [vocab]
  };
};

/// Drafter-invariant sampling by the Gumbel-max trick. The token at absolute position t is
///   argmax_i (log p_t(i) + g_t(i)),   g_t(i) = -log(-log u(seed, t, i)),  u from a counter-based generator,
/// which is an exact sample from p_t. The draft proposes argmax_i (log q_t(i) + g_t(i)) with the same noise and
/// the target accepts while its own choice agrees, so the output depends on the seed alone, not on the draft
/// or the draft length. Implemented in the equivalent exponential-race form argmin_i E_t(i) / p_t(i),
/// E = -log u ~ Exp(1), over the tokens the transform keeps.
struct CoupledSampling {
  SamplingParams params{};

  void validate() const { specdec::validate(params); }

  class Session {
   public:
    Session(const CoupledSampling& policy, std::size_t, std::uint64_t seed) : params_(policy.params), rng_(seed) {}

    Token propose(std::span<const float> row, std::size_t, std::uint64_t position) { return choose(row, position); }
    Verdict verify(std::span<const float> row, std::size_t, Token drafted, std::uint64_t position) {
      const Token chosen = choose(row, position);
      return {chosen == drafted, chosen};
    }
    Token sample(std::span<const float> row, std::uint64_t position) { return choose(row, position); }

   private:
    Token choose(std::span<const float> row, std::uint64_t position) {
      detail::check_logits_row(row, "CoupledSampling");
      // A one-hot distribution (temperature 0, a prompt-lookup draft's row) keeps one token: the race's winner.
      if (const auto one = one_hot_index(row, params_)) return static_cast<Token>(*one);
      detail::transform_dense(row, params_, probs_);
      const auto key = rng_.block(position, RandomStream::gumbel, 0);
      const std::uint64_t start = (std::uint64_t{key[0]} << 32) | key[1];
      Token best = 0;
      double best_score = std::numeric_limits<double>::infinity();
      // Noise only where it can matter: top-k and top-p leave few tokens.
      detail::for_each_kept(
          probs_.size(), [&](std::size_t i) { return !(probs_[i] <= 0.0); },
          [&](std::size_t i) {
            const double score = exponential_noise(start, i) / probs_[i];  // argmin E/p == argmax log p + Gumbel
            if (score < best_score) best_score = score, best = static_cast<Token>(i);
            return false;
          });
      return best;
    }

    /// The Exp(1) deviate of token i at the position whose key gave `start`: SplitMix64 of (start, i), 52 bits
    /// to a uniform strictly inside (0, 1), then −log. A pure function of (seed, position, token), whoever asks.
    /// (It was 24 bits in float: m + 0.5 for m = 2^24 − 1 rounds to 2^24, so once in 2^24 draws u was 1 and
    /// E was 0, and that token won whatever its probability: 0.3% of positions at a 49k vocabulary.)
    static double exponential_noise(std::uint64_t start, std::size_t i) {
      std::uint64_t z = start + (i + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return -std::log(CounterRng::unit_from_bits(z));
    }

    SamplingParams params_;
    CounterRng rng_;
    std::vector<double> probs_;  // [vocab]
  };
};

static_assert(AcceptancePolicy<Greedy>);
static_assert(AcceptancePolicy<RejectionSampling>);
static_assert(AcceptancePolicy<CoupledSampling>);

}  // namespace specdec
