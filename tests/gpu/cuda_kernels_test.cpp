// CUDA kernels == the scalar CPU reference (ops/cpu/reference.h) on fresh random inputs of odd
// sizes: linear (GEMV for 1..16 tokens, cuBLASLt beyond), rms_norm / add_rms_norm, rope, silu_mul,
// embedding, store_kv (f32/f16/bf16 and the quantized i8/f8e4m3 caches, bit for bit), and the
// device helpers. Outputs and the padding around them start as NaN; padding must stay NaN. Every
// CUDA call's Status is checked. Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
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
    for (int64_t d : {1, 7, 64, 67, 896, 4096, 4099, 8192, 16388}) {  // 16388: past the register path
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
    for (int64_t d : {3, 64, 1000, 4096, 5003, 16388}) {
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

// The 16-bit copy a norm or SwiGLU writes beside its f32 output (Rows16, for the linear after it)
// is that output rounded to nearest even, bit for bit; the f32 output is the one written without
// a copy; the copy's row padding stays untouched. Vector (d % 4 == 0) and scalar rows, bf16 and f16.
TEST(CudaNorm, SixteenBitCopyIsTheOutputRounded) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType copy_dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t d : {1001, 4096}) {
      for (int64_t n : {3, 17}) {
        const int64_t ld = (d + 7) / 8 * 8 + 8;  // padding after every row
        const Tensor x = testing::random_tensor({n, d}, rng, -3.0f, 3.0f);
        const Tensor residual = testing::random_tensor({n, d}, rng, -3.0f, 3.0f);
        const Tensor w = testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), DType::kBF16);
        Mirror dw(w);
        for (const char* op : {"rms_norm", "add_rms_norm", "silu_mul"}) {
          const std::string what = fmt::format("{} copy {} n={} d={}", op, dtype_name(copy_dtype), n, d);
          // The same inputs twice: without a copy, then with one.
          std::array<Tensor, 2> outputs;
          Tensor copy;
          for (int with_copy = 0; with_copy < 2; ++with_copy) {
            Mirror dx(x), dres(residual), dy(testing::nan_tensor({n, d})), dc(testing::nan_tensor({n, ld}, copy_dtype));
            cu::Rows16 c16;
            if (with_copy == 1) {
              c16.data = dc.ptr<void>();
              c16.stride = ld;
              c16.dtype = copy_dtype;
            }
            const std::string op_name(op);
            if (op_name == "rms_norm") {
              ASSERT_OK(cu::rms_norm(dx.ptr<float>(), rows_of(x), dw.ptr<void>(), DType::kBF16, 1e-5f,
                                     dy.ptr<float>(), rows_of(dy.host()), nullptr, c16));
            } else if (op_name == "add_rms_norm") {
              ASSERT_OK(cu::add_rms_norm(dres.ptr<float>(), rows_of(residual), dx.ptr<float>(), rows_of(x),
                                         dw.ptr<void>(), DType::kBF16, 1e-5f, dy.ptr<float>(), rows_of(dy.host()),
                                         nullptr, c16));
            } else {
              ASSERT_OK(cu::silu_mul(dx.ptr<float>(), rows_of(x), dres.ptr<float>(), rows_of(residual),
                                     dy.ptr<float>(), rows_of(dy.host()), nullptr, c16));
            }
            ASSERT_OK(cu::synchronize(nullptr));
            ASSERT_OK(dy.download());
            ASSERT_OK(dc.download());
            outputs[with_copy] = dy.host();
            copy = dc.host();
          }
          ASSERT_TRUE(testing::bitwise_equal(outputs[1], outputs[0], what + ": f32 output"));
          ASSERT_TRUE(testing::bitwise_equal(copy.slice(1, 0, d).contiguous(), testing::convert(outputs[1], copy_dtype),
                                             what + ": the copy"));
          ASSERT_TRUE(testing::all_nan(copy.slice(1, d, ld), what + ": the copy's padding"));
        }
      }
    }
  }
}

