#include "quant/calib_audit.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

#include "core/mapped_file.h"

namespace tachyon {
namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Whitespace-separated words, ASCII letters lowercased.
std::vector<std::string> words_of(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t begin = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > begin) {
      std::string w(text.substr(begin, i - begin));
      for (char& c : w) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      }
      words.push_back(std::move(w));
    }
  }
  return words;
}

// The text with every whitespace run folded to one space, trimmed.
std::string folded(std::string_view text) {
  std::string out;
  for (const std::string& w : words_of(text)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

// Runs of non-blank lines (a blank line holds only whitespace) of at least kMinParagraphWords
// words, folded.
std::vector<std::string> paragraphs_of(std::string_view text) {
  std::vector<std::string> out;
  std::string current;
  int words = 0;
  const auto flush = [&] {
    if (words >= kMinParagraphWords) out.push_back(folded(current));
    current.clear();
    words = 0;
  };
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    const int n = static_cast<int>(words_of(line).size());
    if (n == 0) {
      flush();
    } else {
      current.append(line);
      current += '\n';
      words += n;
    }
    begin = end + 1;
  }
  flush();
  return out;
}

// Hashes of every run of n consecutive words (a polynomial over the words' hashes), with the first
// word index of each when `starts` is given.
std::vector<uint64_t> ngram_hashes(const std::vector<std::string>& words, int n, std::vector<size_t>* starts) {
  std::vector<uint64_t> out;
  if (static_cast<int64_t>(words.size()) < n) return out;
  std::vector<uint64_t> wh(words.size());
  for (size_t i = 0; i < words.size(); ++i) wh[i] = fnv1a(words[i]);
  constexpr uint64_t kBase = 0x100000001b3ull * 31 + 7;
  uint64_t power = 1;
  for (int i = 0; i < n - 1; ++i) power *= kBase;
  uint64_t h = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i >= static_cast<size_t>(n)) h -= wh[i - static_cast<size_t>(n)] * power;
    h = h * kBase + wh[i];
    if (i + 1 >= static_cast<size_t>(n)) {
      out.push_back(h);
      if (starts) starts->push_back(i + 1 - static_cast<size_t>(n));
    }
  }
  return out;
}

std::string shortened(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; }

}  // namespace

Result<AuditDocument> read_audit_document(const std::string& path) {
  AuditDocument d;
  d.name = path;
  TACHYON_ASSIGN_OR_RETURN(d.text, read_text_file(path));
  namespace fs = std::filesystem;
  const fs::path manifest = fs::path(path).parent_path() / "MANIFEST.tsv";
  std::error_code ec;
  if (fs::is_regular_file(manifest, ec)) {
    TACHYON_ASSIGN_OR_RETURN(std::string m, read_text_file(manifest.string()));
    std::istringstream in(m);
    std::string line;
    std::vector<std::string> header;
    const std::string file = fs::path(path).filename().string();
    for (int number = 1; std::getline(in, line); ++number) {
      std::vector<std::string> cols;
      std::istringstream fields(line);
      for (std::string c; std::getline(fields, c, '\t');) cols.push_back(c);
      if (number == 1) {
        header = cols;
        continue;
      }
      const auto col = [&](const char* name) -> std::string {
        const auto it = std::find(header.begin(), header.end(), name);
        const size_t i = static_cast<size_t>(it - header.begin());
        return it != header.end() && i < cols.size() ? cols[i] : std::string();
      };
      if (col("file") != file) continue;
      const std::string source = col("package") + "/" + col("source_path");
      if (source.size() > 1 && std::find(d.sources.begin(), d.sources.end(), source) == d.sources.end()) {
        d.sources.push_back(source);
      }
    }
  }
  return d;
}

std::string OverlapReport::summary(const AuditOptions& o) const {
  return fmt::format("{} identical document{}, {} shared source file{}, {} of {} paragraphs ({:.2f} %), {} of {} "
                     "distinct {}-grams ({:.2f} %)",
                     identical_documents.size(), identical_documents.size() == 1 ? "" : "s", shared_sources.size(),
                     shared_sources.size() == 1 ? "" : "s", shared_paragraphs, eval_paragraphs,
                     100.0 * paragraph_overlap(), shared_ngrams, eval_ngrams, o.ngram, 100.0 * ngram_overlap());
}

OverlapReport audit_overlap(const std::vector<AuditDocument>& calibration, const std::vector<AuditDocument>& evaluation,
                            const AuditOptions& options) {
  OverlapReport r;
  const int n = std::max(1, options.ngram);
  // Calibration side: whole-document hashes, sources, paragraph hashes, n-gram hashes.
  std::vector<std::pair<uint64_t, std::string>> calib_docs;
  std::set<std::string> calib_sources;
  std::unordered_set<uint64_t> calib_paragraphs, calib_ngrams;
  for (const AuditDocument& d : calibration) {
    calib_docs.emplace_back(fnv1a(folded(d.text)), d.name);
    calib_sources.insert(d.sources.begin(), d.sources.end());
    for (const std::string& p : paragraphs_of(d.text)) calib_paragraphs.insert(fnv1a(p));
    for (uint64_t h : ngram_hashes(words_of(d.text), n, nullptr)) calib_ngrams.insert(h);
  }
  std::set<std::string> shared_sources;
  std::unordered_set<uint64_t> eval_ngrams_seen;
  for (const AuditDocument& d : evaluation) {
    const uint64_t doc = fnv1a(folded(d.text));
    for (const auto& [h, name] : calib_docs) {
      if (h == doc) r.identical_documents.push_back(name + " = " + d.name);
    }
    for (const std::string& s : d.sources) {
      if (calib_sources.count(s)) shared_sources.insert(s);
    }
    for (const std::string& p : paragraphs_of(d.text)) {
      ++r.eval_paragraphs;
      if (calib_paragraphs.count(fnv1a(p))) {
        ++r.shared_paragraphs;
        if (r.examples.size() < 5) r.examples.push_back("paragraph: " + shortened(p));
      }
    }
    const std::vector<std::string> words = words_of(d.text);
    std::vector<size_t> starts;
    const std::vector<uint64_t> grams = ngram_hashes(words, n, &starts);
    for (size_t i = 0; i < grams.size(); ++i) {
      if (!eval_ngrams_seen.insert(grams[i]).second) continue;  // distinct n-grams only
      ++r.eval_ngrams;
      if (calib_ngrams.count(grams[i])) {
        ++r.shared_ngrams;
        if (r.examples.size() < 5) {
          std::string g;
          for (int k = 0; k < n; ++k) g += (k ? " " : "") + words[starts[i] + static_cast<size_t>(k)];
          r.examples.push_back(fmt::format("{}-gram: {}", n, shortened(g)));
        }
      }
    }
  }
  r.shared_sources.assign(shared_sources.begin(), shared_sources.end());
  return r;
}

}  // namespace tachyon
