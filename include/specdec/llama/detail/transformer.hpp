// specdec/llama/detail/transformer.hpp — the forward pass behind LlamaModel and EarlyExitDraft.
// Entry point: detail::Transformer::forward. Read first: ../llama_model.hpp, transformer_state.hpp (the memory it
// computes into). Read next: attention.hpp, ../matmul.hpp (the kernels).
//
// Forward pass, per appended position at absolute position pos (llama.cpp's "llama" graph):
//   x = token_embd[token]
//   per layer:  h = RMSNorm(x)·attn_norm;  q, k, v = Wq·h, Wk·h, Wv·h;  RoPE(q, k, pos)
//               x += Wo·concat_heads(softmax(q·Kᵀ/√head_dim over keys 0..pos)·V)      (GQA: head h uses kv head h/group)
//               h = RMSNorm(x)·ffn_norm;  x += Wdown·(SiLU(Wgate·h) ⊙ Wup·h)
//   logits = Wout·(RMSNorm(x)·output_norm)
// RMSNorm(v) = v / sqrt(mean(v²) + eps). RoPE rotates adjacent pairs (2j, 2j+1) of each head by
// θ_j = pos·base^(−2j/rope_dims), the pairing of llama.cpp's permuted GGUF Q/K rows.
//
// Batch invariance: every step above is computed per position (norms, RoPE, SwiGLU per row; attention per
// query position and head over keys 0..pos in order; matrix products by matmul.hpp's kernel), so a position's
// logits are bit-identical whether it is forwarded alone or with others, and for any thread count.
//
// Threads: a forward of up to 16 positions (a decoding step, a verify pass) runs all layers in one job in which
// the threads wait for each other between steps (run_blocks_together); a longer one (a prompt) hands each step
// to the pool as a job (run_blocks), as does a pool with more threads than cores. The bits do not depend on
// which: every split of the work between threads is over outputs, never over a sum.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/detail/attention.hpp"
#include "specdec/llama/detail/transformer_state.hpp"
#include "specdec/llama/llama_options.hpp"
#include "specdec/llama/matmul.hpp"
#include "specdec/llama/thread_pool.hpp"
#include "specdec/model.hpp"
#include "specdec/tensor.hpp"

namespace specdec::llama::detail {

/// Adds the wall-clock time since its last mark to a stage of a ForwardProfile; does nothing without one.
class StageClock {
 public:
  explicit StageClock(ForwardProfile* profile) : profile_(profile) {
    if (profile_) last_ = std::chrono::steady_clock::now();
  }
  void mark(double ForwardProfile::*stage) {
    if (!profile_) return;
    const auto now = std::chrono::steady_clock::now();
    profile_->*stage += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  ForwardProfile* profile_;
  std::chrono::steady_clock::time_point last_{};
};

/// One running transformer: forward() appends positions (their keys and values to the cache) and returns their
/// logits; truncate() (TransformerState) rolls the context back.
class Transformer : public TransformerState {
 public:
  using TransformerState::TransformerState;

  /// Appends tokens and returns their logits, [tokens, vocab].
  const Logits& forward(std::span<const Token> tokens) {
    compute(tokens, true);
    return logits_;
  }
  /// Appends tokens without their logits (a prompt, a draft's catch-up): the final norm and the output head are
  /// skipped, and the logits buffer is left as it is, so that the next forward() of as many positions reuses it
  /// (a catch-up between two one-position draft steps freed and allocated 196 KB again).
  void append(std::span<const Token> tokens) { compute(tokens, false); }

