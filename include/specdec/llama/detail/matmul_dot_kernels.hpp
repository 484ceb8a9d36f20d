// specdec/llama/detail/matmul_dot_kernels.hpp — what the block encodings' integer kernels share (q8_0, q4_0,
// q4_1 with 24-bit inputs; q8_0_dot, q4_0_dot, q4_1_dot with 8-bit inputs): the quantised inputs, the float
// sequence per block, the portable kernel and the position groups of a call.
// Entry points: detail::matmul_panels_dot_portable, detail::quantize_inputs. Read first: matmul_kernels.hpp.
// Read next: matmul_dot_avx512.hpp and matmul_dot_avx2.hpp (the vector kernels), matmul_dispatch.hpp.
//
// Batch invariance as for the float kernels: one accumulator per (row, position) from zero, one fixed
// sequence of float operations per 32-column block (the integer sums are exact), inputs quantised per
// position; so results do not depend on how positions are grouped or which thread runs a panel.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "specdec/llama/detail/matmul_kernels.hpp"
#include "specdec/llama/packed_matrix.hpp"

namespace specdec::llama::detail {

// ---------------------------------------------------------------------------------------------------------
// Inputs of the *_dot encodings (one digit): each position's inputs quantised to int8 per 32-column block, as
// llama.cpp's Q8_0 activations: dx = max|x| / 127, xq = nearbyint(x / dx) (default rounding mode). A position's
// quantisation depends on that position's inputs only. Entry (position, block), 48 bytes:
//   xq[32] int8 | dx float | mx = dx·Σxq float | Σxq int32 | 4 bytes padding
// Group g of positions [begin, begin + count) holds its entries at [begin·blocks + b·count + i].
//
// Per block, a (row, position) accumulator takes the exact integer dot product s = Σ q·xq (corrected to the
// signed weight: q4_0 s − 8·Σxq, q8_0 stores q + 128 and uses s − 128·Σxq) and adds it in a fixed float
// sequence: acc = fma(float(s), d·dx, acc), then for q4_1 acc = fma(m, mx, acc). Both paths do exactly that.
//
// Inputs of q8_0, q4_0 and q4_1 (three digits, the `quantized` format): X = nearbyint(x·2^s) per 32-column
// block, s the largest integer with max|X| <= wide_max, at most 149 (scaling by a power of two is exact; the
// block's largest input keeps 23 of its 24 significant bits, 22 when its mantissa is above wide_max / 2^22, and
// every input lies within 2^-23 of the largest of its block; subnormal blocks stay exact: their inputs are
// multiples of 2^-149), split into balanced int8 digits X = h·2^16 + m·2^8 + l. Entry (position, block),
// 128 bytes:
//   l[32] | m[32] | h[32] int8 | Σl, Σm, Σh int32 | 2^-s float | sx = float(ΣX)·2^-s float | 12 bytes padding
// Per block and digit the exact integer sums S_l, S_m, S_h (each corrected to the signed weight as above), then
// the fixed float sequence T = fma(float(S_h), 2^16, float(S_m·2^8 + S_l)), acc = fma(T·2^-s, d, acc), and for
// q4_1 acc = fma(m, sx, acc). T·2^-s is the block's dot product with the inputs to within two roundings (it
// overflows only for inputs above about 2^115, where float products are near overflow too).

inline constexpr std::size_t dot_entry_bytes = 48;
inline constexpr std::size_t wide_entry_bytes = 128;
inline constexpr std::int32_t wide_max = 127 * 65536 + 127 * 256 + 127;  // the largest balanced 3-digit value

/// Entry bytes per (position, block) for inputs of `digits` digits (1 or 3).
constexpr std::size_t entry_bytes(int digits) { return digits == 1 ? dot_entry_bytes : wide_entry_bytes; }

/// Writes an entry's scale, dx·Σxq, Σxq and padding (the quants are written by the caller).
inline void write_entry_scales(std::byte* e, float dx, std::int32_t sum) {
  const float mx = dx * static_cast<float>(sum);
  std::memcpy(e + 32, &dx, 4);
  std::memcpy(e + 36, &mx, 4);
  std::memcpy(e + 40, &sum, 4);
  std::memset(e + 44, 0, 4);
}

/// Writes a 24-bit entry's digit sums, scale (2^-s, or NaN for write_nonfinite_entry) and input sum times the
/// scale (the digits are written by the caller). The input sum ΣX is Σh·2^16 + Σm·2^8 + Σl of the digit sums,
/// exactly (|ΣX| < 2^28).
inline void write_wide_scales(std::byte* e, const std::int32_t (&sums)[3], float scale) {
  const float sx = static_cast<float>(sums[2] * 65536 + sums[1] * 256 + sums[0]) * scale;
  std::memcpy(e + 96, sums, 12);
  std::memcpy(e + 108, &scale, 4);
  std::memcpy(e + 112, &sx, 4);
  std::memset(e + 116, 0, 12);
}

/// Whether a block of 32 inputs holds an infinity or a NaN.
inline bool nonfinite_block(const float* xb) {
  bool nonfinite = false;
  for (std::size_t j = 0; j < quant_block; ++j) nonfinite |= !std::isfinite(xb[j]);
  return nonfinite;
}

/// The entry of a block holding an infinity or a NaN (see quantize_block): zero digits and a NaN scale, so every
/// product with the block is NaN, as a float product would be (or infinite). Without it the digits of such an
/// input would be undefined (a NaN converted to an integer) or would differ between paths, and a NaN in the
/// activations, from a file with broken weights, could leave finite logits that no check would catch.
inline void write_nonfinite_entry(std::byte* e, int digits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::int32_t zeros[3] = {0, 0, 0};
  std::memset(e, 0, 32 * static_cast<std::size_t>(digits));
  if (digits == 1) write_entry_scales(e, nan, 0);
  else write_wide_scales(e, zeros, nan);  // sx = 0·NaN: NaN
}

/// 1/dx for a block's scale dx = max|x|/127, or 0 where dx is below the normal floats (max|x| under about
/// 1.5e-36, 30 orders of magnitude below activations): 1/dx may overflow there, and x·inf would be NaN for x = 0.
/// Such a block's digits are 0.
inline float dot_inverse(float dx) { return dx >= std::numeric_limits<float>::min() ? 1.0f / dx : 0.0f; }

/// Quantises one block of 32 inputs into an entry (layout above), scalar.
inline void quantize_block_portable(const float* xb, std::byte* e) {
  if (nonfinite_block(xb)) return write_nonfinite_entry(e, 1);
  float amax = 0.0f;
  for (std::size_t j = 0; j < quant_block; ++j) amax = std::max(amax, std::abs(xb[j]));
  const float dx = amax / 127.0f;
  const float inverse = dot_inverse(dx);
  std::int8_t q[quant_block];
  std::int32_t sum = 0;
  for (std::size_t j = 0; j < quant_block; ++j) {
    const float v = std::clamp(std::nearbyint(xb[j] * inverse), -127.0f, 127.0f);
    q[j] = static_cast<std::int8_t>(v);
    sum += q[j];
  }
  std::memcpy(e, q, quant_block);
  write_entry_scales(e, dx, sum);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/// max|x| over 32 floats (exact in any order for finite inputs).
inline float abs_max_avx2(const __m256 (&x)[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x[0]), _mm256_andnot_ps(sign, x[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, x[2]), _mm256_andnot_ps(sign, x[3])));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/// Whether any of 32 floats is an infinity or a NaN (x − x is NaN exactly for those).
inline bool nonfinite_avx2(const __m256 (&x)[4]) {
  const __m256 a = _mm256_cmp_ps(_mm256_sub_ps(x[0], x[0]), _mm256_sub_ps(x[1], x[1]), _CMP_UNORD_Q);
  const __m256 b = _mm256_cmp_ps(_mm256_sub_ps(x[2], x[2]), _mm256_sub_ps(x[3], x[3]), _CMP_UNORD_Q);
  return _mm256_movemask_ps(_mm256_or_ps(a, b)) != 0;
}

/// The sum of the 32 int32 lanes of four vectors.
inline std::int32_t add_lanes_avx2(const __m256i (&v4)[4]) {
  const __m256i v = _mm256_add_epi32(_mm256_add_epi32(v4[0], v4[1]), _mm256_add_epi32(v4[2], v4[3]));
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)));
}

