// Fuzz target: a llama2.c checkpoint (legacy and "ak42" v1 headers, then fp32 arrays). Written to
// a memory-backed file (the reader maps files only); every tensor it exposes is then viewed.
#include "fuzz_util.h"
#include "io/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  static tachyon::fuzz::InputFile file("model.bin");
  auto checkpoint = tachyon::Llama2cCheckpoint::open(file.write(data, size));
  if (!checkpoint.ok()) return 0;
  for (const std::string& name : checkpoint.value()->tensor_names()) {
    auto tensor = checkpoint.value()->tensor(name);
    (void)tensor;
  }
  return 0;
}
