// The CUDA backend's recorded errors (ops/errors.h): an attention workspace that cannot be
// allocated or a linear whose launch fails — injected — makes the ops after it do nothing, the
// model's forward returns the error, and the engine ends only the requests of that step: the
// request that waited runs to the tokens it makes alone, every block comes back. With CUDA graphs
// on and off (the fault lands in the first decode step's eager run, before its capture). Skips
// without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <map>

#include <fmt/format.h>

#include "engine/engine.h"
#include "gpu_test_util.h"
#include "model/model_loader.h"
#include "ops/errors.h"
#include "test_util.h"

namespace tachyon {
namespace {

const Device kGpu = Device::cuda(0);

GenerationParams greedy(int max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(GpuEngine, AFailedStepEndsItsRequestsAndTheEngineGoesOn) {
  TACHYON_START_GPU();
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  const std::vector<int32_t> first = gpu.tokenizer->encode("Once upon a time");
  const std::vector<int32_t> second = gpu.tokenizer->encode("The little dog ran");
  for (const bool graphs : {false, true}) {
    for (const ops::Fault fault : {ops::Fault::kWorkspace, ops::Fault::kKernel}) {
      SCOPED_TRACE(fmt::format("cuda graphs {}, {} fault", graphs ? "on" : "off",
                               fault == ops::Fault::kWorkspace ? "workspace" : "kernel"));
      EngineOptions eo;
      eo.kv.num_blocks = 64;
      eo.max_model_len = 256;
      eo.scheduler.max_seqs = 1;  // the second request waits while the first runs
      eo.cuda_graphs = graphs;
      const auto run = [&](Engine& e, std::map<RequestId, std::vector<int32_t>>& got) {
        while (e.has_unfinished()) {
          auto out = e.step();
          ASSERT_TRUE(out.ok()) << out.status().to_string();
          for (const auto& o : *out) got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }
      };
      std::vector<int32_t> alone;
      {
        auto e = Engine::create(*gpu.model, gpu.tokenizer.get(), gpu.eos_token_ids, eo);
        ASSERT_TRUE(e.ok()) << e.status().to_string();
        auto id = (*e)->add_request(second, greedy(8));
        ASSERT_TRUE(id.ok());
        std::map<RequestId, std::vector<int32_t>> got;
        run(**e, got);
        alone = got[*id];
        ASSERT_EQ(alone.size(), 8u);
      }
      auto e = Engine::create(*gpu.model, gpu.tokenizer.get(), gpu.eos_token_ids, eo);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      auto a = (*e)->add_request(first, greedy(8));
      auto b = (*e)->add_request(second, greedy(8));
      ASSERT_TRUE(a.ok() && b.ok());
      auto out = (*e)->step();  // the first prompt and its first token
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ops::inject_fault(DeviceType::kCuda, fault);
      out = (*e)->step();
      ASSERT_TRUE(out.ok()) << "a failed step is not the engine's failure: " << out.status().to_string();
      ASSERT_EQ(out->size(), 1u);
      EXPECT_EQ((*out)[0].id, *a);
      EXPECT_EQ((*out)[0].finish_reason, FinishReason::kError);
      EXPECT_NE((*out)[0].error.message().find("injected fault"), std::string::npos) << (*out)[0].error.to_string();
      std::map<RequestId, std::vector<int32_t>> got;
      run(**e, got);
      EXPECT_EQ(got[*b], alone);
      EXPECT_EQ((*e)->stats().num_failed_steps, 1);
      ASSERT_OK((*e)->check_no_leaks());
      ASSERT_OK(ops::take_error(kGpu));
    }
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
