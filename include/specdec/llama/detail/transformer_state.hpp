// specdec/llama/detail/transformer_state.hpp — the memory of one running transformer: the shared weights and
// thread pool, the KV cache in its KvFormat with the transposed key blocks and q8 scales, the attention score
// rows (sized for max_context at construction), and the RoPE table and activation buffers (grown on demand).
// Entry point: detail::TransformerState. Read first: ../llama_options.hpp. Read next: transformer.hpp (the
// forward pass that computes into it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/detail/huge_pages.hpp"
#include "specdec/error.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/llama/detail/attention.hpp"
#include "specdec/llama/gguf.hpp"
#include "specdec/llama/llama_options.hpp"
#include "specdec/llama/llama_weights.hpp"
#include "specdec/llama/matmul.hpp"
#include "specdec/llama/thread_pool.hpp"
#include "specdec/model.hpp"
#include "specdec/tensor.hpp"

namespace specdec::llama::detail {

/// The state of one running transformer: weights (shared), the first `layers` blocks, a KV cache, buffers; what
/// Transformer computes into, and what a copy of a model copies.
class TransformerState {
 public:
  TransformerState(std::shared_ptr<const LlamaWeights> weights, std::size_t layers, std::size_t max_context,
                   std::shared_ptr<ThreadPool> pool, KvFormat kv_format)
      : weights_(std::move(weights)), pool_(std::move(pool)), layers_(layers), max_context_(max_context),
        kv_format_(kv_format) {
    if (!weights_) specdec::detail::fail("llama model needs weights, got none");
    if (!pool_) pool_ = std::make_shared<ThreadPool>(1);
    const LlamaConfig& c = weights_->config();
    if (layers == 0 || layers > c.layers)  // LlamaModel runs them all: only EarlyExitDraft asks for fewer
      specdec::detail::fail("EarlyExitDraft needs 1 to ", c.layers, " of the target's layers, got ", layers);
    if (max_context == 0) specdec::detail::fail("llama model needs max_context > 0, got 0");
    // A max_context too large for memory is a specdec::Error that names it (the cache's own errors prefixed).
    try {
      allocate_caches(layers, max_context);
    } catch (const specdec::Error& e) {  // the cache keeps a layer per (layer, kv head)
      specdec::detail::fail("llama model of max_context ", max_context, " (", layers, " layers x ", c.kv_heads,
                            " kv heads = ", layers * c.kv_heads, " cache layers): ", e.what());
    } catch (const std::bad_alloc&) {
      // Keys (twice: rows and transposed blocks) and values per position and layer.
      const double element = kv_format_ == KvFormat::f32 ? 4.0 : kv_format_ == KvFormat::f16 ? 2.0 : 1.0 + 8.0 / double(c.head_dim);
      const double per_position = 3.0 * double(layers * c.kv_heads * c.head_dim) * element;
      specdec::detail::fail("llama model of max_context ", max_context, ": out of memory for its caches (",
                            per_position / 1024.0, " KiB a position, ", per_position * double(max_context) / double(1 << 30),
                            " GiB in all)");
    }
    input_digits_ = quantized_input_digits(weights_->format());
    // Threads that wait for each other by spinning need a core each: with more threads than cores this process
    // may use, forwards of one position took 7x the time together (4 threads on 2 cores) where run_blocks' jobs
    // took 1.2x.
    together_ = pool_->threads() > 1 && pool_->threads() <= detail::usable_cores();
  }

  /// Throws specdec::Error for a model moved from (it has no weights), as weights() does; forward() asks first.
  const LlamaConfig& config() const { return weights()->config(); }
  std::size_t context_size() const {
    return kv_format_ == KvFormat::f16 ? kv16_.size() : kv_format_ == KvFormat::q8 ? kv8_.size() : kv32_.size();
  }
  std::size_t max_context() const { return max_context_; }
  std::size_t layers() const { return layers_; }
  KvFormat kv_format() const { return kv_format_; }
  void truncate(std::size_t n) {
    with_kv([n](auto& kv, auto&) { kv.truncate(n); });
    revision_ = specdec::next_revision();
  }
  /// Changes with every forward and truncate (see specdec::HasRevision).
  std::uint64_t revision() const { return revision_; }
  void set_profile(ForwardProfile* profile) { profile_.target = profile; }
  const std::shared_ptr<const LlamaWeights>& weights() const {
    if (!weights_) specdec::detail::fail("llama model was moved from: it has no weights");
    return weights_;
  }
  const std::shared_ptr<ThreadPool>& pool() const { return pool_; }

