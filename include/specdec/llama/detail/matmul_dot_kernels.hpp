// specdec/llama/detail/matmul_dot_kernels.hpp — the integer dot product encodings (q8_0_dot, q4_0_dot,
// q4_1_dot) and the dispatcher detail::matmul_panels that picks a kernel per encoding.
// Entry point: detail::matmul_panels. Read first: matmul_kernels.hpp (the float kernels and helpers).
//
// Batch invariance as for the float kernels: one accumulator per (row, position) from zero, one fixed
// sequence of float operations per 32-column block (the integer sums are exact), inputs quantised per
// position; so results do not depend on how positions are grouped or which thread runs a panel.
#pragma once

#include <algorithm>
#include <array>
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
// Inputs of the *_dot encodings: each position's inputs quantised to int8 per 32-column block, as llama.cpp's
// Q8_0 activations: dx = max|x| / 127, xq = nearbyint(x / dx) (default rounding mode). A position's
// quantisation depends on that position's inputs only. Entry (position, block), 48 bytes:
//   xq[32] int8 | dx float | mx = dx·Σxq float | Σxq int32 | 4 bytes padding
// Group g of positions [begin, begin + count) holds its entries at [begin·blocks + b·count + i].
//
// Per block, a (row, position) accumulator takes the exact integer dot product s = Σ q·xq (corrected to the
// signed weight: q4_0 s − 8·Σxq, q8_0 stores q + 128 and uses s − 128·Σxq) and adds it in a fixed float
// sequence: acc = fma(float(s), d·dx, acc), then for q4_1 acc = fma(m, mx, acc). Both paths do exactly that.

inline constexpr std::size_t dot_entry_bytes = 48;

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

/// quantize_block_portable with AVX-512: the same float operations (max is exact in any order; the conversion
/// rounds to nearest even like nearbyint in the default mode; |x·inverse| <= 127 up to rounding, so clamping
/// the integers equals clamping the floats), so the same bytes for finite inputs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: its own _mm512_undefined_* and
#pragma GCC diagnostic ignored "-Wuninitialized"        // _mm512_reduce_max_ps (false positives)
#endif
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
#else
  quantize_block_portable(xb, e);
#endif
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/// Quantises positions × cols inputs into the group layout above. requires: cols % 32 == 0.
inline void quantize_inputs(const float* x, std::size_t x_stride, std::size_t positions, std::size_t cols,
                            std::byte* out) {
  const std::size_t blocks = cols / quant_block;
  for (std::size_t g = 0; g < group_count(positions); ++g) {
    const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
    for (std::size_t i = 0; i < count; ++i) {
      const float* row = x + (begin + i) * x_stride;
      for (std::size_t b = 0; b < blocks; ++b)
        quantize_block(row + b * quant_block, out + ((begin * blocks) + b * count + i) * dot_entry_bytes);
    }
  }
}

/// This thread's quantised copy of call `call`'s inputs (made on the thread's first block of the call).
inline const std::byte* prepared_quantized_inputs(const float* x, std::size_t x_stride, std::size_t positions,
                                                  std::size_t cols, std::uint64_t call) {
  static thread_local std::vector<CacheLine> buffer;  // grows, never shrinks
  static thread_local std::uint64_t prepared = 0;
  if (prepared != call) {
    const std::size_t bytes = positions * (cols / quant_block) * dot_entry_bytes;
    if (buffer.size() * sizeof(CacheLine) < bytes) buffer.resize((bytes + 63) / 64);
    quantize_inputs(x, x_stride, positions, cols, buffer.data()->bytes);
    prepared = call;
  }
  return buffer.data()->bytes;
}

