// specdec/llama/detail/attention.hpp — per-position attention and the elementwise math of the forward pass.
// Entry points: detail::attend, detail::exp_approx. Read first: ../llama_model.hpp.
//
// Everything here computes one query position from that position's inputs only, in an operation order fixed
// by the number of keys it sees, so the forward pass stays batch-invariant. exp_approx is plain float code
// (no libm call) so that loops over it vectorise; vector and scalar instances give the same bits because they
// perform the same IEEE operations.
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

/// e^x within about 2 ulp for x in [−87.3, 88.3]; inputs outside are clamped (so e^−1000 gives 1e−38, not 0).
/// Cody–Waite reduction x = k·ln2 + r, |r| <= ln2/2, then a degree-6 polynomial for e^r and 2^k from bits.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * r) * r + r + 1.0f;
  return e * std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<std::int32_t>(k) + 127) << 23);
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

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 flags the _mm512_undefined_ps() inside its own intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

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
  for (std::size_t j = 0; j < keys_seen; ++j) scores[j] = exp_approx(scores[j] - max);
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
