// specdec/llama/detail/attention.hpp — per-position attention and the elementwise math of the forward pass.
// Entry points: detail::attend_group, detail::exp_approx. Read first: ../llama_model.hpp.
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

// The AVX2 twins below serve CPUs without AVX-512 (they need FMA and F16C too).
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECDEC_ATTENTION_AVX2 1
#endif

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
  const __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
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

/// gate[i] = SiLU(gate[i])·up[i] = gate[i] / (1 + e^−gate[i]) · up[i] for i < n.
inline void swiglu(float* gate, const float* up, std::size_t n) {
  std::size_t i = 0;
#if defined(__AVX512F__)
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
#elif defined(SPECDEC_ATTENTION_AVX2)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (const std::size_t body = n / 8 * 8; i < body; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
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

/// The portable path of attend_group (also the reference for the vector kernels).
template <class T>
void attend_group_portable(const AttentionGroup<T>& a) {
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

#if defined(__AVX512F__)
// SPECDEC_IN_REGISTER below: for several heads GCC would load the same line once per FMA (30% slower here).

/// 16 stored keys or values as floats (half precision widened exactly by vcvtph2ps).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const std::uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const std::int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

/// Scores of H rows (H <= 6) r0.. for all keys of the last of them, 16 keys per step: each key column is
/// loaded once for all H rows (a row with fewer keys computes a few scores it never reads).
/// requires: d % 4 == 0, 4 <= d <= max_head_dim.
template <int H, class T>
void group_scores_avx512(const AttentionGroup<T>& a, std::size_t r0) {
  const std::size_t part = a.d / 4, blocks = (a.row_keys(r0 + H - 1) + key_block - 1) / key_block;
  // The rows' query values in the order the loop below reads them, qs[(c·4 + m)·H + h] = q_h[m·part + c], so that
  // the broadcasts address one pointer with fixed offsets. Read from the H rows, GCC ran out of registers for the
  // addresses and reloaded them from the stack between FMAs; with the copy, forwards of 9 positions took 0.99x
  // the time and the attention stage 0.96x (5 positions: 0.999x, 0.97x; 1: no change), alternating call by call.
  alignas(64) float qs[max_head_dim * rows_per_pass];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
    const float* q = a.q_row(r0 + h);
    for (std::size_t c = 0; c < part; ++c)
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) qs[(c * 4 + m) * H + h] = q[m * part + c];
  }
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (std::size_t b = 0; b < blocks; ++b) {
    const T* block = a.keys_t + b * a.d * key_block;
    // A block is d cache lines (a 4 KiB page at d = 64 in float), where the hardware prefetcher stops: each
    // column's load asks for the same column of the next block, into L2 (hint T1; into L1, T0, forwards at
    // context 318 took 1.02-1.05x the time at 1 position and 1.01-1.03x at 5, alternating call by call).
    const T* next = b + 1 < blocks ? block + a.d * key_block : block;
    __m512 acc[H][4];
    SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
      _mm_prefetch(reinterpret_cast<const char*>(next + m * part * key_block), _MM_HINT_T1);
      const __m512 k = load16(block + m * part * key_block);
      SPECDEC_UNROLL for (int h = 0; h < H; ++h) acc[h][m] = _mm512_mul_ps(_mm512_set1_ps(qs[m * H + h]), k);
    }
    // The values of this block's keys (16 rows, d cache lines in float) are asked into L2 a line per column, so
    // they stream in beside the keys instead of after them. In f16 they are d / 2 lines and the rest of the
    // requests reach into the next block's values (or, for the last block, past them: a prefetch never faults);
    // limiting them to the block's own lines measured no faster (2.73-2.84 against 2.64-2.80 ms per forward).
    const std::uintptr_t values = reinterpret_cast<std::uintptr_t>(a.values + b * key_block * a.d);
    for (std::size_t c = 1; c < part; ++c) {
      const float* qc = qs + c * 4 * H;
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
        const std::size_t col = m * part + c;
        _mm_prefetch(reinterpret_cast<const char*>(next + col * key_block), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(values + (c * 4 + m) * 64), _MM_HINT_T1);
        __m512 k = load16(block + col * key_block);
        SPECDEC_IN_REGISTER(k);  // one load for all rows, the query values broadcast from memory
        SPECDEC_UNROLL for (int h = 0; h < H; ++h)
          acc[h][m] = _mm512_fmadd_ps(_mm512_set1_ps(qc[m * H + h]), k, acc[h][m]);
      }
    }
    SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
      __m512 total = _mm512_add_ps(_mm512_add_ps(acc[h][0], acc[h][1]), _mm512_add_ps(acc[h][2], acc[h][3]));
      // The last block's scales past the keys may be stale or unset: those scores are never read.
      if constexpr (AttentionGroup<T>::scaled) total = _mm512_mul_ps(total, _mm512_loadu_ps(a.key_scales + b * key_block));
      _mm512_storeu_ps(a.score_row(r0 + h) + b * key_block, _mm512_mul_ps(total, scale));
    }
  }
}

