// The offline benchmark report (report/report.h, report/svg.h): the fixture runs under
// tests/fixtures/report/ (three throughput runs at concurrency 1, 8 and 32 with latency samples
// and KV timelines, two goodput runs at 2 and 4 req/s in one JSON array, a speculative latency run
// whose model name is hostile markup, a `tachyon quantize --budget` report and a perplexity JSON)
// are rendered and the page is read back with a small tag scanner: which figures exist, which
// series each draws, how many points each polyline has against the data, that everything lies in
// the plot area, one summary row per run, no script anywhere and every input string escaped.
// Bad inputs are Status errors. When a `chromium` binary is on PATH the page also loads headless.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "report/report.h"
#include "report/svg.h"

namespace tachyon::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGroup = "synthetic:qwen2.5-0.5b \xC2\xB7 bf16 \xC2\xB7 cuda:0";
const std::string kHostileModel = "evil<script>alert(\"x\")</script> & 'co'";
const std::string kSpecLabel = "#6 latency 128+128 tokens \xC2\xB7 " + kHostileModel + " \xC2\xB7 bf16 \xC2\xB7 cpu";
const std::vector<std::string> kThroughputLabels = {"#1 throughput c=1 \xC2\xB7 " + kGroup,
                                                    "#2 throughput c=8 \xC2\xB7 " + kGroup,
                                                    "#3 throughput c=32 \xC2\xB7 " + kGroup};

std::string source_dir() {
  if (const char* env = std::getenv("TACHYON_SOURCE_DIR")) return env;
  return TACHYON_SOURCE_DIR;
}

std::string fixture(const std::string& name) { return source_dir() + "/tests/fixtures/report/" + name; }

const std::vector<std::string> kFixtureFiles = {"throughput_c1.json", "throughput_c8.json", "throughput_c32.json",
                                                "goodput.json",       "spec_latency.json",  "quantize_report.json",
                                                "perplexity_int4.json"};

// A directory under the system's temp dir, removed with its contents when the object goes.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    path_ = fs::temp_directory_path() / ("tachyon_report_" + tag + "_" + std::to_string(getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

