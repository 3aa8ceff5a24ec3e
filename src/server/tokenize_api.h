// POST /tokenize and POST /detokenize, as vLLM's OpenAI server has them: a request body in, the
// HTTP status and JSON body out. Pure functions of the body and the served model's tokenizer and
// chat template; nothing here touches the engine or the network.
//
//   /tokenize    {"prompt": "..."} (add_special_tokens, default true: the BOS a completion's text
//                prompt gets) or {"messages": [...]} (add_generation_prompt, default true;
//                chat_template_kwargs; add_special_tokens, default true: the BOS rule of
//                /v1/chat/completions), and model, return_token_strs
//                -> {"count", "max_model_len", "tokens"[, "token_strs"]}: exactly the prompt
//                tokens the generation endpoint would run
//   /detokenize  {"tokens": [ids]} and model -> {"prompt": text} (special tokens kept)
// Every mistake (unknown field, wrong type, an id outside the vocabulary) is a 400 naming the
// field; never an exception or an abort.
#pragma once

#include <string>
#include <string_view>

#include "server/openai_api.h"

namespace tachyon::server {

struct JsonReply {
  int status = 200;
  std::string body;
};

JsonReply tokenize_reply(std::string_view body, const ServingContext& context);
JsonReply detokenize_reply(std::string_view body, const ServingContext& context);

}  // namespace tachyon::server
