// Fuzz target: a safetensors file (8-byte header length, JSON header, data). The reader maps
// files only, so each input is written to a memory-backed file; every tensor the header names is
// then viewed, as the model loader does.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  static tachyon::fuzz::InputFile file("model.safetensors");
  auto st = tachyon::SafetensorsFile::open(file.write(data, size));
  if (!st.ok()) return 0;
  const auto& parsed = *st.value();
  for (const auto& meta : parsed.tensors()) {
    auto tensor = parsed.tensor(meta.name);
    (void)tensor;
  }
  return 0;
}
