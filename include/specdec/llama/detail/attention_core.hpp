// specdec/llama/detail/attention_core.hpp — what every attention path shares: the elementwise math of the
// forward pass (exp_approx and its vector twins, swiglu, softmax), AttentionGroup (the query rows of one kv head
// and its cache) and the portable path, whose bits the vector kernels reproduce.
// Entry points: detail::AttentionGroup, detail::attend_group_portable, detail::exp_approx, detail::swiglu.
// Read first: attention.hpp. Read next: attention_avx512.hpp, attention_avx2.hpp (the vector kernels).
//
// Everything here computes one query position from that position's inputs only, in an operation order fixed
// by the number of keys it sees, so the forward pass stays batch-invariant. exp_approx is plain float code
// (no libm call) with an AVX-512 twin, exp16; both perform the same IEEE operations and so give the same bits.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// The AVX2 twins (here and in attention_avx2.hpp) serve CPUs without AVX-512 (they need FMA and F16C too).
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECDEC_ATTENTION_AVX2 1
#endif

#include "specdec/error.hpp"
#include "specdec/llama/detail/compiler.hpp"
#include "specdec/llama/quant.hpp"

namespace specdec::llama::detail {

SPECDEC_AVX512_WARNINGS_OFF

/// e^x within about 2 ulp for x in [−87.3, 88.3]; inputs outside are clamped (so e^−1000 gives 1e−38, not 0),
/// NaN to −87.3 as vmaxps clamps it (so a NaN score weighs nothing, on every path alike).
/// Cody–Waite reduction x = k·ln2 + r, |r| <= ln2/2, then a degree-6 polynomial for e^r and 2^k from bits.
/// Every multiply-add is an explicit fma so that exp16 below, which mirrors it operation by operation, gives
/// the same bits: an element's value does not depend on whether it falls in a vector body or a scalar tail.
inline float exp_approx(float x) {
  x = x > -87.3f ? x : -87.3f;  // _mm512_max_ps(x, c): c where x is NaN
  x = x < 88.3f ? x : 88.3f;
  const float k = std::floor(std::fma(x, 1.44269504088896341f, 0.5f));
  float r = std::fma(-k, 0.693359375f, x);
  r = std::fma(-k, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float pr = p * r;
  const float e = std::fma(pr, r, r) + 1.0f;
  return e * std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<std::int32_t>(k) + 127) << 23);
}

