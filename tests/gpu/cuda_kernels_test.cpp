// CUDA kernels == the scalar CPU reference (ops/cpu/reference.h) on fresh random inputs of odd
// sizes: linear (GEMV for 1..16 tokens, cuBLASLt beyond), rms_norm / add_rms_norm, rope, silu_mul,
// embedding, store_kv, and the device helpers. Outputs and the padding around them start as NaN;
// padding must stay NaN. Every CUDA call's Status is checked. Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "gpu_test_util.h"
#include "ops/cpu/reference.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

using testing::all_close;
using testing::Mirror;
using testing::rows_of;
namespace cu = ::tachyon::ops::cuda;

TEST(CudaDevice, PropertiesAndSizedOutOfMemory) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto props = cu::device_properties(0);
  ASSERT_TRUE(props.ok()) << props.status().to_string();
  EXPECT_FALSE(props->name.empty());
  EXPECT_GT(props->multiprocessors, 0);
  EXPECT_GT(props->total_memory, 0u);
  std::printf("device 0: %s\n", props->to_string().c_str());
  const size_t huge = size_t{1} << 52;  // 4 PiB
  auto ptr = cu::device_malloc(huge, "a test buffer");
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().code(), ErrorCode::kOutOfMemory) << ptr.status().to_string();
  EXPECT_NE(ptr.status().message().find(std::to_string(huge)), std::string::npos) << ptr.status().to_string();
  EXPECT_NE(ptr.status().message().find("a test buffer"), std::string::npos) << ptr.status().to_string();
  // The device still works after the failed allocation.
  auto ok = cu::DeviceBuffer::allocate(1 << 20, "after");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  ASSERT_OK(cu::memset_device(ok->data(), 0, 1 << 20, nullptr));
  ASSERT_OK(cu::synchronize(nullptr));
}

TEST(CudaDevice, FillRandomIsReproducibleAndInRange) {
  TACHYON_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 100003;
    auto a = cu::DeviceBuffer::allocate(n * dtype_size(dtype), "a");
    auto b = cu::DeviceBuffer::allocate(n * dtype_size(dtype), "b");
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_OK(cu::fill_random(a->data(), dtype, n, 42, -2.0f, 3.0f, nullptr));
    ASSERT_OK(cu::fill_random(b->data(), dtype, n, 42, -2.0f, 3.0f, nullptr));
    Tensor ha = Tensor::empty({n}, dtype), hb = Tensor::empty({n}, dtype);
    ASSERT_OK(cu::copy_to_host(ha.raw_data(), a->data(), ha.nbytes()));
    ASSERT_OK(cu::copy_to_host(hb.raw_data(), b->data(), hb.nbytes()));
    ASSERT_TRUE(testing::bitwise_equal(ha, hb, dtype_name(dtype)));
    const Tensor f = ha.to_f32();
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = f.data<float>()[i];
      ASSERT_TRUE(v >= -2.0f && v <= 3.0f) << v;
      sum += v;
    }
    EXPECT_NEAR(sum / n, 0.5, 0.05);
  }
}

// ---- linear ----------------------------------------------------------------------------------------

struct LinearCase {
  int64_t n, in, out;
  DType w_dtype;
  bool bias;
  DType bias_dtype = DType::kF32;
  int64_t x_pad = 0, y_pad = 0;  // extra elements per row (strided views)
};

// Runs one linear on the device and returns y (a view of a NaN-poisoned wider buffer whose
// padding is checked to stay NaN).
struct LinearRun {
  Tensor x, w, bias;  // host: x [n, in] f32 view, w [out, in] w_dtype, bias [out] (optional)
  Tensor y;           // host copy of the result [n, out]
};

