// Addresses as users and the router's protocol write them: "host:port", "[v6]:port" and
// "http://host:port". Nothing here does I/O or name lookup; every parser takes untrusted bytes and
// returns a Status, never throws or aborts. The two text helpers are shared with the parsers of
// the disaggregated workers' headers (server/disagg_protocol.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tachyon::net {

// At most 64 bytes of `text` for an error message, bytes outside printable ASCII as '?'.
std::string shown(std::string_view text);
// A decimal u64: digits only, no sign, no spaces. `what` names the value in the error.
Result<uint64_t> parse_u64(std::string_view text, const char* what);

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
// "host:port" or "[v6]:port", port 1..65535. The host must be non-empty (no name lookup here).
Result<HostPort> parse_host_port(std::string_view text);

// "http://host:port" with an optional trailing "/"; only http, port required.
struct HttpUrl {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;  // "http://host:port"
};
Result<HttpUrl> parse_http_url(std::string_view text);

}  // namespace tachyon::net