#if defined(__AVX512F__)
/// exp_approx on 16 lanes, the same operations in the same order.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  SPECDEC_SIGN_WARNINGS_OFF  // unoptimised, GCC 12's _mm512_roundscale_ps is a macro (see quiet_warnings.hpp)
  const __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  SPECDEC_SIGN_WARNINGS_ON
  const __m512 neg_k = _mm512_sub_ps(_mm512_setzero_ps(), k);
  __m512 r = _mm512_fmadd_ps(neg_k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(neg_k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 pr = _mm512_mul_ps(p, r);
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(pr, r, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
}
#endif

#if defined(SPECDEC_ATTENTION_AVX2)
/// exp_approx on 8 lanes, the same operations in the same order.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  const __m256 neg_k = _mm256_sub_ps(_mm256_setzero_ps(), k);
  __m256 r = _mm256_fmadd_ps(neg_k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(neg_k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 pr = _mm256_mul_ps(p, r);
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(pr, r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}
#endif

/// gate[i] = SiLU(gate[i])·up[i] = gate[i] / (1 + e^−gate[i]) · up[i] for i < n. With a vector kernel the last
/// n % lanes elements go through it too, zero-padded: where an element falls (the callers split rows by position
/// count and thread) must not decide its bits, and a compiler that fuses a multiply and an add (GCC's default
/// -ffp-contract=fast, after inlining) may fuse them in a scalar tail and not in the vector body, or the reverse.
inline void swiglu(float* gate, const float* up, std::size_t n) {
#if defined(__AVX512F__) || defined(SPECDEC_ATTENTION_AVX2)
#if defined(__AVX512F__)
  constexpr std::size_t lanes = 16;
  const auto step = [](float* g_out, const float* u) {
    const __m512 g = _mm512_loadu_ps(g_out);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(g_out, _mm512_mul_ps(silu, _mm512_loadu_ps(u)));
  };
#else
  constexpr std::size_t lanes = 8;
  const auto step = [](float* g_out, const float* u) {
    const __m256 g = _mm256_loadu_ps(g_out);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(g_out, _mm256_mul_ps(silu, _mm256_loadu_ps(u)));
  };
#endif
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) step(gate + i, up + i);
  if (i < n) {
    float g[lanes] = {}, u[lanes] = {};
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    step(g, u);
    std::copy(g, g + (n - i), gate + i);
  }
#else
  for (std::size_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Attention of the query heads that share one kv head (grouped-query attention), at one or more consecutive
// positions. A row is one (position, head); the AVX-512 kernel passes over the keys and values once for up to 6
// rows, the AVX2 kernel for up to 3 heads of one position, and each row's arithmetic is the same whether it
// shares a pass or not.
//
// Keys are read from a transposed copy in blocks of 16 positions, [block][head_dim][16], so that 16 scores
// come out of plain vector FMAs with no horizontal sum; values are rows [position, head_dim]. Keys and values
// are stored as float, as IEEE half-precision bit patterns (std::uint16_t, KvFormat::f16) or as 8-bit integers
// with one float scale per stored row (std::int8_t, KvFormat::q8: a key or value row is its integers times its
// scale), which every path widens to float exactly before use; the arithmetic below is the same for all. Per
// (head, key) the float sequence is fixed by head_dim and the number of keys only:
//   score: four chains over the quarters of head_dim, each q[c]·k[c] for its first c then fma in order of c;
//          s = ((s0 + s1) + (s2 + s3))·scale (one chain over all of head_dim when head_dim % 4 != 0); with
//          row scales s = (((s0 + s1) + (s2 + s3))·key_scale[j])·scale;
//   softmax: max (exact in any order), e^(s − max) by exp_approx, the sum in 16 partial sums by key index
//          and a fixed tree;
//   output: per element, fma over keys in order from zero of the weight e^(s − max) (times value_scale[j], one
//          rounding, with row scales: scale_value_weights) and the value, then × 1/sum.
// attend_group_portable and the AVX-512 and AVX2 kernels perform exactly these operations, so they give the same
// bits.

inline constexpr std::size_t key_block = 16;  // positions per block of the transposed keys
inline constexpr std::size_t max_attention_rows = 64;  // heads × positions of one attend_group call, at most
inline constexpr std::size_t max_head_dim = 256;  // the AVX-512 kernel's limit (the portable path has none)
/// Rows that one pass of the vector kernel serves with each key and value it loads, at most: with AVX-512 rows of
/// any positions, with AVX2 heads of one position (for_head_passes_avx2); 1 on the portable path (a pass per row).
#if defined(__AVX512F__)
inline constexpr std::size_t rows_per_pass = 6;
inline constexpr bool passes_span_positions = true;
#elif defined(SPECDEC_ATTENTION_AVX2)
inline constexpr std::size_t rows_per_pass = 3;
inline constexpr bool passes_span_positions = false;
#else
inline constexpr std::size_t rows_per_pass = 1;
inline constexpr bool passes_span_positions = false;
#endif

/// Whether attend_group takes the vector kernel for head_dim d (else the portable path, a pass per row).
inline bool vector_attention(std::size_t d) {
#if defined(__AVX512F__)
  return d % 64 == 0 && d <= max_head_dim;
#elif defined(SPECDEC_ATTENTION_AVX2)
  return d % 64 == 0;
#else
  (void)d;
  return false;
#endif
}

inline std::size_t score_chains(std::size_t d) { return d % 4 == 0 ? 4 : 1; }

/// lanes[l] = op(lanes[l], lanes[l + w]) for w = 8, 4, 2, 1, l < w; returns lanes[0]: fold_by_lanes's last step.
template <class T, class Op>
T fold_lanes(T* lanes, Op&& op) {
  for (std::size_t width = 8; width > 0; width /= 2)
    for (std::size_t l = 0; l < width; ++l) lanes[l] = op(lanes[l], lanes[l + width]);
  return lanes[0];
}

/// Folds term(0..n) with op in 16 partial results by index (lanes[j % 16], starting from `init`), then
/// lanes[l] = op(lanes[l], lanes[l + w]) for w = 8, 4, 2, 1: the same order for every n, and it vectorises
/// where one running result would be a serial chain.
template <class T, class Term, class Op>
T fold_by_lanes(std::size_t n, T init, Term&& term, Op&& op) {
  T lanes[16];
  std::fill(lanes, lanes + 16, init);
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (std::size_t l = 0; l < 16; ++l) lanes[l] = op(lanes[l], term(j + l));
  for (; j < n; ++j) lanes[j % 16] = op(lanes[j % 16], term(j));
  return fold_lanes(lanes, op);
}

inline float add_floats(float a, float b) { return a + b; }
/// a unless b is greater: a NaN b is skipped, and of +0 and −0 the first stays (as _mm512_max_ps(b, a) does).
inline float max_floats(float a, float b) { return std::max(a, b); }

/// Sum of scores[0..n), by fold_by_lanes.
inline float sum_by_lanes(const float* scores, std::size_t n) {
  return fold_by_lanes(n, 0.0f, [scores](std::size_t j) { return scores[j]; }, add_floats);
}

/// Max of scores[0..n), by fold_by_lanes (a max is exact in any order; NaNs are skipped, and ±0 both give the
/// same weights e^(s − max)).
inline float max_by_lanes(const float* scores, std::size_t n) {
  return fold_by_lanes(n, -INFINITY, [scores](std::size_t j) { return scores[j]; }, max_floats);
}

/// The softmax weights of n scores in place, s[j] = e^(s[j] − max) by exp_approx with max = max_by_lanes(s, n),
/// and returns their sum by sum_by_lanes. The reference sequence that softmax_row performs with vectors.
inline float softmax_row_portable(float* s, std::size_t n) {
  const float max = max_by_lanes(s, n);
  for (std::size_t j = 0; j < n; ++j) s[j] = exp_approx(s[j] - max);
  return sum_by_lanes(s, n);
}

/// softmax_row_portable's operations in two vector passes: the max, then the exponentials and their sum
/// together. A vector accumulator's lane l takes the scores j ≡ l (mod 16) in order of j, as fold_by_lanes's
/// partial results do, and fold_lanes finishes both folds as it does; so the bits are the same. (Against three
/// passes, the max and the sum scalar folds, forwards of SmolLM2 at context 256 on 2 threads took 0.97x the time
/// at 9 positions, 0.98x at 5, 0.998x at 1, the attention stage 0.87-0.94x, alternating call by call.)
inline float softmax_row(float* s, std::size_t n) {
#if defined(__AVX512F__)
  const std::size_t body = n / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (n - body)) - 1);
  float lanes[16];
  __m512 max = _mm512_set1_ps(-INFINITY);
  for (std::size_t j = 0; j < body; j += 16) max = _mm512_max_ps(_mm512_loadu_ps(s + j), max);
  max = _mm512_mask_max_ps(max, tail, _mm512_maskz_loadu_ps(tail, s + body), max);
  _mm512_storeu_ps(lanes, max);
  const __m512 shift = _mm512_set1_ps(fold_lanes(lanes, max_floats));
  __m512 sum = _mm512_setzero_ps();
  for (std::size_t j = 0; j < body; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), shift));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + body), shift));
  _mm512_mask_storeu_ps(s + body, tail, e);
  _mm512_storeu_ps(lanes, _mm512_mask_add_ps(sum, tail, sum, e));
  return fold_lanes(lanes, add_floats);
