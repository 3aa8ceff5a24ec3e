#include "report/table.h"

#include <fmt/format.h>

#include "report/svg.h"

namespace tachyon::report {

std::string render_table(const Table& table) {
  std::string out = fmt::format("<div class=\"table-wrap\"><table data-table=\"{}\">\n", escape_xml(table.id));
  if (!table.caption.empty()) out += fmt::format("<caption>{}</caption>\n", escape_xml(table.caption));
  out += "<thead><tr>";
  for (const std::string& h : table.header) out += fmt::format("<th>{}</th>", escape_xml(h));
  out += "</tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < table.rows.size(); ++r) {
    out += fmt::format("<tr data-row=\"{}\">", r);
    for (const Cell& c : table.rows[r]) {
      out += "<td";
      if (!c.css_class.empty()) out += fmt::format(" class=\"{}\"", escape_xml(c.css_class));
      if (!c.tooltip.empty()) out += fmt::format(" title=\"{}\"", escape_xml(c.tooltip));
      out += fmt::format(">{}</td>", escape_xml(c.text));
    }
    out += "</tr>\n";
  }
  out += "</tbody></table></div>\n";
  return out;
}

}  // namespace tachyon::report
