// specdec/llama/detail/matmul_avx2.hpp — the AVX2 kernels of the float encodings (f32, bf16, bf16_dot), for
// CPUs without AVX-512: a panel's 16 rows as two 8-lane halves, each accumulator in the portable path's order.
// Entry point: detail::matmul_panels_avx2. Read first: matmul_kernels.hpp (the column order and the knobs
// these kernels follow).
#pragma once

#include "specdec/llama/detail/matmul_kernels.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

#if defined(SPECDEC_HAVE_AVX2_FLOAT)
// ---------------------------------------------------------------------------------------------------------
// AVX2 path (CPUs without AVX-512): a panel's 16 rows are two 8-lane halves, each accumulator in the portable
// path's order. AVX2 has 16 registers: up to 6 positions take one pass over the panel with both halves (12
// accumulators, 2 weight vectors, 1 broadcast); 7 to 12 take one pass per half (P accumulators, 1 weight
// vector); more are split into passes of at most 12. Fewer than 8 accumulators leave the FMA units waiting on
// their 4-cycle latency, hence several panels per step for 1 and 2 positions (2 panels × 3 positions spilled),
// except where single_stream_steps says one stream reads faster (AMD's Zen 4): there 1 and 2 positions take a
// panel a step (or a bf16 pair) and ask for nothing ahead; on a Zen 3 one position takes steps of 4 panels and
// asks for nothing ahead (quiet_float_positions_avx2). The second and later passes over a step's panels read
// them from cache, so every other step prefetches the next step's panels into L2 (on a Zen 3, 10% faster for 5
// and 9 positions of a 151 MB matrix, two threads, medians of 9). f32 instead asks for the panels of its next
// step with the hint requests_into_l2 picks, as the block kernels do: built for AVX2 and run on the AVX-512
// machine of 2026-12-02 (a Zen 5, where that hint is NTA), alternating call by call, forwards of f32 took
// 0.81-0.92x the time at 1 position and 0.82-0.92x at 5 with NTA against T1 four panels ahead; for bf16 it was
// 0.94-0.99x at 1 and 1.02-1.03x at 5, so bf16 keeps T1. On the Intel Xeon of 2026-12-05, where NTA requests
// read 0.4x the memory bandwidth (see requests_into_l2), T1 instead of NTA took f32 0.45-0.46x the time at
// 1 position, 0.49x at 2, 0.46-0.53x at 5 and 0.55-0.63x at 9 (bench_llama_forward, 2 threads, two runs each, in
// turn). Not measured on a Zen 3 or 4 (family 25, where the hint is T1 and f32 asks from 3 positions on a
// Zen 4, from 2 on a Zen 3).

/// The visitors hand fn(w, k) the weights of column k for R panels × H halves, starting at half `half`.
struct VisitF32Avx2 {
  template <int R, int H, class Fn>
  static SPECDEC_ALWAYS_INLINE void run(const std::byte* const* panel, std::size_t cols, std::size_t, int half,
                                        Fn&& fn) {
    for (std::size_t k = 0; k < cols; ++k) {
      __m256 w[R][H];
      SPECDEC_UNROLL for (int r = 0; r < R; ++r)
        SPECDEC_UNROLL for (int h = 0; h < H; ++h)
          w[r][h] = _mm256_loadu_ps(reinterpret_cast<const float*>(panel[r]) + k * panel_rows + 8 * (half + h));
      fn(w, k);
    }
  }
};

