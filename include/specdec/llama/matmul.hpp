// specdec/llama/matmul.hpp — the one batch-invariant matrix kernel: y = W·x for 1..n positions at once.
// Entry point: matmul. Read first: packed_matrix.hpp (weight layouts). Read next: detail/matmul_dispatch.hpp
// (which kernel runs), detail/transformer.hpp (the forward pass that calls it).
//
// Batch invariance: y[p, r] = Σ_k W[r, k]·x[p, k] is accumulated in one register lane per (row, position), from
// zero, in a fixed order that depends only on the encoding: one fused multiply-add per k for the float
// encodings, one fixed float sequence per 32-column block of exact integer sums for the block encodings. How many
// positions share a pass over the weights, how many panels a step covers and which thread owns a row change
// only which registers hold the accumulators, never their operation sequence; the reduction dimension is
// never split. So a position's output is bit-identical for any number of positions and threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "specdec/llama/detail/matmul_dispatch.hpp"
#include "specdec/llama/packed_matrix.hpp"
#include "specdec/llama/thread_pool.hpp"

namespace specdec::llama {

namespace detail {

/// Panels of all the outputs together. requires: they all have the same cols.
inline std::size_t total_panels(std::span<const MatmulOutput> outputs) {
  std::size_t total = 0;
  for (const auto& out : outputs) {
    SPECDEC_ASSERT(out.weights->cols() == outputs.front().weights->cols());
    total += out.weights->panels();
  }
  return total;
}

/// Panels per task when matmul splits `total` panels between `threads` threads: one contiguous run of panels
/// per thread, the outputs' panels taken as one sequence (a run may end in one output and go on in the next).
/// Long sequential weight streams are what the hardware prefetcher needs (4-panel tasks ran 1.3-1.5x slower on 2
/// threads). Against two runs per thread, each within one output, forwards of SmolLM2 at context 256 on 2
/// threads took 0.97-0.98x the time at 1, 5 and 9 positions for quantized_dot and quantized, 0.99x for
/// bf16_dot, 0.99-1.00x for f32 (alternating call by call, 2026-12-02). Where an output stores its panels in
/// pairs (bf16, see packed_matrix.hpp), a whole number of pairs, so that a run starts on a pair (where the outputs
/// before it have whole pairs too); other encodings split evenly, whatever the thread count.
inline std::size_t matmul_chunk(std::span<const MatmulOutput> outputs, std::size_t threads) {
  constexpr std::size_t min_chunk = 4;
  const std::size_t even = (total_panels(outputs) + threads - 1) / threads;
  const bool pairs = std::any_of(outputs.begin(), outputs.end(), [](const MatmulOutput& out) {
    return detail::interleaves_panel_pairs(out.weights->encoding());
  });
  return std::max(min_chunk, pairs ? (even + 1) / 2 * 2 : even);
}

/// Calls f(output, first, last) for each output that task `task` of a matmul in tasks of `chunk` panels
/// (matmul_chunk) covers, in order: its panels [first, last) among panels [task·chunk, (task + 1)·chunk) of the
/// outputs' panels taken as one sequence; nothing past the last.
template <class F>
void for_task_panels(std::span<const MatmulOutput> outputs, std::size_t task, std::size_t chunk, F&& f) {
  const std::size_t begin = task * chunk, end = begin + chunk;
  std::size_t offset = 0;  // of the output's first panel in the sequence
  for (const auto& out : outputs) {
    const std::size_t panels = out.weights->panels();
    const std::size_t first = std::max(begin, offset), last = std::min(end, offset + panels);
    if (first < last) f(out, first - offset, last - offset);
    offset += panels;
  }
}

/// Task `task` of a matmul split into tasks of `chunk` panels (for_task_panels), for all positions. `call`:
/// detail::next_call(), the same for every task of one product.
inline void matmul_task(std::span<const MatmulOutput> outputs, std::size_t task, std::size_t chunk, const float* x,
                        std::size_t x_stride, std::size_t positions, bool portable, std::uint64_t call,
                        QuantizedInputs given) {
  for_task_panels(outputs, task, chunk, [&](const MatmulOutput& out, std::size_t first, std::size_t last) {
    detail::matmul_panels(out, first, last, x, x_stride, positions, portable, call, given);
  });
}

/// The weights that matmul_task(outputs, task, chunk, ...) reads, in order, for StepBarrier::wait to ask for.
inline ReadAhead task_weights(std::span<const MatmulOutput> outputs, std::size_t task, std::size_t chunk) {
  ReadAhead ahead;
  for_task_panels(outputs, task, chunk, [&](const MatmulOutput& out, std::size_t first, std::size_t last) {
    ahead.add(out.weights->panel_span(first, last));
  });
  return ahead;
}

}  // namespace detail

/// Computes every output in `outputs` from the same inputs x: [positions, x_stride] row-major, first cols()
/// values of each row used. All weights need the same cols. Parallel over runs of output panels only
/// (matmul_task; a thread that the OS has descheduled leaves its run to the others); the result does not
/// depend on how positions are grouped or which thread computes a block. `portable` forces the scalar path.
/// `given`: x already quantised by the caller (see QuantizedInputs); it must be x's quantisation, which the
/// kernels would otherwise compute themselves.
/// requires: x and the outputs do not overlap.
inline void matmul(std::span<const MatmulOutput> outputs, const float* x, std::size_t x_stride,
                   std::size_t positions, ThreadPool& pool, bool portable = false, QuantizedInputs given = {}) {
  if (positions == 0 || outputs.empty()) return;
  const std::size_t total = detail::total_panels(outputs), chunk = detail::matmul_chunk(outputs, pool.threads());
  const std::uint64_t call = detail::next_call();
  pool.parallel_for((total + chunk - 1) / chunk, [&](std::size_t task, std::size_t) {
    detail::matmul_task(outputs, task, chunk, x, x_stride, positions, portable, call, given);
  });
}

/// Single-output convenience form of matmul.
inline void matmul(const MatmulOutput& output, const float* x, std::size_t x_stride, std::size_t positions,
                   ThreadPool& pool, bool portable = false, QuantizedInputs given = {}) {
  matmul(std::span<const MatmulOutput>(&output, 1), x, x_stride, positions, pool, portable, given);
}

}  // namespace specdec::llama
