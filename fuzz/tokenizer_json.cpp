// Fuzz target: a Hugging Face tokenizer.json (BPE model, normalizers, pre-tokenizers, decoders,
// post-processors, added tokens). Written to a memory-backed file (the loader takes paths); a
// tokenizer that loads then encodes and decodes a short text.
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  static tachyon::fuzz::InputFile file("tokenizer.json");
  auto tokenizer = tachyon::Tokenizer::from_hf_json(file.write(data, size), "");
  if (!tokenizer.ok()) return 0;
  const auto ids = tokenizer.value()->encode("Hello, world! <s> 12 345 \xc3\xa9t\xc3\xa9  \n\tend");
  (void)tokenizer.value()->decode(ids);
  (void)tokenizer.value()->decode(ids, /*skip_special=*/true);
  return 0;
}
