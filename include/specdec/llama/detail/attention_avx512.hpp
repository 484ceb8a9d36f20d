// specdec/llama/detail/attention_avx512.hpp — the AVX-512 attention kernels: the scores and weighted values of
// up to 6 rows (heads × positions sharing a kv head) a pass, each key and value loaded and widened once for them
// all, with the float sequence of attend_group_portable.
// Entry points: detail::for_row_chunks with detail::ScoreStep and detail::ValueStep. Read first:
// attention_core.hpp (the operation order these kernels follow).
#pragma once

#include <cstddef>
#include <cstdint>

#include "specdec/llama/detail/attention_core.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

SPECDEC_AVX512_WARNINGS_OFF

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
    const float* q = a.q_row(r0 + std::size_t(h));
    for (std::size_t c = 0; c < part; ++c)
      SPECDEC_UNROLL for (int m = 0; m < 4; ++m)
        qs[(c * 4 + std::size_t(m)) * H + std::size_t(h)] = q[std::size_t(m) * part + c];
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
      _mm_prefetch(reinterpret_cast<const char*>(next + std::size_t(m) * part * key_block), _MM_HINT_T1);
      const __m512 k = load16(block + std::size_t(m) * part * key_block);
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
        const std::size_t col = std::size_t(m) * part + c;
        _mm_prefetch(reinterpret_cast<const char*>(next + col * key_block), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(values + (c * 4 + std::size_t(m)) * 64), _MM_HINT_T1);
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
      _mm512_storeu_ps(a.score_row(r0 + std::size_t(h)) + b * key_block, _mm512_mul_ps(total, scale));
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
  SPECDEC_UNROLL for (int h = 0; h < H; ++h)
    p[h] = a.score_row(r0 + std::size_t(h)), keys[h] = a.row_keys(r0 + std::size_t(h));
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
    float* out = a.out_row(r0 + std::size_t(h)) + c0;
    const __m512 inv = _mm512_set1_ps(inverse[r0 + std::size_t(h)]);
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

SPECDEC_AVX512_WARNINGS_ON

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
