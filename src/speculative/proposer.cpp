#include "speculative/proposer.h"

#include <algorithm>
#include <cstddef>
#include <span>

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

namespace {

// Accepts `tokens` in order while the grammar allows them; how many it took.
int accept_while_allowed(GrammarMatcher& grammar, std::span<const int32_t> tokens) {
  int accepted = 0;
  for (const int32_t t : tokens) {
    if (!grammar.accept(t).ok()) break;
    ++accepted;
  }
  return accepted;
}

}  // namespace

void trim_to_grammar(Draft& draft, GrammarMatcher& grammar) {
  if (draft.tokens.empty() || !draft.probs.empty()) return;
  if (draft.parents.empty()) {
    const int keep = accept_while_allowed(grammar, draft.tokens);
    if (!grammar.rollback(keep).ok()) draft.tokens.clear();  // cannot happen: K is within its history
    draft.tokens.resize(static_cast<size_t>(keep));
    return;
  }
  // A tree: a node stays when its parent stayed and the grammar takes its path.
  const size_t n = draft.tokens.size();
  std::vector<int32_t> new_index(n, -1);
  std::vector<int32_t> tokens, parents, path;
  for (size_t i = 0; i < n; ++i) {
    const int32_t parent = draft.parents[i];
    if (parent >= 0 && new_index[static_cast<size_t>(parent)] < 0) continue;
    path.clear();
    for (int32_t j = static_cast<int32_t>(i); j >= 0; j = draft.parents[static_cast<size_t>(j)]) {
      path.push_back(draft.tokens[static_cast<size_t>(j)]);
    }
    std::reverse(path.begin(), path.end());
    const int accepted = accept_while_allowed(grammar, path);
    if (!grammar.rollback(accepted).ok()) {
      draft.tokens.clear();
      draft.parents.clear();
      return;
    }
    if (accepted != static_cast<int>(path.size())) continue;
    new_index[i] = static_cast<int32_t>(tokens.size());
    tokens.push_back(draft.tokens[i]);
    parents.push_back(parent < 0 ? -1 : new_index[static_cast<size_t>(parent)]);
  }
  draft.tokens = std::move(tokens);
  draft.parents = std::move(parents);
  if (draft.tokens.empty()) draft.parents.clear();
}

}  // namespace tachyon
