// The mixture-of-experts ops on the GPU (ops/cuda/moe.cu) against the scalar CPU reference
// (ops/cpu/reference.h) on fresh random inputs, through the ops.h entry points on device tensors:
// - moe_experts for dense f32 / bf16 / f16 and packed int8 / int4 (g128) experts (the reference
//   runs on the same stored weights: 16-bit values and packed codes alike), at 1, 3, 32 and 512
//   tokens, 1, 2 and 8 experts per token, 8 and 128 experts; odd widths (rows one value at a
//   time), strided activations and outputs whose padding must stay NaN; experts no token chose
//   and every token on one expert; an id out of range (its token's row NaN, nothing else
//   touched); batch invariance (a token's row alone equals its row in a batch, bit for bit);
//   a CUDA graph replayed on new inputs; a format without a kernel recorded as kUnsupported;
// - moe_route with tied logits, NaN and -inf (ids exact, weights within f32 rounding);
// - add_sigmoid_gated.
// Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "ops/backend.h"
#include "ops/cpu/reference.h"
#include "ops/errors.h"
#include "ops/ops.h"
#include "quant/quantize.h"

namespace tachyon {
namespace {

using testing::all_close;
using testing::bitwise_equal;

#define SEEDED_RNG(rng)                                                                 \
  const uint32_t seed_ = testing::fresh_seed();                                         \
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed_, seed_)); \
  std::mt19937 rng(seed_)

// Dense experts differ from the reference only in the order of f32 sums; packed ones also in
// where the scale is applied (the kernels scale a row's or a block's sum, the reference each
// dequantized weight).
constexpr double kDenseTolerance = 1e-4;
constexpr double kPackedTolerance = 2e-4;

enum class ExpertFormat { kF32, kBF16, kF16, kInt8, kInt4 };
constexpr ExpertFormat kFormats[] = {ExpertFormat::kF32, ExpertFormat::kBF16, ExpertFormat::kF16,
                                     ExpertFormat::kInt8, ExpertFormat::kInt4};

const char* format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kF32: return "f32";
    case ExpertFormat::kBF16: return "bf16";
    case ExpertFormat::kF16: return "f16";
    case ExpertFormat::kInt8: return "int8";
    default: return "int4 g128";
  }
}
bool packed(ExpertFormat f) { return f == ExpertFormat::kInt8 || f == ExpertFormat::kInt4; }
double tolerance(ExpertFormat f) { return packed(f) ? kPackedTolerance : kDenseTolerance; }

// A copy of a host tensor that shares no memory with it.
Tensor clone(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  const Tensor src = t.contiguous();
  std::memcpy(c.raw_data(), src.raw_data(), src.nbytes());
  return c;
}

Tensor host(const Tensor& t) {
  auto h = copy_to(t, Device::cpu());
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return h.ok() ? *h : Tensor();
}

Tensor device(const Tensor& t) {
  auto d = copy_to(t, Device::cuda(0));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return d.ok() ? *d : Tensor();
}

// A stacked projection [rows, cols] of random weights in `format`.
Weight make_stack(ExpertFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
  const Tensor w = testing::random_tensor({rows, cols}, rng, -0.5f, 0.5f);
  Weight out;
  switch (format) {
    case ExpertFormat::kF32: out.dense = w; break;
    case ExpertFormat::kBF16: out.dense = testing::convert(w, DType::kBF16); break;
    case ExpertFormat::kF16: out.dense = testing::convert(w, DType::kF16); break;
    case ExpertFormat::kInt8:
    case ExpertFormat::kInt4: {
      auto q = format == ExpertFormat::kInt8 ? quantize_int8_channel(w) : quantize_int4_group(w, 128);
      EXPECT_TRUE(q.ok()) << q.status().to_string();
      if (q.ok()) out.quant = std::make_shared<const QuantWeight>(std::move(*q));
      break;
    }
  }
  return out;
}

