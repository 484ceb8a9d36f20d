// specdec/llama/detail/matmul_avx512.hpp — the AVX-512 kernels of the float encodings (f32, bf16, bf16_dot):
// R panels × P positions of accumulators in registers, each weight vector loaded and widened once for them all.
// Entry point: detail::matmul_panels_avx512. Read first: matmul_kernels.hpp (the column order and the knobs
// these kernels follow).
#pragma once

#include "specdec/llama/detail/matmul_kernels.hpp"

namespace specdec::llama::detail {

SPECDEC_SIGN_WARNINGS_OFF  // the register tiles' bounds (see quiet_warnings.hpp)

#if defined(__AVX512F__)
SPECDEC_AVX512_WARNINGS_OFF
// ---------------------------------------------------------------------------------------------------------
// AVX-512 path. Each visitor loads (and widens) R panels' weights for one column at a time and hands
// them to fn(w, k); the kernel multiplies them into R × P accumulators.

/// What a float kernel step asks for, into L2 (the hint T1) or with the non-temporal hint (NTA; see
/// requests_into_l2): the next step's panels, `ahead` bytes after its own, and its own panels' lines `near`
/// bytes ahead of those it reads (0: not asked for).
struct PanelRequest {
  std::size_t ahead = 0;
  std::size_t near = 0;
  bool into_l2 = false;
  explicit operator bool() const { return ahead != 0 || near != 0; }
};

/// Asks for what `request` names at byte `offset` of each of the R panels (a prefetch never faults, past the
/// matrix's end included).
template <int R>
SPECDEC_ALWAYS_INLINE void prefetch_ahead(const std::byte* const* panel, PanelRequest request, std::size_t offset) {
  if (request.ahead)
    SPECDEC_UNROLL for (int r = 0; r < R; ++r) request_line(address_past(panel[r], request.ahead + offset), request.into_l2);
  if (request.near)
    SPECDEC_UNROLL for (int r = 0; r < R; ++r) request_line(address_past(panel[r], request.near + offset), request.into_l2);
}

/// The requests of a kernel step of R panels (from `panel`) of P positions, for prefetch_ahead. The float
/// kernels of 1 and 2 panels (bf16 and bf16_dot at every width, f32 from 3 positions) ask for the next step's
/// panels, column by column beside their own loads; never past `last`, the end of the thread's run (asking for
/// panels another thread computes, up to 72 KiB per call in f32, took one-position forwards to 1.02-1.03x the
/// time of asking for nothing). The hardware prefetcher alone left the kernels waiting on memory: alternating
/// call by call with no request (forwards of SmolLM2 at context 256, 2 threads, Zen 5, 2026-12-02, medians of
/// 4-10 rounds per machine state), bf16 took 0.60-0.67x the time at 5 and 9 positions; f32 0.82-0.88x at 5 and
/// 0.73-0.82x at 9; bf16_dot 0.80-0.88x at 5 and 0.67-0.74x at 9. f32's 4-panel kernels (1-2 positions) took
/// 1.07-1.14x the time with that request, so they make none. Steps of 1 and 2 positions also ask for their own
/// panels' lines near_request_lines ahead, past the panels' and the run's ends alike (a few lines of the next
/// panel or run). No request where single_stream_step(P).
template <int R, int P>
PanelRequest panel_ahead(const PackedMatrix& w, std::size_t panel, std::size_t last) {
  if (single_stream_step(P)) return {};
  // A panel's next line is a column step on: 64 bytes on, or 128 in bf16's interleaved pairs.
  const std::size_t near = P <= 2 ? near_request_lines * bf16_pair_stride(w.encoding()) : 0;
  PanelRequest request{0, near, requests_into_l2};
  if (R <= 2 && next_step_in_run<R>(panel, last))
    request.ahead = static_cast<std::size_t>(w.panel(panel + R) - w.panel(panel));
  return request;
}

/// Each visitor's most_panels: the panels per kernel step for 1 and 2 positions (4 fill the registers; see
/// panels_per_step). bf16 and bf16_dot step by 2: alternating call by call with steps of 4 (forwards of SmolLM2
/// at context 256, 2 threads, Zen 5, 2026-12-02, medians of 4-24 rounds per machine state), bf16 took 0.88x the
/// time at 1 position where the two vCPUs do not share an L3 and 0.92x where they do, 0.87x and 0.91x at 2;
/// bf16_dot 0.90x and 0.997x at 1, 0.88x and 0.96x at 2. f32 took 1.02-1.04x with steps of 2, so it keeps 4.
struct VisitF32 {
  static constexpr std::size_t most_panels = 4;
  template <int R, class Fn>
  static SPECDEC_ALWAYS_INLINE void run(const std::byte* const* panel, std::size_t cols, std::size_t,
                                        PanelRequest ahead, Fn&& fn) {
    for (std::size_t k = 0; k < cols; ++k) {
      if (ahead) prefetch_ahead<R>(panel, ahead, k * panel_rows * 4);
      __m512 w[R];
      SPECDEC_UNROLL for (int r = 0; r < R; ++r)
        w[r] = _mm512_loadu_ps(reinterpret_cast<const float*>(panel[r]) + k * panel_rows);
      fn(w, k);
    }
  }
};

struct VisitBf16 {
  static constexpr std::size_t most_panels = 2;
  /// stride: bf16_pair_stride of the matrix's encoding.
  template <int R, class Fn>
  static SPECDEC_ALWAYS_INLINE void run(const std::byte* const* panel, std::size_t cols, std::size_t stride,
                                        PanelRequest ahead, Fn&& fn) {
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (std::size_t k = 0; k < cols; k += 2) {
      if (ahead) prefetch_ahead<R>(panel, ahead, k / 2 * stride);
      __m512 even[R], odd[R];
      SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
        const __m512i pair = _mm512_loadu_si512(panel[r] + k / 2 * stride);  // 16 × (w[k], w[k + 1])
        even[r] = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
        odd[r] = _mm512_castsi512_ps(_mm512_and_si512(pair, high));
      }
      fn(even, k);
      if (k + 1 < cols) fn(odd, k + 1);
    }
  }
};