// A copy that is not 16-bit, or shorter than a row, is an error before any launch.
TEST(CudaNorm, SixteenBitCopyIsChecked) {
  TACHYON_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  Mirror dx(testing::random_tensor({2, 64}, rng)), dy(testing::nan_tensor({2, 64}));
  Mirror dw(testing::convert(testing::random_tensor({64}, rng), DType::kBF16));
  Mirror dc(testing::nan_tensor({2, 64}, DType::kBF16));
  cu::Rows16 c16;
  c16.data = dc.ptr<void>();
  c16.stride = 63;
  EXPECT_FALSE(cu::rms_norm(dx.ptr<float>(), rows_of(dx.host()), dw.ptr<void>(), DType::kBF16, 1e-5f, dy.ptr<float>(),
                            rows_of(dy.host()), nullptr, c16)
                   .ok());
  c16.stride = 64;
  c16.dtype = DType::kF32;
  EXPECT_FALSE(cu::silu_mul(dx.ptr<float>(), rows_of(dx.host()), dx.ptr<float>(), rows_of(dx.host()), dy.ptr<float>(),
                            rows_of(dy.host()), nullptr, c16)
                   .ok());
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

// A f32/f16/bf16 cache layer on the device (k, v [num_blocks, block_size, kv_heads, head_dim]).
cu::KvCacheView float_cache_view(const Mirror& k, const Mirror& v, DType dtype, int64_t num_blocks, int64_t block_size,
                                 int64_t kv_heads, int64_t head_dim) {
  cu::KvCacheView cache;
  cache.k = k.ptr<void>();
  cache.v = v.ptr<void>();
  cache.dtype = dtype;
  cache.num_blocks = num_blocks;
  cache.block_size = block_size;
  cache.num_kv_heads = kv_heads;
  cache.head_dim = head_dim;
  return cache;
}

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
    const cu::KvCacheView cache = float_cache_view(dk, dv, dtype, num_blocks, block_size, kv_heads, head_dim);
    ASSERT_OK(cu::store_kv(dqkv.ptr<float>(k), k.stride(0), k.stride(1), dqkv.ptr<float>(v), v.stride(0), v.stride(1), n,
                           dslots.ptr<int32_t>(), cache, nullptr));
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(dk.download());
    ASSERT_OK(dv.download());
    KvLayer ref;
    ref.k = k_ref;
    ref.v = v_ref;
    ops::reference::store_kv(k.contiguous(), v.contiguous(), slot_mapping, ref);
    ASSERT_TRUE(testing::bitwise_equal(dk.host(), k_ref, fmt::format("k {}", dtype_name(dtype))));
    ASSERT_TRUE(testing::bitwise_equal(dv.host(), v_ref, fmt::format("v {}", dtype_name(dtype))));
  }
}

