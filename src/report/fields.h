// Reading the report's JSON inputs without trusting them: a missing key, a wrong type or a
// non-finite number reads as absent, never as an exception or a crash. Shared by report.cpp and
// quant_tables.cpp.
#pragma once

#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tachyon::report {

// j[path[0]][path[1]]...; nullptr where a step is not an object or lacks the key.
inline const nlohmann::json* field(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* at = &j;
  for (const char* key : path) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(key);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

inline std::optional<double> as_number(const nlohmann::json* j) {
  if (j == nullptr || !j->is_number()) return std::nullopt;
  const double v = j->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

inline std::optional<double> number(const nlohmann::json& j, std::initializer_list<const char*> path) {
  return as_number(field(j, path));
}

// A string as it is, a number or bool as JSON prints it; "" for anything else.
inline std::string text(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* at = field(j, path);
  if (at == nullptr) return {};
  if (at->is_string()) return at->get<std::string>();
  if (at->is_number() || at->is_boolean()) return at->dump();
  return {};
}

// A table cell's number: whole numbers as such (thousands separated from 10,000 up), others with
// about 3-4 significant digits; "—" when absent.
inline std::string format_value(std::optional<double> v) {
  if (!v) return "\xE2\x80\x94";
  const double a = std::abs(*v);
  if (a == 0.0) return "0";
  if (a < 1e15 && std::floor(a) == a) {
    std::string digits = fmt::format("{:.0f}", a);
    if (a >= 1e4) {
      for (size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, ",");
    }
    return (*v < 0 ? "-" : "") + digits;
  }
  if (a >= 100.0) return fmt::format("{:.0f}", *v);
  if (a >= 10.0) return fmt::format("{:.1f}", *v);
  if (a >= 1.0) return fmt::format("{:.2f}", *v);
  return fmt::format("{:.3g}", *v);
}

// A share in [0, 1] as "12.3 %", "—" when absent.
inline std::string format_percent(std::optional<double> v) {
  return v ? fmt::format("{:.1f} %", *v * 100.0) : std::string("\xE2\x80\x94");
}

}  // namespace tachyon::report
