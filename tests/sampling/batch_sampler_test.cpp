// BatchSampler on the host: each row drawn as its request's own Sampler would draw it, draft rows
// left to the verifier, one draw per non-greedy row, and a logits shape that disagrees is an
// error, not an abort. (tests/gpu/sampling_gpu_test.cpp holds the device places against these.)
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "sampling/batch_sampler.h"
#include "sampling/mixed_requests.h"
#include "test_util.h"

namespace tachyon {
namespace {

constexpr int kVocab = 300;

TEST(BatchSampler, HostRowsDrawAsTheirSamplersWouldAndLeaveDraftsToTheVerifier) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const std::vector<SamplingParams> ps = testing::mixed_sampling_params(1000);
  std::vector<Sampler> batch = testing::samplers_with_history(ps), alone = testing::samplers_with_history(ps);
  // Entry 1 verifies a draft of 3 tokens: 4 rows.
  std::vector<SampleRow> rows;
  for (size_t i = 0; i < batch.size(); ++i) rows.push_back({&batch[i], i == 1 ? 3 : 0});
  const int64_t num_rows = 1 + 4 + 1 + 1 + 1;

  BatchSampler sampler(Device::cpu(), kVocab);
  auto place = sampler.begin(rows);
  ASSERT_TRUE(place.ok()) << place.status().to_string();
  EXPECT_EQ(*place, BatchSampler::Place::kHost);
  const Tensor logits = testing::random_tensor({num_rows, kVocab}, rng, -4.0f, 4.0f);
  sampler.logits() = logits;
  ASSERT_TRUE(sampler.finish(rows).ok());

  int row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(fmt::format("entry {}", i));
    EXPECT_EQ(sampler.host_logits(row), logits.data<float>() + row * kVocab);
    if (rows[i].num_draft == 0) {
      auto got = sampler.host_sample(i);
      auto want = alone[i].sample(logits.data<float>() + row * kVocab, kVocab);
      ASSERT_TRUE(got.ok() && want.ok());
      EXPECT_EQ(got->token, want->token);
      EXPECT_EQ(got->logprob, want->logprob);
      // One draw per non-greedy row, none for greedy ones: the streams stay in step.
      EXPECT_EQ(batch[i].rng().next_u64(), alone[i].rng().next_u64());
    }
    row += rows[i].num_rows();
  }
}

TEST(BatchSampler, LogitsOfTheWrongShapeAreAnError) {
  const std::vector<SamplingParams> ps = testing::mixed_sampling_params(1000);
  std::vector<Sampler> batch = testing::samplers_with_history(ps);
  std::vector<SampleRow> rows;
  for (Sampler& s : batch) rows.push_back({&s, 0});
  BatchSampler sampler(Device::cpu(), kVocab);
  ASSERT_TRUE(sampler.begin(rows).ok());
  sampler.logits() = Tensor::zeros({static_cast<int64_t>(rows.size()) - 1, kVocab}, DType::kF32);
  const Status s = sampler.finish(rows);
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.to_string();
}

}  // namespace
}  // namespace tachyon
