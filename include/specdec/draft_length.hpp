// specdec/draft_length.hpp — draft-length policies: how many tokens the draft proposes each round.
// Entry points: FixedDraftLength (the default), AdaptiveDraftLength, and the DraftLengthPolicy concept.
// Read next: decoder.hpp (which calls next() before each round and observe() after it).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <iterator>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/stats.hpp"

namespace specdec {

/// What happened in one round, as the decoder measured it.
struct RoundReport {
  std::size_t requested = 0;     // this round's draft length: next()'s answer, capped by the decoder to the
                                 // output and context left (0: no drafting)
  std::size_t drafted = 0;       // proposals made (fewer when the draft stopped early or the budget ran out)
  std::size_t accepted = 0;      // proposals the target accepted
  std::size_t draft_steps = 0;   // draft forward calls made in the round
  double draft_seconds = 0.0;    // time inside those calls, and feeding the draft the tokens it missed
  std::size_t caught_up = 0;     // tokens the draft was fed before drafting: those of rounds without drafting,
                                 // and a fully accepted round's last proposal (the draft proposed it, never read it)
  double catch_up_seconds = 0.0;  // of draft_seconds: the time feeding them
  std::size_t verify_width = 0;  // positions in the target's call
  double verify_seconds = 0.0;   // time inside the target's call
  double round_seconds = 0.0;    // wall time of the whole round (drafting, verifying, acceptance), callbacks excluded
};

/// What the decoder needs from a draft-length policy (and, optionally, HasSettingsCheck and HasGenerationStart).
template <class P>
concept DraftLengthPolicy = requires(P& policy, const GenerateOptions& options, const RoundReport& report) {
  // Before drafting, how many tokens to ask the draft for: k for the coming round (0 = plain decoding; at most
  // max_draft_length, or the decoder throws).
  { policy.next(options) } -> std::convertible_to<std::size_t>;
  // After verifying, what the round gave and cost (drafted, accepted, the times), so that an adaptive policy can
  // learn; a fixed one ignores it.
  policy.observe(report);
};

/// Optional: a policy with tuning fields. The decoder calls validate() when it is built, so that a field out of
/// range is a specdec::Error then, not in the first round.
template <class P>
concept HasSettingsCheck = requires(P& policy) { policy.validate(); };

/// Optional: a policy that learns per generation. The decoder calls begin_generation() at the start of every
/// generate() call, after the prompt is processed (AdaptiveDraftLength restarts its learning counts there).
template <class P>
concept HasGenerationStart = requires(P& policy) { policy.begin_generation(); };

/// The most tokens a decoder drafts in one round (GenerateOptions::draft_length above it is a specdec::Error with
/// FixedDraftLength): a verify pass of 257 positions is a prompt's worth of work, and a sampling policy keeps a
/// distribution over the vocabulary for each drafted token (1.6 GB for 4,000 tokens of a 49k vocabulary).
inline constexpr std::size_t max_draft_length = 256;

/// Always GenerateOptions::draft_length.
struct FixedDraftLength {
  std::size_t next(const GenerateOptions& options) const { return options.draft_length; }
  void observe(const RoundReport&) const {}
};

/// Chooses k each round to maximise expected tokens per unit time, E(k) / C(k), where, with L the number of
/// tokens the draft proposes before stopping itself (a flat row, draft_p_min, its draft_budget()):
///   E(k) = 1 + sum_{j<k} P(L > j) prod_{i<=j} alpha_i   (alpha_i: acceptance at draft position i, once reached)
///   C(k) = E[steps] * t_draft + E[t_verify(min(k, L) + 1)] + P(all accepted) * t_catch_up + t_outside
/// (k = 0 is plain decoding; t_catch_up: feeding the draft one token, the last proposal of a fully accepted round,
/// which it never read). t_verify(w) is a line fitted by moving least squares to every verify pass (the plain mean
/// of its first passes) plus each width's offset from it; t_draft, t_catch_up and t_outside (the round's time
/// outside the model calls, kept apart for rounds with and without drafting) are moving averages with outlier
/// samples capped (the first few samples give their minimum); a pass over one position and a plain round's time
/// outside the model calls count at most what their drafting counterparts do. alpha_i and P(L > j) start
/// optimistic and are learned as weighted means, then moving averages. The first round drafts one token. A new k
/// replaces the current one only when it is predicted to be `hysteresis` better. Every `probe_interval` rounds
/// at k > 0 one round drafts one token more than k; at k = 0 a probe round runs after `probe_interval` rounds, the
/// wait doubling (up to `max_probe_interval`) after probes that cost real drafting time; a draft that is dear to
/// catch up on missed tokens (more than `probe_budget` of a plain round per token, as a model draft's are) probes
/// only in a generation's first round. begin_generation() (called by the decoder per generate()) restarts the
/// learning counts and, at k = 0, probes at once. k never exceeds GenerateOptions::draft_length, nor
/// max_draft_length (each round weighs every k up to the limit). next() throws specdec::Error naming a tuning
/// field that is out of range (see validate()), observe() for a round report whose counts no decoder gives.
class AdaptiveDraftLength {
 public:
  // Defaults tuned by replaying the benchmark's greedy prompt-lookup tasks against two measured cost tables
  // (virtual time, so deterministic): these gave 0.97-1.00x the best fixed k on every task kind, where the
  // earlier 0.1 / 0.05 / 16 gave 0.94-1.00x, mostly from estimates that swung with a few rejections and
  // then waited long at a low k.
  double smoothing = 0.05;         // weight of the newest observation in each moving average
  double prior_weight = 2.0;       // observations the optimistic prior (acceptance 1) counts for
  double hysteresis = 0.02;        // relative gain needed to change k
  std::size_t probe_interval = 8;        // rounds at k = 0 before the first probe; rounds between longer probes
  std::size_t max_probe_interval = 256;  // the longest wait between probes
  double probe_budget = 0.02;      // what feeding a draft one missed token may cost, relative to a plain round

