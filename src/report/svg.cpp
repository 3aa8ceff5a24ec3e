// SVG charts: layout is fixed (760 px wide, a 660 x 280 px plot area, the legend below it), so
// that every figure of a report lines up and tests can read the plot area from data-plot.
#include "report/svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tachyon::report {
namespace {

constexpr double kWidth = 760.0;
constexpr double kLeft = 76.0;
constexpr double kRight = 736.0;
constexpr double kTop = 44.0;
constexpr double kBottom = 324.0;
constexpr double kLegendTop = kBottom + 62.0;
constexpr double kLegendRow = 18.0;
// Past this magnitude a value is not plotted: the axis arithmetic (hi - lo) must stay finite.
constexpr double kMaxMagnitude = 1e150;
constexpr size_t kMaxLegendChars = 110;

// Tableau 10: distinct on white and under the common colour-vision deficiencies; series past the
// tenth reuse the colours dashed.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

std::string color(size_t i) { return kPalette[i % kPaletteSize]; }
std::string dash(size_t i) { return i >= kPaletteSize ? " stroke-dasharray=\"6 3\"" : ""; }
std::string px(double v) { return fmt::format("{:.1f}", v); }

bool drawable(double v, bool log) { return std::isfinite(v) && std::abs(v) <= kMaxMagnitude && (!log || v > 0.0); }

// Data value to pixel; values outside [lo, hi] land on the nearer edge.
struct Scale {
  bool log = false;
  double lo = 0.0, hi = 1.0;
  double p0 = 0.0, p1 = 1.0;  // pixels of lo and hi

  double operator()(double v) const {
    double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    if (!std::isfinite(t)) t = 0.0;
    t = std::clamp(t, 0.0, 1.0);
    return p0 + t * (p1 - p0);
  }
};

Ticks axis_ticks(const AxisSpec& axis, const std::vector<double>& values) {
  double lo = 0.0, hi = 0.0;
  bool any = false;
  for (double v : values) {
    if (!drawable(v, axis.log)) continue;
    lo = any ? std::min(lo, v) : v;
    hi = any ? std::max(hi, v) : v;
    any = true;
  }
  if (!any) {
    lo = axis.log ? 1.0 : 0.0;
    hi = axis.log ? 10.0 : 1.0;
  }
  if (!axis.log && axis.include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  const bool min_ok = axis.min && drawable(*axis.min, axis.log);
  const bool max_ok = axis.max && drawable(*axis.max, axis.log);
  if (min_ok) lo = *axis.min;
  if (max_ok) hi = *axis.max;
  if (hi < lo) std::swap(lo, hi);
  Ticks t = axis.log ? log_ticks(lo, hi) : linear_ticks(lo, hi);
  if (min_ok || max_ok) {
    if (min_ok) t.lo = lo;
    if (max_ok) t.hi = hi;
    if (!(t.hi > t.lo)) t.hi = axis.log ? t.lo * 10.0 : t.lo + 1.0;
    std::vector<double> kept;
    for (double v : t.at) {
      if (v >= t.lo - 1e-12 * std::abs(t.lo) && v <= t.hi + 1e-12 * std::abs(t.hi)) kept.push_back(v);
    }
    t.at = std::move(kept);
  }
  return t;
}

std::string svg_open(const std::string& id, const std::string& title, double height) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-figure=\"{}\" data-plot=\"{} {} {} {}\" "
      "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\" "
      "aria-label=\"{}\">\n",
      escape_xml(id), px(kLeft), px(kTop), px(kRight), px(kBottom), kWidth, height, kWidth, height,
      escape_xml(title));
}

double svg_height(size_t legend_rows) { return kLegendTop + kLegendRow * static_cast<double>(legend_rows) + 8.0; }

std::string title_text(const std::string& title) {
  return fmt::format("<text class=\"title\" x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
                     "font-weight=\"bold\">{}</text>\n",
                     px(kWidth / 2), escape_xml(title));
}

