// specdec/llama/detail/matmul_kernels.hpp — what every kernel behind specdec::llama::matmul shares (the CPU's
// family, the prefetch knobs measured per CPU, position groups, the interleaved inputs) and the portable kernel
// of the float encodings (f32, bf16, bf16_dot).
// Entry point: detail::matmul_panels_portable. Read first: ../matmul.hpp (layouts and the batch-invariance
// argument). Read next: matmul_avx512.hpp and matmul_avx2.hpp (the float encodings' vector kernels),
// matmul_dot_kernels.hpp (the block encodings), matmul_dispatch.hpp (which kernel runs).
//
// Every path walks a panel's columns in the order visit_panel defines and keeps one accumulator per
// (row, position) that starts at zero and sees one multiply-add per column. The vector paths hold R panels ×
// P positions of accumulators in registers so that each weight vector loaded (and widened) is used
// R·P times; R and P only change register allocation, never an accumulator's operation sequence, so the
// vector paths give the portable path's bits (bf16_dot with vdpbf16ps excepted: that instruction adds a
// column pair in its own order and flushes denormals).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "specdec/llama/detail/compiler.hpp"
#include "specdec/llama/packed_matrix.hpp"

namespace specdec::llama::detail {

/// A number unique to each matmul call, so that a thread interleaves the call's inputs only once however
/// many blocks of it the thread computes; next_call(count) reserves count consecutive numbers and returns the
/// first.
inline std::uint64_t next_call(std::uint64_t count = 1) {
  static std::atomic<std::uint64_t> calls{0};
  return calls.fetch_add(count, std::memory_order_relaxed) + 1;
}

/// The x86 CPU's vendor and family as cpuid reports them (the family: the base family, plus the extended family
/// where the base is 15; AMD's Zen 3 and Zen 4 are family 25, Zen 5 is 26), and whether it reports AVX-512
/// Foundation (cpuid leaf 7, whatever instructions this build uses: within family 25 Zen 4 has it and Zen 3 does
/// not; a Zen 4 whose hypervisor hides AVX-512 counts as a Zen 3 then, which changes speed, never the bits);
/// {false, 0, false} where unknown.
struct CpuFamily {
  bool amd = false;
  unsigned family = 0;
  bool avx512f = false;
};
inline CpuFamily cpu_family() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return {};
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return {amd, 0, false};
  const unsigned base = (a >> 8) & 0xFu, family = base == 0xFu ? base + ((a >> 20) & 0xFFu) : base;
  const bool avx512f = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 16) & 1u);
  return {amd, family, avx512f};
#else
  return {};
#endif
}

/// Whether this is an AMD CPU of the given family (25: Zen 3 and Zen 4; 26: Zen 5), for which the prefetch rules
/// below differ.
inline bool amd_family(unsigned family) {
  const CpuFamily cpu = cpu_family();
  return cpu.amd && cpu.family == family;
}

/// Whether this is AMD's Zen 4: family 25 with AVX-512 (Zen 3, family 25 too, has none).
inline bool amd_zen4() { return amd_family(25) && cpu_family().avx512f; }

