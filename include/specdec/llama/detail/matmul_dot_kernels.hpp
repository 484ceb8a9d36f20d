// specdec/llama/detail/matmul_dot_kernels.hpp — the block encodings' integer kernels (q8_0, q4_0, q4_1 with
// 24-bit inputs; q8_0_dot, q4_0_dot, q4_1_dot with 8-bit inputs) and the dispatcher detail::matmul_panels that
// picks a kernel per encoding.
// Entry point: detail::matmul_panels. Read first: matmul_kernels.hpp (the float kernels and helpers).
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

/// Quantises one block of 32 inputs into an entry (layout above), scalar.
inline void quantize_block_portable(const float* xb, std::byte* e) {
  float amax = 0.0f;
  for (std::size_t j = 0; j < quant_block; ++j) amax = std::max(amax, std::abs(xb[j]));
  const float dx = amax / 127.0f;
  const float inverse = dx != 0.0f ? 1.0f / dx : 0.0f;
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
/// clamping the integers equals clamping the floats), so the same bytes for finite inputs.
SPECDEC_AVX512_WARNINGS_OFF  // also _mm512_reduce_max_ps's placeholders
inline void quantize_block(const float* xb, std::byte* e) {
#if defined(__AVX512F__)
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float dx = amax / 127.0f;
  const float inverse = dx != 0.0f ? 1.0f / dx : 0.0f;
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
  const float dx = abs_max_avx2(x) / 127.0f;
  const __m256 inverse = _mm256_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
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

/// Writes an entry's digit sums, scale and input sum (the digits are written by the caller). The input sum ΣX is
/// Σh·2^16 + Σm·2^8 + Σl of the digit sums, exactly (|ΣX| < 2^28).
inline void write_wide_scales(std::byte* e, const std::int32_t (&sums)[3], int s) {
  const float scale = wide_scale(s);
  const float sx = static_cast<float>(sums[2] * 65536 + sums[1] * 256 + sums[0]) * scale;
  std::memcpy(e + 96, sums, 12);
  std::memcpy(e + 108, &scale, 4);
  std::memcpy(e + 112, &sx, 4);
  std::memset(e + 116, 0, 12);
}

/// Splits X (|X| <= wide_max) into balanced digits X = h·2^16 + m·2^8 + l, each in [-128, 127].
inline void split_digits(std::int32_t X, std::int32_t (&digit)[3]) {
  SPECDEC_UNROLL for (int i = 0; i < 3; ++i) {
    digit[i] = ((X + 128) & 255) - 128;  // the low byte, read as signed
    X = (X - digit[i]) >> 8;             // exact: X − digit is a multiple of 256
  }
}

/// Quantises one block of 32 inputs into a 24-bit entry (layout above), scalar. For finite inputs.
inline void quantize_block_wide_portable(const float* xb, std::byte* e) {
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
      e[32 * i + j] = static_cast<std::byte>(static_cast<std::int8_t>(digit[i]));
      sums[i] += digit[i];
    }
  }
  write_wide_scales(e, sums, s);
}

