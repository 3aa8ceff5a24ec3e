// Fuzz target: the HTTP request reader. The server reads requests with Beast's request_parser
// under its own limits (64 KiB of request line and headers, 8 MiB of body) and then parses the
// route, the internal headers of the disaggregated protocol and, at the router, worker load
// reports and SSE streams; this harness runs those same steps over the input bytes in memory
// (the sockets and the engine are left out: the server tests drive those).
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "fuzz_util.h"
#include "net/http_url.h"
#include "server/disagg_protocol.h"

namespace http = boost::beast::http;

namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;  // as http_server.cpp
constexpr size_t kMaxBody = size_t{8} << 20;    // HttpServerOptions::max_body's default

std::string_view header(const http::request<http::string_body>& req, const char* name) {
  const auto v = req[name];
  return {v.data(), v.size()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  using namespace tachyon::server;
  http::request_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(kMaxBody);
  parser.eager(true);
  boost::beast::error_code ec;
  boost::asio::const_buffer input(data, size);
  while (input.size() > 0 && !parser.is_done()) {
    const size_t used = parser.put(input, ec);
    input += used;
    if (ec == http::error::need_more) {
      ec = {};
      break;  // the rest of a message that has not arrived
    }
    if (ec || used == 0) break;
  }
  // As http::read does: the end of the stream counts only once some bytes came (else Beast asserts).
  if (!ec && !parser.is_done() && parser.got_some()) parser.put_eof(ec);
  if (ec || !parser.is_done()) {
    // What the server answers with: 414 vs 431 reads the target of a half-parsed request.
    (void)parser.get().target().empty();
    return 0;
  }
  const http::request<http::string_body> req = parser.release();
  const std::string_view target(req.target().data(), req.target().size());
  const std::string path(target.substr(0, target.find('?')));
  (void)req.keep_alive();
  (void)parse_transfer_id(header(req, kHeaderTransferId));
  (void)parse_count(header(req, kHeaderMinPromptTokens), int64_t{1} << 30);
  (void)check_response_id(header(req, kHeaderResponseId));
  (void)parse_count(header(req, kHeaderCreated), int64_t{1} << 40);
  (void)parse_host_port(header(req, kHeaderKvAddress));
  (void)parse_role(path);
  (void)tachyon::net::parse_http_url(path);
  // The router's side: a worker's load report and a worker's SSE stream, here from the body.
  (void)parse_load_json(req.body());
  SseParser sse(size_t{64} << 10);
  if (sse.feed(req.body()).ok()) {
    while (sse.next()) {
    }
  }
  return 0;
}
