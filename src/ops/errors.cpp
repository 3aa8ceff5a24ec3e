#include "ops/errors.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/log.h"
#include "ops/backend.h"

namespace tachyon::ops {
namespace {

// [device type][fault]: points of that kind still to pass before one fails (0: none armed).
std::array<std::array<std::atomic<int>, 2>, 2> g_countdown{};

std::atomic<int>& countdown(DeviceType type, Fault fault) {
  return g_countdown[static_cast<size_t>(type)][static_cast<size_t>(fault)];
}

// TACHYON_INJECT_FAULT="workspace:N,kernel:M", read once when the library loads.
const bool g_env_read = [] {
  const char* env = std::getenv("TACHYON_INJECT_FAULT");
  if (env == nullptr) return true;
  std::string_view rest(env);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = item.find(':');
    const std::string_view kind = item.substr(0, colon);
    const int after = colon == std::string_view::npos ? 1 : std::atoi(std::string(item.substr(colon + 1)).c_str());
    if ((kind != "workspace" && kind != "kernel") || after < 1) {
      TACHYON_LOG_WARN("TACHYON_INJECT_FAULT: '{}' is not workspace:N or kernel:N (N >= 1); ignored", item);
      continue;
    }
    const Fault fault = kind == "workspace" ? Fault::kWorkspace : Fault::kKernel;
    for (DeviceType type : {DeviceType::kCpu, DeviceType::kCuda}) inject_fault(type, fault, after);
    TACHYON_LOG_WARN("TACHYON_INJECT_FAULT: the {}th {} will fail", after, kind);
  }
  return true;
}();

}  // namespace

Status take_error(Device device) {
  Backend* b = backend_for(device);
  return b != nullptr ? b->take_error() : Status::Ok();
}

void inject_fault(DeviceType type, Fault fault, int after) { countdown(type, fault).store(after < 1 ? 0 : after); }

namespace detail {

bool consume_fault(DeviceType type, Fault fault) {
  std::atomic<int>& c = countdown(type, fault);
  int left = c.load(std::memory_order_relaxed);
  while (left > 0) {
    if (c.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return left == 1;
  }
  return false;
}

Status injected_error(Fault fault, const char* what) {
  return fault == Fault::kWorkspace
             ? make_error(ErrorCode::kOutOfMemory, "out of memory allocating {} (injected fault)", what)
             : make_error(ErrorCode::kInternal, "{}: kernel launch failed (injected fault)", what);
}

}  // namespace detail
}  // namespace tachyon::ops
