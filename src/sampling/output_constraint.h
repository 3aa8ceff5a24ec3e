// OutputConstraint: what a request asks its output to be (JSON, JSON matching a schema, a regex, a
// GBNF grammar, one of a list of strings), as the API fields and the CLI flags say it; compiled into
// the Grammar that constrained decoding follows (GenerationParams::grammar).
//
// GrammarCache keeps compiled grammars by their constraint, so that requests asking the same (an
// application's one schema, sent with every request) share one Grammar and compile it once: a
// schema of a few hundred rules takes milliseconds to compile, longer than a decode step. Bounded
// (least recently used out) and thread-safe: the server's connection threads share one.
// Must never: abort on a user's constraint (every problem is a kInvalidArgument Status that says
// which constraint and why, for a 400), or hand out a Grammar that a later request could change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "sampling/grammar.h"

namespace tachyon {

struct OutputConstraint {
  enum class Kind : uint8_t {
    kJsonObject,  // any JSON object (response_format json_object)
    kJsonSchema,  // JSON valid under `text`, a JSON Schema (sampling/json_schema.h)
    kRegex,       // the whole output matches `text` (sampling/regex_grammar.h)
    kGbnf,        // GBNF grammar text, root rule "root" (sampling/gbnf_parser.h)
    kChoice,      // exactly one of `choices`
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  // JSON Schema: strict (OpenAI structured outputs: additionalProperties absent means false) or
  // not (vLLM's guided_json: extra properties allowed where the schema does not forbid them).
  bool strict = true;
  // JSON kinds: blanks allowed between two JSON tokens (bounded, so that a model cannot loop on
  // blanks); 0 for compact JSON.
  int max_whitespace = 20;

  // "json_schema", "regex", ...: for messages.
  const char* kind_name() const;
  // Everything that makes two constraints compile alike, as one string.
  std::string cache_key() const;
};

Result<Grammar> compile_output_constraint(const OutputConstraint& constraint);

class GrammarCache {
 public:
  GrammarCache() : GrammarCache(64) {}
  explicit GrammarCache(size_t capacity) : capacity_(capacity) {}
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  // The compiled grammar of `constraint`: from the cache, or compiled now (outside the lock) and
  // kept. Errors are not cached.
  Result<std::shared_ptr<const Grammar>> get(const OutputConstraint& constraint);
  // The same for grammars made otherwise (tool calls): `key` must say everything `compile` depends
  // on, and not collide with an OutputConstraint's cache_key() (start it with another kind name).
  Result<std::shared_ptr<const Grammar>> get(std::string key, const std::function<Result<Grammar>()>& compile);

  size_t size() const;
  int64_t hits() const;
  int64_t misses() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

}  // namespace tachyon
