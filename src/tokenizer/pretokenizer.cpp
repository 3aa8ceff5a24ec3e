// Regex split steps, segment transforms and the known GGUF pre-tokenizer names (see
// pretokenizer.h).
#include "tokenizer/pretokenizer.h"

#include <utility>

namespace tachyon {

Result<SplitBehavior> parse_split_behavior(std::string_view name, std::string_view what) {
  // Hugging Face writes these in PascalCase in tokenizer.json and snake_case in Python.
  if (name == "Isolated" || name == "isolated") return SplitBehavior::kIsolated;
  if (name == "Removed" || name == "removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious" || name == "merged_with_previous") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext" || name == "merged_with_next") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous" || name == "contiguous") return SplitBehavior::kContiguous;
  return make_error(ErrorCode::kUnsupported, "{}: unknown split behavior '{}'", what, name);
}

void PreTokenizer::add_split(std::shared_ptr<const Regex> regex, SplitBehavior behavior, bool invert) {
  steps_.push_back(Step{std::move(regex), behavior, invert});
}

void PreTokenizer::set_transform(std::string replacement, std::string prefix, PrependScheme scheme) {
  space_replacement_ = std::move(replacement);
  prefix_ = std::move(prefix);
  scheme_ = prefix_.empty() ? PrependScheme::kNever : scheme;
}

std::string PreTokenizer::transform(std::string_view segment, bool at_text_start) const {
  std::string out;
  out.reserve(segment.size() + prefix_.size());
  if (space_replacement_.empty()) {
    out.assign(segment);
  } else {
    for (char c : segment) {
      if (c == ' ') {
        out += space_replacement_;
      } else {
        out.push_back(c);
      }
    }
  }
  const bool want_prefix =
      scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_text_start);
  if (want_prefix && !out.empty() && out.compare(0, prefix_.size(), prefix_) != 0) out.insert(0, prefix_);
  return out;
}

void PreTokenizer::split(std::string_view text, std::vector<ByteSpan>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.push_back(ByteSpan{0, text.size()});
    return;
  }
  std::vector<ByteSpan> current{ByteSpan{0, text.size()}};
  std::vector<ByteSpan> next;
  for (size_t s = 0; s < steps_.size(); ++s) {
    std::vector<ByteSpan>& target = (s + 1 == steps_.size()) ? out : next;
    RegexMatcher matcher(*steps_[s].regex);
    for (const ByteSpan& piece : current) split_one(steps_[s], matcher, text, piece, target);
    if (s + 1 < steps_.size()) {
      current.swap(next);
      next.clear();
    }
  }
}

void PreTokenizer::split_one(const Step& step, RegexMatcher& matcher, std::string_view text, ByteSpan piece,
                             std::vector<ByteSpan>& out) {
  // Alternating runs of (span, is_delimiter), empty runs left out.
  struct Run {
    ByteSpan span;
    bool delimiter;
  };
  std::vector<Run> runs;
  size_t last = piece.begin;
  const std::string_view subject = text.substr(piece.begin, piece.end - piece.begin);
  const bool complete = matcher.for_each_match(subject, [&](size_t b, size_t e) {
    const size_t begin = piece.begin + b, end = piece.begin + e;
    if (begin > last) runs.push_back(Run{ByteSpan{last, begin}, step.invert});
    runs.push_back(Run{ByteSpan{begin, end}, !step.invert});
    last = end;
  });
  (void)complete;  // on a regex failure the unmatched rest stays one piece (logged by Regex)
  if (last < piece.end) runs.push_back(Run{ByteSpan{last, piece.end}, step.invert});

  const size_t first_out = out.size();
  bool previous_delimiter = false;
  for (const Run& run : runs) {
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        out.push_back(run.span);
        break;
      case SplitBehavior::kRemoved:
        if (!run.delimiter) out.push_back(run.span);
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (run.delimiter && !previous_delimiter && out.size() > first_out) {
          out.back().end = run.span.end;
        } else {
          out.push_back(run.span);
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (!run.delimiter && previous_delimiter && out.size() > first_out) {
          out.back().end = run.span.end;
        } else {
          out.push_back(run.span);
        }
        break;
      case SplitBehavior::kContiguous:
        if (run.delimiter && previous_delimiter && out.size() > first_out) {
          out.back().end = run.span.end;
        } else {
          out.push_back(run.span);
        }
        break;
    }
    previous_delimiter = run.delimiter;
  }
}

