// The text of one request's generated tokens, made by one set of rules wherever it is made: an
// incremental detokenizer primed with the prompt (so the first piece keeps its leading space) and
// the request's stop strings (text that may still begin one is held back; what follows a matched
// one never appears, nor the match itself unless include_stop_str_in_output). A token that ended
// the request as an EOS or stop token has no text, unless include_stop_str_in_output. Stop strings
// cannot end the text before min_tokens tokens (GenerationParams).
// When the request ends normally (stop, length, context) what was held back is released; an
// aborted or failed request releases nothing, and neither does one handed over to another engine,
// which rebuilds the same state from the tokens and goes on.
//
// The engine keeps one per request whose text it needs on its own thread (stop strings end the
// request at the match). A consumer that makes the text itself, off the engine's thread (the
// server, for requests without stop strings), keeps its own and feeds it whole outputs with
// append().
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/request.h"
#include "engine/stop_strings.h"
#include "tokenizer/detokenizer.h"

namespace tachyon {

class RequestText {
 public:
  // `params` gives the stop strings, include_stop_str_in_output, min_tokens and
  // skip_special_tokens; the tokenizer must outlive this.
  RequestText(const Tokenizer& tokenizer, const GenerationParams& params, std::span<const int32_t> prompt);

  // A generated token that is part of the text: the text it makes safe to show (possibly empty).
  // Once matched(), nothing more. Each call counts one generated token (for min_tokens).
  std::string push(int32_t token);
  // A stop string is complete: the request ends here, with the text push()/finish() returned.
  bool matched() const { return stops_.matched(); }
  const std::string& matched_string() const { return stops_.matched_string(); }
  // The request ended with `reason`: what was held back when that release it (see the top), which
  // may complete a stop string (then matched()).
  std::string finish(FinishReason reason);
  // Whether an ending releases what was held back.
  static bool releases_held_text(FinishReason reason);

  // For a consumer: appends the text of one engine output (its new tokens, then its end when it
  // finished) to output.text, by the rules above.
  void append(RequestOutput& output);

 private:
  // A stop string may end the text: min_tokens tokens were pushed.
  bool may_stop() const { return num_pushed_ >= min_tokens_; }

  IncrementalDetokenizer detok_;
  StopStringMatcher stops_;
  int min_tokens_ = 0;
  int num_pushed_ = 0;
  bool include_stop_ = false;
};

}  // namespace tachyon
