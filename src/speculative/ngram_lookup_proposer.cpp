#include "speculative/ngram_lookup_proposer.h"

namespace tachyon {

Status NgramLookupProposer::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    Draft& d = drafts[i];
    if (r.max_nodes > r.k) {
      lookup_.propose_tree(r.tokens, r.k, r.max_nodes, d.tokens, d.parents);
      // A single branch is a chain.
      bool chain = true;
      for (size_t j = 0; j < d.parents.size() && chain; ++j) chain = d.parents[j] == static_cast<int32_t>(j) - 1;
      if (chain) d.parents.clear();
    } else {
      d.tokens = lookup_.propose(r.tokens, r.k);
    }
  }
  return Status::Ok();
}

}  // namespace tachyon