/// Output rows r0.. (H <= 6) for 64 columns at c0: per element an fma chain over the row's keys in order. Each
/// value row is loaded once for all H rows; past the first row's keys, a row takes part only while it has keys.
template <int H, class T>
void group_values_avx512(const AttentionGroup<T>& a, std::size_t r0, std::size_t c0, const float* inverse) {
  __m512 acc[H][4];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h)
    SPECDEC_UNROLL for (int v = 0; v < 4; ++v) acc[h][v] = _mm512_setzero_ps();
  const float* p[H];
  std::size_t keys[H];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) p[h] = a.score_row(r0 + h), keys[h] = a.row_keys(r0 + h);
  const auto step = [&](std::size_t j, auto&& takes_part) {
    const T* row = a.values + j * a.d + c0;
    __m512 v[4];
    SPECDEC_UNROLL for (int i = 0; i < 4; ++i) {
      v[i] = load16(row + 16 * i);
      SPECDEC_IN_REGISTER(v[i]);  // loaded once, not once per row as a memory operand
    }
    SPECDEC_UNROLL for (int h = 0; h < H; ++h)
      if (takes_part(h)) {
        const __m512 w = _mm512_set1_ps(p[h][j]);
        SPECDEC_UNROLL for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_fmadd_ps(w, v[i], acc[h][i]);
      }
  };
  std::size_t j = 0;
  for (; j < keys[0]; ++j) step(j, [](int) { return true; });
  for (; j < keys[H - 1]; ++j) step(j, [&](int h) { return j < keys[h]; });
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
    float* out = a.out_row(r0 + h) + c0;
    const __m512 inv = _mm512_set1_ps(inverse[r0 + h]);
    SPECDEC_UNROLL for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(acc[h][i], inv));
  }
}

/// Calls Step<H>::run(r0, args...) over the rows in passes of at most rows_per_pass (6), as even as they come.
template <template <int> class Step, typename... Args>
void for_row_chunks(std::size_t rows, Args&&... args) {
  const std::size_t passes = (rows + rows_per_pass - 1) / rows_per_pass;
  for (std::size_t pass = 0, r0 = 0; pass < passes; ++pass) {
    const std::size_t size = rows / passes + (pass < rows % passes ? 1 : 0);
    switch (size) {
      case 1: Step<1>::run(r0, args...); break;
      case 2: Step<2>::run(r0, args...); break;
      case 3: Step<3>::run(r0, args...); break;
      case 4: Step<4>::run(r0, args...); break;
      case 5: Step<5>::run(r0, args...); break;
      default: Step<6>::run(r0, args...); break;
    }
    r0 += size;
  }
}