// The fused rope + store of an attention block equals rope(q), rope(k) and store_kv(k, v) bit for
// bit: q, k and the cache (poisoned, so an unwritten or extra element shows), with q and k as views
// of one fused q/k/v output, padding slots, partial rotary dims, odd head counts, both styles.
TEST(CudaRopeStoreKv, EqualsTheSeparateOpsBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  struct Shape {
    int64_t heads, kv_heads, head_dim;
    int rotary_dim;
  };
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
      for (const Shape& sh : {Shape{32, 8, 128, 128}, Shape{5, 1, 64, 64}, Shape{9, 3, 80, 20}, Shape{4, 4, 6, 6},
                              Shape{14, 2, 128, 64}}) {
        RopeConfig config;
        config.theta = 500000.0f;
        config.rotary_dim = sh.rotary_dim;
        config.style = style;
        const RopeTable table = make_rope_table(config);
        Mirror dfreq(Tensor::view_of(const_cast<float*>(table.inv_freq.data()),
                                     {static_cast<int64_t>(table.inv_freq.size())}, DType::kF32));
        for (int64_t n : {1, 3, 29}) {
          const std::string what = fmt::format("{} {} heads {}/{} head_dim {} rotary {} n {}", dtype_name(dtype),
                                               style == RopeStyle::kNeox ? "neox" : "interleaved", sh.heads,
                                               sh.kv_heads, sh.head_dim, sh.rotary_dim, n);
          const int64_t block_size = 16, num_blocks = (n + block_size - 1) / block_size + 2;
          const Tensor qkv = testing::random_tensor({n, sh.heads + 2 * sh.kv_heads, sh.head_dim}, rng, -3.0f, 3.0f);
          const Tensor positions = testing::random_i32({n}, rng, 0, 100000);
          std::vector<int32_t> all_slots(static_cast<size_t>(num_blocks * block_size));
          std::iota(all_slots.begin(), all_slots.end(), 0);
          std::shuffle(all_slots.begin(), all_slots.end(), rng);
          std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
          if (n > 2) slots[1] = -1;  // a padding token stores nothing
          const Tensor poison = testing::nan_tensor({num_blocks, block_size, sh.kv_heads, sh.head_dim}, dtype);
          Mirror fused_qkv(qkv), apart_qkv(qkv), dpos(positions), dslots(testing::i32_tensor(slots));
          Mirror fused_k(poison), fused_v(poison), apart_k(poison), apart_v(poison);
          const auto cache_of = [&](const Mirror& k, const Mirror& v) {
            return float_cache_view(k, v, dtype, num_blocks, block_size, sh.kv_heads, sh.head_dim);
          };
          const auto parts = [&](Mirror& m) {
            return std::array<Tensor, 3>{m.host().slice(1, 0, sh.heads),
                                         m.host().slice(1, sh.heads, sh.heads + sh.kv_heads),
                                         m.host().slice(1, sh.heads + sh.kv_heads, sh.heads + 2 * sh.kv_heads)};
          };
          const auto [fq, fk, fv] = parts(fused_qkv);
          cu::RopeStoreArgs a;
          a.q = fused_qkv.ptr<float>(fq);
          a.q_heads = sh.heads;
          a.q_token_stride = fq.stride(0);
          a.q_head_stride = fq.stride(1);
          a.k = fused_qkv.ptr<float>(fk);
          a.k_token_stride = fk.stride(0);
          a.k_head_stride = fk.stride(1);
          a.v = fused_qkv.ptr<float>(fv);
          a.v_token_stride = fv.stride(0);
          a.v_head_stride = fv.stride(1);
          a.n = n;
          a.positions = dpos.ptr<int32_t>();
          a.inv_freq = dfreq.ptr<float>();
          a.rotary_dim = table.rotary_dim;
          a.interleaved = style == RopeStyle::kInterleaved;
          a.attention_scale = table.attention_scale;
          a.slot_mapping = dslots.ptr<int32_t>();
          ASSERT_OK(cu::rope_store_kv(a, cache_of(fused_k, fused_v), nullptr));
          const auto [q, k, v] = parts(apart_qkv);
          for (const Tensor* x : {&q, &k}) {
            ASSERT_OK(cu::rope(apart_qkv.ptr<float>(*x), n, x->size(1), sh.head_dim, x->stride(0), x->stride(1),
                               dpos.ptr<int32_t>(), dfreq.ptr<float>(), table.rotary_dim, table.style,
                               table.attention_scale, nullptr));
          }
          ASSERT_OK(cu::store_kv(apart_qkv.ptr<float>(k), k.stride(0), k.stride(1), apart_qkv.ptr<float>(v),
                                 v.stride(0), v.stride(1), n, dslots.ptr<int32_t>(), cache_of(apart_k, apart_v),
                                 nullptr));
          ASSERT_OK(cu::synchronize(nullptr));
          for (Mirror* m : {&fused_qkv, &apart_qkv, &fused_k, &fused_v, &apart_k, &apart_v}) ASSERT_OK(m->download());
          ASSERT_TRUE(testing::bitwise_equal(fused_qkv.host(), apart_qkv.host(), what + ": q, k (rotated), v"));
          ASSERT_TRUE(testing::bitwise_equal(fused_k.host(), apart_k.host(), what + ": k cache"));
          ASSERT_TRUE(testing::bitwise_equal(fused_v.host(), apart_v.host(), what + ": v cache"));
        }
      }
    }
  }
}

