// Plans one forward batch (once per step, reused by every layer): flattens the chunks of several
// sequences into token ids, positions, slot mapping, block tables and logits rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_manager.h"
#include "model/llama_model.h"

namespace tachyon {

enum class LogitsWanted : uint8_t { kNone, kLast, kAll };

struct SequenceChunk {
  const BlockTable* block_table = nullptr;  // already grown to start_position + tokens.size()
  int start_position = 0;                   // position of tokens[0] in the sequence
  std::span<const int32_t> tokens;          // this step's tokens of the sequence
  LogitsWanted logits = LogitsWanted::kLast;
  // A token tree (speculative verification of several branches): empty for a plain chunk, else
  // [tokens.size()] with tree_parents[0] = -1 and tree_parents[i] in [0, i) for the others. Token i
  // then sits at position start_position + its depth and attends to the cache before the chunk
  // and to its ancestors in the chunk; it still occupies cache index start_position + i. At most
  // kMaxTreeTokens tokens.
  std::span<const int32_t> tree_parents;
  // Block-sparse attention (ops.h select_kv_blocks): the history tokens this chunk's query may
  // attend to; 0 for all. Honoured for chunks of one token (decode steps); longer chunks attend
  // densely.
  int sparse_budget = 0;
};

ForwardBatch build_forward_batch(const std::vector<SequenceChunk>& chunks);

}  // namespace tachyon