/// Stores 32 int32 lanes, each in [-128, 127], as 32 int8 in order.
inline void store_bytes_avx2(const __m256i (&v)[4], std::byte* out) {
  // The packs work within 128-bit lanes: bytes come out as v0[0..3] v1[0..3] v2[0..3] v3[0..3] v0[4..7] ...,
  // in dwords 0 2 4 6 1 3 5 7 of the source order; the permutation puts them back.
  const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#endif

/// quantize_block_portable with AVX-512 or AVX2: the same float operations (max is exact in any order; the
/// conversion rounds to nearest even like nearbyint in the default mode; |x·inverse| <= 127 up to rounding, so
/// clamping the integers equals clamping the floats), so the same bytes for finite inputs; a block with an
/// infinity or a NaN gets write_nonfinite_entry's on every path.
SPECDEC_AVX512_WARNINGS_OFF  // also _mm512_reduce_max_ps's placeholders
inline void quantize_block(const float* xb, std::byte* e) {
#if defined(__AVX512F__)
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  if (_mm512_cmp_ps_mask(_mm512_sub_ps(x0, x0), _mm512_sub_ps(x1, x1), _CMP_UNORD_Q) != 0)
    return write_nonfinite_entry(e, 1);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float dx = amax / 127.0f;
  const float inverse = dot_inverse(dx);
  const __m512 inv = _mm512_set1_ps(inverse);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), lo), hi);
  const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, inv)), lo), hi);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(e), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(e + 16), _mm512_cvtepi32_epi8(q1));
  write_entry_scales(e, dx, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
#elif defined(__AVX2__)
  const __m256 x[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                       _mm256_loadu_ps(xb + 24)};
  if (nonfinite_avx2(x)) return write_nonfinite_entry(e, 1);
  const float dx = abs_max_avx2(x) / 127.0f;
  const __m256 inverse = _mm256_set1_ps(dot_inverse(dx));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4];
  SPECDEC_UNROLL for (int i = 0; i < 4; ++i)
    q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[i], inverse)), lo), hi);
  store_bytes_avx2(q, e);
  write_entry_scales(e, dx, add_lanes_avx2(q));