std::string unescape(const std::string& s) {
  static const std::vector<std::pair<std::string, char>> kEntities = {
      {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#39;", '\''}};
  std::string out;
  for (size_t i = 0; i < s.size();) {
    bool matched = false;
    for (const auto& [entity, c] : kEntities) {
      if (s.compare(i, entity.size(), entity) == 0) {
        out += c;
        i += entity.size();
        matched = true;
        break;
      }
    }
    if (!matched) out += s[i++];
  }
  return out;
}

// One tag of the page: its name (lower case, "/svg" for a closing tag) and attributes (unescaped).
struct Tag {
  std::string name;
  std::map<std::string, std::string> attrs;

  bool has(const std::string& key) const { return attrs.count(key) > 0; }
  const std::string& at(const std::string& key) const { return attrs.at(key); }
  double number(const std::string& key) const { return std::stod(attrs.at(key)); }
};

// Tags in document order. Text between tags is skipped; attribute values must be quoted, as the
// report writes them (an unquoted or unterminated value fails the test).
std::vector<Tag> scan(const std::string& html) {
  std::vector<Tag> tags;
  size_t i = 0;
  while ((i = html.find('<', i)) != std::string::npos) {
    size_t j = i + 1;
    if (html.compare(i, 4, "<!--") == 0) {
      i = html.find("-->", i);
      EXPECT_NE(i, std::string::npos) << "unterminated comment";
      if (i == std::string::npos) break;
      continue;
    }
    Tag t;
    while (j < html.size() && !std::isspace(static_cast<unsigned char>(html[j])) && html[j] != '>' &&
           !(html[j] == '/' && j + 1 < html.size() && html[j + 1] == '>')) {
      t.name += static_cast<char>(std::tolower(static_cast<unsigned char>(html[j++])));
    }
    while (j < html.size() && html[j] != '>') {
      if (std::isspace(static_cast<unsigned char>(html[j])) || html[j] == '/') {
        ++j;
        continue;
      }
      std::string key;
      while (j < html.size() && html[j] != '=' && html[j] != '>' &&
             !std::isspace(static_cast<unsigned char>(html[j]))) {
        key += html[j++];
      }
      if (j < html.size() && html[j] == '=') {
        ++j;
        const char quote = html[j];
        EXPECT_TRUE(quote == '"' || quote == '\'') << "unquoted attribute " << key << " in <" << t.name << ">";
        const size_t end = html.find(quote, j + 1);
        EXPECT_NE(end, std::string::npos);
        if (end == std::string::npos) return tags;
        t.attrs[key] = unescape(html.substr(j + 1, end - j - 1));
        j = end + 1;
      } else {
        t.attrs[key] = "";
      }
    }
    tags.push_back(std::move(t));
    i = j;
  }
  return tags;
}

struct Figure {
  double left = 0, top = 0, right = 0, bottom = 0;  // data-plot
  std::vector<Tag> elements;                         // the tags inside the <svg>
};

std::map<std::string, Figure> figures(const std::vector<Tag>& tags) {
  std::map<std::string, Figure> out;
  for (size_t i = 0; i < tags.size(); ++i) {
    if (tags[i].name != "svg") continue;
    const std::string id = tags[i].has("data-figure") ? tags[i].at("data-figure") : "";
    EXPECT_FALSE(id.empty()) << "an <svg> without data-figure";
    Figure f;
    std::istringstream plot(tags[i].has("data-plot") ? tags[i].at("data-plot") : "");
    plot >> f.left >> f.top >> f.right >> f.bottom;
    for (++i; i < tags.size() && tags[i].name != "/svg"; ++i) f.elements.push_back(tags[i]);
    EXPECT_EQ(out.count(id), 0u) << "figure " << id << " twice";
    out[id] = std::move(f);
  }
  return out;
}

std::vector<const Tag*> series_elements(const Figure& f) {
  std::vector<const Tag*> out;
  for (const Tag& t : f.elements) {
    if (t.has("class") && t.at("class") == "series") out.push_back(&t);
  }
  return out;
}

std::vector<std::string> series_names(const Figure& f) {
  std::vector<std::string> names;
  for (const Tag* t : series_elements(f)) {
    if (std::find(names.begin(), names.end(), t->at("data-series")) == names.end()) {
      names.push_back(t->at("data-series"));
    }
  }
  return names;
}

std::vector<Point> polyline_points(const Tag& t) {
  std::vector<Point> out;
  std::istringstream in(t.at("points"));
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    out.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return out;
}

const Tag& polyline(const Figure& f, const std::string& series) {
  for (const Tag* t : series_elements(f)) {
    if (t->name == "polyline" && t->at("data-series") == series) return *t;
  }
  ADD_FAILURE() << "no polyline for " << series;
  static const Tag kNone{"polyline", {{"points", ""}, {"data-n", "0"}}};
  return kNone;
}

std::vector<const Tag*> rects(const Figure& f, const std::string& series) {
  std::vector<const Tag*> out;
  for (const Tag* t : series_elements(f)) {
    if (t->name == "rect" && t->at("data-series") == series) out.push_back(t);
  }
  return out;
}

// Rows of the table with this data-table id (the first such table).
size_t table_rows(const std::vector<Tag>& tags, const std::string& id) {
  size_t rows = 0;
  bool in_table = false;
  for (const Tag& t : tags) {
    if (t.name == "table") {
      if (in_table) break;
      in_table = t.has("data-table") && t.at("data-table") == id;
    } else if (t.name == "/table" && in_table) {
      return rows;
    } else if (in_table && t.name == "tr" && t.has("data-row")) {
      ++rows;
    }
  }
  return rows;
}

bool contains_ci(const std::string& haystack, const std::string& needle) {
  std::string h = haystack;
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
  return h.find(needle) != std::string::npos;
}

void expect_inside(const Figure& f, double x, double y, const std::string& what) {
  constexpr double kEps = 0.051;  // coordinates are written with one decimal
  EXPECT_GE(x, f.left - kEps) << what;
  EXPECT_LE(x, f.right + kEps) << what;
  EXPECT_GE(y, f.top - kEps) << what;
  EXPECT_LE(y, f.bottom + kEps) << what;
}

void expect_all_inside(const std::string& id, const Figure& f) {
  for (const Tag& t : f.elements) {
    const std::string cls = t.has("class") ? t.at("class") : "";
    if (t.name == "polyline" && cls == "series") {
      for (const Point& p : polyline_points(t)) expect_inside(f, p.x, p.y, id + " " + t.at("data-series"));
    } else if (t.name == "rect" && cls == "series") {
      const double x = t.number("x"), y = t.number("y");
      expect_inside(f, x, y, id + " bar");
      expect_inside(f, x + t.number("width"), y + t.number("height"), id + " bar");
    } else if (t.name == "circle" && cls == "marker") {
      expect_inside(f, t.number("cx"), t.number("cy"), id + " marker");
    }
  }
}

// The fixture's page, rendered once through write_report.
class FixtureReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new ScratchDir("fixture");
    std::vector<std::string> files;
    for (const std::string& f : kFixtureFiles) files.push_back(fixture(f));
    const Status s = write_report(files, *scratch_ / "out");
    ASSERT_TRUE(s.ok()) << s.to_string();
    html_ = new std::string(read_text(*scratch_ / "out/index.html"));
    tags_ = new std::vector<Tag>(scan(*html_));
    figures_ = new std::map<std::string, Figure>(figures(*tags_));
  }
  static void TearDownTestSuite() {
    delete figures_;
    delete tags_;
    delete html_;
    delete scratch_;
  }
  const Figure& fig(const std::string& id) {
    static const Figure kEmpty;
    auto it = figures_->find(id);
    if (it == figures_->end()) {
      ADD_FAILURE() << "no figure " << id;
      return kEmpty;
    }
    return it->second;
  }

  static ScratchDir* scratch_;
  static std::string* html_;
  static std::vector<Tag>* tags_;
  static std::map<std::string, Figure>* figures_;
};
ScratchDir* FixtureReport::scratch_ = nullptr;
std::string* FixtureReport::html_ = nullptr;
std::vector<Tag>* FixtureReport::tags_ = nullptr;
std::map<std::string, Figure>* FixtureReport::figures_ = nullptr;

