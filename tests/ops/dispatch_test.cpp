// ops:: dispatch: argument checks abort with the shapes in the message, CUDA tensors are refused
// clearly until the CUDA backend exists, and the ISA choice can be named and forced.
#include <gtest/gtest.h>

#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;

TEST(OpsDispatchDeathTest, CudaTensorsAreRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  static float fake[64];
  Tensor on_gpu = Tensor::view_of(fake, {2, 4}, DType::kF32, nullptr, Device::cuda(0));
  Tensor y = Tensor::empty({2, 4}, DType::kF32);
  Tensor w = Tensor::empty({4}, DType::kF32);
  EXPECT_DEATH(ops::rms_norm(on_gpu, w, 1e-6f, y), "rms_norm: x is on cuda:0.*no CUDA backend");
  EXPECT_DEATH(ops::softmax(on_gpu), "softmax: x is on cuda:0");
  Weight weight;
  weight.dense = Tensor::empty({4, 4}, DType::kBF16);
  EXPECT_DEATH(ops::linear(on_gpu, weight, nullptr, y), "linear: x is on cuda:0");
}

TEST(OpsDispatchDeathTest, ShapeMismatchesNameTheShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor x = Tensor::zeros({3, 8}, DType::kF32);
  Tensor y = Tensor::zeros({3, 5}, DType::kF32);
  Weight w;
  w.dense = Tensor::zeros({6, 8}, DType::kBF16);
  EXPECT_DEATH(ops::linear(x, w, nullptr, y), "linear: y is \\[3, 5\\] f32, expected \\[3, 6\\]");
  Weight w_bad;
  w_bad.dense = Tensor::zeros({6, 7}, DType::kF32);
  EXPECT_DEATH(ops::linear(x, w_bad, nullptr, y), "disagree on in_features");
  Tensor ids = testing::i32_tensor({0, 9});
  Tensor table = Tensor::zeros({9, 8}, DType::kF32);
  Tensor out = Tensor::zeros({2, 8}, DType::kF32);
  EXPECT_DEATH(ops::embedding(table, ids, out), "ids\\[1\\] = 9 outside the vocabulary of 9");
  Tensor xi = Tensor::zeros({3, 8}, DType::kI32);
  Tensor wn = Tensor::zeros({8}, DType::kF32);
  EXPECT_DEATH(ops::rms_norm(xi, wn, 1e-6f, x), "expected f32");
}

TEST(OpsDispatchDeathTest, AttentionMetadataIsChecked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor q = Tensor::zeros({2, 4, 8}, DType::kF32);
  Tensor out = Tensor::zeros({2, 4, 8}, DType::kF32);
  Tensor k_cache = Tensor::zeros({3, 16, 2, 8}, DType::kF32);
  Tensor v_cache = Tensor::zeros({3, 16, 2, 8}, DType::kF32);
  AttentionMetadata meta;
  meta.num_seqs = 1;
  meta.block_size = 16;
  meta.query_start = testing::i32_tensor({0, 2});
  meta.context_lens = testing::i32_tensor({20});
  meta.block_tables = Tensor::empty({1, 2}, DType::kI32);
  meta.block_tables.data<int32_t>()[0] = 2;
  meta.block_tables.data<int32_t>()[1] = 5;  // past the cache's 3 blocks
  AttentionParams params;
  EXPECT_DEATH(ops::paged_attention(q, k_cache, v_cache, meta, params, out), "seq 0 block 1 -> 5 \\(cache has 3\\)");
  meta.block_tables.data<int32_t>()[1] = 0;
  meta.context_lens = testing::i32_tensor({1});
  EXPECT_DEATH(ops::paged_attention(q, k_cache, v_cache, meta, params, out), "seq 0 has 2 queries, context 1");
}

TEST(OpsDispatch, IsaNamesAndOverride) {
  EXPECT_EQ(ops::cpu::parse_isa("avx2"), Isa::kAvx2);
  EXPECT_EQ(ops::cpu::parse_isa("avx512"), Isa::kAvx512);
  EXPECT_EQ(ops::cpu::parse_isa("scalar"), Isa::kScalar);
  EXPECT_FALSE(ops::cpu::parse_isa("sse"));
  EXPECT_TRUE(ops::cpu::isa_supported(Isa::kScalar));
  {
    testing::IsaScope scope(Isa::kScalar);
    EXPECT_EQ(ops::cpu::active_isa(), Isa::kScalar);
    EXPECT_NE(ops::backend_info().find("scalar"), std::string::npos);
  }
  EXPECT_EQ(ops::cpu::active_isa() == Isa::kScalar,
            std::getenv("TACHYON_ISA") != nullptr && std::string(std::getenv("TACHYON_ISA")) == "scalar");
}

}  // namespace
}  // namespace tachyon