::testing::AssertionResult run_linear(cu::LinearContext& ctx, const LinearCase& c, std::mt19937& rng,
                                      cu::LinearAlgo algo, LinearRun* run) {
  Mirror dx(testing::random_tensor({c.n, c.in + c.x_pad}, rng));
  Tensor x = dx.host().slice(1, 0, c.in);
  Tensor w = testing::convert(testing::random_tensor({c.out, c.in}, rng), c.w_dtype);
  Tensor bias;
  if (c.bias) bias = testing::convert(testing::random_tensor({c.out}, rng), c.bias_dtype);
  Mirror dw(w), dy(testing::nan_tensor({c.n, c.out + c.y_pad}));
  Mirror db = c.bias ? Mirror(bias) : Mirror();
  cu::LinearArgs a;
  a.x = dx.ptr<float>(x);
  a.x_stride = x.stride(0);
  a.w = dw.ptr<void>();
  a.w_dtype = c.w_dtype;
  a.w_stride = c.in;
  a.bias = c.bias ? db.ptr<void>() : nullptr;
  a.bias_dtype = c.bias_dtype;
  a.y = dy.ptr<float>();
  a.y_stride = c.out + c.y_pad;
  a.n = c.n;
  a.in = c.in;
  a.out = c.out;
  Status s = cu::linear(ctx, a, nullptr, algo);
  if (s.ok()) s = cu::synchronize(nullptr);
  if (s.ok()) s = dy.download();
  if (!s.ok()) return ::testing::AssertionFailure() << s.to_string();
  if (c.y_pad > 0) {
    auto pad = testing::all_nan(dy.host().slice(1, c.out, c.out + c.y_pad), "y padding");
    if (!pad) return pad;
  }
  run->x = x;
  run->w = w;
  run->bias = bias;
  run->y = dy.host().slice(1, 0, c.out).contiguous();
  return ::testing::AssertionSuccess();
}

Tensor reference_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  Weight weight;
  weight.dense = w;
  Tensor y = testing::nan_tensor({x.size(0), w.size(0)});
  ops::reference::linear(x.contiguous(), weight, bias.defined() ? &bias : nullptr, y);
  return y;
}

std::string describe(const LinearCase& c) {
  return fmt::format("n={} in={} out={} w={} bias={} ({}) x_pad={} y_pad={}", c.n, c.in, c.out, dtype_name(c.w_dtype),
                     c.bias, dtype_name(c.bias_dtype), c.x_pad, c.y_pad);
}

// The GEMV computes in f32 on the stored weights: as tight as the CPU kernels.
TEST(CudaLinear, GemvMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  // (in, out): tiny, odd (scalar loads), 16-byte aligned with split-K, long and short.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},     {8, 7},     {67, 131},  {256, 515},
                                                           {1032, 515}, {2048, 77}, {5003, 37}, {4096, 96}};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (auto [in, out] : shapes) {
      for (int64_t n = 1; n <= 16; ++n) {
        LinearCase c{n, in, out, dtype, (n + in) % 2 == 0};
        c.bias_dtype = n % 3 == 0 ? DType::kBF16 : DType::kF32;
        c.x_pad = n % 4 == 1 ? 4 : (n % 4 == 2 ? 1 : 0);
        c.y_pad = n % 2 == 0 ? 3 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, c, rng, cu::LinearAlgo::kGemv, &r)) << describe(c);
        ASSERT_TRUE(all_close(r.y, reference_linear(r.x, r.w, r.bias), 2e-5, describe(c)));
      }
    }
  }
}

// cuBLASLt rounds the activations to the weight's 16-bit type: tight against the reference on
// the rounded activations, and within bf16/f16 error (relative L2 <= 1e-2) against the exact one.
// f32 weights run in plain f32.
TEST(CudaLinear, CublasLtMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{67, 131}, {256, 515}, {1032, 515}, {33, 1000}};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (auto [in, out] : shapes) {
      for (int64_t n : {1, 5, 17, 37, 64, 133}) {
        LinearCase c{n, in, out, dtype, n % 2 == 1};
        c.bias_dtype = n == 37 ? DType::kBF16 : DType::kF32;  // separate kernel vs the epilogue
        c.x_pad = n % 3 == 0 ? 5 : 0;
        c.y_pad = n % 4 == 1 ? 3 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, c, rng, cu::LinearAlgo::kCublasLt, &r)) << describe(c);
        const Tensor exact = reference_linear(r.x, r.w, r.bias);
        if (dtype == DType::kF32) {
          ASSERT_TRUE(all_close(r.y, exact, 2e-5, describe(c)));
        } else {
          const Tensor x_rounded = testing::convert(r.x, dtype).to_f32();
          ASSERT_TRUE(all_close(r.y, reference_linear(x_rounded, r.w, r.bias), 1e-4, describe(c) + " vs rounded x"));
          ASSERT_TRUE(testing::relative_l2_below(r.y, exact, 1e-2, describe(c) + " vs exact x"));
        }
      }
    }
  }
}