Weight weight_on_gpu(const Weight& w) {
  Weight out;
  if (!w.quant) {
    out.dense = device(w.dense);
    return out;
  }
  auto q = std::make_shared<QuantWeight>(*w.quant);
  q->packed = device(q->packed);
  if (q->scales.defined()) q->scales = device(q->scales);
  if (q->zeros.defined()) q->zeros = device(q->zeros);
  out.quant = std::move(q);
  return out;
}

// One layer's experts: on the host (the reference's) and the same bits on the GPU.
struct Experts {
  ops::MoeExperts host, gpu;
  int64_t hidden = 0;
};

Experts make_experts(ExpertFormat format, int num_experts, int64_t hidden, int64_t inter, std::mt19937& rng) {
  Experts e;
  e.hidden = hidden;
  e.host.num_experts = num_experts;
  e.host.inter = inter;
  e.host.gate = make_stack(format, num_experts * inter, hidden, rng);
  e.host.up = make_stack(format, num_experts * inter, hidden, rng);
  e.host.down = make_stack(format, num_experts * hidden, inter, rng);
  e.gpu.num_experts = num_experts;
  e.gpu.inter = inter;
  e.gpu.gate = weight_on_gpu(e.host.gate);
  e.gpu.up = weight_on_gpu(e.host.up);
  e.gpu.down = weight_on_gpu(e.host.down);
  return e;
}

// Every expert but those in `keep` made NaN (dense rows, or packed rows' scales), on the host and
// again on the GPU: a kernel that read an expert no token chose would spread the NaN.
void poison_experts(Experts& e, const std::vector<int32_t>& keep) {
  const auto poison = [&](Weight& w, int64_t rows) {
    for (int x = 0; x < e.host.num_experts; ++x) {
      if (std::find(keep.begin(), keep.end(), x) != keep.end()) continue;
      if (!w.quant) {
        Tensor block = w.dense.slice(0, x * rows, (x + 1) * rows);
        Tensor nan = testing::nan_tensor(block.shape(), block.dtype());
        std::memcpy(block.raw_data(), nan.raw_data(), nan.nbytes());
      } else {
        auto q = std::make_shared<QuantWeight>(*w.quant);
        q->scales = clone(q->scales);
        Tensor block = q->scales.slice(0, x * rows, (x + 1) * rows);
        for (int64_t i = 0; i < block.numel(); ++i) block.data<float>()[i] = std::nanf("");
        w.quant = std::move(q);
      }
    }
  };
  poison(e.host.gate, e.host.inter);
  poison(e.host.up, e.host.inter);
  poison(e.host.down, e.hidden);
  e.gpu.gate = weight_on_gpu(e.host.gate);
  e.gpu.up = weight_on_gpu(e.host.up);
  e.gpu.down = weight_on_gpu(e.host.down);
}

struct Routing {
  Tensor ids;      // [n, k] i32
  Tensor weights;  // [n, k] f32
};

// k distinct experts per token drawn from `allowed` (all experts when empty), positive weights.
Routing random_routing(int64_t n, int64_t k, int num_experts, std::mt19937& rng, std::vector<int32_t> allowed = {}) {
  if (allowed.empty()) {
    allowed.resize(static_cast<size_t>(num_experts));
    std::iota(allowed.begin(), allowed.end(), 0);
  }
  Routing r{Tensor::empty({n, k}, DType::kI32), Tensor::empty({n, k}, DType::kF32)};
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::shuffle(allowed.begin(), allowed.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      r.ids.data<int32_t>()[t * k + j] = allowed[static_cast<size_t>(j)];
      r.weights.data<float>()[t * k + j] = weight(rng);
    }
  }
  return r;
}

Tensor reference_experts(const Experts& e, const Tensor& x, const Routing& r) {
  Tensor y = Tensor::empty({x.size(0), e.hidden}, DType::kF32);
  ops::reference::moe_experts(x, e.host, r.ids, r.weights, y);
  return y;
}