// Frame, grid lines with tick labels on both axes (x ticks from `x_ticks` unless `x_categories`),
// and the two axis labels.
std::string axes(const Scale& sx, const Ticks& tx, bool x_numeric, const Scale& sy, const Ticks& ty,
                 const std::string& x_label, const std::string& y_label) {
  std::string out;
  for (double v : ty.at) {
    const double y = sy(v);
    out += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e3e3e3\"/>\n", px(kLeft),
                       px(y), px(kRight), px(y));
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", px(kLeft - 6),
                       px(y + 4), escape_xml(format_tick(v)));
  }
  if (x_numeric) {
    for (double v : tx.at) {
      const double x = sx(v);
      out += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e3e3e3\"/>\n", px(x),
                         px(kTop), px(x), px(kBottom));
      out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(x),
                         px(kBottom + 16), escape_xml(format_tick(v)));
    }
  }
  out += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "stroke=\"#888\"/>\n",
                     px(kLeft), px(kTop), px(kRight - kLeft), px(kBottom - kTop));
  out += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     px((kLeft + kRight) / 2), px(kBottom + 40), escape_xml(x_label));
  out += fmt::format("<text class=\"axis-label\" x=\"16\" y=\"{}\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 16 {})\">{}</text>\n",
                     px((kTop + kBottom) / 2), px((kTop + kBottom) / 2), escape_xml(y_label));
  return out;
}

std::string references(const std::vector<ReferenceLine>& lines, const Scale& sx, const Scale& sy) {
  std::string out;
  for (const ReferenceLine& r : lines) {
    if (r.axis == ReferenceAxis::kIdentity) {
      // Where y = x runs inside both ranges: from the larger of the two lows to the smaller high.
      const double lo = std::max(sx.lo, sy.lo), hi = std::min(sx.hi, sy.hi);
      if (!(hi > lo) || !drawable(lo, sx.log || sy.log) || !drawable(hi, false)) continue;
      // No text beside it: a slanted label crosses the series; the caption names it, hovering shows it.
      out += fmt::format("<line class=\"reference\" data-reference=\"{}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" "
                         "stroke=\"#555\" stroke-dasharray=\"5 4\"><title>{}</title></line>\n",
                         escape_xml(r.label), px(sx(lo)), px(sy(lo)), px(sx(hi)), px(sy(hi)), escape_xml(r.label));
      continue;
    }
    if (!drawable(r.value, r.axis == ReferenceAxis::kX ? sx.log : sy.log)) continue;
    if (r.axis == ReferenceAxis::kY) {
      const double y = sy(r.value);
      const double label_y = y - 4 < kTop + 12 ? y + 14 : y - 4;  // below the line near the top edge
      out += fmt::format("<line class=\"reference\" data-reference=\"{}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" "
                         "stroke=\"#555\" stroke-dasharray=\"5 4\"/>\n",
                         escape_xml(r.label), px(kLeft), px(y), px(kRight), px(y));
      out += fmt::format("<text class=\"reference-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#555\">{}"
                         "</text>\n",
                         px(kRight - 4), px(label_y), escape_xml(r.label));
    } else {
      const double x = sx(r.value);
      out += fmt::format("<line class=\"reference\" data-reference=\"{}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" "
                         "stroke=\"#555\" stroke-dasharray=\"5 4\"/>\n",
                         escape_xml(r.label), px(x), px(kTop), px(x), px(kBottom));
      out += fmt::format("<text class=\"reference-label\" x=\"{}\" y=\"{}\" fill=\"#555\">{}</text>\n", px(x + 4),
                         px(kTop + 14), escape_xml(r.label));
    }
  }
  return out;
}

std::string legend_name(const std::string& name) {
  if (name.size() <= kMaxLegendChars) return escape_xml(name);
  size_t cut = kMaxLegendChars;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;  // not mid-character
  return escape_xml(name.substr(0, cut)) + "\xE2\x80\xA6";
}

// One row per series under the plot: a swatch in the series' colour and its name (the full name
// as a tooltip when shortened).
std::string legend(const std::vector<std::string>& names, bool bars) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    const double y = kLegendTop + kLegendRow * static_cast<double>(i);
    out += "<g class=\"legend\">";
    if (bars) {
      out += fmt::format("<rect class=\"swatch\" x=\"{}\" y=\"{}\" width=\"14\" height=\"10\" fill=\"{}\"/>",
                         px(kLeft), px(y - 9), color(i));
    } else {
      out += fmt::format("<line class=\"swatch\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
                         "stroke-width=\"2.5\"{}/>",
                         px(kLeft), px(y - 4), px(kLeft + 22), px(y - 4), color(i), dash(i));
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\">{}<title>{}</title></text></g>\n", px(kLeft + 30), px(y),
                       legend_name(names[i]), escape_xml(names[i]));
  }
  return out;
}

