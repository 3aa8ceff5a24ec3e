#include "speculative/ngram_proposer.h"

#include <algorithm>

#include "core/status.h"

namespace tachyon {

NgramProposer::NgramProposer(const NgramProposerOptions& options) : options_(options) {
  TACHYON_CHECK(options.min_n >= 1 && options.max_n >= options.min_n && options.max_lookback > 0,
                "n-gram proposer: min_n {} max_n {} lookback {}", options.min_n, options.max_n, options.max_lookback);
}

std::vector<int32_t> NgramProposer::propose(std::span<const int32_t> tokens, int k) const {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || len < 2) return {};
  const int64_t first = std::max<int64_t>(0, len - options_.max_lookback);
  for (int n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // The most recent earlier occurrence: a start s < len - n with tokens[s, s + n) == suffix.
    for (int64_t s = len - n - 1; s >= first; --s) {
      if (!std::equal(suffix, suffix + n, tokens.data() + s)) continue;
      const int64_t from = s + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

void NgramProposer::propose_tree(std::span<const int32_t> tokens, int k, int max_nodes, std::vector<int32_t>& nodes,
                                 std::vector<int32_t>& parents) const {
  nodes.clear();
  parents.clear();
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || max_nodes <= 0 || len < 2) return;
  const int64_t first = std::max<int64_t>(0, len - options_.max_lookback);
  // Inserts the continuation at `from` into the trie: follows the nodes it shares, adds the rest.
  const auto insert = [&](int64_t from) {
    int32_t parent = -1;
    for (int64_t i = from; i < std::min<int64_t>(len, from + k); ++i) {
      const int32_t token = tokens[static_cast<size_t>(i)];
      int32_t child = -1;
      for (size_t c = static_cast<size_t>(parent + 1); c < nodes.size() && child < 0; ++c) {
        if (parents[c] == parent && nodes[c] == token) child = static_cast<int32_t>(c);
      }
      if (child < 0) {
        if (static_cast<int>(nodes.size()) >= max_nodes) return;
        child = static_cast<int32_t>(nodes.size());
        nodes.push_back(token);
        parents.push_back(parent);
      }
      parent = child;
    }
  };
  for (int n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    for (int64_t s = len - n - 1; s >= first; --s) {
      if (static_cast<int>(nodes.size()) >= max_nodes) return;
      if (std::equal(suffix, suffix + n, tokens.data() + s)) insert(s + n);
    }
  }
}

}  // namespace tachyon
