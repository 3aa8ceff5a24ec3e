// GrammarBuilder: lowering GrammarExpr rules to the flat Grammar and the checks that keep the matcher from
// looping (left recursion) or stalling (rules that can never finish, alternatives that can never match).
// Also CharClass set algebra, the UTF-8 helpers and Grammar::to_gbnf().
#include "sampling/grammar.h"

#include <algorithm>
#include <set>
#include <utility>

namespace tachyon {

// ---- UTF-8 --------------------------------------------------------------------------------------------

std::optional<uint32_t> decode_utf8(std::string_view bytes, size_t& pos) {
  if (pos >= bytes.size()) return std::nullopt;
  const auto b0 = static_cast<unsigned char>(bytes[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  size_t length = 0;
  uint32_t cp = 0;
  uint32_t min_cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2, cp = b0 & 0x1F, min_cp = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3, cp = b0 & 0x0F, min_cp = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4, cp = b0 & 0x07, min_cp = 0x10000;
  } else {
    return std::nullopt;
  }
  if (pos + length > bytes.size()) return std::nullopt;
  for (size_t i = 1; i < length; ++i) {
    const auto b = static_cast<unsigned char>(bytes[pos + i]);
    if ((b & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min_cp || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
  pos += length;
  return cp;
}

// ---- CharClass ----------------------------------------------------------------------------------------

CharClass CharClass::range(uint32_t first, uint32_t last) {
  CharClass c;
  c.add(first, last);
  return c;
}

void CharClass::add(uint32_t first, uint32_t last) {
  last = std::min(last, kMaxCodePoint);
  if (first > last) return;
  // Merge with every range that overlaps or touches [first, last].
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), first,
                             [](const CharRange& r, uint32_t value) { return r.last + 1 < value; });
  auto end = it;
  while (end != ranges_.end() && end->first <= last + 1) {
    first = std::min(first, end->first);
    last = std::max(last, end->last);
    ++end;
  }
  it = ranges_.erase(it, end);
  ranges_.insert(it, CharRange{first, last});
}

void CharClass::add(const CharClass& other) {
  for (const CharRange& r : other.ranges_) add(r.first, r.last);
}

CharClass CharClass::complement() const {
  CharClass out;
  uint32_t next = 0;
  for (const CharRange& r : ranges_) {
    if (r.first > next) out.ranges_.push_back({next, r.first - 1});
    next = r.last + 1;
  }
  if (next <= kMaxCodePoint) out.ranges_.push_back({next, kMaxCodePoint});
  return out;
}

CharClass CharClass::minus(const CharClass& other) const {
  CharClass keep = other.complement();
  CharClass out;
  // Intersection of two sorted range lists.
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < keep.ranges_.size()) {
    const uint32_t lo = std::max(ranges_[i].first, keep.ranges_[j].first);
    const uint32_t hi = std::min(ranges_[i].last, keep.ranges_[j].last);
    if (lo <= hi) out.ranges_.push_back({lo, hi});
    if (ranges_[i].last < keep.ranges_[j].last)
      ++i;
    else
      ++j;
  }
  return out;
}

bool CharClass::contains(uint32_t cp) const { return intersects(cp, cp); }

bool CharClass::intersects(uint32_t first, uint32_t last) const {
  // The first range that ends at or after `first`.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), first,
                             [](const CharRange& r, uint32_t value) { return r.last < value; });
  return it != ranges_.end() && it->first <= last;
}

std::optional<uint32_t> CharClass::single_member() const {
  if (ranges_.size() == 1 && ranges_[0].first == ranges_[0].last) return ranges_[0].first;
  return std::nullopt;
}

// ---- GrammarExpr --------------------------------------------------------------------------------------

GrammarExpr GrammarExpr::chars(CharClass char_class) {
  GrammarExpr e;
  e.kind = Kind::kChars;
  e.char_class = std::move(char_class);
  return e;
}

GrammarExpr GrammarExpr::literal(std::string_view utf8) {
  GrammarExpr e;
  size_t pos = 0;
  while (pos < utf8.size()) {
    std::optional<uint32_t> cp = decode_utf8(utf8, pos);
    if (!cp) cp = static_cast<unsigned char>(utf8[pos++]);
    e.children.push_back(code_point(*cp));
  }
  if (e.children.size() == 1) return std::move(e.children[0]);
  return e;
}

GrammarExpr GrammarExpr::rule(std::string name, SourcePos position) {
  GrammarExpr e;
  e.kind = Kind::kRuleRef;
  e.rule_name = std::move(name);
  e.position = position;
  return e;
}

GrammarExpr GrammarExpr::sequence(std::vector<GrammarExpr> parts) {
  if (parts.size() == 1) return std::move(parts[0]);
  GrammarExpr e;
  e.children = std::move(parts);
  return e;
}

GrammarExpr GrammarExpr::alternation(std::vector<GrammarExpr> choices) {
  if (choices.size() == 1) return std::move(choices[0]);
  GrammarExpr e;
  e.kind = Kind::kAlternation;
  e.children = std::move(choices);
  return e;
}

GrammarExpr GrammarExpr::repeat(GrammarExpr body, int32_t min_count, int32_t max_count) {
  GrammarExpr e;
  e.kind = Kind::kRepeat;
  e.children.push_back(std::move(body));
  e.min_count = min_count;
  e.max_count = max_count;
  return e;
}

bool is_gbnf_rule_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// ---- GrammarBuilder -----------------------------------------------------------------------------------

namespace {

std::string describe_position(SourcePos pos) {
  return pos.known() ? fmt::format(" at {}:{}", pos.line, pos.column) : std::string();
}

using Alternative = std::vector<GrammarElement>;  // without its kEnd

// The state of one build(): rule ids, lowered alternatives and deduplicated character classes.
class Lowering {
 public:
  Lowering(const GrammarLimits& limits, std::set<std::string> taken) : limits_(limits), taken_(std::move(taken)) {}

