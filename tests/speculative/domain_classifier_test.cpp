// The prompt-kind classifier (speculative/domain_classifier.h): the file is checked on load; the
// kind whose table fits best wins; the bundled profiles tell held-out code from prose.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/mapped_file.h"
#include "io/safetensors_writer.h"
#include "model/model_loader.h"
#include "speculative/domain_classifier.h"
#include "test_util.h"

namespace tachyon {
namespace {

std::map<std::string, std::string> meta(const std::string& kinds, int vocab) {
  return {{"format", "tachyon-domain-profiles"}, {"version", "1"}, {"vocab_size", std::to_string(vocab)},
          {"kinds", kinds}};
}

Tensor table(int vocab, float value) {
  Tensor t = Tensor::empty({vocab}, DType::kF32);
  for (int i = 0; i < vocab; ++i) t.data<float>()[i] = value;
  return t;
}

std::string write(const std::string& name, const std::vector<NamedTensor>& tensors,
                  const std::map<std::string, std::string>& m) {
  const std::string path = testing::scratch_dir("domains") + "/" + name + ".safetensors";
  EXPECT_TRUE(write_safetensors(path, tensors, m).ok());
  return path;
}

TEST(DomainClassifier, TheFileIsCheckedOnLoad) {
  constexpr int V = 16;
  const auto error_of = [&](const std::string& name, const std::vector<NamedTensor>& t,
                            const std::map<std::string, std::string>& m, int target_vocab = 16) {
    auto c = DomainClassifier::load(write(name, t, m), target_vocab);
    EXPECT_FALSE(c.ok()) << name;
    return c.ok() ? std::string() : c.status().to_string();
  };
  const std::vector<NamedTensor> good = {{"code", table(V, -2.0f)}, {"prose", table(V, -3.0f)}};
  ASSERT_TRUE(DomainClassifier::load(write("good", good, meta("code,prose", V)), V).ok());
  // A larger target (padded rows) is fine; a smaller one is not.
  EXPECT_TRUE(DomainClassifier::load(write("good2", good, meta("code,prose", V)), V + 8).ok());
  EXPECT_NE(error_of("small", good, meta("code,prose", V), V - 1).find("vocabulary of 16"), std::string::npos);
  auto m = meta("code,prose", V);
  m["format"] = "pt";
  EXPECT_NE(error_of("format", good, m).find("not a domain profiles file"), std::string::npos);
  m = meta("code,prose", V);
  m["version"] = "2";
  EXPECT_NE(error_of("version", good, m).find("version 2"), std::string::npos);
  EXPECT_NE(error_of("missing", good, meta("code,prose,math", V)).find("tensor math is missing"), std::string::npos);
  EXPECT_NE(error_of("one", {{"code", table(V, -1.0f)}}, meta("code", V)).find("two kinds"), std::string::npos);
  EXPECT_NE(error_of("repeated", good, meta("code,code", V)).find("repeated"), std::string::npos);
  EXPECT_NE(error_of("extra", {good[0], good[1], {"math", table(V, -1.0f)}}, meta("code,prose", V))
                .find("unexpected tensor math"),
            std::string::npos);
  EXPECT_NE(error_of("shape", {good[0], {"prose", table(V + 1, -1.0f)}}, meta("code,prose", V)).find("shape [17]"),
            std::string::npos);
  Tensor nan = table(V, -1.0f);
  nan.data<float>()[3] = NAN;
  EXPECT_NE(error_of("nan", {good[0], {"prose", nan}}, meta("code,prose", V)).find("entry 3"), std::string::npos);
  EXPECT_NE(error_of("positive", {good[0], {"prose", table(V, 0.5f)}}, meta("code,prose", V)).find("<= 0"),
            std::string::npos);
  // A truncated file.
  const std::string path = write("cut", good, meta("code,prose", V));
  auto bytes = read_text_file(path);
  ASSERT_TRUE(bytes.ok());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes->data(), static_cast<std::streamsize>(bytes->size() / 2));
  EXPECT_FALSE(DomainClassifier::load(path, V).ok());
}

// Tokens drawn from one kind's law are put in that kind (on random tables, by the likelihood).
TEST(DomainClassifier, PicksTheKindWhoseTableFitsBest) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int V = 64, K = 3;
  std::vector<std::vector<double>> p(K, std::vector<double>(V));
  std::vector<float> log_probs;
  std::gamma_distribution<double> gamma(0.3, 1.0);
  for (auto& row : p) {
    double sum = 0.0;
    for (double& x : row) sum += (x = gamma(rng) + 1e-6);
    for (double& x : row) {
      x /= sum;
      log_probs.push_back(static_cast<float>(std::log(x)));
    }
  }
  auto c = DomainClassifier::from_tables({"a", "b", "c"}, V, log_probs);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->classify({}), 0);
  int right = 0, total = 0;
  for (int k = 0; k < K; ++k) {
    std::discrete_distribution<int> draw(p[static_cast<size_t>(k)].begin(), p[static_cast<size_t>(k)].end());
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int32_t> tokens(40);
      for (int32_t& t : tokens) t = draw(rng);
      tokens.push_back(V + 5);  // outside the tables: skipped
      // The classifier's choice is the largest sum of the tables' log-probabilities.
      int best = 0;
      double best_score = -INFINITY;
      for (int j = 0; j < K; ++j) {
        double score = 0.0;
        for (int32_t t : tokens) {
          if (t < V) score += log_probs[static_cast<size_t>(j * V + t)];
        }
        if (score > best_score) best_score = score, best = j;
      }
      EXPECT_EQ(c->classify(tokens), best);
      right += c->classify(tokens) == k;
      ++total;
    }
  }
  // Laws this different are told apart from 40 tokens nearly always.
  EXPECT_GE(right * 100, total * 95) << right << " of " << total;
}

