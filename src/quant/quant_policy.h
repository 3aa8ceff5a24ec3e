// Mixed precision per module (`--quant-policy FILE`): which format each linear layer gets,
// chosen by the first rule whose glob pattern matches the module's name. The file holds one rule
// per line, `PATTERN FORMAT`, `#` starting a comment:
//
//   # keep the MLP gates 16-bit, the first layer int8, everything else int4 group 64
//   *.mlp.gate_proj      dense
//   model.layers.0.*     int8
//   *                    int4:g64
//
// Modules are named as in Hugging Face checkpoints: model.layers.N.self_attn.{q,k,v,o}_proj,
// model.layers.N.mlp.{gate,up,down}_proj, and lm_head (an untied LM head only). FORMAT is a
// `--quant` name (int8, int4, w8a8, fp8, ternary or a GGUF block format: q8_0, q4_0, q4_1, q5_0,
// q5_1, iq4_nl, q4_k, q5_k, q6_k), with `:gN` for the group of
// int4 and ternary, or `dense` for the weight as stored. Patterns take `*` (any run of
// characters, dots included) and `?` (one character). A module no rule matches gets the
// fallback (the `--quant` format, or dense without one).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/quantize.h"

namespace tachyon {

struct QuantPolicyRule {
  std::string pattern;
  std::optional<QuantSpec> spec;  // nullopt: dense
  int line = 0;                   // in the file, for messages
};

class QuantPolicy {
 public:
  // Parses the rules; a bad line is InvalidArgument naming `where` and the line number.
  static Result<QuantPolicy> parse(const std::string& text, const std::string& where);
  static Result<QuantPolicy> read_file(const std::string& path);

  // The spec of `module`: the first matching rule's, else `fallback` (nullopt: dense).
  std::optional<QuantSpec> spec_for(const std::string& module, const std::optional<QuantSpec>& fallback) const;
  const std::vector<QuantPolicyRule>& rules() const { return rules_; }

 private:
  std::vector<QuantPolicyRule> rules_;
};

// Glob match of `name` against `pattern` ('*' any run, '?' one character).
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace tachyon