// A quantized layer [num_blocks, block_size, kv_heads, head_dim] whose codes and scales are
// poison (0x5a codes, NaN scales): slots nobody stores keep it, on the device and in the reference.
KvLayer poisoned_quantized_layer(int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                                 DType dtype) {
  KvLayer layer;
  layer.k = Tensor::empty({num_blocks, block_size, kv_heads, head_dim}, dtype);
  std::memset(layer.k.raw_data(), 0x5a, layer.k.nbytes());
  layer.v = layer.k.contiguous();
  layer.k_scales = testing::nan_tensor({num_blocks, block_size, kv_heads, 1});
  layer.v_scales = layer.k_scales.contiguous();
  return layer;
}

// GPU store_kv of k, v (f32 views of `source`'s host tensor, [n, kv_heads, head_dim]) into a
// copy of `layer` == the reference store into `layer`, codes and scales bit for bit.
::testing::AssertionResult quantized_store_matches(const Mirror& source, const Tensor& k, const Tensor& v,
                                                   const std::vector<int32_t>& slots, KvLayer& layer,
                                                   const std::string& what) {
  const Tensor slot_mapping = testing::i32_tensor(slots);
  Mirror dslots(slot_mapping), dk(layer.k), dv(layer.v), dks(layer.k_scales), dvs(layer.v_scales);
  cu::KvCacheView cache;
  cache.k = dk.ptr<void>();
  cache.v = dv.ptr<void>();
  cache.k_scales = dks.ptr<float>();
  cache.v_scales = dvs.ptr<float>();
  cache.dtype = layer.k.dtype();
  cache.num_blocks = layer.k.size(0);
  cache.block_size = layer.k.size(1);
  cache.num_kv_heads = layer.k.size(2);
  cache.head_dim = layer.k.size(3);
  Status st = cu::store_kv(source.ptr<float>(k), k.stride(0), k.stride(1), source.ptr<float>(v), v.stride(0),
                           v.stride(1), k.size(0), dslots.ptr<int32_t>(), cache, nullptr);
  if (st.ok()) st = cu::synchronize(nullptr);
  for (Mirror* m : {&dk, &dv, &dks, &dvs}) {
    if (st.ok()) st = m->download();
  }
  if (!st.ok()) return ::testing::AssertionFailure() << what << ": " << st.to_string();
  ops::reference::store_kv(k.contiguous(), v.contiguous(), slot_mapping, layer);
  auto r = testing::bitwise_equal(dk.host(), layer.k, what + " k codes");
  if (r) r = testing::bitwise_equal(dks.host(), layer.k_scales, what + " k scales");
  if (r) r = testing::bitwise_equal(dv.host(), layer.v, what + " v codes");
  if (r) r = testing::bitwise_equal(dvs.host(), layer.v_scales, what + " v scales");
  return r;
}

