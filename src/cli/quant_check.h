// The safety net of load-time quantization (cli::load, --quant): before a quantized model replaces
// the one as stored, one short forward must give finite logits everywhere. A NaN or Inf there
// (a scale that overflowed, a weight row that held one) would otherwise surface as garbage text
// or a NaN perplexity far from its cause. On failure the weights as stored are kept, with a
// warning that says so: never a silent fallback. Header-only so that tests call it directly.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/scoring.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/model_loader.h"

namespace tachyon::cli {

// Tokens of the probe forward.
constexpr int kFiniteCheckTokens = 8;

struct FiniteCheck {
  bool finite = true;
  std::string first_non_finite;  // "logit 17 at position 3 is nan" when !finite
  double seconds = 0.0;
};

// One forward over kFiniteCheckTokens tokens: BOS (token 0 when the model names none) and 7 fixed ids spread over
// the vocabulary, with logits at every position. Cheap next to loading: on the bundled model a few
// milliseconds. Errors are the forward's own (the check could not run), not a verdict.
inline Result<FiniteCheck> check_finite_logits(const LlamaModel& model, int32_t bos_token_id) {
  Timer timer;
  const int32_t vocab = model.config().vocab_size;
  constexpr int kTokens = kFiniteCheckTokens;
  std::vector<int32_t> tokens{bos_token_id >= 0 && bos_token_id < vocab ? bos_token_id : 0};
  for (int i = 1; i < kTokens; ++i) tokens.push_back(static_cast<int32_t>(int64_t{vocab} * i / kTokens));
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<WindowRunner> runner, WindowRunner::create(model, kTokens));
  Tensor logits;
  TACHYON_RETURN_IF_ERROR(runner->run(tokens, 0, &logits));
  FiniteCheck check;
  const float* row = logits.data<float>();
  for (int64_t i = 0; i < logits.numel() && check.finite; ++i) {
    if (!std::isfinite(row[i])) {
      check.finite = false;
      check.first_non_finite = fmt::format("logit {} at position {} is {}", i % vocab, i / vocab, row[i]);
    }
  }
  check.seconds = timer.seconds();
  return check;
}

// The end of load-time quantization: `quantized` (made from loaded.model's weights as `format`,
// e.g. "int8" or "int4 g128") replaces loaded.model when check_finite_logits passes, and
// loaded.weight_dtypes then names the format. Otherwise a warning names the first bad logit and
// `loaded` is left as it was. Returns whether the quantized model was kept.
inline Result<bool> keep_quantized_if_finite(LoadedModel& loaded, std::unique_ptr<LlamaModel> quantized,
                                             const std::string& format) {
  TACHYON_ASSIGN_OR_RETURN(const FiniteCheck check, check_finite_logits(*quantized, loaded.bos_token_id));
  if (!check.finite) {
    TACHYON_LOG_WARN("{}: the {} weights give non-finite logits ({}); running the weights as stored ({}) instead",
                     loaded.path, format, check.first_non_finite, loaded.weight_dtypes);
    return false;
  }
  TACHYON_LOG_INFO("{} weights: logits finite on a {}-token probe ({:.1f} ms)", format, kFiniteCheckTokens, check.seconds * 1e3);
  loaded.model = std::move(quantized);
  loaded.weight_dtypes = fmt::format("{} (embedding, lm head: {})", format, loaded.weight_dtypes);
  return true;
}

}  // namespace tachyon::cli
