#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace tachyon {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorruptFile: return "corrupt file";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

std::string excerpt(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not mid-character
  return fmt::format("{}... ({} bytes)", text.substr(0, cut), text.size());
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", error_code_name(code_), message_);
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void check_failed(const char* file, int line, const char* cond, const std::string& message) {
  std::fprintf(stderr, "%s:%d: internal check failed: %s: %s\n", file, line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tachyon
