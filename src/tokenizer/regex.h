// A compiled PCRE2 pattern for the pre-tokenizers: UTF-8 subjects, Unicode properties (UCP, so
// \p{L}, \p{N}, \s and \w mean their Unicode versions), JIT-compiled where the platform allows.
// Immutable after compile(), so one Regex may serve many threads; every match call brings its
// own match data.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tachyon {

class Regex {
 public:
  // `what` names the pattern's origin for the error message ("tokenizer.json: pre_tokenizer...").
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern, std::string_view what);
  // A pattern matching `literal` exactly.
  static Result<std::shared_ptr<const Regex>> literal(std::string_view literal, std::string_view what);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every non-empty, non-overlapping match in `subject` (valid
  // UTF-8), left to right, as byte offsets. Returns false if the engine gave up (resource
  // limits); the matches reported up to then stand. A RegexMatcher reused over many subjects
  // saves the per-call allocations.
  bool for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  friend class RegexMatcher;
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Per-call match state for one Regex (match data, and a large JIT stack once a subject needs
// more than PCRE2's default 32 KiB). Not shared between threads.
class RegexMatcher {
 public:
  explicit RegexMatcher(const Regex& regex);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;
  RegexMatcher(RegexMatcher&& other) noexcept;

  // See Regex::for_each_match.
  bool for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match);

 private:
  const Regex* regex_;
  void* match_data_ = nullptr;  // pcre2_match_data_8*
  void* context_ = nullptr;     // pcre2_match_context_8*, with jit_stack_ assigned
  void* jit_stack_ = nullptr;   // pcre2_jit_stack_8*
};

}  // namespace tachyon
