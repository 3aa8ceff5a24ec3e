// Helpers shared by the fuzz harnesses. A harness must never abort on bad input (that is the bug
// it hunts); it only discards the Status the parser returns.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/log.h"

namespace tachyon::fuzz {

// Parsers warn about odd input (ignored keys, unknown tokens); a fuzzer would print millions.
inline void quiet_logs() {
  static const bool once = [] {
    set_log_level(LogLevel::kError);
    return true;
  }();
  (void)once;
}

// A file the file-only readers (mmap) can open: under /dev/shm (memory-backed) when it exists,
// else $TMPDIR. One per process and name, rewritten for every input.
class InputFile {
 public:
  explicit InputFile(const char* name) {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    path_ = std::string(dir) + "/tachyon-fuzz-" + std::to_string(getpid()) + "-" + name;
  }
  ~InputFile() { std::remove(path_.c_str()); }
  const std::string& write(const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (f != nullptr) {
      if (size > 0) std::fwrite(data, 1, size, f);
      std::fclose(f);
    }
    return path_;
  }
  const std::string& write(std::string_view text) {
    return write(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Splits the input at its first occurrence of `separator` (for harnesses with two inputs); the
// second part is empty when there is none.
inline std::pair<std::string_view, std::string_view> split_input(const uint8_t* data, size_t size,
                                                                std::string_view separator) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t at = all.find(separator);
  if (at == std::string_view::npos) return {all, {}};
  return {all.substr(0, at), all.substr(at + separator.size())};
}

}  // namespace tachyon::fuzz
