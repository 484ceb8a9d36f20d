// specdec/sampling.hpp — turning a logits row into the distribution a policy samples from.
// Entry points: SamplingParams, transform_logits(), sample_index(), argmax().
// The transform follows Hugging Face transformers' order: temperature, then top-k, then top-p, renormalised.
// Read next: acceptance.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/tensor.hpp"

namespace specdec {

/// How a sampling policy reshapes the target's (and draft's) logits before sampling.
struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy (argmax); must be >= 0 and finite
  std::size_t top_k = 0;     // keep the k most probable tokens (ties at the k-th value kept); 0 = off
  float top_p = 1.0f;        // keep the smallest set of most probable tokens whose mass reaches top_p; in (0, 1]
};

/// Throws specdec::Error naming the parameter when `params` is out of range.
inline void validate(const SamplingParams& params) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    detail::fail("temperature must be a finite number >= 0, got ", params.temperature);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    detail::fail("top_p must be in (0, 1], got ", params.top_p);
}

/// Index of the largest value; the lowest index wins a tie. requires: !row.empty().
inline Token argmax(std::span<const float> row) {
  SPECDEC_ASSERT(!row.empty());
  return static_cast<Token>(std::max_element(row.begin(), row.end()) - row.begin());
}

/// Probability of the most probable token under softmax(row) (temperature 1): 1 / sum_i exp(l_i - l_max).
inline double top_probability(std::span<const float> row) {
  const float top = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float l : row) sum += std::exp(static_cast<double>(l) - top);
  return 1.0 / sum;
}

/// The transformed distribution of a logits row:
///   z = l / T;  keep z_i >= (k-th largest z) when top_k > 0;  p = softmax(z) over the kept tokens;
///   keep the smallest prefix of tokens by descending p whose mass reaches top_p;  renormalise.
/// With T == 0 the result is one-hot on argmax(row). `out` is resized to row.size(); entries sum to 1.
inline void transform_logits(std::span<const float> row, const SamplingParams& params, std::vector<double>& out) {
  const std::size_t n = row.size();
  out.assign(n, 0.0);
  if (params.temperature == 0.0f) {
    out[static_cast<std::size_t>(argmax(row))] = 1.0;
    return;
  }
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  double cutoff = -std::numeric_limits<double>::infinity();
  if (params.top_k > 0 && params.top_k < n) {
    std::vector<float> sorted(row.begin(), row.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(params.top_k - 1), sorted.end(),
                     std::greater<>());
    cutoff = sorted[params.top_k - 1] * inv_t;
  }
  double top = -std::numeric_limits<double>::infinity();
  for (float l : row) top = std::max(top, l * inv_t);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double z = row[i] * inv_t;
    if (z >= cutoff) sum += (out[i] = std::exp(z - top));
  }
  for (double& p : out) p /= sum;
  if (params.top_p >= 1.0f) return;

  // Grow a sorted prefix of the most probable tokens until its mass reaches top_p.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto more_probable = [&](std::size_t a, std::size_t b) { return out[a] > out[b] || (out[a] == out[b] && a < b); };
  std::size_t kept = 0;
  double mass = 0.0;
  for (std::size_t m = std::min<std::size_t>(64, n);; m = std::min(n, m * 4)) {
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m), order.end(), more_probable);
    mass = 0.0;
    for (kept = 0; kept < m && mass < params.top_p; ++kept) mass += out[order[kept]];
    if (mass >= params.top_p || m == n) break;
  }
  for (std::size_t i = kept; i < n; ++i) out[order[i]] = 0.0;
  for (std::size_t i = 0; i < kept; ++i) out[order[i]] /= mass;
}

/// Inverse-CDF sampling: the first index whose cumulative probability exceeds u * sum(probs).
/// requires: u in (0, 1), probs non-negative with a positive sum.
inline Token sample_index(std::span<const double> probs, double u) {
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  const double target = u * total;
  double cumulative = 0.0;
  std::size_t last_positive = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    cumulative += probs[i];
    last_positive = i;
    if (cumulative > target) return static_cast<Token>(i);
  }
  return static_cast<Token>(last_positive);  // rounding left target at the very end
}

}  // namespace specdec