 private:
  /// forward() and append(): the n tokens at start.. through the model, with or without the logits.
  void compute(std::span<const Token> tokens, bool with_logits) {
    const LlamaConfig& c = config();
    const std::size_t n = tokens.size(), start = context_size();
    if (n > max_context_ - start)
      specdec::detail::fail("context overflow: model holds ", start, " of max_context ", max_context_,
                            " positions, cannot append ", n, " more");
    for (std::size_t i = 0; i < n; ++i)
      if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= c.vocab)
        specdec::detail::fail("token id ", tokens[i], " at index ", i, " is outside the vocabulary of ", c.vocab,
                              " tokens");
    ForwardProfile call;  // this call's times, added to the profile if it returns with positions computed
    StageClock clock(profile_.target ? &call : nullptr);
    if (with_logits) {
      const auto rows = static_cast<Eigen::Index>(n), cols = static_cast<Eigen::Index>(c.vocab);
      if (logits_.size() == rows * cols) {
        logits_.resize(rows, cols);  // no allocation
      } else {  // not Eigen's resize, which frees the old buffer first and leaves a dangling one if allocation fails
        Logits fresh(rows, cols);
        logits_.swap(fresh);
      }
    }
    revision_ = specdec::next_revision();
    if (n == 0) return;
    reserve(n);
    extend_rope(start + n);
    const std::size_t e = c.embedding;
    ThreadPool& pool = *pool_;

    // 1. Token embeddings.                                                         x: [n, embedding]
    for (std::size_t i = 0; i < n; ++i) weights_->token_embedding().row(static_cast<std::size_t>(tokens[i]), &x_[i * e]);
    clock.mark(&ForwardProfile::other);

    // Only std::bad_alloc can throw below (a kernel's per-thread scratch growing): the layers that took the new
    // positions give them back, so the context is what it was before the call.
    try {
      if (together_ && n <= together_positions)
        run_blocks_together(start, n, pool, clock);
      else
        run_blocks(start, n, pool, clock);
      // 4. Final norm and output head.                                             logits: [n, vocab]
      if (with_logits) {
        rms_norm(x_.data(), weights_->output_norm().data(), h_.data(), n);
        matmul(MatmulOutput{&weights_->output(), logits_.data(), c.vocab, false}, h_.data(), e, n, pool, false,
               quantized(e));
        clock.mark(&ForwardProfile::output_head);
      }
    } catch (...) {
      truncate(start);
      throw;
    }
    if (profile_.target) {
      call.forwards = 1, call.positions = n;
      *profile_.target += call;
    }
  }

  /// Runs the transformer blocks over the n positions at start.. held in x_, appending their keys and values.
  void run_blocks(std::size_t start, std::size_t n, ThreadPool& pool, StageClock& clock) {
    const LlamaConfig& c = config();
    const std::size_t e = c.embedding, qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
    constexpr auto products = &ForwardProfile::block_products, other = &ForwardProfile::other;
    for (std::size_t l = 0; l < layers_; ++l) {
      const LayerWeights& w = weights_->layer(l);
      // 2. Attention: norm, Q/K/V projections (K and V straight into the cache), RoPE, attention, Wo + residual.
      // One attention task per kv head (n <= attention_span()): the task also applies RoPE to its heads and
      // stores the head's new keys and values (see attention()). Otherwise the caller does, for all heads.
      const bool per_head = n <= attention_span();
      if (!per_head) prefetch_kv(l, start, n);
      rms_norm(x_.data(), w.attn_norm.data(), h_.data(), n);
      clock.mark(other);
      const MatmulOutput qkv[] = {{&w.q, q_.data(), qw, false}, {&w.k, k_.data(), kw, false}, {&w.v, v_.data(), kw, false}};
      matmul(qkv, h_.data(), e, n, pool, false, quantized(e));
      clock.mark(products);
      if (!per_head) {
        rope(q_.data(), qw, c.heads, start, n);
        rope(k_.data(), kw, c.kv_heads, start, n);
      }
      with_kv([&](auto& kv, auto& keys_t) {
        if (!per_head) store_kv(kv, keys_t, l, start, n);
        clock.mark(other);
        attention(kv, keys_t, l, start, n, per_head);
        clock.mark(&ForwardProfile::attention);
      });
      matmul(MatmulOutput{&w.o, x_.data(), e, true}, attn_.data(), qw, n, pool, false,
             attention_quantizes() ? quantized(qw) : QuantizedInputs{});
      clock.mark(products);

      // 3. MLP: norm, gate and up projections, SwiGLU, down projection + residual.
      rms_norm(x_.data(), w.ffn_norm.data(), h_.data(), n);
      clock.mark(other);
      const MatmulOutput gate_up[] = {{&w.gate, gate_.data(), c.ffn, false}, {&w.up, up_.data(), c.ffn, false}};
      matmul(gate_up, h_.data(), e, n, pool, false, quantized(e));
      clock.mark(products);
      swiglu_rows(n);
      clock.mark(other);
      matmul(MatmulOutput{&w.down, x_.data(), e, true}, gate_.data(), c.ffn, n, pool, false, quantized(c.ffn));
      clock.mark(products);
    }
  }

