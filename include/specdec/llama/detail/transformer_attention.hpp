// specdec/llama/detail/transformer_attention.hpp — the attention stage of the forward pass: RoPE, the new
// positions' keys and values stored into the KV cache (rows, and transposed key blocks), and attention split into
// tasks per kv head (or per run of positions, or per query head) for the thread pool.
// Entry points: detail::TransformerAttention::attention and attention_task (called by transformer.hpp's
// run_blocks and run_blocks_together). Read first: transformer.hpp. Read next: attention.hpp (the kernels).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <thread>
#include <utility>

#include "specdec/error.hpp"
#include "specdec/llama/detail/attention.hpp"
#include "specdec/llama/detail/transformer_state.hpp"
#include "specdec/llama/thread_pool.hpp"

namespace specdec::llama::detail {

/// TransformerState with the attention stage's steps; Transformer runs them in its forward pass. Every step is
/// per position and per head (batch invariance: see transformer.hpp).
class TransformerAttention : public TransformerState {
 public:
  using TransformerState::TransformerState;

 protected:
  /// Rotates adjacent pairs of the first rope_dims values of each head of n rows [n, stride] at start.. .
  void rope(float* rows, std::size_t stride, std::size_t heads, std::size_t start, std::size_t n) const {
    const LlamaConfig& c = config();
    const std::size_t pairs = c.rope_dims / 2;
    for (std::size_t i = 0; i < n; ++i) {
      const float* table = &rope_[(start + i) * pairs * 2];
      for (std::size_t h = 0; h < heads; ++h) {
        float* v = rows + i * stride + h * c.head_dim;
        for (std::size_t j = 0; j < pairs; ++j) {
          const float cos = table[2 * j], sin = table[2 * j + 1], a = v[2 * j], b = v[2 * j + 1];
          // Explicit fmas: written as a·cos − b·sin, GCC 12 at -O3 fuses the pair into vfmaddsub even under
          // -ffp-contract=off, and at -O2 does not, so the logits depended on the optimisation level.
          v[2 * j] = std::fma(a, cos, -(b * sin));
          v[2 * j + 1] = std::fma(a, sin, b * cos);
        }
      }
    }
  }

  /// Asks for the cache lines that store_kv(layer, start, n) will write, to own them by the time it runs (after
  /// the Q/K/V product): the weight stream has evicted them since the last step, and a transposed key writes
  /// one value to each of head_dim lines, so waiting for each line in turn cost as much as the norms and RoPE.
  void prefetch_kv(std::size_t layer, std::size_t start, std::size_t n) {
    with_kv([&](auto& kv, auto& keys_t) {
      for (std::size_t g = 0; g < config().kv_heads; ++g) prefetch_kv_head(kv, keys_t, layer, g, start, n);
    });
  }
  /// The lines of kv head g's part of store_kv.
  template <class Cache, class T>
  void prefetch_kv_head(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t g, std::size_t start,
                        std::size_t n) {
    const LlamaConfig& c = config();
    const std::size_t d = c.head_dim, cache_layer = layer * c.kv_heads + g;
    const auto ask = [](const T* p, std::size_t count) {
#if defined(__GNUC__)
      const auto* bytes = reinterpret_cast<const char*>(p);
      for (std::size_t b = 0; b < count * sizeof(T); b += 64) __builtin_prefetch(bytes + b, 1);  // for writing
#else
      (void)p, (void)count;
#endif
    };
    const std::size_t first = start / key_block, last = (start + n - 1) / key_block;
    ask(&keys_t[(cache_layer * blocks_ + first) * key_block * d], (last - first + 1) * key_block * d);
    ask(kv.key_rows(cache_layer, static_cast<Eigen::Index>(start), static_cast<Eigen::Index>(n)).data(), n * d);
    ask(kv.value_rows(cache_layer, static_cast<Eigen::Index>(start), static_cast<Eigen::Index>(n)).data(), n * d);
  }

