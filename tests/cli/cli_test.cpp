// The `tachyon` binary as a user runs it: generated text alone on stdout, statistics on stderr,
// and every bad input answered by one error line and a non-zero exit — never a crash.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "test_util.h"

namespace tachyon {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::tachyon_binary;

std::string fixture(const std::string& name) { return testing::source_dir() + "/tests/fixtures/models/" + name; }

void expect_clean_error(const testing::CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("tachyon: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty() || r.out == "\n") << r.out;
}

TEST(Cli, GenerateStoriesPrintsOnlyTextOnStdout) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  auto r = run_command(tachyon_binary() + " generate -m " + shared +
                       "/models/stories260K -p 'Once upon a time' -n 24 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(", there was a little girl named Lily.", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
}

TEST(Cli, TokenizePrintsJsonIds) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  auto r = run_command(tachyon_binary() + " tokenize -m " + shared + "/models/stories260K -p 'Once upon a time'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[1, 403, 407, 261, 378]\n");
}

TEST(Cli, InfoDescribesModel) {
  auto r = run_command(tachyon_binary() + " info " + fixture("qwen3"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen3ForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q/k norm"), std::string::npos) << r.out;
  auto s = run_command(tachyon_binary() + " info synthetic:qwen2.5-0.5b");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("494."), std::string::npos) << s.out;
}

TEST(Cli, SyntheticGenerateWithPromptIds) {
  auto r = run_command(tachyon_binary() + " generate -m synthetic:tiny --prompt-ids '[1, 2, 3]' -n 5 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int count = 0;
  for (char c : r.out) count += c == ' ';
  EXPECT_EQ(count, 4) << r.out;  // five ids
}

TEST(Cli, BadInputsGiveOneErrorLine) {
  const std::string dir = testing::scratch_dir("cli");
  // Truncated GGUF.
  {
    std::ifstream in(fixture("llama") + "/model.gguf", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir + "/truncated.gguf", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + dir + "/truncated.gguf --prompt-ids 1 -n 2"),
                     "truncated.gguf");
  // Unknown architecture.
  fs::create_directories(dir + "/unknown");
  std::ofstream(dir + "/unknown/config.json") << R"({"architectures": ["GPTBigCodeForCausalLM"], "vocab_size": 10})";
  expect_clean_error(run_command(tachyon_binary() + " info " + dir + "/unknown"), "GPTBigCodeForCausalLM");
  // Missing file.
  expect_clean_error(run_command(tachyon_binary() + " info " + dir + "/nothing-here.gguf"), "nothing-here.gguf");
  // Prompt longer than the context (128 tokens for the fixtures).
  std::string ids = "1";
  for (int i = 0; i < 200; ++i) ids += ",5";
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + fixture("llama") + " --prompt-ids '" + ids + "' -n 2"),
                     "context");
  // Token id outside the vocabulary.
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + fixture("llama") + " --prompt-ids '[1, 99999]' -n 2"),
                     "99999");
  // Absurd sampling parameters.
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + fixture("llama") + " --prompt-ids 1 --temp -1"),
                     "temperature");
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + fixture("llama") + " --prompt-ids 1 --top-p 7"),
                     "top_p");
  // A model without a tokenizer asked for text.
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + fixture("llama") + " -p hello"), "tokenizer");
}

}  // namespace
}  // namespace tachyon
