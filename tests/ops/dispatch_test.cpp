// ops:: dispatch: argument checks abort with the shapes in the message, CUDA tensors are refused
// clearly when no CUDA backend runs, and the ISA choice can be named and forced. Also the ops
// without a backend-specific kernel file: argmax and the synthetic-weight fill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/thread_pool.h"

#include "ops/backend.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;

TEST(OpsDispatchDeathTest, CudaTensorsAreRefusedWithoutABackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  static float fake[64];
  Tensor on_gpu = Tensor::view_of(fake, {2, 4}, DType::kF32, nullptr, Device::cuda(0));
  Tensor y = Tensor::empty({2, 4}, DType::kF32);
  Tensor w = Tensor::empty({4}, DType::kF32);
  ASSERT_EQ(ops::backend_for(Device::cuda(0)), nullptr);
  EXPECT_DEATH(ops::rms_norm(on_gpu, w, 1e-6f, y), "rms_norm: a tensor is on cuda:0, and no backend for it is running");
  EXPECT_DEATH(ops::rms_norm(w.reshape({1, 4}), on_gpu.slice(0, 0, 1), 1e-6f, y), "rms_norm: weight is on cuda:0");
  EXPECT_DEATH(ops::softmax(on_gpu), "softmax: x is on cuda:0");
  Weight weight;
  weight.dense = Tensor::empty({4, 4}, DType::kBF16);
  EXPECT_DEATH(ops::linear(on_gpu, weight, nullptr, y), "linear: a tensor is on cuda:0");
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
  KvLayer cache{Tensor::zeros({3, 16, 2, 8}, DType::kF32), Tensor::zeros({3, 16, 2, 8}, DType::kF32), {}, {}, {}, {}, {}, {}};
  AttentionMetadata meta;
  meta.num_seqs = 1;
  meta.block_size = 16;
  meta.query_start = testing::i32_tensor({0, 2});
  meta.context_lens = testing::i32_tensor({20});
  meta.block_tables = Tensor::empty({1, 2}, DType::kI32);
  meta.block_tables.data<int32_t>()[0] = 2;
  meta.block_tables.data<int32_t>()[1] = 5;  // past the cache's 3 blocks
  AttentionParams params;
  EXPECT_DEATH(ops::paged_attention(q, cache, meta, params, out), "seq 0 block 1 -> 5 \\(cache has 3, and 0 history blocks\\)");
  meta.block_tables.data<int32_t>()[1] = 0;
  meta.context_lens = testing::i32_tensor({1});
  EXPECT_DEATH(ops::paged_attention(q, cache, meta, params, out), "seq 0 has 2 queries, context 1");
  // A quantized cache needs its scales, of its shape.
  meta.context_lens = testing::i32_tensor({20});
  KvLayer quantized{Tensor::zeros({3, 16, 2, 8}, DType::kI8), Tensor::zeros({3, 16, 2, 8}, DType::kI8), {}, {}, {}, {}, {}, {}};
  EXPECT_DEATH(ops::paged_attention(q, quantized, meta, params, out), "a i8 cache needs scales");
  quantized.k_scales = Tensor::zeros({3, 16, 2, 1}, DType::kF32);
  quantized.v_scales = Tensor::zeros({3, 16, 1, 1}, DType::kF32);
  EXPECT_DEATH(ops::paged_attention(q, quantized, meta, params, out), "expected \\[3, 16, 2, 1\\] f32");
  cache.k_scales = quantized.k_scales;
  cache.v_scales = quantized.k_scales;
  EXPECT_DEATH(ops::paged_attention(q, cache, meta, params, out), "a f32 cache takes no scales");
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

TEST(OpsArgmax, FirstLargestFiniteValue) {
  std::mt19937 rng(testing::fresh_seed());
  const int64_t d = 1001;
  Tensor x = testing::random_tensor({6, d}, rng);
  float* p = x.data<float>();
  p[0 * d + 1000] = 5.0f;                                        // at the end
  p[1 * d + 7] = 5.0f, p[1 * d + 9] = 5.0f;                      // a tie: the first
  p[2 * d + 3] = std::numeric_limits<float>::infinity();         // non-finite values are skipped
  p[2 * d + 4] = std::numeric_limits<float>::quiet_NaN();
  p[2 * d + 5] = 4.0f;
  for (int64_t j = 0; j < d; ++j) p[3 * d + j] = -std::numeric_limits<float>::infinity();  // none finite: 0
  Tensor ids = Tensor::empty({6}, DType::kI32), lps = Tensor::empty({6}, DType::kF32);
  ops::argmax(x, ids, &lps);
  EXPECT_EQ(ids.data<int32_t>()[0], 1000);
  EXPECT_EQ(ids.data<int32_t>()[1], 7);
  EXPECT_EQ(ids.data<int32_t>()[2], 5);
  EXPECT_EQ(ids.data<int32_t>()[3], 0);
  EXPECT_EQ(lps.data<float>()[3], -std::numeric_limits<float>::infinity());
  for (int r : {0, 1, 2, 4, 5}) {
    const float* row = p + r * d;
    if (r >= 4) {
      EXPECT_EQ(ids.data<int32_t>()[r], std::max_element(row, row + d) - row);
    }
    double sum = 0.0;  // log_softmax over the finite values
    for (int64_t j = 0; j < d; ++j) {
      if (std::isfinite(row[j])) sum += std::exp(static_cast<double>(row[j]));
    }
    EXPECT_NEAR(lps.data<float>()[r], row[ids.data<int32_t>()[r]] - std::log(sum), 1e-5) << r;
  }
}

// top_tokens against a plain sort of every finite value: ranking by value then id (ties, a
// maximum at the end), non-finite values left out, rows with fewer finite values than m.
TEST(OpsTopTokens, TheMLargestFiniteValuesRankedWithTheirSoftmax) {
  std::mt19937 rng(testing::fresh_seed());
  const int64_t d = 777, m = 9;
  Tensor x = testing::random_tensor({5, d}, rng);
  float* p = x.data<float>();
  p[0 * d + 776] = 6.0f;
  p[1 * d + 40] = 3.0f, p[1 * d + 12] = 3.0f, p[1 * d + 500] = 3.0f;  // a three-way tie: ids ascending
  p[2 * d + 3] = std::numeric_limits<float>::infinity();
  p[2 * d + 4] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t j = 0; j < d; ++j) p[3 * d + j] = j % 200 == 0 ? static_cast<float>(j) * 0.01f : -INFINITY;  // 4 finite
  for (int64_t j = 0; j < d; ++j) p[4 * d + j] = -std::numeric_limits<float>::infinity();                   // none
  Tensor ids = Tensor::empty({5, m}, DType::kI32), probs = Tensor::empty({5, m}, DType::kF32);
  ops::top_tokens(x, ids, probs);
  Tensor argmax_ids = Tensor::empty({5}, DType::kI32);
  ops::argmax(x, argmax_ids);
  for (int64_t r = 0; r < 5; ++r) {
    const float* row = p + r * d;
    std::vector<int32_t> order;
    double sum = 0.0, top = -INFINITY;
    for (int64_t j = 0; j < d; ++j) top = std::isfinite(row[j]) ? std::max<double>(top, row[j]) : top;
    for (int64_t j = 0; j < d; ++j) {
      if (!std::isfinite(row[j])) continue;
      order.push_back(static_cast<int32_t>(j));
      sum += std::exp(row[j] - top);
    }
    std::stable_sort(order.begin(), order.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int64_t i = 0; i < m; ++i) {
      const int32_t got = ids.data<int32_t>()[r * m + i];
      const float w = probs.data<float>()[r * m + i];
      if (static_cast<size_t>(i) < order.size()) {
        EXPECT_EQ(got, order[static_cast<size_t>(i)]) << r << " " << i;
        EXPECT_NEAR(w, std::exp(row[got] - top) / sum, 1e-6) << r << " " << i;
      } else {
        EXPECT_EQ(got, -1) << r << " " << i;
        EXPECT_EQ(w, 0.0f) << r << " " << i;
      }
    }
    if (r != 4) EXPECT_EQ(ids.data<int32_t>()[r * m], argmax_ids.data<int32_t>()[r]);
  }
  EXPECT_EQ(ids.data<int32_t>()[1 * m + 0], 12);
  EXPECT_EQ(ids.data<int32_t>()[1 * m + 1], 40);
  EXPECT_EQ(ids.data<int32_t>()[1 * m + 2], 500);
}

