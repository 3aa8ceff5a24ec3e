// TokenTrie: the vocabulary's token byte strings as a prefix tree, built once per vocabulary and shared
// (read-only, thread-safe) by every grammar matcher of that model. fill_mask walks it depth-first and skips a
// whole subtree on the first byte the grammar rejects, so a token mask costs the live prefixes, not
// vocab x length.
// Layout: nodes in depth-first preorder in flat arrays (the root is implicit), so a walk is one forward scan
// that jumps to subtree_end(i) to prune. Tokens that share a byte string share a node.
// Only ordinary tokens are in the tree: EOS ids, excluded (special / control) ids and tokens with no bytes
// are not, so a grammar can never produce them by spelling their text.
// Must never: depend on a tokenizer type (an adapter passes bytes and ids), or change after build().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tachyon {

// 32-bit words of a token bitmask for `vocab_size` tokens; bit (id % 32) of word (id / 32) is token id.
inline size_t grammar_mask_words(int32_t vocab_size) { return (static_cast<size_t>(vocab_size) + 31) / 32; }
inline bool grammar_mask_test(std::span<const uint32_t> mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u;
}

class TokenTrie {
 public:
  // The longest token accepted, in bytes (a guard on depth; real vocabularies stay far below it).
  static constexpr size_t kMaxTokenBytes = 4096;

  // `token_bytes[id]`: what token `id` decodes to (raw bytes, possibly a fragment of a UTF-8 character).
  // `eos_ids`: the end-of-generation tokens a grammar allows when it is complete.
  // `excluded_ids`: control/special tokens that a grammar never allows (EOS ids may be listed here too).
  static Result<std::shared_ptr<const TokenTrie>> build(std::vector<std::string> token_bytes,
                                                        std::span<const int32_t> eos_ids,
                                                        std::span<const int32_t> excluded_ids = {});

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  std::string_view token_bytes(int32_t id) const { return token_bytes_[id]; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_eos(int32_t id) const { return id >= 0 && id < vocab_size() && kind_[id] == TokenKind::kEos; }
  // Tokens the grammar may spell: not EOS, not excluded, not empty.
  bool in_trie(int32_t id) const { return id >= 0 && id < vocab_size() && kind_[id] == TokenKind::kOrdinary; }

  // Preorder nodes (the root, the empty prefix, is not stored).
  int32_t num_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  uint8_t node_byte(int32_t node) const { return node_byte_[node]; }
  // Depth of a node: 1 for a child of the root, i.e. the length of its prefix.
  uint16_t node_depth(int32_t node) const { return node_depth_[node]; }
  // One past the node's last descendant: where a walk continues when it prunes the node.
  int32_t subtree_end(int32_t node) const { return subtree_end_[node]; }
  // Token ids whose bytes are exactly this node's prefix.
  std::span<const int32_t> node_tokens(int32_t node) const {
    return {sorted_ids_.data() + token_begin_[node], sorted_ids_.data() + token_begin_[node + 1]};
  }
  size_t max_depth() const { return max_depth_; }

 private:
  enum class TokenKind : uint8_t { kOrdinary, kEos, kExcluded };
  TokenTrie() = default;

  std::vector<std::string> token_bytes_;  // [vocab_size]
  std::vector<TokenKind> kind_;           // [vocab_size]
  std::vector<int32_t> eos_ids_;
  std::vector<uint8_t> node_byte_;    // [num_nodes]
  std::vector<uint16_t> node_depth_;  // [num_nodes]
  std::vector<int32_t> subtree_end_;  // [num_nodes]
  std::vector<int32_t> token_begin_;  // [num_nodes + 1], offsets into sorted_ids_
  std::vector<int32_t> sorted_ids_;   // trie tokens in byte-string order (= preorder of their nodes)
  size_t max_depth_ = 0;
};

}  // namespace tachyon
