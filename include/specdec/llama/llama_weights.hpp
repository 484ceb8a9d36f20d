// specdec/llama/llama_weights.hpp — llama hyperparameters and the immutable, shareable packed weights.
// Entry points: LlamaConfig::from_gguf, LlamaWeights::load. Read next: llama_model.hpp, detail/transformer.hpp
// (the forward pass).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "specdec/llama/gguf.hpp"
#include "specdec/llama/packed_matrix.hpp"
#include "specdec/sampling.hpp"
#include "specdec/tensor.hpp"

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
  /// token_embd.weight shape. Throws specdec::Error, naming the file and the key, on another architecture,
  /// missing keys or bad values, when llama.vocab_size and the tokenizer's token count disagree, and when
  /// llama.attention.value_length is not the head width.
  static LlamaConfig from_gguf(const gguf::File& file) {
    if (auto arch = file.find_string("general.architecture"); arch && *arch != "llama")
      specdec::detail::fail(file.name(), ": general.architecture is \"", *arch, "\", expected \"llama\"");
    LlamaConfig c;
    c.embedding = file.get_uint("llama.embedding_length");
    c.layers = file.get_uint("llama.block_count");
    c.heads = file.get_uint("llama.attention.head_count");
    c.kv_heads = file.find_uint("llama.attention.head_count_kv").value_or(c.heads);
    c.ffn = file.get_uint("llama.feed_forward_length");
    c.context_length = file.get_uint("llama.context_length");
    if (auto key_length = file.find_uint("llama.attention.key_length")) {
      c.head_dim = *key_length;
    } else if (c.heads) {
      if (c.embedding % c.heads != 0)
        specdec::detail::fail(file.name(), ": llama.embedding_length ", c.embedding,
                              " is not a multiple of llama.attention.head_count ", c.heads,
                              ", and no llama.attention.key_length gives the head width");
      c.head_dim = c.embedding / c.heads;
    }
    c.rope_dims = file.find_uint("llama.rope.dimension_count").value_or(c.head_dim);
    c.rms_eps = static_cast<float>(file.get_float("llama.attention.layer_norm_rms_epsilon"));
    c.rope_base = static_cast<float>(file.find_float("llama.rope.freq_base").value_or(10000.0));
    const std::optional<std::size_t> tokens =
        file.has("tokenizer.ggml.tokens") ? std::optional(file.array_size("tokenizer.ggml.tokens")) : std::nullopt;
    if (auto vocab = file.find_uint("llama.vocab_size")) {
      c.vocab = *vocab;
      if (tokens && *tokens != c.vocab)
        specdec::detail::fail(file.name(), ": llama.vocab_size is ", c.vocab, " but tokenizer.ggml.tokens has ",
                              *tokens, " tokens");
    } else if (tokens) {
      c.vocab = *tokens;
    } else if (const auto* embd = file.find_tensor("token_embd.weight"); embd && embd->dims.size() == 2) {
      c.vocab = embd->dims[1];
    }
    gguf::naming_file(file, [&] { c.validate(); });
    // The forward reads values as wide as keys: a file whose value heads differ would load with wrong shapes.
    if (auto value_length = file.find_uint("llama.attention.value_length"); value_length && *value_length != c.head_dim)
      specdec::detail::fail(file.name(), ": llama.attention.value_length is ", *value_length, ", expected the head width ",
                            c.head_dim, " (llama.attention.key_length, else embedding_length / head_count): ",
                            "value heads of another width are not supported");
    return c;
  }

  /// Largest size accepted for any one hyperparameter, and for the widths made of two (heads·head_dim): far
  /// above any llama model, and small enough that no size computed from them overflows.
  static constexpr std::size_t max_size = std::size_t{1} << 24;
  static constexpr std::size_t max_layers = 4096;
  /// Largest head width (llama.attention.key_length) accepted: 4x the widest of llama-architecture models (256).
  /// The RoPE table holds head width floats a position, computed as positions are reached, and the cache
  /// more, so a small file declaring a wider head would cost gigabytes and minutes in a model's first forwards.
  static constexpr std::size_t max_head_width = 1024;
  static constexpr std::size_t max_vocab = specdec::max_vocab_size;  // token ids are int32

  /// Throws specdec::Error naming the first inconsistent hyperparameter (by its GGUF key).
  void validate() const {
    const char* const head_width = "llama.attention.key_length (else embedding_length / head_count)";
    const std::pair<const char*, std::size_t> sizes[] = {
        {"llama.vocab_size (or the token count)", vocab}, {"llama.embedding_length", embedding},
        {"llama.block_count", layers}, {"llama.attention.head_count", heads},
        {"llama.attention.head_count_kv", kv_heads}, {head_width, head_dim},
        {"llama.feed_forward_length", ffn}, {"llama.context_length", context_length}};
    for (const auto& [key, value] : sizes)
      if (value == 0) specdec::detail::fail("llama config: ", key, " is 0, expected at least 1");
    if (vocab >= max_vocab) specdec::detail::fail("llama config: vocabulary of ", vocab, " tokens, at most ", max_vocab - 1, " supported");
    if (layers > max_layers) specdec::detail::fail("llama config: llama.block_count is ", layers, ", at most ", max_layers, " supported");
    for (const auto& [key, value] : {std::pair{"llama.embedding_length", embedding}, std::pair{"llama.feed_forward_length", ffn},
                                     std::pair{"llama.attention.head_count", heads}, std::pair{head_width, head_dim}})
      if (value > max_size) specdec::detail::fail("llama config: ", key, " is ", value, ", at most ", max_size, " supported");
    if (head_dim > max_head_width)
      specdec::detail::fail("llama config: the head width (llama.attention.key_length, else embedding_length / ",
                            "head_count) is ", head_dim, ", at most ", max_head_width, " supported");
    if (heads * head_dim > max_size)  // both <= 2^24: the product cannot overflow
      specdec::detail::fail("llama config: head_count ", heads, " x key_length ", head_dim, " = ", heads * head_dim,
                            ", at most ", max_size, " supported");
    if (heads % kv_heads != 0)
      specdec::detail::fail("llama config: llama.attention.head_count ", heads,
                            " is not a multiple of llama.attention.head_count_kv ", kv_heads);
    if (heads / kv_heads > 64)
      specdec::detail::fail("llama config: ", heads / kv_heads, " query heads per kv head, at most 64 supported");
    if (rope_dims == 0 || rope_dims % 2 != 0 || rope_dims > head_dim)
      specdec::detail::fail("llama config: llama.rope.dimension_count (else the head width) ", rope_dims,
                            " must be even, positive and at most the head width ", head_dim);
    if (!(rms_eps > 0.0f && rms_eps < INFINITY) || !(rope_base > 0.0f && rope_base < INFINITY))
      specdec::detail::fail("llama config: llama.attention.layer_norm_rms_epsilon ", rms_eps,
                            " and llama.rope.freq_base ", rope_base, " must be positive and finite");
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

  /// The seven weight matrices, in the order a forward reads them.
  std::array<const PackedMatrix*, 7> matrices() const { return {&q, &k, &v, &o, &gate, &up, &down}; }
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const PackedMatrix* m : matrices()) total += m->bytes();
    return total;
  }
};