// The tensor-core GEMM rounds the activations to the weight's type like cuBLASLt: tight against the
// reference on the rounded activations. Odd row counts (partial 16-row tiles), token counts inside
// and across 8-token tiles, with and without split-K; shapes it does not take are Status errors.
TEST(CudaLinear, TensorCoreGemmMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto cc = cu::current_compute_capability();
  ASSERT_TRUE(cc.ok());
  if (*cc < 80) GTEST_SKIP() << "the tensor-core GEMM needs sm_80+";
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{32, 7}, {256, 515}, {1024, 129}, {4096, 96}, {2080, 1000}};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (auto [in, out] : shapes) {
      for (int64_t n : {1, 5, 8, 9, 16, 17, 31, 33, 50, 64}) {
        LinearCase c{n, in, out, dtype, n % 2 == 1};
        c.bias_dtype = n == 33 ? DType::kBF16 : DType::kF32;
        c.x_pad = n % 3 == 0 ? 5 : 0;
        c.y_pad = n % 4 == 1 ? 3 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, c, rng, cu::LinearAlgo::kMma, &r)) << describe(c);
        const Tensor x_rounded = testing::convert(r.x, dtype).to_f32();
        ASSERT_TRUE(all_close(r.y, reference_linear(x_rounded, r.w, r.bias), 1e-4, describe(c) + " vs rounded x"));
      }
    }
  }
  LinearRun r;
  EXPECT_FALSE(run_linear(**ctx, LinearCase{65, 64, 64, DType::kBF16, false}, rng, cu::LinearAlgo::kMma, &r));
  EXPECT_FALSE(run_linear(**ctx, LinearCase{8, 48, 64, DType::kBF16, false}, rng, cu::LinearAlgo::kMma, &r));
  EXPECT_FALSE(run_linear(**ctx, LinearCase{8, 64, 64, DType::kF32, false}, rng, cu::LinearAlgo::kMma, &r));
}

// kAuto: GEMV up to kLinearAutoGemvMaxTokens (exact f32), cuBLASLt beyond; both agree with the
// reference.
TEST(CudaLinear, AutoPicksByTokenCount) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (int64_t n : {1, 2, 4, 5, 16, 17, 64, 65, 300}) {
    LinearCase c{n, 896, 1152, DType::kBF16, true};
    LinearRun r;
    ASSERT_TRUE(run_linear(**ctx, c, rng, cu::LinearAlgo::kAuto, &r)) << describe(c);
    ASSERT_TRUE(testing::relative_l2_below(r.y, reference_linear(r.x, r.w, r.bias), 1e-2, describe(c)));
    if (n <= cu::kLinearAutoGemvMaxTokens) {
      ASSERT_TRUE(all_close(r.y, reference_linear(r.x, r.w, r.bias), 2e-5, describe(c)));
    }
  }
  // The GEMV refuses more than 16 tokens with a Status, not a crash.
  LinearCase c{17, 64, 64, DType::kBF16, false};
  LinearRun r;
  EXPECT_FALSE(run_linear(**ctx, c, rng, cu::LinearAlgo::kGemv, &r));
}

