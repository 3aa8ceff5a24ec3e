// Fuzz target: a GGUF file (metadata, tensor infos, data). Written to a memory-backed file (the
// reader maps files only), then read as the loader reads it: the model config and the tokenizer
// from the metadata.
#include "fuzz_util.h"
#include "io/gguf.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  static tachyon::fuzz::InputFile file("model.gguf");
  auto gguf = tachyon::GgufFile::open(file.write(data, size));
  if (!gguf.ok()) return 0;
  auto config = tachyon::model_config_from_gguf(gguf.value());
  if (config.ok()) (void)config.value().validate("fuzz");
  auto tokenizer = tachyon::Tokenizer::from_gguf(gguf.value());
  if (tokenizer.ok()) {
    const auto ids = tokenizer.value()->encode("Hello world, 12 <s>");
    (void)tokenizer.value()->decode(ids);
  }
  return 0;
}
