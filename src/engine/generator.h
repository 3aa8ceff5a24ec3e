// Single-request generation over the paged KV cache: chunked prefill of the prompt, then one
// decode step per token, sampling with the request's Sampler, stopping at EOS / stop ids /
// max_new_tokens / the context length. This is what `tachyon generate` runs; the batched
// Engine (continuous batching) drives the same model forward with many sequences per step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/llama_model.h"
#include "sampling/sampler.h"

namespace tachyon {

struct GenerateOptions {
  int max_new_tokens = 128;
  std::vector<int32_t> stop_token_ids;  // EOS and friends; ignored when ignore_eos
  bool ignore_eos = false;
  int prefill_chunk = 512;  // prompt tokens per forward
  int block_size = 16;
};

enum class FinishReason : uint8_t { kStop, kLength, kContext, kCancelled };
const char* finish_reason_name(FinishReason reason);

struct GenerateStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // from the first sampled token to the last
  FinishReason finish_reason = FinishReason::kLength;
  size_t kv_cache_bytes = 0;
};

// Called with each sampled token; returning false stops generation (kCancelled).
using TokenCallback = std::function<bool(const SampleResult&)>;

Result<GenerateStats> generate(const LlamaModel& model, std::span<const int32_t> prompt, Sampler& sampler,
                               const GenerateOptions& options, const TokenCallback& on_token);

}  // namespace tachyon