  /// The longest round this policy drafts, whatever GenerateOptions::draft_length allows (the decoder's limit;
  /// the policy's cost per round grows with it too).
  static constexpr std::size_t max_draft_length = specdec::max_draft_length;

  /// Throws specdec::Error naming the first tuning field out of range: smoothing in (0, 1], prior_weight,
  /// hysteresis and probe_budget finite and >= 0, probe_interval >= 1, max_probe_interval >= probe_interval.
  void validate() const {
    using detail::exact;
    if (!(smoothing > 0.0 && smoothing <= 1.0))
      detail::fail("AdaptiveDraftLength::smoothing must be in (0, 1], got ", exact(smoothing));
    const auto finite_non_negative = [](double v) { return v >= 0.0 && std::isfinite(v); };
    if (!finite_non_negative(prior_weight))
      detail::fail("AdaptiveDraftLength::prior_weight must be finite and >= 0, got ", exact(prior_weight));
    if (!finite_non_negative(hysteresis))
      detail::fail("AdaptiveDraftLength::hysteresis must be finite and >= 0, got ", exact(hysteresis));
    if (!finite_non_negative(probe_budget))
      detail::fail("AdaptiveDraftLength::probe_budget must be finite and >= 0, got ", exact(probe_budget));
    if (probe_interval == 0) detail::fail("AdaptiveDraftLength::probe_interval must be at least 1, got 0");
    if (max_probe_interval < probe_interval)
      detail::fail("AdaptiveDraftLength::max_probe_interval must be at least probe_interval (", probe_interval,
                   "), got ", max_probe_interval);
  }

