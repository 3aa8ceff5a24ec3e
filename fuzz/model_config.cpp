// Fuzz target: a Hugging Face config.json, read as the model loader reads it: parsed (depth
// checked first), turned into a ModelConfig, validated, and its quantization_config read.
#include <string_view>

#include "fuzz_util.h"
#include "io/json_file.h"
#include "io/quantization_config.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto json = tachyon::parse_json(text, "config.json");
  if (!json.ok()) return 0;
  auto config = tachyon::model_config_from_hf(json.value(), "config.json");
  if (config.ok()) {
    (void)config.value().validate("config.json");
    (void)config.value().summary();
  }
  auto quant = tachyon::read_quantization_config(json.value(), "config.json");
  (void)quant;
  return 0;
}