#else
  quantize_block_portable(xb, e);
#endif
}

/// The scaling exponent s of a block of 24-bit inputs: the largest with max|x|·2^s <= wide_max, at most 149
/// (0 for a block of zeros or a non-finite maximum). With 149 every float below 2^-127 is an integer below 2^22
/// after scaling, and 2^-149 is still a float (a larger s would make the block's scale 0).
inline int wide_shift(float amax) {
  const auto bits = std::bit_cast<std::uint32_t>(amax);
  if (const std::uint32_t exponent = bits >> 23; exponent - 1 < 254) {
    // A normal positive amax = M·2^(exponent − 150), M its 24-bit significand: s = 149 − exponent scales it to
    // M / 2 in [2^22, 2^23), one less when that is above wide_max (what the general path below computes, without
    // its two library calls: they took most of a block's quantisation).
    const std::uint32_t significand = (bits & 0x7FFFFFu) | 0x800000u;
    return 149 - static_cast<int>(exponent) - (significand > 2u * wide_max ? 1 : 0);
  }
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;
  int s = 22 - std::ilogb(amax);  // amax·2^s in [2^22, 2^23)
  if (std::ldexp(amax, s) > static_cast<float>(wide_max)) --s;
  return std::min(s, 149);
}

/// 2^-s as a float, exactly, for s in [-127, 149] (wide_shift's range is [-106, 149]): a normal number down to
/// 2^-126, then subnormal.
inline float wide_scale(int s) {
  return std::bit_cast<float>(s <= 126 ? static_cast<std::uint32_t>(127 - s) << 23 : std::uint32_t{1} << (149 - s));
}