TEST(CudaGemm, Bf16MatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const int64_t n = 45, in = 136, out = 203;
  const Tensor x = testing::convert(testing::random_tensor({n, in}, rng), DType::kBF16);
  const Tensor w = testing::convert(testing::random_tensor({out, in}, rng), DType::kBF16);
  const Tensor bias = testing::random_tensor({out}, rng);
  Mirror dx(x), dw(w), db(bias), dy(testing::nan_tensor({n, out}));
  ASSERT_OK(cu::gemm_bf16(**ctx, dx.ptr<uint16_t>(), in, dw.ptr<uint16_t>(), in, db.ptr<float>(), dy.ptr<float>(), out,
                          n, in, out, nullptr));
  ASSERT_OK(cu::synchronize(nullptr));
  ASSERT_OK(dy.download());
  ASSERT_TRUE(all_close(dy.host(), reference_linear(x.to_f32(), w, bias), 1e-4, "gemm_bf16"));
}

// ---- norms -------------------------------------------------------------------------------------------

TEST(CudaNorm, RmsNormMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType w_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t d : {1, 7, 64, 67, 896, 4096, 4099}) {
      for (int64_t n : {1, 5, 33}) {
        const std::string what = fmt::format("w={} n={} d={}", dtype_name(w_dtype), n, d);
        const Tensor x = testing::random_tensor({n, d}, rng, -3.0f, 3.0f);
        const Tensor w = testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), w_dtype);
        Mirror dx(x), dw(w), dy(testing::nan_tensor({n, d}));
        ASSERT_OK(cu::rms_norm(dx.ptr<float>(), rows_of(x), dw.ptr<void>(), w_dtype, 1e-6f, dy.ptr<float>(),
                               rows_of(dy.host()), nullptr));
        ASSERT_OK(cu::synchronize(nullptr));
        ASSERT_OK(dy.download());
        Tensor expected = testing::nan_tensor({n, d});
        ops::reference::rms_norm(x, w, 1e-6f, expected);
        ASSERT_TRUE(all_close(dy.host(), expected, 1e-5, what));
      }
    }
  }
}

// Per-head norm on the q part of a fused QKV output, in place; k/v untouched.
TEST(CudaNorm, PerHeadOnStridedViewInPlace) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (int64_t head_dim : {40, 128, 18}) {
    const int64_t n = 7, heads = 3, kv_heads = 1;
    Tensor qkv = testing::random_tensor({n, heads + 2 * kv_heads, head_dim}, rng);
    const Tensor before = qkv.contiguous();
    const Tensor w = testing::random_tensor({head_dim}, rng);
    Tensor expected = testing::nan_tensor({n, heads, head_dim});
    ops::reference::rms_norm(before.slice(1, 0, heads).contiguous(), w, 1e-5f, expected);
    Mirror dqkv(qkv), dw(w);
    Tensor q = dqkv.host().slice(1, 0, heads);
    ASSERT_OK(cu::rms_norm(dqkv.ptr<float>(q), rows_of(q), dw.ptr<void>(), DType::kF32, 1e-5f, dqkv.ptr<float>(q),
                           rows_of(q), nullptr));
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(dqkv.download());
    ASSERT_TRUE(all_close(dqkv.host().slice(1, 0, heads), expected, 1e-5, fmt::format("head_dim {}", head_dim)));
    ASSERT_TRUE(testing::bitwise_equal(dqkv.host().slice(1, heads, heads + 2 * kv_heads),
                                       before.slice(1, heads, heads + 2 * kv_heads), "k/v untouched"));
  }
}

