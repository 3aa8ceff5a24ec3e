#include <gtest/gtest.h>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

#include <atomic>

namespace tachyon {
namespace {

TEST(Tensor, ShapesStridesAndViews) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kF32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_TRUE(t.is_contiguous());
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor s = t.slice(2, 1, 3);  // [2, 3, 2], non-contiguous
  EXPECT_FALSE(s.is_contiguous());
  Tensor c = s.contiguous();
  EXPECT_EQ(c.shape(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(c.data<float>()[0], 1.0f);
  EXPECT_EQ(c.data<float>()[1], 2.0f);
  EXPECT_EQ(c.data<float>()[2], 5.0f);
  Tensor row = t.select(0, 1);  // [3, 4]
  EXPECT_EQ(row.data<float>()[0], 12.0f);
  EXPECT_EQ(t.reshape({6, -1}).size(1), 4);
}

TEST(Tensor, ViewKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(8, 3.0f);
  std::weak_ptr<std::vector<float>> weak = owner;
  Tensor v = Tensor::view_of(owner->data(), {8}, DType::kF32, owner);
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(v.data<float>()[7], 3.0f);
  v = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(Tensor, ToF32ConvertsHalfTypes) {
  Tensor t = Tensor::empty({3}, DType::kBF16);
  t.data<uint16_t>()[0] = f32_to_bf16(1.5f);
  t.data<uint16_t>()[1] = f32_to_bf16(-2.0f);
  t.data<uint16_t>()[2] = f32_to_bf16(0.25f);
  Tensor f = t.to_f32();
  EXPECT_EQ(f.data<float>()[1], -2.0f);
}

TEST(Tensor, TryEmptyReportsHugeAllocation) {
  auto r = Tensor::try_empty({1LL << 40, 1LL << 20}, DType::kF32);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kOutOfMemory);
}

TEST(Status, ContextAndMacros) {
  auto inner = []() -> Result<int> { return make_error(ErrorCode::kNotFound, "tensor '{}' missing", "w"); };
  auto outer = [&]() -> Status {
    TACHYON_ASSIGN_OR_RETURN(int v, inner());
    (void)v;
    return Status::Ok();
  };
  Status s = outer().with_context("model.gguf");
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.to_string(), "not found: model.gguf: tensor 'w' missing");
}

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace tachyon
