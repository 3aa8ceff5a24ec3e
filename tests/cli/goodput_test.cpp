// Goodput: the pure count of requests within TTFT/TPOT targets (cli/goodput.h) on hand-made
// timings, bench/serve_load.py's copy of it against the same cases, and `tachyon bench
// --slo-ttft/--slo-tpot` end to end: its figures agree with each other, and targets that no run can
// miss or meet give all or none; no other timing is asserted.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/goodput.h"
#include "test_util.h"

namespace tachyon {
namespace {

using cli::compute_goodput;
using cli::describe_slo;
using cli::Goodput;
using cli::RequestLatency;
using cli::SloTargets;
using testing::run_command;
using testing::tachyon_binary;

// Seconds: {ttft, tpot, output tokens}.
const std::vector<RequestLatency> kRequests = {
    {0.5, 0.04, 10},  // within both
    {1.5, 0.04, 10},  // TTFT too long
    {0.5, 0.06, 10},  // TPOT too long
    {1.0, 0.05, 10},  // exactly on both targets: within
    {0.2, 99.0, 1},   // one token: no TPOT, whatever the field holds
    {2.0, 0.0, 1},    // one token, TTFT too long
    {0.1, 0.0, 0},    // no token at all: never within
};

struct Case {
  SloTargets slo;
  size_t meeting;
};

// The expected counts over kRequests, worked out by hand from the comments above.
const std::vector<Case> kCases = {
    {{1.0, 0.05}, 3},   // both targets
    {{1.0, 0.0}, 4},    // TTFT only
    {{0.0, 0.05}, 5},   // TPOT only
    {{0.1, 0.01}, 0},   // none met
    {{0.0, 0.0}, 6},    // no target: every request that produced a token
};

TEST(Goodput, CountsRequestsWithinTheTargets) {
  const double duration = 2.0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "ttft " << c.slo.ttft << " tpot " << c.slo.tpot);
    const Goodput g = compute_goodput(kRequests, c.slo, duration);
    EXPECT_EQ(g.requests, kRequests.size());
    EXPECT_EQ(g.requests_meeting, c.meeting);
    EXPECT_DOUBLE_EQ(g.fraction, static_cast<double>(c.meeting) / static_cast<double>(kRequests.size()));
    EXPECT_DOUBLE_EQ(g.requests_per_s, static_cast<double>(c.meeting) / duration);
  }
}

TEST(Goodput, OneTokenRequestsMeetTheTpotTargetTrivially) {
  const SloTargets slo{0.0, 0.001};
  EXPECT_TRUE(cli::meets_slo({5.0, 0.0, 1}, slo));
  EXPECT_TRUE(cli::meets_slo({5.0, 1e9, 1}, slo));
  EXPECT_FALSE(cli::meets_slo({5.0, 0.002, 2}, slo));
  EXPECT_TRUE(cli::meets_slo({5.0, 0.001, 2}, slo));
  EXPECT_TRUE(cli::meets_slo({1e-9, 0.0, 1}, SloTargets{1e-9, 0.0}));
  EXPECT_FALSE(cli::meets_slo({2e-9, 0.0, 1}, SloTargets{1e-9, 0.0}));
}

TEST(Goodput, EmptyRunHasNoGoodput) {
  for (double duration : {0.0, 3.0}) {
    const Goodput g = compute_goodput({}, SloTargets{1.0, 0.05}, duration);
    EXPECT_EQ(g.requests, 0u);
    EXPECT_EQ(g.requests_meeting, 0u);
    EXPECT_EQ(g.fraction, 0.0);
    EXPECT_EQ(g.requests_per_s, 0.0);
  }
  // A run of no measurable length reports no rate rather than a division by zero.
  EXPECT_EQ(compute_goodput(kRequests, SloTargets{1.0, 0.0}, 0.0).requests_per_s, 0.0);
}

TEST(Goodput, DescribesOnlyTheGivenTargets) {
  EXPECT_EQ(describe_slo({1.0, 0.05}), "TTFT 1 s, TPOT 50 ms");
  EXPECT_EQ(describe_slo({2.5, 0.0}), "TTFT 2.5 s");
  EXPECT_EQ(describe_slo({0.0, 0.0125}), "TPOT 12.5 ms");
  EXPECT_EQ(describe_slo({}), "");
  EXPECT_FALSE(SloTargets{}.any());
  EXPECT_TRUE((SloTargets{0.0, 0.05}.any()));
}