  /// The draft length for the next round, at most min(options.draft_length, max_draft_length): 1 until a round
  /// has been timed (once in the policy's life), then the k that the estimates give the most tokens per second,
  /// kept unless another is `hysteresis` better, and now and then a probe round's (see the class comment). Throws
  /// specdec::Error for a tuning field out of range (validate()).
  std::size_t next(const GenerateOptions& options) {
    validate();
    const std::size_t max_k = std::min(options.draft_length, max_draft_length);
    if (max_k == 0) return current_ = 0;
    if (!measured_) return current_ = 1;  // first round: one cheap draft step to measure
    rates_.resize(max_k + 1);
    for_each_rate(max_k, [&](std::size_t k, double r) { rates_[k] = r; });
    std::size_t best = 0;
    for (std::size_t k = 1; k <= max_k; ++k)
      if (rates_[k] > rates_[best]) best = k;
    if (current_ > max_k || rates_[best] > rates_[current_] * (1.0 + hysteresis)) current_ = best;
    if (current_ > 0) {
      wait_ = 0;
      probe_now_ = false;
      // Now and then one position more than the best so far: what lies beyond k is only learned by drafting it.
      if (current_ < max_k && ++rounds_since_longer_ >= probe_interval) {
        rounds_since_longer_ = 0;
        return current_ + 1;
      }
    }
    // A draft that must first be fed every token since its last round (a model) pays that on each probe; when
    // that alone costs more per token than `probe_budget` of a plain round, probes wait for the first round of
    // the next generation, where the draft holds the whole context already.
    const bool catch_up_too_dear = catch_up_samples_ >= 3 &&
                                   catch_up_per_token_ >= probe_budget * (plain_verify_seconds() + plain_overhead());
    if (current_ == 0 &&
        (probe_now_ || (++rounds_at_zero_ >= (wait_ = wait_ ? wait_ : probe_interval) && !catch_up_too_dear))) {
      // The wait doubles after a probe that cost real time (a model draft catching up on the context); probes
      // of a draft that costs next to nothing (prompt lookup) stay frequent.
      if (!probe_now_) wait_ = cheap_probes_ ? probe_interval : std::min(2 * wait_, max_probe_interval);
      probe_now_ = false;
      rounds_at_zero_ = 0;
      probing_ = true;
      std::size_t probe = 1;
      for (std::size_t k = 2; k <= max_k; ++k)
        if (rates_[k] > rates_[probe]) probe = k;
      return probe;
    }
    return current_;
  }

  /// Called by the decoder when a generate() call starts. A new text may suit the draft better or worse than the
  /// last: the acceptance estimates stay as a prior but learn quickly again (their observation counts restart),
  /// and a policy that had given up drafting probes in the first round, the one round where the draft holds the
  /// whole context already (a later probe first feeds the draft every token since the last one).
  void begin_generation() {
    std::fill(alpha_seen_.begin(), alpha_seen_.end(), 0);
    std::fill(continues_seen_.begin(), continues_seen_.end(), 0);
    rounds_at_zero_ = rounds_since_longer_ = 0;
    probe_now_ = true;
  }

  /// Updates the estimates from a finished round. Throws specdec::Error for a report whose counts are
  /// inconsistent (check_counts).
  void observe(const RoundReport& report) {
    check_counts(report);
    // A time that is not a finite, non-negative number (a broken clock, a report built by hand) would stay in
    // the moving averages for good: such a round teaches acceptance only.
    const bool timed = [&] {
      for (double t : {report.draft_seconds, report.catch_up_seconds, report.verify_seconds, report.round_seconds})
        if (!(t >= 0.0 && std::isfinite(t))) return false;
      return true;
    }();
    if (!timed) {
      observe_acceptance(report);
      return;
    }
    measured_ = true;
    // A probe the decoder capped to k = 0 (the end of the context or of the output) drafted nothing and cost
    // nothing: it says nothing about what a probe costs.
    if (probing_ && report.requested > 0) cheap_probes_ = report.draft_seconds < 0.05 * report.verify_seconds;
    probing_ = false;
    if (report.draft_steps > 0)
      update(t_draft_, (report.draft_seconds - report.catch_up_seconds) / static_cast<double>(report.draft_steps),
             t_draft_samples_);
    if (report.caught_up > 0) {
      update(catch_up_per_token_, report.catch_up_seconds / static_cast<double>(report.caught_up), catch_up_samples_);
    }
    // A pass wider than any round drafts (the target catching up on tokens) says nothing about the widths used.
    if (report.verify_width > 0 && report.verify_width <= max_draft_length + 1)
      observe_verify(static_cast<double>(report.verify_width), report.verify_seconds);
    // Time outside the model calls (draft bookkeeping, acceptance, sampling transforms), per kind of round.
    if (report.round_seconds > 0.0) {
      const double outside = std::max(0.0, report.round_seconds - report.draft_seconds - report.verify_seconds);
      const bool drafting = report.requested > 0;
      update(overhead_[drafting], outside, overhead_samples_[drafting]);
    }
    observe_acceptance(report);
  }

