// specdec/sampling.hpp — turning a logits row into the distribution a policy samples from.
// Entry points: SamplingParams, transform_logits(), sample_index(), argmax().
// The transform follows Hugging Face transformers' order: temperature, then top-k, then top-p, renormalised.
// Read next: acceptance.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "specdec/detail/quiet_warnings.hpp"
#include "specdec/error.hpp"
#include "specdec/tensor.hpp"

namespace specdec {

/// How a sampling policy reshapes the target's (and draft's) logits before sampling.
struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy (argmax); must be >= 0 and finite
  std::size_t top_k = 0;     // keep the k most probable tokens (ties at the k-th value kept); 0 or >= vocab = off
  float top_p = 1.0f;        // keep the smallest set of most probable tokens whose mass reaches top_p; in (0, 1]
};

/// Throws specdec::Error naming the parameter when `params` is out of range (values printed with every digit
/// a float needs, so that a top_p of 1 + 2^-23 does not read as "got 1").
inline void validate(const SamplingParams& params) {
  using detail::exact;
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    detail::fail("temperature must be a finite number >= 0, got ", exact(params.temperature));
  // Logits are scaled by 1/temperature, which overflows to infinity below the smallest normal float (and
  // (max − max)·inf is NaN): such a temperature is rejected rather than turned into NaN probabilities.
  if (params.temperature > 0.0f && params.temperature < std::numeric_limits<float>::min())
    detail::fail("temperature must be 0 (greedy) or at least ", exact(std::numeric_limits<float>::min()), ", got ",
                 exact(params.temperature));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    detail::fail("top_p must be in (0, 1], got ", exact(params.top_p));
}

// Eigen's vectorised maxCoeff and exp, inlined into argmax and top_probability, draw GCC 12's false positives
// (see quiet_warnings.hpp) in programs that include Eigen before specdec: 29 at -O2 for one call.
SPECDEC_AVX512_WARNINGS_OFF

/// Index of the largest value; the lowest index wins a tie. Throws specdec::Error for an empty row.
/// requires: no NaN. returns: an index into row.
/// One pass: the maximum of each 512-value block (vectorised), keeping the first block that holds the largest
/// so far; then the first position in that block holding it. (A whole-row maximum followed by a scalar search
/// for it took 6-9 us per 49k row; this takes 2.)
inline Token argmax(std::span<const float> row) {
  if (row.empty()) detail::fail("argmax of an empty logits row");
  constexpr std::size_t block = 512;
  const float* values = row.data();
  const std::size_t n = row.size();
  float top = values[0];
  std::size_t top_block = 0, b = 0;
  for (; b + block <= n; b += block)
    if (const float m = Eigen::Map<const Eigen::Array<float, block, 1>>(values + b).maxCoeff(); m > top)
      top = m, top_block = b;
  for (std::size_t i = b; i < n; ++i)
    if (values[i] > top) top = values[i], top_block = i;
  const auto at = static_cast<std::size_t>(std::find(values + top_block, values + n, top) - values);
  return static_cast<Token>(at < n ? at : top_block);  // at == n only for a NaN maximum, outside the contract
}

/// True when every value of the row equals the first (a draft row with no preference). Stops at the first
/// block holding a different value, so a real row costs next to nothing and a one-hot row half a pass.
inline bool is_flat(std::span<const float> row) {
  constexpr std::size_t block = 64;
  const float* values = row.data();
  const std::size_t n = row.size();
  if (n == 0) return true;
  const float first = values[0];
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    unsigned differ = 0;  // counted, not or-ed, so that the block compare vectorises
    for (std::size_t j = 0; j < block; ++j) differ += values[i + j] != first;
    if (differ) return false;
  }
  for (; i < n; ++i)
    if (values[i] != first) return false;
  return true;
}

/// Probability of the most probable token under softmax(row) (temperature 1): 1 / sum_i exp(l_i - l_max).
/// Throws specdec::Error for an empty row, and for one without a distribution (a NaN or +inf logit, or every
/// logit -inf).
inline double top_probability(std::span<const float> row) {
  if (row.empty()) detail::fail("top_probability of an empty logits row");
  const Eigen::Map<const Eigen::ArrayXf> values(row.data(), static_cast<Eigen::Index>(row.size()));
  const double p = 1.0 / static_cast<double>((values - values.maxCoeff()).exp().sum());
  if (!(p > 0.0 && p <= 1.0)) detail::fail("top_probability of a logits row with no distribution (a NaN or +inf, or all -inf)");
  return p;
}
SPECDEC_AVX512_WARNINGS_ON