// advance_decode moves every sequence of a decode batch to its next position: token from the
// step before, position and context length + 1, the slot in its table (across a block boundary).
TEST(OpsAdvanceDecode, NextPositionTokenAndSlot) {
  const int block_size = 4;
  const auto i32 = [](std::vector<int32_t> v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  Tensor next = i32({11, 22, 33}), tokens = i32({1, 2, 3}), positions = i32({2, 3, 0});
  Tensor context = i32({3, 4, 1}), slots = i32({-5, -5, -5});
  Tensor tables = Tensor::empty({3, 3}, DType::kI32);
  const int32_t t[] = {7, 8, -1, 5, 9, -1, 2, -1, -1};
  std::copy(std::begin(t), std::end(t), tables.data<int32_t>());
  ops::advance_decode(next, tokens, positions, context, tables, block_size, slots);
  EXPECT_EQ(std::vector<int32_t>(tokens.data<int32_t>(), tokens.data<int32_t>() + 3), (std::vector<int32_t>{11, 22, 33}));
  EXPECT_EQ(std::vector<int32_t>(positions.data<int32_t>(), positions.data<int32_t>() + 3), (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(std::vector<int32_t>(context.data<int32_t>(), context.data<int32_t>() + 3), (std::vector<int32_t>{4, 5, 2}));
  // Position 3 is block 7's last slot, position 4 block 9's first, position 1 block 2's second.
  EXPECT_EQ(std::vector<int32_t>(slots.data<int32_t>(), slots.data<int32_t>() + 3),
            (std::vector<int32_t>{7 * 4 + 3, 9 * 4 + 0, 2 * 4 + 1}));
}

TEST(OpsFillUniform, DeterministicInRangeAndIndependentOfThreads) {
  Tensor a = Tensor::empty({300007}, DType::kF32);
  ops::fill_uniform(a, 5, 2, 0.5f, 1.0f);
  const float* v = a.data<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_TRUE(v[i] >= 0.5f && v[i] < 1.5f) << i << ": " << v[i];
    sum += v[i];
  }
  EXPECT_NEAR(sum / static_cast<double>(a.numel()), 1.0, 0.005);
  const int threads = num_threads();
  set_num_threads(1);
  Tensor b = Tensor::empty({300007}, DType::kF32);
  ops::fill_uniform(b, 5, 2, 0.5f, 1.0f);
  set_num_threads(threads);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  Tensor c = Tensor::empty({300007}, DType::kF32);
  ops::fill_uniform(c, 5, 3, 0.5f, 1.0f);  // another stream: other values
  EXPECT_NE(std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()), 0);
}

}  // namespace
}  // namespace tachyon
