#include "spec/ngram_lookup_proposer.h"

namespace tachyon {

Status NgramLookupProposer::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) drafts[i].tokens = lookup_.propose(requests[i].tokens, requests[i].k);
  return Status::Ok();
}

}  // namespace tachyon
