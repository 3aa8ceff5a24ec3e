// --quant through the CLI: the bench JSON names the weight format, generation runs on quantized
// weights, and what is not supported is a clean error.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "test_util.h"

namespace tachyon {
namespace {

using testing::run_command;
using testing::tachyon_binary;

std::string demo() { return testing::source_dir() + "/models/tachyon-demo"; }

TEST(QuantCli, BenchReportsTheWeightFormat) {
  const std::string dir = testing::scratch_dir("quant_bench");
  for (const auto& [args, format] : {std::pair<std::string, std::string>{"", "dense"},
                                     {"--quant int8", "int8"},
                                     {"--quant int4 --quant-group 64", "int4-g64"}}) {
    auto r = run_command(tachyon_binary() + " bench -m " + demo() + " " + args +
                         " --workload latency --prompt-len 16 --output-len 4 --iters 1 -t 2 --json " + dir + "/b.json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream f(dir + "/b.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("weight_format").get<std::string>(), format);
    if (format != "dense") {
      EXPECT_NE(j.at("weights").get<std::string>().find(format.substr(0, 4)), std::string::npos);
    }
  }
}

TEST(QuantCli, GenerateWithInt4) {
  auto r = run_command(tachyon_binary() + " generate -m " + demo() +
                       " --quant int4 -p 'Once upon a time' -n 8 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

// Random weights are guarded for finiteness only: rounding moves their logits by nats, and a
// benchmark of `synthetic:` must run every module in the format it names. The bundled model's
// ternary rounding, which destroys it, returns modules to 16 bits with a warning.
TEST(QuantCli, TheGuardKeepsSyntheticModelsInTheirFormat) {
  auto r = run_command(tachyon_binary() + " generate -m synthetic:tiny --quant int4 --prompt-len 4 -n 2 --temp 0 -v -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("int4 g128 weights: logits finite"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("back to 16 bits"), std::string::npos) << r.err;
  auto t = run_command(tachyon_binary() + " generate -m " + demo() + " --quant ternary -p 'hi' -n 2 --temp 0 -t 2");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.err.find("modules back to 16 bits"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("more (KL now"), std::string::npos) << t.err;  // 12 named, then a count
}

TEST(QuantCli, UnsupportedChoicesAreCleanErrors) {
  auto bad = run_command(tachyon_binary() + " generate -m " + demo() + " --quant int3 -p hi -n 1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--quant"), std::string::npos) << bad.err;
  auto group = run_command(tachyon_binary() + " generate -m " + demo() + " --quant int4 --quant-group 48 -p hi -n 1");
  EXPECT_NE(group.exit_code, 0);
  EXPECT_NE(group.err.find("--quant-group"), std::string::npos) << group.err;
}

}  // namespace
}  // namespace tachyon
