#include "cli/common.h"

#include <cstdio>

#include "core/log.h"
#include "core/thread_pool.h"

namespace tachyon::cli {

void add_common_options(CLI::App& cmd, CommonOptions& options) {
  cmd.add_option("-m,--model", options.model,
                 "HF directory, GGUF file, llama2.c checkpoint (or its directory), or synthetic:PRESET")
      ->required();
  cmd.add_option("-t,--threads", options.threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd.add_flag("-v,--verbose", options.verbose, "log what is loaded and which kernels run");
}

Result<LoadedModel> load(const CommonOptions& options, DType synthetic_dtype) {
  if (options.verbose) set_log_level(LogLevel::kInfo);
  if (options.threads > 0) set_num_threads(options.threads);
  LoadOptions lo;
  lo.path = options.model;
  lo.synthetic_dtype = synthetic_dtype;
  return load_model(lo);
}

int report(const Status& status) {
  std::fprintf(stderr, "tachyon: error: %s\n", status.to_string().c_str());
  return 1;
}

}  // namespace tachyon::cli
