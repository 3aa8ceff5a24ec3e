#include "server/access_policy.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "server/openai_api.h"

namespace tachyon::server {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Equal without an early exit on the first difference (the key's bytes do not leak through timing;
// its length may).
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool iequals_prefix(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

// A list of header names: letters, digits, '-', '_', ',', '.' and spaces only.
bool plain_header_list(std::string_view s) {
  return !s.empty() && s.size() <= 1024 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == '.' ||
                  c == ' ';
         });
}

}  // namespace

Result<std::vector<std::string>> parse_allowed_origins(std::string_view list) {
  std::vector<std::string> out;
  if (trim(list).empty()) return out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view origin = trim(list.substr(start, comma - start));
    if (origin.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "an empty origin in '{}' (a comma list, or *)", list);
    }
    const bool printable = std::all_of(origin.begin(), origin.end(), [](char c) {
      return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
    });
    if (!printable) {
      return make_error(ErrorCode::kInvalidArgument, "origin '{}' has a character no origin has", origin);
    }
    out.emplace_back(origin);
    start = comma + 1;
  }
  return out;
}

bool AccessPolicy::authorized(std::string_view path, std::string_view authorization) const {
  if (options_.api_key.empty() || path.rfind("/v1", 0) != 0) return true;
  if (path.size() > 3 && path[3] != '/') return true;  // "/v1x..." is no /v1 route
  constexpr std::string_view kBearer = "Bearer ";
  if (!iequals_prefix(authorization, kBearer)) return false;
  return same_secret(trim(authorization.substr(kBearer.size())), options_.api_key);
}

std::string AccessPolicy::unauthorized_body(bool key_given) {
  ApiError e;
  e.status = 401;
  e.message = key_given ? "Incorrect API key provided." : "You didn't provide an API key. Send it as the header "
                                                          "'Authorization: Bearer YOUR_KEY'.";
  e.code = "invalid_api_key";
  return error_body(e);
}

bool AccessPolicy::origin_allowed(std::string_view origin) const {
  if (origin.empty()) return false;
  return std::any_of(options_.allowed_origins.begin(), options_.allowed_origins.end(),
                     [origin](const std::string& allowed) { return allowed == "*" || allowed == origin; });
}

std::string AccessPolicy::cors_headers(std::string_view origin) const {
  if (!origin_allowed(origin)) return {};
  const bool any = std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(), "*") !=
                   options_.allowed_origins.end();
  // "*" answers any origin with "*"; a list echoes the one origin allowed (an entry of the list,
  // never the client's bytes), and caches must key on it.
  if (any) return "Access-Control-Allow-Origin: *\r\n";
  return fmt::format("Access-Control-Allow-Origin: {}\r\nVary: Origin\r\n", origin);
}

std::string AccessPolicy::preflight_headers(std::string_view origin, std::string_view requested) const {
  std::string out = cors_headers(origin);
  if (out.empty()) return out;
  requested = trim(requested);
  out += "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n";
  out += fmt::format("Access-Control-Allow-Headers: {}\r\n",
                     plain_header_list(requested) ? requested : std::string_view("Authorization, Content-Type"));
  out += "Access-Control-Max-Age: 600\r\n";
  return out;
}

}  // namespace tachyon::server
