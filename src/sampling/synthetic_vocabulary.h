// A made-up vocabulary shaped like a real byte-level BPE one, for speed work on synthetic
// (random-weight) models, which have no tokenizer: grammar masks then walk a trie of realistic size
// and branching. Ids 0-255 are the single bytes; then JSON punctuation runs ("{\"", "\": \""), blanks
// and newlines, and words of 2-9 letters or numbers, 60 % with a leading space, some ending in
// "\":"; the last id is EOS. Deterministic in (size, seed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tachyon {

struct SyntheticVocabulary {
  std::vector<std::string> token_bytes;  // [size]
  int32_t eos_id = -1;                   // size - 1, spelled "<|eot_id|>"
};

// kInvalidArgument below 512 tokens (the bytes and punctuation need room).
Result<SyntheticVocabulary> synthetic_vocabulary(int32_t size, uint32_t seed = 7);

}  // namespace tachyon
