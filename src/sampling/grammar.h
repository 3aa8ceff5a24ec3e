// Grammar: the context-free grammar that constrained decoding follows, in two forms.
//   GrammarExpr    - a tree (sequence, alternation, repetition, character class, rule reference) that the
//                    front ends build: the GBNF parser (gbnf_parser.h), the regex compiler (regex_grammar.h)
//                    and the JSON Schema compiler (json_schema.h).
//   Grammar        - the flat form the matcher runs (grammar_matcher.h): rules of alternatives, each a run
//                    of elements (a character class or a rule reference) ended by kEnd, all in one array so
//                    that a parse position is one int32. Quantifiers are already expanded into helper rules
//                    (x* -> x-1 ::= x x-1 | "", x{0,3} -> a chain of three optional rules).
// GrammarBuilder lowers named GrammarExpr rules into a Grammar and checks what would make the matcher loop
// or stall: undefined rules, a missing root, left recursion (a rule reaching itself without consuming a
// character, which includes repeating something that can be empty) and rules that can never finish.
// Everything here works on Unicode code points; the matcher turns them into bytes.
// Must never: abort on a user's grammar (every problem is a Status naming the rule and, for GBNF text,
// line:column), or depend on a tokenizer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/utf8.h"

namespace tachyon {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// UTF-8 helpers shared by the grammar front ends and the matcher (append_utf8: core/utf8.h).
// Decodes the code point at bytes[pos] and advances pos; nullopt (pos unchanged) for invalid UTF-8
// (overlong forms, surrogates, truncated sequences, bytes 0x80-0xBF or 0xF5-0xFF first).
std::optional<uint32_t> decode_utf8(std::string_view bytes, size_t& pos);

struct CharRange {
  uint32_t first = 0;  // inclusive
  uint32_t last = 0;   // inclusive
  bool operator==(const CharRange&) const = default;
  auto operator<=>(const CharRange&) const = default;
};

// A set of code points. Invariant: ranges() are sorted, disjoint and non-adjacent, all <= kMaxCodePoint.
class CharClass {
 public:
  CharClass() = default;
  static CharClass single(uint32_t code_point) { return range(code_point, code_point); }
  static CharClass range(uint32_t first, uint32_t last);
  static CharClass any() { return range(0, kMaxCodePoint); }

  void add(uint32_t first, uint32_t last);
  void add(const CharClass& other);
  CharClass complement() const;  // within [0, kMaxCodePoint]
  CharClass minus(const CharClass& other) const;

  bool contains(uint32_t code_point) const;
  // Whether some code point in [first, last] is in the class.
  bool intersects(uint32_t first, uint32_t last) const;
  bool empty() const { return ranges_.empty(); }
  // The one code point of a single-member class.
  std::optional<uint32_t> single_member() const;
  const std::vector<CharRange>& ranges() const { return ranges_; }
  bool operator==(const CharClass&) const = default;

 private:
  std::vector<CharRange> ranges_;
};

// Where a construct was written in a grammar's text (1-based; column counts bytes). {0, 0}: not from text.
struct SourcePos {
  int line = 0;
  int column = 0;
  bool known() const { return line > 0; }
};

// A grammar expression tree. The default value is the empty sequence (matches "").
struct GrammarExpr {
  enum class Kind : uint8_t { kChars, kRuleRef, kSequence, kAlternation, kRepeat };
  static constexpr int32_t kUnbounded = -1;

  Kind kind = Kind::kSequence;
  CharClass char_class;               // kChars: one code point from this set
  std::string rule_name;              // kRuleRef
  SourcePos position;                 // kRuleRef: where the reference was written, for errors
  std::vector<GrammarExpr> children;  // kSequence, kAlternation: the parts; kRepeat: exactly one
  int32_t min_count = 0;              // kRepeat: at least min_count copies ...
  int32_t max_count = kUnbounded;     // ... and at most max_count (kUnbounded: no limit)

