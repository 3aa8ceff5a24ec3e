#include "server/disagg_protocol.h"

#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

namespace tachyon::server {

using net::parse_u64;
using net::shown;

const char* role_name(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill: return "prefill";
    case WorkerRole::kDecode: return "decode";
    case WorkerRole::kBoth: break;
  }
  return "both";
}

Result<WorkerRole> parse_role(std::string_view text) {
  if (text == "both") return WorkerRole::kBoth;
  if (text == "prefill") return WorkerRole::kPrefill;
  if (text == "decode") return WorkerRole::kDecode;
  return make_error(ErrorCode::kInvalidArgument, "role '{}' is not one of prefill, decode, both", shown(text));
}

Result<uint64_t> parse_transfer_id(std::string_view text) {
  TACHYON_ASSIGN_OR_RETURN(const uint64_t id, parse_u64(text, "transfer id"));
  if (id == 0) return make_error(ErrorCode::kInvalidArgument, "transfer id 0 is reserved");
  return id;
}

Result<int64_t> parse_count(std::string_view text, int64_t max) {
  TACHYON_ASSIGN_OR_RETURN(const uint64_t n, parse_u64(text, "count"));
  if (n > static_cast<uint64_t>(max)) {
    return make_error(ErrorCode::kInvalidArgument, "count {} is larger than {}", n, max);
  }
  return static_cast<int64_t>(n);
}

Result<disagg::KvDestination> parse_host_port(std::string_view text) {
  TACHYON_ASSIGN_OR_RETURN(net::HostPort hp, net::parse_host_port(text));
  return disagg::KvDestination{std::move(hp.host), hp.port};
}

Status check_response_id(std::string_view text) {
  if (text.empty() || text.size() > 64) {
    return make_error(ErrorCode::kInvalidArgument, "response id '{}' must have 1 to 64 characters", shown(text));
  }
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return make_error(ErrorCode::kInvalidArgument, "response id '{}' has a bad character", shown(text));
  }
  return Status::Ok();
}

std::string load_json(const WorkerLoadReport& l) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["version"] = kInternalProtocolVersion;
  j["role"] = role_name(l.role);
  j["kv_blocks_total"] = l.kv_blocks_total;
  j["kv_blocks_free"] = l.kv_blocks_free;
  j["num_running"] = l.num_running;
  j["num_waiting"] = l.num_waiting;
  j["pending_adoptions"] = l.pending_adoptions;
  j["transfers_in_flight"] = l.transfers_in_flight;
  j["kv_port"] = l.kv_port;
  return j.dump();
}

Result<WorkerLoadReport> parse_load_json(std::string_view body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "load report '{}' is not a JSON object", shown(body));
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != kInternalProtocolVersion) {
    return make_error(ErrorCode::kUnsupported, "load report of protocol version {}; this build speaks {}",
                      version == j.end() ? std::string("(none)") : version->dump(), kInternalProtocolVersion);
  }
  WorkerLoadReport l;
  const auto role = j.find("role");
  if (role == j.end() || !role->is_string()) return make_error(ErrorCode::kInvalidArgument, "load report: no role");
  TACHYON_ASSIGN_OR_RETURN(l.role, parse_role(role->get<std::string>()));
  const auto read = [&](const char* key, int& out, int64_t max) -> Status {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > max) {
      return make_error(ErrorCode::kInvalidArgument, "load report: '{}' must be an integer in [0, {}]", key, max);
    }
    out = static_cast<int>(it->get<int64_t>());
    return Status::Ok();
  };
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  TACHYON_RETURN_IF_ERROR(read("kv_blocks_total", l.kv_blocks_total, kMax));
  TACHYON_RETURN_IF_ERROR(read("kv_blocks_free", l.kv_blocks_free, kMax));
  TACHYON_RETURN_IF_ERROR(read("num_running", l.num_running, kMax));
  TACHYON_RETURN_IF_ERROR(read("num_waiting", l.num_waiting, kMax));
  TACHYON_RETURN_IF_ERROR(read("pending_adoptions", l.pending_adoptions, kMax));
  TACHYON_RETURN_IF_ERROR(read("transfers_in_flight", l.transfers_in_flight, kMax));
  TACHYON_RETURN_IF_ERROR(read("kv_port", l.kv_port, 65535));
  if (l.kv_blocks_free > l.kv_blocks_total) {
    return make_error(ErrorCode::kInvalidArgument, "load report: {} free blocks of {}", l.kv_blocks_free,
                      l.kv_blocks_total);
  }
  return l;
}

Status SseParser::feed(std::string_view bytes) {
  buffer_.append(bytes);
  size_t start = 0;
  for (;;) {
    const size_t nl = buffer_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(buffer_.data() + start, nl - start);
    start = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // the end of an event
      if (has_field_) ready_.push_back(std::move(current_));
      current_ = SseEvent{};
      has_field_ = false;
      continue;
    }
    if (line[0] == ':') continue;  // a comment
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (name == "event") {
      current_.event.assign(value);
      has_field_ = true;
    } else if (name == "data") {
      if (!current_.data.empty()) current_.data += '\n';
      current_.data.append(value);
      has_field_ = true;
    }
    if (current_.data.size() + current_.event.size() > max_event_bytes_) {
      return make_error(ErrorCode::kCorruptFile, "server-sent event longer than {} bytes", max_event_bytes_);
    }
  }
  buffer_.erase(0, start);
  if (buffer_.size() > max_event_bytes_) {
    return make_error(ErrorCode::kCorruptFile, "server-sent event line longer than {} bytes", max_event_bytes_);
  }
  return Status::Ok();
}

std::optional<SseEvent> SseParser::next() {
  if (ready_at_ >= ready_.size()) {
    ready_.clear();
    ready_at_ = 0;
    return std::nullopt;
  }
  return std::move(ready_[ready_at_++]);
}

}  // namespace tachyon::server
