#include "speculative/domain_classifier.h"

#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace tachyon {
namespace {

std::vector<std::string> split_kinds(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    out.push_back(s.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Status read_profiles(const SafetensorsFile& file, int target_vocab, int& vocab_size, std::vector<std::string>& kinds,
                     std::vector<float>& log_probs) {
  const auto& meta = file.metadata();
  const auto get = [&](const char* key) -> const std::string* {
    auto it = meta.find(key);
    return it == meta.end() ? nullptr : &it->second;
  };
  const std::string* format = get("format");
  if (format == nullptr || *format != "tachyon-domain-profiles") {
    return make_error(ErrorCode::kInvalidArgument,
                      "not a domain profiles file (metadata \"format\" is {}, not \"tachyon-domain-profiles\")",
                      format == nullptr ? std::string("absent") : "\"" + *format + "\"");
  }
  const std::string* version = get("version");
  if (version == nullptr || *version != "1") {
    return make_error(ErrorCode::kUnsupported, "domain profiles version {} (this build reads version 1)",
                      version == nullptr ? std::string("absent") : *version);
  }
  const std::string* vocab = get("vocab_size");
  int v = 0;
  // The target's vocabulary may be larger (rows padded past the tokenizer's).
  if (vocab == nullptr || std::from_chars(vocab->data(), vocab->data() + vocab->size(), v).ec != std::errc() ||
      v < 1 || v > target_vocab) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the profiles are for a vocabulary of {} tokens; the target has {} (at most that many)",
                      vocab == nullptr ? std::string("(absent)") : *vocab, target_vocab);
  }
  vocab_size = v;
  const std::string* names = get("kinds");
  if (names == nullptr) return make_error(ErrorCode::kInvalidArgument, "metadata has no \"kinds\"");
  kinds = split_kinds(*names);
  std::set<std::string> seen;
  for (const std::string& k : kinds) {
    if (k.empty() || !seen.insert(k).second) {
      return make_error(ErrorCode::kInvalidArgument, "metadata \"kinds\" = \"{}\" names an empty or repeated kind",
                        *names);
    }
  }
  if (kinds.size() < 2) return make_error(ErrorCode::kInvalidArgument, "a classifier needs two kinds or more");
  log_probs.assign(kinds.size() * static_cast<size_t>(vocab_size), 0.0f);
  for (size_t k = 0; k < kinds.size(); ++k) {
    const TensorMeta* tm = file.find(kinds[k]);
    if (tm == nullptr) return make_error(ErrorCode::kInvalidArgument, "tensor {} is missing", kinds[k]);
    if (tm->shape != std::vector<int64_t>{vocab_size}) {
      return make_error(ErrorCode::kInvalidArgument, "tensor {} has shape [{}], expected [{}]", kinds[k],
                        fmt::join(tm->shape, ", "), vocab_size);
    }
    if (tm->dtype != DType::kF32 && tm->dtype != DType::kF16 && tm->dtype != DType::kBF16) {
      return make_error(ErrorCode::kInvalidArgument, "tensor {} is {} (f32, f16 or bf16)", kinds[k], tm->stored_type);
    }
    TACHYON_ASSIGN_OR_RETURN(Tensor t, file.tensor(kinds[k]));
    const Tensor f = t.to_f32();
    for (int i = 0; i < vocab_size; ++i) {
      const float x = f.data<float>()[i];
      if (!std::isfinite(x) || x > 0.0f) {
        return make_error(ErrorCode::kInvalidArgument, "tensor {} entry {} is {}: a log-probability is finite and <= 0",
                          kinds[k], i, x);
      }
      log_probs[k * static_cast<size_t>(vocab_size) + static_cast<size_t>(i)] = x;
    }
  }
  if (file.tensors().size() != kinds.size()) {
    for (const TensorMeta& tm : file.tensors()) {
      if (!seen.count(tm.name)) return make_error(ErrorCode::kInvalidArgument, "unexpected tensor {}", tm.name);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DomainClassifier> DomainClassifier::load(const std::string& path, int vocab_size) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.status().with_context(fmt::format("domain profiles {}", path));
  DomainClassifier c;
  c.path_ = path;
  if (Status s = read_profiles(**file, vocab_size, c.vocab_size_, c.kinds_, c.log_probs_); !s.ok()) {
    return s.with_context(fmt::format("domain profiles {}", path));
  }
  return c;
}

Result<DomainClassifier> DomainClassifier::from_tables(std::vector<std::string> kinds, int vocab_size,
                                                       std::vector<float> log_probs) {
  if (kinds.size() < 2 || vocab_size < 1 || log_probs.size() != kinds.size() * static_cast<size_t>(vocab_size)) {
    return make_error(ErrorCode::kInvalidArgument, "domain classifier: {} kinds, vocabulary {}, {} table entries",
                      kinds.size(), vocab_size, log_probs.size());
  }
  DomainClassifier c;
  c.kinds_ = std::move(kinds);
  c.vocab_size_ = vocab_size;
  c.log_probs_ = std::move(log_probs);
  return c;
}

int DomainClassifier::classify(std::span<const int32_t> tokens) const {
  if (tokens.size() > kMaxTokens) tokens = tokens.subspan(tokens.size() - kMaxTokens);
  int best = 0;
  double best_score = -INFINITY;
  for (size_t k = 0; k < kinds_.size(); ++k) {
    const float* table = log_probs_.data() + k * static_cast<size_t>(vocab_size_);
    double score = 0.0;
    for (int32_t t : tokens) {
      if (t >= 0 && t < vocab_size_) score += table[t];
    }
    if (score > best_score) {
      best_score = score;
      best = static_cast<int>(k);
    }
  }
  return best;
}

}  // namespace tachyon