  /// run_blocks on several threads in one job instead of five to eight a layer: every thread runs every step,
  /// and between the steps that need each other's results the threads wait for each other (StepBarrier) where a
  /// job per step would hand the next step to the workers through the pool. Each thread computes the norms of
  /// all n positions itself into its own buffers (norm_rows_, norm_inputs_), so only the products and attention
  /// are split: the products in the panel runs that matmul gives each thread (matmul_task), attention in
  /// attention()'s tasks claimed one at a time (beyond one run of positions, RoPE and the cache stores first,
  /// each thread for its share of the kv heads), and the gate and up projections in equal row ranges of both, to
  /// which each thread applies SwiGLU and the quantisation for the down projection. The shared buffers each step
  /// reads (q_, k_, v_, attn_, gate_, up_, xq_ and x_) are written in the step before the wait; the results are
  /// those of run_blocks, bit for bit. Where the two vCPUs do not share an L3 a job's hand-over costs about
  /// 0.9 µs (0.3 µs where they do), some 150 a one-position forward: against run_blocks, one-position
  /// quantized_dot forwards at context 256 took 0.964x the time there (9 rounds, quartiles 0.948-0.974) and
  /// 0.989x where they share one (21 rounds); quantized 0.987x and bf16_dot 0.974x there, bf16 and f32
  /// 0.996-1.006x (alternating blocks of calls in one model, 2 threads, 2026-12-03). quantized_dot at 2, 5, 9
  /// and 16 positions: 0.982x, 0.982x, 0.988x and 0.986x where they share an L3 (6-8 rounds; 9 positions 0.968x
  /// where they do not, 3 rounds); f32 and quantized at 9: 0.990x and 1.000x.
  void run_blocks_together(std::size_t start, std::size_t n, ThreadPool& pool, StageClock& clock) {
    const LlamaConfig& c = config();
    const std::size_t e = c.embedding, qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
    const std::size_t threads = pool.threads();
    const std::size_t span = attention_span(), runs = (n + span - 1) / span;
    const bool per_head = runs == 1;  // each attention task applies RoPE and stores its own kv head
    StepBarrier barrier(threads);
    const auto claimed = std::make_unique<std::atomic<std::size_t>[]>(layers_);  // attention tasks, per layer
    const auto stored = attention_parts(n) > 1 ? std::make_unique<std::atomic<bool>[]>(layers_ * c.kv_heads)
                                               : nullptr;  // see attention_task
    const std::uint64_t calls = detail::next_call(4 * layers_);  // the products' numbers (see next_call)
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    constexpr auto products = &ForwardProfile::block_products, other = &ForwardProfile::other;
    pool.run_together([&](std::size_t t, std::size_t slot) {
      const auto mark = [&](double ForwardProfile::*stage) {
        if (t == 0) clock.mark(stage);  // the caller's task keeps the clock
      };
      float* h = &norm_rows_[t * (norm_rows_.size() / threads)];
      std::byte* hq = norm_inputs_.empty() ? nullptr : line_bytes(&norm_inputs_[t * (norm_inputs_.size() / threads)]);
      const QuantizedInputs normed = quantizes(e) ? QuantizedInputs{hq, input_digits_} : QuantizedInputs{};
      const auto norm = [&](const std::vector<float>& weight) {
        for (std::size_t i = 0; i < n; ++i) {
          norm_row(&x_[i * e], weight.data(), h + i * e);
          if (quantizes(e)) quantize_row_blocks(input_digits_, h + i * e, i, 0, e / quant_block, n, e / quant_block, hq);
        }
        mark(other);
      };
      const auto product = [&](std::span<const MatmulOutput> outputs, std::uint64_t call, const float* x,
                               std::size_t cols, QuantizedInputs given) {
        matmul_task(outputs, t, matmul_chunk(outputs, threads), x, cols, n, false, call, given);
      };
      // The weights this thread reads in the next step, for the barrier to ask for while the thread waits there
      // (see ReadAhead), where the vector kernels are built (detail::reads_ahead_at_barriers). On the Intel Xeon
      // of 2026-12-05, one-position forwards of the block and bf16 formats took 0.95-0.99x the time in most runs,
      // back to back and with the weights evicted, f32 0.97-1.02x (docs/measurements.md, "midday"); on the Zen 5
      // of 2026-12-07 quantized_dot 0.95-0.99x (see barrier_read_ahead). W_o's run is asked for at each of the
      // (two or three) waits before it, each time from its start: lines that arrived in an earlier wait cost
      // little to ask for again.
      const bool read_ahead = detail::reads_ahead_at_barriers();
      const auto next_weights = [&](std::span<const MatmulOutput> outputs) {
        return read_ahead ? task_weights(outputs, t, matmul_chunk(outputs, threads)) : ReadAhead{};
      };
      const auto next_gate_up = [&](const LayerWeights& w) {
        ReadAhead ahead;
        if (!read_ahead) return ahead;
        const auto [first, last] = gate_up_panels(w, t, threads);
        for (const PackedMatrix* m : {&w.gate, &w.up}) ahead.add(m->panel_span(first, last));
        return ahead;
      };
      const auto qkv_of = [&](const LayerWeights& w) {
        return std::array<MatmulOutput, 3>{{{&w.q, q_.data(), qw, false}, {&w.k, k_.data(), kw, false}, {&w.v, v_.data(), kw, false}}};
      };
      try {
        for (std::size_t l = 0; l < layers_; ++l) {
          const LayerWeights& w = weights_->layer(l);
          const std::uint64_t call = calls + 4 * l;
          with_kv([&](auto& kv, auto& keys_t) {  // this thread's kv heads' cache lines (see prefetch_kv)
            if (!per_head)
              for (std::size_t g = t; g < c.kv_heads; g += threads) prefetch_kv_head(kv, keys_t, l, g, start, n);
          });
          norm(w.attn_norm);
          product(qkv_of(w), call, h, e, normed);
          const MatmulOutput o[] = {{&w.o, x_.data(), e, true}};
          barrier.wait(t, next_weights(o));
          mark(products);
          with_kv([&](auto& kv, auto& keys_t) {
            if (!per_head) {  // a run's keys are read by the later runs' tasks too: all stored before any task
              for (std::size_t g = t; g < c.kv_heads; g += threads) rope_and_store_head(kv, keys_t, l, g, start, n);
              barrier.wait(t, next_weights(o));
              mark(other);
            }
            for (std::size_t task; (task = claimed[l].fetch_add(1, std::memory_order_relaxed)) < attention_tasks(n);)
              attention_task(kv, keys_t, l, start, n, task, per_head, slot, stored ? &stored[l * c.kv_heads] : nullptr);
          });
          barrier.wait(t, next_weights(o));
          mark(&ForwardProfile::attention);
          product(o, call + 1, attn_.data(), qw, attention_quantizes() ? quantized(qw) : QuantizedInputs{});
          barrier.wait(t, next_gate_up(w));
          mark(products);
          norm(w.ffn_norm);
          gate_up_rows(w, t, threads, n, call + 2, h, normed);
          const MatmulOutput down[] = {{&w.down, x_.data(), e, true}};
          barrier.wait(t, next_weights(down));
          mark(products);
          product(down, call + 3, gate_.data(), c.ffn, quantized(c.ffn));
          barrier.wait(t, l + 1 < layers_ ? next_weights(qkv_of(weights_->layer(l + 1))) : ReadAhead{});
          mark(products);
        }
      } catch (const StepBarrier::Aborted&) {  // another thread failed, and reports it
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
        barrier.abort();
      }
    });
    if (error) std::rethrow_exception(error);
  }