/// Portable twin of the dot kernel: the same integer sums and the same float sequence per (row, position).
inline void matmul_panels_dot_portable(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                                       std::size_t x_stride, std::size_t positions, std::uint64_t call) {
  const PackedMatrix& w = *out.weights;
  const PanelEncoding type = block_type(w.encoding());
  const bool has_min = type == PanelEncoding::q4_1, q8 = type == PanelEncoding::q8_0;
  const std::int32_t offset = q8 ? 128 : type == PanelEncoding::q4_0 ? 8 : 0;  // weight = stored − offset
  const std::size_t blocks = w.cols() / quant_block, block_bytes = panel_block_bytes(type);
  const std::size_t q_offset = (has_min ? 4 : 2) * panel_rows;
  const std::byte* xq = prepared_quantized_inputs(x, x_stride, positions, w.cols(), call);
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
              q[j][l] = static_cast<std::int32_t>(block[q_offset + quant_offset(true, j, l)]);
            } else {
              const auto byte = static_cast<std::int32_t>(block[q_offset + quant_offset(true, j % 16, l)]);
              q[j][l] = j < 16 ? byte & 15 : byte >> 4;
            }
          }
        for (std::size_t i = 0; i < count; ++i) {
          const std::byte* e = xq + ((begin * blocks) + b * count + i) * dot_entry_bytes;
          std::int8_t xv[quant_block];
          float dx, mx;
          std::int32_t sum;
          std::memcpy(xv, e, quant_block);
          std::memcpy(&dx, e + 32, 4);
          std::memcpy(&mx, e + 36, 4);
          std::memcpy(&sum, e + 40, 4);
          std::int32_t s[panel_rows] = {};
          for (std::size_t j = 0; j < quant_block; ++j)
            for (std::size_t l = 0; l < panel_rows; ++l) s[l] += q[j][l] * xv[j];
          for (std::size_t l = 0; l < panel_rows; ++l) {
            const float dd = d[l] * dx;
            acc[i][l] = std::fma(static_cast<float>(s[l] - offset * sum), dd, acc[i][l]);
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
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 flags the _mm512_undefined_epi32() inside its own intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/// The dot kernel for R panels × P positions of a q8_0_dot / q4_0_dot / q4_1_dot matrix: per block, the
/// quants are loaded (and nibbles unpacked) once and used by all R·P integer dot products (8 vpdpbusd each:
/// 16 rows × 4 columns per instruction, the 4 input bytes broadcast), then each sum is finalised in the
/// order the portable twin uses. xq: the group's entries (see quantize_inputs).
template <PanelEncoding Type, int R, int P>
void panel_kernel_qdot(const MatmulOutput& out, std::size_t panel, const std::byte* xq) {
  constexpr bool has_min = Type == PanelEncoding::q4_1, q8 = Type == PanelEncoding::q8_0;
  constexpr std::int32_t offset = q8 ? 128 : Type == PanelEncoding::q4_0 ? 8 : 0;
  constexpr std::size_t block_bytes = panel_block_bytes(Type), q_offset = (has_min ? 4 : 2) * panel_rows;
  const PackedMatrix& w = *out.weights;
  const std::byte* panels[R];
  for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + r);
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const std::size_t blocks = w.cols() / quant_block;
  // From 6 positions on the kernel is compute-bound, and the hardware prefetcher, which follows the demand,
  // leaves memory idle between panels (8 and 9 positions ran at 60-65% of the in-cache rate): each block also
  // asks for the same block of the next panel. (Measured on a 94 MB matrix, 2 threads: 9 positions 7.6-8.6 ->
  // 5.0 ms; with fewer positions the gain was within the noise.)
  constexpr int prefetch_from = 6;
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(panels[R - 1]) + w.panel_bytes();
  for (std::size_t b = 0; b < blocks; ++b) {
    if constexpr (P >= prefetch_from)
      for (std::size_t line = 0; line < block_bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + b * block_bytes + line), _MM_HINT_T0);
    __m512i q[R][8];
    __m512 d[R], m[R];
    for (int r = 0; r < R; ++r) {
      const std::byte* block = panels[r] + b * block_bytes;
      d[r] = load_f16x16(block);
      if constexpr (has_min) m[r] = load_f16x16(block + 2 * panel_rows);
      if constexpr (q8) {
        for (int g = 0; g < 8; ++g) q[r][g] = _mm512_loadu_si512(block + q_offset + 64 * g);
      } else {
        for (int g = 0; g < 4; ++g) {
          const __m512i v = _mm512_loadu_si512(block + q_offset + 64 * g);
          q[r][g] = _mm512_and_si512(v, low);                             // columns 4g .. 4g+3
          q[r][g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);  // columns 16+4g .. 16+4g+3
        }
      }
    }
    const std::byte* xb = xq + b * P * dot_entry_bytes;
    for (int p = 0; p < P; ++p) {
      const std::byte* e = xb + p * dot_entry_bytes;
      // Each 4 input bytes are broadcast straight from memory (an embedded broadcast operand), not through a
      // general register.
      const auto word = [e](int g) { return _mm512_set1_epi32(gguf::detail::load_i32(e + 4 * g)); };
      std::int32_t sum;
      float dx, mx;
      std::memcpy(&dx, e + 32, 4);
      std::memcpy(&mx, e + 36, 4);
      std::memcpy(&sum, e + 40, 4);
      const __m512 dxv = _mm512_set1_ps(dx);
      for (int r = 0; r < R; ++r) {
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();  // two chains (integer: exact)
        for (int g = 0; g < 8; g += 2) {
          s0 = _mm512_dpbusd_epi32(s0, q[r][g], word(g));
          s1 = _mm512_dpbusd_epi32(s1, q[r][g + 1], word(g + 1));
        }
        __m512i s = _mm512_add_epi32(s0, s1);
        if constexpr (offset != 0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(offset * sum));
        acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d[r], dxv), acc[r][p]);
        if constexpr (has_min) acc[r][p] = _mm512_fmadd_ps(m[r], _mm512_set1_ps(mx), acc[r][p]);
      }
    }
  }
  store_panels<R, P>(out, panel, acc);
}

