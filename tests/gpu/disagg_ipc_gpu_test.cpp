// Disaggregation with the K/V kept on the GPU: a prefill worker with --kv-transport cuda-ipc and a
// decode worker, two processes on this host's first GPU, behind `tachyon router`, against a
// colocated `tachyon serve --device cuda`. The decode worker maps the prefill worker's staging
// memory (CUDA IPC) and copies the K/V out of it, never through the host; the outputs must equal
// the colocated server's, the prefill worker's metrics must show every byte went by CUDA IPC, and
// no KV block may stay in use. Requests go one at a time (each kernel sees the shapes it sees
// colocated). Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "gpu_test_util.h"
#include "net/http_client.h"
#include "server/tachyon_process.h"

namespace tachyon {
namespace {

using testing::TachyonProcess;

net::HttpUrl url_of(const TachyonProcess& p) { return net::HttpUrl{"127.0.0.1", static_cast<uint16_t>(p.port())}; }

nlohmann::json post(const TachyonProcess& p, const nlohmann::json& body) {
  auto r = net::http_fetch(url_of(p), "POST", "/v1/completions", body.dump(), 1 << 20, net::Millis(60'000));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  EXPECT_EQ(r->first, 200) << r->second;
  return nlohmann::json::parse(r->second, nullptr, false);
}

// The Prometheus samples of /metrics, by name with labels.
std::map<std::string, double> metrics(const TachyonProcess& p) {
  std::map<std::string, double> out;
  auto r = net::http_fetch(url_of(p), "GET", "/metrics", "", 1 << 20, net::Millis(10'000));
  if (!r.ok()) return out;
  std::istringstream in(r->second);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space != std::string::npos) out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(GpuDisagg, CudaIpcBetweenProcessesEqualsColocated) {
  TACHYON_SKIP_WITHOUT_GPU();
  const std::string serve = "serve -m " + testing::demo_model_dir() +
                            " --device cuda --port 0 --kv-cache-mem 256MiB --batch-invariant --threads 1 ";
  TachyonProcess colocated("gpu_colocated", serve);
  TachyonProcess prefill("gpu_prefill", serve + "--role prefill --kv-transport cuda-ipc --kv-staging-mem 64MiB");
  TachyonProcess decode("gpu_decode", serve + "--role decode");
  ASSERT_TRUE(colocated.started() && prefill.started() && decode.started())
      << colocated.log() << prefill.log() << decode.log();
  EXPECT_NE(prefill.log().find("CUDA IPC"), std::string::npos) << prefill.log();
  TachyonProcess router("gpu_router", "router --port 0 --worker-timeout 30 --disagg-min-prompt 2 --prefill " +
                                          prefill.url() + " --decode " + decode.url());
  ASSERT_TRUE(router.started()) << router.log();
  const auto logs = [&] {
    return "\nprefill:\n" + prefill.log() + "\ndecode:\n" + decode.log() + "\nrouter:\n" + router.log();
  };

  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  const int requests = 16;
  for (int i = 0; i < requests; ++i) {
    std::vector<int32_t> prompt(std::uniform_int_distribution<size_t>(3, 300)(rng));
    for (auto& t : prompt) t = std::uniform_int_distribution<int32_t>(16, 8191)(rng);
    const nlohmann::json body = {{"model", "tachyon-demo"}, {"prompt", prompt},   {"max_tokens", 4 + i * 3},
                                 {"temperature", 0},        {"ignore_eos", true}, {"logprobs", 0}};
    const nlohmann::json want = post(colocated, body), got = post(router, body);
    ASSERT_TRUE(want.is_object() && got.is_object()) << logs();
    ASSERT_TRUE(got.contains("choices")) << got.dump() << logs();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]) << "request " << i << logs();
    EXPECT_EQ(got["choices"][0]["logprobs"]["tokens"], want["choices"][0]["logprobs"]["tokens"]) << "request " << i;
    EXPECT_EQ(got["usage"], want["usage"]) << "request " << i;
  }

  // Every transfer went through the device: no byte by TCP, every one adopted, nothing held.
  std::map<std::string, double> p, d;
  for (int tries = 0; tries < 100; ++tries) {
    p = metrics(prefill);
    d = metrics(decode);
    if (p["tachyon_kv_cache_blocks_used"] == 0 && d["tachyon_kv_cache_blocks_used"] == 0 &&
        d["tachyon_num_requests_running"] == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(p["tachyon_kv_transfers_total{outcome=\"ok\"}"], requests) << logs();
  EXPECT_EQ(p["tachyon_kv_transfers_total{outcome=\"error\"}"], 0);
  EXPECT_GT(p["tachyon_kv_transfer_bytes_total{via=\"cuda_ipc\"}"], 0);
  EXPECT_EQ(p["tachyon_kv_transfer_bytes_total{via=\"tcp\"}"], 0);
  EXPECT_EQ(d["tachyon_kv_adoptions_total{outcome=\"ok\"}"], requests);
  EXPECT_EQ(d["tachyon_kv_adopted_bytes_total{via=\"cuda_ipc\"}"], p["tachyon_kv_transfer_bytes_total{via=\"cuda_ipc\"}"]);
  EXPECT_GT(d["tachyon_kv_adopt_copy_seconds_total{via=\"cuda_ipc\"}"], 0);
  EXPECT_EQ(p["tachyon_kv_cache_blocks_used"], 0);
  EXPECT_EQ(d["tachyon_kv_cache_blocks_used"], 0);
  EXPECT_EQ(router.stop(), 0) << logs();
  EXPECT_EQ(prefill.stop(), 0) << logs();
  EXPECT_EQ(decode.stop(), 0) << logs();
  EXPECT_EQ(colocated.stop(), 0) << colocated.log();
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
