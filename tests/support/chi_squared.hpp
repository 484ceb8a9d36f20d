// Exact enumeration of a model's distribution over its first few generated tokens, and a chi-squared test
// of observed generations against it.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <vector>

#include <specdec/specdec.hpp>

namespace specdec::test {

using Sequence = std::vector<Token>;

/// P(t1..tn | prompt) = prod_i p(t_i | prompt, t_<i), p the transformed distribution of `model`.
template <class M>
std::map<Sequence, double> enumerate_sequences(M& model, const Sequence& prompt, const SamplingParams& params,
                                               std::size_t length) {
  std::map<Sequence, double> out;
  std::vector<double> probs;
  std::function<void(Sequence&, double)> walk = [&](Sequence& suffix, double mass) {
    if (suffix.size() == length) {
      out[suffix] = mass;
      return;
    }
    Sequence context = prompt;
    context.insert(context.end(), suffix.begin(), suffix.end());
    model.truncate(0);
    const Logits& logits = model.forward(context);
    const auto last = logits.rows() - 1;
    transform_logits(std::span<const float>(logits.row(last).data(), static_cast<std::size_t>(logits.cols())), params, probs);
    const std::vector<double> here = probs;
    for (std::size_t t = 0; t < here.size(); ++t) {
      if (here[t] <= 0.0) continue;
      suffix.push_back(static_cast<Token>(t));
      walk(suffix, mass * here[t]);
      suffix.pop_back();
    }
  };
  Sequence suffix;
  walk(suffix, 1.0);
  model.truncate(0);
  return out;
}

struct ChiSquared {
  double statistic = 0.0;
  double critical = 0.0;  // at significance 0.001
  std::size_t degrees = 0;
  std::size_t impossible = 0;  // observations of sequences with probability 0
  bool passes() const { return impossible == 0 && statistic < critical; }
};

/// Pearson's chi-squared of `counts` (n samples) against `expected` probabilities. Cells with expected count
/// below 5 are pooled into one. The critical value comes from the Wilson-Hilferty approximation, p = 0.001.
inline ChiSquared chi_squared(const std::map<Sequence, double>& expected, const std::map<Sequence, std::size_t>& counts,
                              std::size_t n) {
  ChiSquared result;
  for (const auto& [sequence, count] : counts)
    if (!expected.contains(sequence)) result.impossible += count;
  double pooled_expected = 0.0, pooled_observed = 0.0;
  std::size_t cells = 0;
  for (const auto& [sequence, p] : expected) {
    const double e = p * static_cast<double>(n);
    const auto it = counts.find(sequence);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    if (e < 5.0) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    result.statistic += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    result.statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  result.degrees = cells > 1 ? cells - 1 : 1;
  const double k = static_cast<double>(result.degrees), z = 3.090232;  // z of the 0.999 quantile
  result.critical = k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
  return result;
}

}  // namespace specdec::test