// ops::moe_experts on the GPU, x and y rows `pad` values wider than hidden (y's padding NaN and
// checked to stay so); y on the host.
Tensor gpu_experts(const Experts& e, const Tensor& x, const Routing& r, ops::LinearMode mode, int64_t pad = 0) {
  const int64_t n = x.size(0), hidden = e.hidden;
  Tensor xp = testing::nan_tensor({n, hidden + pad});
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(x.data<float>() + t * x.stride(0), hidden, xp.data<float>() + t * (hidden + pad));
  }
  const Tensor dx = device(xp).slice(1, 0, hidden);
  Tensor dy_full = device(testing::nan_tensor({n, hidden + pad}));
  Tensor dy = dy_full.slice(1, 0, hidden);
  ops::moe_experts(dx, e.gpu, device(r.ids), device(r.weights), dy, mode);
  const Status s = ops::take_error(Device::cuda(0));
  EXPECT_TRUE(s.ok()) << s.to_string();
  const Tensor y_full = host(dy_full);
  if (pad > 0) {
    EXPECT_TRUE(testing::all_nan(y_full.slice(1, hidden, hidden + pad).contiguous(), "y's padding"));
  }
  return y_full.slice(1, 0, hidden).contiguous();
}

// Every format, 1 / 3 / 32 / 512 tokens, 1 / 2 / 8 experts per token, 8 and 128 experts. The
// 512-token batches run on narrower experts (the reference runs each (token, choice) alone).
TEST(CudaMoe, ExpertsMatchTheReference) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (ExpertFormat format : kFormats) {
    for (int num_experts : {8, 128}) {
      for (bool wide : {true, false}) {
        const int64_t hidden = wide ? 256 : 128, inter = wide ? 256 : 128;
        const Experts e = make_experts(format, num_experts, hidden, inter, rng);
        for (int64_t n : wide ? std::vector<int64_t>{1, 3, 32} : std::vector<int64_t>{512}) {
          for (int64_t k : {1, 2, 8}) {
            const std::string what = fmt::format("{} experts of {} x {}, {}: n={} k={}", num_experts, hidden, inter,
                                                 format_name(format), n, k);
            SCOPED_TRACE(what);
            const Tensor x = testing::random_tensor({n, hidden}, rng);
            const Routing r = random_routing(n, k, num_experts, rng);
            const Tensor y = gpu_experts(e, x, r, ops::LinearMode::kFastest, n == 3 ? 5 : 0);
            ASSERT_TRUE(all_close(y, reference_experts(e, x, r), tolerance(format), what));
          }
        }
      }
    }
  }
}

// Widths that are no multiple of a 16-byte load (rows read one value at a time: dense and int8),
// and ones that leave lanes of a warp without a whole load (int4: 3 blocks of 128 columns).
TEST(CudaMoe, OddWidths) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (ExpertFormat format : kFormats) {
    const bool int4 = format == ExpertFormat::kInt4;
    for (auto [hidden, inter] : int4 ? std::vector<std::pair<int64_t, int64_t>>{{384, 128}, {128, 384}}
                                     : std::vector<std::pair<int64_t, int64_t>>{{98, 50}, {136, 144}, {260, 36}}) {
      const Experts e = make_experts(format, 6, hidden, inter, rng);
      for (int64_t n : {1, 5, 19}) {
        const std::string what = fmt::format("{} [{} x {}] n={}", format_name(format), hidden, inter, n);
        SCOPED_TRACE(what);
        const Tensor x = testing::random_tensor({n, hidden}, rng);
        const Routing r = random_routing(n, 3, 6, rng);
        ASSERT_TRUE(all_close(gpu_experts(e, x, r, ops::LinearMode::kFastest, 3), reference_experts(e, x, r),
                              tolerance(format), what));
      }
    }
  }
}

// Qwen3-30B-A3B's expert shape (hidden 2048, inter 768; fewer experts): long rows, several loads
// per lane in flight.
TEST(CudaMoe, QwenExpertShape) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (ExpertFormat format : {ExpertFormat::kBF16, ExpertFormat::kInt4}) {
    const Experts e = make_experts(format, 12, 2048, 768, rng);
    for (int64_t n : {1, 4}) {
      const std::string what = fmt::format("{} n={}", format_name(format), n);
      SCOPED_TRACE(what);
      const Tensor x = testing::random_tensor({n, 2048}, rng);
      const Routing r = random_routing(n, 8, 12, rng);
      ASSERT_TRUE(all_close(gpu_experts(e, x, r, ops::LinearMode::kFastest), reference_experts(e, x, r),
                            tolerance(format), what));
    }
  }
}

