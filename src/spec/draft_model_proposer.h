// `--draft-model PATH`: a smaller model with the target's vocabulary drafts K tokens, one batched
// forward per draft position over every speculating sequence. It runs on its own paged KV cache
// and block manager (sized by the engine like the target's), with one block table per request.
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
#include "spec/proposer.h"

namespace tachyon {

struct DraftModelOptions {
  int num_kv_blocks = 0;  // the draft cache: as many blocks as the target's
  int block_size = 16;
  DType kv_dtype = DType::kF32;
  int max_model_len = 0;  // positions the draft may write, at most its context
  ops::LinearMode linear_mode = ops::LinearMode::kFastest;
  // The target's vocabulary, when it is larger than the draft's (padding rows, as Qwen2.5-7B's
  // 152,064 against 0.5B's 151,936): q is returned with zeros for the tokens the draft lacks, and a
  // sequence holding such a token gets no draft. 0: the draft's own.
  int target_vocab = 0;
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
  DraftModelProposer(const LlamaModel& draft, const DraftModelOptions& options, KvCache cache);

  const LlamaModel& model_;
  DraftModelOptions options_;
  KvCache cache_;
  BlockManager blocks_;
  std::unordered_map<uint64_t, State> states_;
  Tensor logits_;  // [n_active, vocab] f32, reused
};

}  // namespace tachyon