/// quantize_block_wide_portable with AVX-512 or AVX2: the same scaling (exact here, as ldexp: vscalefps, or two
/// multiplications by powers of two), rounding to nearest even, digits and sums, so the same bytes for finite
/// inputs. Without the AVX2 path, builds for AVX2 ran the scalar loop: a forward of one position of `quantized`
/// spent 0.61-0.64 ms outside its products, attention and output head, against 0.16 ms with it (on the AVX-512
/// machine of 2026-12-02; one-digit inputs, `quantized_dot`: 0.175 against 0.11 ms).
inline void quantize_block_wide(const float* xb, std::byte* e) {
#if defined(__AVX512F__)
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
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
  write_wide_scales(e, sums, s);
#elif defined(__AVX2__)
  const __m256 x[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                       _mm256_loadu_ps(xb + 24)};
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
  write_wide_scales(e, sums, s);
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

#if defined(__AVX512VNNI__)
SPECDEC_AVX512_WARNINGS_OFF
/// How the AVX-512 dot kernel issues a block's integer dot products for P positions with Digits-digit inputs:
/// positions in sub-groups of `group` (at most 9, as even as they come), whose vpdpbusd chains are issued
/// interleaved (step g of every position of the sub-group, then step g + 1), each (position, digit) in `chains`
/// chains. Issued position by position, each in two chains (the earlier code), a position's chains waited on
/// each other and the scheduler did not reach the next positions' independent work. On the Intel Xeon of
/// 2026-12-06 (family 6, model 207), one thread, products of 1536×576 warm in L2, rounds alternating in one
/// process against the earlier code (the same bits): one digit 0.96-0.98x the time at 1 position, 0.92-0.95x at
/// 2-4, 0.88-0.94x at 5, 0.88-0.93x at 6-16; three digits 0.92-0.97x at 1-3, 0.80-0.85x at 4-5, 0.77-0.81x at
/// 6-16; the q8_0 output head (49152×576, from L3) 0.88-1.01x. Whole forwards of SmolLM2 on 2 threads:
/// quantized_dot 0.89-1.03x at 1-5 positions (within the noise), 0.91-0.96x at 7-9, 0.89-0.91x at 16; quantized
/// 0.87-0.97x at 2-16. In a first trial (one digit, the machine in a slower state, where the earlier code took
/// 1.6x as long): sub-groups as above 0.73-0.86x; one chain per position at 2-5 positions 0.82-0.97x where two
/// took 0.79-0.85x; one chain of 8 per position, position by position, 1.15x (the log's "2026-12-06, early
/// morning, then").
template <int Digits, int P>
struct DotSchedule {
  static constexpr int group = (P + (P + 8) / 9 - 1) / ((P + 8) / 9);
  static constexpr int chains = Digits == 1 ? (group == 1 ? 4 : group <= 5 ? 2 : 1) : (group == 1 ? 2 : 1);
};

/// The dot kernel for R panels × P positions of a block matrix with Digits-digit inputs: per block, the quants
/// are loaded (and nibbles unpacked) once and used by all R·P integer dot products (8 vpdpbusd per digit: 16 rows
/// × 4 columns per instruction, the 4 input bytes broadcast), then each sum is finalised in the order the
/// portable twin uses. xq: the group's entries (see quantize_inputs).
template <PanelEncoding Type, int Digits, int R, int P>
void panel_kernel_qdot(const MatmulOutput& out, std::size_t panel, const std::byte* xq) {
  constexpr bool has_min = Type == PanelEncoding::q4_1, q8 = Type == PanelEncoding::q8_0;
  constexpr std::int32_t offset = q8 ? 128 : Type == PanelEncoding::q4_0 ? 8 : 0;
  constexpr std::size_t block_bytes = panel_block_bytes(Type), q_offset = (has_min ? 4 : 2) * panel_rows;
  constexpr std::size_t entry = entry_bytes(Digits);
  constexpr int G = DotSchedule<Digits, P>::group, C = DotSchedule<Digits, P>::chains;
  const PackedMatrix& w = *out.weights;
  const std::byte* panels[R];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + r);
  __m512 acc[R][P];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const std::size_t blocks = w.cols() / quant_block;
  // Each block also asks for the same block of the next panel, with the non-temporal hint (NTA). Measured
  // 2026-12-02 in forwards of SmolLM2 at context 256 on 2 threads (Zen 4), alternating call by call with the
  // earlier code (the hint T1 into L2, from 2 positions up, from 5 for one-digit q8_0, none below): 0.88x the time
  // at 1 position, 0.90x at 2, 0.94x at 3-4, 0.95-0.96x at 5-7, 0.975x at 9; three digits (`quantized`) 0.89x at
  // 5. T1 at 1 position was no faster than no request, and T0 in between (the hint T1 once took 2-5 positions to
  // 0.86-0.99x of no request, and T0 was a loss there). For q8_0 (SmolLM2's output head, 34 bytes per 32 weights
  // where q4_1 has 20) the request used to get in the hardware prefetcher's way up to 4 positions; NTA does not.
  // Where the CPU's hardware prefetcher does better alone, up to quiet_dot_products digit products a block, none;
  // into L2 instead where requests_into_l2 says so.
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(panels[R - 1]) + w.panel_bytes();
  const bool ask = Digits * P > (q8 ? quiet_dot_products.q8 : quiet_dot_products.q4), into_l2 = requests_into_l2;
  for (std::size_t b = 0; b < blocks; ++b) {
    if (ask)
      for (std::size_t line = 0; line < block_bytes; line += 64)
        request_line(reinterpret_cast<const void*>(ahead + b * block_bytes + line), into_l2);
    __m512i q[R][8];
    __m512 d[R], m[R];
    SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
      const std::byte* block = panels[r] + b * block_bytes;
      d[r] = load_f16x16(block);
      if constexpr (has_min) m[r] = load_f16x16(block + 2 * panel_rows);
      if constexpr (q8) {
        SPECDEC_UNROLL for (int g = 0; g < 8; ++g) {
          q[r][g] = _mm512_loadu_si512(block + q_offset + 64 * g);
          SPECDEC_IN_REGISTER(q[r][g]);  // one load (GCC would load it again for every digit)
        }
      } else {
        SPECDEC_UNROLL for (int g = 0; g < 4; ++g) {
          __m512i v = _mm512_loadu_si512(block + q_offset + 64 * g);
          SPECDEC_IN_REGISTER(v);  // one load (GCC would fold it into both the AND and the shift)
          q[r][g] = _mm512_and_si512(v, low);                             // columns 4g .. 4g+3
          q[r][g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);  // columns 16+4g .. 16+4g+3
        }
      }
    }
    const std::byte* xb = xq + b * P * entry;
    // Positions in sub-groups of G whose chains are issued interleaved (see DotSchedule), each position's
    // digit sums in C chains that start from the offset correction (integer adds are exact in any order).
    SPECDEC_UNROLL for (int p0 = 0; p0 < P; p0 += G) {
      __m512i s[R][G][Digits][C];
      SPECDEC_UNROLL for (int i = 0; i < G; ++i) {
        if (p0 + i >= P) break;
        std::int32_t sums[Digits];
        std::memcpy(sums, xb + (p0 + i) * entry + (Digits == 1 ? 40 : 96), sizeof sums);
        SPECDEC_UNROLL for (int r = 0; r < R; ++r)
          SPECDEC_UNROLL for (int t = 0; t < Digits; ++t) {
            s[r][i][t][0] = _mm512_set1_epi32(-offset * sums[t]);
            SPECDEC_UNROLL for (int c = 1; c < C; ++c) s[r][i][t][c] = _mm512_setzero_si512();
          }
      }
      // Each 4 input bytes are broadcast straight from memory, not through a general register.
      SPECDEC_UNROLL for (int g = 0; g < 8; ++g)
        SPECDEC_UNROLL for (int t = 0; t < Digits; ++t)
          SPECDEC_UNROLL for (int i = 0; i < G; ++i) {
            if (p0 + i >= P) break;
            const __m512i word = _mm512_set1_epi32(gguf::detail::load_i32(xb + (p0 + i) * entry + 32 * t + 4 * g));
            SPECDEC_UNROLL for (int r = 0; r < R; ++r)
              s[r][i][t][g % C] = _mm512_dpbusd_epi32(s[r][i][t][g % C], q[r][g], word);
          }
      SPECDEC_UNROLL for (int i = 0; i < G; ++i) {
        if (p0 + i >= P) break;
        const int p = p0 + i;
        const std::byte* e = xb + p * entry;
        float scale, mx;
        std::memcpy(&scale, e + (Digits == 1 ? 32 : 108), 4);
        std::memcpy(&mx, e + (Digits == 1 ? 36 : 112), 4);
        const __m512 scale_v = _mm512_set1_ps(scale);
        SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
          // The exact integer dot product of 16 rows' signed weights with digit plane t.
          const auto digit_dot = [&](int t) SPECDEC_ALWAYS_INLINE_LAMBDA {
            __m512i sum = s[r][i][t][0];
            if constexpr (C == 2) sum = _mm512_add_epi32(sum, s[r][i][t][1]);
            if constexpr (C == 4)
              sum = _mm512_add_epi32(_mm512_add_epi32(sum, s[r][i][t][1]), _mm512_add_epi32(s[r][i][t][2], s[r][i][t][3]));
            return sum;
          };
          if constexpr (Digits == 1) {
            acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(digit_dot(0)), _mm512_mul_ps(d[r], scale_v), acc[r][p]);
          } else {
            const __m512i s_low = digit_dot(0), s_mid = digit_dot(1), s_high = digit_dot(2);
            const __m512 low_mid = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(s_mid, 8), s_low));
            const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_high), _mm512_set1_ps(65536.0f), low_mid);
            acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(t, scale_v), d[r], acc[r][p]);
          }
          if constexpr (has_min) acc[r][p] = _mm512_fmadd_ps(m[r], _mm512_set1_ps(mx), acc[r][p]);
        }
      }
    }
  }
  store_panels<R, P>(out, panel, acc);
}