namespace detail {

/// The first index of `values` whose float's bits satisfy `bad`, if any. One vectorised pass over the bits
/// decides, and only a bad row is searched again. (Eigen's abs().maxCoeff() plus isNaN().any() took 28 us per
/// 49k-logit row, 3% of a five-position round.)
template <class Bad>
std::optional<std::size_t> first_bits_where(std::span<const float> values, Bad bad) {
  const auto test = [&](float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bad(bits);
  };
  std::uint32_t any = 0;
  for (const float v : values) any |= static_cast<std::uint32_t>(test(v));
  if (any == 0) return std::nullopt;
  return static_cast<std::size_t>(std::find_if(values.begin(), values.end(), test) - values.begin());
}
/// first_bits_where's tests: NaN or infinite (the exponent bits all set); NaN or +inf (-inf passes: a mask).
/// Function objects, not functions: passed as function pointers, GCC 12 called them once per value instead of
/// vectorising the scan (100 us a 49k row instead of 7).
inline constexpr auto not_finite_bits = [](std::uint32_t bits) { return (bits & 0x7f800000u) == 0x7f800000u; };
inline constexpr auto nan_or_plus_inf_bits = [](std::uint32_t bits) {
  return bits == 0x7f800000u || (bits & 0x7fffffffu) > 0x7f800000u;
};

/// Throws specdec::Error, naming `who`, unless `row` holds numbers and -inf only (-inf: a token masked out) and
/// at least one number: the rows an acceptance policy's Session can choose from.
inline void check_logits_row(std::span<const float> row, const char* who) {
  if (const auto bad = first_bits_where(row, nan_or_plus_inf_bits))
    fail(who, " needs logits that are numbers or -inf, got ", row[*bad], " at column ", *bad);
  if (std::none_of(row.begin(), row.end(), [](float v) { return v != -INFINITY; }))
    fail(who, " got a logits row with no number in it (", row.size(), " columns, every one -inf or none)");
}

/// Sum of v[0..n) in double over 8 interleaved partial sums and a fixed tree: vectorisable (a single running
/// sum is latency-bound) and the same result on every call.
template <class T>
double sum_in_lanes(const T* v, std::size_t n) {
  double lanes[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) lanes[l] += static_cast<double>(v[i + l]);
  for (; i < n; ++i) lanes[i % 8] += static_cast<double>(v[i]);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

/// Calls visit(i) for every i < n where keep(i), in increasing order, and stops early when visit returns true
/// (then returns true). Finds them 64 at a time through a bit mask built by one vectorised compare, for rows
/// where few entries count: a branch per entry mispredicted on the scattered few.
template <class Keep, class Visit>
bool for_each_kept(std::size_t n, Keep&& keep, Visit&& visit) {
  for (std::size_t b = 0; b < n; b += 64) {
    const std::size_t width = std::min<std::size_t>(64, n - b);
    std::uint64_t bits = 0;
    for (std::size_t j = 0; j < width; ++j) bits |= static_cast<std::uint64_t>(keep(b + j) ? 1 : 0) << j;
    for (; bits != 0; bits &= bits - 1)
      if (visit(b + static_cast<std::size_t>(std::countr_zero(bits)))) return true;
  }
  return false;
}

/// Keeps the smallest set of most probable candidates (`order`: indices into `probs`, a distribution) whose mass
/// reaches top_p, by weighted quickselect in expected O(candidates); rank: higher probability first, lower index
/// first on a tie. Zeroes the rest, leaves the kept indices in `order` and returns their mass.
/// A kept entry i has mass(entries ranked at or after i) > 1 - top_p, all of them <= p_i, so n * p_i > 1 - top_p:
/// entries at or below (1 - top_p) / n need not be candidates.
inline double keep_top_p(std::vector<double>& probs, std::vector<std::uint32_t>& order, double top_p) {
  const auto more_probable = [&](std::uint32_t a, std::uint32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  // Invariant: order[0, lo) are all more probable than order[lo, ...) and hold mass `below` < top_p.
  std::size_t lo = 0, hi = order.size();
  double below = 0.0;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    std::nth_element(order.begin() + static_cast<std::ptrdiff_t>(lo), order.begin() + static_cast<std::ptrdiff_t>(mid),
                     order.begin() + static_cast<std::ptrdiff_t>(hi), more_probable);
    double mass = below;
    for (std::size_t i = lo; i < mid; ++i) mass += probs[order[i]];
    if (mass >= top_p) {
      hi = mid;
    } else {
      lo = mid;
      below = mass;
    }
  }
  // The top `hi` candidates are the smallest prefix whose mass reaches top_p (or all of them).
  for (std::size_t i = hi; i < order.size(); ++i) probs[order[i]] = 0.0;
  order.resize(hi);
  double kept = 0.0;
  for (std::uint32_t i : order) kept += probs[i];
  return kept;
}

}  // namespace detail

/// The index that transform_logits(row, params) puts all the mass on when its result is one-hot by construction,
/// else nullopt: the argmax at temperature 0, and with top_p < 1 a row with one clear winner (a prompt-lookup
/// draft's: 0 for its proposal, -1e30 elsewhere), whose every other weight e^((l - max)/T) is below e^-100, so
/// that the winner alone reaches top_p. A policy that learns this keeps no dense copy of the row's distribution.
/// Throws specdec::Error for parameters that validate() rejects and for an empty row.
inline std::optional<std::size_t> one_hot_index(std::span<const float> row, const SamplingParams& params) {
  validate(params);
  if (params.temperature != 0.0f && !(params.top_p < 1.0f)) return std::nullopt;
  const auto top = static_cast<std::size_t>(argmax(row));
  if (params.temperature == 0.0f) return top;
  const std::size_t n = row.size();
  const Eigen::Map<const Eigen::ArrayXf> logits(row.data(), static_cast<Eigen::Index>(n));
  const float second = std::max(top > 0 ? logits.head(static_cast<Eigen::Index>(top)).maxCoeff() : -INFINITY,
                                top + 1 < n ? logits.tail(static_cast<Eigen::Index>(n - top - 1)).maxCoeff() : -INFINITY);
  if (second < row[top] - 100.0f * params.temperature) return top;
  return std::nullopt;
}

namespace detail {

/// transform_logits for a row that one_hot_index() did not take: the full computation.
inline void transform_dense(std::span<const float> row, const SamplingParams& params, std::vector<double>& out) {
  const std::size_t n = row.size();
  out.assign(n, 0.0);
  const Eigen::Map<const Eigen::ArrayXf> logits(row.data(), static_cast<Eigen::Index>(n));
  const float max = logits.maxCoeff();
  if (!(max > -INFINITY)) fail("transform_logits of a row with no finite logit: every token masked out");
  const float inverse_t = 1.0f / params.temperature;
  // Eigen's vectorised exp, on every weight: an expression of the row's own length takes its last n % lanes
  // entries through the scalar std::exp, whose last bit can differ from the packet's. Equal logits then got
  // unequal weights (top-p's tie order, lower index first, broke), and a token's weight depended on the vector
  // width. A buffer padded to 16 lanes (a multiple of every packet) keeps all of them on the packet path.
  constexpr std::size_t lanes = 16;
  const auto padded = static_cast<Eigen::Index>((n + lanes - 1) / lanes * lanes);
  thread_local Eigen::ArrayXf buffer;  // reused: no allocation per row of the same length
  if (buffer.size() != padded) buffer.resize(padded);
  buffer.head(static_cast<Eigen::Index>(n)) = (logits - max) * inverse_t;
  buffer.tail(padded - static_cast<Eigen::Index>(n)).setZero();
  buffer = buffer.exp();
  Eigen::Map<Eigen::ArrayXf> weights(buffer.data(), static_cast<Eigen::Index>(n));
  // Below e^-87 a weight is 0: Eigen's vectorised exp clamps its argument at about -88.7, which left masked
  // tokens (-inf, -1e30) a weight of 3e-39 instead of 0 in whole vector packets (and exactly 0 in the tail).
  // A plain loop, which the compiler vectorises: an Eigen select() of the same test runs element by element, and
  // took its exps with it onto the scalar path (105 us a row of 49,152 against 12 us like this).
  float* w = weights.data();
  for (std::size_t i = 0; i < n; ++i)
    if ((row[i] - max) * inverse_t < -87.0f) w[i] = 0.0f;
  if (params.top_k > 0 && params.top_k < n) {
    std::vector<float> sorted(row.begin(), row.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(params.top_k - 1), sorted.end(),
                     std::greater<>());
    weights = (logits >= sorted[params.top_k - 1]).select(weights, 0.0f);
  }
  const double sum = sum_in_lanes(weights.data(), n);
  Eigen::Map<Eigen::ArrayXd> probs(out.data(), static_cast<Eigen::Index>(n));
  if (params.top_p >= 1.0f) {
    probs = weights.cast<double>() / sum;
    return;
  }
  // Top-p: only probabilities above (1 - top_p)/n can be kept (see keep_top_p), so the selection runs over those
  // candidates alone; a float pre-filter a little below the bound skips the rest cheaply.
  const double floor = (1.0 - static_cast<double>(params.top_p)) / static_cast<double>(n);
  const float prefilter = static_cast<float>(floor * sum * 0.999);
  thread_local std::vector<std::uint32_t> order;
  order.clear();
  for_each_kept(
      n, [&](std::size_t i) { return weights[static_cast<Eigen::Index>(i)] > prefilter; },
      [&](std::size_t i) {
        const double p = static_cast<double>(weights[static_cast<Eigen::Index>(i)]) / sum;
        if (p > floor) {
          out[i] = p;
          order.push_back(static_cast<std::uint32_t>(i));
        }
        return false;
      });
  if (order.empty()) {  // top_p so small that 1 - top_p rounds to 1: the floor is 1/n, which no entry exceeds
    const auto top = static_cast<std::size_t>(argmax(row));
    out[top] = static_cast<double>(weights[static_cast<Eigen::Index>(top)]) / sum;
    order.push_back(static_cast<std::uint32_t>(top));
  }
  const double kept = keep_top_p(out, order, static_cast<double>(params.top_p));
  for (std::uint32_t i : order) out[i] /= kept;
}

}  // namespace detail

namespace detail {

/// transform_logits without its checks of the row's values, for the acceptance policies: they check their rows
/// with check_logits_row(), and their parameters were validated once.
inline void transform_row(std::span<const float> row, const SamplingParams& params, std::vector<double>& out) {
  if (row.empty()) fail("transform_logits of an empty logits row");
  // A one-hot result takes two passes over the row instead of five (110 -> 20 us per row of 49k).
  if (const auto one = one_hot_index(row, params)) {
    out.assign(row.size(), 0.0);
    out[*one] = 1.0;
    return;
  }
  transform_dense(row, params, out);
}

}  // namespace detail

/// The transformed distribution of a logits row:
///   z = l / T;  keep z_i >= (k-th largest z) when top_k > 0;  p = softmax(z) over the kept tokens;
///   keep the smallest set of most probable tokens whose mass reaches top_p;  renormalise.
/// With T == 0 the result is one-hot on argmax(row). `out` is resized to row.size(); entries sum to 1.
/// Exponentials are taken in float (vectorised), sums in double. Throws specdec::Error for parameters that
/// validate() rejects, for an empty row, for a NaN or +inf logit (-inf is a token masked out) and, with
/// T > 0, for a row of -inf alone.
inline void transform_logits(std::span<const float> row, const SamplingParams& params, std::vector<double>& out) {
  validate(params);
  if (const auto bad = detail::first_bits_where(row, detail::nan_or_plus_inf_bits))
    detail::fail("transform_logits needs logits that are numbers or -inf, got ", row[*bad], " at column ", *bad);
  detail::transform_row(row, params, out);
}

/// Inverse-CDF sampling: the first index whose cumulative probability exceeds u * sum(probs).
/// Throws specdec::Error unless u is in [0, 1) and the sum of probs is positive and finite.
/// requires: probs non-negative. returns: an index into probs whose probability is positive.
inline Token sample_index(std::span<const double> probs, double u) {
  if (!(u >= 0.0 && u < 1.0)) detail::fail("sample_index needs u in [0, 1), got ", detail::exact(u));
  const double total = detail::sum_in_lanes(probs.data(), probs.size());
  if (!(total > 0.0 && std::isfinite(total)))
    detail::fail("sample_index needs probabilities with a positive, finite sum, got ", detail::exact(total), " over ",
                 probs.size(), " entries");
  const double target = u * total;
  double cumulative = 0.0;
  std::size_t last_positive = 0;
  // Top-k and top-p leave most entries 0. The scan stops at the chosen index, which is then the last positive
  // one seen; a scan that never passes target (rounding) ends at the very last positive entry.
  detail::for_each_kept(
      probs.size(), [&](std::size_t i) { return !(probs[i] <= 0.0); },
      [&](std::size_t i) {
        cumulative += probs[i];
        last_positive = i;
        return cumulative > target;
      });
  return static_cast<Token>(last_positive);
}

}  // namespace specdec
