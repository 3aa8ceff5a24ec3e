// Addresses and URLs as users and the router's protocol write them (net/http_url.h), and the bytes
// of the responses the server and the router write (net/http_response.h).
#include <string>

#include <gtest/gtest.h>

#include "net/http_response.h"
#include "net/http_url.h"

namespace tachyon::net {
namespace {

TEST(HttpUrl, ParsesHostAndPortOnly) {
  auto u = parse_http_url("http://127.0.0.1:8001/");
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8001);
  EXPECT_EQ(u->to_string(), "http://127.0.0.1:8001");
  auto v6 = parse_http_url("http://[::1]:9000");
  ASSERT_TRUE(v6.ok()) << v6.status().to_string();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->to_string(), "http://[::1]:9000");
  for (const char* bad : {"127.0.0.1:8001", "https://h:1", "http://h", "http://h:1/v1", "http://:1", "http://h:99999"}) {
    EXPECT_FALSE(parse_http_url(bad).ok()) << bad;
  }
}

TEST(HttpUrl, ErrorsShowAtMost64PrintableBytes) {
  const Result<uint64_t> n = parse_u64("12\x01" + std::string(100, '9'), "port");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("12?999"), std::string::npos) << n.status().message();
  EXPECT_NE(n.status().message().find("..."), std::string::npos) << n.status().message();
  EXPECT_EQ(*parse_u64("18446744073709551615", "id"), 18446744073709551615ull);
  EXPECT_FALSE(parse_u64("18446744073709551616", "id").ok());
  EXPECT_FALSE(parse_u64("+1", "id").ok());
}

TEST(HttpResponse, StatusLinesChunksAndPlainResponses) {
  EXPECT_EQ(status_line(200), "HTTP/1.1 200 OK\r\n");
  EXPECT_EQ(status_line(503), "HTTP/1.1 503 Service Unavailable\r\n");
  EXPECT_EQ(chunk("data: x\n\n"), "9\r\ndata: x\n\n\r\n");
  EXPECT_EQ(chunk(std::string(26, 'a')), "1a\r\n" + std::string(26, 'a') + "\r\n");
  EXPECT_EQ(plain_response(404, "application/json", "{}", /*keep_alive=*/true),
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            "Connection: keep-alive\r\n\r\n{}");
  EXPECT_NE(plain_response(200, "text/plain", "", false).find("Connection: close\r\n"), std::string::npos);
}

}  // namespace
}  // namespace tachyon::net
