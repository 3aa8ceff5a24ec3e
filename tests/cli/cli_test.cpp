// The `tachyon` binary as a user runs it: generated text alone on stdout, statistics on stderr,
// and every bad input answered by one error line and a non-zero exit — never a crash.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// Without --device the run says where it runs in its first line: the CPU here unless this build
// has CUDA and a GPU is visible (the device run sees cuda:0); --device cpu forces the CPU, silently.
TEST(Cli, DeviceAutoIsSaidFirst) {
  const std::string model = testing::source_dir() + "/models/tachyon-demo";
  auto r = run_command(tachyon_binary() + " generate -m " + model + " -p 'func main() {' -n 4 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string first = r.err.substr(0, r.err.find('\n'));
  // A GPU is there when the driver's device node is (and this build has CUDA, which the line says).
  const bool gpu = fs::exists("/dev/nvidia0") && first.find("a build without CUDA") == std::string::npos;
  EXPECT_EQ(first.rfind(gpu ? "tachyon: device cuda:0 (" : "tachyon: device cpu (", 0), 0u) << r.err;
  EXPECT_NE(first.find("--device cpu|cuda"), std::string::npos) << first;
  auto forced =
      run_command(tachyon_binary() + " generate -m " + model + " -p 'func main() {' -n 4 --temp 0 --device cpu");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.err.find("tachyon: device"), std::string::npos) << forced.err;
  if (!gpu) {
    EXPECT_EQ(forced.out, r.out);  // both ran on the CPU
  }
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + model + " -p x --device tpu"), "--device 'tpu'");
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