  int32_t add_rule_name(const std::string& name) {
    const auto id = static_cast<int32_t>(names_.size());
    names_.push_back(name);
    ids_[name] = id;
    rules_.emplace_back();
    return id;
  }
  std::optional<int32_t> rule_id(std::string_view name) const {
    auto it = ids_.find(name);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  // rules_[id] = the alternatives of `expr`.
  Status lower_rule(int32_t id, const GrammarExpr& expr) {
    std::vector<Alternative> alternatives;
    if (expr.kind == GrammarExpr::Kind::kAlternation) {
      for (const GrammarExpr& choice : expr.children) {
        Alternative alt;
        TACHYON_RETURN_IF_ERROR(emit(choice, id, alt));
        alternatives.push_back(std::move(alt));
      }
    } else {
      Alternative alt;
      TACHYON_RETURN_IF_ERROR(emit(expr, id, alt));
      alternatives.push_back(std::move(alt));
    }
    for (const Alternative& alt : alternatives) TACHYON_RETURN_IF_ERROR(count_elements(alt.size() + 1));
    rules_[id] = std::move(alternatives);
    return Status::Ok();
  }

  std::vector<std::string>& names() { return names_; }
  std::vector<std::vector<Alternative>>& rules() { return rules_; }
  std::vector<CharClass>& classes() { return classes_; }

 private:
  Status count_elements(size_t n) {
    elements_ += n;
    if (elements_ > limits_.max_elements) {
      return make_error(ErrorCode::kOutOfRange,
                        "grammar too large: more than {} elements once repetitions are expanded", limits_.max_elements);
    }
    return Status::Ok();
  }

  int32_t class_id(const CharClass& c) {
    auto it = class_ids_.find(c.ranges());
    if (it != class_ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(classes_.size());
    classes_.push_back(c);
    class_ids_.emplace(c.ranges(), id);
    return id;
  }

  std::string helper_name(int32_t owner) {
    const std::string& base = names_[owner];
    // Helper names hang off the user's rule name so that errors and to_gbnf() stay readable.
    std::string root = base;
    for (int n = counters_[root] + 1;; ++n) {
      std::string candidate = fmt::format("{}-{}", root, n);
      if (!taken_.count(candidate)) {
        counters_[root] = n;
        taken_.insert(candidate);
        return candidate;
      }
    }
  }

  // A rule holding `expr`, returned as a reference element.
  Result<GrammarElement> helper_rule(const GrammarExpr& expr, int32_t owner) {
    const int32_t id = add_rule_name(helper_name(owner));
    TACHYON_RETURN_IF_ERROR(lower_rule(id, expr));
    return GrammarElement{GrammarElementType::kRuleRef, id};
  }

  // `expr` as one element: a class or a reference as it is, anything else through a helper rule.
  Result<GrammarElement> as_element(const GrammarExpr& expr, int32_t owner) {
    if (expr.kind == GrammarExpr::Kind::kChars) {
      return GrammarElement{GrammarElementType::kChars, class_id(expr.char_class)};
    }
    if (expr.kind == GrammarExpr::Kind::kRuleRef) {
      std::optional<int32_t> id = rule_id(expr.rule_name);
      if (!id) {
        return make_error(ErrorCode::kInvalidArgument, "undefined rule '{}' referenced{} in rule '{}'", expr.rule_name,
                          describe_position(expr.position), names_[owner]);
      }
      return GrammarElement{GrammarElementType::kRuleRef, *id};
    }
    return helper_rule(expr, owner);
  }

  // Appends `expr` to `out` as a run of elements (helper rules for alternations and repetitions).
  Status emit(const GrammarExpr& expr, int32_t owner, Alternative& out) {
    switch (expr.kind) {
      case GrammarExpr::Kind::kChars:
      case GrammarExpr::Kind::kRuleRef: {
        TACHYON_ASSIGN_OR_RETURN(GrammarElement e, as_element(expr, owner));
        out.push_back(e);
        return Status::Ok();
      }
      case GrammarExpr::Kind::kSequence:
        for (const GrammarExpr& part : expr.children) TACHYON_RETURN_IF_ERROR(emit(part, owner, out));
        return Status::Ok();
      case GrammarExpr::Kind::kAlternation: {
        TACHYON_ASSIGN_OR_RETURN(GrammarElement e, helper_rule(expr, owner));
        out.push_back(e);
        return Status::Ok();
      }
      case GrammarExpr::Kind::kRepeat: return emit_repeat(expr, owner, out);
    }
    return Status::Ok();
  }

  // x{m,n}: m copies of x, then n - m nested optional rules (o1 ::= x | "", o2 ::= x o1 | "", ...), which
  // keeps the parse unambiguous; x{m,}: m copies, then s ::= x s | "".
  Status emit_repeat(const GrammarExpr& expr, int32_t owner, Alternative& out) {
    const int32_t min_count = expr.min_count;
    const int32_t max_count = expr.max_count;
    if (min_count < 0 || (max_count != GrammarExpr::kUnbounded && max_count < min_count)) {
      return make_error(ErrorCode::kInvalidArgument, "repetition {{{},{}}} in rule '{}': the bounds are reversed",
                        min_count, max_count, names_[owner]);
    }
    if (min_count > limits_.max_repeat || max_count > limits_.max_repeat) {
      return make_error(ErrorCode::kOutOfRange, "repetition count {} in rule '{}' is over the limit of {}",
                        std::max(min_count, max_count), names_[owner], limits_.max_repeat);
    }
    if (max_count == 0) return Status::Ok();
    const GrammarExpr& body = expr.children.at(0);
    TACHYON_ASSIGN_OR_RETURN(GrammarElement element, as_element(body, owner));
    TACHYON_RETURN_IF_ERROR(count_elements(static_cast<size_t>(min_count)));
    for (int32_t i = 0; i < min_count; ++i) out.push_back(element);
    if (max_count == GrammarExpr::kUnbounded) {
      const int32_t star = add_rule_name(helper_name(owner));
      rules_[star] = {Alternative{element, GrammarElement{GrammarElementType::kRuleRef, star}}, Alternative{}};
      TACHYON_RETURN_IF_ERROR(count_elements(5));
      out.push_back({GrammarElementType::kRuleRef, star});
      return Status::Ok();
    }
    int32_t previous = -1;
    for (int32_t k = 1; k <= max_count - min_count; ++k) {
      const int32_t opt = add_rule_name(helper_name(owner));
      Alternative first{element};
      if (previous >= 0) first.push_back({GrammarElementType::kRuleRef, previous});
      rules_[opt] = {std::move(first), Alternative{}};
      TACHYON_RETURN_IF_ERROR(count_elements(5));
      previous = opt;
    }
    if (previous >= 0) out.push_back({GrammarElementType::kRuleRef, previous});
    return Status::Ok();
  }

  const GrammarLimits& limits_;
  std::set<std::string> taken_;
  std::map<std::string, int> counters_;
  std::vector<std::string> names_;
  std::map<std::string, int32_t, std::less<>> ids_;
  std::vector<std::vector<Alternative>> rules_;
  std::map<std::vector<CharRange>, int32_t> class_ids_;
  std::vector<CharClass> classes_;
  size_t elements_ = 0;
};

// Rules that can finish (derive some string), as a fixpoint over the alternatives.
std::vector<bool> productive_rules(const std::vector<std::vector<Alternative>>& rules,
                                   const std::vector<CharClass>& classes) {
  std::vector<bool> productive(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (productive[r]) continue;
      for (const Alternative& alt : rules[r]) {
        const bool ok = std::all_of(alt.begin(), alt.end(), [&](const GrammarElement& e) {
          return e.type == GrammarElementType::kChars ? !classes[e.value].empty() : bool(productive[e.value]);
        });
        if (ok) {
          productive[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return productive;
}

// Rules that can match the empty string.
std::vector<bool> nullable_rules(const std::vector<std::vector<Alternative>>& rules) {
  std::vector<bool> nullable(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nullable[r]) continue;
      for (const Alternative& alt : rules[r]) {
        const bool ok = std::all_of(alt.begin(), alt.end(), [&](const GrammarElement& e) {
          return e.type == GrammarElementType::kRuleRef && nullable[e.value];
        });
        if (ok) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

// A cycle in "rule A may call rule B before consuming a character", as rule ids; empty when there is none.
std::vector<int32_t> find_left_recursion(const std::vector<std::vector<Alternative>>& rules,
                                         const std::vector<bool>& nullable) {
  const size_t n = rules.size();
  std::vector<std::vector<int32_t>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Alternative& alt : rules[r]) {
      for (const GrammarElement& e : alt) {
        if (e.type != GrammarElementType::kRuleRef) break;
        edges[r].push_back(e.value);
        if (!nullable[e.value]) break;
      }
    }
  }
  // Iterative depth-first search; a grey node met again closes a cycle.
  enum Color : uint8_t { kWhite, kGrey, kBlack };
  std::vector<uint8_t> color(n, kWhite);
  std::vector<std::pair<int32_t, size_t>> stack;  // (rule, next edge)
  for (size_t start = 0; start < n; ++start) {
    if (color[start] != kWhite) continue;
    stack.push_back({static_cast<int32_t>(start), 0});
    color[start] = kGrey;
    while (!stack.empty()) {
      auto& [rule, next] = stack.back();
      if (next == edges[rule].size()) {
        color[rule] = kBlack;
        stack.pop_back();
        continue;
      }
      const int32_t to = edges[rule][next++];
      if (color[to] == kGrey) {
        std::vector<int32_t> cycle;
        size_t i = stack.size();
        while (i > 0 && stack[i - 1].first != to) --i;
        for (size_t k = i - 1; k < stack.size(); ++k) cycle.push_back(stack[k].first);
        cycle.push_back(to);
        return cycle;
      }
      if (color[to] == kWhite) {
        color[to] = kGrey;
        stack.push_back({to, 0});
      }
    }
  }
  return {};
}

}  // namespace

Status GrammarBuilder::add_rule(const std::string& name, GrammarExpr expr, SourcePos position) {
  auto it = rules_.find(name);
  if (it != rules_.end()) {
    return make_error(ErrorCode::kInvalidArgument, "rule '{}' is defined twice{} (first{})", name,
                      describe_position(position), describe_position(it->second.position));
  }
  rules_.emplace(name, RuleDef{std::move(expr), position, rules_.size()});
  return Status::Ok();
}

std::string GrammarBuilder::unique_name(std::string_view base) {
  std::string root(base);
  if (!has_rule(root) && !name_counters_.count(root)) {
    name_counters_[root] = 1;
    return root;
  }
  for (int n = name_counters_[root] + 1;; ++n) {
    std::string candidate = fmt::format("{}{}", root, n);
    if (!has_rule(candidate)) {
      name_counters_[root] = n;
      return candidate;
    }
  }
}

Result<Grammar> GrammarBuilder::build(std::string_view root_name) const {
  if (!rules_.count(std::string(root_name))) {
    return make_error(ErrorCode::kInvalidArgument, "the grammar has no '{}' rule", root_name);
  }
  std::set<std::string> taken;
  for (const auto& [name, def] : rules_) taken.insert(name);
  Lowering lowering(limits_, std::move(taken));
  // User rules first, in the order they were added, so their ids are stable and errors read in order.
  std::vector<const std::pair<const std::string, RuleDef>*> ordered;
  for (const auto& entry : rules_) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(), [](auto* a, auto* b) { return a->second.order < b->second.order; });
  for (auto* entry : ordered) lowering.add_rule_name(entry->first);
  for (size_t i = 0; i < ordered.size(); ++i) {
    TACHYON_RETURN_IF_ERROR(lowering.lower_rule(static_cast<int32_t>(i), ordered[i]->second.expr));
  }
  auto& names = lowering.names();
  auto& rules = lowering.rules();
  auto& classes = lowering.classes();
  // Surrogates never occur in UTF-8; a class of only surrogates can never match.
  const CharClass surrogates = CharClass::range(0xD800, 0xDFFF);
  for (CharClass& c : classes) c = c.minus(surrogates);

  const auto root = static_cast<int32_t>(std::find(names.begin(), names.end(), root_name) - names.begin());
  auto position_of = [&](int32_t rule) {
    auto it = rules_.find(names[rule]);
    return it == rules_.end() ? std::string() : describe_position(it->second.position);
  };

  const std::vector<bool> nullable = nullable_rules(rules);
  const std::vector<int32_t> cycle = find_left_recursion(rules, nullable);
  if (!cycle.empty()) {
    std::string path;
    for (size_t i = 0; i < cycle.size(); ++i) path += (i ? " -> " : "") + names[cycle[i]];
    return make_error(ErrorCode::kInvalidArgument,
                      "rule '{}'{} is left-recursive ({}): it can reach itself without consuming a character "
                      "(direct or indirect left recursion, or a repetition of something that can be empty)",
                      names[cycle[0]], position_of(cycle[0]), path);
  }

  // Drop alternatives that can never finish, so that every parse stack the matcher holds can complete.
  const std::vector<bool> productive = productive_rules(rules, classes);
  const std::vector<std::vector<Alternative>> lowered_alternatives = rules;  // before the drop, for errors
  for (auto& alternatives : rules) {
    std::erase_if(alternatives, [&](const Alternative& alt) {
      return !std::all_of(alt.begin(), alt.end(), [&](const GrammarElement& e) {
        return e.type == GrammarElementType::kChars ? !classes[e.value].empty() : bool(productive[e.value]);
      });
    });
  }
  // Every rule the user defined that is reachable from the root must be able to finish (a helper rule may not:
  // regex's [] matches nothing, and the alternatives holding it were dropped above). The error names a rule
  // whose failure is its own (it needs only itself or dead classes), not one that merely depends on it.
  std::vector<bool> reachable(rules.size(), false);
  std::vector<int32_t> work{root};
  std::vector<int32_t> dead;
  reachable[root] = true;
  while (!work.empty()) {
    const int32_t r = work.back();
    work.pop_back();
    if (!productive[r] && (r == root || rules_.count(names[r]))) dead.push_back(r);
    for (const Alternative& alt : lowered_alternatives[r]) {
      for (const GrammarElement& e : alt) {
        if (e.type == GrammarElementType::kRuleRef && !reachable[e.value]) {
          reachable[e.value] = true;
          work.push_back(e.value);
        }
      }
    }
  }
  if (!dead.empty()) {
    int32_t culprit = dead.front();
    for (int32_t r : dead) {
      bool own = true;
      for (const Alternative& alt : lowered_alternatives[r]) {
        for (const GrammarElement& e : alt) {
          own = own && (e.type != GrammarElementType::kRuleRef || e.value == r || productive[e.value]);
        }
      }
      if (own) {
        culprit = r;
        break;
      }
    }
    std::string dependents;
    if (culprit != root && !productive[root]) dependents = fmt::format(" (and so cannot '{}')", names[root]);
    return make_error(ErrorCode::kInvalidArgument,
                      "rule '{}'{} can never finish{}: every alternative needs the rule itself again or a character "
                      "class that matches nothing",
                      names[culprit], position_of(culprit), dependents);
  }

  Grammar g;
  g.rule_names_ = std::move(names);
  g.char_classes_ = std::move(classes);
  g.root_rule_ = root;
  g.rule_alternatives_.push_back(0);
  for (const auto& alternatives : rules) {
    for (const Alternative& alt : alternatives) {
      g.alternative_starts_.push_back(static_cast<int32_t>(g.elements_.size()));
      g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
      g.elements_.push_back({GrammarElementType::kEnd, 0});
    }
    g.rule_alternatives_.push_back(static_cast<int32_t>(g.alternative_starts_.size()));
  }
  return g;
}

// ---- Grammar::to_gbnf ---------------------------------------------------------------------------------

namespace {

void append_escaped(std::string& out, uint32_t cp, bool in_class) {
  switch (cp) {
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\\': out += "\\\\"; return;
    default: break;
  }
  if (in_class && (cp == ']' || cp == '[' || cp == '^' || cp == '-')) {
    out.push_back('\\');
    out.push_back(static_cast<char>(cp));
  } else if (!in_class && cp == '"') {
    out += "\\\"";
  } else if (cp < 0x20 || cp == 0x7F) {
    out += fmt::format("\\x{:02X}", cp);
  } else if (cp >= 0x80 && cp < 0xA0) {
    out += fmt::format("\\u{:04X}", cp);
  } else if (cp >= 0xD800 && cp <= 0xDFFF) {
    out += fmt::format("\\u{:04X}", cp);
  } else {
    append_utf8(out, cp);
  }
}

void append_class(std::string& out, const CharClass& c) {
  if (c == CharClass::any() || c == CharClass::any().minus(CharClass::range(0xD800, 0xDFFF))) {
    out += ".";
    return;
  }
  const CharClass complement = c.complement().minus(CharClass::range(0xD800, 0xDFFF));
  const bool negate = complement.ranges().size() < c.ranges().size();
  const CharClass& shown = negate ? complement : c;
  out += negate ? "[^" : "[";
  for (const CharRange& r : shown.ranges()) {
    append_escaped(out, r.first, true);
    if (r.last != r.first) {
      if (r.last > r.first + 1) out += "-";
      append_escaped(out, r.last, true);
    }
  }
  out += "]";
}

}  // namespace

std::string Grammar::to_gbnf() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    out += rule_names_[r] + " ::=";
    const auto alts = alternatives(r);
    if (alts.empty()) out += " []";  // never produced by GrammarBuilder (unreachable dead rules keep none)
    for (size_t a = 0; a < alts.size(); ++a) {
      if (a > 0) out += " |";
      int32_t p = alts[a];
      if (elements_[p].type == GrammarElementType::kEnd) out += " \"\"";
      while (elements_[p].type != GrammarElementType::kEnd) {
        const GrammarElement& e = elements_[p];
        if (e.type == GrammarElementType::kRuleRef) {
          out += " " + rule_names_[e.value];
          ++p;
          continue;
        }
        // Runs of single code points print as one string literal.
        if (char_classes_[e.value].single_member()) {
          out += " \"";
          while (elements_[p].type == GrammarElementType::kChars && char_classes_[elements_[p].value].single_member()) {
            append_escaped(out, *char_classes_[elements_[p].value].single_member(), false);
            ++p;
          }
          out += "\"";
          continue;
        }
        out += " ";
        append_class(out, char_classes_[e.value]);
        ++p;
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace tachyon
