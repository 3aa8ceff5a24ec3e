// Host-side helpers internal to ops/cuda: argument checks that return Status with the offending
// values, and the once-per-process log line naming a kernel variant the first time it runs.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "core/log.h"
#include "core/status.h"

namespace tachyon::ops::cuda {

// Logs `path` once per process at info level ("cuda linear: gemv bf16, 16-byte loads").
void log_path_once(std::string_view path);
template <typename... Args>
void log_path_once(fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(log_level()) < static_cast<int>(LogLevel::kInfo)) return;
  log_path_once(std::string_view(fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace tachyon::ops::cuda

// Returns kInvalidArgument with a formatted message from the enclosing function unless `cond`.
#define TACHYON_CUDA_REQUIRE(cond, ...)                                                      \
  do {                                                                                       \
    if (!(cond)) return ::tachyon::make_error(::tachyon::ErrorCode::kInvalidArgument, __VA_ARGS__); \
  } while (0)
