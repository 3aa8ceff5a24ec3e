// Fuzz target: the Jinja chat-template engine. The input is the template text, a NUL byte, then
// the messages as JSON (an array of message objects; when absent or not JSON, a fixed
// conversation). Parsed and rendered as the server does, with smaller step and output limits
// than the server's so that each input stays fast (the limits themselves are tested in
// tests/tokenizer).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/json_file.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  const auto [source, messages_text] = tachyon::fuzz::split_input(data, size, std::string_view("\0", 1));
  auto tpl = tachyon::ChatTemplate::parse(source);
  if (!tpl.ok()) return 0;

  nlohmann::ordered_json messages = nlohmann::ordered_json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "Hi"}},
       {{"role", "assistant"}, {"content", "Hello."}},
       {{"role", "user"}, {"content", "Again"}}});
  if (!messages_text.empty() && tachyon::check_json_depth(messages_text, "messages").ok()) {
    auto parsed = nlohmann::ordered_json::parse(messages_text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) messages = std::move(parsed);
  }
  tachyon::ChatTemplateExtras extras;
  extras.bos_token = "<s>";
  extras.eos_token = "</s>";
  extras.render.limits.max_steps = 200'000;
  extras.render.limits.max_output_bytes = size_t{1} << 20;
  (void)tachyon::apply_chat_template(tpl.value(), messages, /*add_generation_prompt=*/true, extras);
  return 0;
}
