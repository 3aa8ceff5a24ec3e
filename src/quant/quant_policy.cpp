#include "quant/quant_policy.h"

#include <fstream>
#include <sstream>

namespace tachyon {

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative matching with one backtrack point (the last '*'), linear in practice.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Result<QuantPolicy> QuantPolicy::parse(const std::string& text, const std::string& where) {
  QuantPolicy policy;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string pattern, format, extra;
    if (!(fields >> pattern)) continue;  // blank or comment
    if (!(fields >> format) || (fields >> extra)) {
      return make_error(ErrorCode::kInvalidArgument, "{}:{}: expected 'PATTERN FORMAT', got '{}'", where, number,
                        line);
    }
    QuantPolicyRule rule;
    rule.pattern = pattern;
    rule.line = number;
    if (format != "dense") {
      std::string name = format;
      int group = 128;
      if (const size_t colon = format.find(':'); colon != std::string::npos) {
        name = format.substr(0, colon);
        const std::string g = format.substr(colon + 1);
        if (g.size() < 2 || g[0] != 'g' || g.find_first_not_of("0123456789", 1) != std::string::npos ||
            g.size() > 5 || (name != "int4" && name != "ternary")) {
          return make_error(ErrorCode::kInvalidArgument, "{}:{}: '{}': a group is written int4:gN or ternary:gN",
                            where, number, format);
        }
        group = std::stoi(g.substr(1));
      }
      auto spec = parse_quant_spec(name, group);
      if (!spec.ok()) return spec.status().with_context(fmt::format("{}:{}", where, number));
      rule.spec = *spec;
    }
    policy.rules_.push_back(std::move(rule));
  }
  if (policy.rules_.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: no rules", where);
  return policy;
}

Result<QuantPolicy> QuantPolicy::read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, "--quant-policy {}: cannot open the file", path);
  std::ostringstream text;
  text << f.rdbuf();
  return parse(text.str(), path);
}

std::optional<QuantSpec> QuantPolicy::spec_for(const std::string& module,
                                               const std::optional<QuantSpec>& fallback) const {
  for (const QuantPolicyRule& r : rules_) {
    if (glob_match(r.pattern, module)) return r.spec;
  }
  return fallback;
}

}  // namespace tachyon
