// Fuzz target: the OpenAI request parser (server/openai_api.h), a body given to both
// /v1/completions and /v1/chat/completions, with the small byte-level tokenizer of
// tests/fixtures and the ChatML template serving.
#include <memory>

#include "fuzz_util.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#ifndef TACHYON_SOURCE_DIR
#error "TACHYON_SOURCE_DIR must name the source tree (for the fixture tokenizer.json)"
#endif

namespace {

struct Served {
  std::unique_ptr<tachyon::Tokenizer> tokenizer;
  tachyon::ChatTemplate chat_template = tachyon::ChatTemplate::chatml();
  tachyon::server::ServingContext context;
};

const Served& served() {
  static const Served* s = [] {
    auto* out = new Served;
    const std::string dir = std::string(TACHYON_SOURCE_DIR) + "/tests/fixtures/tokenizer/tiny_bytelevel/";
    auto tokenizer = tachyon::Tokenizer::from_hf_json(dir + "tokenizer.json", dir + "tokenizer_config.json");
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "openai_request fuzzer: %s\n", tokenizer.status().to_string().c_str());
      std::abort();  // the harness's own setup, not an input
    }
    out->tokenizer = std::move(tokenizer).value();
    out->context.model_name = "fuzz";
    out->context.tokenizer = out->tokenizer.get();
    out->context.chat_template = &out->chat_template;
    out->context.template_extras = tachyon::chat_template_extras(*out->tokenizer);
    out->context.max_model_len = 2048;
    out->context.vocab_size = out->tokenizer->vocab_size();
    out->context.max_choices = 16;
    return out;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto endpoint : {tachyon::server::Endpoint::kCompletions, tachyon::server::Endpoint::kChatCompletions}) {
    tachyon::server::ApiRequest request;
    if (auto error = tachyon::server::parse_api_request(endpoint, body, served().context, request)) {
      (void)tachyon::server::error_body(*error);
    }
  }
  return 0;
}