TEST_F(FixtureReport, HasEveryFigureAndNoScript) {
  std::set<std::string> ids;
  for (const auto& [id, f] : *figures_) ids.insert(id);
  EXPECT_EQ(ids, (std::set<std::string>{"throughput_vs_concurrency", "latency_cdf_ttft", "latency_cdf_tpot",
                                        "latency_cdf_itl", "goodput_vs_rate", "kv_timeline", "spec_acceptance"}));
  bool quant_section = false;
  for (const Tag& t : *tags_) {
    quant_section |= t.name == "section" && t.has("data-figure") && t.at("data-figure") == "quant_table";
    EXPECT_NE(t.name, "script");
    EXPECT_NE(t.name, "iframe");
    EXPECT_NE(t.name, "link");  // nothing fetched: styles are inline
    for (const auto& [key, value] : t.attrs) {
      EXPECT_NE(key.rfind("on", 0), 0u) << "event handler " << key << " on <" << t.name << ">";
      EXPECT_FALSE(contains_ci(value, "javascript:")) << key;
    }
  }
  EXPECT_TRUE(quant_section);
  EXPECT_FALSE(contains_ci(*html_, "<script"));
  EXPECT_EQ(html_->rfind("<!DOCTYPE html>", 0), 0u);
}

TEST_F(FixtureReport, SeriesNamesPerFigure) {
  EXPECT_EQ(series_names(fig("throughput_vs_concurrency")), std::vector<std::string>{kGroup});
  for (const char* id : {"latency_cdf_ttft", "latency_cdf_tpot", "latency_cdf_itl", "kv_timeline"}) {
    EXPECT_EQ(series_names(fig(id)), kThroughputLabels) << id;
  }
  EXPECT_EQ(series_names(fig("goodput_vs_rate")),
            std::vector<std::string>{kGroup + " (TTFT 1 s, TPOT 50 ms)"});
  EXPECT_EQ(series_names(fig("spec_acceptance")), std::vector<std::string>{kSpecLabel});
}

