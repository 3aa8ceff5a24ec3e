// What a caller hands the Engine for one request and what it gets back each step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "sampling/grammar.h"
#include "sampling/sampler.h"

namespace tachyon {

using RequestId = uint64_t;

struct GenerationParams {
  SamplingParams sampling;
  int max_tokens = 16;                  // tokens to generate at most; the context length also stops
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS tokens; at most kMaxStopTokenIds
  std::vector<std::string> stop;        // stop strings: generation ends before the first match,
                                        // which is not part of the returned text unless
  bool include_stop_str_in_output = false;  // this is set (then the matched string, or the text of
                                            // the EOS / stop token that ended it, is kept)
  bool ignore_eos = false;              // keep going past EOS (stop_token_ids still stop)
  // No EOS or stop token can end the output before this many tokens (their logits are masked to
  // -inf while fewer are out, as vLLM does), and no stop string either (a match must end in the
  // text of token min_tokens or later). In [0, max_tokens].
  int min_tokens = 0;
  // vLLM's prompt_logprobs: unset, none; N, for every prompt token after the first its logprob
  // under the model given the tokens before it, its rank and the N most likely tokens there
  // (RequestOutput::prompt_logprobs). The prefill then keeps every position's logits for this
  // request and skips the prefix cache (whose positions have no logits). N in [0, kMaxLogprobs].
  std::optional<int> prompt_logprobs;
  bool skip_special_tokens = true;      // in the returned text
  bool detokenize = true;               // text deltas (needs a tokenizer)
  std::optional<bool> add_bos;          // for text prompts; unset: the tokenizer's default
  bool parse_special = false;           // text prompts may spell special tokens
  // Speculative decoding with named draft models: the one to draft with ("code"); empty: the
  // engine's choice (the prompt's kind, else the first draft). A name not loaded is an error.
  std::string draft;
  // Disaggregated prefill (disagg/): the request ends once its prompt is computed and its first
  // token sampled, with FinishReason::kTransfer, and its KV blocks stay held until
  // Engine::release_transfer() lets them go (disagg::export_kv() copies them out first), or
  // abort() drops them. A request that a stop condition ends at its first token finishes as usual
  // instead, and holds nothing.
  bool prefill_only = false;
  // Constrained decoding (structured output): the output must be a string of this grammar's
  // language (sampling/grammar.h: JSON Schema, regex, GBNF), followed by EOS. Every sampled row,
  // speculative rows included, is masked to the tokens that keep it so (sampling/grammar_matcher.h);
  // EOS is allowed exactly where the grammar is complete and is then the only token when nothing can
  // follow. A stop string or token, max_tokens or the context can still end it early. Shared by
  // the requests that ask for the same grammar; needs the engine's tokenizer.
  std::shared_ptr<const Grammar> grammar;
  // Block-sparse decode attention (EngineOptions::sparse_budget): the history tokens this
  // request's decode queries attend to, 0 for dense; unset: the engine's default. Needs an engine
  // started with a budget (it keeps the key bounds).
  std::optional<int> sparse_budget;
};

enum class FinishReason : uint8_t {
  kStop,     // EOS, a stop token or a stop string
  kLength,   // max_tokens
  kContext,  // the sequence reached the model's context length (OpenAI reports "length")
  kAbort,    // aborted by the caller
  kError,    // the request failed (the output's error says why); other requests go on
  kTransfer, // a prefill-only request is done here; its KV awaits disagg::export_kv() and another
             // engine continues it (GenerationParams::prefill_only)
};
const char* finish_reason_name(FinishReason reason);

// Seconds on the engine's clock (steady, 0 = engine creation).
struct RequestTiming {
  double arrival = 0.0;
  double first_scheduled = -1.0;
  double first_token = -1.0;
  double finished = -1.0;
  std::vector<double> token_times;  // when each generated token was sampled
};

inline constexpr size_t kMaxStopTokenIds = 1024;

// One prompt token's entry of prompt_logprobs: the raw model distribution (log-softmax of the
// logits, no penalty, bias or temperature, as vLLM reports it) at the position before it.
struct PromptLogprob {
  int32_t token = -1;
  float logprob = 0.0f;  // -inf when the model gives the token no probability
  int64_t rank = 1;      // 1-based, in the order of `top`: larger logit first, then lower id
  std::vector<std::pair<int32_t, float>> top;  // the N most likely, in that order
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // when GenerationParams::sampling.logprobs > 0
};

// What ended a request that finished with FinishReason::kStop.
struct StopCause {
  enum class Kind : uint8_t {
    kNone,    // not stopped (yet), or ended by something else
    kToken,   // an EOS or stop token: the last of new_token_ids, which has no text
    kString,  // a stop string: it matched in the text and is not part of it
  };
  Kind kind = Kind::kNone;
  int32_t token = -1;  // kToken
  std::string text;    // kString
};

// One request's news from one step.
struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> new_token_ids;  // sampled this step (a stop token included)
  std::vector<TokenLogprob> logprobs;  // one per new token
  // GenerationParams::prompt_logprobs, in the request's first output with a token: one entry per
  // prompt token after the first (entry i is prompt token i + 1's).
  std::vector<PromptLogprob> prompt_logprobs;
  std::string text;                    // new text, stop strings held back until they cannot match
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  StopCause stop;                      // what ended it, when finish_reason is kStop
  Status error;                        // for kError
  int num_prompt_tokens = 0;
  int num_generated_tokens = 0;        // in all so far
  int num_cached_tokens = 0;           // prompt tokens served from the prefix cache
  int num_preemptions = 0;
  RequestTiming timing;                // filled when finished
  double handed_over_at = 0.0;         // set by a consumer that queues outputs (the server): the
                                       // CLOCK_MONOTONIC second it took this one from the engine
};

}  // namespace tachyon
