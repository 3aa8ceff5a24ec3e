// Scoring a token sequence with a model, for `tachyon perplexity` and the load-time check of
// quantized weights (cli/quant_check.h): the sliding-window plan, one model's forward over the
// windows (its own paged KV cache, logits only for the rows that are scored), and the statistics
// of one position in double: negative log-likelihood through a max-shifted log-softmax, the KL
// divergence between two models' next-token distributions, and whether their argmax agrees.
// Header-only so that the quant tests check these pieces directly (the tachyon executable is not
// a library). Nothing here reads options or prints: callers report.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"

namespace tachyon::cli {

// One window of a sliding-window evaluation over token positions of a text. Input tokens
// [begin, end) run in one sequence (positions 0 .. end - begin - 1); the logits at inputs
// [score_begin, end) predict tokens score_begin + 1 .. end, the ones this window scores.
struct ScoreWindow {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t score_begin = 0;
};

// Windows of at most `ctx` input tokens, one starting every `stride` tokens, that together score
// tokens 1 .. num_targets of a text exactly once (token 0 has nothing before it). A window scores
// only what the previous one did not, so every scored token past the first window has at least
// ctx - stride tokens of left context; the last window is cut short at the text's end (the
// Hugging Face perplexity recipe). stride == ctx gives non-overlapping windows whose every input
// predicts its next token. Preconditions (the caller has checked them): num_targets >= 1,
// ctx >= 2, 1 <= stride <= ctx.
inline std::vector<ScoreWindow> plan_windows(int64_t num_targets, int ctx, int stride) {
  assert(num_targets >= 1 && ctx >= 2 && stride >= 1 && stride <= ctx);
  std::vector<ScoreWindow> windows;
  int64_t scored = 0;  // inputs [0, scored) have predicted their next token
  for (int64_t begin = 0;; begin += stride) {
    const int64_t end = std::min<int64_t>(begin + ctx, num_targets);
    windows.push_back(ScoreWindow{begin, end, scored});
    scored = end;
    if (end == num_targets) break;
  }
  return windows;
}

// log(sum_v exp(logits[v])) in double, shifted by the largest logit so that no term overflows.
// NaN or +inf logits give a non-finite result (the callers check).
inline double log_sum_exp(std::span<const float> logits) {
  double max = -INFINITY;
  for (float x : logits) max = std::max<double>(max, x);
  if (!std::isfinite(max)) return max == -INFINITY ? -INFINITY : NAN;
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  return max + std::log(sum);
}

// -log softmax(logits)[target].
inline double token_nll(std::span<const float> logits, int32_t target) {
  return log_sum_exp(logits) - static_cast<double>(logits[static_cast<size_t>(target)]);
}

// The first index of the largest logit.
inline int64_t argmax(std::span<const float> logits) {
  return std::max_element(logits.begin(), logits.end()) - logits.begin();
}

// One scored position under a reference model (P = softmax(reference)) and a model under test
// (Q = softmax(logits)).
struct PositionComparison {
  double reference_nll = 0.0;  // -log P(target)
  double nll = 0.0;            // -log Q(target)
  double kl = 0.0;             // KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)), nats
  bool same_argmax = false;
};

// Two passes over the vocabulary: the maxima (and argmaxes), then the shifted exponentials of
// both rows and sum_v e_v (x_v - y_v), where e_v = exp(x_v - max x). With S = sum_v e_v,
//   KL = sum_v (e_v / S)(x_v - y_v) - (logsumexp x - logsumexp y),
// two exponentials per entry instead of three. Identical rows give exactly 0.
inline PositionComparison compare_distributions(std::span<const float> reference, std::span<const float> logits,
                                                int32_t target) {
  assert(reference.size() == logits.size() && !logits.empty());
  const size_t n = logits.size();
  size_t ref_top = 0, top = 0;
  for (size_t v = 1; v < n; ++v) {
    if (reference[v] > reference[ref_top]) ref_top = v;
    if (logits[v] > logits[top]) top = v;
  }
  const double ref_max = reference[ref_top], max = logits[top];
  double ref_sum = 0.0, sum = 0.0, weighted_diff = 0.0;
  for (size_t v = 0; v < n; ++v) {
    const double x = reference[v], y = logits[v];
    const double e = std::exp(x - ref_max);
    ref_sum += e;
    sum += std::exp(y - max);
    if (e > 0.0) weighted_diff += e * (x - y);  // P(v) = 0 adds nothing, even where Q(v) = 0
  }
  const double ref_lse = ref_max + std::log(ref_sum), lse = max + std::log(sum);
  PositionComparison c;
  c.reference_nll = ref_lse - reference[static_cast<size_t>(target)];
  c.nll = lse - logits[static_cast<size_t>(target)];
  // KL >= 0; rounding can leave a tiny negative where the rows are nearly identical.
  c.kl = std::max(0.0, weighted_diff / ref_sum - (ref_lse - lse));
  c.same_argmax = ref_top == top;
  return c;
}

inline double kl_divergence(std::span<const float> reference, std::span<const float> logits) {
  return compare_distributions(reference, logits, 0).kl;
}

// Runs one model over the windows of a text, one window at a time, in a paged KV cache of its own
// sized for one window (on the model's device; f32 on the CPU, bf16 on a GPU, as the engine's,
// unless kv_dtype says otherwise).
// Every window starts again at position 0 and overwrites the slots of the previous one.
class WindowRunner {
 public:
  // `tiers`: the cache's window and history, applied after every run() as an engine applies them
  // after every step. `sparse_budget` > 0 (int8 / int4 history): every query attends block-sparse
  // (ops.h select_kv_blocks) with that budget and one sink block, as an engine's decode steps do.
  static Result<std::unique_ptr<WindowRunner>> create(const LlamaModel& model, int max_tokens,
                                                      std::optional<DType> kv_dtype = std::nullopt,
                                                      const KvTierOptions& tiers = {}, int sparse_budget = 0) {
    const ModelConfig& c = model.config();
    KvCacheConfig kv;
    kv.num_layers = c.num_layers;
    kv.num_kv_heads = c.num_kv_heads;
    kv.head_dim = c.head_dim;
    kv.block_size = kBlockSize;
    kv.num_blocks = (max_tokens + kBlockSize - 1) / kBlockSize;
    kv.device = model.device();
    kv.dtype = kv_dtype.value_or(kv.device.is_cpu() ? DType::kF32 : DType::kBF16);
    kv.tiers = tiers;
    kv.num_history_blocks = tiers.history_bits() != 0 ? kv.num_blocks : 0;
    kv.key_bounds = sparse_budget > 0;
    TACHYON_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(kv));
    std::unique_ptr<WindowRunner> runner(new WindowRunner(model, std::move(cache), kv.num_blocks, max_tokens));
    runner->sparse_budget_ = sparse_budget;
    TACHYON_RETURN_IF_ERROR(runner->blocks_.grow_to(runner->table_, max_tokens));
    return runner;
  }