TEST_F(FixtureReport, PointCountsMatchTheData) {
  // Throughput: one marker-joined point per concurrency (the paced goodput runs are left out).
  EXPECT_EQ(polyline_points(polyline(fig("throughput_vs_concurrency"), kGroup)).size(), 3u);
  // CDFs: N samples with D distinct values give 2D points (a rise per value, a run between them).
  std::vector<std::string> files = {"throughput_c1.json", "throughput_c8.json", "throughput_c32.json"};
  const std::pair<const char*, const char*> metrics[] = {
      {"ttft_s", "latency_cdf_ttft"}, {"tpot_s", "latency_cdf_tpot"}, {"itl_s", "latency_cdf_itl"}};
  for (const auto& [metric, id] : metrics) {
    for (size_t r = 0; r < files.size(); ++r) {
      const json run = json::parse(read_text(fixture(files[r])));
      const std::vector<double> samples = run["samples"][metric].get<std::vector<double>>();
      const std::set<double> distinct(samples.begin(), samples.end());
      const Tag& line = polyline(fig(id), kThroughputLabels[r]);
      EXPECT_EQ(polyline_points(line).size(), 2 * distinct.size()) << metric << " run " << r;
      EXPECT_EQ(line.at("data-n"), std::to_string(samples.size())) << metric << " run " << r;
    }
  }
  // The c=32 TTFT samples hold one tie: 8 samples, 7 distinct values, 14 points.
  EXPECT_EQ(polyline_points(polyline(fig("latency_cdf_ttft"), kThroughputLabels[2])).size(), 14u);
  // KV timelines are step lines: an entry whose time and value both differ from the previous one
  // adds a corner before it.
  for (size_t r = 0; r < files.size(); ++r) {
    const json run = json::parse(read_text(fixture(files[r])));
    const json& k = run["kv_timeline"];
    size_t expected = k.size();
    for (size_t i = 1; i < k.size(); ++i) {
      expected += k[i][0] != k[i - 1][0] && k[i][1] != k[i - 1][1];
    }
    const Tag& line = polyline(fig("kv_timeline"), kThroughputLabels[r]);
    EXPECT_EQ(polyline_points(line).size(), expected) << r;
    EXPECT_EQ(line.at("data-n"), std::to_string(k.size())) << r;
  }
  EXPECT_EQ(polyline_points(polyline(fig("goodput_vs_rate"), kGroup + " (TTFT 1 s, TPOT 50 ms)")).size(), 2u);
  EXPECT_EQ(rects(fig("spec_acceptance"), kSpecLabel).size(), 4u);
}

TEST_F(FixtureReport, EverythingDrawnStaysInThePlotArea) {
  for (const auto& [id, f] : *figures_) {
    EXPECT_LT(f.left, f.right) << id;
    EXPECT_LT(f.top, f.bottom) << id;
    expect_all_inside(id, f);
  }
}