 protected:
  /// The KV cache, the transposed key blocks, the q8 scales and the score rows for max_context; the RoPE
  /// frequencies.
  void allocate_caches(std::size_t layers, std::size_t max_context) {
    const LlamaConfig& c = weights_->config();
    blocks_ = (max_context + key_block - 1) / key_block;
    with_kv([&](auto& kv, auto& keys_t) {
      using Cache = std::remove_reference_t<decltype(kv)>;
      kv = Cache(layers * c.kv_heads, max_context, c.head_dim);
      keys_t = std::remove_reference_t<decltype(keys_t)>(layers * c.kv_heads * blocks_ * key_block * c.head_dim);
    });
    if (kv_format_ == KvFormat::q8) {  // a scale per position, in rows of whole blocks (the kernels read 16)
      key_scales_ = specdec::detail::ZeroedArray<float>(layers * c.kv_heads * blocks_ * key_block);
      value_scales_ = specdec::detail::ZeroedArray<float>(key_scales_.size());
    }
    // RoPE frequencies base^(−2j/rope_dims), in double; the table's rows follow as positions are reached.
    const std::size_t pairs = c.rope_dims / 2;
    rope_frequencies_.resize(pairs);
    for (std::size_t j = 0; j < pairs; ++j)
      rope_frequencies_[j] = std::pow(double(c.rope_base), -2.0 * double(j) / double(c.rope_dims));
    score_stride_ = blocks_ * key_block;
    scores_.resize(pool_->threads() * (c.heads / c.kv_heads) * attention_span() * score_stride_);
  }

  /// Makes the RoPE table hold the first `positions` positions (at most max_context): cos and sin of
  /// θ_j = pos·base^(−2j/rope_dims), computed in double. It grows at least twofold at a time, so a model costs
  /// table memory and time for the positions it reaches, not for max_context (a 131072-position model made
  /// 33.5 MB of table in 0.12 s before its first token); a row's values do not depend on when it is computed.
  void extend_rope(std::size_t positions) {
    const std::size_t pairs = rope_frequencies_.size(), have = pairs == 0 ? 0 : rope_.size() / (pairs * 2);
    if (positions <= have) return;
    const std::size_t grown = std::min(max_context_, std::max({positions, 2 * have, std::size_t{64}}));
    rope_.resize(grown * pairs * 2);
    for (std::size_t pos = have; pos < grown; ++pos)
      for (std::size_t j = 0; j < pairs; ++j) {
        const double theta = double(pos) * rope_frequencies_[j];
        rope_[(pos * pairs + j) * 2] = static_cast<float>(std::cos(theta));
        rope_[(pos * pairs + j) * 2 + 1] = static_cast<float>(std::sin(theta));
      }
  }

  /// Forwards of at most this many positions run run_blocks_together: a verify pass's, not a prompt's, where each
  /// thread's norms of every position would cost more than the jobs they save.
  static constexpr std::size_t together_positions = 16;

  template <class T>
  using KeyBlocks = specdec::detail::ZeroedArray<T>;  // zeros, untouched until written

  /// Calls f(cache, transposed key blocks) for the cache of this model's KvFormat.
  template <class F>
  void with_kv(F&& f) {
    if (kv_format_ == KvFormat::f16)
      f(kv16_, keys_t16_);
    else if (kv_format_ == KvFormat::q8)
      f(kv8_, keys_t8_);
    else
      f(kv32_, keys_t32_);
  }

  /// A computed key or value as the cache stores it.
  static float to_kv(float v, float) { return v; }
  static std::uint16_t to_kv(float v, std::uint16_t) { return gguf::float_to_fp16(v); }

  /// Grows the activation buffers to hold n positions (only when a bigger batch than ever before arrives).
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    const LlamaConfig& c = config();
    x_.resize(n * c.embedding);
    h_.resize(n * c.embedding);
    q_.resize(n * c.heads * c.head_dim);
    attn_.resize(n * c.heads * c.head_dim);
    k_.resize(n * c.kv_heads * c.head_dim);
    v_.resize(n * c.kv_heads * c.head_dim);
    gate_.resize(n * c.ffn);
    up_.resize(n * c.ffn);
    if (input_digits_ != 0) {
      const std::size_t widest = std::max({c.embedding, c.heads * c.head_dim, c.ffn});
      xq_.resize((n * (widest / quant_block) * entry_bytes(input_digits_) + 63) / 64);
    }
    if (together_) {  // run_blocks_together's norms: each thread's share is its buffers' size / threads
      const std::size_t rows = std::min(n, together_positions), threads = pool_->threads();
      const std::size_t lines =
          input_digits_ != 0 ? (rows * (c.embedding / quant_block) * entry_bytes(input_digits_) + 63) / 64 : 0;
      norm_rows_.resize(std::max(norm_rows_.size(), threads * rows * c.embedding));
      norm_inputs_.resize(std::max(norm_inputs_.size(), threads * lines));
    }
    capacity_ = n;
  }

  /// The inputs of cols columns that the last producer (a norm, attention or SwiGLU) quantised into xq_ for the
  /// block kernels, or none where it did not (float weights; cols not whole 32-column blocks).
  QuantizedInputs quantized(std::size_t cols) const {
    if (!quantizes(cols)) return {};
    return {line_bytes(xq_.data()), input_digits_};
  }

  /// Whether inputs of cols columns are quantised by their producer: block weights, and whole 32-column blocks.
  bool quantizes(std::size_t cols) const { return input_digits_ != 0 && cols % quant_block == 0; }

  /// Whether the attention tasks quantise the output projection's inputs: each task writes whole blocks.
  bool attention_quantizes() const {
    const LlamaConfig& c = config();
    return quantizes(c.heads * c.head_dim) && (c.heads / c.kv_heads * c.head_dim) % quant_block == 0;
  }