/// Splits X (|X| <= wide_max) into balanced digits X = h·2^16 + m·2^8 + l, each in [-128, 127].
inline void split_digits(std::int32_t X, std::int32_t (&digit)[3]) {
  SPECDEC_UNROLL for (int i = 0; i < 3; ++i) {
    digit[i] = ((X + 128) & 255) - 128;  // the low byte, read as signed
    X = (X - digit[i]) >> 8;             // exact: X − digit is a multiple of 256
  }
}

/// Quantises one block of 32 inputs into a 24-bit entry (layout above), scalar; a block with an infinity or a
/// NaN gets write_nonfinite_entry's.
inline void quantize_block_wide_portable(const float* xb, std::byte* e) {
  if (nonfinite_block(xb)) return write_nonfinite_entry(e, 3);
  float amax = 0.0f;
  for (std::size_t j = 0; j < quant_block; ++j) amax = std::max(amax, std::abs(xb[j]));
  const int s = wide_shift(amax);
  std::int32_t sums[3] = {0, 0, 0};
  for (std::size_t j = 0; j < quant_block; ++j) {
    const float v = std::nearbyint(std::ldexp(xb[j], s));
    const auto X = std::abs(v) <= static_cast<float>(wide_max) ? static_cast<std::int32_t>(v) : 0;  // finite: always
    std::int32_t digit[3];
    split_digits(X, digit);
    SPECDEC_UNROLL for (int i = 0; i < 3; ++i) {
      e[std::size_t(32 * i) + j] = static_cast<std::byte>(static_cast<std::int8_t>(digit[i]));
      sums[i] += digit[i];
    }
  }
  write_wide_scales(e, sums, wide_scale(s));
}

/// quantize_block_wide_portable with AVX-512 or AVX2: the same scaling (exact here, as ldexp: vscalefps, or two
/// multiplications by powers of two), rounding to nearest even, digits and sums, so the same bytes (for a block
/// with an infinity or a NaN, write_nonfinite_entry's). Without the AVX2 path, builds for AVX2 ran the scalar
/// loop: a forward of one position of `quantized` spent 0.61-0.64 ms outside its products, attention and output
/// head, against 0.16 ms with it (on the AVX-512 machine of 2026-12-02; one-digit inputs, `quantized_dot`: 0.175
/// against 0.11 ms).
inline void quantize_block_wide(const float* xb, std::byte* e) {
#if defined(__AVX512F__)
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  if (_mm512_cmp_ps_mask(_mm512_sub_ps(x0, x0), _mm512_sub_ps(x1, x1), _CMP_UNORD_Q) != 0)
    return write_nonfinite_entry(e, 3);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const int s = wide_shift(amax);
  const __m512 shift = _mm512_set1_ps(static_cast<float>(s));
  __m512i X[2] = {_mm512_cvtps_epi32(_mm512_scalef_ps(x0, shift)), _mm512_cvtps_epi32(_mm512_scalef_ps(x1, shift))};
  std::int32_t sums[3];
  SPECDEC_UNROLL for (int i = 0; i < 3; ++i) {
    __m512i sum = _mm512_setzero_si512();
    SPECDEC_UNROLL for (int h = 0; h < 2; ++h) {
      const __m512i digit = _mm512_srai_epi32(_mm512_slli_epi32(X[h], 24), 24);  // the low byte, read as signed
      X[h] = _mm512_srai_epi32(_mm512_sub_epi32(X[h], digit), 8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(e + 32 * i + 16 * h), _mm512_cvtepi32_epi8(digit));
      sum = _mm512_add_epi32(sum, digit);
    }
    sums[i] = _mm512_reduce_add_epi32(sum);
  }
  write_wide_scales(e, sums, wide_scale(s));
#elif defined(__AVX2__)
  const __m256 x[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                       _mm256_loadu_ps(xb + 24)};
  if (nonfinite_avx2(x)) return write_nonfinite_entry(e, 3);
  const int s = wide_shift(abs_max_avx2(x));
  // x·2^s as two exact multiplications by powers of two (s runs from -105 to 149, past a float's exponents).
  // Scaling up is exact; scaling down is exact unless the product is subnormal, and then so small (below
  // 2^-126) that it rounds to 0 either way.
  const __m256 f1 = _mm256_set1_ps(wide_scale(-(s / 2))), f2 = _mm256_set1_ps(wide_scale(-(s - s / 2)));
  __m256i X[4];
  SPECDEC_UNROLL for (int i = 0; i < 4; ++i) X[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(x[i], f1), f2));
  std::int32_t sums[3];
  SPECDEC_UNROLL for (int i = 0; i < 3; ++i) {
    __m256i digit[4];
    SPECDEC_UNROLL for (int h = 0; h < 4; ++h) {
      digit[h] = _mm256_srai_epi32(_mm256_slli_epi32(X[h], 24), 24);  // the low byte, read as signed
      X[h] = _mm256_srai_epi32(_mm256_sub_epi32(X[h], digit[h]), 8);
    }
    store_bytes_avx2(digit, e + 32 * i);
    sums[i] = add_lanes_avx2(digit);
  }
  write_wide_scales(e, sums, wide_scale(s));
