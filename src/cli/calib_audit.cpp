// `tachyon calib-audit --calib FILE... --eval FILE... [--ngram 13] [--max-ngram-overlap F]
// [--max-paragraph-overlap F] [--json OUT]`: how much of the evaluation text the calibration text
// already holds (quant/calib_audit.h: identical documents, shared source files from MANIFEST.tsv,
// shared paragraphs, shared n-grams). Prints one summary line and up to five examples; exits 1
// when an overlap is past its limit (or a file cannot be read), 0 when the sets are disjoint.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "quant/calib_audit.h"

namespace tachyon::cli {

namespace {

struct AuditArgs {
  std::vector<std::string> calib;
  std::vector<std::string> eval;
  AuditOptions options;
  std::string json;
};

Result<std::vector<AuditDocument>> read_all(const std::vector<std::string>& paths, const char* what) {
  std::vector<AuditDocument> docs;
  for (const std::string& p : paths) {
    auto d = read_audit_document(p);
    if (!d.ok()) return d.status().with_context(what);
    docs.push_back(std::move(d).value());
  }
  return docs;
}

int run_audit(const AuditArgs& a) {
  auto calib = read_all(a.calib, "--calib");
  if (!calib.ok()) return report(calib.status());
  auto eval = read_all(a.eval, "--eval");
  if (!eval.ok()) return report(eval.status());
  const OverlapReport r = audit_overlap(*calib, *eval, a.options);
  const bool fails = r.fails(a.options);
  std::printf("%s: %s\n", fails ? "overlap" : "disjoint", r.summary(a.options).c_str());
  for (const std::string& d : r.identical_documents) std::printf("  identical: %s\n", d.c_str());
  for (const std::string& s : r.shared_sources) std::printf("  shared source: %s\n", s.c_str());
  for (const std::string& e : r.examples) std::printf("  e.g. %s\n", e.c_str());
  if (!a.json.empty()) {
    nlohmann::json j = {{"calib", a.calib},
                        {"eval", a.eval},
                        {"ngram", a.options.ngram},
                        {"identical_documents", r.identical_documents},
                        {"shared_sources", r.shared_sources},
                        {"eval_paragraphs", r.eval_paragraphs},
                        {"shared_paragraphs", r.shared_paragraphs},
                        {"paragraph_overlap", r.paragraph_overlap()},
                        {"eval_ngrams", r.eval_ngrams},
                        {"shared_ngrams", r.shared_ngrams},
                        {"ngram_overlap", r.ngram_overlap()},
                        {"limits", {{"max_paragraph_overlap", a.options.max_paragraph_overlap},
                                    {"max_ngram_overlap", a.options.max_ngram_overlap}}},
                        {"passes", !fails}};
    std::ofstream f(a.json, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f) return report(make_error(ErrorCode::kIo, "--json {}: cannot write", a.json));
  }
  if (fails) {
    std::fprintf(stderr, "tachyon: calib-audit: the calibration text overlaps the evaluation text past the limits\n");
    return 1;
  }
  return 0;
}

}  // namespace

void add_calib_audit(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<AuditArgs>();
  CLI::App* cmd = app.add_subcommand("calib-audit", "check that calibration text and evaluation text are disjoint "
                                     "(identical files, shared source files, paragraphs, n-grams)");
  cmd->add_option("--calib", args->calib, "calibration text files")->required();
  cmd->add_option("--eval", args->eval, "evaluation text files")->required();
  cmd->add_option("--ngram", args->options.ngram, "words per n-gram (default 13)")->check(CLI::Range(1, 64));
  cmd->add_option("--max-ngram-overlap", args->options.max_ngram_overlap,
                  "largest share of the evaluation text's distinct n-grams the calibration text may hold (default "
                  "0.01)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-paragraph-overlap", args->options.max_paragraph_overlap,
                  "largest share of the evaluation text's paragraphs found verbatim in the calibration text (default "
                  "0.01)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--json", args->json, "also write the numbers here");
  cmd->callback([args, &run]() { run = [args]() { return run_audit(*args); }; });
}

}  // namespace tachyon::cli
