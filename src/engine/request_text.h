// The text of one request's generated tokens, made by one set of rules wherever it is made: an
// incremental detokenizer primed with the prompt (so the first piece keeps its leading space) and
// the request's stop strings (text that may still begin one is held back; a matched one and what
// follows it never appear). A token that ended the request as an EOS or stop token has no text.
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
  // `params` gives the stop strings and skip_special_tokens; the tokenizer must outlive this.
  RequestText(const Tokenizer& tokenizer, const GenerationParams& params, std::span<const int32_t> prompt);

  // A generated token that is part of the text: the text it makes safe to show (possibly empty).
  // Once matched(), nothing more.
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
  IncrementalDetokenizer detok_;
  StopStringMatcher stops_;
};

}  // namespace tachyon