#else
  quantize_block_wide_portable(xb, e);
#endif
}
SPECDEC_AVX512_WARNINGS_ON

/// A panel kernel of the block encodings: one panel × P positions, xq the position group's entries.
using DotKernelFn = void (*)(const MatmulOutput&, std::size_t, const std::byte*);

/// Calls run(type, digits) with the block encoding's weight type and input digit count as constants
/// (std::integral_constant); false for the float encodings.
template <class Run>
bool with_block_encoding(PanelEncoding encoding, Run&& run) {
  using E = PanelEncoding;
  const auto call = [&](auto type, auto digits) { return run(type, digits), true; };
  switch (encoding) {
    case E::q8_0: return call(std::integral_constant<E, E::q8_0>{}, std::integral_constant<int, 3>{});
    case E::q4_0: return call(std::integral_constant<E, E::q4_0>{}, std::integral_constant<int, 3>{});
    case E::q4_1: return call(std::integral_constant<E, E::q4_1>{}, std::integral_constant<int, 3>{});
    case E::q8_0_dot: return call(std::integral_constant<E, E::q8_0>{}, std::integral_constant<int, 1>{});
    case E::q4_0_dot: return call(std::integral_constant<E, E::q4_0>{}, std::integral_constant<int, 1>{});
    case E::q4_1_dot: return call(std::integral_constant<E, E::q4_1>{}, std::integral_constant<int, 1>{});
    default: return false;
  }
}

/// Runs panels [first, last) for every group of positions with kernels[count - 1], a few panels at a time so
/// that their weights stay in cache while every position group passes. xq: all positions' entries.
template <std::size_t N>
void run_dot_kernels(const std::array<DotKernelFn, N>& kernels, const MatmulOutput& out, std::size_t first,
                     std::size_t last, std::size_t positions, const std::byte* xq, int digits) {
  const std::size_t blocks = out.weights->cols() / quant_block;
  for (std::size_t b = first; b < last; b += step_panels) {
    const std::size_t block_end = std::min(last, b + step_panels);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      const std::byte* xg = xq + begin * blocks * entry_bytes(digits);
      MatmulOutput og = out;
      og.y = out.y + begin * out.y_stride;
      for (std::size_t p = b; p < block_end; ++p) kernels[count - 1](og, p, xg);
    }
  }
}

