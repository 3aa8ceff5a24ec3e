// Leveled logging to stderr. The level comes from TACHYON_LOG (error|warn|info|debug) or
// set_log_level(); stdout is reserved for a command's actual output (generated text, JSON).
#pragma once

#include <string>

#include <fmt/format.h>

namespace tachyon {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(log_level())) {
    log_message(level, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace tachyon

#define TACHYON_LOG_ERROR(...) ::tachyon::log_at(::tachyon::LogLevel::kError, __VA_ARGS__)
#define TACHYON_LOG_WARN(...) ::tachyon::log_at(::tachyon::LogLevel::kWarn, __VA_ARGS__)
#define TACHYON_LOG_INFO(...) ::tachyon::log_at(::tachyon::LogLevel::kInfo, __VA_ARGS__)
#define TACHYON_LOG_DEBUG(...) ::tachyon::log_at(::tachyon::LogLevel::kDebug, __VA_ARGS__)