TEST_F(FixtureReport, GeometryFollowsTheValues) {
  // Throughput rises with concurrency in the fixture: x and the height both increase.
  const std::vector<Point> t = polyline_points(polyline(fig("throughput_vs_concurrency"), kGroup));
  ASSERT_EQ(t.size(), 3u);
  EXPECT_LT(t[0].x, t[1].x);
  EXPECT_LT(t[1].x, t[2].x);
  EXPECT_GT(t[0].y, t[1].y);
  EXPECT_GT(t[1].y, t[2].y);
  // A CDF never goes back: x non-decreasing, height non-decreasing, from the bottom to the top edge.
  for (const char* id : {"latency_cdf_ttft", "latency_cdf_tpot", "latency_cdf_itl"}) {
    const Figure& f = fig(id);
    for (const std::string& label : kThroughputLabels) {
      const std::vector<Point> p = polyline_points(polyline(f, label));
      ASSERT_FALSE(p.empty());
      for (size_t i = 1; i < p.size(); ++i) {
        EXPECT_GE(p[i].x, p[i - 1].x) << id;
        EXPECT_LE(p[i].y, p[i - 1].y) << id;
      }
      EXPECT_NEAR(p.front().y, f.bottom, 0.051) << id;
      EXPECT_NEAR(p.back().y, f.top, 0.051) << id;
    }
  }
  // Acceptance by position 0.90, 0.70, 0.55, 0.35 on a 0..1 axis: heights in those proportions.
  const std::vector<const Tag*> bars = rects(fig("spec_acceptance"), kSpecLabel);
  ASSERT_EQ(bars.size(), 4u);
  const double full = fig("spec_acceptance").bottom - fig("spec_acceptance").top;
  const double expected[] = {0.90, 0.70, 0.55, 0.35};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(bars[i]->number("height") / full, expected[i], 0.002) << i;
    EXPECT_EQ(bars[i]->at("data-category"), std::to_string(i + 1));
  }
}

TEST_F(FixtureReport, TablesHaveOneRowPerInput) {
  EXPECT_EQ(table_rows(*tags_, "summary"), 6u);  // 3 throughput + 2 goodput + 1 speculative
  EXPECT_EQ(table_rows(*tags_, "spec_summary"), 1u);
  EXPECT_EQ(table_rows(*tags_, "quantize_budget"), 3u);  // one per module
  EXPECT_EQ(table_rows(*tags_, "quantize_budgets"), 3u);
  EXPECT_EQ(table_rows(*tags_, "perplexity"), 1u);
  size_t chosen = 0;  // the budget table marks one chosen format per module
  for (const Tag& t : *tags_) chosen += t.name == "td" && t.has("class") && t.at("class") == "num chosen";
  EXPECT_EQ(chosen, 3u);
  EXPECT_NE(html_->find(">50,000<"), std::string::npos);  // module bytes, thousands separated
  EXPECT_NE(html_->find("12.9516"), std::string::npos);
  EXPECT_NE(html_->find("+6.74 %"), std::string::npos);  // 12.9516 / 12.1335 - 1
}

TEST_F(FixtureReport, HostileStringsAreEscaped) {
  EXPECT_EQ(html_->find(kHostileModel), std::string::npos);
  EXPECT_EQ(html_->find("<script"), std::string::npos);
  EXPECT_NE(html_->find("evil&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;co&#39;"),
            std::string::npos);
  // The scanner's unescaped attribute is the name as the JSON holds it.
  bool seen = false;
  for (const Tag& t : *tags_) seen |= t.has("data-series") && t.at("data-series") == kSpecLabel;
  EXPECT_TRUE(seen);
}

TEST(Report, HostileTitleLabelAndSeriesNames) {
  json run = json::parse(read_text(fixture("throughput_c1.json")));
  const std::string evil = "</svg><script>x()</script>\"'&<img src=x onerror=y>";
  run["label"] = evil;
  run["model"] = evil;
  run["device"] = evil;
  ReportOptions options;
  options.title = evil;
  options.sources = {evil};
  auto html = render_report({run}, options);
  ASSERT_TRUE(html.ok()) << html.status().to_string();
  EXPECT_FALSE(contains_ci(*html, "<script"));
  EXPECT_FALSE(contains_ci(*html, "<img"));
  const std::vector<Tag> tags = scan(*html);
  for (const Tag& t : tags) EXPECT_FALSE(t.has("onerror"));
  const auto figs = figures(tags);
  ASSERT_TRUE(figs.count("latency_cdf_ttft"));
  EXPECT_EQ(series_names(figs.at("latency_cdf_ttft")), std::vector<std::string>{"#1 " + evil});
  EXPECT_EQ(series_names(figs.at("throughput_vs_concurrency")),
            std::vector<std::string>{evil + " \xC2\xB7 bf16 \xC2\xB7 " + evil});
}