SPECDEC_ALWAYS_INLINE __m512 load_f16x16(const std::byte* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

/// Writes (or adds) R × P accumulators to their outputs, masking the padded rows of the last panel.
template <int R, int P>
SPECDEC_ALWAYS_INLINE void store_panels(const MatmulOutput& out, std::size_t panel, const __m512 (&acc)[R][P]) {
  const PackedMatrix& w = *out.weights;
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) {
    const std::size_t row0 = (panel + std::size_t(r)) * panel_rows;
    const std::size_t lanes = std::min(panel_rows, w.rows() - row0);
    const __mmask16 mask = lanes == panel_rows ? __mmask16(0xFFFF) : __mmask16((1u << lanes) - 1);
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
      float* y = out.y + std::size_t(p) * out.y_stride + row0;
      __m512 v = acc[r][p];
      if (out.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

/// R panels starting at `panel` × P positions: accumulate over all columns, then store. `last`: the end of the
/// thread's run of panels (see panel_ahead).
/// xt: the P positions' inputs interleaved, xt[k·P + p] = x[p, k], so that every broadcast addresses one base
/// register (P separate row pointers would exhaust the general registers for large P).
template <class Visitor, int R, int P>
void panel_kernel(const MatmulOutput& out, std::size_t panel, std::size_t last, const float* xt) {
  const PackedMatrix& w = *out.weights;
  const std::byte* panels[R];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + std::size_t(r));
  __m512 acc[R][P];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const PanelRequest ahead = panel_ahead<R, P>(w, panel, last);
  const std::size_t pair_stride = bf16_pair_stride(w.encoding());
  const auto multiply = [&](const __m512* wv, std::size_t k) SPECDEC_ALWAYS_INLINE_LAMBDA {
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
      const __m512 xv = _mm512_set1_ps(xt[k * P + std::size_t(p)]);
      SPECDEC_UNROLL for (int r = 0; r < R; ++r) acc[r][p] = _mm512_fmadd_ps(wv[r], xv, acc[r][p]);
    }
  };
  Visitor::template run<R>(panels, w.cols(), pair_stride, ahead, multiply);
  store_panels<R, P>(out, panel, acc);
}

/// Marks the vdpbf16ps kernel in the tables below (it multiplies column pairs, not visited weight vectors).
struct DotBf16 {
  static constexpr std::size_t most_panels = 2;
};

#if defined(__AVX512BF16__)
/// The bf16_dot kernel: one vdpbf16ps per column pair multiplies 16 rows' bf16 weight pairs with a broadcast
/// pair of bf16-rounded inputs (xt[kp·P + p] holds x[p, 2kp] | x[p, 2kp + 1] << 16) and adds both products.
template <int R, int P>
void panel_kernel_dot(const MatmulOutput& out, std::size_t panel, std::size_t last, const float* xt_bits) {
  const PackedMatrix& w = *out.weights;
  const auto* xt = reinterpret_cast<const std::int32_t*>(xt_bits);
  const std::byte* panels[R];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r) panels[r] = w.panel(panel + std::size_t(r));
  __m512 acc[R][P];
  SPECDEC_UNROLL for (int r = 0; r < R; ++r)
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  static_assert(!interleaves_panel_pairs(PanelEncoding::bf16_dot), "column pairs 64 bytes apart, as below");
  const std::size_t pairs = (w.cols() + 1) / 2;
  const PanelRequest ahead = panel_ahead<R, P>(w, panel, last);
  for (std::size_t kp = 0; kp < pairs; ++kp) {
    if (ahead) prefetch_ahead<R>(panels, ahead, kp * panel_rows * 4);
    __m512bh wv[R];
    SPECDEC_UNROLL for (int r = 0; r < R; ++r)
      wv[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panels[r] + kp * panel_rows * 4));
    SPECDEC_UNROLL for (int p = 0; p < P; ++p) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(xt[kp * P + std::size_t(p)]));
      SPECDEC_UNROLL for (int r = 0; r < R; ++r) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], wv[r], xv);
    }
  }
  store_panels<R, P>(out, panel, acc);
}
#endif