  /// What a round tells about the draft alone: how far it went, and how much of it the target accepted.
  void observe_acceptance(const RoundReport& report) {
    check_counts(report);
    // The draft's own limit L (a flat row, draft_p_min, its budget): it proposed `drafted` tokens, and when
    // that is below the request, L = drafted; otherwise L >= requested (censored). P(L > j) is learned for the
    // j the round could see.
    const std::size_t seen = std::min(report.requested, report.drafted + 1);
    if (continues_.size() < seen) continues_.resize(seen, 1.0), continues_seen_.resize(seen, 0);
    for (std::size_t j = 0; j < seen; ++j) learn(continues_[j], continues_seen_[j], report.drafted > j ? 1.0 : 0.0);
    // Position i was reached when the first i proposals were accepted and an i-th proposal was made.
    const std::size_t reached = std::min(report.drafted, report.accepted + 1);
    if (alpha_.size() < reached) alpha_.resize(reached, 1.0), alpha_seen_.resize(reached, 0);
    for (std::size_t i = 0; i < reached; ++i)
      learn(alpha_[i], alpha_seen_[i], i < report.accepted ? 1.0 : 0.0);
  }

  /// Predicted tokens per second at draft length k (0 when nothing is known yet). A round asked for k drafts
  /// min(k, L) tokens, L the draft's own limit: expected tokens 1 + Σ_{j<k} P(L > j)·Π_{i<=j} α_i, and the cost
  /// of each width min(k, L) + 1 weighted by its probability (a draft that stops itself on weak guesses makes a
  /// large k cheap), plus the measured time a round spends outside the model calls (separately for rounds with
  /// and without drafting), so that k > 0 is chosen only when it pays in wall time.
  double rate(std::size_t k) const {
    double last = 0.0;
    for_each_rate(k, [&](std::size_t, double r) { last = r; });
    return last;
  }
  /// Calls f(k, rate(k)) for k = 0..max_k in one pass, O(max_k): the same sums in the same order as rate(k), so
  /// the same bits, without redoing the first k terms for every k (next() used to, cubic in draft_length).
  template <class F>
  void for_each_rate(std::size_t max_k, F&& f) const {
    // all_accepted: P(the round's proposals were all accepted); the draft never read the last of them, and is
    // fed it (one token of catch-up) before the next round. The sums over j < k are kept; each k adds its own
    // terms for L >= k to copies.
    double expected = 1.0, run = 1.0, cost = 0.0, steps = 0.0, all_accepted = 0.0;
    double continues_j = 1.0, at_least_j = 1.0;  // P(L > j) and P(L >= j) at the current j
    for (std::size_t k = 0;; ++k) {
      const double full = at_least_j;
      double cost_k = cost + full * (k == 0 ? plain_verify_seconds() : verify_seconds(k + 1));
      const double steps_k = steps + full * static_cast<double>(k);
      const double all_k = k > 0 ? all_accepted + full * run : all_accepted;
      cost_k += steps_k * (t_draft_samples_ > 0 ? t_draft_ : 0.0);
      cost_k += all_k * catch_up_per_token_;  // 0 until measured
      if (cost_k > 0.0) cost_k += k > 0 ? drafting_overhead() : plain_overhead();
      f(k, cost_k > 0.0 ? expected / cost_k : 0.0);
      if (k == max_k) return;
      // The terms of j = k, for every longer k.
      const std::size_t j = k;
      if (j < continues_.size()) continues_j = std::min(continues_j, continues_[j]);
      const double stops_here = at_least_j - continues_j;  // P(L = j)
      cost += stops_here * (j == 0 ? plain_verify_seconds() : verify_seconds(j + 1));
      steps += stops_here * static_cast<double>(j + 1);  // j proposals and the step that declined
      if (j > 0) all_accepted += stops_here * run;
      expected += continues_j * (run *= alpha(j));
      at_least_j = continues_j;
    }
  }
  /// The current estimate of P(L > j), the draft proposing more than j tokens when asked for more
  /// (non-increasing in j: the running minimum of the per-j averages).
  double continues(std::size_t j) const {
    double p = 1.0;
    for (std::size_t i = 0; i <= j && i < continues_.size(); ++i) p = std::min(p, continues_[i]);
    return p;
  }

  /// Seconds per round spent outside the model calls, in rounds with (true) or without drafting.
  double overhead(bool drafting) const { return overhead_[drafting]; }
  /// Seconds of a target call over `width` positions: the line fitted to every verify pass plus that width's
  /// measured offset from it (0 when nothing was measured yet).
  double verify_seconds(std::size_t width) const { return verify_seconds_at(static_cast<double>(width)); }
  /// The current estimate of acceptance at draft position i (0.5 before any round that drafted a token; past the
  /// positions measured, the last one's).
  double alpha(std::size_t i) const { return i < alpha_.size() ? alpha_[i] : (alpha_.empty() ? 0.5 : alpha_.back()); }
  /// The draft length the policy has settled on; a probe round may draft more (or, at 0, some).
  std::size_t current() const { return current_; }

