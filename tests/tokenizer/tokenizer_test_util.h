// Shared by the tokenizer tests: the real tokenizers under ../shared/tokenizers (each loaded
// once per test binary, then reused), the committed fixtures under tests/fixtures/tokenizer, and
// small readers for llama.cpp's .inp/.out test vectors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tachyon::testing {

// The tokenizers the suite knows by name:
//   gpt2-gguf, llama-spm-gguf, phi-3-gguf, falcon-gguf, mpt-gguf   llama.cpp vocab GGUF files
//   llama3-tiktoken, qwen-tiktoken                                  tiktoken files + specials
//   gpt2-files                                                      encoder.json + vocab.bpe
//   codellama-hf                                                    tokenizer.json
//   llama2-bin, stories260k                                         llama2.c tokenizer.bin files
//   tiny-bytelevel-hf, tiny-metaspace-hf                            committed small fixtures
// Returns nullptr (after recording a test failure) when loading fails; the caller must have
// checked that ../shared exists for the shared ones.
const Tokenizer* shared_tokenizer(const std::string& name);
bool tokenizer_needs_shared(const std::string& name);

// Directory of the committed fixtures.
std::string fixture_dir();

// llama.cpp's test vectors: `.inp` strings separated by "\n__ggml_vocab_test__\n", `.out` one
// line of space-separated ids per string.
std::vector<std::string> read_vocab_test_inputs(const std::string& path);
std::vector<std::vector<int32_t>> read_vocab_test_outputs(const std::string& path);

std::string read_file_bytes(const std::string& path);
std::string ids_to_string(const std::vector<int32_t>& ids);
// Printable form of a byte string for failure messages (non-ASCII and controls escaped).
std::string escape_bytes(const std::string& bytes);

}  // namespace tachyon::testing