template <PanelEncoding Type, int Digits, int R, int... P>
constexpr std::array<DotKernelFn, sizeof...(P)> dot_kernel_table(std::integer_sequence<int, P...>) {
  return {&panel_kernel_qdot<Type, Digits, R, P + 1>...};
}

template <PanelEncoding Type, int Digits>
void matmul_panels_dot_avx512(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                              std::size_t x_stride, std::size_t positions, std::uint64_t call,
                              QuantizedInputs given) {
  // One panel per step: 8 quant vectors per panel plus P accumulators already fill the registers (two panels
  // measured slower, from spills; and, sharing the input broadcasts, 1.09-1.5x the time of whole forwards on
  // 2026-12-03 at 1-9 positions, read as two interleaved weight streams).
  static constexpr auto single =
      dot_kernel_table<Type, Digits, 1>(std::make_integer_sequence<int, max_position_group>{});
  const std::byte* xq = prepared_quantized_inputs<Digits>(x, x_stride, positions, out.weights->cols(), call, given);
  // The run's first panel is asked for whole, into L2, before its first block is used: from 2 positions up (5
  // for one-digit q8_0) the panel kernel's prefetch covers the panels after it (below that, this is the only
  // software prefetch), and the demand loads alone found the first one cold (quantized_dot forwards at context
  // 318 took 0.97-0.99x the time at 2-7 positions with this, 0.98-1.00x at 1, alternating call by call).
  if (first < last) {
    const auto* first_panel = reinterpret_cast<const char*>(out.weights->panel(first));
    for (std::size_t line = 0; line < out.weights->panel_bytes(); line += 64) _mm_prefetch(first_panel + line, _MM_HINT_T1);
  }
  run_dot_kernels(single, out, first, last, positions, xq, Digits);
}
SPECDEC_AVX512_WARNINGS_ON
#endif  // __AVX512VNNI__

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512VNNI__)
// ---------------------------------------------------------------------------------------------------------
// AVX2 kernels of the block encodings, for CPUs without AVX-512 VNNI: the same exact integer sums and the same
// float sequence per (row, position) as the portable twin, on 8-row halves of a panel.
//
// The integer dot products use vpmaddubsw (unsigned × signed bytes, adjacent pairs added in 16 bits with
// saturation) and vpmaddwd, arranged so that nothing saturates: the unsigned operand is always a nibble (q4's
// quants; q8_0's stored bytes q + 128 split into two nibbles, hi·16 + lo) and the input digits lie in
// [−128, 127], so a pair is at most 3,840 in magnitude and 8 column groups add up to at most 30,720 < 2^15.
// One-digit inputs lie in [−127, 127] (the quantiser clamps them there), so q8_0 with one digit multiplies
// the quants directly, as llama.cpp does: |q| (up to 128, unsigned) × x with q's sign (vpsignb, which cannot
// overflow on ±127), a pair at most 32,512 < 2^15, each group widened to 32 bits at once; that takes about
// 30% fewer instructions than the nibbles (SmolLM2's output head is q8_0).
// Integer sums are exact in any order, so the bits equal the portable twin's.
#define SPECDEC_HAVE_AVX2_DOT 1

