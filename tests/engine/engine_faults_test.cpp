// A step that fails — an op's workspace that cannot be allocated or a kernel launch that fails,
// both injected (ops/errors.h) — ends the requests it scheduled with an error and nothing else:
// a request that waited runs to the same tokens as alone, every KV block comes back, and the
// engine counts the failure. (tests/gpu holds the same on the CUDA backend.)
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "ops/errors.h"
#include "test_util.h"

namespace tachyon {
namespace {

class EngineFaults : public ::testing::TestWithParam<ops::Fault> {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo"));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static std::unique_ptr<Engine> make(int max_seqs) {
    EngineOptions o;
    o.kv.num_blocks = 64;
    o.scheduler.max_seqs = max_seqs;
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static GenerationParams greedy(int max_tokens) {
    GenerationParams p;
    p.sampling.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
  }

  static inline LoadedModel* model_ = nullptr;
};

TEST_P(EngineFaults, AFailedStepEndsItsRequestsAndTheEngineGoesOn) {
  const std::vector<int32_t> first = model_->tokenizer->encode("Once upon a time");
  const std::vector<int32_t> second = model_->tokenizer->encode("The little dog ran");

  // The second prompt's tokens alone, as the reference.
  std::vector<int32_t> alone;
  {
    auto e = make(4);
    ASSERT_TRUE(e && e->add_request(second, greedy(8)).ok());
    while (e->has_unfinished()) {
      auto out = e->step();
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      for (const RequestOutput& o : *out) alone.insert(alone.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
    ASSERT_EQ(alone.size(), 8u);
  }

  // One sequence at a time: the second request waits while the first runs.
  auto e = make(1);
  ASSERT_TRUE(e);
  auto a = e->add_request(first, greedy(8));
  auto b = e->add_request(second, greedy(8));
  ASSERT_TRUE(a.ok() && b.ok());
  auto out = e->step();  // the first prompt, and its first token
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].id, *a);

  ops::inject_fault(DeviceType::kCpu, GetParam());
  out = e->step();
  ASSERT_TRUE(out.ok()) << "a failed step is not the engine's failure: " << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  const RequestOutput& failed = (*out)[0];
  EXPECT_EQ(failed.id, *a);
  EXPECT_TRUE(failed.finished);
  EXPECT_EQ(failed.finish_reason, FinishReason::kError);
  EXPECT_NE(failed.error.message().find("injected fault"), std::string::npos) << failed.error.to_string();
  EXPECT_EQ(failed.error.code(), GetParam() == ops::Fault::kWorkspace ? ErrorCode::kOutOfMemory : ErrorCode::kInternal);
  EXPECT_EQ(e->stats().num_failed_steps, 1);

  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kAbort;
  while (e->has_unfinished()) {
    out = e->step();
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (const RequestOutput& o : *out) {
      ASSERT_EQ(o.id, *b);
      tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) reason = o.finish_reason;
    }
  }
  EXPECT_EQ(reason, FinishReason::kLength);
  EXPECT_EQ(tokens, alone);
  EXPECT_EQ(e->stats().num_failed_steps, 1);
  EXPECT_TRUE(e->check_no_leaks().ok()) << e->check_no_leaks().to_string();
  EXPECT_TRUE(ops::take_error(Device::cpu()).ok()) << "the failed step's error was taken with it";
}

INSTANTIATE_TEST_SUITE_P(Faults, EngineFaults, ::testing::Values(ops::Fault::kWorkspace, ops::Fault::kKernel),
                         [](const ::testing::TestParamInfo<ops::Fault>& info) {
                           return info.param == ops::Fault::kWorkspace ? std::string("Workspace") : std::string("Kernel");
                         });

}  // namespace
}  // namespace tachyon
