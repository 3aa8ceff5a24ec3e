// Argument errors as a hostile or careless user makes them: each is refused with exit code 1 and
// one short error line on stderr (never CLI11's codes 104-114, never a value silently saturated,
// wrapped or ignored).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace tachyon {
namespace {

using testing::run_command;
using testing::tachyon_binary;

std::string fixture(const std::string& name) { return testing::source_dir() + "/tests/fixtures/models/" + name; }

// Exit code 1, exactly one line on stderr starting "tachyon: error: " and naming `needle`, no
// longer than a screen line or two.
void expect_one_error_line(const std::string& args, const std::string& needle) {
  const auto r = run_command(tachyon_binary() + " " + args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
  EXPECT_EQ(r.err.rfind("tachyon: error: ", 0), 0u) << args << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  EXPECT_LT(r.err.size(), 300u) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
}

TEST(CliArgs, ParseErrorsExitWithOneAndOneLine) {
  const std::string gen = "generate -m " + fixture("llama") + " --prompt-ids 1 ";
  expect_one_error_line(gen + "--bogus", "--bogus");
  expect_one_error_line(gen + "-n -1", "-1");
  expect_one_error_line(gen + "-n abc", "abc");
  expect_one_error_line("info", "model");  // a required option missing
  expect_one_error_line("nosuchcommand", "subcommand");
  // --help still prints and succeeds.
  EXPECT_EQ(run_command(tachyon_binary() + " generate --help").exit_code, 0);
}

TEST(CliArgs, SeedsBeyond64BitsAreRefusedNotSaturated) {
  const std::string gen = "generate -m " + fixture("llama") + " --prompt-ids 1 -n 1 ";
  expect_one_error_line(gen + "--seed 18446744073709551616", "18446744073709551616");
  expect_one_error_line(gen + "--seed 1e30", "1e30");
  expect_one_error_line(gen + "--seed -1", "seed");
  const auto r = run_command(tachyon_binary() + " " + gen + "--seed 18446744073709551615");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("seed 18446744073709551615"), std::string::npos) << r.err;
}

TEST(CliArgs, OutOfRangeValuesAreRefused) {
  const std::string gen = "generate -m " + fixture("llama") + " -n 1 ";
  expect_one_error_line(gen + "--prompt-ids '[1099511627776]'", "1099511627776");
  expect_one_error_line(gen + "--prompt-ids '[-1]'", "-1");
  for (const char* fraction : {"0", "-1", "NaN", "5", "inf"}) {
    expect_one_error_line(gen + "--prompt-ids 1 --kv-cache-fraction " + fraction, "--kv-cache-fraction");
  }
  expect_one_error_line(gen + "--prompt-ids 1 --spec-ngram --spec-k -1", "--spec-k");
  expect_one_error_line(gen + "--prompt-ids 1 --spec-ngram --spec-k 0", "--spec-k");
}

TEST(CliArgs, DirectoriesAndOverlongLinesAreErrors) {
  const std::string dir = testing::scratch_dir("cli-args");
  const std::string model = testing::source_dir() + "/models/tachyon-demo";
  expect_one_error_line("generate -m " + model + " -n 1 -f " + dir, "directory");
  expect_one_error_line("generate -m " + model + " -n 1 --prompts-file " + dir, "directory");
  // A line far longer than the context: its JSON line says why, and stderr has one error line.
  {
    std::ofstream f(dir + "/prompts.txt");
    f << "hello\n";
    for (int i = 0; i < 5000; ++i) f << "word ";
    f << "\n";
  }
  const auto r = run_command(tachyon_binary() + " generate -m " + model +
                             " -n 1 --temp 0 --max-model-len 64 --prompts-file " + dir + "/prompts.txt");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tachyon: error: 1 of 2 prompts failed; line 2"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"index\":1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tachyon