// Most experts get no token (and are NaN: never read); then every token's first choice is the
// same expert (one expert with all the batch's rows, the others' second choices spread).
TEST(CudaMoe, IdleExpertsAndOneExpertForAll) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (ExpertFormat format : kFormats) {
    const int64_t n = 41;
    const Tensor x = testing::random_tensor({n, 128}, rng);
    {
      SCOPED_TRACE(fmt::format("{}: 3 of 16 experts used, the others NaN", format_name(format)));
      Experts idle = make_experts(format, 16, 128, 128, rng);
      poison_experts(idle, {3, 7, 15});
      const Routing r = random_routing(n, 2, 16, rng, {3, 7, 15});
      ASSERT_TRUE(all_close(gpu_experts(idle, x, r, ops::LinearMode::kFastest), reference_experts(idle, x, r),
                            tolerance(format), "idle experts"));
    }
    const Experts e = make_experts(format, 16, 128, 128, rng);
    for (int64_t k : {1, 2}) {
      SCOPED_TRACE(fmt::format("{}: expert 9 first for every token, k={}", format_name(format), k));
      Routing r = random_routing(n, k, 16, rng, {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15});
      for (int64_t t = 0; t < n; ++t) r.ids.data<int32_t>()[t * k] = 9;
      ASSERT_TRUE(all_close(gpu_experts(e, x, r, ops::LinearMode::kFastest), reference_experts(e, x, r),
                            tolerance(format), "one expert for all"));
    }
  }
}

// kBatchInvariant: a token's row of a batched call equals the same token run alone, bit for bit
// (the experts it chose see 1 token alone and many in the batch).
TEST(CudaMoe, BatchInvariant) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (ExpertFormat format : kFormats) {
    const Experts e = make_experts(format, 8, 256, 128, rng);
    const int64_t n = 45, k = 4;
    const Tensor x = testing::random_tensor({n, 256}, rng);
    const Routing r = random_routing(n, k, 8, rng);
    const Tensor batched = gpu_experts(e, x, r, ops::LinearMode::kBatchInvariant);
    ASSERT_TRUE(all_close(batched, reference_experts(e, x, r), tolerance(format), format_name(format)));
    for (int64_t t : {int64_t{0}, int64_t{22}, n - 1}) {
      const std::string what = fmt::format("{}: token {} alone vs in a batch of {}", format_name(format), t, n);
      const Routing one{r.ids.slice(0, t, t + 1).contiguous(), r.weights.slice(0, t, t + 1).contiguous()};
      const Tensor alone = gpu_experts(e, x.slice(0, t, t + 1).contiguous(), one, ops::LinearMode::kBatchInvariant,
                                       t == 22 ? 1 : 0);
      ASSERT_TRUE(bitwise_equal(alone, batched.slice(0, t, t + 1).contiguous(), what));
    }
  }
}

// An id outside [0, E) on the device (the host checks only host ids): nothing is read through it;
// its token's row is NaN and the other rows are right.
TEST(CudaMoe, IdOutOfRangeGivesANanRow) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  const Experts e = make_experts(ExpertFormat::kBF16, 8, 128, 128, rng);
  const int64_t n = 6, k = 2;
  const Tensor x = testing::random_tensor({n, 128}, rng);
  Routing r = random_routing(n, k, 8, rng);
  const Routing good{clone(r.ids), r.weights};
  r.ids.data<int32_t>()[1 * k + 1] = 8;
  r.ids.data<int32_t>()[4 * k + 0] = -1;
  const Tensor y = gpu_experts(e, x, r, ops::LinearMode::kFastest);
  const Tensor ref = reference_experts(e, x, good);
  for (int64_t t = 0; t < n; ++t) {
    const Tensor row = y.slice(0, t, t + 1).contiguous();
    if (t == 1 || t == 4) {
      EXPECT_TRUE(testing::all_nan(row, fmt::format("row {}", t)));
    } else {
      EXPECT_TRUE(all_close(row, ref.slice(0, t, t + 1).contiguous(), kDenseTolerance, fmt::format("row {}", t)));
    }
  }
}

