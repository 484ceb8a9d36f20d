// specdec/llama/llama_model.hpp — the reference llama transformer (SmolLM2 from GGUF) and its early-exit draft.
// Entry points: LlamaModel::load, EarlyExitDraft. Both satisfy specdec::Model.
// Read first: llama_options.hpp (load options, KV formats), llama_weights.hpp (config and weights), matmul.hpp
// (the batch-invariant kernel). Read next: detail/transformer.hpp (the forward pass and its batch invariance),
// detail/transformer_state.hpp (the caches and buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>

#include "specdec/llama/detail/transformer.hpp"
#include "specdec/llama/gguf.hpp"
#include "specdec/llama/llama_options.hpp"
#include "specdec/llama/llama_weights.hpp"
#include "specdec/llama/thread_pool.hpp"
#include "specdec/model.hpp"
#include "specdec/tensor.hpp"

namespace specdec::llama {

/// The reference llama transformer. Keeps its context in a KV cache; forward appends, truncate rolls back.
/// A copy has its own cache and shares the weights and the thread pool: copies, or a model and its drafts, may
/// be used on different threads, and then take turns on the pool (see ThreadPool). Models that should run at the
/// same time need pools of their own: LlamaModel(m.weights(), m.max_context(), std::make_shared<ThreadPool>(n),
/// m.kv_format()) is a model over m's weights with an empty context and a pool of its own.
///
///   auto model = specdec::llama::LlamaModel::load("models/SmolLM2-135M-Instruct.Q4_1.gguf", {.threads = 2});
///   const specdec::Logits& logits = model.forward(prompt_tokens);  // [prompt size, 49152]
class LlamaModel {
 public:
  /// Opens a GGUF file and loads it in options.format. Throws specdec::Error on 0 threads or max_context (before
  /// the file is read), unreadable files, missing keys or tensors, tensor shapes that disagree with the
  /// hyperparameters, weights that are not finite, and a thread count or max_context the machine cannot provide.
  static LlamaModel load(const std::filesystem::path& path, const LoadOptions& options = {}) {
    if (options.threads == 0) specdec::detail::fail("LoadOptions::threads must be at least 1, got 0");
    if (options.max_context == 0) specdec::detail::fail("LoadOptions::max_context must be at least 1, got 0");
    const gguf::File file = gguf::File::open(path);
    return LlamaModel(LlamaWeights::load(file, options.format), options.max_context,
                      std::make_shared<ThreadPool>(options.threads), options.kv_format);
  }

  /// A model over shared weights with its own KV cache of max_context positions, running on `pool`
  /// (which a draft may share; nullptr means one thread). requires: weights != nullptr, max_context > 0.
  LlamaModel(std::shared_ptr<const LlamaWeights> weights, std::size_t max_context, std::shared_ptr<ThreadPool> pool,
             KvFormat kv_format = LoadOptions{}.kv_format)
      : state_(weights, weights ? weights->config().layers : 0, max_context, std::move(pool), kv_format) {}

  std::size_t vocab_size() const { return state_.config().vocab; }
  /// Tokens held in the context.
  std::size_t context_size() const { return state_.context_size(); }
  /// Appends tokens; returns the logits of each appended position, [tokens.size(), vocab_size()], valid until
  /// the next call. Throws specdec::Error for ids outside the vocabulary or when the context would exceed
  /// max_context(); the model is unchanged then. Running out of memory is a specdec::Error that names the
  /// call's size (its logits and activations), and also leaves the context as it was.
  const Logits& forward(std::span<const Token> tokens) { return state_.forward(tokens); }
  /// Appends tokens without computing logits: the decoder's prompt processing skips the output head this way.
  void append(std::span<const Token> tokens) { state_.append(tokens); }
  /// Keeps the first n tokens of the context, in O(layers).
  void truncate(std::size_t n) { state_.truncate(n); }
  /// Changes with every forward, append and truncate: lets a decoder notice other users (specdec::HasRevision).
  std::uint64_t revision() const { return state_.revision(); }

  const LlamaConfig& config() const { return state_.config(); }
  std::size_t max_context() const { return state_.max_context(); }
  WeightFormat format() const { return state_.weights()->format(); }
  KvFormat kv_format() const { return state_.kv_format(); }
  const std::shared_ptr<const LlamaWeights>& weights() const { return state_.weights(); }
  const std::shared_ptr<ThreadPool>& pool() const { return state_.pool(); }
  /// Weight bytes a forward call streams (all layers and the output head).
  std::size_t weight_bytes_per_forward() const { return state_.weights()->bytes_per_forward(state_.layers()); }
  /// Adds the time of every later forward and append, by stage, to *profile (not owned; it must outlive the
  /// calls); nullptr stops. Results do not change. A copy of the model, made or assigned, does not profile; a move
  /// takes the profile over.
  void set_profile(ForwardProfile* profile) { state_.set_profile(profile); }

 private:
  detail::Transformer state_;
};

/// A draft made of the target's first `layers` blocks followed by its final norm and output head. Shares the
/// target's weights (no copy) and thread pool; has its own KV cache of the target's max_context positions and
/// KvFormat.
class EarlyExitDraft {
 public:
  /// Throws specdec::Error unless 1 <= layers <= target.config().layers. Draft and target share a thread pool:
  /// on different threads they take turns on it.
  EarlyExitDraft(const LlamaModel& target, std::size_t layers)
      : state_(target.weights(), layers, target.max_context(), target.pool(), target.kv_format()) {}

  std::size_t vocab_size() const { return state_.config().vocab; }
  std::size_t context_size() const { return state_.context_size(); }
  const Logits& forward(std::span<const Token> tokens) { return state_.forward(tokens); }
  void append(std::span<const Token> tokens) { state_.append(tokens); }
  void truncate(std::size_t n) { state_.truncate(n); }
  std::uint64_t revision() const { return state_.revision(); }

  std::size_t layers() const { return state_.layers(); }
  std::size_t max_context() const { return state_.max_context(); }
  std::size_t weight_bytes_per_forward() const { return state_.weights()->bytes_per_forward(state_.layers()); }

 private:
  detail::Transformer state_;
};

static_assert(specdec::Model<LlamaModel>);
static_assert(specdec::Model<EarlyExitDraft>);
static_assert(specdec::HasMaxContext<LlamaModel> && specdec::HasMaxContext<EarlyExitDraft>);

}  // namespace specdec::llama
