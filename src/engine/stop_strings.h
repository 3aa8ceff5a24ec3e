// Stop strings over streamed text: text arrives in pieces (one per token, split anywhere, even
// inside a stop string), and what may be shown is only what can no longer be the start of a
// match. The first stop string to be complete (the earliest end; then the earliest start) ends
// the stream; nothing after it is shown, and neither is the stop string itself unless the matcher
// includes it (vLLM's include_stop_str_in_output). How the text is cut into pieces never changes
// the result.
//
// Pieces pushed with may_stop = false (a request's tokens before min_tokens) cannot end the
// stream: a match counts only if it ends in text pushed with may_stop = true, as vLLM checks only
// the text after its min_tokens-th token (with a lookback of a stop string's length).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tachyon {

// Bounds on one request's stop strings: the matcher's work per piece grows with both.
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;
// kInvalidArgument naming the bound a request's stop strings pass; the engine checks it on
// add_request, and the server before a stream starts.
Status validate_stop_strings(const std::vector<std::string>& stops);

class StopStringMatcher {
 public:
  // include_stop: the matched stop string is part of the text push() returns.
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  bool empty() const { return stops_.empty(); }
  // Adds a piece of text; returns the text that is now safe to show.
  std::string push(std::string_view piece, bool may_stop = true);
  // A stop string was found (push() returned the text before it); the stream is over.
  bool matched() const { return matched_.has_value(); }
  const std::string& matched_string() const { return *matched_; }
  // The end of the stream without a match: everything held back is safe.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;  // held back: a suffix that may begin a stop string
  size_t unarmed_ = 0;   // pending_'s leading bytes pushed with may_stop = false: no match ends there
  std::optional<std::string> matched_;
};

}  // namespace tachyon
