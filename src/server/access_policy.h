// Who may call the HTTP server, decided per request from its path and headers: the API key that
// /v1/* routes need (tachyon serve --api-key, or TACHYON_API_KEY), and the origins a browser may
// call from (CORS, --allowed-origins). /health, /metrics and every route outside /v1 stay open, as
// in vLLM. Owns only these decisions and the header lines they add; never reads a body and never
// logs a key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tachyon::server {

struct AccessOptions {
  std::string api_key;                       // empty: no key needed
  std::vector<std::string> allowed_origins;  // CORS; "*" allows any; empty: no CORS headers at all
};

// "a, b,c" -> {"a", "b", "c"}; empty input -> none. An empty entry, or an origin with a character
// that cannot be in an HTTP header or a URL origin, is kInvalidArgument.
Result<std::vector<std::string>> parse_allowed_origins(std::string_view list);

class AccessPolicy {
 public:
  AccessPolicy() = default;
  explicit AccessPolicy(AccessOptions options) : options_(std::move(options)) {}

  // The request may proceed: its path needs no key, or `authorization` (the Authorization header's
  // value, empty when absent) is "Bearer KEY" (the scheme's case aside), compared in constant time.
  bool authorized(std::string_view path, std::string_view authorization) const;
  // The 401 body for a request that is not, OpenAI-style ({"error": {..., "code": "invalid_api_key"}}).
  static std::string unauthorized_body(bool key_given);

  bool cors_enabled() const { return !options_.allowed_origins.empty(); }
  bool origin_allowed(std::string_view origin) const;
  // Header lines (each ending in CRLF) for any response to a request from `origin` (the Origin
  // header, empty when absent): Access-Control-Allow-Origin and Vary when it is allowed, else none.
  std::string cors_headers(std::string_view origin) const;
  // A preflight's (OPTIONS from an allowed origin) header lines: the above, the methods, the headers
  // asked for in Access-Control-Request-Headers (`requested`, when they are plain header names;
  // else a fixed list) and how long the answer may be cached.
  std::string preflight_headers(std::string_view origin, std::string_view requested) const;

 private:
  AccessOptions options_;
};

}  // namespace tachyon::server