/// 8 half-precision numbers widened to float (exact).
SPECDEC_ALWAYS_INLINE __m256 load_f16x8(const std::byte* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/// H halves (8 rows each) of one panel, from half `first_half`, × P positions of a block matrix with Digits-digit
/// inputs. With H = 2 each block's lines are used for both halves in turn, so the panel is read in one pass.
template <PanelEncoding Type, int Digits, int P, int H>
void halves_kernel_qdot_avx2(const MatmulOutput& out, std::size_t panel, int first_half, const std::byte* xq) {
  constexpr bool has_min = Type == PanelEncoding::q4_1, q8 = Type == PanelEncoding::q8_0;
  constexpr bool signed_q8 = q8 && Digits == 1;  // the quants as signed bytes (see above)
  constexpr std::int32_t offset = signed_q8 ? 0 : q8 ? 128 : Type == PanelEncoding::q4_0 ? 8 : 0;
  constexpr std::size_t block_bytes = panel_block_bytes(Type), q_offset = (has_min ? 4 : 2) * panel_rows;
  constexpr std::size_t entry = entry_bytes(Digits);
  const PackedMatrix& w = *out.weights;
  const std::byte* panel_bytes = w.panel(panel);
  __m256 accs[H][P];
  SPECDEC_UNROLL for (int h = 0; h < H; ++h)
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) accs[h][p] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const std::size_t blocks = w.cols() / quant_block;
  // The pass over the first half asks for the same block of the next panel: into L2 (T1) where requests_into_l2
  // says so and a block takes at most l2_dot_products_avx2 digit products (Digits × P; 9 on AMD family 25), else
  // with the non-temporal hint (NTA).
  // - Until 2026-12-02 it asked for the panel a step of run_dot_kernels ahead (4 panels) into L2, which on a
  //   2-core Zen 3 took forwards of SmolLM2 (context 256, alternating with no prefetch, medians of 11) to
  //   0.90-0.96x the time at 5 positions, 0.93-0.94x at 9 and 0.98-1.00x at 1.
  // - Built for AVX2 and run on the AVX-512 machine of 2026-12-02 (AMD family 26; no Zen 3 was at hand),
  //   alternating call by call, NTA one panel ahead took 0.87-0.90x the time of that (0.94-0.98x with NTA 4
  //   panels ahead) at 1, 2 and 5 positions of quantized_dot, 0.92x at 9; quantized 0.87x at 1 and 0.95x at 5.
  // - On the Zen 4 of 2026-12-05 (family 25; 2 threads, alternating round by round in one process, medians of
  //   40 forwards a round, 6-10 rounds), T1 one panel ahead took quantized forwards to 0.90-0.92x the time of
  //   NTA at one position and 0.98x at 2, but 1.02-1.05x at 5 and 1.01x at 9; quantized_dot (with the one-pass
  //   kernel at one position, see panel_kernel_qdot_avx2) to 0.97-0.975x at 1, 0.95x at 2 and 5, 0.97x at 9,
  //   but 1.02x at 16. (quantized at 3 positions, 9 digit products, was not measured.) Not measured on a Zen 3.
  // - On the Intel Xeon of 2026-12-05 (family 6), where NTA requests read 0.4x the bandwidth (see
  //   requests_into_l2), T1 instead of NTA took quantized_dot forwards to 0.40-0.53x the time at one position and
  //   quantized to 0.48-0.73x (bench_llama_forward, 2 threads, two runs each, in turn); above 9 products see
  //   l2_dot_products_avx2.
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(panel_bytes) + w.panel_bytes();  // the next panel
  const bool into_l2 = requests_into_l2 && Digits * P <= l2_dot_products_avx2;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = panel_bytes + b * block_bytes;
    if (first_half == 0)
      for (std::size_t line = 0; line < block_bytes; line += 64)
        request_line(reinterpret_cast<const void*>(ahead + b * block_bytes + line), into_l2);
    const std::byte* xb = xq + b * P * entry;
    SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
      const int half = first_half + h;
      const std::size_t quants = q_offset + 32 * static_cast<std::size_t>(half);  // this half's rows in a vector
      const std::size_t scales = 16 * static_cast<std::size_t>(half);
      __m256(&acc)[P] = accs[h];
      // Σ_g nibbles[g]·(digit t's bytes 4g..4g+3 of position p), 16 bits per pair of columns, as 32-bit row sums
      const auto nibble_dot = [&](const __m256i* nib, int groups, int first_group, int p,
                                  int t) SPECDEC_ALWAYS_INLINE_LAMBDA {
        const std::byte* e = xb + p * entry + 32 * t;
        __m256i s16 = _mm256_setzero_si256();
        SPECDEC_UNROLL for (int g = 0; g < groups; ++g) {
          const __m256i x = _mm256_set1_epi32(gguf::detail::load_i32(e + 4 * (first_group + g)));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(nib[g], x));
        }
        return _mm256_madd_epi16(s16, ones);
      };
      __m256i sums[P][Digits];  // exact Σ stored·x per (position, digit); Σ q·x for signed_q8
      if constexpr (signed_q8) {
        SPECDEC_UNROLL for (int p = 0; p < P; ++p) sums[p][0] = _mm256_setzero_si256();
        SPECDEC_UNROLL for (int g = 0; g < 8; ++g) {
          const __m256i stored = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + quants + 64 * g));
          const __m256i q = _mm256_xor_si256(stored, flip);  // q + 128 -> q
          const __m256i magnitude = _mm256_abs_epi8(q);      // as unsigned bytes: |−128| = 128
          SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
            const __m256i x = _mm256_set1_epi32(gguf::detail::load_i32(xb + p * entry + 4 * g));
            const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, q));
            sums[p][0] = _mm256_add_epi32(sums[p][0], _mm256_madd_epi16(pairs, ones));
          }
        }
      } else if constexpr (q8) {
        SPECDEC_UNROLL for (int p = 0; p < P; ++p)
          SPECDEC_UNROLL for (int t = 0; t < Digits; ++t) sums[p][t] = _mm256_setzero_si256();
        // 4 column groups at a time: 8 registers of nibbles
        SPECDEC_UNROLL for (int first = 0; first < 8; first += 4) {
          __m256i lo[4], hi[4];
          SPECDEC_UNROLL for (int g = 0; g < 4; ++g) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + quants + 64 * (first + g)));
            lo[g] = _mm256_and_si256(v, low);
            hi[g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          }
          SPECDEC_UNROLL for (int p = 0; p < P; ++p)
            SPECDEC_UNROLL for (int t = 0; t < Digits; ++t)
              sums[p][t] = _mm256_add_epi32(sums[p][t],
                                            _mm256_add_epi32(_mm256_slli_epi32(nibble_dot(hi, 4, first, p, t), 4),
                                                             nibble_dot(lo, 4, first, p, t)));
        }
      } else {
        __m256i q[8];
        SPECDEC_UNROLL for (int g = 0; g < 4; ++g) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + quants + 64 * g));
          q[g] = _mm256_and_si256(v, low);                             // columns 4g .. 4g+3
          q[g + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);  // columns 16+4g .. 16+4g+3
        }
        SPECDEC_UNROLL for (int p = 0; p < P; ++p)
          SPECDEC_UNROLL for (int t = 0; t < Digits; ++t) sums[p][t] = nibble_dot(q, 8, 0, p, t);
      }
      const __m256 d = load_f16x8(block + scales);
      const __m256 m = has_min ? load_f16x8(block + 2 * panel_rows + scales) : _mm256_setzero_ps();
      SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
        const std::byte* e = xb + p * entry;
        std::int32_t digit_sums[Digits];
        float scale, mx;  // one digit: dx and dx·Σxq; three: 2^-s and float(ΣX)·2^-s
        std::memcpy(digit_sums, e + (Digits == 1 ? 40 : 96), sizeof digit_sums);
        std::memcpy(&scale, e + (Digits == 1 ? 32 : 108), 4);
        std::memcpy(&mx, e + (Digits == 1 ? 36 : 112), 4);
        __m256i s[Digits];
        SPECDEC_UNROLL for (int t = 0; t < Digits; ++t)
          s[t] = _mm256_sub_epi32(sums[p][t], _mm256_set1_epi32(offset * digit_sums[t]));
        if constexpr (Digits == 1) {
          acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[0]), _mm256_mul_ps(d, _mm256_set1_ps(scale)), acc[p]);
        } else {
          const __m256 low_mid = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(s[1], 8), s[0]));
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[2]), _mm256_set1_ps(65536.0f), low_mid);
          acc[p] = _mm256_fmadd_ps(_mm256_mul_ps(t, _mm256_set1_ps(scale)), d, acc[p]);
        }
        if constexpr (has_min) acc[p] = _mm256_fmadd_ps(m, _mm256_set1_ps(mx), acc[p]);
      }
    }
  }
  SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
    const std::size_t row0 = panel * panel_rows + 8 * static_cast<std::size_t>(first_half + h);
    if (row0 >= w.rows()) break;  // padding rows only, here and in any later half
    const std::size_t lanes = std::min<std::size_t>(8, w.rows() - row0);
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
      float v[8];
      _mm256_storeu_ps(v, accs[h][p]);
      float* y = out.y + p * out.y_stride + row0;
      for (std::size_t l = 0; l < lanes; ++l) y[l] = out.accumulate ? y[l] + v[l] : v[l];
    }
  }
}

