// Speculative-decoding flags shared by generate, bench and serve: `--spec-ngram`,
// `--draft-model PATH`, `--spec-heads PATH`, `--spec-k N`, `--spec-k-max N`, `--spec-tree N`; and the lines that report
// what it did.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace tachyon::cli {

struct SpecArgs {
  bool ngram = false;
  std::string draft_model;
  std::string heads;  // --spec-heads PATH
  int k = -1;      // -1: not given (the controller picks K)
  int k_max = 8;
  int tree = 0;    // --spec-tree N: token trees of up to N nodes
};

void add_spec_options(CLI::App& cmd, SpecArgs& args);
// Fills options.spec from the flags; with --draft-model, loads the draft into `draft` (which must
// outlive the engine) and checks that it shares the target's tokenizer.
Status apply_spec_options(const SpecArgs& args, const LoadedModel& target, std::unique_ptr<LoadedModel>& draft,
                          EngineOptions& options);
// "speculative (draft, K dynamic <= 8): 812 proposed, 534 accepted (65.8%), 2.31 accepted per step"
// or an empty string when speculation is off.
std::string spec_summary(const EngineOptions& options, const SpecStats& stats);

}  // namespace tachyon::cli