TEST(Report, QuantizeMethodAndCalibAuditTables) {
  const json quantize = {
      {"model", "m"}, {"method", "awq-int4"}, {"group_size", 128},
      {"layers",
       {{{"layer", 0},
         {"modules",
          {{{"module", "model.layers.0.self_attn.q_proj"}, {"method", "awq-int4"}, {"format", "int4"},
            {"kept_16bit", false}, {"relative_error", 0.04}, {"rtn_relative_error", 0.05}, {"clip_ratio", 0.93},
            {"alpha", 0.5}},
           {{"module", "model.layers.0.mlp.down_proj"}, {"method", "16-bit"}, {"format", "bf16"},
            {"kept_16bit", true}, {"relative_error", nullptr}}}}},
        {{"layer", 1}, {"modules", {{{"module", "model.layers.1.mlp.up_proj"}, {"relative_error", "oops"}}}}}}},
      {"totals", {{"modules_quantized", 2}, {"modules_16bit", 1}, {"bytes_before", 1 << 20}, {"bytes_after", 300000}}}};
  const json audit = {{"calib", {"a.txt"}}, {"eval", {"b.txt", "c.txt"}}, {"ngram", 13}, {"paragraph_overlap", 0.0},
                      {"ngram_overlap", 0.002},
                      {"limits", {{"max_paragraph_overlap", 0.01}, {"max_ngram_overlap", 0.01}}},
                      {"passes", true}};
  auto html = render_report({quantize, audit});
  ASSERT_TRUE(html.ok()) << html.status().to_string();
  const std::vector<Tag> tags = scan(*html);
  EXPECT_EQ(table_rows(tags, "quantize_modules"), 3u);
  EXPECT_EQ(table_rows(tags, "calib_audit"), 1u);
  EXPECT_EQ(table_rows(tags, "summary"), 0u);  // always there, empty without bench runs
  EXPECT_TRUE(figures(tags).empty());
  EXPECT_NE(html->find("0.80x"), std::string::npos);  // 0.04 / 0.05 against RTN
  EXPECT_NE(html->find("b.txt, c.txt"), std::string::npos);
}

TEST(Report, MalformedFieldsAreLeftOutNotFatal) {
  json run = json::parse(read_text(fixture("throughput_c8.json")));
  run["samples"]["ttft_s"] = "not an array";
  run["samples"]["tpot_s"] = json::array({0.005, "x", nullptr, 0.006});
  run["samples"]["itl_s"] = json::array();
  run["kv_timeline"] = json::array({json::array({0.0, 1, 10}), json::array({1.0, 2}), "x", json::array({2.0, 5, 0}),
                                    json::array({3.0, 4, 10})});
  run["output_tokens_per_s"] = "fast";
  run["ttft_ms"] = 5;
  run["spec"] = {{"accepted_by_position", {1, "x"}}, {"proposed_by_position", {2, 2}}};
  auto html = render_report({run});
  ASSERT_TRUE(html.ok()) << html.status().to_string();
  const std::vector<Tag> tags = scan(*html);
  const auto figs = figures(tags);
  EXPECT_FALSE(figs.count("latency_cdf_ttft"));
  EXPECT_FALSE(figs.count("latency_cdf_itl"));
  EXPECT_FALSE(figs.count("throughput_vs_concurrency"));
  ASSERT_TRUE(figs.count("latency_cdf_tpot"));
  const Tag& tpot = polyline(figs.at("latency_cdf_tpot"), series_names(figs.at("latency_cdf_tpot")).at(0));
  EXPECT_EQ(tpot.at("data-n"), "2");
  EXPECT_EQ(polyline_points(tpot).size(), 4u);
  ASSERT_TRUE(figs.count("kv_timeline"));
  // (0, 10 %) and (3, 40 %) as a step: a corner at (3, 10 %) between them.
  EXPECT_EQ(polyline_points(polyline(figs.at("kv_timeline"), series_names(figs.at("kv_timeline")).at(0))).size(), 3u);
  EXPECT_NE(html->find("3 malformed entries left out"), std::string::npos);
  ASSERT_TRUE(figs.count("spec_acceptance"));
  EXPECT_EQ(series_elements(figs.at("spec_acceptance")).size(), 1u);  // position 2 has no number
  EXPECT_EQ(table_rows(tags, "summary"), 1u);
  for (const auto& [id, f] : figs) expect_all_inside(id, f);
}