// The points a polyline visits: the drawable ones, and for a step series the corner before each
// (left out where it coincides with the previous point, as in a vertical rise).
std::vector<Point> drawn_points(const LineSeries& s, bool log_x, bool log_y) {
  std::vector<Point> in;
  for (const Point& p : s.points) {
    if (drawable(p.x, log_x) && drawable(p.y, log_y)) in.push_back(p);
  }
  if (s.shape == LineShape::kStraight || in.size() < 2) return in;
  std::vector<Point> out{in[0]};
  for (size_t i = 1; i < in.size(); ++i) {
    const Point corner{in[i].x, out.back().y};
    if (corner.x != out.back().x || corner.y != out.back().y) out.push_back(corner);
    if (in[i].x != out.back().x || in[i].y != out.back().y) out.push_back(in[i]);
  }
  return out;
}

}  // namespace

std::string escape_xml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_tick(double value) {
  if (value == 0.0 || !std::isfinite(value)) return value == 0.0 ? "0" : fmt::format("{}", value);
  const double a = std::abs(value);
  if (a >= 1e9) return fmt::format("{:.6g}G", value / 1e9);
  if (a >= 1e6) return fmt::format("{:.6g}M", value / 1e6);
  if (a >= 1e4) return fmt::format("{:.6g}k", value / 1e3);
  return fmt::format("{:.6g}", value);
}

Ticks linear_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return Ticks{0.0, 1.0, {0.0, 0.5, 1.0}};
  if (hi < lo) std::swap(lo, hi);
  if (!(hi > lo)) {
    const double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    hi = lo + pad;
    lo = lo == 0.0 ? 0.0 : lo - pad;
  }
  target = std::max(target, 2);
  const double raw = (hi - lo) / static_cast<double>(target - 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double nice = norm <= 1.0 ? 1.0 : norm <= 2.0 ? 2.0 : norm <= 2.5 ? 2.5 : norm <= 5.0 ? 5.0 : 10.0;
  const double step = nice * magnitude;
  const double k0 = std::floor(lo / step + 1e-9), k1 = std::ceil(hi / step - 1e-9);
  Ticks t;
  t.lo = k0 * step;
  t.hi = k1 * step;
  for (double k = k0; k <= k1 + 0.5 && t.at.size() < 64; k += 1.0) {
    const double v = k * step;
    t.at.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  if (!(t.hi > t.lo)) t.hi = t.lo + step;
  return t;
}

Ticks log_ticks(double lo, double hi) {
  if (!(lo > 0.0) || !(hi > 0.0) || !std::isfinite(lo) || !std::isfinite(hi)) return Ticks{1.0, 10.0, {1.0, 10.0}};
  if (hi < lo) std::swap(lo, hi);
  const int e0 = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  int e1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  if (e1 <= e0) e1 = e0 + 1;
  const int decades = e1 - e0;
  const int every = std::max(1, (decades + 11) / 12);
  Ticks t;
  t.lo = std::pow(10.0, e0);
  t.hi = std::pow(10.0, e1);
  for (int e = e0; e <= e1; e += every) {
    const double d = std::pow(10.0, e);
    t.at.push_back(d);
    if (decades < 3 && e < e1) {
      t.at.push_back(2.0 * d);
      t.at.push_back(5.0 * d);
    }
  }
  return t;
}

std::string render_line_chart(const LineChart& chart) {
  std::vector<double> xs, ys;
  for (const LineSeries& s : chart.series) {
    for (const Point& p : s.points) {
      if (!drawable(p.x, chart.x.log) || !drawable(p.y, chart.y.log)) continue;
      xs.push_back(p.x);
      ys.push_back(p.y);
    }
  }
  for (const ReferenceLine& r : chart.references) {
    if (r.axis != ReferenceAxis::kIdentity) (r.axis == ReferenceAxis::kX ? xs : ys).push_back(r.value);
  }
  const Ticks tx = axis_ticks(chart.x, xs), ty = axis_ticks(chart.y, ys);
  const Scale sx{chart.x.log, tx.lo, tx.hi, kLeft, kRight};
  const Scale sy{chart.y.log, ty.lo, ty.hi, kBottom, kTop};

  std::string out = svg_open(chart.id, chart.title, svg_height(chart.series.size()));
  out += title_text(chart.title);
  out += axes(sx, tx, true, sy, ty, chart.x.label, chart.y.label);
  std::vector<std::string> names;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const LineSeries& s = chart.series[i];
    names.push_back(s.name);
    const std::vector<Point> points = drawn_points(s, chart.x.log, chart.y.log);
    std::string coords;
    for (const Point& p : points) coords += fmt::format("{}{},{}", coords.empty() ? "" : " ", px(sx(p.x)), px(sy(p.y)));
    const int64_t n = s.data_count >= 0 ? s.data_count : static_cast<int64_t>(s.points.size());
    out += fmt::format("<polyline class=\"series\" data-series=\"{}\" data-n=\"{}\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"1.8\" stroke-linejoin=\"round\"{} points=\"{}\"><title>{}</title></polyline>\n",
                       escape_xml(s.name), n, color(i), dash(i), coords, escape_xml(s.name));
    if (!s.markers) continue;
    for (const Point& p : s.points) {
      if (!drawable(p.x, chart.x.log) || !drawable(p.y, chart.y.log)) continue;
      out += fmt::format("<circle class=\"marker\" cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"><title>{}: ({}, {})"
                         "</title></circle>\n",
                         px(sx(p.x)), px(sy(p.y)), color(i), escape_xml(s.name), escape_xml(format_tick(p.x)),
                         escape_xml(format_tick(p.y)));
    }
  }
  out += references(chart.references, sx, sy);
  out += legend(names, false);
  out += "</svg>\n";
  return out;
}