#elif defined(SPECDEC_ATTENTION_AVX2)
  const std::size_t body = n / 16 * 16;
  float lanes[16];
  __m256 max[2] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY)};
  for (std::size_t j = 0; j < body; j += 16)
    SPECDEC_UNROLL for (int half = 0; half < 2; ++half)
      max[half] = _mm256_max_ps(_mm256_loadu_ps(s + j + 8 * half), max[half]);
  SPECDEC_UNROLL for (int half = 0; half < 2; ++half) _mm256_storeu_ps(lanes + 8 * half, max[half]);
  for (std::size_t j = body; j < n; ++j) lanes[j % 16] = max_floats(lanes[j % 16], s[j]);
  const float m = fold_lanes(lanes, max_floats);
  const __m256 shift = _mm256_set1_ps(m);
  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (std::size_t j = 0; j < body; j += 16)
    SPECDEC_UNROLL for (int half = 0; half < 2; ++half) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8 * half), shift));
      _mm256_storeu_ps(s + j + 8 * half, e);
      sum[half] = _mm256_add_ps(sum[half], e);
    }
  SPECDEC_UNROLL for (int half = 0; half < 2; ++half) _mm256_storeu_ps(lanes + 8 * half, sum[half]);
  for (std::size_t j = body; j < n; ++j) lanes[j % 16] += (s[j] = exp_approx(s[j] - m));
  return fold_lanes(lanes, add_floats);
