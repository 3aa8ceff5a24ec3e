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
};

ForwardBatch build_forward_batch(const std::vector<SequenceChunk>& chunks);

}  // namespace tachyon
