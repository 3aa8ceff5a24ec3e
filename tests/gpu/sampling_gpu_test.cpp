// The device ops that choose tokens and move a decode batch on, against their CPU forms (ops.cpp):
// argmax, top_tokens, sample (and the law q it returns), adjust_logits, advance_decode, and the
// synthetic-weight fill; the BatchSampler's device places against its host place. Skips without a
// device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "ops/cuda/launch.h"
#include "ops/ops.h"
#include "sampling/batch_sampler.h"
#include "sampling/mixed_requests.h"
#include "test_util.h"

namespace tachyon {
namespace {

const Device kGpu = Device::cuda(0);

Tensor to_host(const Tensor& t) {
  auto h = copy_to(t, Device::cpu());
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return std::move(h).value();
}

TEST(GpuOps, FillUniformEqualsTheCpuDrawsAndArgmaxTheCpuArgmax) {
  TACHYON_START_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor host = Tensor::empty({100003}, dtype);
    ops::fill_uniform(host, 7, 3, 0.25f, 1.0f);
    auto dev = empty_on({100003}, dtype, kGpu);
    ASSERT_TRUE(dev.ok());
    ops::fill_uniform(*dev, 7, 3, 0.25f, 1.0f);
    ASSERT_TRUE(testing::bitwise_equal(to_host(*dev), host, dtype_name(dtype)));
  }
  std::mt19937 rng(testing::fresh_seed());
  for (int64_t d : {1, 31, 1000, 32000, 128257}) {
    Tensor x = testing::random_tensor({5, d}, rng);
    x.data<float>()[2 * d + (d - 1)] = 7.0f;  // a maximum at the last column
    if (d > 3) {                              // a tie: the first index wins
      x.data<float>()[3 * d + 1] = 5.0f;
      x.data<float>()[3 * d + 3] = 5.0f;
    }
    if (d > 1000) {  // a tie far apart (in different chunks where a row is split over blocks)
      x.data<float>()[4 * d + d / 2 + 1] = 9.0f;
      x.data<float>()[4 * d + d - 2] = 9.0f;
    }
    Tensor ids = Tensor::empty({5}, DType::kI32), lps = Tensor::empty({5}, DType::kF32);
    ops::argmax(x, ids, &lps);
    auto dx = copy_to(x, kGpu);
    auto dids = empty_on({5}, DType::kI32, kGpu);
    auto dlps = empty_on({5}, DType::kF32, kGpu);
    ASSERT_TRUE(dx.ok() && dids.ok() && dlps.ok());
    ops::argmax(*dx, *dids, &*dlps);
    const Tensor got = to_host(*dids), got_lp = to_host(*dlps);
    for (int r = 0; r < 5; ++r) {
      EXPECT_EQ(got.data<int32_t>()[r], ids.data<int32_t>()[r]) << "d=" << d << " row " << r;
      EXPECT_NEAR(got_lp.data<float>()[r], lps.data<float>()[r], 1e-4 * (1.0 + std::fabs(lps.data<float>()[r])))
          << "d=" << d << " row " << r;
    }
  }
}

// top_tokens and advance_decode on the device give the CPU ops' results: vocabularies from one
// chunk to Llama-3's (rows split over many blocks), ties in different chunks, NaN and -inf values,
// a row with fewer finite values than m, m from 1 to kMaxTopTokens.
TEST(GpuOps, TopTokensAndAdvanceDecodeEqualTheCpuOps) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (int64_t d : {5, 1000, 4096, 4097, 128256}) {
    for (int64_t m : {int64_t{1}, int64_t{7}, ops::kMaxTopTokens}) {
      const int64_t n = 4;
      Tensor x = testing::random_tensor({n, d}, rng);
      float* p = x.data<float>();
      if (d > 4100) {  // ties far apart, in different chunks
        p[0 * d + 17] = 9.0f;
        p[0 * d + d - 3] = 9.0f;
        p[0 * d + 4096] = 9.0f;
      }
      p[1 * d + 0] = std::numeric_limits<float>::quiet_NaN();
      p[1 * d + d - 1] = std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < d; ++j) p[2 * d + j] = j % 997 == 1 ? static_cast<float>(j % 5) : -INFINITY;
      Tensor ids = Tensor::empty({n, m}, DType::kI32), probs = Tensor::empty({n, m}, DType::kF32);
      ops::top_tokens(x, ids, probs);
      auto dx = copy_to(x, kGpu);
      auto dids = empty_on({n, m}, DType::kI32, kGpu);
      auto dprobs = empty_on({n, m}, DType::kF32, kGpu);
      ASSERT_TRUE(dx.ok() && dids.ok() && dprobs.ok());
      ops::top_tokens(*dx, *dids, *dprobs);
      const Tensor got = to_host(*dids), got_p = to_host(*dprobs);
      for (int64_t i = 0; i < n * m; ++i) {
        ASSERT_EQ(got.data<int32_t>()[i], ids.data<int32_t>()[i]) << "d=" << d << " m=" << m << " at " << i;
        ASSERT_NEAR(got_p.data<float>()[i], probs.data<float>()[i], 1e-5 + 1e-4 * probs.data<float>()[i])
            << "d=" << d << " m=" << m << " at " << i;
      }
    }
  }
  const int64_t n = 300, columns = 8;
  const int block_size = 16;
  std::uniform_int_distribution<int32_t> pos(0, static_cast<int32_t>(columns * block_size) - 2);
  Tensor next = Tensor::empty({n}, DType::kI32), tokens = Tensor::empty({n}, DType::kI32);
  Tensor positions = Tensor::empty({n}, DType::kI32), context = Tensor::empty({n}, DType::kI32);
  Tensor slots = Tensor::empty({n}, DType::kI32), tables = Tensor::empty({n, columns}, DType::kI32);
  for (int64_t s = 0; s < n; ++s) {
    next.data<int32_t>()[s] = static_cast<int32_t>(rng() % 1000);
    tokens.data<int32_t>()[s] = -1;
    positions.data<int32_t>()[s] = pos(rng);
    context.data<int32_t>()[s] = positions.data<int32_t>()[s] + 1;
    slots.data<int32_t>()[s] = -1;
    for (int64_t c = 0; c < columns; ++c) tables.data<int32_t>()[s * columns + c] = static_cast<int32_t>(rng() % 5000);
  }
  std::vector<Tensor> dev;
  for (const Tensor* t : {&next, &tokens, &positions, &context, &slots, &tables}) {
    auto d = copy_to(*t, kGpu);
    ASSERT_TRUE(d.ok());
    dev.push_back(*d);
  }
  ops::advance_decode(next, tokens, positions, context, tables, block_size, slots);
  ops::advance_decode(dev[0], dev[1], dev[2], dev[3], dev[5], block_size, dev[4]);
  EXPECT_TRUE(testing::bitwise_equal(to_host(dev[1]), tokens, "tokens"));
  EXPECT_TRUE(testing::bitwise_equal(to_host(dev[2]), positions, "positions"));
  EXPECT_TRUE(testing::bitwise_equal(to_host(dev[3]), context, "context lens"));
  EXPECT_TRUE(testing::bitwise_equal(to_host(dev[4]), slots, "slots"));
}