// Random rows over a wide range of magnitudes (scales from subnormal to ~1e36), strided k/v views,
// odd head counts and head dims (the 4-byte and 16-byte paths of the attention loaders read what
// this writes), padding tokens, and the special rows: all zero (scale 0), -0.0 mixed in, a NaN or
// an infinity (scale NaN, codes 0), a single non-zero value.
TEST(CudaStoreKv, QuantizedMatchesReferenceBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  struct Shape {
    int64_t kv_heads, head_dim, block_size;
  };
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    for (const Shape& shape : {Shape{3, 24, 16}, Shape{5, 128, 5}, Shape{1, 36, 16}, Shape{3, 256, 16},
                               Shape{7, 4, 3}, Shape{2, 100, 16}}) {
      const int64_t kv_heads = shape.kv_heads, head_dim = shape.head_dim, block_size = shape.block_size;
      const int64_t n = 37, num_blocks = (n + block_size - 1) / block_size + 3;
      Tensor qkv = testing::random_tensor({n, 1 + 2 * kv_heads, head_dim}, rng, -1.0f, 1.0f);
      float* x = qkv.data<float>();
      const int64_t token = (1 + 2 * kv_heads) * head_dim;
      // Row r of token t (r in [0, 1 + 2 kv_heads): the leading one is neither k nor v).
      const auto row = [&](int64_t t, int64_t r) { return x + t * token + r * head_dim; };
      std::uniform_real_distribution<float> exponent(-40.0f, 36.0f);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < 1 + 2 * kv_heads; ++r) {
          const float magnitude = std::pow(10.0f, exponent(rng));
          for (int64_t i = 0; i < head_dim; ++i) row(t, r)[i] *= magnitude;
        }
      }
      for (int64_t r = 0; r < 1 + 2 * kv_heads; ++r) std::fill_n(row(0, r), head_dim, 0.0f);  // all zero
      for (int64_t i = 0; i < head_dim; i += 2) row(1, 1)[i] = -0.0f;                          // signed zeros
      row(2, 1)[head_dim / 2] = std::numeric_limits<float>::quiet_NaN();
      row(2, 1 + kv_heads)[0] = std::numeric_limits<float>::infinity();
      row(2, 2 * kv_heads)[head_dim - 1] = -std::numeric_limits<float>::infinity();
      std::fill_n(row(3, 1), head_dim, 0.0f);
      row(3, 1)[head_dim - 1] = -3.0f;  // one value: it becomes -Q exactly
      Mirror dqkv(qkv);
      const Tensor k = dqkv.host().slice(1, 1, 1 + kv_heads), v = dqkv.host().slice(1, 1 + kv_heads, 1 + 2 * kv_heads);
      std::vector<int32_t> all_slots(static_cast<size_t>(num_blocks * block_size));
      std::iota(all_slots.begin(), all_slots.end(), 0);
      std::shuffle(all_slots.begin(), all_slots.end(), rng);
      std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
      slots[5] = -1;  // padding tokens store nothing
      slots[n - 1] = -1;
      KvLayer layer = poisoned_quantized_layer(num_blocks, block_size, kv_heads, head_dim, dtype);
      ASSERT_TRUE(quantized_store_matches(dqkv, k, v, slots, layer,
                                          fmt::format("{} kv_heads={} head_dim={}", dtype_name(dtype), kv_heads,
                                                      head_dim)));
      // The special rows came out as ops.h KvLayer says (the reference is checked in tests/ops;
      // this guards the comparison above against a reference that changed under it).
      const auto scale_of = [&](const Tensor& scales, int64_t t, int64_t h) {
        return scales.data<float>()[slots[static_cast<size_t>(t)] * kv_heads + h];
      };
      EXPECT_EQ(scale_of(layer.k_scales, 0, 0), 0.0f);
      EXPECT_TRUE(std::isnan(scale_of(layer.k_scales, 2, 0)));
      EXPECT_TRUE(std::isnan(scale_of(layer.v_scales, 2, 0)));
    }
  }
}