/// Whether the AVX-512 kernels ask for the next panels into L2 (the hint T1) rather than with the non-temporal
/// hint (NTA): the float kernels (f32, bf16, bf16_dot) for their next step's panels (see panel_ahead), the block
/// kernels for the next panel (panel_kernel_qdot). Everywhere but on AMD family 26 (Zen 5), the one CPU where NTA
/// was measured the faster (below). The AVX2 block kernels follow it too, up to 9 digit products a block, and ask
/// at every width (they have no quiet_dot_products); see halves_kernel_qdot_avx2, measured on a Zen 4 running
/// AVX2 code, not on a Zen 3. So does the AVX2 f32 kernel (see matmul_panels_avx2).
/// Measured on a Zen 4 (family 25, model 17; 2 threads, forwards of SmolLM2 at context 256, alternating call by
/// call, 8-40 rounds, 2026-12-03), T1 against NTA:
/// - float kernels: bf16 0.72-0.84x the time at 1 position, 0.86x at 2, 0.86-0.88x at 5, 0.98x at 9; bf16_dot
///   0.82-0.87x at 1, 0.83x at 2, 0.74-0.79x at 5, 0.82x at 9; f32 (which asks from 3 positions) 0.76x at 5,
///   0.77x at 9. No request at all read 0.91-1.28x, asking two steps ahead into L2 no better than one
///   (0.76-0.88x where one step read 0.72-0.88x), and the hint T0 0.95x at 1 position of bf16;
/// - block kernels, asking at every width but quantized_dot's one position (quiet_dot_products {1, 1}) against
///   the NTA rule before ({5, 8}): quantized_dot 0.86-0.96x at 2 positions, 0.90x at 3, 0.93x at 4, 0.75x at 5,
///   0.86-0.90x at 6, 0.89-0.92x at 9, 1.00x at 16; quantized 0.77-1.005x at 1 (three runs), 0.86x at 2,
///   0.97-0.98x at 5, 1.01x at 9. At quantized_dot's one position, asking for every panel read 1.01-1.03x (the
///   output head's stage 0.97 ms against 0.75 without, 150 rounds), for q8_0 alone 1.09x, and for the 4-bit
///   panels alone 0.99x (150 rounds; within this machine's noise, so not taken).
/// On the Zen 5 of 2026-12-02 and -03, T1 took the float kernels 0.99-1.11x the time of NTA. On an Intel Xeon of
/// 2026-12-05 (family 6, model 207, Emerald Rapids; the same forwards, alternating round by round in one process,
/// medians of 6 rounds of 12 forwards) NTA requests left the kernels waiting on memory, as if the lines were
/// evicted again before their use, and T1 took 0.39-0.68x the time of NTA in bf16, bf16_dot, quantized and
/// quantized_dot at 1, 2 and 5 positions and 0.51-0.81x at 9; f32 (which then asked only from 3 positions) 0.50x
/// at 5 and 9 (its near requests at 1 and 2 positions, see near_request_lines, take the same hint). On CPUs not
/// measured, T1: what NTA does differs from CPU to CPU, while T1's lines stay in L2 until used. The bits do not
/// change. Read by every call: a program may change it between forwards (for measuring).
inline bool requests_into_l2 = !amd_family(26);

/// Whether a thread that waits at one of run_blocks_together's barriers asks, into L2, for the weights it reads
/// first in the next step (ReadAhead; see transformer.hpp), wherever the vector kernels (AVX-512, AVX2) are built,
/// whatever hint the kernels use themselves (requests_into_l2); the portable build asks for nothing. Until
/// 2026-12-07 only where requests_into_l2 held, so not on the Zen 5, where it had not been measured. On the Zen 5
/// of 2026-12-07 (family 26, model 2; 2 threads, context 256, rounds of 15 forwards of each variant in turn,
/// medians; rounds sorted by a cache line's round trip into the two placements of the vCPUs), asking against not
/// asking: quantized_dot at one position with the weights evicted 0.973x the time where the vCPUs did not share an
/// L3 (79 rounds) and 0.989x where they did (1,851); back to back 0.949x and 0.984x (23 and 92), at 5 positions
/// 0.973x and 0.988x (95 and 68), at 9 1.002x (78, sharing); quantized at one position back to back 0.961x and
/// 0.983x, evicted 0.993x (sharing); bf16 0.979x and 0.989x, evicted 0.989x; bf16_dot 0.987x back to back and
/// 0.993x evicted (sharing); f32 0.995-0.997x sharing (13-21 rounds apart: 0.97x and 1.02x). The landed code,
/// switched through this flag: quantized_dot evicted 0.975x apart and 0.987x sharing (84 and 408 rounds), back to
/// back 0.949x and 0.977x (48 and 311), at 5 positions 0.970x and 0.989x (404 and 69). The bits do not change.
/// Read by every call, like requests_into_l2.
inline bool barrier_read_ahead = true;

/// barrier_read_ahead where the vector kernels are built; false for the portable build.
inline bool reads_ahead_at_barriers() {
#if defined(__AVX512F__) || defined(__AVX2__)
  return barrier_read_ahead;
#else
  return false;
#endif
}

