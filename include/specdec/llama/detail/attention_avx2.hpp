// specdec/llama/detail/attention_avx2.hpp — the AVX2 attention kernels, for CPUs without AVX-512: the scores
// and weighted values of up to 3 heads of one position a pass, each key and value loaded and widened once for
// them, with the float sequence of attend_group_portable.
// Entry points: detail::for_head_passes_avx2 with detail::row_scores_avx2, detail::group_scores_avx2 and
// detail::group_values_avx2. Read first: attention_core.hpp (the operation order these kernels follow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "specdec/llama/detail/attention_core.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

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
      if (ask) block.ask(std::size_t(m) * part);
      const __m256 qv = _mm256_set1_ps(q[std::size_t(m) * part]);
      SPECDEC_UNROLL for (int half = 0; half < 2; ++half)
        acc[half][m] = _mm256_mul_ps(qv, block.load(std::size_t(m) * part, half));
    }
    for (std::size_t c = 1; c < part; ++c)
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
        const std::size_t col = std::size_t(m) * part + c;
        if (ask) block.ask(col, c * 4 + std::size_t(m));
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
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) q[h] = a.q_row(r0 + std::size_t(h));
  const __m256 scale = _mm256_set1_ps(a.scale);
  const bool ask = a.positions <= 5;
  for (std::size_t b = 0; b < blocks; ++b) {
    const KeyBlockAvx2<T> block(a, b, blocks);
    SPECDEC_UNROLL for (int half = 0; half < 2; ++half) {
      const bool asks = ask && half == 0;
      __m256 acc[H][4];
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
        if (asks) block.ask(std::size_t(m) * part);
        const __m256 k = block.load(std::size_t(m) * part, half);
        SPECDEC_UNROLL for (int h = 0; h < H; ++h)
          acc[h][m] = _mm256_mul_ps(_mm256_set1_ps(q[h][std::size_t(m) * part]), k);
      }
      for (std::size_t c = 1; c < part; ++c)
        SPECDEC_UNROLL for (int m = 0; m < 4; ++m) {
          const std::size_t col = std::size_t(m) * part + c;
          if (asks) block.ask(col, c * 4 + std::size_t(m));
          __m256 k = block.load(col, half);
          SPECDEC_IN_REGISTER(k);  // widened once for all rows
          SPECDEC_UNROLL for (int h = 0; h < H; ++h)
            acc[h][m] = _mm256_fmadd_ps(_mm256_set1_ps(q[h][col]), k, acc[h][m]);
        }
      SPECDEC_UNROLL for (int h = 0; h < H; ++h) store_scores_avx2(a, r0 + std::size_t(h), b, half, acc[h], scale);
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
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) p[h] = a.score_row(r0 + std::size_t(h));
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
    float* out = a.out_row(r0 + std::size_t(h)) + c0;
    const __m256 inv = _mm256_set1_ps(inverse[r0 + std::size_t(h)]);
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

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
