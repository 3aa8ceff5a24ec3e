// The streaming load client (loadgen/stream_load.h) behind `tachyon bench --url`: its response
// parser on hand-made responses cut at every byte, its runs against the real `tachyon serve`, and
// servers that refuse, stall or answer errors, each of which must fail its requests, not hang.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net/http_client.h"
#include "loadgen/stream_load.h"
#include "server/tachyon_process.h"
#include "test_util.h"

namespace tachyon {
namespace {

using loadgen::SseResponseParser;
using loadgen::StreamLoadResult;

std::string chunked(const std::vector<std::string>& pieces, const std::string& head_extra = "") {
  std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n" +
                    head_extra + "\r\n";
  for (const std::string& p : pieces) out += fmt::format("{:x}\r\n{}\r\n", p.size(), p);
  return out + "0\r\n\r\n";
}

// Three events of 1, 2 and 0 tokens (the last: finish_reason only), usage, [DONE]; the first two
// carry hand-over stamps.
std::string good_stream() {
  return chunked({
      R"(data: {"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"]},"finish_reason":null}],"tachyon_handed_over":100.0})"
      "\n\n",
      R"(data: {"choices":[{"index":0,"text":"bc","logprobs":{"tokens":["b","c"]},"finish_reason":null}],"tachyon_handed_over":100.5})"
      "\n\ndata: ",
      R"({"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]})"
      "\n\n",
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n",
      "data: [DONE]\n\n",
  });
}

void expect_good(const StreamLoadResult& r) {
  EXPECT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.token_times.size(), 3u);
  ASSERT_EQ(r.delivery.size(), 3u);
  EXPECT_EQ(r.prompt_tokens, 7);
  EXPECT_EQ(r.completion_tokens, 3);
}

TEST(StreamLoad, ParserReadsAResponseCutAtEveryByte) {
  const std::string response = good_stream();
  // Whole.
  {
    StreamLoadResult r;
    SseResponseParser p(r, 99.0);
    EXPECT_FALSE(p.feed(response, 2.0));
    EXPECT_TRUE(p.done());
    expect_good(r);
    // Arrival 2 s after a start at clock 99: the client read the tokens at clock 101.
    EXPECT_DOUBLE_EQ(r.delivery[0], 1.0);
    EXPECT_DOUBLE_EQ(r.delivery[2], 0.5);
    EXPECT_DOUBLE_EQ(r.first_token, 2.0);
    EXPECT_DOUBLE_EQ(r.finished, 2.0);
  }
  // In two pieces, cut at every position; the second piece arrives later.
  for (size_t cut = 1; cut < response.size(); ++cut) {
    SCOPED_TRACE(::testing::Message() << "cut at " << cut << ": " << response.substr(0, cut));
    StreamLoadResult r;
    SseResponseParser p(r, 0.0);
    ASSERT_TRUE(p.feed(response.substr(0, cut), 1.0)) << cut;
    EXPECT_FALSE(p.feed(response.substr(cut), 2.0)) << cut;
    ASSERT_TRUE(p.done()) << cut << ": " << r.error;
    expect_good(r);
    // [DONE] is read when its event is complete, which may be before the last chunk's framing.
    const size_t done_at = response.find("[DONE]\n\n") + 8;
    EXPECT_DOUBLE_EQ(r.finished, cut >= done_at ? 1.0 : 2.0);
  }
  // Byte by byte: each token's arrival is the read that completed its event.
  StreamLoadResult r;
  SseResponseParser p(r, 0.0);
  for (size_t i = 0; i < response.size(); ++i) {
    const bool more = p.feed(response.substr(i, 1), static_cast<double>(i));
    EXPECT_EQ(more, i + 1 < response.size()) << i;
  }
  expect_good(r);
  EXPECT_LT(r.token_times[0], r.token_times[1]);
  EXPECT_EQ(r.token_times[1], r.token_times[2]);  // one event, two tokens
  EXPECT_LE(r.token_times[2], r.finished);
}

TEST(StreamLoad, ParserFailsBrokenAndErrorResponses) {
  const auto parse = [](const std::string& bytes, bool eof) {
    StreamLoadResult r;
    SseResponseParser p(r, 0.0);
    p.feed(bytes, 1.0);
    if (eof) p.end_of_stream(1.5);
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(p.failed());
    return r.error;
  };
  const std::string body = R"({"error":{"message":"prompt is too long","type":"invalid_request_error"}})";
  EXPECT_NE(parse(fmt::format("HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{}", body.size(), body), false)
                .find("HTTP 400: " + body),
            std::string::npos);
  EXPECT_NE(parse(chunked({"data: {\"error\":{\"message\":\"boom\"}}\n\n", "data: [DONE]\n\n"}), false).find("boom"),
            std::string::npos);
  EXPECT_NE(parse(chunked({"data: {\"choices\":[]}\n\n"}), false).find("without data: [DONE]"), std::string::npos);
  EXPECT_NE(parse(chunked({"data: {not json\n\n"}), false).find("not JSON"), std::string::npos);
  EXPECT_NE(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false).find("chunk size"),
            std::string::npos);
  EXPECT_NE(parse("SSH-2.0-OpenSSH\r\n\r\n", false).find("not an HTTP"), std::string::npos);
  // The connection closes before the end.
  const std::string whole = good_stream();
  EXPECT_NE(parse(whole.substr(0, whole.size() / 2), true).find("mid-response"), std::string::npos);
  EXPECT_NE(parse("", true).find("before answering"), std::string::npos);
  // A body that runs to the close is complete at the close.
  StreamLoadResult r;
  SseResponseParser p(r, 0.0);
  EXPECT_TRUE(p.feed("HTTP/1.0 200 OK\r\n\r\ndata: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n", 1.0));
  EXPECT_TRUE(p.closes());
  p.end_of_stream(2.0);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.token_times.size(), 1u);  // no logprobs: the event counts as one token
}