// ops::sample on the device draws the CPU op's token for the same row and uniform draw: random rows
// with a NaN, temperatures, min-p, top-k (with a run of tied values at the boundary) and top-p
// values, greedy rows, draws near 0 and near 1, flat and peaked rows, a small vocabulary and
// Llama-3's.
TEST(GpuOps, SampleEqualsTheCpuDraw) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  constexpr int64_t kCols = ops::kSampleParams;
  int mismatches = 0, total = 0;
  for (int64_t d : {1000, 128257}) {
    constexpr int kRows = 20;
    Tensor x = testing::random_tensor({kRows, d}, rng);
    for (int r = 0; r < kRows; ++r) {
      const float spread = r % 2 == 0 ? 5.0f : 25.0f;  // flat-ish and peaked rows
      for (int64_t j = 0; j < d; ++j) x.data<float>()[r * d + j] *= spread;
    }
    x.data<float>()[2 * d + 5] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 300; j < 320; ++j) x.data<float>()[9 * d + j] = 40.0f;  // 20 tied maxima
    Tensor params = Tensor::empty({kRows, kCols}, DType::kF32);
    const float temperatures[kRows] = {1.0f, 0.7f, 0.0f, 1.5f, 1.0f, 0.3f, 2.0f, 0.0f, 1.0f, 0.9f,
                                       0.5f, 1.2f, 1.0f, 0.8f, 1.0f, 1.0f, 0.6f, 1.0f, 1.1f, 1.0f};
    const float min_ps[kRows] = {0.0f, 0.05f, 0.0f, 0.0f, 0.0f, 0.1f, 0.0f, 0.3f, 0.02f, 0.0f,
                                 0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.01f, 0.0f, 0.0f, 0.0f, 0.0f};
    const float top_ks[kRows] = {0, 0, 0, 0, 0, 0, 0, 0, 50, 7, 1, 0, 0, 40, 0, 1000, 0, 100, 0, 3};
    const float top_ps[kRows] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.9f,
                                 1.0f, 1.0f, 0.9f, 0.8f, 0.5f, 0.95f, 0.99f, 0.7f, 0.3f, 0.9f};
    for (int r = 0; r < kRows; ++r) {
      double u = uniform(rng);
      if (r == 4) u = 0.0;
      if (r == 6 || r == 14) u = 1.0 - 1e-12;
      float* p = params.data<float>() + kCols * r;
      p[0] = temperatures[r];
      p[1] = min_ps[r];
      p[2] = static_cast<float>(u);
      p[3] = static_cast<float>(u - static_cast<double>(p[2]));
      p[4] = top_ks[r];
      p[5] = top_ps[r];
    }
    Tensor ids = Tensor::empty({kRows}, DType::kI32), lps = Tensor::empty({kRows}, DType::kF32);
    auto dx = copy_to(x, kGpu);
    auto dp = copy_to(params, kGpu);
    auto dids = empty_on({kRows}, DType::kI32, kGpu);
    auto dlps = empty_on({kRows}, DType::kF32, kGpu);
    auto dprobs = empty_on({kRows, d}, DType::kF32, kGpu);
    ASSERT_TRUE(dx.ok() && dp.ok() && dids.ok() && dlps.ok() && dprobs.ok());
    Tensor probs = Tensor::empty({kRows, d}, DType::kF32);
    ops::sample(x, params, ids, lps, &probs);
    ops::sample(*dx, *dp, *dids, *dlps, &*dprobs);
    const Tensor got = to_host(*dids), got_lp = to_host(*dlps), got_probs = to_host(*dprobs);
    for (int r = 0; r < kRows; ++r) {
      // The law of each draw: the kept weights over their sum (a kept set that differs at a tied
      // boundary would show here as well as in the token).
      for (int64_t j = 0; j < d; ++j) {
        const float want = probs.data<float>()[r * d + j];
        ASSERT_NEAR(got_probs.data<float>()[r * d + j], want, 1e-6 + 1e-4 * want) << "d=" << d << " row " << r << " id " << j;
      }
      ++total;
      // expf on the device and std::exp differ in the last bits: a draw within rounding of a
      // boundary between two tokens may pick the neighbour. Anything else must agree.
      if (got.data<int32_t>()[r] != ids.data<int32_t>()[r]) {
        ++mismatches;
        std::printf("sample mismatch (one allowed): d=%lld row %d: %d vs %d\n", static_cast<long long>(d), r,
                    got.data<int32_t>()[r], ids.data<int32_t>()[r]);
        continue;
      }
      EXPECT_NEAR(got_lp.data<float>()[r], lps.data<float>()[r], 1e-4 * (1.0 + std::fabs(lps.data<float>()[r])))
          << "d=" << d << " row " << r;
    }
  }
  EXPECT_LE(mismatches, 1) << "of " << total;
}