using KernelFn = void (*)(const MatmulOutput&, std::size_t, std::size_t, const float*);

template <class Visitor, int R, int P>
constexpr KernelFn kernel_for() {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<Visitor, DotBf16>) return &panel_kernel_dot<R, P>;
  else
#endif
    return &panel_kernel<Visitor, R, P>;
}

/// Kernels for R panels by P = 1..sizeof...(P) positions: table[P - 1].
template <class Visitor, int R, int... P>
constexpr std::array<KernelFn, sizeof...(P)> kernel_table(std::integer_sequence<int, P...>) {
  return {kernel_for<Visitor, R, P + 1>()...};
}

/// Panels per kernel step for a group of `count` positions: as many accumulators as the 32 registers allow
/// next to the weights, up to the visitor's most_panels. Where single_stream_step(count), one stream: one panel,
/// or a pair where the encoding interleaves its panels in pairs (bf16).
template <class Visitor>
std::size_t panels_per_step(std::size_t count, PanelEncoding encoding) {
  if (single_stream_step(count)) return interleaves_panel_pairs(encoding) ? 2 : 1;
  if (count <= 2) return Visitor::most_panels;
  return count <= 12 ? 2 : 1;
}

template <class Visitor, InputLayout Layout>
void matmul_panels_avx512(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                          std::size_t x_stride, std::size_t positions, std::uint64_t call) {
  static constexpr auto pair = kernel_table<Visitor, 2>(std::make_integer_sequence<int, 12>{});
  static constexpr auto single = kernel_table<Visitor, 1>(std::make_integer_sequence<int, max_position_group>{});
  const std::size_t cols = out.weights->cols();
  const float* interleaved = prepared_inputs<Layout>(x, x_stride, positions, cols, call);
  for (std::size_t b = first; b < last; b += step_panels) {
    const std::size_t block_end = std::min(last, b + step_panels);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      const std::size_t step = panels_per_step<Visitor>(count, out.weights->encoding());
      const float* xt = interleaved + begin * cols;
      MatmulOutput og = out;
      og.y = out.y + begin * out.y_stride;
      std::size_t p = b;
      if constexpr (Visitor::most_panels == 4) {
        static constexpr auto wide = kernel_table<Visitor, 4>(std::make_integer_sequence<int, 2>{});
        if (step == 4)
          for (; p + 4 <= block_end; p += 4) wide[count - 1](og, p, last, xt);
      }
      if (step >= 2)
        for (; p + 2 <= block_end; p += 2) pair[count - 1](og, p, last, xt);
      for (; p < block_end; ++p) single[count - 1](og, p, last, xt);
    }
  }
}

SPECDEC_AVX512_WARNINGS_ON
#endif  // __AVX512F__

SPECDEC_SIGN_WARNINGS_ON

}  // namespace specdec::llama::detail