/// Whether the AVX-512 float kernels (f32, bf16, bf16_dot) take one panel a step at 1 and 2 positions and ask
/// for nothing ahead there, leaving the weights to the hardware prefetcher: a thread's panels are adjacent in
/// memory, so its run is then read as one sequential stream, where steps of 2 (bf16, bf16_dot) or 4 (f32)
/// panels read as that many interleaved streams, and the bf16 steps asked for the next step's panels besides.
/// On for AMD's Zen 4 (amd_zen4), off elsewhere: on the Zen 5 of 2026-12-02 steps of 2 beat steps of 4 and the
/// requests helped (see most_panels and panel_ahead); steps of one panel were not measured there. On the Zen 4 of
/// 2026-12-03 (forwards of SmolLM2 at context 256, 2 threads, alternating call by call in one process, medians
/// of 6-24 rounds): bf16 0.89-0.94x the time at 1 position (three runs) and 0.99x at 2; bf16_dot 0.83-0.97x at
/// 1 (three runs) and 0.93x at 2; f32 0.94-0.99x at 1 (three runs) and 1.00x at 2. One panel a step that still
/// asks for the next read 0.95-0.96x (bf16, bf16_dot) and 1.16x (f32), and steps of 2 that ask for nothing
/// 1.09x (bf16). A plain read of 128 MB on one thread there measured the same: 25-30 GB/s as one stream, 21-24
/// as 2 or 4 interleaved ones, 20-22 as one stream that asks into L2 for the lines one panel ahead. bf16 steps
/// by a pair of its panels, which it stores interleaved (see packed_matrix.hpp), so that one stream feeds two
/// chains of FMAs: one panel's one chain read 32 GB/s in L2 at one position on one core of that Zen 4, two
/// 59 GB/s (bf16_dot's one chain 43 GB/s), where a thread must read about 32 GB/s when the two vCPUs do not
/// share an L3. The bits do not change. Read by every call, like requests_into_l2.
/// The AVX2 float kernels follow it too (matmul_panels_avx2), where they took steps of 4 panels (f32, bf16,
/// bf16_dot) at one position and 2 at two, each asking ahead. Built for AVX2 and run on the Zen 4 of 2026-12-05
/// (the same forwards, alternating round by round, medians of 40 forwards a round, 6-8 rounds): one stream took
/// f32 to 0.87-0.96x the time at 1 position (three runs) and 0.94x at 2, bf16 0.84-0.91x at 1 (three runs) and
/// 0.92x at 2, bf16_dot 0.91x at 1 and at 2 (steps of a pair of its separate panels: 1.02x at 1).
/// On the Intel Xeon of 2026-12-05 (family 6, model 207; as for requests_into_l2, with T1 requests) one stream
/// took f32 1.17x the time at 1 position and 1.25x at 2, bf16 1.36x and 1.48x, bf16_dot 1.39x and 1.57x, so it
/// stays off there. On the Zen 3 of 2026-12-06 (family 25, model 1, without AVX-512; AVX2 code; the same
/// forwards with the weights evicted before each, alternating round by round, medians of 25 forwards a round,
/// 8-16 rounds) one stream took bf16 1.06-1.12x the time of those steps at 1 position, bf16_dot 1.12-1.17x and
/// f32 1.01-1.10x (four runs), and 1.01-1.02x, 1.15-1.16x and 1.03-1.04x at 2 (two runs), so it is off there
/// (Zen 3's FMA chains: one stream gives bf16 four, and f32 two, where a step of 4 panels gives eight).
inline bool single_stream_steps = amd_zen4();

/// Whether a float kernel step over `positions` positions reads one panel and asks for nothing ahead (see
/// single_stream_steps): the one place both panels_per_step and panel_ahead take that rule from.
inline bool single_stream_step(std::size_t positions) { return positions <= 2 && single_stream_steps; }