template <int H>
struct ScoreStep {
  template <class T>
  static void run(std::size_t r0, const AttentionGroup<T>& a) { group_scores_avx512<H>(a, r0); }
};
template <int H>
struct ValueStep {
  template <class T>
  static void run(std::size_t r0, const AttentionGroup<T>& a, std::size_t c0, const float* inverse) {
    group_values_avx512<H>(a, r0, c0, inverse);
  }
};
#endif

#if defined(SPECDEC_ATTENTION_AVX2)
/// 8 stored keys or values as floats (half precision widened exactly by vcvtph2ps).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const std::int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

/// Key block b (of `blocks`) of a's transposed keys for the AVX2 score kernels, and the lines they ask for ahead
/// (see row_scores_avx2): the same columns of the next block (for the last block, its own) and this block's
/// values.
template <class T>
struct KeyBlockAvx2 {
  const T* keys;          // this block: [d][16]
  const T* next;          // the next block (this one for the last)
  std::uintptr_t values;  // this block's 16 value rows, [16][d]

  KeyBlockAvx2(const AttentionGroup<T>& a, std::size_t b, std::size_t blocks)
      : keys(a.keys_t + b * a.d * key_block), next(b + 1 < blocks ? keys + a.d * key_block : keys),
        values(reinterpret_cast<std::uintptr_t>(a.values + b * key_block * a.d)) {}
  /// Keys 8·half.. of column col, as floats.
  SPECDEC_ALWAYS_INLINE __m256 load(std::size_t col, int half) const {
    return load8(keys + col * key_block + 8 * half);
  }
  /// Asks, into L2, for column col of the next block.
  SPECDEC_ALWAYS_INLINE void ask(std::size_t col) const {
    _mm_prefetch(reinterpret_cast<const char*>(next + col * key_block), _MM_HINT_T1);
  }
  /// Asks, into L2, for column col of the next block and the values' line `line` from this block's.
  SPECDEC_ALWAYS_INLINE void ask(std::size_t col, std::size_t line) const {
    ask(col);
    _mm_prefetch(reinterpret_cast<const char*>(values + line * 64), _MM_HINT_T1);
  }
};

/// Stores row r's scores of keys b·16 + 8·half.. from its four chains: ((acc[0] + acc[1]) + (acc[2] + acc[3])),
/// times the keys' row scales with row scales, times scale.
template <class T>
SPECDEC_ALWAYS_INLINE void store_scores_avx2(const AttentionGroup<T>& a, std::size_t r, std::size_t b, int half,
                                             const __m256 (&acc)[4], __m256 scale) {
  __m256 total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  // The last block's scales past the keys may be stale or unset: those scores are never read.
  if constexpr (AttentionGroup<T>::scaled)
    total = _mm256_mul_ps(total, _mm256_loadu_ps(a.key_scales + b * key_block + 8 * half));
  _mm256_storeu_ps(a.score_row(r) + b * key_block + 8 * half, _mm256_mul_ps(total, scale));
}

