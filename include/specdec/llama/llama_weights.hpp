// specdec/llama/llama_weights.hpp — llama hyperparameters and the immutable, shareable packed weights.
// Entry points: LlamaConfig::from_gguf, LlamaWeights::load. Read next: llama_model.hpp (the forward pass).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/gguf.hpp"
#include "specdec/llama/packed_matrix.hpp"

namespace specdec::llama {

/// Hyperparameters of a llama-architecture transformer, as the GGUF `llama.*` keys give them.
struct LlamaConfig {
  std::size_t vocab = 0;           // tokens
  std::size_t embedding = 0;       // model width
  std::size_t layers = 0;          // transformer blocks
  std::size_t heads = 0;           // query heads
  std::size_t kv_heads = 0;        // key/value heads (GQA: heads / kv_heads query heads share one)
  std::size_t head_dim = 0;        // width of one head
  std::size_t ffn = 0;             // hidden width of the SwiGLU MLP
  std::size_t context_length = 0;  // trained context
  std::size_t rope_dims = 0;       // leading dims of each head that RoPE rotates (usually head_dim)
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;

  /// Reads the llama.* keys; vocab from llama.vocab_size, else the tokenizer.ggml.tokens count, else the
  /// token_embd.weight shape. Throws specdec::Error on another architecture, missing keys or bad values.
  static LlamaConfig from_gguf(const gguf::File& file) {
    if (auto arch = file.find_string("general.architecture"); arch && *arch != "llama")
      specdec::detail::fail("general.architecture is \"", *arch, "\", expected \"llama\"");
    LlamaConfig c;
    c.embedding = file.get_uint("llama.embedding_length");
    c.layers = file.get_uint("llama.block_count");
    c.heads = file.get_uint("llama.attention.head_count");
    c.kv_heads = file.find_uint("llama.attention.head_count_kv").value_or(c.heads);
    c.ffn = file.get_uint("llama.feed_forward_length");
    c.context_length = file.get_uint("llama.context_length");
    c.head_dim = file.find_uint("llama.attention.key_length").value_or(c.heads ? c.embedding / c.heads : 0);
    c.rope_dims = file.find_uint("llama.rope.dimension_count").value_or(c.head_dim);
    c.rms_eps = static_cast<float>(file.get_float("llama.attention.layer_norm_rms_epsilon"));
    c.rope_base = static_cast<float>(file.find_float("llama.rope.freq_base").value_or(10000.0));
    if (auto vocab = file.find_uint("llama.vocab_size")) {
      c.vocab = *vocab;
    } else if (file.has("tokenizer.ggml.tokens")) {
      c.vocab = file.array_size("tokenizer.ggml.tokens");
    } else if (const auto* embd = file.find_tensor("token_embd.weight"); embd && embd->dims.size() == 2) {
      c.vocab = embd->dims[1];
    }
    c.validate();
    return c;
  }

  /// Throws specdec::Error naming the first inconsistent hyperparameter.
  void validate() const {
    if (!vocab || !embedding || !layers || !heads || !kv_heads || !head_dim || !ffn)
      specdec::detail::fail("llama config needs nonzero sizes, got vocab ", vocab, ", embedding ", embedding,
                            ", layers ", layers, ", heads ", heads, ", kv_heads ", kv_heads, ", head_dim ", head_dim,
                            ", ffn ", ffn);
    if (heads % kv_heads != 0)
      specdec::detail::fail("llama config: head count ", heads, " is not a multiple of kv head count ", kv_heads);
    if (heads / kv_heads > 64)
      specdec::detail::fail("llama config: ", heads / kv_heads, " query heads per kv head, at most 64 supported");
    if (rope_dims % 2 != 0 || rope_dims > head_dim)
      specdec::detail::fail("llama config: rope dimension count ", rope_dims, " must be even and at most head_dim ",
                            head_dim);
    if (!(rms_eps > 0.0f) || !(rope_base > 0.0f))
      specdec::detail::fail("llama config: rms epsilon ", rms_eps, " and rope base ", rope_base, " must be positive");
  }
};

/// One transformer block's weights. Matrices are [outputs, inputs].
struct LayerWeights {
  std::vector<float> attn_norm;  // [embedding]
  PackedMatrix q;                // [heads·head_dim, embedding], rows permuted for adjacent-pair RoPE (GGUF)
  PackedMatrix k;                // [kv_heads·head_dim, embedding], same permutation
  PackedMatrix v;                // [kv_heads·head_dim, embedding]
  PackedMatrix o;                // [embedding, heads·head_dim]
  std::vector<float> ffn_norm;   // [embedding]
  PackedMatrix gate;             // [ffn, embedding]
  PackedMatrix up;               // [ffn, embedding]
  PackedMatrix down;             // [embedding, ffn]

  std::size_t bytes() const { return q.bytes() + k.bytes() + v.bytes() + o.bytes() + gate.bytes() + up.bytes() + down.bytes(); }
};

/// All weights of a llama model in one in-memory format. Immutable once loaded: a model and its early-exit
/// drafts share one instance through std::shared_ptr<const LlamaWeights>.
class LlamaWeights {
 public:
  /// Finds a tensor by GGUF name, or returns nullptr.
  using TensorLookup = std::function<const gguf::TensorInfo*(std::string_view)>;

  /// Loads and repacks every tensor of a llama GGUF file.
  /// Throws specdec::Error on a missing tensor or a shape that does not match the config.
  static std::shared_ptr<const LlamaWeights> load(const gguf::File& file, WeightFormat format) {
    return load(LlamaConfig::from_gguf(file), [&](std::string_view name) { return file.find_tensor(name); },
                format);
  }