TEST(CudaNorm, AddRmsNormMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType w_dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t d : {3, 64, 1000, 4096, 5003}) {
      for (int64_t n : {1, 9}) {
        const std::string what = fmt::format("w={} n={} d={}", dtype_name(w_dtype), n, d);
        const Tensor residual = testing::random_tensor({n, d}, rng, -3.0f, 3.0f);
        // x as a strided view: 16-byte aligned rows when d % 4 == 0 (vector path), else not.
        Mirror dx(testing::random_tensor({n, d + 4}, rng));
        const int64_t offset = d % 4 == 0 ? 4 : 2;
        const Tensor x = dx.host().slice(1, offset, d + offset);
        const Tensor w = testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), w_dtype);
        Mirror dres(residual), dw(w), dy(testing::nan_tensor({n, d}));
        ASSERT_OK(cu::add_rms_norm(dres.ptr<float>(), rows_of(residual), dx.ptr<float>(x), rows_of(x), dw.ptr<void>(),
                                   w_dtype, 1e-5f, dy.ptr<float>(), rows_of(dy.host()), nullptr));
        ASSERT_OK(cu::synchronize(nullptr));
        ASSERT_OK(dres.download());
        ASSERT_OK(dy.download());
        Tensor res_ref = residual.contiguous();
        Tensor expected = testing::nan_tensor({n, d});
        ops::reference::add_rms_norm(res_ref, x.contiguous(), w, 1e-5f, expected);
        ASSERT_TRUE(testing::bitwise_equal(dres.host(), res_ref, what + " residual"));
        ASSERT_TRUE(all_close(dy.host(), expected, 1e-5, what));
      }
    }
  }
}

// ---- rope --------------------------------------------------------------------------------------------

TEST(CudaRope, MatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    for (auto [head_dim, rotary_dim] :
         std::vector<std::pair<int, int>>{{64, 64}, {128, 128}, {48, 48}, {6, 6}, {128, 64}, {80, 20}, {34, 34}}) {
      for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kYarn}) {
        RopeConfig config;
        config.theta = 1000000.0f;
        config.rotary_dim = rotary_dim;
        config.style = style;
        config.scaling = scaling;
        config.factor = 4.0f;
        config.original_max_position = 4096;
        const RopeTable table = make_rope_table(config);
        Mirror dfreq(Tensor::view_of(const_cast<float*>(table.inv_freq.data()),
                                     {static_cast<int64_t>(table.inv_freq.size())}, DType::kF32));
        for (int64_t n : {1, 3, 17}) {
          const std::string what = fmt::format("{} head_dim={} rotary={} n={} scale={}",
                                               style == RopeStyle::kNeox ? "neox" : "interleaved", head_dim,
                                               rotary_dim, n, table.attention_scale);
          const int64_t heads = 3, kv_heads = 2;
          // x: the k part of a fused QKV output [n, heads + 2 kv_heads, head_dim].
          const Tensor qkv = testing::random_tensor({n, heads + 2 * kv_heads, head_dim}, rng);
          const Tensor positions = testing::random_i32({n}, rng, 0, 200000);
          Mirror dqkv(qkv), dpos(positions);
          Tensor k = dqkv.host().slice(1, heads, heads + kv_heads);
          ASSERT_OK(cu::rope(dqkv.ptr<float>(k), n, kv_heads, head_dim, k.stride(0), k.stride(1), dpos.ptr<int32_t>(),
                             dfreq.ptr<float>(), table.rotary_dim, table.style, table.attention_scale, nullptr));
          ASSERT_OK(cu::synchronize(nullptr));
          ASSERT_OK(dqkv.download());
          Tensor expected = qkv.slice(1, heads, heads + kv_heads).contiguous();
          ops::reference::rope(expected, positions, table);
          ASSERT_TRUE(all_close(dqkv.host().slice(1, heads, heads + kv_heads), expected, 1e-6, what));
          ASSERT_TRUE(testing::bitwise_equal(dqkv.host().slice(1, 0, heads), qkv.slice(1, 0, heads), "q untouched"));
        }
      }
    }
  }
}

// ---- silu_mul, embedding -------------------------------------------------------------------------------