TEST(Report, BadInputsAreStatusErrors) {
  ScratchDir dir("errors");
  const auto fails = [](const std::vector<std::string>& files, const std::string& out, ErrorCode code,
                        const std::string& fragment) {
    const Status s = write_report(files, out);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.to_string();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.to_string();
  };
  fails({}, dir / "out", ErrorCode::kInvalidArgument, "no JSON files");
  fails({dir / "missing.json"}, dir / "out", ErrorCode::kNotFound, "missing.json: no such file");
  write_text(dir / "corrupt.json", "{\"bench\": \"engine\", \"workload\": ");
  fails({dir / "corrupt.json"}, dir / "out", ErrorCode::kCorruptFile, "corrupt.json: not valid JSON");
  write_text(dir / "empty.json", "  \n");
  fails({dir / "empty.json"}, dir / "out", ErrorCode::kCorruptFile, "empty.json: empty file");
  write_text(dir / "empty_array.json", "[]");
  fails({dir / "empty_array.json"}, dir / "out", ErrorCode::kInvalidArgument, "empty JSON array");
  write_text(dir / "numbers.json", "[{\"bench\": \"engine\"}, 3]");
  fails({dir / "numbers.json"}, dir / "out", ErrorCode::kInvalidArgument, "element 1 is a JSON number");
  write_text(dir / "other.json", "{\"hello\": 1, \"world\": [2]}");
  fails({dir / "other.json"}, dir / "out", ErrorCode::kInvalidArgument, "other.json: neither");
  fails({dir.str()}, dir / "out", ErrorCode::kInvalidArgument, "a directory");
  write_text(dir / "file", "x");
  fails({fixture("throughput_c1.json")}, dir / "file/sub", ErrorCode::kIo, "cannot create");
  EXPECT_FALSE(fs::exists(dir / "out"));

  EXPECT_EQ(render_report({}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(render_report({json(3)}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(render_report({json::object()}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Svg, TicksAndLabels) {
  const Ticks t = linear_ticks(212.5, 3310.5);
  EXPECT_LE(t.lo, 212.5);
  EXPECT_GE(t.hi, 3310.5);
  ASSERT_GE(t.at.size(), 3u);
  const double step = t.at[1] - t.at[0];
  for (size_t i = 1; i < t.at.size(); ++i) EXPECT_NEAR(t.at[i] - t.at[i - 1], step, 1e-9);
  const double mantissa = step / std::pow(10.0, std::floor(std::log10(step)));
  EXPECT_TRUE(mantissa == 1.0 || mantissa == 2.0 || mantissa == 2.5 || mantissa == 5.0) << step;
  EXPECT_EQ(linear_ticks(0.0, 1.0).at.front(), 0.0);
  EXPECT_GT(linear_ticks(5.0, 5.0).hi, linear_ticks(5.0, 5.0).lo);  // a single value still has a range
  const Ticks l = log_ticks(1.0, 32.0);
  EXPECT_EQ(l.lo, 1.0);
  EXPECT_EQ(l.hi, 100.0);
  EXPECT_EQ(l.at, (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(format_tick(0.30000000000000004), "0.3");
  EXPECT_EQ(format_tick(25000), "25k");
  EXPECT_EQ(format_tick(3.5e6), "3.5M");
  EXPECT_EQ(escape_xml("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
}

TEST(Svg, StepSeriesForcedBoundsAndLogAxes) {
  LineChart chart;
  chart.id = "t";
  chart.x.log = true;
  chart.y = AxisSpec{"y", false, true, 0.0, 100.0};
  chart.series = {LineSeries{"step", {{1, 0}, {1, 50}, {10, 150}, {100, 100}}, LineShape::kStep, false, -1},
                  LineSeries{"drops", {{-1, 5}, {0, 5}, {2, 5}}, LineShape::kStraight, true, 7}};
  chart.references = {{ReferenceAxis::kX, 1000.0, "far"}};
  const std::string svg = render_line_chart(chart);
  const std::vector<Tag> tags = scan(svg);
  const auto figs = figures(tags);
  ASSERT_TRUE(figs.count("t"));
  const Figure& f = figs.at("t");
  expect_all_inside("t", f);
  // (1,0) (1,50) | corner (10,50) (10,150 drawn at the top) | corner (100,150) (100,100)
  const std::vector<Point> step = polyline_points(polyline(f, "step"));
  ASSERT_EQ(step.size(), 6u);
  EXPECT_NEAR(step[3].y, f.top, 0.051);
  EXPECT_NEAR(step[5].x, f.right - (f.right - f.left) / 3.0, 0.051);  // 100 of 1..1000 on a log axis
  const Tag& drops = polyline(f, "drops");
  EXPECT_EQ(polyline_points(drops).size(), 1u);  // x <= 0 has no place on a log axis
  EXPECT_EQ(drops.at("data-n"), "7");

  BarChart bars;
  bars.id = "b";
  bars.categories = {"1", "2", "3"};
  bars.series = {BarSeries{"a", {1.0, std::nan(""), 3.0}}, BarSeries{"b", {2.0}}};
  const auto bar_figs = figures(scan(render_bar_chart(bars)));
  ASSERT_TRUE(bar_figs.count("b"));
  EXPECT_EQ(rects(bar_figs.at("b"), "a").size(), 2u);
  EXPECT_EQ(rects(bar_figs.at("b"), "b").size(), 1u);
  expect_all_inside("b", bar_figs.at("b"));
}

// Headless Chromium parses the page and keeps every figure (skipped without a `chromium` binary).
TEST_F(FixtureReport, LoadsInHeadlessChromium) {
  std::string chromium;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    const fs::path candidate = fs::path(d) / "chromium";
    if (!d.empty() && access(candidate.c_str(), X_OK) == 0) {
      chromium = candidate.string();
      break;
    }
  }
  if (chromium.empty()) GTEST_SKIP() << "no chromium on PATH";
  const std::string dom = *scratch_ / "dom.html";
  // As root, Chromium refuses to start sandboxed.
  const std::string command = "timeout 120 '" + chromium + "' --headless --disable-gpu" +
                              (geteuid() == 0 ? " --no-sandbox" : "") + " --dump-dom 'file://" +
                              (*scratch_ / "out/index.html") + "' > '" + dom + "' 2>/dev/null";
  const int rc = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << command;
  ASSERT_EQ(WEXITSTATUS(rc), 0) << command;
  const std::string text = read_text(dom);
  for (const auto& [id, f] : *figures_) EXPECT_NE(text.find("data-figure=\"" + id + "\""), std::string::npos) << id;
  EXPECT_NE(text.find("data-figure=\"quant_table\""), std::string::npos);
}

}  // namespace
}  // namespace tachyon::report
