// `--draft-model PATH`: a smaller model with the target's vocabulary drafts K tokens, one batched
// forward per draft position over every speculating sequence. It runs on its own paged KV cache
// and block manager (sized by the engine like the target's), with one block table per request.
//
// Where the draft's logits alone decide (requests without penalties or logit bias), the K
// positions run as one chain on the model's device: the first forward catches the sequences up,
// then K - 1 decode steps each run the choice of the step before (LlamaModel::decode_steps,
// replayed CUDA graphs on a GPU): the argmax for greedy requests and trees, a draw by ops::sample
// with a uniform from the request's draft stream for sampled ones. The host reads the tokens back
// once, with a sampled draft's q and a tree's ranked runners-up (the softmax at temperature 1; the
// host ranks a sampled tree's under its temperature). Requests whose penalties shape q take the
// sampler on the host after every forward.
//
// Catching up without re-running the prompt: the proposer remembers which token it ran at every
// position of a request's table. At the next step the sequence may have grown by accepted drafts
// and the target's token, and the drafts the target rejected sit in the table; the table keeps the
// longest prefix that still agrees with the sequence (K/V at a position depend only on the tokens
// up to it), is truncated there — the rejected positions rolled back, no copy — and only the
// tokens after it run. A request's first draft runs its prompt once, less what the draft cache's
// prefix cache already holds.
//
// Never changes a request's outcome, only how fast it comes: a request whose table cannot grow (the
// draft cache is full) or that is past the draft's context simply gets no draft this step.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/llama_model.h"
#include "sampling/rng.h"
#include "speculative/proposer.h"

namespace tachyon {

struct DraftModelOptions {
  int num_kv_blocks = 0;  // the draft cache: as many blocks as the target's
  int block_size = 0;     // the target cache's (KvCacheConfig::block_size)
  // The target cache's window and history, so that the draft's cache holds long sequences as the
  // target's does (its own history pool of num_history_blocks with int8 / int4).
  KvTierOptions tiers;
  int num_history_blocks = 0;
  DType kv_dtype = DType::kF32;
  int max_model_len = 0;  // positions the draft may write, at most its context
  ops::LinearMode linear_mode = ops::LinearMode::kFastest;
  // The target's vocabulary, when it is larger than the draft's (padding rows, as Qwen2.5-7B's
  // 152,064 against 0.5B's 151,936): q is returned with zeros for the tokens the draft lacks, and a
  // sequence holding such a token gets no draft. 0: the draft's own.
  int target_vocab = 0;
  // Requests without penalties or logit bias draft as one chain of decode steps on the device, the
  // choice taken there (ops::argmax, ops::sample, ops::top_tokens) and read back once; false: one
  // forward and a host round trip per draft position (tests).
  bool device_chain = true;
};

class DraftModelProposer final : public Proposer {
 public:
  // Fails on a bad size or when the cache cannot be allocated. The model is borrowed.
  static Result<std::unique_ptr<DraftModelProposer>> create(const LlamaModel& draft, const DraftModelOptions& options);

  const char* name() const override { return "draft"; }
  // Greedy requests get the draft's processed argmax (q one-hot, Draft::probs empty); sampling
  // requests a draw from q = the draft's distribution under the request's sampling parameters,
  // with q returned for the verifier.
  Status propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override;
  void release(uint64_t id) override;
  Status check_no_leaks() const override;

  // Tests: the positions whose K/V the draft cache holds for a request (-1: none kept).
  int num_cached_tokens(uint64_t id) const;

 private:
  struct State {
    explicit State(int block_size, uint64_t seed) : table(block_size), rng(seed) {}
    BlockTable table;
    std::vector<int32_t> tokens;  // the token run at each position of `table` so far
    Rng rng;                      // draws of sampled drafts
  };
  struct Active;  // a request drafted for in this call
  DraftModelProposer(const LlamaModel& draft, const DraftModelOptions& options, KvCache cache);
  // Drafts for `active` as one chain of K_max levels (every table holds them); trees go to `finished`.
  Status propose_chain(std::span<const DraftRequest> requests, std::vector<Active>& active, int k_max,
                       std::vector<Draft>& drafts, std::vector<Active>& finished);
  // One forward per level and the request's sampler on the host.
  Status propose_stepwise(std::span<const DraftRequest> requests, std::vector<Active>& active,
                          std::vector<Draft>& drafts, std::vector<Active>& finished);

  const LlamaModel& model_;
  DraftModelOptions options_;
  KvCache cache_;
  BlockManager blocks_;
  std::unordered_map<uint64_t, State> states_;
  Tensor logits_;       // [n_active, vocab] f32 on the model's device (chains), reused
  Tensor host_logits_;  // [n_active, vocab] f32 on the host (step by step), reused
};

}  // namespace tachyon