/// Scores of one row for all its keys, 16 keys per step as two 8-lane halves side by side (4 chains each: 8
/// accumulators). requires: d % 4 == 0.
/// In a group of at most 5 positions each column's load asks, into L2, for the same column of the next block and
/// for a line of values (this block's and, for f16 and q8, the next's), as group_scores_avx512 does. Built for
/// AVX2 and run on the Zen 4 of 2026-12-05 (forwards of SmolLM2 at context 256, 2 threads, quantized_dot,
/// alternating round by round in one process, medians of 40 forwards a round), against asking for nothing: at
/// one position the attention stage took 0.78-0.80x the time and the forward 0.955x (12 rounds; quantized 0.98x,
/// 8 rounds), at 2 positions 0.79x and 0.96x, at 5 0.94x and 0.99x, but at 9 1.15x and 1.03x (asking in the
/// rows of the first position only: 1.13x and 1.035x).
template <class T>
void row_scores_avx2(const AttentionGroup<T>& a, std::size_t r) {
  const std::size_t part = a.d / 4, blocks = (a.row_keys(r) + key_block - 1) / key_block;
  const float* q = a.q_row(r);
  const __m256 scale = _mm256_set1_ps(a.scale);
  const bool ask = a.positions <= 5;
  for (std::size_t b = 0; b < blocks; ++b) {
    const KeyBlockAvx2<T> block(a, b, blocks);
    __m256 acc[2][4];
    SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
      if (ask) block.ask(m * part);
      const __m256 qv = _mm256_set1_ps(q[m * part]);
      SPECDEC_UNROLL for (int half = 0; half < 2; ++half) acc[half][m] = _mm256_mul_ps(qv, block.load(m * part, half));
    }
    for (std::size_t c = 1; c < part; ++c)
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
        const std::size_t col = m * part + c;
        if (ask) block.ask(col, c * 4 + m);
        const __m256 qv = _mm256_set1_ps(q[col]);
        SPECDEC_UNROLL for (int half = 0; half < 2; ++half)
          acc[half][m] = _mm256_fmadd_ps(qv, block.load(col, half), acc[half][m]);
      }
    SPECDEC_UNROLL for (int half = 0; half < 2; ++half) store_scores_avx2(a, r, b, half, acc[half], scale);
  }
}

/// Scores of H rows r0.. of one position (2 <= H <= 3) for all their keys, as row_scores_avx2 computes each,
/// but the two 8-lane halves of a step one after the other (4 chains per row and half: 4·H accumulators, which
/// fit AVX2's 16 registers), each key column loaded and widened once for all H rows; it asks for the same lines
/// as row_scores_avx2, in the first half. requires: d % 4 == 0.
template <int H, class T>
void group_scores_avx2(const AttentionGroup<T>& a, std::size_t r0) {
  static_assert(H >= 2 && H <= 3);
  const std::size_t part = a.d / 4, blocks = (a.row_keys(r0) + key_block - 1) / key_block;
  const float* q[H];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) q[h] = a.q_row(r0 + h);
  const __m256 scale = _mm256_set1_ps(a.scale);
  const bool ask = a.positions <= 5;
  for (std::size_t b = 0; b < blocks; ++b) {
    const KeyBlockAvx2<T> block(a, b, blocks);
    SPECDEC_UNROLL for (int half = 0; half < 2; ++half) {
      const bool asks = ask && half == 0;
      __m256 acc[H][4];
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
        if (asks) block.ask(m * part);
        const __m256 k = block.load(m * part, half);
        SPECDEC_UNROLL for (int h = 0; h < H; ++h) acc[h][m] = _mm256_mul_ps(_mm256_set1_ps(q[h][m * part]), k);
      }
      for (std::size_t c = 1; c < part; ++c)
        SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
          const std::size_t col = m * part + c;
          if (asks) block.ask(col, c * 4 + m);
          __m256 k = block.load(col, half);
          SPECDEC_IN_REGISTER(k);  // widened once for all rows
          SPECDEC_UNROLL for (int h = 0; h < H; ++h)
            acc[h][m] = _mm256_fmadd_ps(_mm256_set1_ps(q[h][col]), k, acc[h][m]);
        }
      SPECDEC_UNROLL for (int h = 0; h < H; ++h) store_scores_avx2(a, r0 + h, b, half, acc[h], scale);
    }
  }
}

