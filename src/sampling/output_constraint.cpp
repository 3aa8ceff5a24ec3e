#include "sampling/output_constraint.h"

#include <fmt/format.h>

#include "sampling/gbnf_parser.h"
#include "sampling/json_schema.h"
#include "sampling/regex_grammar.h"

namespace tachyon {

namespace {

Result<Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error(ErrorCode::kInvalidArgument, "choice: the list of choices is empty");
  std::vector<GrammarExpr> alternatives;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) return make_error(ErrorCode::kInvalidArgument, "choice {} is the empty string", i);
    alternatives.push_back(GrammarExpr::literal(choices[i]));
  }
  GrammarBuilder builder;
  TACHYON_RETURN_IF_ERROR(builder.add_rule("root", GrammarExpr::alternation(std::move(alternatives))));
  return builder.build("root");
}

}  // namespace

const char* OutputConstraint::kind_name() const {
  switch (kind) {
    case Kind::kJsonObject: return "json_object";
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kRegex: return "regex";
    case Kind::kGbnf: return "grammar";
    case Kind::kChoice: return "choice";
  }
  return "?";
}

std::string OutputConstraint::cache_key() const {
  std::string key = fmt::format("{}|{}|{}|", kind_name(), strict ? 1 : 0, max_whitespace);
  if (kind == Kind::kChoice) {
    for (const std::string& c : choices) key += fmt::format("{}:{}", c.size(), c);  // length-prefixed: unambiguous
  } else {
    key += text;
  }
  return key;
}

Result<Grammar> compile_output_constraint(const OutputConstraint& c) {
  if (c.max_whitespace < 0 || c.max_whitespace > 1000) {
    return make_error(ErrorCode::kInvalidArgument, "whitespace bound {} must be in [0, 1000]", c.max_whitespace);
  }
  JsonSchemaOptions jo;
  jo.strict = c.strict;
  jo.max_whitespace = c.max_whitespace;
  Result<Grammar> g = [&]() -> Result<Grammar> {
    switch (c.kind) {
      case OutputConstraint::Kind::kJsonObject: return json_object_grammar(jo);
      case OutputConstraint::Kind::kJsonSchema: return json_schema_to_grammar(std::string_view(c.text), jo);
      case OutputConstraint::Kind::kRegex: return regex_to_grammar(c.text);
      case OutputConstraint::Kind::kGbnf: return parse_gbnf(c.text);
      case OutputConstraint::Kind::kChoice: return choice_grammar(c.choices);
    }
    return make_error(ErrorCode::kInvalidArgument, "unknown output constraint");
  }();
  if (!g.ok() && g.status().code() != ErrorCode::kInvalidArgument) {
    // Limits and unsupported constructs are the request's problem too: a 400, not a 500.
    return make_error(ErrorCode::kInvalidArgument, "{}: {}", c.kind_name(), g.status().message());
  }
  if (!g.ok()) return g.status().with_context(c.kind_name());
  return g;
}

Result<std::shared_ptr<const Grammar>> GrammarCache::get(const OutputConstraint& constraint) {
  return get(constraint.cache_key(), [&] { return compile_output_constraint(constraint); });
}

Result<std::shared_ptr<const Grammar>> GrammarCache::get(std::string key,
                                                         const std::function<Result<Grammar>()>& compile) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      entries_.splice(entries_.begin(), entries_, it->second);
      ++hits_;
      return it->second->second;
    }
    ++misses_;
  }
  TACHYON_ASSIGN_OR_RETURN(Grammar grammar, compile());
  auto shared = std::make_shared<const Grammar>(std::move(grammar));
  if (capacity_ == 0) return shared;
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // compiled meanwhile
  entries_.emplace_front(key, shared);
  index_.emplace(std::move(key), entries_.begin());
  if (entries_.size() > capacity_) {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
  return shared;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

int64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

}  // namespace tachyon