  int max_tokens() const { return max_tokens_; }

  // Runs `tokens` at positions start_position .. of the current window: positions before
  // start_position were run by earlier calls for this window (start_position 0 starts a new
  // one). With `logits`, fills it with [tokens.size(), vocab] f32 on the host, row i predicting
  // the token after tokens[i]; without, computes no logits (context only).
  Status run(std::span<const int32_t> tokens, int start_position, Tensor* logits) {
    if (tokens.empty() || start_position + static_cast<int64_t>(tokens.size()) > max_tokens()) {
      return make_error(ErrorCode::kOutOfRange, "window runner: {} tokens at position {} in a window of {}",
                        tokens.size(), start_position, max_tokens());
    }
    if (start_position == 0 && (table_.num_released() > 0 || table_.num_history() > 0)) {  // a new window
      blocks_.free(table_);
      TACHYON_RETURN_IF_ERROR(blocks_.grow_to(table_, max_tokens_));
    }
    if (start_position < table_.first_resident_position()) {
      return make_error(ErrorCode::kOutOfRange, "window runner: position {} was released", start_position);
    }
    // History tiers change what later queries read: one token per forward, as decode steps see
    // them (a chunk's queries would read their chunk at full precision). Drop only masks, which a
    // chunk does exactly.
    const size_t step = cache_.config().tiers.history_bits() != 0 ? 1 : tokens.size();
    if (step == tokens.size()) return run_chunk(tokens, start_position, logits);
    Tensor row;
    for (size_t i = 0; i < tokens.size(); ++i) {
      TACHYON_RETURN_IF_ERROR(
          run_chunk(tokens.subspan(i, 1), start_position + static_cast<int>(i), logits != nullptr ? &row : nullptr));
      if (logits == nullptr) continue;
      if (i == 0) *logits = Tensor::empty({static_cast<int64_t>(tokens.size()), row.size(1)}, DType::kF32);
      std::copy(row.data<float>(), row.data<float>() + row.size(1),
                logits->data<float>() + static_cast<int64_t>(i) * row.size(1));
    }
    return Status::Ok();
  }

 private:
  Status run_chunk(std::span<const int32_t> tokens, int start_position, Tensor* logits) {
    SequenceChunk chunk;
    chunk.block_table = &table_;
    chunk.start_position = start_position;
    chunk.tokens = tokens;
    chunk.logits = logits != nullptr ? LogitsWanted::kAll : LogitsWanted::kNone;
    chunk.sparse_budget = sparse_budget_;
    const ForwardBatch batch = build_forward_batch({chunk});
    Tensor none;
    TACHYON_RETURN_IF_ERROR(model_.forward(batch, cache_, logits != nullptr ? *logits : none));
    blocks_.retire(table_, start_position + static_cast<int>(tokens.size()));
    if (blocks_.has_compressions()) cache_.compress_blocks(blocks_.take_compressions());
    return Status::Ok();
  }


 private:
  static constexpr int kBlockSize = kDefaultBlockSize;

  WindowRunner(const LlamaModel& model, KvCache cache, int num_blocks, int max_tokens)
      : model_(model),
        cache_(std::move(cache)),
        blocks_(BlockManagerOptions{num_blocks, kBlockSize, false, cache_.config().tiers,
                                    cache_.config().num_history_blocks}),
        table_(kBlockSize),
        max_tokens_(max_tokens) {}

  const LlamaModel& model_;
  KvCache cache_;
  BlockManager blocks_;
  BlockTable table_;
  int max_tokens_;
  int sparse_budget_ = 0;
};

}  // namespace tachyon::cli
