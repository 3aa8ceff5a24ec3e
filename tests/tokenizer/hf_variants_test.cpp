// Hugging Face pipeline pieces that the real tokenizer files do not use (ByteLevel with
// add_prefix_space, Digits, Punctuation, Whitespace, Split behaviours and inversion, NFKC/NFD,
// Lowercase, Strip, regex Replace, Metaspace schemes): each variant's tokenizer.json is rebuilt
// here from a base vocabulary plus the normalizer/pre_tokenizer JSON that the `tokenizers`
// package serialized, and must give the package's ids for the whole corpus.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

using json = nlohmann::json;

const json& variants() {
  static const json v = json::parse(read_file_bytes(fixture_dir() + "/expected_hf_variants.json"));
  return v;
}

const json& corpus_json() {
  static const json c = json::parse(read_file_bytes(fixture_dir() + "/corpus.json"));
  return c;
}

std::string corpus_bytes(const json& entry) {
  if (entry.contains("text")) return entry.at("text").get<std::string>();
  const std::string hex = entry.at("hex").get<std::string>();
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// GPT-2's encoder.json + vocab.bpe as a tokenizer.json model section (built once).
const json& gpt2_base(const std::string& shared) {
  static const json base = [&] {
    json model = {{"type", "BPE"}, {"vocab", json::parse(read_file_bytes(shared + "/tokenizers/gpt2/encoder.json"))}};
    json merges = json::array();
    std::istringstream lines(read_file_bytes(shared + "/tokenizers/gpt2/vocab.bpe"));
    std::string line;
    while (std::getline(lines, line)) {
      if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
    }
    model["merges"] = std::move(merges);
    return json{{"model", std::move(model)},
                {"added_tokens", json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}})},
                {"decoder", {{"type", "ByteLevel"}}}};
  }();
  return base;
}

class HfVariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfVariantTest, MatchesTokenizersPackage) {
  const json& variant = variants().at(GetParam());
  const json& spec = variant.at("spec");
  json root;
  if (spec.at("base") == "gpt2") {
    TACHYON_SKIP_WITHOUT_SHARED(shared);
    root = gpt2_base(shared);
  } else {
    root = json::parse(read_file_bytes(fixture_dir() + "/tiny_metaspace/tokenizer.json"));
  }
  root["normalizer"] = spec.at("normalizer");
  root["pre_tokenizer"] = spec.at("pre_tokenizer");
  const std::string path = scratch_dir("tok-variant") + "/tokenizer.json";
  std::ofstream(path, std::ios::binary) << root.dump();
  auto tok = Tokenizer::from_hf_json(path, "");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();

  const json& ids = variant.at("ids");
  ASSERT_EQ(ids.size(), corpus_json().size());
  int matched = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string text = corpus_bytes(corpus_json()[i]);
    const auto want = ids[i].get<std::vector<int32_t>>();
    const auto got = (*tok)->encode(text, EncodeOptions{false, true, false});
    if (got == want) {
      ++matched;
    } else {
      ADD_FAILURE() << GetParam() << ": corpus entry '" << corpus_json()[i].at("name").get<std::string>()
                    << "'\n  expected " << ids_to_string(want) << "\n  got      " << ids_to_string(got);
    }
  }
  std::printf("[ variant  ] %s: %d/%zu corpus strings match\n", GetParam().c_str(), matched, ids.size());
}

std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const auto& [name, value] : variants().items()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Pipelines, HfVariantTest, ::testing::ValuesIn(variant_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace tachyon::testing