/// Positions up to which the AVX2 float kernels (f32, bf16, bf16_dot) ask for nothing ahead where they take
/// steps of several panels (where single_stream_step is false), leaving those panels' streams to the hardware
/// prefetcher: 1 on AMD family 25, 0 elsewhere (on a Zen 4 single_stream_steps covers 1 and 2 positions, so
/// this counts on a Zen 3 only). On the Zen 3 of 2026-12-06 (as for single_stream_steps, 8-16 rounds, four
/// runs, one without the eviction) asking for nothing took bf16 to 0.95-0.99x the time of asking at one
/// position, bf16_dot 0.93-0.98x and f32 0.93-0.95x, but at 2 positions bf16 to 1.03x and bf16_dot to 1.06x
/// (f32 0.94x), so 2 positions ask (one rule for the three formats). Not measured elsewhere. The bits do not
/// change. Read by every call, like requests_into_l2.
inline std::size_t quiet_float_positions_avx2 = amd_family(25) ? 1 : 0;

/// Lines of each of its panels' own weights ahead of those it reads at which an AVX-512 float kernel step of 1 or
/// 2 positions (f32's steps of 4 panels, bf16's interleaved pair, bf16_dot's 2 panels; where single_stream_steps
/// is off) asks for the panel's next line there, with the hint requests_into_l2 picks, beside bf16's and
/// bf16_dot's requests for their next step's panels (see panel_ahead): 32 (2 KiB of a panel's weights; in bf16's
/// interleaved pairs 4 KiB of the stream) everywhere but on AMD family 25 and 26, 0 (nothing: the hardware
/// prefetcher alone, as before) there. The hardware prefetcher follows the steps' panel streams late on the
/// Intel Xeon of 2026-12-05 (family 6, model 207). Forwards of SmolLM2 at context 256 on 2 threads there, rounds
/// alternating in one process (medians of the per-round ratios, 8-20 rounds), against no such request:
/// - f32 (whose 4-panel steps asked for nothing) at 32 lines: 0.935-0.993x the time at 1 position back to back
///   (five runs), 0.917-0.998x with the weights evicted before each (five), 0.879-0.897x at 2 positions (four);
///   48 and 64 lines 0.92-0.99x and 0.89-0.90x. The output head alone, evicted, read 23.7-26.2 GB/s against
///   21.0-24.1 (medians of 15);
/// - bf16 at 32 lines (4 KiB of its stream): 0.948x at 1 position, 0.953x evicted, 0.929x at 2; at 16 lines
///   0.943x and 0.968x, 0.929x and 0.948x evicted, 0.962x and 0.966x at 2, and 32 against 16 lines 0.952x and
///   0.969x, 0.976x and 0.962x evicted (48: 0.963-0.983x);
/// - bf16_dot at 32 lines: 0.955x and 0.955x, 0.917x and 0.925x, 0.968x and 0.994x; 64 against 32 0.995x;
/// - near requests alone, without the next step's: bf16 and bf16_dot 0.98-1.16x;
/// - at 5, 9 and 16 positions near requests took f32 to 0.98x, 1.01x and 1.07x in place of its next-step
///   requests, bf16 and bf16_dot to 0.99-1.01x at 5 and 9 beside theirs, so those steps make none.
/// Not measured on a Zen 4 (where the float kernels read one panel a step at 1 and 2 positions) or a Zen 5
/// (where f32's 4-panel steps asking for the next step's panels, with NTA, took 1.07-1.14x the time). The bits
/// do not change. Read by every call, like requests_into_l2.
inline std::size_t near_request_lines = amd_family(25) || amd_family(26) ? 0 : 32;

/// Digit products per weight block (input digits × positions of a kernel call) up to which the AVX-512 block
/// kernels leave the next panel to the hardware prefetcher instead of asking for it (panel_kernel_qdot), for
/// 4-bit blocks (q4_0, q4_1: 18-20 bytes per 32 weights) and for q8_0 (34 bytes): 1 and 1 on AMD family 25 (where
/// the requests go into L2; see requests_into_l2), 0 (always ask) elsewhere. On the Zen 5 of 2026-12-02 asking
/// took 1-position quantized_dot forwards to 0.88x the time. With NTA requests, the same Zen 4 (forwards as
/// above, against asking for both) did best with {5, 8}: leaving both took quantized_dot to 0.81-0.90x the time
/// at 1 position, 0.93-0.98x at 2, 0.85-0.91x at 3, 0.91x at 4, 0.92-0.93x at 5, but 1.17x, 1.33x, 1.14x and
/// 1.10x at 6-9; quantized (3 digits) to 0.86-0.87x at 1, 1.01x at 2, 1.20x at 5; then, against 5 for both,
/// leaving q8_0 (SmolLM2's output head) up to 16: quantized_dot 0.88-0.89x at 6, 0.95x at 7, 1.005x at 8,
/// 1.01-1.02x at 9, 1.065x at 16; quantized 0.94x at 2, 0.97x at 3. On the Intel Xeon of 2026-12-05 (as for
/// requests_into_l2, with T1 requests) leaving one-digit blocks at one position took quantized_dot 1.32x the time.
/// The bits do not change. Read by every call, like requests_into_l2.
struct QuietDotProducts {
  int q4 = 0;  // q4_0 and q4_1
  int q8 = 0;  // q8_0
};
inline QuietDotProducts quiet_dot_products = amd_family(25) ? QuietDotProducts{1, 1} : QuietDotProducts{};

