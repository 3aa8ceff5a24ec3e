#include "ops/cpu/isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>

#include "core/log.h"
#include "core/status.h"

namespace tachyon::ops::cpu {
namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

}  // namespace

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

namespace {

Isa env_or_detected() {
  const Isa detected = detected_isa();
  const char* env = std::getenv("TACHYON_ISA");
  if (env == nullptr || *env == '\0') return detected;
  const std::optional<Isa> wanted = parse_isa(env);
  if (!wanted) {
    TACHYON_LOG_WARN("TACHYON_ISA={} is not one of scalar|avx2|avx512; using {}", env, isa_name(detected));
    return detected;
  }
  if (!isa_supported(*wanted)) {
    TACHYON_LOG_WARN("TACHYON_ISA={}: this CPU or build cannot run it; using {}", env, isa_name(detected));
    return detected;
  }
  return *wanted;
}

// -1: no override; else an Isa value.
std::atomic<int> g_override{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  if (name == "scalar" || name == "reference") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return std::nullopt;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: {
      static const bool has = cpu_has_avx2();
      return has;
    }
    case Isa::kAvx512: {
      static const bool has = cpu_has_avx512();
      return has;
    }
  }
  return false;
}

Isa detected_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa active_isa() {
  const int forced = g_override.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Isa>(forced);
  static const Isa chosen = env_or_detected();
  return chosen;
}

void set_isa(Isa isa) {
  TACHYON_CHECK(isa_supported(isa), "set_isa({}): not supported by this CPU or build", isa_name(isa));
  g_override.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void clear_isa_override() { g_override.store(-1, std::memory_order_relaxed); }

void log_path_once(std::string_view path) {
  if (static_cast<int>(log_level()) < static_cast<int>(LogLevel::kInfo)) return;
  static std::mutex mutex;
  static std::unordered_set<std::string> seen;
  std::string key(path);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.insert(key).second) return;
  }
  TACHYON_LOG_INFO("{}", key);
}

namespace {
// -1: no override; 0 / 1: off / on.
std::atomic<int> g_int8_dot_override{-1};
}  // namespace

bool int8_dot_enabled() {
  const int o = g_int8_dot_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  static const bool from_env = [] {
    const char* env = std::getenv("TACHYON_INT8_DOT");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return from_env;
}

void set_int8_dot(bool enabled) { g_int8_dot_override.store(enabled ? 1 : 0, std::memory_order_relaxed); }
void clear_int8_dot_override() { g_int8_dot_override.store(-1, std::memory_order_relaxed); }

}  // namespace tachyon::ops::cpu
