#include "sampling/synthetic_vocabulary.h"

#include <algorithm>
#include <random>
#include <unordered_set>

namespace tachyon {

Result<SyntheticVocabulary> synthetic_vocabulary(int32_t size, uint32_t seed) {
  if (size < 512) {
    return make_error(ErrorCode::kInvalidArgument, "a synthetic vocabulary of {} tokens (at least 512)", size);
  }
  SyntheticVocabulary v;
  std::unordered_set<std::string> seen;
  const auto add = [&](const std::string& t) {
    if (seen.insert(t).second) v.token_bytes.push_back(t);
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (const char* p : {"{\"", "\":", "\",", "\": \"", "\", \"", "\"}", "\"]", "},", "}}", "]}", "\n", "\n  ", "\n    ",
                        "  ", "    ", "true", "false", "null", "é", "€", "😀"}) {
    add(p);
  }
  std::mt19937 rng(seed);
  const std::string letters = "etaoinshrdlucmfwypvbgkqjxz";
  std::uniform_int_distribution<int> length(2, 9);
  std::geometric_distribution<int> letter(0.18);
  while (static_cast<int32_t>(v.token_bytes.size()) < size - 1) {
    std::string w = std::bernoulli_distribution(0.6)(rng) ? " " : "";
    if (std::bernoulli_distribution(0.1)(rng)) {
      w += std::to_string(std::uniform_int_distribution<int>(0, 9999)(rng));
    } else {
      for (int n = length(rng); n > 0; --n) w += letters[std::min<size_t>(letter(rng), letters.size() - 1)];
      if (std::bernoulli_distribution(0.05)(rng)) w += "\":";
    }
    add(w);
  }
  v.eos_id = static_cast<int32_t>(v.token_bytes.size());
  v.token_bytes.push_back("<|eot_id|>");
  return v;
}

}  // namespace tachyon