 private:
  /// Throws unless accepted <= drafted <= requested <= max_draft_length, as in every report the decoder builds
  /// (one built by hand may not be): a larger count would size the per-position estimates by it.
  static void check_counts(const RoundReport& report) {
    if (report.requested > max_draft_length || report.drafted > report.requested || report.accepted > report.drafted)
      detail::fail("round report needs accepted <= drafted <= requested <= ", max_draft_length, ", got accepted ",
                   report.accepted, ", drafted ", report.drafted, ", requested ", report.requested);
  }

  // The estimates that mostly plain rounds refresh (a pass over one position, which a drafting round verifies
  // only when its draft proposes nothing; the time outside the model calls of a round without drafting) count at
  // most what their drafting counterparts do (a pass over two positions; a drafting round's time outside, whose
  // work includes a plain round's). While the policy drafts they may go unrefreshed for good, and a stall in the
  // one plain round measured before (the OS running something else; the first sample of an average is not capped)
  // would otherwise keep rate(0) low and the policy drafting at a loss. (t_v(1) <= t_v(2) is the kernels' cost
  // model, not exact: measured, t_v(2)/t_v(1) is 1.00-1.15 here.)
  double plain_verify_seconds() const {
    const double one = verify_seconds(1);
    return off_line_.size() > 2 && off_line_seen_[2] ? std::min(one, verify_seconds(2)) : one;
  }
  double plain_overhead() const {
    if (overhead_samples_[0] == 0) return 0.0;
    return overhead_samples_[1] > 0 ? std::min(overhead_[0], overhead_[1]) : overhead_[0];
  }
  double drafting_overhead() const {
    return overhead_samples_[1] > 0 ? overhead_[1] : plain_overhead();
  }

  /// The mean of the observations and a prior worth `prior_weight` of them while they are few, then a moving
  /// average: quick to leave the prior, steady later, and not swung to 0 or 1 by a single observation.
  void learn(double& average, std::size_t& seen, double value) const {
    ++seen;
    average += std::max(smoothing, 1.0 / (static_cast<double>(seen) + prior_weight)) * (value - average);
  }
  /// Moving average of a time. A sample is capped at 1.5x the average (+20 µs): on a shared machine a round now
  /// and then stalls for milliseconds (the OS ran something else), and one such outlier must not make drafting
  /// look unaffordable for the next dozens of rounds; a real, lasting increase still comes through, 5% a round.
  /// Nothing caps the first sample, so the first `warm_up_samples` give their minimum: a stall in the very first
  /// round (where one-time costs fall too) would otherwise price drafting out for hundreds of rounds, as probes
  /// only move the average 5% each.
  void update(double& average, double value, std::size_t& samples) const {
    constexpr std::size_t warm_up_samples = 3;
    if (samples == 0) average = value;
    else if (samples < warm_up_samples) average = std::min(average, value);
    else average += smoothing * (capped(value, average) - average);
    ++samples;
  }
  /// t_verify(w) as a line a + b·w fitted to every verify pass (moving-average least squares), so that every
  /// width's estimate follows the machine's drift however rarely that width itself is used, plus a moving
  /// average per width of how far its passes lie off the line: t_v is not linear (one position more can cost
  /// 5% or 25% of a pass, by how the kernels group positions), and a line alone through the widths a draft uses
  /// (1, 3, 5 and 9 for prompt lookup) overestimated t_v(3..5) by up to 40% here. Outliers are capped as in
  /// update().
  void observe_verify(double width, double seconds) {
    const auto w = static_cast<std::size_t>(width);
    // A pass far below a young line means the line started from a stalled pass (nothing caps the first one): it
    // starts again from this pass, and so do the offsets measured against it.
    constexpr std::size_t young = 8;
    if (verify_samples_ > 0 && verify_samples_ < young && 1.5 * seconds < verify_seconds_at(width)) {
      verify_samples_ = 0;
      std::fill(std::begin(fit_), std::end(fit_), 0.0);
      std::fill(off_line_seen_.begin(), off_line_seen_.end(), false);
    }
    if (verify_samples_ > 0) seconds = capped(seconds, verify_seconds_at(width));
    const double sample[5] = {1.0, width, width * width, seconds, width * seconds};
    // The line moves slower than the offsets, so that it holds still across a cycle of widths and each width's
    // offset is measured against the same line. Over its first passes it is their plain mean: started from one
    // pass and moving 1.25% a pass, a first pass that ran slow (a stall, a slow phase of the machine) kept the
    // line high for hundreds of passes, and the offsets of widths measured meanwhile, frozen while the policy
    // used other widths, went stale as it came down (rejected drafts at k = 2 looked cheaper than plain).
    ++verify_samples_;
    const double line_smoothing = std::max(smoothing / 4.0, 1.0 / static_cast<double>(verify_samples_));
    for (int i = 0; i < 5; ++i) fit_[i] += line_smoothing * (sample[i] - fit_[i]);
    if (off_line_.size() <= w) off_line_.resize(w + 1, 0.0), off_line_seen_.resize(w + 1, false);
    const bool known = off_line_seen_[w];
    const double off = seconds - line_at(width);
    off_line_[w] = known ? off_line_[w] + smoothing * (off - off_line_[w]) : off;
    off_line_seen_[w] = true;
  }
  static double capped(double seconds, double estimate) { return std::min(seconds, 1.5 * estimate + 20e-6); }
  double verify_seconds_at(double width) const {
    const auto w = static_cast<std::size_t>(width);
    const double off = w < off_line_.size() && off_line_seen_[w] ? off_line_[w] : 0.0;
    return std::max(0.0, line_at(width) + off);
  }
  double line_at(double width) const {
    if (!(fit_[0] > 0.0)) return 0.0;
    const double mean_w = fit_[1] / fit_[0], mean_t = fit_[3] / fit_[0];
    const double var = fit_[2] / fit_[0] - mean_w * mean_w, cov = fit_[4] / fit_[0] - mean_w * mean_t;
    // Until widths vary enough to fit a slope, assume each extra position costs 10% of the mean pass.
    const double slope = var > 0.05 ? std::max(0.0, cov / var) : 0.1 * mean_t;
    return std::max(0.0, mean_t + slope * (width - mean_w));
  }