  static GrammarExpr empty() { return GrammarExpr(); }
  static GrammarExpr chars(CharClass char_class);
  static GrammarExpr code_point(uint32_t cp) { return chars(CharClass::single(cp)); }
  // The code points of `utf8` in order; bytes that are not valid UTF-8 stand for themselves (as U+0080..U+00FF
  // would), so callers pass valid UTF-8.
  static GrammarExpr literal(std::string_view utf8);
  static GrammarExpr rule(std::string name, SourcePos position = {});
  static GrammarExpr sequence(std::vector<GrammarExpr> parts);
  static GrammarExpr alternation(std::vector<GrammarExpr> choices);
  static GrammarExpr repeat(GrammarExpr body, int32_t min_count, int32_t max_count);
  static GrammarExpr optional(GrammarExpr body) { return repeat(std::move(body), 0, 1); }
  static GrammarExpr star(GrammarExpr body) { return repeat(std::move(body), 0, kUnbounded); }
  static GrammarExpr plus(GrammarExpr body) { return repeat(std::move(body), 1, kUnbounded); }
};

enum class GrammarElementType : uint8_t {
  kEnd,      // ends an alternative
  kChars,    // value: index of a CharClass in Grammar::char_class()
  kRuleRef,  // value: rule id
};

struct GrammarElement {
  GrammarElementType type = GrammarElementType::kEnd;
  int32_t value = 0;
};

// The flat grammar the matcher runs. Immutable once built; share it between requests (const, thread-safe).
// Invariants (checked by GrammarBuilder): every rule has >= 1 alternative; every alternative ends with kEnd;
// every reference names a rule; no left recursion; every rule can finish.
class Grammar {
 public:
  int32_t root_rule() const { return root_rule_; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_names_.size()); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  // Start positions (into elements()) of the rule's alternatives. An alternative at `p` runs until the
  // kEnd element after it; an empty alternative is a kEnd at p.
  std::span<const int32_t> alternatives(int32_t rule) const {
    return {alternative_starts_.data() + rule_alternatives_[rule],
            alternative_starts_.data() + rule_alternatives_[rule + 1]};
  }
  const std::vector<GrammarElement>& elements() const { return elements_; }
  const CharClass& char_class(int32_t id) const { return char_classes_[id]; }
  int32_t num_char_classes() const { return static_cast<int32_t>(char_classes_.size()); }

  // GBNF text of the grammar (helper rules included); parse_gbnf() of it gives the same language.
  std::string to_gbnf() const;

 private:
  friend class GrammarBuilder;
  std::vector<std::string> rule_names_;      // [num_rules]
  std::vector<int32_t> rule_alternatives_;   // [num_rules + 1], offsets into alternative_starts_
  std::vector<int32_t> alternative_starts_;  // [num alternatives], positions in elements_
  std::vector<GrammarElement> elements_;     // all alternatives, each ended by kEnd
  std::vector<CharClass> char_classes_;      // deduplicated
  int32_t root_rule_ = 0;
};

// Limits that keep a user's grammar from exhausting memory while it is lowered.
struct GrammarLimits {
  int32_t max_repeat = 10000;             // the largest m or n in x{m,n}
  size_t max_elements = size_t{1} << 21;  // elements of the flat grammar, helper rules included
};

// Collects named rules, then lowers them into a Grammar.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(GrammarLimits limits = {}) : limits_(limits) {}

  bool has_rule(std::string_view name) const { return rules_.count(std::string(name)) != 0; }
  // Defines `name`. A second definition of the same name is an error naming both positions.
  Status add_rule(const std::string& name, GrammarExpr expr, SourcePos position = {});
  // A rule name not used so far, made from `base` ("value", "value-2", ...); for generated rules.
  std::string unique_name(std::string_view base);

  // Lowers every rule and checks the result (see the file comment). The builder may be reused afterwards
  // only for another build() of the same rules.
  Result<Grammar> build(std::string_view root_name = "root") const;

 private:
  struct RuleDef {
    GrammarExpr expr;
    SourcePos position;
    size_t order = 0;
  };
  GrammarLimits limits_;
  std::map<std::string, RuleDef, std::less<>> rules_;
  std::map<std::string, int, std::less<>> name_counters_;
};

// Whether a name may be written in GBNF: [A-Za-z0-9_-]+.
bool is_gbnf_rule_name(std::string_view name);

}  // namespace tachyon
