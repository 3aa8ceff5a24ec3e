// TokenTrie::build: sorts the ordinary tokens by their bytes, then emits preorder nodes from the longest
// common prefix of neighbours (a sorted list lists every prefix before its extensions, so node order and
// token order agree and each node's tokens are one contiguous run of sorted_ids_).
#include "sampling/token_trie.h"

#include <algorithm>
#include <numeric>

namespace tachyon {

Result<std::shared_ptr<const TokenTrie>> TokenTrie::build(std::vector<std::string> token_bytes,
                                                          std::span<const int32_t> eos_ids,
                                                          std::span<const int32_t> excluded_ids) {
  const size_t vocab = token_bytes.size();
  if (vocab == 0 || vocab > static_cast<size_t>(INT32_MAX)) {
    return make_error(ErrorCode::kInvalidArgument, "token trie: vocabulary size {} is out of range", vocab);
  }
  std::shared_ptr<TokenTrie> trie(new TokenTrie());
  trie->kind_.assign(vocab, TokenKind::kOrdinary);
  for (int32_t id : excluded_ids) {
    if (id < 0 || static_cast<size_t>(id) >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token trie: excluded token id {} is outside [0, {})", id, vocab);
    }
    trie->kind_[id] = TokenKind::kExcluded;
  }
  for (int32_t id : eos_ids) {
    if (id < 0 || static_cast<size_t>(id) >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token trie: EOS token id {} is outside [0, {})", id, vocab);
    }
    if (trie->kind_[id] != TokenKind::kEos) trie->eos_ids_.push_back(id);
    trie->kind_[id] = TokenKind::kEos;
  }
  std::vector<int32_t> ids;
  for (size_t id = 0; id < vocab; ++id) {
    if (trie->kind_[id] != TokenKind::kOrdinary) continue;
    if (token_bytes[id].size() > kMaxTokenBytes) {
      return make_error(ErrorCode::kInvalidArgument, "token trie: token {} has {} bytes (the limit is {})", id,
                        token_bytes[id].size(), kMaxTokenBytes);
    }
    if (token_bytes[id].empty()) {
      trie->kind_[id] = TokenKind::kExcluded;  // accepting it would change nothing: a grammar never allows it
      continue;
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return token_bytes[a] < token_bytes[b]; });

  // open[d] = the node at depth d + 1 on the current path; closed when the next token leaves the path.
  std::vector<int32_t> open;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      trie->subtree_end_[open.back()] = static_cast<int32_t>(trie->node_byte_.size());
      open.pop_back();
    }
  };
  std::string_view previous;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string_view bytes = token_bytes[ids[k]];
    size_t common = 0;
    const size_t limit = std::min(previous.size(), bytes.size());
    while (common < limit && previous[common] == bytes[common]) ++common;
    close_to(common);
    for (size_t d = common; d < bytes.size(); ++d) {
      open.push_back(static_cast<int32_t>(trie->node_byte_.size()));
      trie->node_byte_.push_back(static_cast<uint8_t>(bytes[d]));
      trie->node_depth_.push_back(static_cast<uint16_t>(d + 1));
      trie->subtree_end_.push_back(0);
      trie->token_begin_.push_back(static_cast<int32_t>(k));
    }
    trie->max_depth_ = std::max(trie->max_depth_, bytes.size());
    previous = bytes;
  }
  close_to(0);
  trie->token_begin_.push_back(static_cast<int32_t>(ids.size()));
  // A node's tokens run from its token_begin_ to the next node's: identical strings sit on one node, and the
  // next node starts at the first longer token.
  trie->sorted_ids_ = std::move(ids);
  trie->token_bytes_ = std::move(token_bytes);
  return std::shared_ptr<const TokenTrie>(std::move(trie));
}

}  // namespace tachyon
