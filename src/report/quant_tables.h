// The report's quantization section: tables from `tachyon perplexity --json`,
// quantize_report.json (both `tachyon quantize --method` and `--budget`) and `tachyon calib-audit
// --json` (report/report.h lists the keys that recognise each).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tachyon::report {

enum class QuantInput { kNone, kPerplexity, kQuantize, kBudget, kCalibAudit };

QuantInput quant_input_kind(const nlohmann::json& j);

struct QuantSource {
  const nlohmann::json* json = nullptr;
  std::string source;  // the file it came from; may be empty
};

// A `<section data-figure="quant_table">` with one table per kind of input present; empty when
// `inputs` is.
std::string render_quant_section(const std::vector<QuantSource>& inputs);

}  // namespace tachyon::report
