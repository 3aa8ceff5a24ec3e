// The one Llama-family forward (Llama 2/3, Mistral, Qwen2/2.5, Qwen3), written against ops/:
// embed → per layer [rms_norm → q,k,v (+bias) → (q/k norm) → rope → store K/V in the paged cache
// → paged attention → o_proj → residual add + rms_norm → SwiGLU MLP → residual] → final norm →
// LM head. The batch is flat: prefill chunks and decode tokens of several sequences together.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/status.h"
#include "core/tensor.h"
#include "kv/kv_cache.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace tachyon {

struct ForwardBatch {
  Tensor token_ids;   // [n_tokens] i32
  Tensor positions;   // [n_tokens] i32: position of each token in its sequence
  AttentionMetadata attention;
  Tensor logits_rows; // [n_logits] i32: rows of the batch whose logits are wanted
};

struct ForwardOptions {
  ops::LinearMode linear_mode = ops::LinearMode::kFastest;  // kBatchInvariant: outputs independent of batching
  bool cuda_graphs = true;  // on a GPU, decode steps replay a graph captured once per batch shape
  // When set: the final hidden state of each logits row (after the final norm: what the LM head
  // reads), [n_logits, hidden] f32, where the logits are (forward: the host; forward_on_device:
  // device(), allocated there unless it is that shape there already; a GPU decode step hands
  // back its graph's buffer, as it does the logits, valid until the next forward). What
  // proposers that read the target's features take (speculative/).
  Tensor* hidden = nullptr;
};

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // Where the weights live, and so where forward() runs and its KV cache must be.
  Device device() const { return weights_.embed_tokens.device(); }

  // Runs the batch (described on the host), writing its K/V into `cache` (on device()), and fills
  // logits [n_logits, vocab] f32 on the host. On a GPU the batch's plan is copied over first and
  // the call returns once the logits are back.
  Status forward(const ForwardBatch& batch, KvCache& cache, Tensor& logits, const ForwardOptions& options = {}) const;
  // Like forward(), but `logits` stays on device() (allocated there when it is not [n_logits,
  // vocab] f32 on device() already) and nothing waits for the device.
  Status forward_on_device(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                           const ForwardOptions& options = {}) const;

  // Decode steps with no host round trip between them (a draft model's chain): `batch` is a
  // decode batch (one token per sequence) whose token ids are `first_ids` ([num_seqs] i32 on
  // device(); the batch's own ids are not read). Step s writes its K/V, then pick(logits, s, next)
  // enqueues the choice of each sequence's next token from the step's logits ([num_seqs, vocab]
  // f32 on device()) into next = ids[s]; step s + 1 runs those. ids is [steps, num_seqs] i32 on
  // device(). Every block table must already hold the positions up to its last + steps - 1. On a
  // GPU the steps replay the decode graph of the batch's shape, its inputs moved on in place by
  // ops::advance_decode; nothing waits for the device.
  using PickNext = std::function<void(const Tensor& logits, int64_t step, Tensor& next)>;
  Status decode_steps(const ForwardBatch& batch, const Tensor& first_ids, KvCache& cache, Tensor& ids,
                      const PickNext& pick, const ForwardOptions& options = {}) const;

  // Mixtures of experts: the routing counters every forward since load adds to (ops::moe_experts'
  // expert_tokens, one row per layer: [num_layers, num_experts + 2] i64, a dense layer's row 0),
  // copied to the host (waiting for the device); undefined for a dense model.
  Result<Tensor> expert_token_counts() const;

 private:
  // `hidden` null: the final hidden rows go to a scratch tensor.
  Status run_layers(const ForwardBatch& batch, KvCache& cache, Tensor& logits, Tensor* hidden,
                    ops::LinearMode mode) const;
  Status forward_decode_on_device(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                  const ForwardOptions& options) const;
  struct DecodeGraph;
  // The decode graph of the batch's shape (created when new), with the batch uploaded into its
  // inputs. The caller holds graphs_mutex_.
  Result<DecodeGraph*> decode_graph_for(const ForwardBatch& batch, KvCache& cache, const ForwardOptions& options) const;
  // One step on g's inputs: the graph replayed, or (none yet) an eager step and then the capture.
  Status run_decode_graph(DecodeGraph& g, KvCache& cache, const ForwardOptions& options) const;

  // Decode steps on a device, one per (cache, tokens, block-table columns, linear mode): inputs and
  // logits at fixed device addresses, and the graph once captured.
  struct GraphKey {
    uint64_t cache = 0;  // the id of the KV cache the graph writes
    int64_t tokens = 0, columns = 0;
    int mode = 0;
    bool sparse = false;  // the batch has sparse budgets (block-sparse attention)
    bool operator<(const GraphKey& o) const {
      return std::tie(cache, tokens, columns, mode, sparse) < std::tie(o.cache, o.tokens, o.columns, o.mode, o.sparse);
    }
  };
  struct DecodeGraph {
    ForwardBatch input;
    Tensor logits;
    Tensor hidden;  // [tokens, hidden]: the LM head's input rows
    std::shared_ptr<void> graph;
  };

  // Each graph keeps [tokens, vocab] f32 logits on the device: bound what shapes that come and go hold.
  static constexpr size_t kMaxDecodeGraphs = 64;

  ModelConfig config_;
  ModelWeights weights_;
  RopeTable rope_;
  Tensor expert_tokens_;  // [num_layers, num_experts + 2] i64 on device(), MoE models only
  mutable std::mutex graphs_mutex_;
  mutable std::map<GraphKey, DecodeGraph> graphs_;
  mutable uint64_t graphs_epoch_ = 0;  // the backend's scratch_epoch() the graphs were captured at
};

}  // namespace tachyon
