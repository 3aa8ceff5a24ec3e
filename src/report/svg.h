// Small SVG charts for the offline benchmark report (report/report.h): line charts with several
// series (straight or stepped, e.g. CDFs), grouped bar charts, axes with nice ticks (linear or
// log10), a legend under the plot, a title, axis labels and dashed horizontal/vertical reference
// lines. Output is one self-contained `<svg>` element (no scripts, no external references).
//
// What tests can rely on in the markup:
//   - the `<svg>` carries data-figure="<id>" and data-plot="LEFT TOP RIGHT BOTTOM", the plot area
//     in the svg's own pixel coordinates; every drawn series point and bar lies inside it (values
//     past a forced axis bound are drawn at the bound);
//   - each line series is one `<polyline class="series" data-series="<name>" data-n="<count>">`
//     (data-n: LineSeries::data_count, else its number of points); each bar is a
//     `<rect class="series" data-series="<name>" data-category="<category>">`; legend swatches,
//     markers (`class="marker"`), grid lines and reference lines (`class="reference"`) never carry
//     class="series";
//   - every string from the caller is escaped (escape_xml), in text and attributes alike.
// Points are given in data units; points that a log axis cannot show (<= 0) and non-finite
// coordinates are left out of the drawing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tachyon::report {

// `text` with & < > " ' replaced by entities: safe in XML/HTML text and quoted attributes.
std::string escape_xml(std::string_view text);

// A tick label: "0", "2.5", "0.001", "12k", "3.5M"; at most about 6 significant digits.
std::string format_tick(double value);

struct Ticks {
  double lo = 0.0;  // the axis' range, widened to whole ticks
  double hi = 1.0;
  std::vector<double> at;  // tick values within [lo, hi], ascending
};
// About `target` ticks at 1, 2, 2.5 or 5 times a power of ten, covering [lo, hi]. A zero-width
// range is widened around its value.
Ticks linear_ticks(double lo, double hi, int target = 6);
// Decades covering [lo, hi] (both > 0), with 2 and 5 in between when fewer than 3 decades.
Ticks log_ticks(double lo, double hi);

struct Point {
  double x = 0.0;
  double y = 0.0;
};

enum class LineShape {
  kStraight,  // segments between consecutive points
  kStep,      // from each point horizontally to the next point's x, then vertically to it
};

struct LineSeries {
  std::string name;
  std::vector<Point> points;  // in drawing order
  LineShape shape = LineShape::kStraight;
  bool markers = true;       // a small circle at each given point
  int64_t data_count = -1;   // written as data-n (e.g. the samples behind a CDF); -1: points.size()
};

struct AxisSpec {
  std::string label;
  bool log = false;            // log10 scale; needs positive values
  bool include_zero = false;   // linear axes: the range reaches 0
  std::optional<double> min;   // forced bounds (ticks still nice when the bounds are)
  std::optional<double> max;
};

// kX: a vertical line at x = value; kY: horizontal at y = value; kIdentity: the line y = x where it
// crosses the plot (value unused; it does not widen the axes; no text, the label is its tooltip),
// e.g. goodput against the offered rate.
enum class ReferenceAxis { kX, kY, kIdentity };

struct ReferenceLine {
  ReferenceAxis axis = ReferenceAxis::kY;
  double value = 0.0;
  std::string label;
};

struct LineChart {
  std::string id;     // data-figure
  std::string title;
  AxisSpec x;
  AxisSpec y;
  std::vector<LineSeries> series;
  std::vector<ReferenceLine> references;  // kX and kY widen the axes' ranges to include themselves
};

struct BarSeries {
  std::string name;
  std::vector<double> values;  // one per category; NaN (or a missing tail): no bar
};

struct BarChart {
  std::string id;
  std::string title;
  std::vector<std::string> categories;  // along x, in order; each holds one bar per series
  std::string x_label;
  AxisSpec y;  // linear; bars start at 0
  std::vector<BarSeries> series;
  std::vector<ReferenceLine> references;  // kY only; others are ignored
};

std::string render_line_chart(const LineChart& chart);
std::string render_bar_chart(const BarChart& chart);

}  // namespace tachyon::report
