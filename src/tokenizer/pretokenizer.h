// Pre-tokenization: turns one segment of text (between added tokens) into the pieces that BPE
// sees, as byte spans. Owns the regex split steps (Hugging Face `Split`, `ByteLevel`'s regex,
// `Digits`, `Punctuation`, `Whitespace*`, `Sequence` of those), the `Metaspace` / `ByteLevel`
// text transforms (space replacement, prefix), and the named patterns of the known models.
// Knows nothing of vocabularies.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace tachyon {

// The published pre-tokenizer patterns.
// GPT-2 (also GPT-NeoX/MPT and others that kept it).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (numbers in groups of up to three digits).
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen / Qwen2 (digits one at a time).
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// What happens to the regex matches of a split step (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,            // matches and the text between them are separate pieces
  kRemoved,             // matches are dropped
  kMergedWithPrevious,  // a match is glued to the piece before it
  kMergedWithNext,      // a match is glued to the piece after it
  kContiguous,          // adjacent matches form one piece, the rest is kept
};
Result<SplitBehavior> parse_split_behavior(std::string_view name, std::string_view what);

// When a prefix is put in front of a segment.
enum class PrependScheme {
  kNever,
  kFirst,   // only the segment at the very start of the text
  kAlways,  // every segment
};

struct ByteSpan {
  size_t begin = 0;
  size_t end = 0;
};

class PreTokenizer {
 public:
  // Split steps run in order; each splits every piece the previous steps produced.
  void add_split(std::shared_ptr<const Regex> regex, SplitBehavior behavior, bool invert = false);
  // Before any split: replace every ' ' by `replacement` (empty: no replacement), then put
  // `prefix` in front of the segment per `scheme` unless it already starts with `prefix`.
  void set_transform(std::string replacement, std::string prefix, PrependScheme scheme);

  bool has_transform() const { return !space_replacement_.empty() || scheme_ != PrependScheme::kNever; }
  // The segment after the transform. `at_text_start`: the segment begins the whole text.
  std::string transform(std::string_view segment, bool at_text_start) const;
  // Appends the pieces of `text` (already transformed) to `out`.
  void split(std::string_view text, std::vector<ByteSpan>& out) const;

  // "split(/.../ isolated) -> split(/.../ isolated)"; "none" when empty.
  std::string describe() const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  static void split_one(const Step& step, RegexMatcher& matcher, std::string_view text, ByteSpan piece,
                        std::vector<ByteSpan>& out);

  std::vector<Step> steps_;
  std::string space_replacement_;
  std::string prefix_;
  PrependScheme scheme_ = PrependScheme::kNever;
};

// The split patterns behind a GGUF `tokenizer.ggml.pre` name, applied in sequence with
// "isolated" behaviour; nullopt for a name we do not know. Names whose tokenizer takes a
// pre-token that is itself a token whole (tiktoken's rule) are flagged by
// gguf_pretokenizer_ignores_merges().
std::optional<std::vector<std::string_view>> gguf_pretokenizer_patterns(std::string_view pre);
bool gguf_pretokenizer_ignores_merges(std::string_view pre);
// Names gguf_pretokenizer_patterns() knows, for error messages.
std::string known_gguf_pretokenizers();

}  // namespace tachyon
