// The kind of text a prompt is (code, prose, ...), for the choice of a draft per request: one
// table per kind of the unigram log-probabilities of its training tokens
// (tools/train/domain_profiles.py), and the kind whose table gives the prompt's tokens the largest
// sum of log-probabilities wins (naive Bayes with equal priors). A table lookup and an add per
// prompt token and kind, once per request.
//
// The file: safetensors whose "__metadata__" has format = "tachyon-domain-profiles",
// version = "1", vocab_size and kinds (comma-separated names); one f16, bf16 or f32 tensor [vocab]
// per kind, named after it; nothing else. The bundled target carries one
// (models/tachyon-demo/domains.safetensors).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace tachyon {

class DomainClassifier {
 public:
  // Reads and checks the file against the target's vocabulary: the format and version, a
  // vocabulary no larger than the target's `vocab_size` (whose padded rows no prompt uses), every
  // kind named in the metadata present with that shape, nothing else, every value finite and <= 0.
  static Result<DomainClassifier> load(const std::string& path, int vocab_size);
  // From tables in memory: log_probs [kinds.size() * vocab_size], kind-major.
  static Result<DomainClassifier> from_tables(std::vector<std::string> kinds, int vocab_size,
                                              std::vector<float> log_probs);

  // The index of the kind that fits `tokens` best (ids outside the vocabulary are skipped; ties
  // go to the first kind); 0 for no tokens.
  int classify(std::span<const int32_t> tokens) const;
  const std::vector<std::string>& kinds() const { return kinds_; }
  int vocab_size() const { return vocab_size_; }
  const std::string& path() const { return path_; }

  // Tokens read per prompt at most: the prompt's last ones (the text the draft continues).
  static constexpr size_t kMaxTokens = 512;

 private:
  std::vector<std::string> kinds_;
  int vocab_size_ = 0;
  std::vector<float> log_probs_;
  std::string path_;
};

}  // namespace tachyon