  /// Thread t's share of the gate and up projections of n positions in run_blocks_together: the same rows of
  /// both, cut at whole quantisation blocks, then SwiGLU over them and their quantisation for the down
  /// projection.
  void gate_up_rows(const LayerWeights& w, std::size_t t, std::size_t threads, std::size_t n, std::uint64_t call,
                    const float* h, QuantizedInputs normed) {
    const LlamaConfig& c = config();
    const auto [first, last] = gate_up_panels(w, t, threads);
    if (first >= last) return;
    const MatmulOutput gate{&w.gate, gate_.data(), c.ffn, false}, up{&w.up, up_.data(), c.ffn, false};
    detail::matmul_panels(gate, first, last, h, c.embedding, n, false, call, normed);
    detail::matmul_panels(up, first, last, h, c.embedding, n, false, call, normed);
    const std::size_t r0 = first * panel_rows, r1 = std::min(c.ffn, last * panel_rows);
    for (std::size_t i = 0; i < n; ++i) {
      swiglu(&gate_[i * c.ffn + r0], &up_[i * c.ffn + r0], r1 - r0);
      quantize_for_next(&gate_[i * c.ffn], i, r0 / quant_block, r1 / quant_block, c.ffn, n);  // whole blocks where ffn's are
    }
  }

  /// Thread t's panels [first, last) of the gate and up projections in gate_up_rows: an equal share of the pairs
  /// of panels (a pair: one 32-row quantisation block).
  static std::pair<std::size_t, std::size_t> gate_up_panels(const LayerWeights& w, std::size_t t, std::size_t threads) {
    const std::size_t panels = w.gate.panels(), pairs = (panels + 1) / 2;
    return {std::min(panels, 2 * (pairs * t / threads)), std::min(panels, 2 * (pairs * (t + 1) / threads))};
  }