/// One panel × P positions: at one or two positions with one-digit inputs both halves in one pass over the panel,
/// else the halves one after the other (a pass each). Built for AVX2 and run on the Zen 4 of 2026-12-05 (2 threads,
/// forwards of SmolLM2 at context 256, one position, alternating round by round in one process, medians of 40
/// forwards a round): one pass with T1 requests took quantized_dot to 0.969x and 0.975x the time of two passes
/// with NTA (8 and 10 rounds; the q8_0 output head's stage 0.80-0.85 ms against 0.86-0.97), where two passes
/// with T1 took 1.02-1.03x. One thread reading a 113 MB q4_1_dot matrix at one position from memory (medians of
/// 5-7 runs): 37-38 GB/s in one pass with T1 against 22 GB/s in two with NTA and 34 in one with NTA; q8_0_dot 25
/// against 17. At two positions one pass read 19.6 GB/s against 23.1 for two passes with T1 (registers run
/// short), and with three digits (`quantized`) the forward's products took 2.4 ms against 2.0-2.3.
/// On the Zen 3 of 2026-12-06 (AMD family 25, model 1, the CPU these kernels are for; SmolLM2 forwards at
/// context 256, 2 threads, alternating round by round in one process, medians of 25 forwards a round, 10-12
/// rounds) one pass took quantized_dot to 0.879x the time of two at 2 positions with the weights evicted before
/// each forward (two runs) and 0.859x back to back, but 1.035x at 3 positions and 1.094x at 4 (evicted); two
/// passes at one position took 1.086x (evicted) and 1.115x (back to back). So one pass at 1 and 2 positions,
/// the forwards outweighing the single matrix read on the proxy above; AVX2-only Intel CPUs were not measured.
template <PanelEncoding Type, int Digits, int P>
void panel_kernel_qdot_avx2(const MatmulOutput& out, std::size_t panel, const std::byte* xq) {
  if constexpr (Digits == 1 && P <= 2) {
    halves_kernel_qdot_avx2<Type, Digits, P, 2>(out, panel, 0, xq);
  } else {
    halves_kernel_qdot_avx2<Type, Digits, P, 1>(out, panel, 0, xq);
    halves_kernel_qdot_avx2<Type, Digits, P, 1>(out, panel, 1, xq);
  }
}

