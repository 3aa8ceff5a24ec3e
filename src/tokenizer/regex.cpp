// PCRE2 wrapper (see regex.h). The only file that includes pcre2.h.
#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/log.h"

namespace tachyon {
namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return fmt::format("PCRE2 error {}", code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern, std::string_view what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "{}: regex /{}/ does not compile at offset {}: {}", what, pattern,
                      offset, pcre2_error_text(error));
  }
  std::shared_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  if (!regex->jit_) TACHYON_LOG_INFO("tokenizer: regex /{}/ runs in the PCRE2 interpreter (no JIT)", pattern);
  return std::shared_ptr<const Regex>(std::move(regex));
}

Result<std::shared_ptr<const Regex>> Regex::literal(std::string_view literal, std::string_view what) {
  // \Q...\E quotes everything except a literal "\E", which is spliced in separately.
  std::string pattern = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal.compare(i, 2, "\\E") == 0) {
      pattern += "\\E\\\\E\\Q";
      ++i;
    } else {
      pattern.push_back(literal[i]);
    }
  }
  pattern += "\\E";
  return compile(pattern, what);
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const {
  RegexMatcher matcher(*this);
  return matcher.for_each_match(subject, on_match);
}

RegexMatcher::RegexMatcher(const Regex& regex) : regex_(&regex) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(regex.code_), nullptr);
}

RegexMatcher::RegexMatcher(RegexMatcher&& other) noexcept
    : regex_(other.regex_), match_data_(other.match_data_), context_(other.context_), jit_stack_(other.jit_stack_) {
  other.match_data_ = other.context_ = other.jit_stack_ = nullptr;
}

RegexMatcher::~RegexMatcher() {
  if (match_data_ != nullptr) pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  if (context_ != nullptr) pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  if (jit_stack_ != nullptr) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

bool RegexMatcher::for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) {
  auto* code = static_cast<pcre2_code*>(regex_->code_);
  auto* match_data = static_cast<pcre2_match_data*>(match_data_);
  if (match_data == nullptr) return false;
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  uint32_t options = 0;
  while (start <= subject.size()) {
    // The subject was validated (or repaired) before it got here.
    auto run = [&](uint32_t extra) {
      return pcre2_match(code, data, subject.size(), start, options | extra | PCRE2_NO_UTF_CHECK, match_data,
                         static_cast<pcre2_match_context*>(context_));
    };
    int rc = run(0);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_ == nullptr) {
      // Long runs of one character class can need more than the default 32 KiB JIT stack.
      jit_stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      context_ = pcre2_match_context_create(nullptr);
      if (jit_stack_ != nullptr && context_ != nullptr) {
        pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(context_), nullptr,
                               static_cast<pcre2_jit_stack*>(jit_stack_));
      }
      rc = run(0);
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      TACHYON_LOG_INFO("tokenizer: regex /{}/ falls back to the PCRE2 interpreter on a {}-byte subject",
                       regex_->pattern(), subject.size());
      rc = run(PCRE2_NO_JIT);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return true;
    if (rc < 0) {
      TACHYON_LOG_WARN("tokenizer: regex /{}/ stopped at byte {} of {}: {}", regex_->pattern(), start, subject.size(),
                       pcre2_error_text(rc));
      return false;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      start = end;
      options = 0;
    } else {
      // An empty match: look again from there, refusing an empty match at that very place
      // (a later empty match moves `start` forward, so this terminates).
      if (options == PCRE2_NOTEMPTY_ATSTART && begin == start) return true;  // cannot happen
      start = begin;
      options = PCRE2_NOTEMPTY_ATSTART;
    }
  }
  return true;
}

}  // namespace tachyon