/// Digit products per weight block (input digits × positions of a kernel call) up to which the AVX2 block
/// kernels ask for the next panel into L2 where requests_into_l2 says so; above it they ask with the
/// non-temporal hint (see halves_kernel_qdot_avx2). 9 on AMD family 25, where T1 was measured slower from 5
/// positions of quantized (15 products); no limit elsewhere: on the Intel Xeon of 2026-12-05, built for AVX2,
/// T1 instead of NTA above 9 products took quantized forwards (2 threads, bench_llama_forward, two runs each, in
/// turn) 0.67-0.86x the time at 5 positions and 0.85-0.91x at 9, quantized_dot 0.82-0.83x at 16. The bits do not
/// change. Read by every call, like requests_into_l2.
inline int l2_dot_products_avx2 = amd_family(25) ? 9 : std::numeric_limits<int>::max();

/// Positions that share one pass over a panel's weights. One pass streams the weights from memory while
/// computing, so up to 16 positions cost about one weight read.
inline constexpr std::size_t max_position_group = 16;

/// Sizes of near-equal groups of at most `most` positions (of n): group g covers
/// [group_begin(n, g), group_begin(n, g + 1)).
inline std::size_t group_count(std::size_t n, std::size_t most = max_position_group) { return (n + most - 1) / most; }
inline std::size_t group_begin(std::size_t n, std::size_t g, std::size_t most = max_position_group) {
  return n * g / group_count(n, most);
}

/// Panels per step of the vector kernels: their weights stay in cache while every position group (and pass)
/// goes over them.
inline constexpr std::size_t step_panels = 4;

/// Whether the kernel step after R panels from `panel` still lies in the thread's run, which ends at `last`: the
/// vector kernels ask for that step's panels only then (past the run they are another thread's).
template <int R>
bool next_step_in_run(std::size_t panel, std::size_t last) {
  return panel + 2 * R <= last;
}

// ---------------------------------------------------------------------------------------------------------
// Portable path: scalar code over 16-lane arrays (the compiler vectorises the lane loops).