// adjust_logits on the device makes the CPU op's edits, to the bit.
TEST(GpuOps, AdjustLogitsEqualsTheCpuOp) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  Tensor x = testing::random_tensor({7, 3001}, rng);
  std::uniform_int_distribution<int> token(0, 3000);
  std::vector<float> edits;
  for (int r = 0; r < 7; ++r) {
    std::set<int> used;
    for (int i = 0; i < 200; ++i) {
      const int t = token(rng);
      if (!used.insert(t).second) continue;
      edits.insert(edits.end(), {static_cast<float>(r), static_cast<float>(t), i % 3 == 0 ? 2.5f : 0.0f,
                                 i % 2 == 0 ? 1.3f : 1.0f, i % 5 == 0 ? 0.75f : 0.0f});
    }
  }
  Tensor e = Tensor::empty({static_cast<int64_t>(edits.size()) / 5, 5}, DType::kF32);
  std::copy(edits.begin(), edits.end(), e.data<float>());
  auto dx = copy_to(x, kGpu);
  auto de = copy_to(e, kGpu);
  ASSERT_TRUE(dx.ok() && de.ok());
  ops::adjust_logits(x, e);
  ops::adjust_logits(*dx, *de);
  EXPECT_TRUE(testing::bitwise_equal(to_host(*dx), x, "adjusted logits"));
}

// mask_logits on the device clears what the CPU op clears, to the bit: random masks over some rows
// (one row named twice), a vocabulary that does not fill its last word.
TEST(GpuOps, MaskLogitsEqualsTheCpuOp) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  constexpr int64_t kVocab = 70001;
  Tensor x = testing::random_tensor({6, kVocab}, rng);
  const int64_t columns = ops::token_mask_columns(kVocab);
  const int rows[] = {4, 0, 2, 4};
  Tensor masks = Tensor::empty({4, columns}, DType::kI32);
  for (int m = 0; m < 4; ++m) {
    int32_t* mask = masks.data<int32_t>() + m * columns;
    mask[0] = rows[m];
    std::bernoulli_distribution keep(m == 1 ? 0.001 : 0.5);
    for (int64_t j = 1; j < columns; ++j) {
      uint32_t w = 0;
      for (int b = 0; b < 32; ++b) w |= static_cast<uint32_t>(keep(rng)) << b;
      mask[j] = static_cast<int32_t>(w);
    }
  }
  auto dx = copy_to(x, kGpu);
  auto dm = copy_to(masks, kGpu);
  ASSERT_TRUE(dx.ok() && dm.ok());
  ops::mask_logits(x, masks);
  ops::mask_logits(*dx, *dm);
  EXPECT_TRUE(testing::bitwise_equal(to_host(*dx), x, "masked logits"));
}

