// Quantization tables: each input kind is read by the keys its command writes (src/cli/quantize.cpp,
// perplexity.cpp, calib_audit.cpp); a key that is missing or of another type shows as "—".
#include "report/quant_tables.h"

#include <algorithm>

#include <fmt/format.h>

#include "report/fields.h"
#include "report/svg.h"
#include "report/table.h"

namespace tachyon::report {
namespace {

using nlohmann::json;

Cell num_cell(std::optional<double> v) { return Cell{format_value(v), "num", {}}; }
Cell pct_cell(std::optional<double> v) { return Cell{format_percent(v), "num", {}}; }
// Perplexities differ in the third decimal between formats: four decimals, as docs/quant.md gives them.
std::string format_perplexity(std::optional<double> v) { return v ? fmt::format("{:.4f}", *v) : format_value(v); }

std::string join_strings(const json* list) {
  if (list == nullptr) return {};
  if (list->is_string()) return list->get<std::string>();
  if (!list->is_array()) return {};
  std::string out;
  for (const json& e : *list) {
    if (e.is_string()) out += (out.empty() ? "" : ", ") + e.get<std::string>();
  }
  return out;
}

std::string perplexity_table(const std::vector<QuantSource>& inputs) {
  Table t;
  t.id = "perplexity";
  t.caption = "Perplexity (tachyon perplexity --json); KL and top-1 against the model as stored (--kl)";
  t.header = {"model", "text", "weights", "weight format", "KV", "tokens scored", "perplexity",
              "reference perplexity", "change", "KL mean", "KL p99", "top-1 agreement"};
  for (const QuantSource& in : inputs) {
    const json& j = *in.json;
    const auto ppl = number(j, {"perplexity"}), ref = number(j, {"reference_perplexity"});
    std::optional<double> change;
    if (ppl && ref && *ref > 0) change = *ppl / *ref - 1.0;
    t.rows.push_back({Cell{text(j, {"model"}), {}, in.source}, Cell{text(j, {"text"}), {}, {}},
                      Cell{text(j, {"weights"}), {}, {}}, Cell{text(j, {"weight_format"}), {}, {}},
                      Cell{text(j, {"kv_dtype"}), {}, {}}, num_cell(number(j, {"tokens_scored"})),
                      Cell{format_perplexity(ppl), "num", {}}, Cell{format_perplexity(ref), "num", {}},
                      Cell{change ? fmt::format("{:+.2f} %", *change * 100.0) : format_value(change), "num", {}},
                      num_cell(number(j, {"kl_mean"})), num_cell(number(j, {"kl_p99"})),
                      pct_cell(number(j, {"top1_agreement"}))});
  }
  return render_table(t);
}

// quantize_report.json of `tachyon quantize --method`: one row per module of every layer.
std::string quantize_table(const QuantSource& in) {
  const json& j = *in.json;
  Table t;
  t.id = "quantize_modules";
  const auto before = number(j, {"totals", "bytes_before"}), after = number(j, {"totals", "bytes_after"});
  t.caption = fmt::format("{}: {} {}{}; {} modules quantized, {} kept 16-bit; weights {} MiB -> {} MiB. "
                          "Relative error: ||X Wq^T - X W^T|| / ||X W^T|| on the calibration tokens",
                          text(j, {"model"}), text(j, {"method"}),
                          text(j, {"group_size"}).empty() ? "" : "group ", text(j, {"group_size"}),
                          format_value(number(j, {"totals", "modules_quantized"})),
                          format_value(number(j, {"totals", "modules_16bit"})),
                          format_value(before ? std::optional<double>(*before / (1 << 20)) : std::nullopt),
                          format_value(after ? std::optional<double>(*after / (1 << 20)) : std::nullopt));
  t.header = {"module", "method", "format", "relative error", "RTN relative error", "vs RTN", "clip ratio", "alpha",
              "kept 16-bit"};
  const json* layers = field(j, {"layers"});
  for (const json& layer : *layers) {
    const json* modules = field(layer, {"modules"});
    if (modules == nullptr || !modules->is_array()) continue;
    for (const json& m : *modules) {
      const auto error = number(m, {"relative_error"}), rtn = number(m, {"rtn_relative_error"});
      std::optional<double> ratio;
      if (error && rtn && *rtn > 0) ratio = *error / *rtn;
      const json* kept = field(m, {"kept_16bit"});
      t.rows.push_back({Cell{text(m, {"module"}), {}, in.source}, Cell{text(m, {"method"}), {}, {}},
                        Cell{text(m, {"format"}), {}, {}}, num_cell(error), num_cell(rtn),
                        Cell{ratio ? fmt::format("{:.2f}x", *ratio) : format_value(ratio), "num", {}},
                        num_cell(number(m, {"clip_ratio"})), num_cell(number(m, {"alpha"})),
                        Cell{kept != nullptr && kept->is_boolean() && kept->get<bool>() ? "yes" : "", {}, {}}});
    }
  }
  return render_table(t);
}

// quantize_report.json of `tachyon quantize --budget`: per module, every candidate format's
// relative error (the chosen one marked), then what other budgets would choose.
std::string budget_tables(const QuantSource& in) {
  const json& j = *in.json;
  const json* modules = field(j, {"modules"});
  std::vector<std::string> formats;  // candidates in order of first appearance
  for (const json& m : *modules) {
    const json* candidates = field(m, {"candidates"});
    if (candidates == nullptr || !candidates->is_array()) continue;
    for (const json& c : *candidates) {
      const std::string f = text(c, {"format"});
      if (!f.empty() && std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
    }
  }
  Table t;
  t.id = "quantize_budget";
  t.caption = fmt::format(
      "{}: error budget {}; end to end on {}: KL {} (predicted {}), top-1 {}, perplexity {} (16-bit {}). "
      "Cells: relative output error of each candidate format; the chosen one is marked",
      text(j, {"model"}), format_value(number(j, {"budget"})), text(j, {"end_to_end", "text"}),
      format_value(number(j, {"end_to_end", "choice", "kl"})), format_value(number(j, {"end_to_end", "predicted_kl"})),
      format_percent(number(j, {"end_to_end", "choice", "top1_agreement"})),
      format_perplexity(number(j, {"end_to_end", "choice", "perplexity"})),
      format_perplexity(number(j, {"end_to_end", "choice", "reference_perplexity"})));
  t.header = {"module", "chosen", "bytes", "of dense"};
  for (const std::string& f : formats) t.header.push_back(f);
  for (const json& m : *modules) {
    const std::string chosen = text(m, {"format"});
    const auto bytes = number(m, {"bytes"}), dense = number(m, {"dense_bytes"});
    std::optional<double> share;
    if (bytes && dense && *dense > 0) share = *bytes / *dense;
    std::vector<Cell> row = {Cell{text(m, {"module"}), {}, in.source}, Cell{chosen, {}, {}}, num_cell(bytes),
                             pct_cell(share)};
    for (const std::string& f : formats) {
      Cell cell{format_value(std::nullopt), "num", {}};
      const json* candidates = field(m, {"candidates"});
      if (candidates != nullptr && candidates->is_array()) {
        for (const json& c : *candidates) {
          if (text(c, {"format"}) != f) continue;
          cell.text = format_value(number(c, {"relative_error"}));
          cell.tooltip = fmt::format("{} bytes", format_value(number(c, {"bytes"})));
          if (f == chosen) cell.css_class = "num chosen";
        }
      }
      row.push_back(std::move(cell));
    }
    t.rows.push_back(std::move(row));
  }
  std::string out = render_table(t);
  const json* budgets = field(j, {"budgets"});
  if (budgets != nullptr && budgets->is_array() && !budgets->empty()) {
    Table s;
    s.id = "quantize_budgets";
    s.caption = "What other error budgets would choose (from the same measurements)";
    s.header = {"budget", "bytes", "fewer bytes", "predicted KL"};
    for (const json& b : *budgets) {
      s.rows.push_back({num_cell(number(b, {"budget"})), num_cell(number(b, {"bytes"})),
                        pct_cell(number(b, {"fewer_bytes"})), num_cell(number(b, {"predicted_kl"}))});
    }
    out += render_table(s);
  }
  return out;
}

std::string calib_audit_table(const std::vector<QuantSource>& inputs) {
  Table t;
  t.id = "calib_audit";
  t.caption = "Calibration against evaluation text (tachyon calib-audit --json)";
  t.header = {"calibration",    "evaluation", "n-gram", "paragraph overlap",
              "n-gram overlap", "limits (paragraph / n-gram)", "passes"};
  for (const QuantSource& in : inputs) {
    const json& j = *in.json;
    const json* passes = field(j, {"passes"});
    t.rows.push_back(
        {Cell{join_strings(field(j, {"calib"})), {}, in.source}, Cell{join_strings(field(j, {"eval"})), {}, {}},
         num_cell(number(j, {"ngram"})), pct_cell(number(j, {"paragraph_overlap"})),
         pct_cell(number(j, {"ngram_overlap"})),
         Cell{fmt::format("{} / {}", format_percent(number(j, {"limits", "max_paragraph_overlap"})),
                          format_percent(number(j, {"limits", "max_ngram_overlap"}))),
              "num", {}},
         Cell{passes != nullptr && passes->is_boolean() ? (passes->get<bool>() ? "yes" : "no") : "", {}, {}}});
  }
  return render_table(t);
}

}  // namespace

QuantInput quant_input_kind(const json& j) {
  if (!j.is_object()) return QuantInput::kNone;
  const auto is = [&](const char* key, bool (json::*type)() const noexcept) {
    auto it = j.find(key);
    return it != j.end() && ((*it).*type)();
  };
  if (is("perplexity", &json::is_number) && is("tokens_scored", &json::is_number)) return QuantInput::kPerplexity;
  if (is("layers", &json::is_array) && is("totals", &json::is_object)) return QuantInput::kQuantize;
  if (is("budget", &json::is_number) && is("modules", &json::is_array)) return QuantInput::kBudget;
  if (is("ngram_overlap", &json::is_number) && is("paragraph_overlap", &json::is_number)) {
    return QuantInput::kCalibAudit;
  }
  return QuantInput::kNone;
}

std::string render_quant_section(const std::vector<QuantSource>& inputs) {
  if (inputs.empty()) return {};
  std::vector<QuantSource> perplexity, audits;
  std::string body;
  for (const QuantSource& in : inputs) {
    switch (quant_input_kind(*in.json)) {
      case QuantInput::kPerplexity: perplexity.push_back(in); break;
      case QuantInput::kCalibAudit: audits.push_back(in); break;
      case QuantInput::kQuantize: body += quantize_table(in); break;
      case QuantInput::kBudget: body += budget_tables(in); break;
      case QuantInput::kNone: break;
    }
  }
  std::string out = "<section id=\"fig-quant_table\" data-figure=\"quant_table\">\n<h2>Quantization quality</h2>\n";
  if (!perplexity.empty()) out += perplexity_table(perplexity);
  out += body;
  if (!audits.empty()) out += calib_audit_table(audits);
  out += "</section>\n";
  return out;
}

}  // namespace tachyon::report