std::vector<loadgen::StreamLoadRequest> workload(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<loadgen::StreamLoadRequest> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& r = out[static_cast<size_t>(i)];
    r.prompt.resize(std::uniform_int_distribution<size_t>(1, 40)(rng));
    for (auto& t : r.prompt) t = std::uniform_int_distribution<int32_t>(16, vocab - 1)(rng);
    r.max_tokens = std::uniform_int_distribution<int>(1, 24)(rng);
    r.seed = static_cast<uint64_t>(i);
    r.arrival = 0.002 * i;
  }
  return out;
}

TEST(StreamLoad, EveryRequestCompletesAgainstTachyonServe) {
  testing::TachyonProcess serve("stream_load", "serve -m " + testing::demo_model_dir() +
                                                   " --port 0 --kv-cache-mem 64MiB -t 1 --stream-timestamps");
  ASSERT_TRUE(serve.started()) << serve.log();
  auto models = net::http_fetch(net::HttpUrl{"127.0.0.1", static_cast<uint16_t>(serve.port())}, "GET",
                                   "/v1/models", "", 1 << 16, net::Millis(10'000));
  ASSERT_TRUE(models.ok()) << models.status().message();
  const auto card = nlohmann::json::parse(models->second)["data"][0];
  const int vocab = card["vocab_size"].get<int>();
  ASSERT_GT(vocab, 16);

  loadgen::StreamLoadOptions options;
  options.url = net::HttpUrl{"127.0.0.1", static_cast<uint16_t>(serve.port())};
  options.model = card["id"].get<std::string>();
  options.concurrency = 10;
  options.threads = 3;
  options.temperature = 0.8f;
  const auto requests = workload(60, vocab, testing::fresh_seed());
  const auto t0 = std::chrono::steady_clock::now();
  auto results = loadgen::run_stream_load(options, requests);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(results.ok()) << results.status().message();
  ASSERT_EQ(results->size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const StreamLoadResult& r = (*results)[i];
    ASSERT_TRUE(r.ok) << i << ": " << r.error << "\n" << serve.log();
    EXPECT_EQ(r.token_times.size(), static_cast<size_t>(requests[i].max_tokens)) << i;
    EXPECT_EQ(r.completion_tokens, requests[i].max_tokens) << i;
    EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(requests[i].prompt.size())) << i;
    EXPECT_GE(r.sent, requests[i].arrival) << i;
    EXPECT_LE(r.sent, r.first_token) << i;
    EXPECT_LE(r.first_token, r.finished) << i;
    EXPECT_LE(r.finished, wall) << i;
    ASSERT_EQ(r.delivery.size(), r.token_times.size()) << i;
    for (double d : r.delivery) {  // one host, one monotonic clock: read after it was handed over
      EXPECT_GE(d, 0.0) << i;
      EXPECT_LT(d, wall) << i;
    }
  }
  // The same seed gives the same tokens: a request's sampling is its own (checked through the CLI,
  // which also writes the JSON a user reads).
  const std::string dir = testing::scratch_dir("stream_load_cli");
  const std::string cmd = testing::tachyon_binary() + " bench --url " + serve.url() +
                          " --workload throughput -n 12 --mean-prompt-len 16 --mean-output-len 8 --len-sigma 0" +
                          " --concurrency 4 --client-threads 2 --json " + dir + "/out.json";
  const testing::CommandResult cli = testing::run_command(cmd);
  ASSERT_EQ(cli.exit_code, 0) << cli.out << cli.err;
  EXPECT_NE(cli.out.find("http throughput: 12 requests"), std::string::npos) << cli.out;
  const auto j = nlohmann::json::parse(testing::slurp(dir + "/out.json"));
  EXPECT_EQ(j["bench"], "http");
  EXPECT_EQ(j["output_tokens"], 96);
  EXPECT_EQ(j["prompt_tokens"], 192);
  EXPECT_EQ(j["requests_failed"], 0);
  EXPECT_EQ(j["usage_mismatches"], 0);
  EXPECT_EQ(j["delivery_ms"]["count"], 96);
  EXPECT_EQ(serve.stop(), 0) << serve.log();
}

// A port nobody listens on, and a socket that listens but never answers: every request fails with
// its reason, within its timeout.
TEST(StreamLoad, RefusingAndSilentServersFailEachRequestWithoutHanging) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const uint16_t port = ntohs(addr.sin_port);

  loadgen::StreamLoadOptions options;
  options.url = net::HttpUrl{"127.0.0.1", port};
  options.model = "m";
  options.threads = 2;
  options.request_timeout_s = 0.3;
  const auto requests = workload(6, 100, 1);
  // Bound but not listening: connections are refused.
  auto refused = loadgen::run_stream_load(options, requests);
  ASSERT_TRUE(refused.ok());
  for (const StreamLoadResult& r : *refused) {
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("connect"), std::string::npos) << r.error;
  }
  // Listening, never accepting: the kernel completes the handshakes, nothing ever answers. Each
  // request ends on its own timeout (its error says so), not on anything else: no wall-clock
  // bound needed, which ctest -j's load would make flaky.
  ASSERT_EQ(listen(fd, 16), 0);
  auto silent = loadgen::run_stream_load(options, requests);
  ASSERT_TRUE(silent.ok());
  for (const StreamLoadResult& r : *silent) {
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("timed out"), std::string::npos) << r.error;
  }
  close(fd);
  // Bad options are an error of the call.
  options.threads = 0;
  EXPECT_FALSE(loadgen::run_stream_load(options, requests).ok());
}

}  // namespace
}  // namespace tachyon
