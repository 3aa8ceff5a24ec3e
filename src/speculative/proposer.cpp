#include "speculative/proposer.h"

#include <algorithm>
#include <cstddef>

namespace tachyon {

void add_side_branches(Draft& draft, std::vector<SideBranch>& branches, size_t room) {
  const int chain_len = static_cast<int>(draft.tokens.size());
  std::erase_if(branches, [&](const SideBranch& b) { return b.level >= chain_len; });
  if (chain_len == 0 || room == 0 || branches.empty()) return;
  const size_t n = std::min(room, branches.size());
  std::partial_sort(branches.begin(), branches.begin() + static_cast<ptrdiff_t>(n), branches.end(),
                    [](const SideBranch& x, const SideBranch& y) {
                      return x.score != y.score ? x.score > y.score
                                                : (x.level != y.level ? x.level < y.level : x.token < y.token);
                    });
  draft.parents.resize(static_cast<size_t>(chain_len));
  for (int i = 0; i < chain_len; ++i) draft.parents[static_cast<size_t>(i)] = i - 1;
  for (size_t i = 0; i < n; ++i) {
    draft.tokens.push_back(branches[i].token);
    draft.parents.push_back(branches[i].level - 1);
  }
}

}  // namespace tachyon