// The bundled profiles (models/tachyon-demo/domains.safetensors, from the training split) on the
// held-out evaluation chunks, cut to the first N tokens: code and prose told apart.
TEST(DomainClassifier, BundledProfilesTellHeldOutCodeFromProse) {
  const LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo");
  auto c = DomainClassifier::load(testing::source_dir() + "/models/tachyon-demo/domains.safetensors",
                                  m.model->config().vocab_size);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->kinds(), (std::vector<std::string>{"code", "prose"}));
  const std::string dir = testing::source_dir() + "/tests/data/eval/";
  auto manifest = read_text_file(dir + "MANIFEST.tsv");
  ASSERT_TRUE(manifest.ok());
  std::map<std::string, std::string> files;
  for (const char* f : {"code.txt", "prose.txt"}) {
    auto text = read_text_file(dir + f);
    ASSERT_TRUE(text.ok());
    files[f] = *text;
  }
  std::istringstream lines(*manifest);
  std::string line;
  std::getline(lines, line);  // header
  std::vector<std::pair<std::string, std::string>> chunks;  // (kind, text)
  while (std::getline(lines, line)) {
    std::istringstream cols(line);
    std::string file, offset, bytes, category;
    std::getline(cols, file, '\t');
    std::getline(cols, offset, '\t');
    std::getline(cols, bytes, '\t');
    std::getline(cols, category, '\t');
    chunks.emplace_back(category.rfind("code", 0) == 0 ? "code" : "prose",
                        files.at(file).substr(std::stoul(offset), std::stoul(bytes)));
  }
  ASSERT_EQ(chunks.size(), 84u);
  for (size_t n : {32u, 128u}) {
    std::map<std::string, std::pair<int, int>> score;  // kind -> (right, total)
    for (const auto& [kind, text] : chunks) {
      std::vector<int32_t> ids = m.tokenizer->encode(text);  // BOS first
      ids.resize(std::min(ids.size(), n + 1));
      const std::string& got = c->kinds()[static_cast<size_t>(c->classify(ids))];
      score[kind].first += got == kind;
      ++score[kind].second;
    }
    const int right = score["code"].first + score["prose"].first, total = score["code"].second + score["prose"].second;
    std::printf("prompts of %zu tokens: code %d/%d, prose %d/%d\n", n, score["code"].first, score["code"].second,
                score["prose"].first, score["prose"].second);
    // Measured (2026-12-07): 32 tokens: code 41/44, prose 40/40; 128: 41/44, 40/40 (the code
    // chunks taken for prose open with a docstring or a comment block).
    EXPECT_GE(right * 100, total * 95) << n << " tokens";
    EXPECT_GE(score["code"].first * 100, score["code"].second * 90) << n << " tokens";
    EXPECT_GE(score["prose"].first * 100, score["prose"].second * 90) << n << " tokens";
  }
}

}  // namespace
}  // namespace tachyon