/// All weights of a llama model in one in-memory format. Immutable once loaded: a model and its early-exit
/// drafts share one instance through std::shared_ptr<const LlamaWeights>.
class LlamaWeights {
 public:
  /// Finds a tensor by GGUF name, or returns nullptr.
  using TensorLookup = std::function<const gguf::TensorInfo*(std::string_view)>;

  /// Loads and repacks every tensor of a llama GGUF file.
  /// Throws specdec::Error on a missing tensor, a shape that does not match the config, or a weight that is not
  /// finite as `format` stores it (naming the tensor and where).
  static std::shared_ptr<const LlamaWeights> load(const gguf::File& file, WeightFormat format) {
    const LlamaConfig config = LlamaConfig::from_gguf(file);
    return gguf::naming_file(
        file, [&] { return load(config, [&](std::string_view name) { return file.find_tensor(name); }, format); });
  }

  /// Loads from any tensor source (a GGUF file, or tensors built in memory by a test).
  static std::shared_ptr<const LlamaWeights> load(const LlamaConfig& config, const TensorLookup& lookup,
                                                  WeightFormat format) {
    config.validate();
    auto w = std::shared_ptr<LlamaWeights>(new LlamaWeights(config, format));
    const std::size_t e = config.embedding, qw = config.heads * config.head_dim, kw = config.kv_heads * config.head_dim;
    // Grown layer by layer, as tensors are found: a block count far beyond the file's tensors fails at the
    // first missing one, not in a huge allocation first.
    for (std::size_t l = 0; l < config.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LayerWeights& L = w->layers_.emplace_back();
      L.attn_norm = vector(require(lookup, p + "attn_norm.weight", {e}));
      L.q = matrix(lookup, p + "attn_q.weight", {e, qw}, format);
      L.k = matrix(lookup, p + "attn_k.weight", {e, kw}, format);
      L.v = matrix(lookup, p + "attn_v.weight", {e, kw}, format);
      L.o = matrix(lookup, p + "attn_output.weight", {qw, e}, format);
      L.ffn_norm = vector(require(lookup, p + "ffn_norm.weight", {e}));
      L.gate = matrix(lookup, p + "ffn_gate.weight", {e, config.ffn}, format);
      L.up = matrix(lookup, p + "ffn_up.weight", {e, config.ffn}, format);
      L.down = matrix(lookup, p + "ffn_down.weight", {config.ffn, e}, format);
    }
    w->output_norm_ = vector(require(lookup, "output_norm.weight", {e}));
    w->embedding_ = matrix(lookup, "token_embd.weight", {e, config.vocab}, format);
    if (lookup("output.weight")) w->output_ = matrix(lookup, "output.weight", {e, config.vocab}, format);
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
    // A File has checked its tensors' bytes; a lookup that builds them (a test's, a caller's) may be wrong.
    // The dims are the config's (LlamaConfig::validate: widths up to 2^24, vocab below 2^31): no overflow below.
    const std::uint64_t block = gguf::block_size(t->type);
    if (block == 0) specdec::detail::fail("tensor ", name, " has unknown type ", std::uint32_t(t->type));
    const std::uint64_t bytes = t->rows() * t->row_bytes();
    if (dims[0] % block != 0 || t->data.size() != bytes)
      specdec::detail::fail("tensor ", name, " of type ", gguf::type_name(t->type), " and dims ", dims_text(dims), " has ",
                            t->data.size(), " bytes of data, expected ", bytes, dims[0] % block ? " and whole blocks" : "");
    return *t;
  }