  std::vector<double> alpha_;     // [draft position]
  std::vector<double> continues_;  // [j]: P(L > j), see observe()
  std::vector<std::size_t> alpha_seen_, continues_seen_;  // observations behind each estimate
  double overhead_[2] = {0.0, 0.0};  // seconds per round outside the model calls: [0] plain rounds, [1] drafting
  std::size_t overhead_samples_[2] = {0, 0};
  double fit_[5] = {0, 0, 0, 0, 0};  // moving averages of 1, w, w², t_v, w·t_v over verify passes
  std::size_t verify_samples_ = 0;   // verify passes observed
  std::vector<double> off_line_;      // [width]: moving average of t_v(width) minus the line
  std::vector<bool> off_line_seen_;
  double t_draft_ = 0.0;          // seconds per draft step
  std::size_t t_draft_samples_ = 0;
  double catch_up_per_token_ = 0.0;  // seconds to feed the draft one token it missed
  std::size_t catch_up_samples_ = 0;  // rounds behind that estimate (the probe rule waits for a few)
  bool measured_ = false;
  std::size_t current_ = 0;
  std::vector<double> rates_;  // next()'s rate(k) for k = 0..draft_length, kept to avoid an allocation per round
  std::size_t rounds_at_zero_ = 0;
  std::size_t wait_ = 0;  // rounds at k = 0 before the next probe (0: not waiting yet)
  std::size_t rounds_since_longer_ = 0;  // rounds at k > 0 since one was drafted one position longer
  bool probe_now_ = false;     // the next round at k = 0 probes (set when a generation starts)
  bool probing_ = false;       // the round under way is a probe
  bool cheap_probes_ = false;  // the drafting of the last probe that drafted cost under 5% of its verify pass
};

static_assert(DraftLengthPolicy<FixedDraftLength>);
static_assert(DraftLengthPolicy<AdaptiveDraftLength>);
static_assert(HasSettingsCheck<AdaptiveDraftLength> && HasGenerationStart<AdaptiveDraftLength>);
static_assert(!HasSettingsCheck<FixedDraftLength> && !HasGenerationStart<FixedDraftLength>);

}  // namespace specdec