  /// out[i] = x[i] / sqrt(mean(x[i]²) + eps) · weight, per row; the sum of squares in double, in 16 partial
  /// sums by index added in a fixed tree (fold_by_lanes): vectorised, and the same order for every row; each row
  /// then quantised for the next product (quantize_for_next). Rows are split across the threads (a row's
  /// arithmetic is the same on any thread).
  void rms_norm(const float* x, const float* weight, float* out, std::size_t n) {
    const std::size_t e = config().embedding;
    pool_->parallel_for(n, [&](std::size_t i, std::size_t) {
      norm_row(x + i * e, weight, out + i * e);
      quantize_for_next(out + i * e, i, 0, e / quant_block, e, n);
    });
  }

  /// One row of rms_norm, without the quantisation.
  void norm_row(const float* row, const float* weight, float* out) const {
    const std::size_t e = config().embedding;
    const double sum = fold_by_lanes(
        e, 0.0, [row](std::size_t k) { return double(row[k]) * double(row[k]); },
        [](double a, double b) { return a + b; });
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / double(e)) + config().rms_eps);
    for (std::size_t k = 0; k < e; ++k) out[k] = (row[k] * scale) * weight[k];
  }

  /// gate = SiLU(gate)·up over n positions, each 32-column block then quantised for the down projection
  /// (quantize_for_next); from 2 positions up split across the threads in runs of whole blocks (swiglu's
  /// arithmetic per element does not depend on the run it is in). With the norms split by rows (runs of 16
  /// elements then, nothing quantised here), forwards at context 318 took 0.98-0.99x the time at 5 and 9
  /// positions and 0.999-1.01x at 1 and 2 (alternating call by call with the one-thread code, 2 threads,
  /// 2026-12-02); quantising here and in the norms and attention, instead of on every thread in each product,
  /// then took 0.98-0.99x at 2-9 positions (one run of 7: 1.02x) and 0.999-1.008x at 1.
  void swiglu_rows(std::size_t n) {
    const std::size_t ffn = config().ffn, count = n * ffn, runs = n == 1 ? 1 : pool_->threads();
    const std::size_t run = (count / runs + quant_block - 1) / quant_block * quant_block;
    pool_->parallel_for(runs, [&](std::size_t r, std::size_t) {
      const std::size_t begin = std::min(count, r * run), end = r + 1 == runs ? count : std::min(count, begin + run);
      swiglu(gate_.data() + begin, up_.data() + begin, end - begin);
      if (!quantizes(ffn)) return;
      for (std::size_t k = begin; k < end; k += quant_block) {
        const std::size_t i = k / ffn, b = k % ffn / quant_block;
        quantize_for_next(gate_.data() + i * ffn, i, b, b + 1, ffn, n);
      }
    });
  }

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