  /// Quantises blocks [first, last) of position i's row of cols inputs into xq_ for the next matmul call over n
  /// positions (what quantized(cols) hands it), where quantized(cols) hands anything.
  void quantize_for_next(const float* row, std::size_t i, std::size_t first, std::size_t last, std::size_t cols,
                         std::size_t n) {
    if (!quantizes(cols)) return;
    quantize_row_blocks(input_digits_, row, i, first, last, n, cols / quant_block, line_bytes(xq_.data()));
  }

  /// Positions per attention task: as many as fill one pass of the AVX-512 kernel (6 rows) with the query heads
  /// that share a kv head, so that a pass reads each key and value once for them all. One without AVX-512, whose
  /// kernels pass once per position (AVX2) or row: there two positions per task would only halve the tasks that
  /// balance the threads. SmolLM2 (3 heads per kv head), context 318, 2 threads, alternating call by call: 2
  /// positions per task took the attention stage from 0.72 to 0.61-0.62 ms at 5 positions and from 1.22-1.23 to
  /// 1.03-1.05 at 9.
  std::size_t attention_span() const {
    const LlamaConfig& c = config();
    return passes_span_positions ? std::max<std::size_t>(1, rows_per_pass / (c.heads / c.kv_heads)) : 1;
  }

  std::shared_ptr<const LlamaWeights> weights_;
  std::shared_ptr<ThreadPool> pool_;
  std::size_t layers_;
  std::size_t max_context_;
  KvFormat kv_format_;
  // The cache of kv_format_ (the others stay empty). Layer l, kv head g at cache layer l·kv_heads + g:
  // [max_context, head_dim]; f16 holds half-precision bit patterns, q8 integers of rows scaled by the scales below.
  KvCache kv32_;
  BasicKvCache<std::uint16_t> kv16_;
  BasicKvCache<std::int8_t> kv8_;
  std::size_t blocks_ = 0;     // blocks of key_block positions that max_context needs
  // Per cache layer: [blocks][head_dim][key_block], the keys (after RoPE) again, in the cache's element.
  KeyBlocks<float> keys_t32_;
  KeyBlocks<std::uint16_t> keys_t16_;
  KeyBlocks<std::int8_t> keys_t8_;
  // q8 only: per cache layer [blocks·key_block], each position's key and value row scale.
  specdec::detail::ZeroedArray<float> key_scales_, value_scales_;  // zeros, untouched until written
  std::vector<double> rope_frequencies_;  // [rope_dims / 2]: base^(−2j/rope_dims)
  std::vector<float> rope_;    // [positions reached (extend_rope), rope_dims / 2, (cos, sin)]
  std::size_t score_stride_ = 0;  // blocks_·key_block
  std::vector<float> scores_;  // [threads, group, score_stride]: attention scratch per thread
  std::uint64_t revision_ = 0;  // see revision()
  // See set_profile(). A copy of the model, made or assigned, profiles nothing: two models adding to one
  // profile would mix their times (and race, on two threads). A move, made or assigned, takes the profile
  // over from its source.
  struct ProfileLink {
    ForwardProfile* target = nullptr;
    ProfileLink() = default;
    ProfileLink(const ProfileLink&) noexcept {}
    ProfileLink(ProfileLink&& other) noexcept : target(std::exchange(other.target, nullptr)) {}
    ProfileLink& operator=(const ProfileLink&) noexcept { return target = nullptr, *this; }
    ProfileLink& operator=(ProfileLink&& other) noexcept {
      if (this != &other) target = std::exchange(other.target, nullptr);
      return *this;
    }
  } profile_;
  int input_digits_ = 0;       // digits of the block kernels' inputs (1 or 3), 0 for float weights
  std::size_t capacity_ = 0;   // positions the buffers below hold
  std::vector<float> x_;       // [capacity, embedding]: the residual stream
  std::vector<float> h_;       // [capacity, embedding]: normed input of a block
  std::vector<float> q_;       // [capacity, heads·head_dim]
  std::vector<float> attn_;    // [capacity, heads·head_dim]: concatenated head outputs
  std::vector<float> k_;       // [capacity, kv_heads·head_dim]: new keys, before they go to the cache
  std::vector<float> v_;       // [capacity, kv_heads·head_dim]: new values
  std::vector<float> gate_;    // [capacity, ffn]: gate projection, then SwiGLU output
  std::vector<float> up_;      // [capacity, ffn]
  // The next matmul call's inputs quantised for the block kernels by the step that wrote them (see quantized()):
  // [capacity × the widest row's blocks] entries in detail::quantize_inputs's layout.
  std::vector<CacheLine> xq_;
  // run_blocks_together's norms, an equal share per thread: [threads, rows, embedding] (rows up to
  // together_positions), and quantised.
  std::vector<float> norm_rows_;
  std::vector<CacheLine> norm_inputs_;
  bool together_ = false;      // forwards of up to together_positions run run_blocks_together (see the constructor)
  Logits logits_;              // [n, vocab] of the last forward call
};

}  // namespace specdec::llama::detail