std::string render_bar_chart(const BarChart& chart) {
  std::vector<double> ys;
  for (const BarSeries& s : chart.series) ys.insert(ys.end(), s.values.begin(), s.values.end());
  for (const ReferenceLine& r : chart.references) {
    if (r.axis == ReferenceAxis::kY) ys.push_back(r.value);
  }
  AxisSpec y = chart.y;
  y.log = false;
  y.include_zero = true;
  const Ticks ty = axis_ticks(y, ys);
  const Scale sy{false, ty.lo, ty.hi, kBottom, kTop};
  const Scale sx{false, 0.0, 1.0, kLeft, kRight};

  std::string out = svg_open(chart.id, chart.title, svg_height(chart.series.size()));
  out += title_text(chart.title);
  out += axes(sx, Ticks{}, false, sy, ty, chart.x_label, y.label);
  const size_t num_categories = chart.categories.size();
  const size_t num_series = std::max<size_t>(chart.series.size(), 1);
  const double band = num_categories > 0 ? (kRight - kLeft) / static_cast<double>(num_categories) : 0.0;
  const double bar = band * 0.8 / static_cast<double>(num_series);
  for (size_t c = 0; c < num_categories; ++c) {
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       px(kLeft + band * (static_cast<double>(c) + 0.5)), px(kBottom + 16),
                       escape_xml(chart.categories[c]));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const BarSeries& s = chart.series[i];
    names.push_back(s.name);
    for (size_t c = 0; c < num_categories && c < s.values.size(); ++c) {
      const double v = s.values[c];
      if (!drawable(v, false)) continue;
      const double x = kLeft + band * static_cast<double>(c) + band * 0.1 + bar * static_cast<double>(i);
      const double y0 = sy(0.0), y1 = sy(v);
      out += fmt::format("<rect class=\"series\" data-series=\"{}\" data-category=\"{}\" x=\"{}\" y=\"{}\" "
                         "width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}, {}: {}</title></rect>\n",
                         escape_xml(s.name), escape_xml(chart.categories[c]), px(x), px(std::min(y0, y1)), px(bar),
                         px(std::abs(y0 - y1)), color(i), escape_xml(s.name), escape_xml(chart.categories[c]),
                         escape_xml(format_tick(v)));
    }
  }
  std::vector<ReferenceLine> horizontal;
  for (const ReferenceLine& r : chart.references) {
    if (r.axis == ReferenceAxis::kY) horizontal.push_back(r);
  }
  out += references(horizontal, sx, sy);
  out += legend(names, true);
  out += "</svg>\n";
  return out;
}

}  // namespace tachyon::report
