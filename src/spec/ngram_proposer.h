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

 private:
  NgramProposerOptions options_;
};

}  // namespace tachyon
