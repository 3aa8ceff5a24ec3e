// Disaggregated serving as clients see it: a prefill worker, a decode worker and `tachyon router`
// as separate processes on loopback (free ports), with the bundled model, driven by Python scripts
// in tests/server/ (the official `openai` client, beside the server's own scripts and the metrics
// reader they share): outputs equal a colocated `tachyon serve`'s, and a decode worker killed
// mid-stream fails its requests cleanly and can come back.
// Without the project's .venv these tests skip and say so.
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net/http_client.h"

#include "server/tachyon_process.h"
#include "test_util.h"

namespace tachyon {
namespace {

using Process = testing::TachyonProcess;

std::string model_dir() { return testing::demo_model_dir(); }
std::optional<std::string> python() { return testing::openai_python(); }

// One thread each: three or four processes share the machine (and idle OpenMP workers would spin).
const std::string kWorkerArgs = " --port 0 --kv-cache-mem 128MiB --batch-invariant --threads 1 ";

std::string serve(const std::string& extra) { return "serve -m " + model_dir() + kWorkerArgs + extra; }

testing::CommandResult run_script(const std::string& name, const std::string& env) {
  const std::string command = "TACHYON_MODEL_NAME=tachyon-demo TACHYON_SOURCE_DIR=" + testing::source_dir() + " " +
                              env + " " + *python() + " " + testing::source_dir() + "/tests/server/" + name;
  return testing::run_command(command);
}

// The three processes of a disaggregated deployment.
struct Deployment {
  Process prefill{"prefill", serve("--role prefill")};
  Process decode{"decode", serve("--role decode")};
  std::optional<Process> router;

