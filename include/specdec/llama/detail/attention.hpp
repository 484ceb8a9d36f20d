// specdec/llama/detail/attention.hpp — per-position attention and the elementwise math of the forward pass.
// Entry points: detail::attend, detail::exp_approx. Read first: ../llama_model.hpp.
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

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specdec::llama::detail {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 flags the _mm512_undefined_ps() inside its own intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// e^x within about 2 ulp for x in [−87.3, 88.3]; inputs outside are clamped (so e^−1000 gives 1e−38, not 0).
/// Cody–Waite reduction x = k·ln2 + r, |r| <= ln2/2, then a degree-6 polynomial for e^r and 2^k from bits.
/// Every multiply-add is an explicit fma so that exp16 below, which mirrors it operation by operation, gives
/// the same bits: an element's value does not depend on whether it falls in a vector body or a scalar tail.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
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

/// v[i] = e^(v[i] − shift) for i < n.
inline void exp_shifted(float* v, std::size_t n, float shift) {
  std::size_t i = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(shift);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i), s)));
#endif
  for (; i < n; ++i) v[i] = exp_approx(v[i] - shift);
}

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
#endif
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

/// Sum of a[i]·b[i] in 16 interleaved partial sums and a fixed reduction tree (vectorisable, deterministic).
inline float dot(const float* a, const float* b, std::size_t n) {
  float lanes[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (std::size_t l = 0; l < 16; ++l) lanes[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) lanes[i % 16] += a[i] * b[i];
  for (std::size_t width = 8; width > 0; width /= 2)
    for (std::size_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

/// out = softmax(q·Kᵀ·scale)·V for one query head over keys 0..keys_seen−1.
/// q: [d]; keys, values: rows [keys_seen, stride] (this head's kv slice at the row start); scores: [keys_seen]
/// scratch; out: [d].
inline void attend(const float* q, const float* keys, const float* values, std::size_t stride,
                   std::size_t keys_seen, std::size_t d, float scale, float* scores, float* out) {
  // 1. Scores and their maximum (max is exact in any order).
  float max = -INFINITY;
#if defined(__AVX512F__)
  if (d % 16 == 0) {
    for (std::size_t j = 0; j < keys_seen; ++j) {
      const float* k = keys + j * stride;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
      for (std::size_t c = 16; c < d; c += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(k + c), acc);
      scores[j] = _mm512_reduce_add_ps(acc) * scale;
      max = std::max(max, scores[j]);
    }
  } else
#endif
  {
    for (std::size_t j = 0; j < keys_seen; ++j) {
      scores[j] = dot(q, keys + j * stride, d) * scale;
      max = std::max(max, scores[j]);
    }
  }
  // 2. Softmax weights e^(s − max) and their sum in 16 partial sums by key index.
  float lanes[16] = {};
  exp_shifted(scores, keys_seen, max);
  std::size_t j = 0;
  for (; j + 16 <= keys_seen; j += 16)
    for (std::size_t l = 0; l < 16; ++l) lanes[l] += scores[j + l];
  for (; j < keys_seen; ++j) lanes[j % 16] += scores[j];
  for (std::size_t width = 8; width > 0; width /= 2)
    for (std::size_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  const float inv = 1.0f / lanes[0];
  // 3. out = Σ_j p_j·V_j / sum, keys in order.
  std::size_t c = 0;
#if defined(__AVX512F__)
  for (; c + 64 <= d; c += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (std::size_t k = 0; k < keys_seen; ++k) {
      const float* v = values + k * stride + c;
      const __m512 p = _mm512_set1_ps(scores[k]);
      a0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v), a0);
      a1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16), a1);
      a2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 32), a2);
      a3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 48), a3);
    }
    const __m512 s = _mm512_set1_ps(inv);
    _mm512_storeu_ps(out + c, _mm512_mul_ps(a0, s));
    _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(a1, s));
    _mm512_storeu_ps(out + c + 32, _mm512_mul_ps(a2, s));
    _mm512_storeu_ps(out + c + 48, _mm512_mul_ps(a3, s));
  }
#endif
  if (c < d) {
    std::fill(out + c, out + d, 0.0f);
    for (std::size_t k = 0; k < keys_seen; ++k)
      for (std::size_t e = c; e < d; ++e) out[e] += scores[k] * values[k * stride + e];
    for (std::size_t e = c; e < d; ++e) out[e] *= inv;
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace specdec::llama::detail
