// Proposers for speculative decoding: something cheaper than the target model that guesses the
// next few tokens of a sequence. The engine asks once per step for every speculating sequence
// together (a draft model runs them as one batch per draft position), the target verifies all
// guesses of a sequence in one forward, and the verifier decides what is kept (verifier.h).
//
// A proposer only guesses: whatever it returns, the emitted tokens follow the target exactly
// (greedy) or in distribution (sampling). To keep sampling lossless it must say how it guessed:
// either the distribution q each token was drawn from, or nothing, meaning a deterministic guess
// (q one-hot on the token, as n-gram lookup makes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "sampling/grammar_matcher.h"
#include "sampling/sampler.h"

namespace tachyon {

// One sequence to draft for.
struct DraftRequest {
  uint64_t id = 0;                  // the request; a proposer may keep state under it until release()
  std::span<const int32_t> tokens;  // the sequence so far: prompt, then output (last one included)
  int k = 0;                        // draft at most this many tokens (>= 1), or tree levels
  // The request's sampler: its parameters and history (penalties) shape a draft model's q, the
  // same way they shape the target's p. Not drawn from: a proposer keeps its own randomness.
  const Sampler* sampler = nullptr;
  // > 0: a token tree of at most this many nodes (>= k) may be returned instead of a chain
  // (Draft::parents), its branches all one-hot guesses; 0: a chain only.
  int max_nodes = 0;
};

struct Draft {
  std::vector<int32_t> tokens;  // [<= k] the guessed continuation (empty: no guess); a tree: its nodes
  std::vector<float> probs;     // [tokens.size(), target vocab] q of each position, or empty: one-hot guesses
  // A tree: parents[i] is the index of node i's parent (< i), or -1 for a child of the sequence's
  // last token; empty for a chain. Trees carry no probs (every node a one-hot guess), and the
  // first branch (nodes 0, 1, ... each the child of the one before) should be the likeliest:
  // an accepted path along it costs no cache copy.
  std::vector<int32_t> parents;
};

// A side branch of a drafted chain: a token ranked below the chain's choice at one level.
struct SideBranch {
  double score;   // the probability of the path to it
  int level;      // its parent is the chain's node level - 1 (-1: the sequence's last token)
  int32_t token;
};

// Makes `draft`, a chain, a tree: at most `room` of `branches` (those at levels the chain
// reaches), likeliest first (ties: the shallower, then the smaller token), appended as nodes
// whose parent is the chain's node one level above their own. Reorders `branches`.
void add_side_branches(Draft& draft, std::vector<SideBranch>& branches, size_t room);

// Constrained decoding: drops the guesses of `draft` that `grammar` (the request's state, after its
// last token) refuses, which the target's masked rows would reject for sure: a chain is cut before
// its first refused token, a tree loses every node with a refused token on its path (the others
// keep their order). A draft that carries q (probs) is left whole: cutting it would change the law
// its kept tokens were drawn from, and the verifier rejects a refused token exactly. The matcher
// ends where it started.
void trim_to_grammar(Draft& draft, GrammarMatcher& grammar);

class Proposer {
 public:
  virtual ~Proposer() = default;
  // The label of metrics and logs: "ngram", "draft".
  virtual const char* name() const = 0;
  // Fills drafts[i] for requests[i].
  virtual Status propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) = 0;
  // The request finished or was aborted: drop what is kept for it.
  virtual void release(uint64_t id) {}
  // Every resource kept for released requests is back (tests).
  virtual Status check_no_leaks() const { return Status::Ok(); }
  // Proposers that read the target's features (head_proposer.h): the engine asks the target's
  // forward for its final hidden rows and, after each step, hands over each sequence's row that
  // sampled its last token.
  virtual bool wants_features() const { return false; }
  virtual void observe_features(uint64_t id, std::span<const float> hidden) { (void)id, (void)hidden; }
};

}  // namespace tachyon