  /// Appends the n new positions' keys (after RoPE) and values, converted to the cache's element: rows of kv
  /// cache layer (l, g), and the keys again into the transposed blocks the score loop reads.
  template <class Cache, class T>
  void store_kv(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t start, std::size_t n) {
    for (std::size_t g = 0; g < config().kv_heads; ++g) store_kv_head(kv, keys_t, layer, g, start, n);
  }
  /// RoPE on kv head g's query heads and key at the n new positions, then its part of store_kv.
  template <class Cache, class T>
  void rope_and_store_head(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t g, std::size_t start,
                           std::size_t n) {
    const LlamaConfig& c = config();
    const std::size_t d = c.head_dim, group = c.heads / c.kv_heads;
    rope(&q_[g * group * d], c.heads * d, group, start, n);
    rope(&k_[g * d], c.kv_heads * d, 1, start, n);
    store_kv_head(kv, keys_t, layer, g, start, n);
  }
  /// kv head g's part of store_kv.
  template <class Cache, class T>
  void store_kv_head(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t g, std::size_t start,
                     std::size_t n) {
    const LlamaConfig& c = config();
    const std::size_t d = c.head_dim, kw = c.kv_heads * d, cache_layer = layer * c.kv_heads + g;
    const auto begin = kv.reserve(cache_layer, n);
    T* keys = kv.key_rows(cache_layer, begin, static_cast<Eigen::Index>(n)).data();
    T* values = kv.value_rows(cache_layer, begin, static_cast<Eigen::Index>(n)).data();
    T* blocks = &keys_t[cache_layer * blocks_ * key_block * d];
    for (std::size_t i = 0; i < n; ++i) {
      const float* k = &k_[i * kw + g * d];
      const float* v = &v_[i * kw + g * d];
      const std::size_t pos = start + i;
      T* column = blocks + (pos / key_block) * d * key_block + pos % key_block;
      if constexpr (AttentionGroup<T>::scaled) {  // the rows quantised, their scales beside
        key_scales_[cache_layer * score_stride_ + pos] = quantize_kv_row(k, d, &keys[i * d]);
        value_scales_[cache_layer * score_stride_ + pos] = quantize_kv_row(v, d, &values[i * d]);
        for (std::size_t j = 0; j < d; ++j) column[j * key_block] = keys[i * d + j];
      } else {
        for (std::size_t j = 0; j < d; ++j) {
          const T key = to_kv(k[j], T{});
          keys[i * d + j] = key;
          column[j * key_block] = key;
          values[i * d + j] = to_kv(v[j], T{});
        }
      }
    }
  }

  /// attn_[i, head] = softmax(q·Kᵀ·scale) V over keys 0..start+i, per (run of attention_span() positions, kv
  /// head) with the query heads that share it, or per query head (attention_parts), split across threads. With
  /// per_head (one run: n <= attention_span()) each task first applies RoPE to its query heads and its kv head's
  /// keys and stores that kv head's new keys and values (with parts, the head's first part does, for them all),
  /// which the caller otherwise does for all heads before: the thread that reads a head's transposed keys then
  /// also wrote them (a new key touches head_dim cache lines). Against the caller's stores, quantized_dot
  /// forwards of one position took 0.995x the time while the two vCPUs shared an L3 and 0.989x while they did
  /// not (medians of 66 and 14 rounds, alternating call by call, 2026-12-02).
  template <class Cache, class T>
  void attention(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t start, std::size_t n, bool per_head) {
    // One part per kv head here, so no task waits for another: parallel_for may leave a task that stores a head
    // to a thread that would wait for the head's later parts (the caller, when a worker joins late).
    SPECDEC_ASSERT(attention_parts(n) == 1);  // run_blocks_together alone splits (see attention_parts)
    pool_->parallel_for(attention_tasks(n), [&](std::size_t task, std::size_t slot) {
      attention_task(kv, keys_t, layer, start, n, task, per_head, slot, nullptr);
    });
  }

