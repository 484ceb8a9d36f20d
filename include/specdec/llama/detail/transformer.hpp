// specdec/llama/detail/transformer.hpp — the forward pass behind LlamaModel and EarlyExitDraft.
// Entry point: detail::Transformer::forward. Read first: ../llama_model.hpp, transformer_state.hpp (the memory it
// computes into). Read next: transformer_attention.hpp (RoPE, the KV cache's stores, attention's tasks),
// attention.hpp, ../matmul.hpp (the kernels).
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
#include <new>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/detail/attention.hpp"
#include "specdec/llama/detail/transformer_attention.hpp"
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
class Transformer : public TransformerAttention {
 public:
  using TransformerAttention::TransformerAttention;

  /// Appends tokens and returns their logits, [tokens, vocab].
  const Logits& forward(std::span<const Token> tokens) {
    compute_or_fail(tokens, true);
    return logits_;
  }
  /// Appends tokens without their logits (a prompt, a draft's catch-up): the final norm and the output head are
  /// skipped, and the logits buffer is left as it is, so that the next forward() of as many positions reuses it
  /// (a catch-up between two one-position draft steps freed and allocated 196 KB again).
  void append(std::span<const Token> tokens) { compute_or_fail(tokens, false); }

 private:
  /// compute(), with running out of memory reported as a specdec::Error that names the call's size; the
  /// context is what it was before the call.
  void compute_or_fail(std::span<const Token> tokens, bool with_logits) {
    try {
      compute(tokens, with_logits);
    } catch (const std::bad_alloc&) {
      const LlamaConfig& c = config();
      const double n = double(tokens.size()), mib = 1024.0 * 1024.0;
      // The main activation buffers (reserve); the quantised inputs and the kernels' scratch add a little.
      const double activations = 4.0 * n * double(2 * c.embedding + 2 * c.heads * c.head_dim + 2 * c.kv_heads * c.head_dim + 2 * c.ffn);
      if (with_logits)
        specdec::detail::fail("llama model: out of memory in a forward of ", tokens.size(), " positions at context ",
                              context_size(), " (", 4.0 * n * double(c.vocab) / mib, " MiB of logits, about ",
                              activations / mib, " MiB of activations)");
      specdec::detail::fail("llama model: out of memory in an append of ", tokens.size(), " positions at context ",
                            context_size(), " (no logits, about ", activations / mib, " MiB of activations)");
    }
  }

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
};

}  // namespace specdec::llama::detail