int32_t host_argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// The engine's device sampling (BatchSampler::Place::kDeviceSample: argmax rows of a plain greedy
// draft, penalties and logit bias through ops::adjust_logits, one draw per sampled row from its
// request's stream) draws what the host place's Samplers draw from the same logits.
TEST(GpuBatchSampler, DevicePlacesDrawWhatTheHostPlaceDraws) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  constexpr int64_t kVocab = 1000;
  // Entry 0 (plain greedy) verifies a draft of 2.
  const std::vector<SamplingParams> ps = testing::mixed_sampling_params(1000 + seed % 1000);
  std::vector<Sampler> on_device = testing::samplers_with_history(ps), on_host = testing::samplers_with_history(ps);
  std::vector<SampleRow> device_rows, host_rows;
  for (size_t i = 0; i < ps.size(); ++i) {
    device_rows.push_back({&on_device[i], i == 0 ? 2 : 0});
    host_rows.push_back({&on_host[i], i == 0 ? 2 : 0});
  }
  constexpr int64_t kRows = 3 + 4;
  Tensor x = testing::random_tensor({kRows, kVocab}, rng, -8.0f, 8.0f);

  BatchSampler device(kGpu, kVocab), host(Device::cpu(), kVocab);
  auto device_place = device.begin(device_rows);
  ASSERT_TRUE(device_place.ok()) << device_place.status().to_string();
  EXPECT_EQ(*device_place, BatchSampler::Place::kDeviceSample);
  auto dx = copy_to(x, kGpu);
  ASSERT_TRUE(dx.ok());
  device.logits() = *dx;
  ASSERT_TRUE(device.finish(device_rows).ok());
  ASSERT_EQ(*host.begin(host_rows), BatchSampler::Place::kHost);
  host.logits() = x;
  ASSERT_TRUE(host.finish(host_rows).ok());

  for (int r = 0; r < 3; ++r) {  // the draft's rows: their argmax
    EXPECT_EQ(device.device_ids(0, 3)[static_cast<size_t>(r)], host_argmax(x.data<float>() + r * kVocab, kVocab)) << r;
  }
  int mismatches = 0;
  for (size_t i = 1; i < ps.size(); ++i) {
    const int row = 2 + static_cast<int>(i);
    auto want = host.host_sample(i);
    ASSERT_TRUE(want.ok());
    const int32_t got = device.device_ids(row, 1)[0];
    // expf on the device and std::exp differ in the last bits: a draw within rounding of a
    // boundary may pick the neighbour. Anything else must agree.
    if (got != want->token) {
      ++mismatches;
      std::printf("batch sampler mismatch (one allowed): entry %zu: %d vs %d\n", i, got, want->token);
    } else {
      EXPECT_NEAR(device.device_logprobs(row, 1)[0], want->logprob, 1e-4 * (1.0 + std::fabs(want->logprob))) << i;
    }
    EXPECT_EQ(on_device[i].rng().next_u64(), on_host[i].rng().next_u64()) << "entry " << i << "'s stream";
  }
  EXPECT_LE(mismatches, 1);

  // All plain greedy: the argmax alone.
  std::vector<SampleRow> greedy_rows = {{&on_device[0], 2}};
  ASSERT_EQ(*device.begin(greedy_rows), BatchSampler::Place::kDeviceGreedy);
  auto three = copy_to(x.slice(0, 0, 3), kGpu);
  ASSERT_TRUE(three.ok());
  device.logits() = *three;
  ASSERT_TRUE(device.finish(greedy_rows).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(device.device_ids(0, 3)[static_cast<size_t>(r)], host_argmax(x.data<float>() + r * kVocab, kVocab)) << r;
  }
  // What only the host can do: top logprobs, or a draft of a request that is not plain greedy.
  SamplingParams with_logprobs = ps[1];
  with_logprobs.logprobs = 2;
  Sampler asks(with_logprobs);
  std::vector<SampleRow> needs_host = {{&on_device[0], 0}, {&asks, 0}};
  EXPECT_EQ(*device.begin(needs_host), BatchSampler::Place::kHost);
  needs_host = {{&on_device[1], 1}};
  EXPECT_EQ(*device.begin(needs_host), BatchSampler::Place::kHost);
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