/// Byte offset of the entry of (position i, block b) among `positions` positions' inputs of `blocks` blocks
/// each, in the group layout above.
inline std::size_t entry_offset(std::size_t positions, std::size_t i, std::size_t b, std::size_t blocks, int digits) {
  std::size_t g = 0;
  while (group_begin(positions, g + 1) <= i) ++g;
  const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
  return (begin * blocks + b * count + (i - begin)) * entry_bytes(digits);
}

/// Quantises blocks [first, last) of position i's inputs (`row` is the position's whole row) into `out`, the
/// group layout of `positions` positions of `blocks` blocks, with `Digits` digits (1 or 3).
template <int Digits>
void quantize_row_blocks(const float* row, std::size_t i, std::size_t first, std::size_t last, std::size_t positions,
                         std::size_t blocks, std::byte* out) {
  for (std::size_t b = first; b < last; ++b) {
    std::byte* e = out + entry_offset(positions, i, b, blocks, Digits);
    if constexpr (Digits == 1) quantize_block(row + b * quant_block, e);
    else quantize_block_wide(row + b * quant_block, e);
  }
}

/// quantize_row_blocks with the digit count as a value (1 or 3).
inline void quantize_row_blocks(int digits, const float* row, std::size_t i, std::size_t first, std::size_t last,
                                std::size_t positions, std::size_t blocks, std::byte* out) {
  if (digits == 1) quantize_row_blocks<1>(row, i, first, last, positions, blocks, out);
  else quantize_row_blocks<3>(row, i, first, last, positions, blocks, out);
}

/// Quantises positions × cols inputs into the group layout above, with `Digits` digits (1 or 3).
/// requires: cols % 32 == 0.
template <int Digits>
void quantize_inputs(const float* x, std::size_t x_stride, std::size_t positions, std::size_t cols, std::byte* out) {
  const std::size_t blocks = cols / quant_block;
  for (std::size_t i = 0; i < positions; ++i) quantize_row_blocks<Digits>(x + i * x_stride, i, 0, blocks, positions, blocks, out);
}

/// quantize_inputs with the digit count as a value (1 or 3).
inline void quantize_inputs(int digits, const float* x, std::size_t x_stride, std::size_t positions, std::size_t cols,
                            std::byte* out) {
  if (digits == 1) quantize_inputs<1>(x, x_stride, positions, cols, out);
  else quantize_inputs<3>(x, x_stride, positions, cols, out);
}

/// Call `call`'s inputs quantised with `Digits` digits: `given` when the caller quantised them already (see
/// QuantizedInputs), else this thread's own copy (made on the thread's first block of the call).
template <int Digits>
const std::byte* prepared_quantized_inputs(const float* x, std::size_t x_stride, std::size_t positions,
                                           std::size_t cols, std::uint64_t call, QuantizedInputs given) {
  if (given.bytes && given.digits == Digits) return given.bytes;
  static thread_local std::vector<CacheLine> buffer;  // grows, never shrinks
  static thread_local std::uint64_t prepared = 0;
  if (prepared != call) {
    const std::size_t bytes = positions * (cols / quant_block) * entry_bytes(Digits);
    // At least one line, so that data() is never null (a matrix with no columns has no entries).
    const std::size_t lines = std::max<std::size_t>(1, (bytes + sizeof(CacheLine) - 1) / sizeof(CacheLine));
    if (buffer.size() < lines) buffer.resize(lines);
    quantize_inputs<Digits>(x, x_stride, positions, cols, line_bytes(buffer.data()));
    prepared = call;
  }
  return line_bytes(buffer.data());
}

