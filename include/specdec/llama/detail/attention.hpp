// specdec/llama/detail/attention.hpp — per-position attention: detail::attend_group runs the AVX-512 or AVX2
// kernels where the build has them and the head dimension suits them, else the portable path; all give the
// same bits.
// Entry points: detail::attend_group; through attention_core.hpp detail::exp_approx and detail::swiglu.
// Read first: transformer_attention.hpp. Read next: attention_core.hpp (the shared math, the operation order and the
// portable path), then attention_avx512.hpp and attention_avx2.hpp.
#pragma once

#include <cstddef>

#include "specdec/llama/detail/attention_avx2.hpp"
#include "specdec/llama/detail/attention_avx512.hpp"
#include "specdec/llama/detail/attention_core.hpp"

namespace specdec::llama::detail {

SPECDEC_AVX512_WARNINGS_OFF

/// out[r] = softmax(q_r·Kᵀ·scale)·V over the row's keys for each row r = (position, query head) of a group
/// sharing one kv head. `portable` forces the portable path (same bits). Throws specdec::Error unless
/// rows() <= max_attention_rows.
template <class T>
void attend_group(const AttentionGroup<T>& a, bool portable = false) {
  check_attention_rows(a);
#if defined(__AVX512F__)
  if (!portable && vector_attention(a.d)) {
    for_row_chunks<ScoreStep>(a.rows(), a);
    float inverse[max_attention_rows];
    softmax_rows(a, inverse);
    scale_value_weights(a);
    for (std::size_t c0 = 0; c0 < a.d; c0 += 64) for_row_chunks<ValueStep>(a.rows(), a, c0, inverse);
    return;
  }
#elif defined(SPECDEC_ATTENTION_AVX2)
  if (!portable && vector_attention(a.d)) {
    for_head_passes_avx2(a.heads, a.positions, [&](std::size_t r0, auto rows) {
      if constexpr (decltype(rows)::value == 1) row_scores_avx2(a, r0);
      else group_scores_avx2<decltype(rows)::value>(a, r0);
    });
    float inverse[max_attention_rows];
    softmax_rows(a, inverse);
    scale_value_weights(a);
    // 64 columns a call for one head (8 chains), 32 for two or three (8 or 12): with 16 columns, three heads'
    // 6 chains were bound by the FMA latency (3.8-4.0 µs a call in cache against 3.4-3.6).
    for_head_passes_avx2(a.heads, a.positions, [&](std::size_t r0, auto rows) {
      constexpr int H = decltype(rows)::value, V = H == 1 ? 8 : 4;
      for (std::size_t c0 = 0; c0 < a.d; c0 += 8 * V) group_values_avx2<H, V>(a, r0, c0, inverse);
    });
    return;
  }
#endif
  (void)portable;
  attend_group_portable(a);
}

SPECDEC_AVX512_WARNINGS_ON

}  // namespace specdec::llama::detail
