// Prompt logprobs (vLLM's prompt_logprobs) from logits rows: for a prompt token, the log-softmax of
// the logits of the position before it, in the raw model distribution (no penalty, logit bias or
// temperature: what vLLM reports), the token's rank there and the N most likely tokens.
//
// Owns only this arithmetic over one [vocab] row; the engine decides which rows (it asks the
// forward for every prefill position's logits of such a request) and when the entries go out.
// Must never touch a request's sampler: reading prompt logprobs draws nothing and changes no state.
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace tachyon {

// `logits`: [vocab_size] f32, the row of the position before `token` (which is in the vocabulary).
// Non-finite logits count as -inf. top_n: how many of the most likely tokens to list (ties: lower
// id first); fewer when fewer tokens have a finite logit.
PromptLogprob prompt_logprob(const float* logits, int vocab_size, int32_t token, int top_n);

}  // namespace tachyon
