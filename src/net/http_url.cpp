#include "net/http_url.h"

#include <charconv>

#include <fmt/format.h>

namespace tachyon::net {

std::string shown(std::string_view text) {
  std::string out(text.substr(0, 64));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return text.size() > 64 ? out + "..." : out;
}

Result<uint64_t> parse_u64(std::string_view text, const char* what) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  if (text.empty() || text.size() > 20 || text[0] < '0' || text[0] > '9') {
    return make_error(ErrorCode::kInvalidArgument, "{} '{}' is not a decimal number", what, shown(text));
  }
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    return make_error(ErrorCode::kInvalidArgument, "{} '{}' is not a decimal number in range", what, shown(text));
  }
  return value;
}

Result<HostPort> parse_host_port(std::string_view text) {
  std::string_view host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return make_error(ErrorCode::kInvalidArgument, "address '{}' is not [v6-address]:port", shown(text));
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "address '{}' is not host:port", shown(text));
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "address '{}': an IPv6 host needs brackets", shown(text));
    }
  }
  if (host.empty() || host.size() > 253) {
    return make_error(ErrorCode::kInvalidArgument, "address '{}' has no usable host", shown(text));
  }
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == ':' || c == '_';
    if (!ok) return make_error(ErrorCode::kInvalidArgument, "address '{}': bad character in the host", shown(text));
  }
  auto p = parse_u64(port, "port");
  if (!p.ok() || *p == 0 || *p > 65535) {
    return make_error(ErrorCode::kInvalidArgument, "address '{}': the port must be in [1, 65535]", shown(text));
  }
  return HostPort{std::string(host), static_cast<uint16_t>(*p)};
}

std::string HttpUrl::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("http://[{}]:{}", host, port);
  return fmt::format("http://{}:{}", host, port);
}

Result<HttpUrl> parse_http_url(std::string_view text) {
  constexpr std::string_view scheme = "http://";
  if (text.substr(0, scheme.size()) != scheme) {
    return make_error(ErrorCode::kInvalidArgument, "URL '{}' must start with http://", shown(text));
  }
  std::string_view rest = text.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument, "URL '{}' must be http://host:port without a path", shown(text));
  }
  auto hp = parse_host_port(rest);
  if (!hp.ok()) return hp.status().with_context(fmt::format("URL '{}'", shown(text)));
  return HttpUrl{hp->host, hp->port};
}

}  // namespace tachyon::net
