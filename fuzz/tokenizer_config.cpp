// Fuzz target: a Hugging Face tokenizer_config.json (added_tokens_decoder, bos/eos tokens,
// add_bos/add_eos, chat_template), loaded beside fuzz/data/tokenizer.json (byte-level BPE, 263
// tokens, no regex: small, so that each input loads fast); also read for its special tokens alone
// (read_hf_special_tokens). The config goes through a memory-backed file, since the loader takes
// paths.
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#ifndef TACHYON_SOURCE_DIR
#error "TACHYON_SOURCE_DIR must name the source tree (for the fixture tokenizer.json)"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  static const std::string tokenizer_json =
      std::string(TACHYON_SOURCE_DIR) + "/fuzz/data/tokenizer.json";
  static tachyon::fuzz::InputFile file("tokenizer_config.json");
  const std::string& path = file.write(data, size);
  (void)tachyon::read_hf_special_tokens(path);
  auto tokenizer = tachyon::Tokenizer::from_hf_json(tokenizer_json, path);
  if (!tokenizer.ok()) return 0;
  const auto ids = tokenizer.value()->encode("Hello <|im_start|> world</s>");
  (void)tokenizer.value()->decode(ids, /*skip_special=*/true);
  (void)tachyon::load_chat_template(*tokenizer.value());
  return 0;
}
