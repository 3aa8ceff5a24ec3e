// Structured-output flags shared by generate and bench: `--json-schema FILE`, `--json-object` (any JSON
// object), `--regex PATTERN`, `--grammar FILE` (GBNF, root rule "root"), `--choice TEXT`
// (repeatable: the output is one of them); at most one kind per run. And, for models without a
// tokenizer (synthetic ones), the made-up vocabulary that grammar masks then walk.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "model/model_loader.h"
#include "sampling/grammar.h"

namespace tachyon::cli {

struct ConstraintArgs {
  std::string json_schema_file;
  bool json_object = false;
  std::string regex;
  std::string grammar_file;
  std::vector<std::string> choices;
  int max_whitespace = 20;  // --json-whitespace: blanks between JSON tokens
};

void add_constraint_options(CLI::App& cmd, ConstraintArgs& args);
// The compiled grammar the flags ask for, or null when none; kInvalidArgument naming the flag
// when two kinds are given or the file or the constraint is bad.
Result<std::shared_ptr<const Grammar>> constraint_grammar(const ConstraintArgs& args);
// With a grammar: options.grammar_vocabulary becomes the model's tokenizer's (what the engine would
// build itself; the bench runs its engine without the tokenizer), or, for a model without one, a
// synthetic vocabulary of the model's size whose EOS is the model's first EOS id when it has one.
Status apply_constraint_vocabulary(const LoadedModel& model, bool constrained, EngineOptions& options);

}  // namespace tachyon::cli
