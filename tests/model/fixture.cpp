#include "fixture.h"

#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "test_util.h"

namespace tachyon::testing {

ModelFixture read_model_fixture(const std::string& name) {
  ModelFixture f;
  f.dir = source_dir() + "/tests/fixtures/models/" + name;
  auto text = read_text_file(f.dir + "/expected.json");
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  if (!text.ok()) return f;
  const nlohmann::json j = nlohmann::json::parse(*text);
  f.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
  f.decode_ids = j.at("decode_ids").get<std::vector<int32_t>>();
  std::ifstream bin(f.dir + "/" + j.at("binary").get<std::string>(), std::ios::binary);
  for (const auto& a : j.at("arrays")) {
    const auto shape = a.at("shape").get<std::vector<int64_t>>();
    Tensor t = Tensor::empty(shape, DType::kF32);
    bin.seekg(a.at("offset").get<int64_t>());
    bin.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    EXPECT_TRUE(bin.good()) << "reading " << a.at("name");
    f.arrays[a.at("name").get<std::string>()] = t;
  }
  return f;
}

double relative_error(const float* a, const float* b, int64_t n) {
  double max_diff = 0.0, max_ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace tachyon::testing
