#include "engine/stop_strings.h"

#include <algorithm>

namespace tachyon {

Status validate_stop_strings(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return make_error(ErrorCode::kInvalidArgument, "{} stop strings; at most {}", stops.size(), kMaxStopStrings);
  }
  for (const auto& s : stops) {
    if (s.size() > kMaxStopStringBytes) {
      return make_error(ErrorCode::kInvalidArgument, "a stop string of {} bytes; at most {}", s.size(),
                        kMaxStopStringBytes);
    }
  }
  return Status::Ok();
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop) : include_stop_(include_stop) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));  // an empty stop string would match at once
  }
}

std::string StopStringMatcher::push(std::string_view piece, bool may_stop) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(piece);
  pending_.append(piece);
  if (may_stop) {
    // The first stop string to be complete wins: the match that ends earliest (then starts
    // earliest), which does not depend on how the text was cut into pieces. Only matches that end
    // past the unarmed bytes count.
    size_t best = std::string::npos, best_end = std::string::npos;
    const std::string* best_stop = nullptr;
    for (const std::string& s : stops_) {
      const size_t from = unarmed_ >= s.size() ? unarmed_ - s.size() + 1 : 0;
      const size_t at = pending_.find(s, from);
      if (at == std::string::npos) continue;
      const size_t end = at + s.size();
      if (end < best_end || (end == best_end && at < best)) {
        best = at;
        best_end = end;
        best_stop = &s;
      }
    }
    if (best_stop != nullptr) {
      matched_ = *best_stop;
      std::string out = pending_.substr(0, include_stop_ ? best_end : best);
      pending_.clear();
      unarmed_ = 0;
      return out;
    }
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  const size_t shown = pending_.size() - keep;
  std::string out = pending_.substr(0, shown);
  pending_.erase(0, shown);
  unarmed_ = may_stop ? (unarmed_ > shown ? unarmed_ - shown : 0) : pending_.size();
  return out;
}

std::string StopStringMatcher::flush() {
  if (matched_) return {};
  std::string out;
  out.swap(pending_);
  unarmed_ = 0;
  return out;
}

}  // namespace tachyon