inline void matmul_panels_portable(const MatmulOutput& out, std::size_t first, std::size_t last, const float* x,
                                   std::size_t x_stride, std::size_t positions) {
  const PackedMatrix& w = *out.weights;
  const bool round_inputs = w.encoding() == PanelEncoding::bf16_dot;  // emulates the BF16 dot product's inputs
  float acc[max_position_group][panel_rows];
  for (std::size_t p = first; p < last; ++p) {
    const std::size_t row0 = p * panel_rows;
    const std::size_t lanes = std::min(panel_rows, w.rows() - row0);
    for (std::size_t g = 0; g < group_count(positions); ++g) {
      const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
      for (std::size_t i = 0; i < count; ++i) std::fill(acc[i], acc[i] + panel_rows, 0.0f);
      visit_panel(w.panel(p), w.encoding(), w.cols(), [&](const float* wv, std::size_t k) {
        for (std::size_t i = 0; i < count; ++i) {
          float xv = x[(begin + i) * x_stride + k];
          if (round_inputs) xv = gguf::bf16_to_float(gguf::float_to_bf16(xv));
          // An explicit fma, as the vector paths do: `acc += w * x` is fused only where the compiler contracts it
          // (GCC 12 at -O1 did not, and the bits differed from the AVX2 kernel's).
          for (std::size_t l = 0; l < panel_rows; ++l) acc[i][l] = std::fma(wv[l], xv, acc[i][l]);
        }
      });
      for (std::size_t i = 0; i < count; ++i) {
        float* y = out.y + (begin + i) * out.y_stride + row0;
        for (std::size_t l = 0; l < lanes; ++l) y[l] = out.accumulate ? y[l] + acc[i][l] : acc[i][l];
      }
    }
  }
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define SPECDEC_HAVE_AVX2_FLOAT 1
#endif

#if defined(__AVX512F__) || defined(SPECDEC_HAVE_AVX2_FLOAT)
// ---------------------------------------------------------------------------------------------------------
// The vector paths' inputs: each thread interleaves a call's inputs once, so that a kernel's broadcasts for
// P positions of one column come from one base register.

/// How a kernel takes its inputs: as floats; as floats rounded to bf16 (bf16_dot without a BF16 dot
/// instruction: the portable path's emulation); or as column pairs of bf16 in one 32-bit word (vdpbf16ps).
enum class InputLayout { floats, bf16_rounded, bf16_pairs };

/// Interleaves the inputs of each position group: xt[begin·cols + k·count + i] = x[begin + i, k]; for
/// bf16_pairs, column pairs rounded to bf16 and packed into one 32-bit word per (pair, position).
template <InputLayout Layout>
void interleave(const float* x, std::size_t x_stride, std::size_t positions, std::size_t cols, float* out) {
  for (std::size_t g = 0; g < group_count(positions); ++g) {
    const std::size_t begin = group_begin(positions, g), count = group_begin(positions, g + 1) - begin;
    float* xt = out + begin * cols;
    for (std::size_t i = 0; i < count; ++i) {
      const float* row = x + (begin + i) * x_stride;
      if constexpr (Layout == InputLayout::bf16_pairs) {
        for (std::size_t k = 0; k < cols; k += 2) {
          const std::uint32_t lo = gguf::float_to_bf16(row[k]);
          const std::uint32_t hi = k + 1 < cols ? gguf::float_to_bf16(row[k + 1]) : 0u;
          xt[k / 2 * count + i] = std::bit_cast<float>(lo | hi << 16);
        }
      } else if constexpr (Layout == InputLayout::bf16_rounded) {
        for (std::size_t k = 0; k < cols; ++k) xt[k * count + i] = gguf::bf16_to_float(gguf::float_to_bf16(row[k]));
      } else {
        for (std::size_t k = 0; k < cols; ++k) xt[k * count + i] = row[k];
      }
    }
  }
}

/// This thread's interleaved copy of call `call`'s inputs (made on the thread's first block of the call).
template <InputLayout Layout>
const float* prepared_inputs(const float* x, std::size_t x_stride, std::size_t positions, std::size_t cols,
                             std::uint64_t call) {
  constexpr auto layout = static_cast<std::size_t>(Layout);
  static thread_local std::vector<float> buffer[3];  // one per layout; grow, never shrink
  static thread_local std::uint64_t prepared[3] = {0, 0, 0};
  if (prepared[layout] != call) {
    if (buffer[layout].size() < positions * (cols + 1)) buffer[layout].resize(positions * (cols + 1));
    interleave<Layout>(x, x_stride, positions, cols, buffer[layout].data());
    prepared[layout] = call;
  }
  return buffer[layout].data();
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
/// Asks for the cache line at `line`, into L2 (the hint T1) or with the non-temporal hint (NTA); see
/// requests_into_l2.
SPECDEC_ALWAYS_INLINE void request_line(const void* line, bool into_l2) {
  if (into_l2) _mm_prefetch(static_cast<const char*>(line), _MM_HINT_T1);
  else _mm_prefetch(static_cast<const char*>(line), _MM_HINT_NTA);
}

/// The address `bytes` past `base`, for request_line: computed on integers, as it may lie past the end of the
/// array that `base` points into (a prefetch never faults there), where pointer arithmetic would be undefined.
SPECDEC_ALWAYS_INLINE const void* address_past(const void* base, std::size_t bytes) {
  return reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(base) + bytes);
}
#endif

}  // namespace specdec::llama::detail
