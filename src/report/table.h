// HTML tables for the benchmark report: a header row, body rows of cells and a caption, every
// string escaped. The `<table>` carries data-table="<id>" and each body row data-row="<index>", so
// that tests can count rows.
#pragma once

#include <string>
#include <vector>

namespace tachyon::report {

struct Cell {
  std::string text;
  std::string css_class;  // e.g. "num" (right-aligned), "chosen"; empty: none
  std::string tooltip;    // the cell's title attribute; empty: none
};

struct Table {
  std::string id;
  std::string caption;
  std::vector<std::string> header;
  std::vector<std::vector<Cell>> rows;
};

std::string render_table(const Table& table);

}  // namespace tachyon::report