struct VisitBf16Avx2 {
  /// stride: bf16_pair_stride of the matrix's encoding.
  template <int R, int H, class Fn>
  static SPECDEC_ALWAYS_INLINE void run(const std::byte* const* panel, std::size_t cols, std::size_t stride, int half,
                                        Fn&& fn) {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (std::size_t k = 0; k < cols; k += 2) {
      __m256i pair[R][H];  // 8 rows × (w[k], w[k + 1])
      __m256 w[R][H];
      SPECDEC_UNROLL for (int r = 0; r < R; ++r)
        SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
          pair[r][h] = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(panel[r] + k / 2 * stride + 32 * (half + h)));
          w[r][h] = _mm256_castsi256_ps(_mm256_slli_epi32(pair[r][h], 16));
        }
      fn(w, k);
      if (k + 1 == cols) break;
      SPECDEC_UNROLL for (int r = 0; r < R; ++r)
        SPECDEC_UNROLL for (int h = 0; h < H; ++h) w[r][h] = _mm256_castsi256_ps(_mm256_and_si256(pair[r][h], high));
      fn(w, k + 1);
    }
  }
};

/// Writes (or adds) R panels × H halves × P positions of accumulators to their outputs; the padded rows of the
/// last panel are dropped.
template <int R, int H, int P>
SPECDEC_ALWAYS_INLINE void store_halves_avx2(const MatmulOutput& out, std::size_t panel, int half,
                                             const __m256 (&acc)[R][H][P]) {
  const std::size_t rows = out.weights->rows();
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int h = 0; h < H; ++h) {
      const std::size_t row0 = (panel + std::size_t(r)) * panel_rows + 8 * static_cast<std::size_t>(half + h);
      if (row0 >= rows) continue;
      const std::size_t lanes = std::min<std::size_t>(8, rows - row0);
      SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
        float* y = out.y + std::size_t(p) * out.y_stride + row0;
        if (lanes == 8) {
          __m256 v = acc[r][h][p];
          if (out.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y), v);
          _mm256_storeu_ps(y, v);
        } else {
          float v[8];
          _mm256_storeu_ps(v, acc[r][h][p]);
          for (std::size_t l = 0; l < lanes; ++l) y[l] = out.accumulate ? y[l] + v[l] : v[l];
        }
      }
    }
}

/// R panels starting at `panel`, H halves starting at `half`, × P positions: xt[k·stride + p] is position p's
/// input k (stride: the number of positions interleaved together, of which this pass takes P). `last`: the end
/// of the thread's run of panels, past which f32 asks for nothing (the next R panels past a run are another
/// thread's, up to 144 KiB a call: built for AVX2 and run on the AVX-512 machine of 2026-12-02, alternating
/// call by call, f32 forwards took 0.98x the time at 1 position and 0.99x at 5 without them; bf16, whose T1
/// request reaches 4 panels ahead, took 1.01-1.02x, so it asks past the run as before).
template <class Visitor, int R, int H, int P>
void panel_kernel_avx2(const MatmulOutput& out, std::size_t panel, std::size_t last, int half, const float* xt,
                       std::size_t stride) {
  const PackedMatrix& w = *out.weights;
  const std::byte* panels[R];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + std::size_t(r));
  // The request: f32 the next step's R panels, with the hint requests_into_l2 picks, and never past its run;
  // bf16 the panels step_panels ahead, into L2.
  constexpr bool f32 = std::is_same_v<Visitor, VisitF32Avx2>;
  const std::size_t ahead = (f32 ? R : step_panels) * w.panel_bytes();
  const bool ask = half == 0 && !single_stream_step(P) && P > quiet_float_positions_avx2 &&
                   (!f32 || next_step_in_run<R>(panel, last)),
             into_l2 = !f32 || requests_into_l2;
  // Bytes from one column of a panel to its next: a bf16 column pair's stride covers two columns.
  const std::size_t pair_stride = bf16_pair_stride(w.encoding());
  const std::size_t column_bytes = f32 ? panel_rows * 4 : pair_stride / 2;
  __m256 acc[R][H][P];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int h = 0; h < H; ++h)
      SPECDEC_UNROLL for (int p = 0; p < P; ++p) acc[r][h][p] = _mm256_setzero_ps();
  Visitor::template run<R, H>(
      panels, w.cols(), pair_stride, half, [&](const __m256(&wv)[R][H], std::size_t k) SPECDEC_ALWAYS_INLINE_LAMBDA {
        if (ask)
          SPECDEC_UNROLL for (int r = 0; r < R; ++r) request_line(address_past(panels[r], k * column_bytes + ahead), into_l2);
        const float* xk = xt + k * stride;
        SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
          const __m256 xv = _mm256_broadcast_ss(xk + p);
          SPECDEC_UNROLL for (int r = 0; r < R; ++r)
            SPECDEC_UNROLL for (int h = 0; h < H; ++h) acc[r][h][p] = _mm256_fmadd_ps(wv[r][h], xv, acc[r][h][p]);
        }
      });
  __m256 result[R][H][P];  // a copy: with acc's address taken, GCC 12 stores every accumulator on every column
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int h = 0; h < H; ++h)
      SPECDEC_UNROLL for (int p = 0; p < P; ++p) result[r][h][p] = acc[r][h][p];
  store_halves_avx2<R, H, P>(out, panel, half, result);
}

