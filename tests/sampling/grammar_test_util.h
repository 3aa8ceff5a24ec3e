// Helpers shared by the grammar tests: small vocabularies, whole-string matching, the brute-force token mask
// (copy the matcher, accept the token, see whether it survives) and random walks under the mask.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/grammar.h"
#include "sampling/grammar_matcher.h"
#include "sampling/token_trie.h"

namespace tachyon::grammar_test {

// Ids 0..255: the single bytes; 256: EOS; 257: a special token spelled "<s>".
inline constexpr int32_t kByteEos = 256;
inline constexpr int32_t kByteSpecial = 257;

inline std::shared_ptr<const TokenTrie> byte_vocabulary() {
  static const std::shared_ptr<const TokenTrie> vocab = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    tokens.push_back("</s>");
    tokens.push_back("<s>");
    const int32_t eos[] = {kByteEos};
    const int32_t special[] = {kByteSpecial};
    return TokenTrie::build(std::move(tokens), eos, special).value();
  }();
  return vocab;
}

inline std::shared_ptr<const Grammar> share(Grammar g) { return std::make_shared<const Grammar>(std::move(g)); }

inline GrammarMatcher make_matcher(const std::shared_ptr<const Grammar>& grammar,
                                   std::shared_ptr<const TokenTrie> vocab = byte_vocabulary(),
                                   GrammarMatcherOptions options = {}) {
  Result<GrammarMatcher> m = GrammarMatcher::create(grammar, std::move(vocab), options);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// Whether the grammar matches all of `text`.
inline bool accepts(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m = make_matcher(grammar);
  return m.accept_bytes(text).ok() && m.can_end();
}

inline std::vector<uint32_t> mask_of(GrammarMatcher& m) {
  std::vector<uint32_t> mask(grammar_mask_words(m.vocabulary().vocab_size()));
  const Status s = m.fill_mask(mask);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return mask;
}

// The mask by definition: a token is allowed iff accepting it (on a copy) succeeds.
inline std::vector<uint32_t> brute_force_mask(const GrammarMatcher& m) {
  const TokenTrie& vocab = m.vocabulary();
  std::vector<uint32_t> mask(grammar_mask_words(vocab.vocab_size()), 0u);
  for (int32_t id = 0; id < vocab.vocab_size(); ++id) {
    GrammarMatcher copy = m;
    if (copy.accept(id).ok()) mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  }
  return mask;
}

inline std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& mask, int32_t vocab_size) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (grammar_mask_test(mask, id)) ids.push_back(id);
  }
  return ids;
}

inline std::string escape_for_trace(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F)
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("\\x{:02X}", c);
  }
  return out;
}

// A random string of the grammar's language over the byte vocabulary (nullopt if it did not finish within
// max_bytes). After min_bytes, ends as soon as it may with probability `end_bias`.
inline std::optional<std::string> sample_string(const std::shared_ptr<const Grammar>& grammar, std::mt19937& rng,
                                                size_t min_bytes = 0, size_t max_bytes = 64, double end_bias = 0.5) {
  GrammarMatcher m = make_matcher(grammar);
  std::string out;
  std::bernoulli_distribution stop(end_bias);
  while (out.size() <= max_bytes) {
    if (m.can_end() && out.size() >= min_bytes && stop(rng)) return out;
    std::vector<int32_t> ids = allowed_ids(mask_of(m), m.vocabulary().vocab_size());
    std::erase(ids, kByteEos);
    if (ids.empty()) return m.can_end() ? std::optional<std::string>(out) : std::nullopt;
    const int32_t id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
    if (!m.accept(id).ok()) return std::nullopt;
    out.push_back(static_cast<char>(id));
  }
  return std::nullopt;
}

}  // namespace tachyon::grammar_test