/// Output rows r0.. of one position (H <= 3) for 8·V columns at c0 (H·V accumulators): per element an fma chain
/// over the rows' keys in order, each value loaded and widened once for all H rows. requires: c0 + 8·V <= d.
template <int H, int V, class T>
void group_values_avx2(const AttentionGroup<T>& a, std::size_t r0, std::size_t c0, const float* inverse) {
  static_assert(H >= 1 && H <= 3 && H * V <= 12);
  __m256 acc[H][V];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h)
    SPECDEC_UNROLL for (int i = 0; i < V; ++i) acc[h][i] = _mm256_setzero_ps();
  const float* p[H];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) p[h] = a.score_row(r0 + h);
  for (std::size_t j = 0; j < a.row_keys(r0); ++j) {
    const T* row = a.values + j * a.d + c0;
    __m256 w[H];
    SPECDEC_UNROLL for (int h = 0; h < H; ++h) w[h] = _mm256_set1_ps(p[h][j]);
    SPECDEC_UNROLL for (int i = 0; i < V; ++i) {
      __m256 v = load8(row + 8 * i);
      SPECDEC_IN_REGISTER(v);
      SPECDEC_UNROLL for (int h = 0; h < H; ++h) acc[h][i] = _mm256_fmadd_ps(w[h], v, acc[h][i]);
    }
  }
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
    float* out = a.out_row(r0 + h) + c0;
    const __m256 inv = _mm256_set1_ps(inverse[r0 + h]);
    SPECDEC_UNROLL for (int i = 0; i < V; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[h][i], inv));
  }
}

/// Calls fn(r0, std::integral_constant<int, H>{}) for the rows of each of `positions` positions in passes of at
/// most rows_per_pass (3) of its `heads` rows, as even as they come.
template <class Fn>
void for_head_passes_avx2(std::size_t heads, std::size_t positions, Fn&& fn) {
  static_assert(rows_per_pass == 3);
  const std::size_t passes = (heads + rows_per_pass - 1) / rows_per_pass;
  for (std::size_t p = 0; p < positions; ++p)
    for (std::size_t pass = 0, h0 = 0; pass < passes; ++pass) {
      const std::size_t size = heads / passes + (pass < heads % passes ? 1 : 0), r0 = p * heads + h0;
      if (size == 1) fn(r0, std::integral_constant<int, 1>{});
      else if (size == 2) fn(r0, std::integral_constant<int, 2>{});
      else fn(r0, std::integral_constant<int, 3>{});
      h0 += size;
    }
}
#endif

/// out[r] = softmax(q_r·Kᵀ·scale)·V over the row's keys for each row r = (position, query head) of a group
/// sharing one kv head. requires: rows() <= max_attention_rows. `portable` forces the portable path (same bits).
template <class T>
void attend_group(const AttentionGroup<T>& a, bool portable = false) {
#if defined(__AVX512F__)
  if (!portable && vector_attention(a.d)) {
    for_row_chunks<ScoreStep>(a.rows(), a);
    float inverse[max_attention_rows];
    softmax_rows(a, inverse);
    scale_value_weights(a);
    for (std::size_t c0 = 0; c0 < a.d; c0 += 64) for_row_chunks<ValueStep>(a.rows(), a, c0, inverse);
    return;
  }
#elif defined(SPECDEC_ATTENTION_AVX2)
  if (!portable && vector_attention(a.d)) {
    for_head_passes_avx2(a.heads, a.positions, [&](std::size_t r0, auto rows) {
      if constexpr (decltype(rows)::value == 1) row_scores_avx2(a, r0);
      else group_scores_avx2<decltype(rows)::value>(a, r0);
    });
    float inverse[max_attention_rows];
    softmax_rows(a, inverse);
    scale_value_weights(a);
    // 64 columns a call for one head (8 chains), 32 for two or three (8 or 12): with 16 columns, three heads'
    // 6 chains were bound by the FMA latency (3.8-4.0 µs a call in cache against 3.4-3.6).
    for_head_passes_avx2(a.heads, a.positions, [&](std::size_t r0, auto rows) {
      constexpr int H = decltype(rows)::value, V = H == 1 ? 8 : 4;
      for (std::size_t c0 = 0; c0 < a.d; c0 += 8 * V) group_values_avx2<H, V>(a, r0, c0, inverse);
    });
    return;
  }
#endif
  (void)portable;
  attend_group_portable(a);
}

SPECDEC_AVX512_WARNINGS_ON

}  // namespace specdec::llama::detail
