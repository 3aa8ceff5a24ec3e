// Proposal heads of random weights for tests (speculative/spec_heads.h's file layout): the
// tensors, their metadata, a file in a scratch directory.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/safetensors_writer.h"
#include "test_util.h"

namespace tachyon::testing {

struct HeadsSpec {
  int num_heads = 3;
  int hidden = 256;
  int ffn = 64;
  int vocab = 8192;
  float scale = 0.05f;
};

inline std::vector<NamedTensor> random_heads(const HeadsSpec& s, std::mt19937& rng) {
  std::vector<NamedTensor> t;
  for (int i = 0; i < s.num_heads; ++i) {
    const std::string p = "heads." + std::to_string(i) + ".";
    t.push_back({p + "in_norm.weight", random_tensor({s.hidden}, rng, 0.5f, 1.5f)});
    t.push_back({p + "x_proj.weight", random_tensor({2 * s.ffn, s.hidden}, rng, -s.scale, s.scale)});
    t.push_back({p + "e_proj.weight", random_tensor({2 * s.ffn, s.hidden}, rng, -s.scale, s.scale)});
    t.push_back({p + "down_proj.weight", random_tensor({s.hidden, s.ffn}, rng, -s.scale, s.scale)});
    t.push_back({p + "out_norm.weight", random_tensor({s.hidden}, rng, 0.5f, 1.5f)});
  }
  return t;
}

inline std::map<std::string, std::string> heads_metadata(const HeadsSpec& s) {
  return {{"format", "tachyon-spec-heads"},         {"version", "1"},
          {"num_heads", std::to_string(s.num_heads)}, {"hidden_size", std::to_string(s.hidden)},
          {"ffn_size", std::to_string(s.ffn)},        {"vocab_size", std::to_string(s.vocab)},
          {"rms_norm_eps", "1e-05"}};
}

inline std::string write_heads(const std::string& name, const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& meta) {
  const std::string path = scratch_dir("heads") + "/" + name + ".safetensors";
  const Status s = write_safetensors(path, tensors, meta);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return path;
}

}  // namespace tachyon::testing
