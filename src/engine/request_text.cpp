#include "engine/request_text.h"

namespace tachyon {
namespace {

DetokenizerOptions detokenizer_options(const GenerationParams& params) {
  DetokenizerOptions o;
  o.skip_special = params.skip_special_tokens;
  return o;
}

}  // namespace

RequestText::RequestText(const Tokenizer& tokenizer, const GenerationParams& params, std::span<const int32_t> prompt)
    : detok_(tokenizer, detokenizer_options(params)),
      stops_(params.stop, params.include_stop_str_in_output),
      min_tokens_(params.min_tokens),
      include_stop_(params.include_stop_str_in_output) {
  for (int32_t t : prompt) (void)detok_.push(t);
}

std::string RequestText::push(int32_t token) {
  if (stops_.matched()) return {};
  ++num_pushed_;
  return stops_.push(detok_.push(token), may_stop());
}

bool RequestText::releases_held_text(FinishReason reason) {
  return reason != FinishReason::kAbort && reason != FinishReason::kError && reason != FinishReason::kTransfer;
}

std::string RequestText::finish(FinishReason reason) {
  if (!releases_held_text(reason) || stops_.matched()) return {};
  std::string text = stops_.push(detok_.flush(), may_stop());
  if (!stops_.matched()) text += stops_.flush();
  return text;
}

void RequestText::append(RequestOutput& o) {
  size_t count = o.new_token_ids.size();
  // An EOS or stop token that ended the request is the last new token, and has no text (unless
  // the request keeps what stopped it).
  if (o.finished && o.finish_reason == FinishReason::kStop && count > 0 && o.stop.kind == StopCause::Kind::kToken &&
      !include_stop_) {
    --count;
  }
  for (size_t i = 0; i < count; ++i) o.text += push(o.new_token_ids[i]);
  if (o.finished) o.text += finish(o.finish_reason);
}

}  // namespace tachyon