  /// Loads from any tensor source (a GGUF file, or tensors built in memory by a test).
  static std::shared_ptr<const LlamaWeights> load(const LlamaConfig& config, const TensorLookup& lookup,
                                                  WeightFormat format) {
    config.validate();
    auto w = std::shared_ptr<LlamaWeights>(new LlamaWeights(config, format));
    const std::size_t e = config.embedding, qw = config.heads * config.head_dim, kw = config.kv_heads * config.head_dim;
    w->layers_.resize(config.layers);
    for (std::size_t l = 0; l < config.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LayerWeights& L = w->layers_[l];
      L.attn_norm = vector(require(lookup, p + "attn_norm.weight", {e}));
      L.q = matrix(require(lookup, p + "attn_q.weight", {e, qw}), format);
      L.k = matrix(require(lookup, p + "attn_k.weight", {e, kw}), format);
      L.v = matrix(require(lookup, p + "attn_v.weight", {e, kw}), format);
      L.o = matrix(require(lookup, p + "attn_output.weight", {qw, e}), format);
      L.ffn_norm = vector(require(lookup, p + "ffn_norm.weight", {e}));
      L.gate = matrix(require(lookup, p + "ffn_gate.weight", {e, config.ffn}), format);
      L.up = matrix(require(lookup, p + "ffn_up.weight", {e, config.ffn}), format);
      L.down = matrix(require(lookup, p + "ffn_down.weight", {config.ffn, e}), format);
    }
    w->output_norm_ = vector(require(lookup, "output_norm.weight", {e}));
    w->embedding_ = matrix(require(lookup, "token_embd.weight", {e, config.vocab}), format);
    if (lookup("output.weight")) w->output_ = matrix(require(lookup, "output.weight", {e, config.vocab}), format);
    return w;
  }

  const LlamaConfig& config() const { return config_; }
  WeightFormat format() const { return format_; }
  const LayerWeights& layer(std::size_t l) const { return layers_.at(l); }
  const PackedMatrix& token_embedding() const { return embedding_; }                   // [vocab, embedding]
  const PackedMatrix& output() const { return tied() ? embedding_ : output_; }        // [vocab, embedding]
  const std::vector<float>& output_norm() const { return output_norm_; }              // [embedding]
  /// Whether the output head is the token embedding (no output.weight in the file).
  bool tied() const { return output_.rows() == 0; }

  /// Weight bytes one forward call streams when it runs the first `layers` blocks and the output head.
  std::size_t bytes_per_forward(std::size_t layers) const {
    std::size_t bytes = output().bytes();
    for (std::size_t l = 0; l < layers && l < layers_.size(); ++l) bytes += layers_[l].bytes();
    return bytes;
  }

 private:
  LlamaWeights(const LlamaConfig& config, WeightFormat format) : config_(config), format_(format) {}

  static std::string dims_text(const std::vector<std::uint64_t>& dims) {
    std::ostringstream out;
    out << '[';
    for (std::size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
    out << ']';
    return out.str();
  }

  static const gguf::TensorInfo& require(const TensorLookup& lookup, const std::string& name,
                                         const std::vector<std::uint64_t>& dims) {
    const gguf::TensorInfo* t = lookup(name);
    if (!t) specdec::detail::fail("missing tensor ", name, ", expected dims ", dims_text(dims));
    if (t->dims != dims)
      specdec::detail::fail("tensor ", name, " has dims ", dims_text(t->dims), ", expected ", dims_text(dims));
    return *t;
  }

  static std::vector<float> vector(const gguf::TensorInfo& t) { return gguf::dequantize(t); }

  /// Repacks a GGUF [cols, rows] tensor. `quantized` keeps Q8_0/Q4_0/Q4_1 blocks and BF16 values as they are
  /// and stores anything else as exact f32. `quantized_dot` stores the same; its quant blocks take 8-bit
  /// inputs instead of 24-bit ones.
  static PackedMatrix matrix(const gguf::TensorInfo& t, WeightFormat format) {
    const std::size_t rows = t.rows(), cols = t.row_length();
    if (format == WeightFormat::quantized_dot) {
      switch (t.type) {
        case gguf::TensorType::Q8_0: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q8_0_dot, t.data.data());
        case gguf::TensorType::Q4_0: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q4_0_dot, t.data.data());
        case gguf::TensorType::Q4_1: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q4_1_dot, t.data.data());
        default: format = WeightFormat::quantized; break;  // other tensor types: as `quantized` stores them
      }
    }
    if (format == WeightFormat::quantized) {
      switch (t.type) {
        case gguf::TensorType::Q8_0: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q8_0, t.data.data());
        case gguf::TensorType::Q4_0: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q4_0, t.data.data());
        case gguf::TensorType::Q4_1: return PackedMatrix::from_blocks(rows, cols, PanelEncoding::q4_1, t.data.data());
        default: break;
      }
    }
    PanelEncoding encoding = PanelEncoding::f32;
    if (format == WeightFormat::bf16 || (format == WeightFormat::quantized && t.type == gguf::TensorType::BF16))
      encoding = PanelEncoding::bf16;
    if (format == WeightFormat::bf16_dot) encoding = PanelEncoding::bf16_dot;
    return PackedMatrix::from_rows(rows, cols, encoding,
                                   [&](std::size_t r, float* out) { t.dequantize_row(r, out); });
  }

  LlamaConfig config_;
  WeightFormat format_;
  std::vector<LayerWeights> layers_;  // [layers]
  std::vector<float> output_norm_;    // [embedding]
  PackedMatrix embedding_;            // [vocab, embedding]
  PackedMatrix output_;               // [vocab, embedding]; empty when tied to embedding_
};

}  // namespace specdec::llama
