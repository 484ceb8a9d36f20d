// specdec/llama/detail/matmul_dot_avx512.hpp — the AVX-512 VNNI kernels of the block encodings (q8_0, q4_0,
// q4_1 with one- or three-digit inputs): exact integer sums by vpdpbusd, then the fixed float sequence of the
// portable twin.
// Entry point: detail::matmul_panels_dot_avx512. Read first: matmul_dot_kernels.hpp (the input entries and the
// float sequence), matmul_avx512.hpp (the helpers it shares with the float kernels).
#pragma once

#include "specdec/llama/detail/matmul_avx512.hpp"
#include "specdec/llama/detail/matmul_dot_kernels.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

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
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + std::size_t(r));
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
        std::memcpy(sums, xb + std::size_t(p0 + i) * entry + (Digits == 1 ? 40 : 96), sizeof sums);
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
            const __m512i word =
                _mm512_set1_epi32(gguf::detail::load_i32(xb + std::size_t(p0 + i) * entry + 32 * t + 4 * g));
            SPECDEC_UNROLL for (int r = 0; r < R; ++r)
              s[r][i][t][g % C] = _mm512_dpbusd_epi32(s[r][i][t][g % C], q[r][g], word);
          }
      SPECDEC_UNROLL for (int i = 0; i < G; ++i) {
        if (p0 + i >= P) break;
        const int p = p0 + i;
        const std::byte* e = xb + std::size_t(p) * entry;
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

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
