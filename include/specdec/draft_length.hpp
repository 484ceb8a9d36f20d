// specdec/draft_length.hpp — draft-length policies: how many tokens the draft proposes each round.
// Entry points: FixedDraftLength (the default), AdaptiveDraftLength, and the DraftLengthPolicy concept.
// Read next: decoder.hpp (which calls next() before each round and observe() after it).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <vector>

#include "specdec/stats.hpp"

namespace specdec {

/// What happened in one round, as the decoder measured it.
struct RoundReport {
  std::size_t requested = 0;     // the draft length next() asked for
  std::size_t drafted = 0;       // proposals made (fewer when the draft stopped early or the budget ran out)
  std::size_t accepted = 0;      // proposals the target accepted
  std::size_t draft_steps = 0;   // draft forward calls made in the round
  double draft_seconds = 0.0;    // time inside those calls
  std::size_t verify_width = 0;  // positions in the target's call
  double verify_seconds = 0.0;   // time inside the target's call
};

/// What the decoder needs from a draft-length policy.
template <class P>
concept DraftLengthPolicy = requires(P& policy, const GenerateOptions& options, const RoundReport& report) {
  { policy.next(options) } -> std::convertible_to<std::size_t>;  // k for the coming round (0 = plain decoding)
  policy.observe(report);                                          // feedback after the round
};

/// Always GenerateOptions::draft_length.
struct FixedDraftLength {
  std::size_t next(const GenerateOptions& options) const { return options.draft_length; }
  void observe(const RoundReport&) const {}
};

/// Chooses k each round to maximise expected tokens per unit time, E(k) / C(k), where
///   E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i   (alpha_i: acceptance at draft position i, given i was reached)
///   C(k) = k * t_draft + t_verify(k + 1)         (t_verify(1) is a plain decoding step, so k = 0 is plain decoding)
/// alpha_i and the costs are exponential moving averages of what the decoder measures. The first round drafts one
/// token (cheap to learn from, whatever the draft costs); unmeasured positions take the last measured alpha, so k
/// grows while drafts keep being accepted. A new k replaces the current one only when it is predicted to be
/// `hysteresis` better; while k = 0, a probe round with k >= 1 runs after `probe_interval` rounds, and the wait
/// doubles after each probe that does not bring speculation back (up to `max_probe_interval`).
/// k never exceeds GenerateOptions::draft_length. State persists across generate() calls on one decoder.
class AdaptiveDraftLength {
 public:
  double smoothing = 0.1;          // weight of the newest observation in each moving average
  double hysteresis = 0.05;        // relative gain needed to change k
  std::size_t probe_interval = 16;       // rounds at k = 0 before the first probe
  std::size_t max_probe_interval = 256;  // the longest wait between probes

  std::size_t next(const GenerateOptions& options) {
    const std::size_t max_k = options.draft_length;
    if (max_k == 0) return current_ = 0;
    if (!measured_) return current_ = 1;  // first round: one cheap draft step to measure
    std::size_t best = 0;
    double best_rate = rate(0);
    for (std::size_t k = 1; k <= max_k; ++k)
      if (const double r = rate(k); r > best_rate) best = k, best_rate = r;
    if (current_ > max_k || best_rate > rate(current_) * (1.0 + hysteresis)) current_ = best;
    if (current_ > 0) {
      wait_ = 0;
      // Now and then one position more than the best so far: what lies beyond k is only learned by drafting it.
      if (current_ < max_k && ++rounds_since_longer_ >= probe_interval) {
        rounds_since_longer_ = 0;
        return current_ + 1;
      }
    }
    if (current_ == 0 && ++rounds_at_zero_ >= (wait_ = wait_ ? wait_ : probe_interval)) {
      rounds_at_zero_ = 0;
      wait_ = std::min(2 * wait_, max_probe_interval);
      std::size_t probe = 1;
      for (std::size_t k = 2; k <= max_k; ++k)
        if (rate(k) > rate(probe)) probe = k;
      return probe;
    }
    return current_;
  }

