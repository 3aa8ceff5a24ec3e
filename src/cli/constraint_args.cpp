#include "cli/constraint_args.h"

#include "core/mapped_file.h"
#include "sampling/output_constraint.h"
#include "sampling/synthetic_vocabulary.h"
#include "sampling/token_trie.h"

namespace tachyon::cli {

void add_constraint_options(CLI::App& cmd, ConstraintArgs& a) {
  cmd.add_option("--json-schema", a.json_schema_file, "structured output: JSON valid under the JSON Schema in FILE");
  cmd.add_flag("--json-object", a.json_object, "structured output: any JSON object");
  cmd.add_option("--regex", a.regex, "structured output: text that the regex matches whole");
  cmd.add_option("--grammar", a.grammar_file, "structured output: the GBNF grammar in FILE (root rule \"root\")");
  cmd.add_option("--choice", a.choices, "structured output: exactly one of these strings (repeatable)");
  cmd.add_option("--json-whitespace", a.max_whitespace,
                 "blanks allowed between JSON tokens under --json-object / --json-schema (default 20; 0: compact)")
      ->check(CLI::Range(0, 1000));
}

Result<std::shared_ptr<const Grammar>> constraint_grammar(const ConstraintArgs& a) {
  std::vector<OutputConstraint> asked;
  std::vector<const char*> flags;
  const auto ask = [&](OutputConstraint c, const char* flag) {
    c.max_whitespace = a.max_whitespace;
    asked.push_back(std::move(c));
    flags.push_back(flag);
  };
  if (!a.json_schema_file.empty()) {
    TACHYON_ASSIGN_OR_RETURN(std::string schema, read_text_file(a.json_schema_file));
    ask({OutputConstraint::Kind::kJsonSchema, std::move(schema), {}}, "--json-schema");
  }
  if (a.json_object) ask({OutputConstraint::Kind::kJsonObject, "", {}}, "--json-object");
  if (!a.regex.empty()) ask({OutputConstraint::Kind::kRegex, a.regex, {}}, "--regex");
  if (!a.grammar_file.empty()) {
    TACHYON_ASSIGN_OR_RETURN(std::string grammar, read_text_file(a.grammar_file));
    ask({OutputConstraint::Kind::kGbnf, std::move(grammar), {}}, "--grammar");
  }
  if (!a.choices.empty()) ask({OutputConstraint::Kind::kChoice, "", a.choices}, "--choice");
  if (asked.empty()) return std::shared_ptr<const Grammar>();
  if (asked.size() > 1) {
    return make_error(ErrorCode::kInvalidArgument, "{} and {}: give one kind of structured output", flags[0], flags[1]);
  }
  Result<Grammar> g = compile_output_constraint(asked[0]);
  if (!g.ok()) return g.status().with_context(flags[0]);
  return std::make_shared<const Grammar>(std::move(g).value());
}

Status apply_constraint_vocabulary(const LoadedModel& m, bool constrained, EngineOptions& options) {
  if (!constrained) return Status::Ok();
  const int32_t vocab = m.model->config().vocab_size;
  if (m.tokenizer) {
    TACHYON_ASSIGN_OR_RETURN(options.grammar_vocabulary, grammar_vocabulary(*m.tokenizer, vocab, m.eos_token_ids));
    return Status::Ok();
  }
  TACHYON_ASSIGN_OR_RETURN(SyntheticVocabulary made, synthetic_vocabulary(vocab));
  int32_t eos = made.eos_id;
  if (!m.eos_token_ids.empty() && m.eos_token_ids[0] >= 0 && m.eos_token_ids[0] < vocab) {
    eos = m.eos_token_ids[0];
    std::swap(made.token_bytes[static_cast<size_t>(eos)], made.token_bytes[static_cast<size_t>(made.eos_id)]);
  }
  const int32_t eos_ids[] = {eos};
  TACHYON_ASSIGN_OR_RETURN(options.grammar_vocabulary, TokenTrie::build(std::move(made.token_bytes), eos_ids));
  return Status::Ok();
}

}  // namespace tachyon::cli