// The conversions themselves, exhaustively near every rounding boundary: a row whose max |x| is
// Q (127 or 448) has scale exactly 1, so its other values are converted as they are. i8: every
// quarter in [-127, 127] (ties to even) and the floats beside each tie; f8e4m3: a sweep of f32
// bit patterns over [0, 448] of both signs, every midpoint between neighbouring e4m3 values
// (normal and subnormal) and the floats beside it, -0 and the f32 subnormals.
TEST(CudaStoreKv, QuantizedConversionsAreExact) {
  TACHYON_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    const float q_max = ops::quantized_kv_max(dtype);
    std::vector<float> values;
    const auto beside = [&](float f) {
      values.push_back(f);
      values.push_back(std::nextafter(f, -INFINITY));
      values.push_back(std::nextafter(f, INFINITY));
    };
    if (dtype == DType::kI8) {
      for (int q = -4 * 127; q <= 4 * 127; ++q) beside(static_cast<float>(q) / 4.0f);
    } else {
      for (uint32_t bits = 0; bits <= f32_bits(kF8E4M3Max); bits += 997) {
        values.push_back(f32_from_bits(bits));
        values.push_back(-f32_from_bits(bits));
      }
      for (int b = 0; b < 0x7e; ++b) {
        const float lo = f8e4m3_to_f32(static_cast<uint8_t>(b)), hi = f8e4m3_to_f32(static_cast<uint8_t>(b + 1));
        beside((lo + hi) / 2.0f);  // exact in f32
        beside(-(lo + hi) / 2.0f);
      }
      values.push_back(-0.0f);
      values.push_back(std::numeric_limits<float>::denorm_min());
      values.push_back(-std::numeric_limits<float>::min());
    }
    // Values past Q (the float beside +-Q) would change the row's scale: clamp them onto Q.
    for (float& f : values) f = std::clamp(f, -q_max, q_max);
    const int64_t head_dim = 256, per_row = head_dim - 1, block_size = 16;
    const int64_t n = (static_cast<int64_t>(values.size()) + per_row - 1) / per_row;
    Tensor kv = Tensor::empty({n, 2, head_dim}, DType::kF32);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t which = 0; which < 2; ++which) {
        float* r = kv.data<float>() + (t * 2 + which) * head_dim;
        r[0] = which == 0 ? q_max : -q_max;  // scale 1 either way
        for (int64_t i = 1; i < head_dim; ++i) {
          const size_t j = static_cast<size_t>(t * per_row + i - 1);
          r[i] = j < values.size() ? values[j] : 0.0f;
        }
      }
    }
    Mirror dkv(kv);
    const Tensor k = dkv.host().slice(1, 0, 1), v = dkv.host().slice(1, 1, 2);
    std::vector<int32_t> slots(static_cast<size_t>(n));
    std::iota(slots.begin(), slots.end(), 0);
    KvLayer layer = poisoned_quantized_layer((n + block_size - 1) / block_size, block_size, 1, head_dim, dtype);
    ASSERT_TRUE(quantized_store_matches(dkv, k, v, slots, layer, dtype_name(dtype)));
    EXPECT_EQ(layer.k_scales.data<float>()[0], 1.0f);
  }
}

// A quantized cache without its scales, or scales on a 16-bit cache, is an argument error.
TEST(CudaStoreKv, ScalesMustMatchTheCacheDtype) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto k = cu::DeviceBuffer::allocate(4096, "k");
  auto v = cu::DeviceBuffer::allocate(4096, "v");
  auto scales = cu::DeviceBuffer::allocate(4096, "scales");
  ASSERT_TRUE(k.ok() && v.ok() && scales.ok());
  cu::KvCacheView cache;
  cache.k = k->data();
  cache.v = v->data();
  cache.num_blocks = 4;
  cache.block_size = 4;
  cache.num_kv_heads = 2;
  cache.head_dim = 16;
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    cache.dtype = dtype;
    cache.k_scales = cache.v_scales = nullptr;
    const Status s = cu::store_kv(nullptr, 0, 0, nullptr, 0, 0, 0, nullptr, cache, nullptr);
    EXPECT_FALSE(s.ok()) << dtype_name(dtype);
    EXPECT_NE(s.message().find("scales"), std::string::npos) << s.to_string();
  }
  cache.dtype = DType::kBF16;
  cache.k_scales = cache.v_scales = scales->as<float>();
  const Status s = cu::store_kv(nullptr, 0, 0, nullptr, 0, 0, 0, nullptr, cache, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("takes no scales"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