// A format moe.cu has no kernel for is recorded as kUnsupported, naming the format.
TEST(CudaMoe, UnsupportedFormatIsRecorded) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  Experts e = make_experts(ExpertFormat::kF32, 4, 64, 32, rng);
  for (Weight* w : {&e.host.gate, &e.host.up, &e.host.down}) {
    auto q = quantize_fp8_channel(w->dense);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    w->dense = Tensor();
    w->quant = std::make_shared<const QuantWeight>(std::move(*q));
  }
  e.gpu.gate = weight_on_gpu(e.host.gate);
  e.gpu.up = weight_on_gpu(e.host.up);
  e.gpu.down = weight_on_gpu(e.host.down);
  const Routing r = random_routing(3, 2, 4, rng);
  Tensor dy = device(testing::nan_tensor({3, 64}));
  ops::moe_experts(device(testing::random_tensor({3, 64}, rng)), e.gpu, device(r.ids), device(r.weights), dy);
  const Status s = ops::take_error(Device::cuda(0));
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find(quant_format_name(QuantFormat::kFp8Channel)), std::string::npos) << s.to_string();
  ASSERT_OK(ops::synchronize(Device::cuda(0)));
}

// Logits with many exact ties (multiples of 0.5), NaN and -inf; rows strided; every k up to
// min(E, 32), with and without renormalisation.
TEST(CudaMoe, RouteMatchesTheReference) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  std::uniform_int_distribution<int> level(-4, 4);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int num_experts : {1, 8, 60, 128, 512}) {
    for (int64_t n : {1, 7, 70}) {
      for (int kind = 0; kind < 3; ++kind) {  // 0 random, 1 tied, 2 tied with NaN and -inf
        Tensor logits = testing::random_tensor({n, num_experts + 3}, rng, -3.0f, 3.0f);
        for (int64_t i = 0; i < logits.numel(); ++i) {
          float& v = logits.data<float>()[i];
          if (kind >= 1) v = 0.5f * static_cast<float>(level(rng));
          if (kind == 2 && u(rng) < 0.1f) v = std::numeric_limits<float>::quiet_NaN();
          if (kind == 2 && u(rng) < 0.05f) v = -std::numeric_limits<float>::infinity();
        }
        if (kind == 2 && n > 1) {  // a row of NaN but for two values
          for (int i = 0; i < num_experts; ++i) logits.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
          logits.data<float>()[num_experts / 2] = 1.0f;
          logits.data<float>()[num_experts - 1] = 1.0f;
        }
        const Tensor view = logits.slice(1, 0, num_experts);
        const Tensor dlogits = device(logits).slice(1, 0, num_experts);
        for (int64_t k : {1, 2, 3, 8, 32}) {
          if (k > num_experts) continue;
          for (bool normalize : {true, false}) {
            const std::string what =
                fmt::format("E={} n={} logits kind {} k={} normalize={}", num_experts, n, kind, k, normalize);
            SCOPED_TRACE(what);
            Tensor ids = Tensor::empty({n, k}, DType::kI32), weights = Tensor::empty({n, k}, DType::kF32);
            ops::reference::moe_route(view, normalize, ids, weights);
            Tensor dids = device(Tensor::zeros({n, k}, DType::kI32));
            Tensor dweights = device(testing::nan_tensor({n, k}));
            ops::moe_route(dlogits, normalize, dids, dweights);
            ASSERT_OK(ops::take_error(Device::cuda(0)));
            ASSERT_TRUE(bitwise_equal(host(dids), ids, what + ": ids"));
            ASSERT_TRUE(all_close(host(dweights), weights, 1e-5, what + ": weights"));
          }
        }
      }
    }
  }
}

