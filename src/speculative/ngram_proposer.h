// Prompt-lookup (n-gram) proposals: no extra model. The longest recent suffix of the sequence
// (max_n tokens down to min_n) that also occurs earlier in the sequence (prompt or output) is
// looked up, and the tokens that followed its most recent earlier occurrence are proposed.
// Pays off where output copies its input: code edits, summaries and extraction, RAG answers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tachyon {

struct NgramProposerOptions {
  int min_n = 1;           // shortest suffix to match
  int max_n = 4;           // longest suffix to match (tried first)
  int max_lookback = 4096; // only the last this-many tokens are searched (bounds the cost)
};

class NgramProposer {
 public:
  explicit NgramProposer(const NgramProposerOptions& options = {});
  // Up to k tokens to follow `tokens` (empty when no suffix recurs). Cost O(lookback * max_n).
  std::vector<int32_t> propose(std::span<const int32_t> tokens, int k) const;

  // A token tree of at most max_nodes nodes, k levels deep: the continuations (k tokens each) of
  // every earlier occurrence of the longest recurring suffix, most recent first, then of shorter
  // suffixes, merged into a trie (shared prefixes once) until the budget is spent. The most
  // recent longest match is the first branch (nodes 0..), what propose() returns. parents as
  // Draft::parents. Both empty when no suffix recurs.
  void propose_tree(std::span<const int32_t> tokens, int k, int max_nodes, std::vector<int32_t>& nodes,
                    std::vector<int32_t>& parents) const;

 private:
  NgramProposerOptions options_;
};

}  // namespace tachyon