// Mixtures of experts: the experts, top-k and active parameters; a large synthetic preset is
// described from its shape without making its weights.
TEST(Cli, InfoDescribesExperts) {
  auto r = run_command(tachyon_binary() + " info " + fixture("qwen2-moe"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("8 per sparse layer (2 of 2 layers), top 4, expert ffn 32, shared expert ffn 48"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("active:"), std::string::npos) << r.out;
  auto s = run_command(tachyon_binary() + " info synthetic:qwen3-30b-a3b");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  // Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active (the model card's figures).
  EXPECT_NE(s.out.find("parameters:     30532."), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("active:         3353."), std::string::npos) << s.out;
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


// Every line of the file is a request of its own; the batched results, printed in file order,
// equal each line generated alone (batch-invariant kernels make that exact).
TEST(Cli, PromptsFileRunsEveryLineAndMatchesSingleRuns) {
  const std::string dir = testing::scratch_dir("prompts");
  const std::vector<std::string> lines = {"func main() {", "The quick brown fox", "", "import os\nimport sys",
                                          "SELECT * FROM", "Once upon a time, in a land far away, there lived"};
  {
    std::ofstream f(dir + "/prompts.txt");
    for (const auto& l : lines) f << (l == "import os\nimport sys" ? "import os" : l) << "\n";
  }
  const std::string model = testing::source_dir() + "/models/tachyon-demo";
  const std::string common = " -n 12 --temp 0 --batch-invariant --max-model-len 128 ";
  auto r = run_command(tachyon_binary() + " generate -m " + model + common + "--prompts-file " + dir + "/prompts.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  size_t pos = 0;
  while (pos < r.out.size()) {
    const size_t end = r.out.find('\n', pos);
    rows.push_back(nlohmann::json::parse(r.out.substr(pos, end - pos)));
    pos = end + 1;
  }
  ASSERT_EQ(rows.size(), lines.size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].at("index").get<size_t>(), i);
    const std::string line = lines[i] == "import os\nimport sys" ? "import os" : lines[i];
    if (line.empty()) continue;  // the empty line is a BOS-only prompt; -p '' is the same request
    auto alone = run_command(tachyon_binary() + " generate -m " + model + common + "-p '" + line + "'");
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(rows[i].at("text").get<std::string>() + "\n", alone.out) << "line " << i;
  }
  expect_clean_error(run_command(tachyon_binary() + " generate -m " + model + " --prompts-file " + dir + "/missing.txt"),
                     "missing.txt");
}

TEST(Cli, BenchWritesJsonAndOneSummaryLine) {
  const std::string dir = testing::scratch_dir("bench");
  auto r = run_command(tachyon_binary() +
                       " bench -m synthetic:tiny --workload throughput -n 12 --mean-prompt-len 64 --mean-output-len 8 "
                       "--shared-prefix 0.5 --max-batched-tokens 64 --json " + dir + "/t.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("throughput: 12 requests", 0), 0u) << r.out;
  std::ifstream f(dir + "/t.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("ttft_ms").at("count").get<int>(), 12);
  EXPECT_GT(j.at("output_tokens").get<int>(), 12);
  EXPECT_GT(j.at("prefix_hit_rate").get<double>(), 0.0);  // half of every prompt is shared
  EXPECT_LE(j.at("prefix_hit_rate").get<double>(), 1.0);
  for (const char* key : {"requests_per_s", "output_tokens_per_s", "schedule_fraction", "kv_peak_fraction"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  auto l = run_command(tachyon_binary() + " bench -m synthetic:tiny --workload latency --prompt-len 16 --output-len 8 " +
                       "--iters 2 --json " + dir + "/l.json");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_EQ(l.out.rfind("latency: prompt 16, output 8", 0), 0u) << l.out;
  std::ifstream lf(dir + "/l.json");
  const auto lj = nlohmann::json::parse(lf);
  EXPECT_EQ(lj.at("output_tokens").get<int>(), 16);
  EXPECT_GT(lj.at("decode_tokens_per_s").get<double>(), 0.0);
  expect_clean_error(run_command(tachyon_binary() + " bench -m synthetic:tiny --workload nope"), "workload");
  expect_clean_error(run_command(tachyon_binary() + " bench -m synthetic:tiny --kv-cache-mem lots"), "size");
}

// Speculative decoding in bench: the acceptance, the draft's and the verify forward's shares of a
// step, and the speed against the same requests decoded plainly in the same process (not run with
// --no-spec-baseline).
TEST(Cli, BenchReportsSpeculationAgainstPlainDecodeInTheSameProcess) {
  const std::string dir = testing::scratch_dir("bench-spec");
  const std::string demo = testing::source_dir() + "/models/tachyon-demo";
  const std::string base = tachyon_binary() + " bench -m " + demo + " --draft-model " + demo +
                           "-draft --spec-k 3 --workload latency --prompt-len 24 --output-len 24 --iters 2 "
                           "--prompt-text " + testing::source_dir() + "/tests/data/eval/prose.txt";
  auto r = run_command(base + " --json " + dir + "/s.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("plain decode in this process"), std::string::npos) << r.out;
  std::ifstream f(dir + "/s.json");
  const auto s = nlohmann::json::parse(f).at("spec");
  EXPECT_GT(s.at("verify_steps").get<int>(), 0);
  EXPECT_GT(s.at("mean_accepted_length").get<double>(), 0.0);
  const double draft = s.at("draft_time_fraction").get<double>(), verify = s.at("verify_time_fraction").get<double>();
  EXPECT_GT(draft, 0.0);
  EXPECT_GT(verify, 0.0);
  EXPECT_LE(draft + verify, 1.0);
  EXPECT_GT(s.at("plain").at("decode_tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(s.at("speedup").get<double>(), 0.0);
  auto n = run_command(base + " --no-spec-baseline --json " + dir + "/n.json");
  ASSERT_EQ(n.exit_code, 0) << n.err;
  EXPECT_EQ(n.out.find("plain decode in this process"), std::string::npos) << n.out;
  std::ifstream nf(dir + "/n.json");
  EXPECT_FALSE(nlohmann::json::parse(nf).at("spec").contains("speedup"));
}

// Named drafts (--draft-model NAME=PATH, repeated): bench reports each draft and each prompt kind
// (the target directory's domains.safetensors tells them); several unnamed drafts are an error.
TEST(Cli, BenchReportsEachNamedDraftAndPromptKind) {
  const std::string dir = testing::scratch_dir("bench-named");
  const std::string demo = testing::source_dir() + "/models/tachyon-demo";
  const std::string base = tachyon_binary() + " bench -m " + demo + " --spec-k 3 --workload latency --prompt-len 24 "
                           "--output-len 24 --iters 2 --no-spec-baseline --prompt-text " + testing::source_dir() +
                           "/tests/data/eval/code.txt";
  auto r = run_command(base + " --draft-model code=" + demo + "-draft --draft-model prose=" + demo + "-draft --json " +
                       dir + "/s.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  proposer draft:code:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  prompt kind "), std::string::npos) << r.out;
  std::ifstream f(dir + "/s.json");
  const auto s = nlohmann::json::parse(f).at("spec");
  EXPECT_EQ(s.at("proposer").get<std::string>(), "draft:code,draft:prose");
  const auto& by = s.at("by_proposer");
  ASSERT_TRUE(by.contains("draft:code") && by.contains("draft:prose")) << by.dump();
  EXPECT_EQ(by.at("draft:code").at("verify_steps").get<int>() + by.at("draft:prose").at("verify_steps").get<int>(),
            s.at("verify_steps").get<int>());
  ASSERT_TRUE(s.contains("by_kind")) << s.dump();
  int kind_steps = 0;
  for (const auto& [kind, c] : s.at("by_kind").items()) kind_steps += c.at("verify_steps").get<int>();
  EXPECT_EQ(kind_steps, s.at("verify_steps").get<int>());
  // Without the classifier there is no breakdown by kind.
  auto off = run_command(base + " --draft-model " + demo + "-draft --draft-classifier none --json " + dir + "/o.json");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  std::ifstream of(dir + "/o.json");
  EXPECT_FALSE(nlohmann::json::parse(of).at("spec").contains("by_kind"));
  expect_clean_error(run_command(base + " --draft-model " + demo + "-draft --draft-model " + demo + "-draft"),
                     "name each");
  // --draft: every request names one draft (the oracle choice for a file of one kind).
  auto named = run_command(base + " --draft-model code=" + demo + "-draft --draft-model prose=" + demo +
                           "-draft --draft prose --json " + dir + "/p.json");
  ASSERT_EQ(named.exit_code, 0) << named.err;
  std::ifstream pf(dir + "/p.json");
  const auto p = nlohmann::json::parse(pf).at("spec").at("by_proposer");
  EXPECT_EQ(p.at("draft:code").at("verify_steps").get<int>(), 0) << p.dump();
  EXPECT_GT(p.at("draft:prose").at("verify_steps").get<int>(), 0) << p.dump();
  expect_clean_error(run_command(base + " --draft-model code=" + demo + "-draft --draft poetry"), "draft \"poetry\"");
  expect_clean_error(run_command(base + " --draft-model code=" + demo + "-draft --draft-model code=" + demo + "-draft"),
                     "two draft models are named 'code'");
  expect_clean_error(run_command(base + " --draft-model " + demo + "-draft --draft-classifier " + demo +
                                 "/model.safetensors"),
                     "not a domain profiles file");
}

}  // namespace
}  // namespace tachyon
