// Speculative-decoding flags shared by generate, bench and serve: `--spec-ngram`,
// `--draft-model [NAME=]PATH` (repeatable: named drafts a request picks by name, or the engine by
// the prompt's kind), `--draft-classifier PATH|none`, `--spec-heads PATH`, `--spec-k N`,
// `--spec-k-max N`, `--spec-tree N`, `--spec-prior on|off`; and the lines that report what it did.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace tachyon::cli {

struct SpecArgs {
  bool ngram = false;
  std::vector<std::string> draft_models;  // --draft-model [NAME=]PATH, in order
  std::string classifier;                 // --draft-classifier: a profiles file, "none", or empty (the target's)
  std::string heads;  // --spec-heads PATH
  int k = -1;      // -1: not given (the controller picks K)
  int k_max = 8;
  int tree = 0;    // --spec-tree N: token trees of up to N nodes
  std::string prior = "off";  // --spec-prior on|off: new requests' draft length from their population
  std::string request_draft;  // --draft NAME: every request names this draft (GenerationParams::draft)
};

void add_spec_options(CLI::App& cmd, SpecArgs& args);
using SpecModels = std::vector<std::unique_ptr<LoadedModel>>;
// Fills options.spec from the flags; with --draft-model, loads each draft into `drafts` (which
// must outlive the engine) and checks that it shares the target's tokenizer. The prompt-kind
// classifier is --draft-classifier's file, else the target directory's domains.safetensors when
// there is one (speculation on), else none.
Status apply_spec_options(const SpecArgs& args, const LoadedModel& target, SpecModels& drafts, EngineOptions& options);
// "speculative (draft, K dynamic <= 8): 812 proposed, 534 accepted (65.8%), 2.31 accepted per step",
// then with several proposers or a classifier one "  draft:code: ..." line each; or an empty string
// when speculation is off.
std::string spec_summary(const EngineOptions& options, const SpecStats& stats);

}  // namespace tachyon::cli
