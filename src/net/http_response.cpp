#include "net/http_response.h"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/status.hpp>
#include <fmt/format.h>

namespace tachyon::net {

std::string status_line(int status) {
  namespace http = boost::beast::http;
  const boost::beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
}

std::string chunk(std::string_view data) { return fmt::format("{:x}\r\n", data.size()) + std::string(data) + "\r\n"; }

std::string plain_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                           std::string_view extra_headers) {
  std::string out = status_line(status);
  out += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n{}\r\n", content_type, body.size(),
                     keep_alive ? "keep-alive" : "close", extra_headers);
  out += body;
  return out;
}

}  // namespace tachyon::net
