// Entry point of the `tachyon` command: parses the subcommand and runs it. Errors reach the
// user as one line on stderr and a non-zero exit code, never as a crash.
#include <cstdio>
#include <exception>
#include <functional>

#include "cli/commands.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"tachyon: fast LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tachyon 0.1.0"));
  std::function<int()> run;
  tachyon::cli::add_generate(app, run);
  tachyon::cli::add_bench(app, run);
  tachyon::cli::add_info(app, run);
  tachyon::cli::add_tokenize(app, run);
  tachyon::cli::add_serve(app, run);
  tachyon::cli::add_chat(app, run);
  tachyon::cli::add_router(app, run);
  tachyon::cli::add_quantize(app, run);
  tachyon::cli::add_perplexity(app, run);
  tachyon::cli::add_calib_audit(app, run);
  tachyon::cli::add_report(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; any other parse error is a user error: one line
    // and exit code 1, as for every error a command reports.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "tachyon: error: %s\n", e.what());
    return 1;
  }
  try {
    return run ? run() : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tachyon: error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tachyon: error: %s\n", e.what());
    return 1;
  }
}
