// Normalizer steps (see normalizer.h). Unicode normalization and case mapping come from
// utf8proc; everything else is plain string work.
#include "tokenizer/normalizer.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include <utf8proc.h>

#include "core/log.h"
#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

std::string unicode_normalize(std::string_view text, Normalizer::Form form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Normalizer::Form::kNfc: options |= UTF8PROC_COMPOSE; break;
    case Normalizer::Form::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case Normalizer::Form::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Normalizer::Form::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    // Only possible for invalid UTF-8, which never gets here; keep the text as it is.
    TACHYON_LOG_WARN("tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
    return std::string(text);
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = next_code_point(text, pos);
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end) {
      size_t pos = begin;
      if (!is_unicode_white_space(next_code_point(text, pos))) break;
      begin = pos;
    }
  }
  if (right) {
    while (end > begin) {
      const size_t start = std::max(begin, previous_code_point_start(text, end));
      size_t pos = start;
      if (!is_unicode_white_space(next_code_point(text, pos))) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace

void Normalizer::add_prepend(std::string prefix) { steps_.push_back(Step{Kind::kPrepend, std::move(prefix), {}, {}}); }

void Normalizer::add_replace(std::string from, std::string to) {
  steps_.push_back(Step{Kind::kReplace, std::move(from), std::move(to), {}});
}

void Normalizer::add_replace_regex(std::shared_ptr<const Regex> regex, std::string to) {
  steps_.push_back(Step{Kind::kReplaceRegex, {}, std::move(to), std::move(regex)});
}

void Normalizer::add_unicode(Form form) {
  Step step{Kind::kUnicode, {}, {}, {}};
  step.form = form;
  steps_.push_back(std::move(step));
}

void Normalizer::add_lowercase() { steps_.push_back(Step{Kind::kLowercase, {}, {}, {}}); }

void Normalizer::add_strip(bool left, bool right) {
  Step step{Kind::kStrip, {}, {}, {}};
  step.left = left;
  step.right = right;
  steps_.push_back(std::move(step));
}

std::string Normalizer::apply(std::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kPrepend:
        if (!current.empty()) current.insert(0, step.a);
        break;
      case Kind::kReplace:
        current = replace_all(current, step.a, step.b);
        break;
      case Kind::kReplaceRegex: {
        std::string out;
        size_t last = 0;
        step.regex->for_each_match(current, [&](size_t b, size_t e) {
          out.append(current, last, b - last);
          out.append(step.b);
          last = e;
        });
        out.append(current, last, std::string::npos);
        current = std::move(out);
        break;
      }
      case Kind::kUnicode:
        current = unicode_normalize(current, step.form);
        break;
      case Kind::kLowercase:
        current = lowercase(current);
        break;
      case Kind::kStrip:
        current = strip(current, step.left, step.right);
        break;
    }
  }
  return current;
}

std::string Normalizer::describe() const {
  std::string out;
  static constexpr const char* kFormNames[] = {"NFC", "NFD", "NFKC", "NFKD"};
  for (const Step& step : steps_) {
    if (!out.empty()) out += " -> ";
    switch (step.kind) {
      case Kind::kPrepend: out += fmt::format("prepend '{}'", step.a); break;
      case Kind::kReplace: out += fmt::format("replace '{}' by '{}'", step.a, step.b); break;
      case Kind::kReplaceRegex: out += fmt::format("replace /{}/ by '{}'", step.regex->pattern(), step.b); break;
      case Kind::kUnicode: out += kFormNames[static_cast<int>(step.form)]; break;
      case Kind::kLowercase: out += "lowercase"; break;
      case Kind::kStrip: out += "strip"; break;
    }
  }
  return out.empty() ? "none" : out;
}

}  // namespace tachyon
