// Overlap between calibration text and evaluation text (`tachyon calib-audit`, and the warnings of
// `quantize` and `perplexity`): a quantizer calibrated on text it is then scored on flatters its
// own numbers. Four views, from coarse to fine:
// - documents: two files whose text is the same (whitespace runs folded);
// - sources: a file's MANIFEST.tsv (beside it; columns file, ..., package, source_path, as
//   tools/train/build_corpus.py writes for tests/data) names the source files its chunks came
//   from, and both sides name one (different chunks of one file);
// - paragraphs: blank-line separated blocks of at least kMinParagraphWords words (whitespace
//   folded), a block of the evaluation text found verbatim in the calibration text;
// - n-grams: runs of n words (13 by default, as in the usual decontamination checks; words are
//   whitespace-separated, ASCII letters lowercased) of the evaluation text that the calibration
//   text also holds, as a share of the evaluation text's distinct n-grams.
// Hashes are 64-bit (FNV-1a over words, then a polynomial over the n word hashes); a collision
// is possible in principle and negligible at these sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tachyon {

inline constexpr int kMinParagraphWords = 8;

struct AuditDocument {
  std::string name;                  // the path, for messages
  std::string text;
  std::vector<std::string> sources;  // "package/source_path" from a MANIFEST.tsv beside it; empty when none
};

// `path`'s text, and the sources its directory's MANIFEST.tsv lists for it (when there is one).
Result<AuditDocument> read_audit_document(const std::string& path);

struct AuditOptions {
  int ngram = 13;
  double max_ngram_overlap = 0.01;      // share of the evaluation n-grams
  double max_paragraph_overlap = 0.01;  // share of the evaluation paragraphs
};

struct OverlapReport {
  std::vector<std::string> identical_documents;  // "calib.txt = code.txt"
  std::vector<std::string> shared_sources;       // sources both sides name
  int64_t eval_paragraphs = 0;
  int64_t shared_paragraphs = 0;
  int64_t eval_ngrams = 0;                       // distinct
  int64_t shared_ngrams = 0;
  std::vector<std::string> examples;             // up to 5 shared paragraphs or n-grams, shortened
  double paragraph_overlap() const {
    return eval_paragraphs > 0 ? static_cast<double>(shared_paragraphs) / eval_paragraphs : 0.0;
  }
  double ngram_overlap() const { return eval_ngrams > 0 ? static_cast<double>(shared_ngrams) / eval_ngrams : 0.0; }
  // Identical documents or shared sources, or a paragraph or n-gram share above its limit.
  bool fails(const AuditOptions& o) const {
    return !identical_documents.empty() || !shared_sources.empty() || paragraph_overlap() > o.max_paragraph_overlap ||
           ngram_overlap() > o.max_ngram_overlap;
  }
  // One line: "2 identical documents, 1 shared source, 3 of 410 paragraphs (0.73 %), 812 of 60,211 13-grams (1.35 %)".
  std::string summary(const AuditOptions& o) const;
};

OverlapReport audit_overlap(const std::vector<AuditDocument>& calibration, const std::vector<AuditDocument>& evaluation,
                            const AuditOptions& options = {});

}  // namespace tachyon
