// The subcommands of `tachyon`. Each registers its options on the CLI11 app and returns the
// process exit code when run: 0 on success, 1 on a reported error (one line on stderr).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tachyon::cli {

// Registers a subcommand; `run` is set to its body when the subcommand is chosen.
void add_generate(CLI::App& app, std::function<int()>& run);
void add_bench(CLI::App& app, std::function<int()>& run);
void add_info(CLI::App& app, std::function<int()>& run);
void add_tokenize(CLI::App& app, std::function<int()>& run);
void add_serve(CLI::App& app, std::function<int()>& run);
void add_chat(CLI::App& app, std::function<int()>& run);
void add_router(CLI::App& app, std::function<int()>& run);
void add_quantize(CLI::App& app, std::function<int()>& run);
void add_perplexity(CLI::App& app, std::function<int()>& run);
void add_calib_audit(CLI::App& app, std::function<int()>& run);
void add_report(CLI::App& app, std::function<int()>& run);

}  // namespace tachyon::cli