TEST(CudaSiluMul, MatchesReferenceOnFusedGateUp) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (int64_t ff : {1, 7, 1001, 4864}) {
    for (int64_t n : {1, 13}) {
      Mirror dgu(testing::random_tensor({n, 2 * ff}, rng, -8.0f, 8.0f)), dout(testing::nan_tensor({n, ff + 2}));
      const Tensor gate = dgu.host().slice(1, 0, ff), up = dgu.host().slice(1, ff, 2 * ff);
      Tensor out = dout.host().slice(1, 1, ff + 1);
      ASSERT_OK(cu::silu_mul(dgu.ptr<float>(gate), rows_of(gate), dgu.ptr<float>(up), rows_of(up),
                             dout.ptr<float>(out), rows_of(out), nullptr));
      ASSERT_OK(cu::synchronize(nullptr));
      ASSERT_OK(dout.download());
      Tensor expected = testing::nan_tensor({n, ff});
      ops::reference::silu_mul(gate, up, expected);
      const std::string what = fmt::format("n={} ff={}", n, ff);
      ASSERT_TRUE(all_close(dout.host().slice(1, 1, ff + 1), expected, 1e-6, what));
      ASSERT_TRUE(testing::all_nan(dout.host().slice(1, 0, 1), what + " left pad"));
      ASSERT_TRUE(testing::all_nan(dout.host().slice(1, ff + 1, ff + 2), what + " right pad"));
    }
  }
}

TEST(CudaEmbedding, MatchesReferenceBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t vocab = 1003, d = 77, n = 29;
    const Tensor table = testing::convert(testing::random_tensor({vocab, d}, rng), dtype);
    const Tensor ids = testing::random_i32({n}, rng, 0, static_cast<int32_t>(vocab - 1));
    Mirror dtable(table), dids(ids), dout(testing::nan_tensor({n, d + 5}));
    Tensor out = dout.host().slice(1, 0, d);
    ASSERT_OK(cu::embedding(dtable.ptr<void>(), dtype, d, vocab, d, dids.ptr<int32_t>(), n, dout.ptr<float>(out),
                            d + 5, nullptr));
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(dout.download());
    Tensor expected = testing::nan_tensor({n, d});
    ops::reference::embedding(table, ids, expected);
    ASSERT_TRUE(testing::bitwise_equal(dout.host().slice(1, 0, d), expected, dtype_name(dtype)));
    ASSERT_TRUE(testing::all_nan(dout.host().slice(1, d, d + 5), "padding"));
  }
}

// ---- store_kv ------------------------------------------------------------------------------------------

TEST(CudaStoreKv, MatchesReferenceBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t num_blocks = 7, block_size = 16, kv_heads = 3, head_dim = 24, n = 29;
    // k, v as strided views of a fused QKV output; values past f16's range overflow to Inf.
    Mirror dqkv(testing::random_tensor({n, 2 + 2 * kv_heads, head_dim}, rng, -70000.0f, 70000.0f));
    const Tensor k = dqkv.host().slice(1, 2, 2 + kv_heads), v = dqkv.host().slice(1, 2 + kv_heads, 2 + 2 * kv_heads);
    std::vector<int32_t> all_slots(static_cast<size_t>(num_blocks * block_size));
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
    slots[3] = -1;  // padding tokens store nothing
    slots[17] = -1;
    const Tensor slot_mapping = testing::i32_tensor(slots);
    Tensor k_ref = testing::nan_tensor({num_blocks, block_size, kv_heads, head_dim}, dtype);
    Tensor v_ref = k_ref.contiguous();
    Mirror dslots(slot_mapping), dk(k_ref), dv(v_ref);
    cu::KvCacheView cache;
    cache.k = dk.ptr<void>();
    cache.v = dv.ptr<void>();
    cache.dtype = dtype;
    cache.num_blocks = num_blocks;
    cache.block_size = block_size;
    cache.num_kv_heads = kv_heads;
    cache.head_dim = head_dim;
    ASSERT_OK(cu::store_kv(dqkv.ptr<float>(k), k.stride(0), k.stride(1), dqkv.ptr<float>(v), v.stride(0), v.stride(1), n,
                           dslots.ptr<int32_t>(), cache, nullptr));
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(dk.download());
    ASSERT_OK(dv.download());
    ops::reference::store_kv(k.contiguous(), v.contiguous(), slot_mapping, k_ref, v_ref);
    ASSERT_TRUE(testing::bitwise_equal(dk.host(), k_ref, fmt::format("k {}", dtype_name(dtype))));
    ASSERT_TRUE(testing::bitwise_equal(dv.host(), v_ref, fmt::format("v {}", dtype_name(dtype))));
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