/// Portable twin of the dot kernels: the same integer sums and the same float sequence per (row, position).
/// digits: 1 for the *_dot encodings, 3 for q8_0, q4_0 and q4_1.
inline void matmul_panels_dot_portable(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                                       std::size_t x_stride, std::size_t positions, std::uint64_t call,
                                       QuantizedInputs given) {
  const PackedMatrix& w = *out.weights;
  const PanelEncoding type = block_type(w.encoding());
  const int digits = is_dot_encoding(w.encoding()) ? 1 : 3;
  const bool has_min = type == PanelEncoding::q4_1, q8 = type == PanelEncoding::q8_0;
  const std::int32_t offset = q8 ? 128 : type == PanelEncoding::q4_0 ? 8 : 0;  // weight = stored − offset
  const std::size_t blocks = w.cols() / quant_block, block_bytes = panel_block_bytes(type);
  const std::size_t q_offset = (has_min ? 4 : 2) * panel_rows;
  const std::byte* xq = digits == 1 ? prepared_quantized_inputs<1>(x, x_stride, positions, w.cols(), call, given)
                                    : prepared_quantized_inputs<3>(x, x_stride, positions, w.cols(), call, given);
  float acc[max_position_group][panel_rows];
  std::int32_t q[quant_block][panel_rows];
  float d[panel_rows], m[panel_rows];
  for (std::size_t p = first; p < last; ++p) {
    const std::size_t row0 = p * panel_rows;
    const std::size_t lanes = std::min(panel_rows, w.rows() - row0);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      for (std::size_t i = 0; i < count; ++i) std::fill(acc[i], acc[i] + panel_rows, 0.0f);
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = w.panel(p) + b * block_bytes;
        for (std::size_t l = 0; l < panel_rows; ++l) {
          d[l] = gguf::fp16_to_float(load_u16(block + 2 * l));
          m[l] = has_min ? gguf::fp16_to_float(load_u16(block + 2 * panel_rows + 2 * l)) : 0.0f;
        }
        for (std::size_t j = 0; j < quant_block; ++j)
          for (std::size_t l = 0; l < panel_rows; ++l) {
            if (q8) {
              q[j][l] = static_cast<std::int32_t>(block[q_offset + quant_offset(j, l)]);
            } else {
              const auto byte = static_cast<std::int32_t>(block[q_offset + quant_offset(j % 16, l)]);
              q[j][l] = j < 16 ? byte & 15 : byte >> 4;
            }
          }
        for (std::size_t i = 0; i < count; ++i) {
          const std::byte* e = xq + ((begin * blocks) + b * count + i) * entry_bytes(digits);
          // s[digit][l]: the exact integer dot product of row l's signed weights with one digit plane
          std::int32_t s[3][panel_rows] = {}, digit_sums[3];
          std::memcpy(digit_sums, e + (digits == 1 ? 40 : 96), 4 * static_cast<std::size_t>(digits));
          SPECDEC_UNROLL for (int t = 0; t < digits; ++t) {
            std::int8_t xv[quant_block];
            std::memcpy(xv, e + 32 * t, quant_block);
            for (std::size_t j = 0; j < quant_block; ++j)
              for (std::size_t l = 0; l < panel_rows; ++l) s[t][l] += q[j][l] * xv[j];
            for (std::size_t l = 0; l < panel_rows; ++l) s[t][l] -= offset * digit_sums[t];
          }
          float scale, mx;  // one digit: dx and dx·Σxq; three: 2^-s and float(ΣX)·2^-s
          std::memcpy(&scale, e + (digits == 1 ? 32 : 108), 4);
          std::memcpy(&mx, e + (digits == 1 ? 36 : 112), 4);
          for (std::size_t l = 0; l < panel_rows; ++l) {
            if (digits == 1) {
              acc[i][l] = std::fma(static_cast<float>(s[0][l]), d[l] * scale, acc[i][l]);
            } else {
              const float t = std::fma(static_cast<float>(s[2][l]), 65536.0f, static_cast<float>(s[1][l] * 256 + s[0][l]));
              acc[i][l] = std::fma(t * scale, d[l], acc[i][l]);
            }
            if (has_min) acc[i][l] = std::fma(m[l], mx, acc[i][l]);
          }
        }
      }
      for (std::size_t i = 0; i < count; ++i) {
        float* y = out.y + (begin + i) * out.y_stride + row0;
        for (std::size_t l = 0; l < lanes; ++l) y[l] = out.accumulate ? y[l] + acc[i][l] : acc[i][l];
      }
    }
  }
}

}  // namespace specdec::llama::detail
