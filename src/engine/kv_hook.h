// The engine's side of disaggregation: the narrow hook through which disagg/kv_export.h moves a
// sequence from one engine to another. The engine owns requests, blocks and sampling state and
// says where a sequence's K/V lie; disagg/ owns the K/V's exported form and the copies, and never
// sees a request. Engine::release_transfer() and Engine::adopt_sequence() (engine/engine.h) take
// the two types below.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "core/status.h"

namespace tachyon {

class KvCache;

// One sequence whose prompt ran on one engine, for another engine to continue: everything about
// it but its K/V.
struct TransferredSequence {
  std::span<const int32_t> tokens;  // [num_tokens]: the prompt, then the generated tokens
  int num_prompt_tokens = 0;
  int num_computed = 0;             // leading positions whose K/V exist (num_tokens - 1)
  int first_position = 0;           // full-precision K/V from here on (> 0: history dropped, KvHistory::kDrop,
                                    // or re-quantized: history_blocks below)
  int history_blocks = 0;           // int8 / int4 history: positions [0, history_blocks * block_size) are
                                    // the history blocks of the table's leading entries
  uint64_t sampler_seed = 0;        // the seed of the request's random stream (given or drawn)
  uint64_t rng_draws = 0;           // values the stream gave so far
};

// Where positions [begin, end) of one sequence's K/V lie in a cache: position p in block
// block_table[p / block_size] of every pool of the layer (KvCache::pools()); and where its history
// lies: the table's first num_history entries are history blocks (ids num_blocks + h, in
// KvCache::history_pools()), positions [0, num_history * block_size).
struct SequenceBlocks {
  KvCache* cache = nullptr;
  std::span<const int32_t> block_table;
  int begin = 0;
  int end = 0;
  int num_history = 0;
};

// Reads a held sequence's K/V out of its blocks, or writes an adopted one's in; the copies have
// finished when it returns.
using SequenceBlocksCopy = std::function<Status(const SequenceBlocks& blocks)>;
using HeldSequenceRead = std::function<Status(const TransferredSequence& seq, const SequenceBlocks& blocks)>;

}  // namespace tachyon