  static std::vector<float> vector(const gguf::TensorInfo& t) {
    std::vector<float> values = gguf::dequantize(t);
    check_finite(t, 0, values.data(), values.size());
    return values;
  }

  /// The magnitude bits from which a float is not finite as `encoding` stores it: inf and NaN in f32; in
  /// bfloat16 also the finite floats from 0x7F7F8000 up (about 3.3961e38), which round to inf.
  static std::uint32_t first_non_finite_bits(PanelEncoding encoding) {
    return encoding == PanelEncoding::f32 ? 0x7F800000u : 0x7F7F8000u;
  }

  /// Throws specdec::Error naming the tensor and the place unless row `r` of `t`, dequantised into `row`, is
  /// finite as `encoding` stores it: a NaN or infinite weight would otherwise surface as a non-finite logit, far
  /// from its cause.
  static void check_finite(const gguf::TensorInfo& t, std::size_t r, const float* row, std::size_t n,
                           PanelEncoding encoding = PanelEncoding::f32) {
    const std::uint32_t limit = first_non_finite_bits(encoding);
    const auto bad = specdec::detail::first_bits_where(
        std::span<const float>(row, n), [limit](std::uint32_t bits) { return (bits & 0x7FFFFFFFu) >= limit; });
    if (bad)
      specdec::detail::fail("tensor ", t.name, " holds ", row[*bad], " at row ", r, ", column ", *bad,
                            std::isfinite(row[*bad]) ? ", which rounds to inf in bfloat16" : "",
                            ": a model's weights must be finite");
  }

