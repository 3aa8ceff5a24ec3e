// The internal router <-> worker protocol's parsers (disagg_protocol.h) and the router's assembly
// of plain responses from streamed chunks (response_assembler.h), fed good and bad bytes: every
// bad input is a clear error, never a crash.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/disagg_protocol.h"
#include "server/response_assembler.h"

namespace tachyon::server {
namespace {

TEST(DisaggProtocol, TransferIdsAndCounts) {
  EXPECT_EQ(*parse_transfer_id("1"), 1u);
  EXPECT_EQ(*parse_transfer_id("18446744073709551615"), 18446744073709551615ull);
  for (const char* bad : {"", "0", "-1", "+5", " 5", "5 ", "18446744073709551616", "99999999999999999999999", "0x10",
                          "1e3", "12a"}) {
    auto r = parse_transfer_id(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    }
  }
  EXPECT_EQ(*parse_count("0", 10), 0);
  EXPECT_EQ(*parse_count("10", 10), 10);
  EXPECT_FALSE(parse_count("11", 10).ok());
  EXPECT_FALSE(parse_count("-3", 10).ok());
}

TEST(DisaggProtocol, HostPortsAndResponseIds) {
  auto a = parse_host_port("127.0.0.1:4000");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 4000);
  auto v6 = parse_host_port("[::1]:65535");
  ASSERT_TRUE(v6.ok()) << v6.status().to_string();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->to_string(), "[::1]:65535");
  EXPECT_EQ(parse_host_port("worker-3.local:80")->host, "worker-3.local");
  for (const char* bad : {"", ":80", "host", "host:", "host:0", "host:65536", "host:80x", "::1:80", "[::1]80", "[::1",
                          "ho st:80", "host:-1", "h\r\nX: y:80"}) {
    EXPECT_FALSE(parse_host_port(bad).ok()) << "'" << bad << "'";
  }
  EXPECT_TRUE(check_response_id("cmpl-0123abc_X").ok());
  EXPECT_FALSE(check_response_id("").ok());
  EXPECT_FALSE(check_response_id("cmpl-\"}").ok());
  EXPECT_FALSE(check_response_id(std::string(65, 'a')).ok());
}

TEST(DisaggProtocol, RolesAndLoadReports) {
  EXPECT_EQ(*parse_role("prefill"), WorkerRole::kPrefill);
  EXPECT_EQ(*parse_role("decode"), WorkerRole::kDecode);
  EXPECT_EQ(*parse_role("both"), WorkerRole::kBoth);
  EXPECT_FALSE(parse_role("Decode").ok());
  WorkerLoadReport l;
  l.role = WorkerRole::kDecode;
  l.kv_blocks_total = 409;
  l.kv_blocks_free = 300;
  l.num_running = 3;
  l.num_waiting = 2;
  l.pending_adoptions = 1;
  l.kv_port = 40000;
  auto back = parse_load_json(load_json(l));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->role, WorkerRole::kDecode);
  EXPECT_EQ(back->kv_blocks_free, 300);
  EXPECT_EQ(back->pending_adoptions, 1);
  EXPECT_EQ(back->kv_port, 40000);
  const std::string good = load_json(l);
  const auto with = [&](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(good);
    j[key] = nlohmann::json::parse(value);
    return j.dump();
  };
  EXPECT_EQ(parse_load_json(with("version", "2")).status().code(), ErrorCode::kUnsupported);
  for (const std::string& bad : {std::string(""), std::string("[]"), std::string("{"), std::string("{\"version\":1}"),
                                 with("role", "\"router\""), with("kv_blocks_free", "-1"), with("kv_blocks_free", "1e3"),
                                 with("kv_blocks_free", "500"), with("kv_port", "70000"), with("num_waiting", "\"3\""),
                                 with("num_running", "99999999999")}) {
    EXPECT_FALSE(parse_load_json(bad).ok()) << bad;
  }
}

TEST(DisaggProtocol, SseParserSplitsEventsAcrossPieces) {
  const std::string stream =
      "event: tachyon\ndata: {\"mode\":\"disagg\"}\n\n: a comment\ndata: {\"a\":1}\r\n\r\ndata: [DONE]\n\n";
  // Fed one byte at a time, and whole: the same events.
  for (size_t piece : {size_t{1}, stream.size()}) {
    SseParser p;
    std::vector<SseEvent> events;
    for (size_t i = 0; i < stream.size(); i += piece) {
      ASSERT_TRUE(p.feed(stream.substr(i, piece)).ok());
      while (auto e = p.next()) events.push_back(*e);
    }
    ASSERT_EQ(events.size(), 3u) << piece;
    EXPECT_EQ(events[0].event, "tachyon");
    EXPECT_EQ(events[0].data, "{\"mode\":\"disagg\"}");
    EXPECT_EQ(events[1].event, "");
    EXPECT_EQ(events[1].data, "{\"a\":1}");
    EXPECT_EQ(events[2].data, "[DONE]");
  }
  // An event, or a line without its end, past the limit is an error.
  SseParser small(64);
  EXPECT_FALSE(small.feed("data: " + std::string(100, 'x') + "\n").ok());
  SseParser unterminated(64);
  EXPECT_FALSE(unterminated.feed(std::string(100, 'x')).ok());
  SseParser many(64);
  EXPECT_FALSE(many.feed("data: " + std::string(40, 'x') + "\ndata: " + std::string(40, 'y') + "\n").ok());
}

