// `tachyon report FILE... -o DIR [--title T]`: an offline HTML page (DIR/index.html: inline SVG
// plots and tables, no JavaScript) from `tachyon bench --json` results, with the quantize,
// perplexity and calib-audit JSON files beside them as tables (report/report.h says which figure
// reads which keys). Reads JSON only, runs nothing; a missing or corrupt file is one error line.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "report/report.h"

namespace tachyon::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> files;
  std::string dir;
  tachyon::report::ReportOptions options;
};

int run_report(const ReportArgs& a) {
  if (Status s = tachyon::report::write_report(a.files, a.dir, a.options); !s.ok()) return report(s);
  std::printf("wrote %s (%zu input file%s)\n", (std::filesystem::path(a.dir) / "index.html").string().c_str(),
              a.files.size(), a.files.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

void add_report(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "write an offline HTML report with plots from `tachyon bench --json` "
                                     "files (and quantize / perplexity / calib-audit JSON)");
  cmd->add_option("files", args->files, "JSON files: one result each, or an array of results")->required();
  cmd->add_option("-o,--output", args->dir, "directory to write index.html into (created)")->required();
  cmd->add_option("--title", args->options.title, "the page's title");
  cmd->callback([args, &run]() { run = [args]() { return run_report(*args); }; });
}

}  // namespace tachyon::cli
