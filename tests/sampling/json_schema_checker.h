// A small JSON Schema validator for the grammar tests: the subset json_schema.h compiles, written from the
// specification (draft 2020-12) and independent of the compiler, so that sampled outputs can be judged.
// check() returns "" for a valid instance, else what failed and where.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "sampling/grammar.h"

namespace tachyon::grammar_test {

using ojson = nlohmann::ordered_json;

// Parses `text` as JSON; "" in `error` on success. Duplicate keys are allowed: extra (additionalProperties)
// keys may repeat one another in what the grammar produces (json_schema.h says why); declared keys never do,
// which the compiler's own tests check.
inline ojson parse_json(const std::string& text, std::string& error) {
  error.clear();
  try {
    return ojson::parse(text);
  } catch (const std::exception& e) {
    error = std::string("not JSON: ") + e.what();
  }
  return ojson();
}

class SchemaChecker {
 public:
  explicit SchemaChecker(const ojson& root) : root_(root) {}

  std::string check(const ojson& x, const ojson& s, const std::string& at = "$") const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("$ref")) {
      const ojson& target = root_.at(ojson::json_pointer(s["$ref"].get<std::string>().substr(1)));
      return check(x, target, at);
    }
    if (s.contains("anyOf")) {
      for (const ojson& sub : s["anyOf"]) {
        if (check(x, sub, at).empty()) return "";
      }
      return at + ": no anyOf branch matches";
    }
    if (s.contains("oneOf")) {
      int matches = 0;
      for (const ojson& sub : s["oneOf"]) matches += check(x, sub, at).empty();
      return matches == 1 ? "" : at + ": " + std::to_string(matches) + " oneOf branches match";
    }
    if (s.contains("allOf")) {
      for (const ojson& sub : s["allOf"]) {
        std::string e = check(x, sub, at);
        if (!e.empty()) return e;
      }
    }
    if (s.contains("const") && !(x == s["const"])) return at + ": not the const";
    if (s.contains("enum")) {
      bool found = false;
      for (const ojson& v : s["enum"]) found = found || v == x;
      if (!found) return at + ": not in enum";
    }
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string())
        ok = has_type(x, s["type"].get<std::string>());
      else
        for (const ojson& t : s["type"]) ok = ok || has_type(x, t.get<std::string>());
      if (!ok) return at + ": wrong type " + std::string(x.type_name());
    }
    if (x.is_string()) return check_string(x.get<std::string>(), s, at);
    if (x.is_number()) return check_number(x.get<double>(), s, at);
    if (x.is_object()) return check_object(x, s, at);
    if (x.is_array()) return check_array(x, s, at);
    return "";
  }

 private:
  static bool has_type(const ojson& x, const std::string& t) {
    if (t == "string") return x.is_string();
    if (t == "number") return x.is_number();
    if (t == "integer")
      return x.is_number_integer() || (x.is_number_float() && std::floor(x.get<double>()) == x.get<double>());
    if (t == "boolean") return x.is_boolean();
    if (t == "null") return x.is_null();
    if (t == "object") return x.is_object();
    if (t == "array") return x.is_array();
    return false;
  }

  static std::wstring wide(const std::string& utf8) {
    std::wstring out;
    size_t pos = 0;
    while (pos < utf8.size()) {
      std::optional<uint32_t> c = decode_utf8(utf8, pos);
      if (!c) return L"\xFFFD(invalid)";
      out.push_back(static_cast<wchar_t>(*c));
    }
    return out;
  }

  static bool format_ok(const std::string& format, const std::string& v) {
    auto digits = [&](size_t from, size_t n) {
      if (from + n > v.size()) return -1;
      int value = 0;
      for (size_t i = from; i < from + n; ++i) {
        if (v[i] < '0' || v[i] > '9') return -1;
        value = value * 10 + (v[i] - '0');
      }
      return value;
    };
    auto date_at = [&](size_t p) {
      static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
      const int month = digits(p + 5, 2), day = digits(p + 8, 2);
      return digits(p, 4) >= 0 && v[p + 4] == '-' && v[p + 7] == '-' && month >= 1 && month <= 12 && day >= 1 &&
             day <= kDays[month - 1];
    };
    auto time_at = [&](size_t p) {
      if (v.size() < p + 9 || digits(p, 2) > 23 || digits(p, 2) < 0 || v[p + 2] != ':' || digits(p + 3, 2) > 59 ||
          digits(p + 3, 2) < 0 || v[p + 5] != ':' || digits(p + 6, 2) > 59 || digits(p + 6, 2) < 0) {
        return false;
      }
      size_t q = p + 8;
      if (v[q] == '.') {
        size_t n = 0;
        while (q + 1 + n < v.size() && std::isdigit(static_cast<unsigned char>(v[q + 1 + n]))) ++n;
        if (n == 0) return false;
        q += 1 + n;
      }
      if (q < v.size() && v[q] == 'Z') return q + 1 == v.size();
      return q + 6 == v.size() && (v[q] == '+' || v[q] == '-') && digits(q + 1, 2) >= 0 && digits(q + 1, 2) <= 23 &&
             v[q + 3] == ':' && digits(q + 4, 2) >= 0 && digits(q + 4, 2) <= 59;
    };
    if (format == "date") return v.size() == 10 && date_at(0);
    if (format == "time") return time_at(0);
    if (format == "date-time") return v.size() > 11 && date_at(0) && v[10] == 'T' && time_at(11);
    if (format == "uuid") {
      if (v.size() != 36) return false;
      for (size_t i = 0; i < 36; ++i) {
        const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? v[i] != '-' : !std::isxdigit(static_cast<unsigned char>(v[i]))) return false;
      }
      return true;
    }
    if (format == "ipv4") {
      int parts = 0;
      size_t p = 0;
      while (p <= v.size()) {
        size_t end = v.find('.', p);
        if (end == std::string::npos) end = v.size();
        const std::string part = v.substr(p, end - p);
        if (part.empty() || part.size() > 3 || (part.size() > 1 && part[0] == '0') ||
            part.find_first_not_of("0123456789") != std::string::npos || std::stoi(part) > 255) {
          return false;
        }
        ++parts;
        p = end + 1;
        if (end == v.size()) break;
      }
      return parts == 4;
    }
    if (format == "email") {
      const size_t at = v.find('@');
      return at != std::string::npos && at > 0 && v.find('@', at + 1) == std::string::npos &&
             v.find('.', at) != std::string::npos && v.back() != '.';
    }
    return false;
  }

  std::string check_string(const std::string& v, const ojson& s, const std::string& at) const {
    const std::wstring w = wide(v);
    if (s.contains("minLength") && w.size() < s["minLength"].get<size_t>()) return at + ": shorter than minLength";
    if (s.contains("maxLength") && w.size() > s["maxLength"].get<size_t>()) return at + ": longer than maxLength";
    if (s.contains("pattern")) {
      const std::wregex re(wide(s["pattern"].get<std::string>()), std::regex::ECMAScript);
      if (!std::regex_search(w, re)) return at + ": pattern does not match";
    }
    if (s.contains("format") && !format_ok(s["format"].get<std::string>(), v)) return at + ": bad format";
    return "";
  }

  std::string check_number(double v, const ojson& s, const std::string& at) const {
    const bool draft4_min = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean();
    const bool draft4_max = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean();
    if (s.contains("minimum")) {
      const double m = s["minimum"].get<double>();
      if (v < m || (draft4_min && s["exclusiveMinimum"].get<bool>() && v == m)) return at + ": below minimum";
    }
    if (s.contains("maximum")) {
      const double m = s["maximum"].get<double>();
      if (v > m || (draft4_max && s["exclusiveMaximum"].get<bool>() && v == m)) return at + ": above maximum";
    }
    if (s.contains("exclusiveMinimum") && !draft4_min && v <= s["exclusiveMinimum"].get<double>()) {
      return at + ": not above exclusiveMinimum";
    }
    if (s.contains("exclusiveMaximum") && !draft4_max && v >= s["exclusiveMaximum"].get<double>()) {
      return at + ": not below exclusiveMaximum";
    }
    return "";
  }

  std::string check_object(const ojson& x, const ojson& s, const std::string& at) const {
    if (s.contains("required")) {
      for (const ojson& r : s["required"]) {
        if (!x.contains(r.get<std::string>())) return at + ": missing required '" + r.get<std::string>() + "'";
      }
    }
    for (const auto& [key, value] : x.items()) {
      const std::string where = at + "." + key;
      if (s.contains("properties") && s["properties"].contains(key)) {
        std::string e = check(value, s["properties"][key], where);
        if (!e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        std::string e = check(value, s["additionalProperties"], where);
        if (!e.empty()) return e;
      }
    }
    return "";
  }

  std::string check_array(const ojson& x, const ojson& s, const std::string& at) const {
    if (s.contains("minItems") && x.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
    if (s.contains("maxItems") && x.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
    size_t prefix = 0;
    if (s.contains("prefixItems")) {
      prefix = s["prefixItems"].size();
      for (size_t i = 0; i < prefix && i < x.size(); ++i) {
        std::string e = check(x[i], s["prefixItems"][i], at + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
    }
    if (s.contains("items")) {
      for (size_t i = prefix; i < x.size(); ++i) {
        std::string e = check(x[i], s["items"], at + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
    }
    return "";
  }

  const ojson& root_;
};

}  // namespace tachyon::grammar_test