TEST(CudaMoe, AddSigmoidGated) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  for (int64_t n : {1, 5, 33}) {
    for (int64_t d : {1, 7, 256, 1030}) {
      const std::string what = fmt::format("n={} d={}", n, d);
      SCOPED_TRACE(what);
      // y and x rows padded, gate a column of a [n, 2] tensor.
      Tensor y = testing::random_tensor({n, d + 2}, rng);
      const Tensor x = testing::random_tensor({n, d + 1}, rng);
      const Tensor gate = testing::random_tensor({n, 2}, rng, -6.0f, 6.0f);
      Tensor dy = device(y);
      Tensor dyv = dy.slice(1, 0, d);
      ops::add_sigmoid_gated(dyv, device(x).slice(1, 0, d), device(gate).slice(1, 0, 1));
      ASSERT_OK(ops::take_error(Device::cuda(0)));
      Tensor expected = clone(y);
      Tensor ev = expected.slice(1, 0, d);
      ops::reference::add_sigmoid_gated(ev, x.slice(1, 0, d), gate.slice(1, 0, 1));
      const Tensor got = host(dy);
      ASSERT_TRUE(all_close(got, expected, 1e-6, what));
      ASSERT_TRUE(bitwise_equal(got.slice(1, d, d + 2).contiguous(), y.slice(1, d, d + 2).contiguous(),
                                what + ": padding"));
    }
  }
}

// Router and experts captured into a CUDA graph once (after a warm-up that sized the workspace)
// and replayed on new logits and activations written in place: no host synchronisation or
// allocation inside, the same results as the reference.
TEST(CudaMoe, GraphReplay) {
  TACHYON_START_GPU();
  SEEDED_RNG(rng);
  const Device gpu = Device::cuda(0);
  ops::Backend* backend = ops::backend_for(gpu);
  ASSERT_NE(backend, nullptr);
  const int num_experts = 32;
  const int64_t n = 4, k = 4, hidden = 256;
  const Experts e = make_experts(ExpertFormat::kBF16, num_experts, hidden, 128, rng);
  Tensor dlogits = device(testing::random_tensor({n, num_experts}, rng));
  Tensor dx = device(testing::random_tensor({n, hidden}, rng));
  Tensor dids = device(Tensor::zeros({n, k}, DType::kI32));
  Tensor dweights = device(Tensor::zeros({n, k}, DType::kF32));
  Tensor dy = device(Tensor::zeros({n, hidden}, DType::kF32));
  ops::moe_route(dlogits, true, dids, dweights);
  ops::moe_experts(dx, e.gpu, dids, dweights, dy);
  ASSERT_OK(ops::synchronize(gpu));
  ASSERT_OK(ops::take_error(gpu));
  const uint64_t epoch = backend->scratch_epoch();
  ASSERT_OK(backend->begin_capture());
  ops::moe_route(dlogits, true, dids, dweights);
  ops::moe_experts(dx, e.gpu, dids, dweights, dy);
  auto graph = backend->end_capture();
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  ASSERT_OK(ops::take_error(gpu));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(fmt::format("replay {}", round));
    const Tensor logits = testing::random_tensor({n, num_experts}, rng);
    const Tensor x = testing::random_tensor({n, hidden}, rng);
    ASSERT_OK(copy_into(dlogits, logits));
    ASSERT_OK(copy_into(dx, x));
    ASSERT_OK(backend->replay(*graph));
    ASSERT_OK(ops::synchronize(gpu));
    Routing r{Tensor::empty({n, k}, DType::kI32), Tensor::empty({n, k}, DType::kF32)};
    ops::reference::moe_route(logits, true, r.ids, r.weights);
    ASSERT_TRUE(bitwise_equal(host(dids), r.ids, "ids"));
    ASSERT_TRUE(all_close(host(dy), reference_experts(e, x, r), kDenseTolerance, "y"));
  }
  EXPECT_EQ(backend->scratch_epoch(), epoch);
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