  /// The same for quant blocks kept as they are (Q8_0, Q4_0, Q4_1): their f16 scales (and Q4_1's minimums) are
  /// finite, so every value is. `scales` is 1 or 2, the f16 values at the start of each block.
  static void check_finite_scales(const gguf::TensorInfo& t, std::size_t scales) {
    const std::size_t block = gguf::type_size(t.type), per_row = t.row_length() / gguf::block_size(t.type);
    const std::byte* data = t.data.data();
    for (std::size_t b = 0, blocks = t.data.size() / block; b < blocks; ++b)
      for (std::size_t s = 0; s < scales; ++s) {
        std::uint16_t h;
        std::memcpy(&h, data + b * block + 2 * s, 2);
        if ((h & 0x7C00u) == 0x7C00u)  // exponent all ones: inf or NaN
          specdec::detail::fail("tensor ", t.name, " holds ", gguf::fp16_to_float(h), " as the ",
                                s == 0 ? "scale" : "minimum", " of block ", b % per_row, " of row ", b / per_row,
                                " (columns ", b % per_row * gguf::block_size(t.type), "..",
                                (b % per_row + 1) * gguf::block_size(t.type) - 1, "): a model's weights must be finite");
      }
  }

  /// The tensor `name` (require) repacked (matrix); out of memory is a specdec::Error that names it.
  static PackedMatrix matrix(const TensorLookup& lookup, const std::string& name,
                             const std::vector<std::uint64_t>& dims, WeightFormat format) {
    const gguf::TensorInfo& t = require(lookup, name, dims);
    try {
      return matrix(t, format);
    } catch (const std::bad_alloc&) {
      specdec::detail::fail("out of memory repacking tensor ", name, " of type ", gguf::type_name(t.type),
                            " and dims ", dims_text(dims), " (", t.data.size(), " bytes in the file) as ",
                            to_string(format));
    }
  }

  /// Repacks a GGUF [cols, rows] tensor. `quantized` keeps Q8_0/Q4_0/Q4_1 blocks and BF16 values as they are
  /// and stores anything else as exact f32. `quantized_dot` stores the same; its quant blocks take 8-bit
  /// inputs instead of 24-bit ones.
  static PackedMatrix matrix(const gguf::TensorInfo& t, WeightFormat format) {
    const std::size_t rows = t.rows(), cols = t.row_length();
    if (format == WeightFormat::quantized_dot || format == WeightFormat::quantized) {
      if (t.type == gguf::TensorType::Q8_0 || t.type == gguf::TensorType::Q4_0) check_finite_scales(t, 1);
      if (t.type == gguf::TensorType::Q4_1) check_finite_scales(t, 2);
    }
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
    return PackedMatrix::from_rows(rows, cols, encoding, [&](std::size_t r, float* out) {
      t.dequantize_row(r, out);
      check_finite(t, r, out, cols, encoding);
    });
  }

  LlamaConfig config_;
  WeightFormat format_;
  std::vector<LayerWeights> layers_;  // [layers]
  std::vector<float> output_norm_;    // [embedding]
  PackedMatrix embedding_;            // [vocab, embedding]
  PackedMatrix output_;               // [vocab, embedding]; empty when tied to embedding_
};

}  // namespace specdec::llama