#else
  return softmax_row_portable(s, n);
#endif
}

/// A stored key or value as float: itself, a half-precision bit pattern widened, or an 8-bit integer (before its
/// row's scale); all exact.
inline float kv_to_float(float v) { return v; }
inline float kv_to_float(std::uint16_t h) { return gguf::fp16_to_float(h); }
inline float kv_to_float(std::int8_t i) { return static_cast<float>(i); }

/// Stores a row of n floats as 8-bit integers (KvFormat::q8) and returns their scale: scale = max |x| / 127,
/// out[i] = x[i] / scale rounded to the nearest integer, ties to even (0 for a row of zeros; a division, not a
/// multiplication by 1/scale, which overflows for rows under about 3e-37). NaNs are skipped in the max and
/// stored as 0; a row with an infinite value gets an infinite scale and zeros, so the scores or outputs that
/// use it turn NaN (the f16 cache stores such values as infinities, with like results). Scalar code: the same
/// bits on every path and thread, so the cache stays batch-invariant.
inline float quantize_kv_row(const float* x, std::size_t n, std::int8_t* out) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.0f;
  for (std::size_t i = 0; i < n; ++i) {
    // nearbyint: the default rounding mode, to nearest with ties to even; NaN (x / inf, inf / inf) stored as 0
    const float v = scale > 0.0f ? std::nearbyint(x[i] / scale) : 0.0f;
    out[i] = static_cast<std::int8_t>(v >= 127.0f ? 127.0f : v <= -127.0f ? -127.0f : v == v ? v : 0.0f);
  }
  return scale;
}

/// Geometry of one attend_group call: the query heads that share one kv head, at `positions` consecutive
/// positions, position p (0-based within the call) seeing keys + p keys. Its rows are (position, head) in that
/// order, row r = p·heads + h. q rows and out rows are head_dim floats at the given strides; scores is scratch
/// of rows() × score_stride floats with score_stride >= the last position's keys rounded up to 16.
/// T: the stored keys' and values' element, float, std::uint16_t (half-precision bits) or std::int8_t (with
/// key_scales and value_scales, one float per stored position).
template <class T>
struct AttentionGroup {
  const float* q;            // [positions][heads] rows at q_position_stride, q_stride
  std::size_t q_stride;
  std::size_t heads;         // query heads sharing this kv head
  const T* keys_t;           // transposed key blocks of this kv head: [ceil(keys / 16)][d][16]
  const T* values;           // [keys, d]
  std::size_t keys;          // keys seen by the first position
  std::size_t d;             // head_dim
  float scale;               // 1/√d
  float* scores;             // scratch
  std::size_t score_stride;
  float* out;                // [positions][heads] rows at out_position_stride, out_stride
  std::size_t out_stride;
  std::size_t positions = 1;
  std::size_t q_position_stride = 0;
  std::size_t out_position_stride = 0;
  // std::int8_t only: a scale per stored key row, [the last position's keys rounded up to 16] (the vector score
  // kernels read whole blocks; past the keys any value does), and per value row, [the last position's keys].
  const float* key_scales = nullptr;
  const float* value_scales = nullptr;