// bench/serve_load.py carries its own copy (it runs without the C++ tree): same cases, same answers.
TEST(Goodput, ServeLoadScriptAgreesWithTheCli) {
  const std::string venv = testing::source_dir() + "/.venv/bin/python";
  const std::string python = std::filesystem::exists(venv) ? venv : "python3";
  if (run_command(python + " -c pass").exit_code != 0) GTEST_SKIP() << "no Python; skipping";
  const std::string dir = testing::scratch_dir("goodput");
  nlohmann::json cases = nlohmann::json::array();
  for (const Case& c : kCases) {
    nlohmann::json requests = nlohmann::json::array();
    for (const RequestLatency& r : kRequests) requests.push_back({r.ttft, r.tpot, r.output_tokens});
    cases.push_back({{"ttft", c.slo.ttft}, {"tpot", c.slo.tpot}, {"requests", requests}});
  }
  cases.push_back({{"ttft", 1.0}, {"tpot", 0.05}, {"requests", nlohmann::json::array()}});
  std::ofstream(dir + "/cases.json") << cases.dump();
  const std::string script =
      "import json, sys\n"
      "sys.path.insert(0, sys.argv[1] + '/bench')\n"
      "import serve_load\n"
      "out = []\n"
      "for c in json.load(open(sys.argv[2])):\n"
      "    latencies = [tuple(r) for r in c['requests']] + ([None] if c['requests'] else [])\n"
      "    out.append({'goodput': serve_load.goodput(latencies, c['ttft'], c['tpot'], 2.0),\n"
      "                'describe': serve_load.describe_slo(c['ttft'], c['tpot'])})\n"
      "r = serve_load.Result()\n"
      "r.start, r.token_times = 1.0, [1.5, 1.5, 1.75]\n"
      "failed = serve_load.Result()\n"
      "failed.error = RuntimeError('reset')\n"
      "print(json.dumps({'cases': out, 'latency': r.latency(), 'failed': failed.latency()}))\n";
  std::ofstream(dir + "/check.py") << script;
  auto r = run_command(python + " " + dir + "/check.py " + testing::source_dir() + " " + dir + "/cases.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  // Measured as bench measures: TTFT to the first token, TPOT over the tokens after it.
  EXPECT_EQ(result.at("latency"), nlohmann::json({0.5, 0.125, 3}));
  EXPECT_TRUE(result.at("failed").is_null());
  const auto& out = result.at("cases");
  ASSERT_EQ(out.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].dump());
    const SloTargets slo{cases[i]["ttft"].get<double>(), cases[i]["tpot"].get<double>()};
    std::vector<RequestLatency> requests;
    for (const auto& q : cases[i]["requests"]) {
      requests.push_back({q[0].get<double>(), q[1].get<double>(), q[2].get<int64_t>()});
    }
    const Goodput want = compute_goodput(requests, slo, 2.0);
    const auto& got = out[i]["goodput"];
    // The script also counts one failed request (None) wherever there are requests: never within.
    const size_t failed = requests.empty() ? 0 : 1;
    EXPECT_EQ(got["requests"].get<size_t>(), want.requests + failed);
    EXPECT_EQ(got["requests_meeting"].get<size_t>(), want.requests_meeting);
    EXPECT_DOUBLE_EQ(got["requests_per_s"].get<double>(), want.requests_per_s);
    EXPECT_DOUBLE_EQ(got["fraction"].get<double>(),
                     requests.empty() ? 0.0 : static_cast<double>(want.requests_meeting) / (requests.size() + failed));
    EXPECT_EQ(got["slo_ttft_s"].is_null(), slo.ttft == 0.0);
    EXPECT_EQ(got["slo_tpot_s"].is_null(), slo.tpot == 0.0);
    EXPECT_EQ(out[i]["describe"].get<std::string>(), describe_slo(slo));
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

void expect_consistent(const nlohmann::json& j, size_t requests) {
  ASSERT_TRUE(j.contains("goodput")) << j.dump();
  const auto& g = j.at("goodput");
  const size_t meeting = g.at("requests_meeting").get<size_t>();
  EXPECT_EQ(g.at("requests").get<size_t>(), requests);
  EXPECT_LE(meeting, requests);
  EXPECT_DOUBLE_EQ(g.at("fraction").get<double>(), static_cast<double>(meeting) / static_cast<double>(requests));
  EXPECT_NEAR(g.at("requests_per_s").get<double>(), static_cast<double>(meeting) / j.at("duration_s").get<double>(),
              1e-9 * (1.0 + g.at("requests_per_s").get<double>()));
}

TEST(Goodput, BenchReportsGoodputOnlyWhenATargetIsGiven) {
  const std::string dir = testing::scratch_dir("bench-goodput");
  const std::string bench = tachyon_binary() + " bench -m " + testing::source_dir() +
                            "/models/tachyon-demo --workload throughput -n 8 --mean-prompt-len 16 "
                            "--mean-output-len 4 --request-rate 400 --seed 3 ";
  // Targets no run can miss (a test is killed long before 1000 s) and none can meet (a token takes
  // more than a microsecond): the counts follow from the definition, not from the machine's speed.
  auto loose = run_command(bench + "--slo-ttft 1000 --slo-tpot 1000 --json " + dir + "/loose.json");
  ASSERT_EQ(loose.exit_code, 0) << loose.err;
  EXPECT_EQ(std::count(loose.out.begin(), loose.out.end(), '\n'), 1) << loose.out;
  EXPECT_NE(loose.out.find("| goodput "), std::string::npos) << loose.out;
  EXPECT_NE(loose.out.find("(100% within TTFT 1000 s, TPOT 1000 s)\n"), std::string::npos) << loose.out;
  const auto lj = read_json(dir + "/loose.json");
  expect_consistent(lj, 8);
  EXPECT_EQ(lj.at("goodput").at("requests_meeting").get<size_t>(), 8u);
  EXPECT_EQ(lj.at("goodput").at("slo_ttft_s").get<double>(), 1000.0);

  auto tight = run_command(bench + "--slo-ttft 0.000001 --json " + dir + "/tight.json");
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  EXPECT_NE(tight.out.find("| goodput 0.00 req/s (0% within TTFT 0.001 ms)\n"), std::string::npos) << tight.out;
  const auto tj = read_json(dir + "/tight.json");
  expect_consistent(tj, 8);
  EXPECT_EQ(tj.at("goodput").at("requests_meeting").get<size_t>(), 0u);
  EXPECT_TRUE(tj.at("goodput").at("slo_tpot_s").is_null());

  auto none = run_command(bench + "--json " + dir + "/none.json");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out.find("goodput"), std::string::npos) << none.out;
  EXPECT_FALSE(read_json(dir + "/none.json").contains("goodput"));

  const std::string latency = tachyon_binary() + " bench -m " + testing::source_dir() +
                              "/models/tachyon-demo --workload latency --slo-tpot 0.05";
  for (const std::string& bad : {bench + "--slo-ttft -1", latency}) {
    auto r = run_command(bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--slo-"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace tachyon
