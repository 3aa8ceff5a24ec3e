#include "engine/generator.h"

#include <algorithm>

#include "core/timer.h"
#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"

namespace tachyon {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Result<GenerateStats> generate(const LlamaModel& model, std::span<const int32_t> prompt, Sampler& sampler,
                               const GenerateOptions& options, const TokenCallback& on_token) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty (no tokens)");
  const int context = c.max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) >= context) {
    return make_error(ErrorCode::kOutOfRange, "the prompt has {} tokens; the model's context is {} tokens",
                      prompt.size(), context);
  }
  if (options.max_new_tokens < 0) {
    return make_error(ErrorCode::kInvalidArgument, "max_new_tokens = {} must not be negative", options.max_new_tokens);
  }
  if (options.prefill_chunk <= 0 || options.block_size <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "prefill_chunk ({}) and block_size ({}) must be positive",
                      options.prefill_chunk, options.block_size);
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument, "prompt token {} at index {} is outside the vocabulary [0, {})",
                        prompt[i], i, c.vocab_size);
    }
  }
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int>(prompt.size());
  const int64_t total = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + options.max_new_tokens, context);

  KvCacheConfig kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = options.block_size;
  kv.num_blocks = static_cast<int>((total + options.block_size - 1) / options.block_size);
  TACHYON_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(kv));
  stats.kv_cache_bytes = cache.nbytes();
  BlockAllocator allocator(kv.num_blocks);
  BlockTable table(options.block_size);

  Tensor logits;
  Timer timer;
  // Prefill in chunks; only the last chunk's last row needs logits.
  for (size_t start = 0; start < prompt.size(); start += static_cast<size_t>(options.prefill_chunk)) {
    const size_t len = std::min(prompt.size() - start, static_cast<size_t>(options.prefill_chunk));
    TACHYON_RETURN_IF_ERROR(table.grow_to(static_cast<int>(start + len), allocator));
    SequenceChunk chunk;
    chunk.block_table = &table;
    chunk.start_position = static_cast<int>(start);
    chunk.tokens = prompt.subspan(start, len);
    chunk.logits = start + len == prompt.size() ? LogitsWanted::kLast : LogitsWanted::kNone;
    ForwardBatch batch = build_forward_batch({chunk});
    TACHYON_RETURN_IF_ERROR(model.forward(batch, cache, logits));
  }
  stats.prefill_seconds = timer.seconds();
  sampler.set_prompt(prompt);

  std::vector<int32_t> stop_ids = options.ignore_eos ? std::vector<int32_t>{} : options.stop_token_ids;
  timer.reset();
  int position = static_cast<int>(prompt.size());
  stats.finish_reason = FinishReason::kLength;
  while (stats.generated_tokens < options.max_new_tokens) {
    TACHYON_ASSIGN_OR_RETURN(SampleResult result, sampler.sample(logits.data<float>(), c.vocab_size));
    sampler.accept(result.token);
    ++stats.generated_tokens;
    const bool is_stop = std::find(stop_ids.begin(), stop_ids.end(), result.token) != stop_ids.end();
    if (!on_token(result)) {
      stats.finish_reason = FinishReason::kCancelled;
      break;
    }
    if (is_stop) {
      stats.finish_reason = FinishReason::kStop;
      break;
    }
    if (stats.generated_tokens >= options.max_new_tokens) break;
    if (position >= context) {  // no room to feed the token back
      stats.finish_reason = FinishReason::kContext;
      break;
    }
    // Feed the sampled token back at the next position.
    TACHYON_RETURN_IF_ERROR(table.grow_to(position + 1, allocator));
    const int32_t token = result.token;
    SequenceChunk chunk;
    chunk.block_table = &table;
    chunk.start_position = position;
    chunk.tokens = std::span<const int32_t>(&token, 1);
    chunk.logits = LogitsWanted::kLast;
    ForwardBatch batch = build_forward_batch({chunk});
    TACHYON_RETURN_IF_ERROR(model.forward(batch, cache, logits));
    ++position;
  }
  stats.decode_seconds = timer.seconds();
  table.release_all(allocator);
  return stats;
}

}  // namespace tachyon
