// specdec/llama/detail/matmul_dot_avx2.hpp — the AVX2 kernels of the block encodings (q8_0, q4_0, q4_1 with
// one- or three-digit inputs), for CPUs without AVX-512 VNNI: exact integer sums by vpmaddubsw and vpmaddwd,
// then the fixed float sequence of the portable twin.
// Entry point: detail::matmul_panels_dot_avx2. Read first: matmul_dot_kernels.hpp (the input entries and the
// float sequence).
#pragma once

#include "specdec/llama/detail/matmul_dot_kernels.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

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
        const std::byte* e = xb + std::size_t(p) * entry + 32 * t;
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
            const __m256i x = _mm256_set1_epi32(gguf::detail::load_i32(xb + std::size_t(p) * entry + 4 * g));
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
        const std::byte* e = xb + std::size_t(p) * entry;
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
      float* y = out.y + std::size_t(p) * out.y_stride + row0;
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

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
