// `--spec-ngram`: the Proposer over NgramProposer (prompt lookup). No model and no state: each
// step searches the sequence itself, so it costs microseconds and never needs rolling back. With a
// tree budget (DraftRequest::max_nodes) the continuations of several earlier matches form a tree.
#pragma once

#include "speculative/ngram_proposer.h"
#include "speculative/proposer.h"

namespace tachyon {

class NgramLookupProposer final : public Proposer {
 public:
  explicit NgramLookupProposer(const NgramProposerOptions& options = {}) : lookup_(options) {}
  const char* name() const override { return "ngram"; }
  // Deterministic guesses: q is one-hot (Draft::probs stays empty).
  Status propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override;

 private:
  NgramProposer lookup_;
};

}  // namespace tachyon