std::string PreTokenizer::describe() const {
  std::string out;
  if (!space_replacement_.empty()) out += fmt::format("replace ' ' by '{}'", space_replacement_);
  if (scheme_ != PrependScheme::kNever) {
    if (!out.empty()) out += " -> ";
    out += fmt::format("prefix '{}' ({})", prefix_, scheme_ == PrependScheme::kAlways ? "every segment" : "first segment");
  }
  static constexpr const char* kBehaviorNames[] = {"isolated", "removed", "merged with previous", "merged with next",
                                                   "contiguous"};
  for (const Step& step : steps_) {
    if (!out.empty()) out += " -> ";
    out += fmt::format("split(/{}/ {}{})", step.regex->pattern(), kBehaviorNames[static_cast<int>(step.behavior)],
                       step.invert ? ", inverted" : "");
  }
  return out.empty() ? "none" : out;
}

namespace {

// Falcon: punctuation runs, then the GPT-2 pattern, then groups of three ASCII digits.
constexpr std::string_view kPunctuationRunPattern = R"([\p{P}$+<=>^`|~]+)";
constexpr std::string_view kThreeDigitsPattern = R"([0-9][0-9][0-9])";
constexpr std::string_view kSingleDigitPattern = R"(\p{N})";

struct NamedPatterns {
  std::string_view name;
  std::vector<std::string_view> patterns;
};

const std::vector<NamedPatterns>& gguf_pretokenizer_table() {
  static const std::vector<NamedPatterns> table = {
      // "default" is what GGUF writers put for byte-level vocabularies without a more specific
      // match; GPT-2's pattern is the one those vocabularies were trained with.
      {"default", {kGpt2Pattern}},
      {"gpt-2", {kGpt2Pattern}},
      {"gpt2", {kGpt2Pattern}},
      {"mpt", {kGpt2Pattern}},
      {"llama-bpe", {kLlama3Pattern}},
      {"llama3", {kLlama3Pattern}},
      {"llama-v3", {kLlama3Pattern}},
      {"smaug-bpe", {kLlama3Pattern}},  // Llama 3's tokenizer
      {"dbrx", {kLlama3Pattern}},       // OpenAI's cl100k pattern, which Llama 3 adopted
      {"qwen2", {kQwen2Pattern}},
      // StarCoder's tokenizer (also SmolLM's, Refact's): single digits, then GPT-2's pattern.
      {"starcoder", {kSingleDigitPattern, kGpt2Pattern}},
      {"refact", {kSingleDigitPattern, kGpt2Pattern}},
      {"smollm", {kSingleDigitPattern, kGpt2Pattern}},
      {"falcon", {kPunctuationRunPattern, kGpt2Pattern, kThreeDigitsPattern}},
  };
  return table;
}

}  // namespace

std::optional<std::vector<std::string_view>> gguf_pretokenizer_patterns(std::string_view pre) {
  for (const auto& entry : gguf_pretokenizer_table()) {
    if (entry.name == pre) return entry.patterns;
  }
  return std::nullopt;
}

bool gguf_pretokenizer_ignores_merges(std::string_view pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "dbrx";
}

std::string known_gguf_pretokenizers() {
  std::string out;
  for (const auto& entry : gguf_pretokenizer_table()) {
    if (!out.empty()) out += ", ";
    out += entry.name;
  }
  return out;
}

}  // namespace tachyon