  static constexpr bool scaled = std::is_same_v<T, std::int8_t>;

  std::size_t rows() const { return heads * positions; }
  const float* q_row(std::size_t r) const { return q + (r / heads) * q_position_stride + (r % heads) * q_stride; }
  float* out_row(std::size_t r) const { return out + (r / heads) * out_position_stride + (r % heads) * out_stride; }
  float* score_row(std::size_t r) const { return scores + r * score_stride; }
  std::size_t row_keys(std::size_t r) const { return keys + r / heads; }
};

/// Softmax of each row's scores in place (weights e^(s − max)) and 1/sum per row, by softmax_row or, on the
/// portable path, softmax_row_portable.
template <class T>
void softmax_rows(const AttentionGroup<T>& a, float* inverse, bool portable = false) {
  for (std::size_t r = 0; r < a.rows(); ++r)
    inverse[r] = 1.0f / (portable ? softmax_row_portable : softmax_row)(a.score_row(r), a.row_keys(r));
}

/// With row scales, each row's softmax weights times the value rows' scales, in place after softmax_rows (whose
/// sums used the weights alone): one rounding per weight, the same on every path. With the product taken per
/// key and row inside the value loops instead, q8 forwards of 9 positions took 1.00x the time of f16 ones at
/// context 1024 and 0.98x at 4096; with this, 0.955x and 0.95x (alternating with f16 in one process).
template <class T>
void scale_value_weights(const AttentionGroup<T>& a) {
  if constexpr (AttentionGroup<T>::scaled)
    for (std::size_t r = 0; r < a.rows(); ++r) {
      float* p = a.score_row(r);
      for (std::size_t j = 0; j < a.row_keys(r); ++j) p[j] = p[j] * a.value_scales[j];
    }
  else
    (void)a;
}

/// Throws specdec::Error unless a.rows() <= max_attention_rows, the rows that attend_group's stack arrays hold.
template <class T>
void check_attention_rows(const AttentionGroup<T>& a) {
  if (a.rows() > max_attention_rows)
    specdec::detail::fail("attention group of ", a.heads, " heads at ", a.positions, " positions has ", a.rows(),
                          " rows, at most ", max_attention_rows, " allowed");
}

/// The portable path of attend_group (also the reference for the vector kernels). Throws as check_attention_rows.
template <class T>
void attend_group_portable(const AttentionGroup<T>& a) {
  check_attention_rows(a);
  const std::size_t chains = score_chains(a.d), part = a.d / chains;
  for (std::size_t r = 0; r < a.rows(); ++r) {
    const float* q = a.q_row(r);
    for (std::size_t j = 0; j < a.row_keys(r); ++j) {
      const T* block = a.keys_t + (j / key_block) * a.d * key_block + j % key_block;
      float partial[4];
      for (std::size_t m = 0; m < chains; ++m) {
        const std::size_t c0 = m * part;
        float s = q[c0] * kv_to_float(block[c0 * key_block]);
        for (std::size_t c = c0 + 1; c < c0 + part; ++c) s = std::fma(q[c], kv_to_float(block[c * key_block]), s);
        partial[m] = s;
      }
      float total = chains == 4 ? (partial[0] + partial[1]) + (partial[2] + partial[3]) : partial[0];
      if constexpr (AttentionGroup<T>::scaled) total = total * a.key_scales[j];
      a.score_row(r)[j] = total * a.scale;
    }
  }
  float inverse[max_attention_rows];
  softmax_rows(a, inverse, /*portable=*/true);
  scale_value_weights(a);
  for (std::size_t r = 0; r < a.rows(); ++r) {
    const float* p = a.score_row(r);
    float* out = a.out_row(r);
    for (std::size_t c = 0; c < a.d; ++c) {
      float acc = 0.0f;
      for (std::size_t j = 0; j < a.row_keys(r); ++j)
        acc = std::fma(p[j], kv_to_float(a.values[j * a.d + c]), acc);
      out[c] = acc * inverse[r];
    }
  }
}

SPECDEC_AVX512_WARNINGS_ON

}  // namespace specdec::llama::detail
