// Which instruction set the CPU kernels use. The choice is process-wide state in ops/cpu (with
// int8_dot_enabled below): detected once from the running CPU (x86-64 builds assume AVX2 + FMA + F16C; AVX-512
// F/BW/VL/DQ is used when the CPU reports it), and overridable by TACHYON_ISA=scalar|avx2|avx512
// in the environment or by set_isa() (tests and benchmarks use it to run each path). kScalar routes
// every op to the scalar reference kernels.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string_view>

#include "core/log.h"

namespace tachyon::ops::cpu {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);  // "scalar", "avx2", "avx512"

// Whether this build and this CPU can run `isa`.
bool isa_supported(Isa isa);
// The best supported ISA (ignores overrides).
Isa detected_isa();
// The ISA the kernels use now: the override if set, else TACHYON_ISA if set and supported, else
// detected_isa().
Isa active_isa();
// Whether this build and this CPU have AVX-512 VNNI (the int8 dot product vpdpbusd), which the
// W8A8 linear uses while kAvx512 is active.
bool cpu_has_avx512_vnni();
// Forces `isa` (must be supported: an internal invariant) until clear_isa_override().
void set_isa(Isa isa);
void clear_isa_override();

// Whether the GGUF block formats, per-channel int8 and group-wise int4 weights multiply int8 codes of the
// activations (quant_linear.h dot_linear_supported: fast, the activations rounded to 8 bits per block of 32)
// or the exact f32 activations. On unless TACHYON_INT8_DOT=0 or an override (tests and benchmarks
// run both) says otherwise: the second and last piece of process-wide state here.
bool int8_dot_enabled();
void set_int8_dot(bool enabled);  // until clear_int8_dot_override()
void clear_int8_dot_override();

// Logs `path` once per process at info level (the first time a kernel variant runs), so the logs
// say which implementation ran: "linear: avx512 bf16 gemv".
void log_path_once(std::string_view path);
template <typename... Args>
void log_path_once(fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(log_level()) < static_cast<int>(LogLevel::kInfo)) return;
  log_path_once(std::string_view(fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace tachyon::ops::cpu