using DotKernelFn = void (*)(const MatmulOutput&, std::size_t, const std::byte*);

template <PanelEncoding Type, int R, int... P>
constexpr std::array<DotKernelFn, sizeof...(P)> dot_kernel_table(std::integer_sequence<int, P...>) {
  return {&panel_kernel_qdot<Type, R, P + 1>...};
}

template <PanelEncoding Type>
void matmul_panels_dot_avx512(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                              std::size_t x_stride, std::size_t positions, std::uint64_t call) {
  // One panel per step: 8 quant vectors per panel plus P accumulators already fill the registers (two panels
  // measured slower, from spills).
  static constexpr auto single = dot_kernel_table<Type, 1>(std::make_integer_sequence<int, max_position_group>{});
  const std::size_t blocks = out.weights->cols() / quant_block;
  const std::byte* xq = prepared_quantized_inputs(x, x_stride, positions, out.weights->cols(), call);
  constexpr std::size_t block = 4;  // panels whose weights stay in cache while every position group passes
  for (std::size_t b = first; b < last; b += block) {
    const std::size_t block_end = std::min(last, b + block);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      const std::byte* xg = xq + begin * blocks * dot_entry_bytes;
      MatmulOutput og = out;
      og.y = out.y + begin * out.y_stride;
      for (std::size_t p = b; p < block_end; ++p) single[count - 1](og, p, xg);
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // __AVX512VNNI__


/// Output panels [first, last) of `out` for all positions.
inline void matmul_panels(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                          std::size_t x_stride, std::size_t positions, bool portable, std::uint64_t call) {
#if defined(__AVX512F__)
  if (!portable) {
    switch (out.weights->encoding()) {
      case PanelEncoding::f32: return matmul_panels_avx512<VisitF32>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::bf16: return matmul_panels_avx512<VisitBf16>(out, first, last, x, x_stride, positions, call);
#if defined(__AVX512BF16__)
      case PanelEncoding::bf16_dot: return matmul_panels_avx512<DotBf16>(out, first, last, x, x_stride, positions, call);
#else
      case PanelEncoding::bf16_dot: break;  // no BF16 dot instruction: the portable path emulates it
#endif
      case PanelEncoding::q8_0: return matmul_panels_avx512<VisitQ8_0>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::q4_0: return matmul_panels_avx512<VisitQ4<false>>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::q4_1: return matmul_panels_avx512<VisitQ4<true>>(out, first, last, x, x_stride, positions, call);
#if defined(__AVX512VNNI__)
      case PanelEncoding::q8_0_dot:
        return matmul_panels_dot_avx512<PanelEncoding::q8_0>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::q4_0_dot:
        return matmul_panels_dot_avx512<PanelEncoding::q4_0>(out, first, last, x, x_stride, positions, call);
      case PanelEncoding::q4_1_dot:
        return matmul_panels_dot_avx512<PanelEncoding::q4_1>(out, first, last, x, x_stride, positions, call);
#else
      case PanelEncoding::q8_0_dot:
      case PanelEncoding::q4_0_dot:
      case PanelEncoding::q4_1_dot: break;  // no VNNI: the portable twin gives the same bits
#endif
    }
  }
#endif
  (void)portable;
  if (is_dot_encoding(out.weights->encoding()))
    return matmul_panels_dot_portable(out, first, last, x, x_stride, positions, call);
  matmul_panels_portable(out, first, last, x, x_stride, positions);
}


}  // namespace specdec::llama::detail