template <PanelEncoding Type, int Digits, int... P>
constexpr std::array<DotKernelFn, sizeof...(P)> dot_kernel_table_avx2(std::integer_sequence<int, P...>) {
  return {&panel_kernel_qdot_avx2<Type, Digits, P + 1>...};
}

/// Output panels [first, last) of a block matrix for all positions, in groups of at most 16.
template <PanelEncoding Type, int Digits>
void matmul_panels_dot_avx2(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                            std::size_t x_stride, std::size_t positions, std::uint64_t call, QuantizedInputs given) {
  static constexpr auto kernels =
      dot_kernel_table_avx2<Type, Digits>(std::make_integer_sequence<int, max_position_group>{});
  const std::byte* xq = prepared_quantized_inputs<Digits>(x, x_stride, positions, out.weights->cols(), call, given);
  run_dot_kernels(kernels, out, first, last, positions, xq, Digits);
}
#endif  // AVX2 without AVX-512 VNNI


/// Output panels [first, last) of `out` for all positions.
inline void matmul_panels(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                          std::size_t x_stride, std::size_t positions, bool portable, std::uint64_t call,
                          QuantizedInputs given) {
#if defined(__AVX512F__)
  if (!portable) {
    switch (out.weights->encoding()) {
      case PanelEncoding::f32:
        return matmul_panels_avx512<VisitF32, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16:
        return matmul_panels_avx512<VisitBf16, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
#if defined(__AVX512BF16__)
      case PanelEncoding::bf16_dot:
        return matmul_panels_avx512<DotBf16, InputLayout::bf16_pairs>(out, first, last, x, x_stride, positions, call);
#else
      case PanelEncoding::bf16_dot:  // no BF16 dot instruction: bf16 products of bf16-rounded inputs, as portable
        return matmul_panels_avx512<VisitBf16, InputLayout::bf16_rounded>(out, first, last, x, x_stride, positions,
                                                                           call);
#endif
      default: break;
    }
#if defined(__AVX512VNNI__)
    const auto run = [&](auto type, auto digits) {
      matmul_panels_dot_avx512<type(), digits()>(out, first, last, x, x_stride, positions, call, given);
    };
    if (with_block_encoding(out.weights->encoding(), run)) return;
#endif
  }
#endif
#if defined(SPECDEC_HAVE_AVX2_FLOAT)
  if (!portable) {
    switch (out.weights->encoding()) {
      case PanelEncoding::f32:
        return matmul_panels_avx2<VisitF32Avx2, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16:
        return matmul_panels_avx2<VisitBf16Avx2, InputLayout::floats>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16_dot:
        return matmul_panels_avx2<VisitBf16Avx2, InputLayout::bf16_rounded>(out, first, last, x, x_stride, positions,
                                                                            call);
      default: break;
    }
  }
#endif
#if defined(SPECDEC_HAVE_AVX2_DOT)
  const auto run = [&](auto type, auto digits) {
    matmul_panels_dot_avx2<type(), digits()>(out, first, last, x, x_stride, positions, call, given);
  };
  if (!portable && with_block_encoding(out.weights->encoding(), run)) return;
#endif
  (void)portable;
  if (!is_float_encoding(out.weights->encoding()))
    return matmul_panels_dot_portable(out, first, last, x, x_stride, positions, call, given);
  matmul_panels_portable(out, first, last, x, x_stride, positions);
}


}  // namespace specdec::llama::detail
