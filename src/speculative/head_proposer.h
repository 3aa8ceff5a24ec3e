// The head proposer (`--spec-heads PATH`): drafts come from proposal heads over the target's own
// final hidden state (spec_heads.h), a few small matrix products per draft token instead of a
// second model. The engine hands over, after each step, the hidden row that sampled each
// sequence's last token (observe_features); the next propose() runs the heads for every sequence
// with a row, all sequences together, one batch per draft position, on the target's device: the
// token each head picks feeds the next head without a trip to the host, and the drafts come back
// once. A draft is a greedy chain of one-hot guesses (Draft::probs empty), which keeps sampled
// requests lossless too; with a tree budget (`--spec-tree N`), each level's runners-up under its
// head's softmax hang beside the chain, likeliest path first (one top_tokens per level, on the
// device). A sequence the heads have no row for (its first step, an adopted one) gets no draft.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/llama_model.h"
#include "speculative/proposer.h"
#include "speculative/spec_heads.h"

namespace tachyon {

class HeadProposer final : public Proposer {
 public:
  // Borrows the target, whose embedding table and LM head the heads share; `heads` are on its device.
  HeadProposer(const LlamaModel& target, std::shared_ptr<const SpecHeads> heads);

  const char* name() const override { return "heads"; }
  Status propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override;
  void release(uint64_t id) override { features_.erase(id); }
  Status check_no_leaks() const override;
  bool wants_features() const override { return true; }
  void observe_features(uint64_t id, std::span<const float> hidden) override;

 private:
  const LlamaModel& target_;
  std::shared_ptr<const SpecHeads> heads_;
  std::vector<Weight> x_proj_, e_proj_, down_proj_;  // the heads' matrices as linear() weights
  std::unordered_map<uint64_t, std::vector<float>> features_;  // [hidden] per sequence
};

}  // namespace tachyon