  void observe(const RoundReport& report) {
    measured_ = true;
    if (report.draft_steps > 0) update(t_draft_, report.draft_seconds / static_cast<double>(report.draft_steps), have_t_draft_);
    if (report.verify_width > 0) {
      if (t_verify_.size() < report.verify_width) t_verify_.resize(report.verify_width, -1.0);
      double& slot = t_verify_[report.verify_width - 1];
      bool known = slot >= 0.0;
      update(slot, report.verify_seconds, known);
    }
    // The draft's own limit L (a flat row, draft_p_min, its budget): it proposed `drafted` tokens, and when
    // that is below the request, L = drafted; otherwise L >= requested (censored). P(L > j) is learned for the
    // j the round could see.
    const std::size_t seen = std::min(report.requested, report.drafted + 1);
    if (continues_.size() < seen) continues_.resize(seen, 1.0);
    for (std::size_t j = 0; j < seen; ++j) continues_[j] += smoothing * ((report.drafted > j ? 1.0 : 0.0) - continues_[j]);
    // Position i was reached when the first i proposals were accepted and an i-th proposal was made.
    const std::size_t reached = std::min(report.drafted, report.accepted + 1);
    if (alpha_.size() < reached) alpha_.resize(reached, 1.0);  // optimistic until observed: explores longer drafts
    for (std::size_t i = 0; i < reached; ++i)
      alpha_[i] += smoothing * ((i < report.accepted ? 1.0 : 0.0) - alpha_[i]);
  }

  /// Predicted tokens per second at draft length k (0 when nothing is known yet). A round asked for k drafts
  /// min(k, L) tokens, L the draft's own limit: expected tokens 1 + Σ_{j<k} P(L > j)·Π_{i<=j} α_i, and the cost
  /// of each width min(k, L) + 1 weighted by its probability (a draft that stops itself on weak guesses makes a
  /// large k cheap).
  double rate(std::size_t k) const {
    double expected = 1.0, run = 1.0, cost = 0.0, steps = 0.0;
    for (std::size_t j = 0; j < k; ++j) {
      const double stops_here = continues(j == 0 ? 0 : j - 1, j == 0) - continues(j, false);  // P(L = j)
      cost += stops_here * verify_cost(j + 1);
      steps += stops_here * static_cast<double>(j + 1);  // j proposals and the step that declined
      expected += continues(j, false) * (run *= alpha(j));
    }
    const double full = continues(k == 0 ? 0 : k - 1, k == 0);  // P(L >= k)
    cost += full * verify_cost(k + 1);
    steps += full * static_cast<double>(k);
    cost += steps * (have_t_draft_ ? t_draft_ : 0.0);
    return cost > 0.0 ? expected / cost : 0.0;
  }
  /// The current estimate of P(L > j), the draft proposing more than j tokens when asked for more.
  /// (Non-increasing in j: the running minimum of the per-j averages.)
  double continues(std::size_t j, bool none = false) const {
    double p = 1.0;
    if (none) return p;
    for (std::size_t i = 0; i <= j && i < continues_.size(); ++i) p = std::min(p, continues_[i]);
    return p;
  }
  /// The current estimate of acceptance at draft position i.
  double alpha(std::size_t i) const { return i < alpha_.size() ? alpha_[i] : (alpha_.empty() ? 0.5 : alpha_.back()); }
  std::size_t current() const { return current_; }

 private:
  void update(double& average, double value, bool& known) const {
    average = known ? average + smoothing * (value - average) : value;
    known = true;
  }
  /// t_verify(width): measured when available, else interpolated linearly between the nearest measured widths
  /// (flat beyond the measured range: an optimistic guess that probing corrects).
  double verify_cost(std::size_t width) const {
    std::size_t lo = 0, hi = 0;  // 1-based widths of the nearest measurements below/at and above
    for (std::size_t w = 1; w <= t_verify_.size(); ++w) {
      if (t_verify_[w - 1] < 0.0) continue;
      if (w <= width) lo = w;
      if (w >= width && hi == 0) hi = w;
    }
    if (lo == width) return t_verify_[lo - 1];
    if (lo && hi) {
      const double f = static_cast<double>(width - lo) / static_cast<double>(hi - lo);
      return t_verify_[lo - 1] + f * (t_verify_[hi - 1] - t_verify_[lo - 1]);
    }
    if (lo) return t_verify_[lo - 1];
    if (hi) return t_verify_[hi - 1];
    return 0.0;
  }

  std::vector<double> alpha_;     // [draft position]
  std::vector<double> continues_;  // [j]: P(L > j), see observe()
  std::vector<double> t_verify_;  // [width - 1]: seconds, -1 = not measured
  double t_draft_ = 0.0;          // seconds per draft step
  bool have_t_draft_ = false;
  bool measured_ = false;
  std::size_t current_ = 0;
  std::size_t rounds_at_zero_ = 0;
  std::size_t wait_ = 0;  // rounds at k = 0 before the next probe (0: not waiting yet)
  std::size_t rounds_since_longer_ = 0;  // rounds at k > 0 since one was drafted one position longer
};

static_assert(DraftLengthPolicy<FixedDraftLength>);
static_assert(DraftLengthPolicy<AdaptiveDraftLength>);

}  // namespace specdec