  /// Task `task` of attention() (of attention_tasks(n)): kv head task % kv_heads for the run of positions
  /// task / kv_heads, or with several parts (one run; see attention_parts) part task / kv_heads of kv head
  /// task % kv_heads' query heads, on the thread of scratch slot `slot`. With per_head, part 0 stores the kv
  /// head and, with several parts, sets stored[g] (false before the call, one flag per kv head), which the
  /// other parts wait for; `stored` may be null with one part.
  template <class Cache, class T>
  void attention_task(Cache& kv, KeyBlocks<T>& keys_t, std::size_t layer, std::size_t start, std::size_t n,
                      std::size_t task, bool per_head, std::size_t slot, std::atomic<bool>* stored) {
    const LlamaConfig& c = config();
    const std::size_t qw = c.heads * c.head_dim, d = c.head_dim, group = c.heads / c.kv_heads;
    const std::size_t parts = attention_parts(n), heads = group / parts;
    const std::size_t span = attention_span(), part = parts > 1 ? task / c.kv_heads : 0;
    const std::size_t i0 = parts > 1 ? 0 : task / c.kv_heads * span, g = task % c.kv_heads;
    const std::size_t cache_layer = layer * c.kv_heads + g, head0 = g * group + part * heads;  // first query head
    if (per_head && part == 0) {  // one run: this task is the only one of kv head g, or its first part
      struct Publish {  // also if a store throws, so that no part waits for ever (the forward fails anyway)
        std::atomic<bool>* flag;
        ~Publish() {
          if (flag) flag->store(true, std::memory_order_release);
        }
      } publish{parts > 1 ? &stored[g] : nullptr};
      prefetch_kv_head(kv, keys_t, layer, g, start, n);
      rope_and_store_head(kv, keys_t, layer, g, start, n);
    } else if (per_head) {  // part 0 was claimed before this one (by a thread of run_blocks_together, which runs
                            // it at once), and stores the head first thing
      for (unsigned spins = 0; !stored[g].load(std::memory_order_acquire); ++spins) {
        if (spins < detail::yield_after_polls) detail::cpu_relax();
        else std::this_thread::yield();  // its thread may have been descheduled
      }
    }
    AttentionGroup<T> a;
    a.q = &q_[i0 * qw + head0 * d];
    a.q_stride = d;
    a.heads = heads;
    a.keys_t = &keys_t[cache_layer * blocks_ * key_block * d];
    a.values = kv.values(cache_layer, start + n).data();
    a.keys = start + i0 + 1;
    a.d = d;
    a.scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.scores = &scores_[slot * group * span * score_stride_];
    a.score_stride = score_stride_;
    a.out = &attn_[i0 * qw + head0 * d];
    a.out_stride = d;
    a.positions = std::min(span, n - i0);
    a.q_position_stride = qw;
    a.out_position_stride = qw;
    if constexpr (AttentionGroup<T>::scaled) {
      a.key_scales = &key_scales_[cache_layer * score_stride_];
      a.value_scales = &value_scales_[cache_layer * score_stride_];
    }
    attend_group(a);
    if (attention_quantizes()) {  // this task's blocks of the output projection's inputs
      const std::size_t blocks = heads * d / quant_block, first = head0 * d / quant_block;
      for (std::size_t i = i0; i < i0 + a.positions; ++i)
        quantize_for_next(&attn_[i * qw], i, first, first + blocks, qw, n);
    }
  }

  /// Attention tasks per kv head in a forward of n positions: where n takes one run, the kernels pass once per
  /// row (the portable build, and AVX2 builds for a head_dim not a multiple of 64; AVX-512 builds never split),
  /// run_blocks_together runs the forward and the kv heads do not divide evenly between its threads, one per
  /// query head, so that a task of three heads does not cost three of one (SmolLM2's 3 kv heads on 2 threads left
  /// one thread idle for a third of the stage); else 1 (one per run of positions, and a pass reads each key once
  /// for all the heads). Also 1 where a head's quantised output blocks would not be
  /// whole (head_dim not a multiple of 32). On a 2-core Zen 3 (2026-12-06; SmolLM2, context 256, 2 threads, the
  /// weights evicted before each forward, alternating round by round in one process), while the AVX2 kernels
  /// passed once per row, the one-position attention stage took 0.79-0.90x the time in every format, the
  /// forward 0.96-0.98x in quantized_dot (six runs), quantized (two) and bf16 (one), 1.00x in bf16_dot (one),
  /// 1.00-1.02x in f32 (two); without the eviction quantized_dot 0.99-1.03x: the thread that idled in the stage
  /// had asked for W_o's weights. Once they passed once for a position's three heads, whole kv heads took
  /// 0.95-1.00x the time of the split in quantized_dot (six runs; the stage 0.81-0.88x in the three that timed
  /// it), 0.98-0.99x in quantized (two), 1.00-1.01x in bf16 (two), 0.99x in bf16_dot and 1.00x in f32 (one
  /// each), so AVX2 no longer splits (docs/measurements.md, the last parts).
  std::size_t attention_parts(std::size_t n) const {
    const LlamaConfig& c = config();
    const bool row_passes = !passes_span_positions && !vector_attention(c.head_dim);  // see above
    const bool split = n <= attention_span() && row_passes && c.head_dim % quant_block == 0 && together_ &&
                       c.kv_heads % pool_->threads() != 0;
    return split ? c.heads / c.kv_heads : 1;
  }

  /// Attention tasks of a forward of n positions (see attention_task).
  std::size_t attention_tasks(std::size_t n) const {
    const std::size_t span = attention_span();
    return (n + span - 1) / span * config().kv_heads * attention_parts(n);
  }
};

}  // namespace specdec::llama::detail