std::string completion_chunk(int index, const std::string& text, const std::string& finish = "") {
  nlohmann::ordered_json c = {{"index", index}, {"text", text}, {"logprobs", nullptr},
                              {"finish_reason", finish.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(finish)}};
  nlohmann::ordered_json j = {{"id", "cmpl-x"}, {"object", "text_completion"}, {"created", 7}, {"model", "m"},
                              {"choices", nlohmann::ordered_json::array({c})}};
  return j.dump();
}

TEST(ResponseAssembler, MergesChunksByChoice) {
  ResponseAssembler a(Endpoint::kCompletions);
  ASSERT_TRUE(a.add(completion_chunk(0, "Hel")).ok());
  ASSERT_TRUE(a.add(completion_chunk(1, "Wor")).ok());
  ASSERT_TRUE(a.add(completion_chunk(0, "lo", "length")).ok());
  ASSERT_TRUE(a.add(completion_chunk(1, "ld", "stop")).ok());
  ASSERT_TRUE(a.add(R"({"id":"cmpl-x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}})").ok());
  EXPECT_FALSE(a.failed());
  const auto body = nlohmann::json::parse(a.body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-x");
  EXPECT_EQ(body["created"], 7);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["text"], "Hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["text"], "World");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);

  ResponseAssembler chat(Endpoint::kChatCompletions);
  ASSERT_TRUE(chat.add(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})").ok());
  ASSERT_TRUE(chat.add(R"({"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-1}],"refusal":null},"finish_reason":null}]})").ok());
  ASSERT_TRUE(chat.add(R"({"choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-2}],"refusal":null},"finish_reason":null}]})").ok());
  ASSERT_TRUE(chat.add(R"({"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})").ok());
  const auto c = nlohmann::json::parse(chat.body());
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  ASSERT_EQ(c["choices"][0]["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(c["choices"][0]["logprobs"]["content"][1]["token"], "!");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
}

TEST(ResponseAssembler, ErrorChunksAndBadChunks) {
  ResponseAssembler a(Endpoint::kCompletions);
  ASSERT_TRUE(a.add(completion_chunk(0, "x")).ok());
  ASSERT_TRUE(a.add(R"({"error":{"message":"handing over failed","type":"server_error","param":null,"code":"kv_transfer_failed"}})").ok());
  EXPECT_TRUE(a.failed());
  EXPECT_EQ(a.error_status(), 502);
  EXPECT_NE(a.error_body().find("handing over failed"), std::string::npos);
  EXPECT_EQ(ResponseAssembler::status_of_error(nlohmann::ordered_json::parse(R"({"error":{"type":"invalid_request_error"}})")), 400);
  EXPECT_EQ(ResponseAssembler::status_of_error(nlohmann::ordered_json::parse(R"({"error":{"type":"timeout_error"}})")), 504);
  EXPECT_EQ(ResponseAssembler::status_of_error(nlohmann::ordered_json::parse(R"({"error":"text"})")), 500);

  for (const char* bad : {"", "[DONE]", "[1]", R"({"choices":{}})", R"({"choices":[{"text":"x"}]})",
                          R"({"choices":[{"index":-1,"text":"x"}]})", R"({"choices":[{"index":999999999,"text":"x"}]})",
                          R"({"choices":[{"index":0,"text":5}]})", R"({"choices":[{"index":0,"text":"x","logprobs":7}]})"}) {
    ResponseAssembler r(Endpoint::kCompletions);
    const Status st = r.add(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.code(), ErrorCode::kCorruptFile) << bad;
  }
  ResponseAssembler chat(Endpoint::kChatCompletions);
  EXPECT_FALSE(chat.add(R"({"choices":[{"index":0,"delta":"x"}]})").ok());
  EXPECT_FALSE(chat.add(R"({"choices":[{"index":0,"delta":{"content":3}}]})").ok());
  // Logprobs whose arrays disagree with earlier ones.
  for (const char* later : {R"({"choices":[{"index":0,"text":"b","logprobs":{"tokens":"b"}}]})",
                            R"({"choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"],"extra":[1]}}]})"}) {
    ResponseAssembler lp(Endpoint::kCompletions);
    ASSERT_TRUE(lp.add(R"({"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"]}}]})").ok());
    EXPECT_FALSE(lp.add(later).ok()) << later;
  }
}

}  // namespace
}  // namespace tachyon::server