  bool start_router(const std::string& options = "--disagg-min-prompt 4 --hold-timeout 5") {
    if (!prefill.started() || !decode.started()) return false;
    router.emplace("router", "router --port 0 --worker-timeout 20 " + options + " --prefill " + prefill.url() +
                                 " --decode " + decode.url());
    return router->started();
  }
  std::string logs() const {
    return "\nprefill log:\n" + prefill.log() + "\ndecode log:\n" + decode.log() + "\nrouter log:\n" +
           (router ? router->log() : std::string());
  }
  std::string env() const {
    return "TACHYON_ROUTER_URL=" + router->url() + " TACHYON_PREFILL_URL=" + prefill.url() +
           " TACHYON_DECODE_URL=" + decode.url();
  }
};

TEST(DisaggServer, RouterOutputsEqualColocatedServe) {
  if (!python()) GTEST_SKIP() << "no .venv with the openai package (scripts/setup makes it); skipping";
  Process colocated("colocated", serve(""));
  Deployment d;
  ASSERT_TRUE(colocated.started()) << colocated.log();
  ASSERT_TRUE(d.start_router()) << d.logs();
  const testing::CommandResult r =
      run_script("disagg_equality_test.py", d.env() + " TACHYON_COLOCATED_URL=" + colocated.url());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << d.logs();
  // Every process drains and exits 0 on SIGTERM.
  EXPECT_EQ(d.router->stop(), 0) << d.logs();
  EXPECT_EQ(d.prefill.stop(), 0) << d.logs();
  EXPECT_EQ(d.decode.stop(), 0) << d.logs();
  EXPECT_EQ(colocated.stop(), 0) << colocated.log();
}

TEST(DisaggServer, DecodeWorkerKilledMidStreamThenRestarted) {
  if (!python()) GTEST_SKIP() << "no .venv with the openai package (scripts/setup makes it); skipping";
  Deployment d;
  ASSERT_TRUE(d.start_router()) << d.logs();
  // The replacement listens on the same HTTP port (the router's --decode URL) and logs beside it.
  const std::string restart = "exec " + testing::tachyon_binary() + " serve -m " + model_dir() + " --port " +
                              std::to_string(d.decode.port()) +
                              " --kv-cache-mem 128MiB --batch-invariant --threads 1 --role decode > " +
                              testing::scratch_dir("decode-restarted") + "/process.log 2>&1";
  const testing::CommandResult r =
      run_script("disagg_failure_test.py", d.env() + " TACHYON_DECODE_PID=" + std::to_string(d.decode.pid()) +
                                               " TACHYON_DECODE_CMD='" + restart + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << d.logs();
  EXPECT_EQ(d.router->stop(), 0) << d.logs();
  EXPECT_EQ(d.prefill.stop(), 0) << d.logs();
}

TEST(DisaggServer, RateMatchingHoldsThenRefuses) {
  if (!python()) GTEST_SKIP() << "no .venv with the openai package (scripts/setup makes it); skipping";
  Deployment d;
  ASSERT_TRUE(d.start_router("--decode-max-queue 1 --max-held 1 --hold-timeout 3 --poll-interval 600")) << d.logs();
  const testing::CommandResult r = run_script("disagg_rate_test.py", d.env());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << d.logs();
  EXPECT_EQ(d.router->stop(), 0) << d.logs();
}

// A router without prefill workers fronts a colocated pool: every request runs whole on one of
// its decode workers (the baseline a disaggregated deployment is measured against).
TEST(DisaggServer, RouterWithoutPrefillWorkersRunsEveryRequestColocated) {
  Process a("pool_a", serve("--role decode")), b("pool_b", serve("--role decode"));
  ASSERT_TRUE(a.started() && b.started()) << a.log() << b.log();
  Process router("pool_router", "router --port 0 --worker-timeout 20 --decode " + a.url() + " --decode " + b.url());
  ASSERT_TRUE(router.started()) << router.log();
  const net::HttpUrl url{"127.0.0.1", static_cast<uint16_t>(router.port())};
  for (int i = 0; i < 6; ++i) {
    const std::string body = R"({"model": "tachyon-demo", "prompt": "Once upon a time there was a robot", "max_tokens": )" +
                             std::to_string(3 + i) + R"(, "temperature": 0, "ignore_eos": true})";
    auto r = net::http_fetch(url, "POST", "/v1/completions", body, 1 << 20, net::Millis(30000));
    ASSERT_TRUE(r.ok()) << r.status().to_string() << router.log();
    ASSERT_EQ(r->first, 200) << r->second;
    const auto j = nlohmann::json::parse(r->second);
    EXPECT_EQ(j["usage"]["completion_tokens"], 3 + i);
  }
  auto health = net::http_fetch(url, "GET", "/health", "", 1 << 16, net::Millis(5000));
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->first, 200) << health->second;
  auto metrics = net::http_fetch(url, "GET", "/metrics", "", 1 << 20, net::Millis(5000));
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->second.find("tachyon_router_requests_total{mode=\"colocated\"} 6"), std::string::npos)
      << metrics->second;
  EXPECT_NE(metrics->second.find("tachyon_router_requests_total{mode=\"disagg\"} 0"), std::string::npos);
  EXPECT_EQ(router.stop(), 0) << router.log();
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

TEST(DisaggServer, BadOptionsGiveOneErrorLine) {
  const auto expect_error = [](const std::string& args, const std::string& needle) {
    const testing::CommandResult r = testing::run_command(testing::tachyon_binary() + " " + args);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_NE((r.err + r.out).find(needle), std::string::npos) << args << "\n" << r.err << r.out;
  };
  expect_error("router --port 0 --prefill http://127.0.0.1:1", "--decode");
  expect_error("router --port 0", "--decode");
  expect_error("router --port 0 --prefill 127.0.0.1:1 --decode http://127.0.0.1:2", "http://");
  expect_error("router --port 0 --prefill http://127.0.0.1:1 --decode http://127.0.0.1:99999", "65535");
  expect_error("router --port 0 --prefill http://127.0.0.1:1 --decode http://127.0.0.1:2 --host nowhere", "nowhere");
  expect_error(serve("--role middle"), "--role");
  expect_error(serve("--role decode --kv-host not-an-address"), "not-an-address");
  // K/V in GPU memory: the prefill side's choice, and only on a GPU.
  expect_error(serve("--role decode --kv-transport cuda-ipc"), "prefill role's choice");
  expect_error(serve("--role prefill --kv-transport cuda-ipc --device cpu"), "needs a GPU");
  expect_error(serve("--role prefill --kv-transport rdma"), "tcp or cuda-ipc");
  expect_error(serve("--role prefill --kv-transport cuda-ipc --kv-staging-mem lots"), "--kv-staging-mem");
}

}  // namespace
}  // namespace tachyon
