// Options and helpers shared by the subcommands: model loading with a clear error line,
// thread count, log level.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "model/model_loader.h"

namespace tachyon::cli {

struct CommonOptions {
  std::string model;
  int threads = 0;  // 0 = all cores
  bool verbose = false;
};

void add_common_options(CLI::App& cmd, CommonOptions& options);
// Applies threads/verbosity; loads the model.
Result<LoadedModel> load(const CommonOptions& options, DType synthetic_dtype = DType::kBF16);
// Prints "tachyon: error: <status>" and returns 1.
int report(const Status& status);

}  // namespace tachyon::cli
