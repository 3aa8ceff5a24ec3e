// Reads the model conformance fixtures of tests/fixtures/models/<name>/ (made by
// tools/reference/make_model_fixtures.py with transformers): prompt ids, the reference logits of
// every prompt position and of 16 greedy decode steps.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tachyon::testing {

struct ModelFixture {
  std::string dir;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> decode_ids;
  std::map<std::string, Tensor> arrays;  // "prompt_logits" [P, V], "decode_logits" [16, V], ...
};

ModelFixture read_model_fixture(const std::string& name);

// max |a - b| / max |b| over a row pair, the relative error the conformance tests bound.
double relative_error(const float* a, const float* b, int64_t n);
int32_t argmax(const float* x, int64_t n);

}  // namespace tachyon::testing