using KernelFnAvx2 = void (*)(const MatmulOutput&, std::size_t, std::size_t, int, const float*, std::size_t);

inline constexpr std::size_t avx2_pass_positions = 12;  // the most positions one pass takes

/// Kernels for R panels × H halves × P = 1..sizeof...(P) positions: table[P - 1].
template <class Visitor, int R, int H, int... P>
constexpr std::array<KernelFnAvx2, sizeof...(P)> kernel_table_avx2(std::integer_sequence<int, P...>) {
  return {&panel_kernel_avx2<Visitor, R, H, P + 1>...};
}

template <class Visitor, InputLayout Layout>
void matmul_panels_avx2(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                        std::size_t x_stride, std::size_t positions, std::uint64_t call) {
  static constexpr auto whole = kernel_table_avx2<Visitor, 1, 2>(std::make_integer_sequence<int, 6>{});
  static constexpr auto halves =
      kernel_table_avx2<Visitor, 1, 1>(std::make_integer_sequence<int, avx2_pass_positions>{});
  const std::size_t cols = out.weights->cols();
  const float* interleaved = prepared_inputs<Layout>(x, x_stride, positions, cols, call);
  constexpr std::size_t most = avx2_pass_positions;
  for (std::size_t b = first; b < last; b += step_panels) {
    const std::size_t block_end = std::min(last, b + step_panels);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      for (std::size_t s = 0; s < group_count(count, most); ++s) {  // passes of at most 12 positions
        const std::size_t s_begin = group_begin(count, s, most), n = group_begin(count, s + 1, most) - s_begin;
        const float* xt = interleaved + begin * cols + s_begin;
        MatmulOutput og = out;
        og.y = out.y + (begin + s_begin) * out.y_stride;
        std::size_t p = b;
        if (n > 6) {
          for (; p < block_end; ++p)
            SPECDEC_UNROLL for (int half = 0; half < 2; ++half) halves[n - 1](og, p, last, half, xt, count);
          continue;
        }
        // One stream where single_stream_steps says so: a panel a step, or one of bf16's interleaved pairs.
        const bool single = single_stream_step(n), pairs = interleaves_panel_pairs(out.weights->encoding());
        if (n == 1 && !single)
          for (; p + 4 <= block_end; p += 4) panel_kernel_avx2<Visitor, 4, 2, 1>(og, p, last, 0, xt, count);
        if (n == 1 && single && pairs)
          for (; p + 2 <= block_end; p += 2) panel_kernel_avx2<Visitor, 2, 2, 1>(og, p, last, 0, xt, count);
        if (n == 2 && (!single || pairs))
          for (; p + 2 <= block_end; p += 2) panel_kernel_avx2<Visitor, 2, 2, 2>(og, p, last, 0, xt, count);
        for (; p < block_end; ++p) whole[n - 1](og, p, last, 0, xt, count);
      }
    }
  }
}
#endif  // SPECDEC_HAVE_AVX2_FLOAT

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
