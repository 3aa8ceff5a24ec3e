// linear() on the GPU: the custom GEMV (linear_gemv.cu) for 1..16 tokens, cuBLASLt beyond. The
// cuBLASLt path multiplies 16-bit activations (converted from f32 in a small kernel) by the
// 16-bit weight with f32 accumulation and f32 output; f32 weights run in plain f32. The bias is
// cuBLASLt's epilogue when it is f32, else a separate kernel. Chosen algorithms are cached per
// shape in the LinearContext, so a steady-state step makes no heuristic queries. Quantized weights
// (int8, int4, GGUF blocks) have their own GEMVs and tensor-core GEMMs, and are expanded to bf16
// for cuBLASLt beyond them.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/host_util.h"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
  }
}

Status cublas_status(cublasStatus_t s, const char* expression, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error(s == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                    "{}:{}: {} failed: {} ({})", file, line, expression, cublas_status_name(s), static_cast<int>(s));
}

#define TACHYON_CUBLAS_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                      \
    const cublasStatus_t tachyon_cublas_status_ = (expr);                                   \
    if (tachyon_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      return cublas_status(tachyon_cublas_status_, #expr, __FILE__, __LINE__);              \
  } while (0)

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kI8: return CUDA_R_8I;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    default: return CUDA_R_32F;
  }
}

int alignment_of(const void* p, int64_t stride_bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes) | 256u;
  return static_cast<int>(a & (~a + 1));  // lowest set bit, at most 256
}

// Descriptors of one cuBLASLt matmul, destroyed on scope exit.
struct MatmulDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~MatmulDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

struct LinearContext::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  DeviceBuffer activations;  // x converted to 16 bits for cuBLASLt
  DeviceBuffer dequantized;  // an int8 weight expanded to bf16 for cuBLASLt
  DeviceBuffer partial;      // GEMV split-K partial sums
  DeviceBuffer rounded;      // f32 activations rounded to an fp8 weight's static scale
  DeviceBuffer split_counters;  // kSplitKCounters arrival counts for kernels that finish split-K themselves
  // Activations a producer kernel wrote in 16 bits for the next linear (stage_activations): which
  // f32 rows they mirror, at what rounding. `staged_for` is what the last stage_activations() set;
  // linear() moves it to `usable` for the call (so only that one call may read it).
  struct Staged {
    const float* x = nullptr;
    int64_t x_stride = 0, n = 0, in = 0;
    DType dtype = DType::kF32;
    bool matches(const LinearArgs& a, DType d) const {
      return x != nullptr && x == a.x && x_stride == a.x_stride && n == a.n && in == a.in && dtype == d;
    }
  };
  DeviceBuffer staged;
  Staged staged_for, usable;
  // (n, in, out, x ld, w ld, y ld, dtype, bias epilogue, alignments) -> algorithm
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int, int, int>;
  std::map<Key, cublasLtMatmulAlgo_t> algos;
  int sm_count = 0;
  int compute_capability = 0;
  uint64_t generation = 0;  // scratch reallocations so far

  ~Impl() {
    if (handle) cublasLtDestroy(handle);
  }

  Status grow(DeviceBuffer& buffer, size_t bytes, const char* what) {
    if (buffer.bytes() >= bytes) return Status::Ok();
    // The old buffer may still be in use by queued work: wait before freeing it.
    TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    buffer = DeviceBuffer();
    ++generation;
    const size_t rounded = std::max<size_t>(bytes, 1u << 20);
    TACHYON_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(rounded, what));
    TACHYON_LOG_DEBUG("cuda linear: {} scratch grown to {} bytes", what, rounded);
    return Status::Ok();
  }

  // y[n, out] = x[n, in] · w[out, in]^T in cuBLASLt's column-major terms: Y^T (out x n, ld
  // y_stride) = op(W) · X^T, where W is stored as a column-major in x out matrix (ld w_stride)
  // taken transposed, and X^T is column-major in x n (ld x_stride). ab_dtype kI8: int32 sums,
  // exact, in y's words; kF8E4M3: f32 sums of the codes; neither takes a bias.
  Status matmul(const void* x, int64_t x_stride, const void* w, int64_t w_stride, DType ab_dtype, const float* bias,
                float* y, int64_t y_stride, int64_t n, int64_t in, int64_t out, Stream stream) {
    const bool int_sums = ab_dtype == DType::kI8;
    if (bias != nullptr && (int_sums || ab_dtype == DType::kF8E4M3)) {
      return make_error(ErrorCode::kInvalidArgument, "cuBLASLt {} GEMM: the bias is the caller's epilogue",
                        dtype_name(ab_dtype));
    }
    MatmulDescs d;
    TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d.op, int_sums ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                                            int_sums ? CUDA_R_32I : CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    TACHYON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    TACHYON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    if (bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      TACHYON_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      TACHYON_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      const cudaDataType_t bias_type = CUDA_R_32F;
      TACHYON_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    const cudaDataType_t ab = cuda_type(ab_dtype);
    TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.a, ab, in, out, w_stride));
    TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.b, ab, in, n, x_stride));
    TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.c, int_sums ? CUDA_R_32I : CUDA_R_32F, out, n, y_stride));

    const size_t esize = dtype_size(ab_dtype);
    const int align_a = alignment_of(w, w_stride * static_cast<int64_t>(esize));
    const int align_b = alignment_of(x, x_stride * static_cast<int64_t>(esize));
    const int align_c = alignment_of(y, y_stride * 4);
    const Key key{n, in, out, x_stride, w_stride, y_stride, static_cast<int>(ab_dtype), bias != nullptr,
                  align_a, align_b, align_c};
    auto it = algos.find(key);
    if (it == algos.end()) {
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&d.pref));
      const uint64_t ws = workspace.bytes();
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const uint32_t a32 = static_cast<uint32_t>(align_a), b32 = static_cast<uint32_t>(align_b),
                     c32 = static_cast<uint32_t>(align_c);
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof(a32)));
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof(b32)));
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c32, sizeof(c32)));
      TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c32, sizeof(c32)));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found);
      // An 8-bit GEMM the library does not do for this shape or alignment says so here (callers fall back).
      if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
      else TACHYON_CUBLAS_RETURN_IF_ERROR(st);
      if (found == 0) {
        return make_error(ErrorCode::kUnsupported,
                          "cuBLASLt has no algorithm for {} x {} -> {} ({}, n={}, lds {}/{}/{}, bias {})", in, out, n,
                          dtype_name(ab_dtype), n, x_stride, w_stride, y_stride, bias != nullptr);
      }
      it = algos.emplace(key, result.algo).first;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const int32_t alpha_i = 1, beta_i = 0;
    TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        handle, d.op, int_sums ? static_cast<const void*>(&alpha_i) : &alpha, w, d.a, x, d.b,
        int_sums ? static_cast<const void*>(&beta_i) : &beta, y, d.c, y, d.c, &it->second, workspace.data(),
        workspace.bytes(), stream));
    return Status::Ok();
  }
};

LinearContext::LinearContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LinearContext::~LinearContext() = default;

Result<std::unique_ptr<LinearContext>> LinearContext::create() {
  auto impl = std::make_unique<Impl>();
  TACHYON_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  TACHYON_ASSIGN_OR_RETURN(impl->workspace, DeviceBuffer::allocate(kWorkspaceBytes, "cuBLASLt workspace"));
  TACHYON_ASSIGN_OR_RETURN(impl->sm_count, current_sm_count());
  TACHYON_ASSIGN_OR_RETURN(impl->compute_capability, current_compute_capability());
  TACHYON_ASSIGN_OR_RETURN(impl->split_counters,
                           DeviceBuffer::allocate(detail::kSplitKCounters * sizeof(unsigned), "split-K counters"));
  TACHYON_CUDA_RETURN_IF_ERROR(cudaMemset(impl->split_counters.data(), 0, impl->split_counters.bytes()));
  return std::unique_ptr<LinearContext>(new LinearContext(std::move(impl)));
}

uint64_t LinearContext::generation() const { return impl_->generation; }

Status LinearContext::reserve(int64_t max_tokens, int64_t max_in, int64_t max_out) {
  const int64_t ld = (max_in + 7) / 8 * 8;
  TACHYON_RETURN_IF_ERROR(impl_->grow(impl_->activations, static_cast<size_t>(max_tokens * ld) * 2, "activations"));
  TACHYON_RETURN_IF_ERROR(
      impl_->grow(impl_->staged, static_cast<size_t>(max_tokens * ld) * 2, "staged activations"));
  // Split-K only runs on matrices with few rows (it fills the SMs with K slices instead).
  const int64_t split_rows = std::min<int64_t>(max_out, 32768);
  TACHYON_RETURN_IF_ERROR(impl_->grow(impl_->partial,
                                      static_cast<size_t>(32 * std::min<int64_t>(max_tokens, detail::kGemmMmaMaxTokens) *
                                                          split_rows) * sizeof(float),
                                      "split-K partial sums"));
  return Status::Ok();
}

Result<Rows16> LinearContext::stage_activations(const float* x, int64_t x_stride, int64_t n, int64_t in, DType dtype) {
  TACHYON_CUDA_REQUIRE(x != nullptr && n > 0 && in > 0 && x_stride >= in && (dtype == DType::kBF16 || dtype == DType::kF16),
                       "stage_activations: x {} [{}, {}] rows {} apart, {}", static_cast<const void*>(x), n, in,
                       x_stride, dtype_name(dtype));
  const int64_t ld = (in + 7) / 8 * 8;  // the rows linear() would convert x into
  impl_->staged_for = {};
  TACHYON_RETURN_IF_ERROR(impl_->grow(impl_->staged, static_cast<size_t>(n * ld) * 2, "staged activations"));
  impl_->staged_for = Impl::Staged{x, x_stride, n, in, dtype};
  Rows16 rows;
  rows.data = impl_->staged.data();
  rows.stride = ld;
  rows.dtype = dtype;
  return rows;
}

void LinearContext::forget_staged() { impl_->staged_for = {}; }

Status gemm_bf16(LinearContext& context, const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride,
                 const float* bias, float* y, int64_t y_stride, int64_t n, int64_t in, int64_t out, Stream stream) {
  TACHYON_CUDA_REQUIRE(n > 0 && in > 0 && out > 0, "gemm_bf16: n={} in={} out={}", n, in, out);
  TACHYON_CUDA_REQUIRE(x_stride >= in && w_stride >= in && y_stride >= out,
                       "gemm_bf16: strides x {} w {} y {} for in={} out={}", x_stride, w_stride, y_stride, in, out);
  log_path_once("cuda gemm: cuBLASLt bf16 x bf16 -> f32");
  return context.impl().matmul(x, x_stride, w, w_stride, DType::kBF16, bias, y, y_stride, n, in, out, stream);
}

namespace {

const char* gguf_format_name(GgufFormat format) {
  switch (format) {
    case GgufFormat::kQ8_0: return "q8_0";
    case GgufFormat::kQ4_1: return "q4_1";
    case GgufFormat::kQ5_0: return "q5_0";
    case GgufFormat::kQ5_1: return "q5_1";
    case GgufFormat::kIq4Nl: return "iq4_nl";
    case GgufFormat::kQ4_K: return "q4_k";
    case GgufFormat::kQ5_K: return "q5_k";
    case GgufFormat::kQ6_K: return "q6_k";
    default: return "none";
  }
}

// x rounded to `dtype` in rows `ld` apart: the copy a producer staged for this call when it is of
// these rows at this rounding, else converted now into the activation scratch.
Result<const void*> rounded_activations(LinearContext::Impl& ctx, const LinearArgs& a, DType dtype, int64_t ld,
                                        Stream stream) {
  const bool staged = ctx.usable.matches(a, dtype) && ld == (a.in + 7) / 8 * 8;
  ctx.usable = {};
  if (staged) {
    log_path_once("cuda linear: activations rounded to 16 bits by the kernel that wrote them");
    return static_cast<const void*>(ctx.staged.data());
  }
  TACHYON_RETURN_IF_ERROR(ctx.grow(ctx.activations, static_cast<size_t>(a.n * ld) * 2, "activations"));
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_convert_rows(a.x, a.x_stride, a.n, a.in, ctx.activations.data(), dtype, ld, stream));
  return static_cast<const void*>(ctx.activations.data());
}

// The cuBLASLt path of linear(): f32 weights in plain f32, 16-bit weights against activations
// rounded to their type, quantized weights expanded to bf16 first; the bias in cuBLASLt's epilogue
// when it is f32, else a separate kernel. ld: the row stride of converted activations and expanded
// weights.
Status linear_cublaslt(LinearContext::Impl& ctx, const LinearArgs& a, int64_t ld, Stream stream) {
  const bool gguf = a.gguf != GgufFormat::kNone;
  const bool ternary = a.scheme == QuantScheme::kTernary;
  const bool int4 = !gguf && !ternary && a.w_dtype == DType::kU8;
  const bool epilogue_bias = a.bias != nullptr && a.bias_dtype == DType::kF32;
  const float* bias = epilogue_bias ? static_cast<const float*>(a.bias) : nullptr;
  if (gguf || int4 || ternary || a.w_dtype == DType::kI8 || a.w_dtype == DType::kF8E4M3) {
    // Many tokens share the weight: expand it to bf16 once for this call and multiply on tensor
    // cores. The expansion reads 1 byte (int8), half a byte (int4) or a GGUF block's share and
    // writes 2 per weight, so this path costs more than a bf16 weight would; the kernels above are
    // where quantized weights pay (few tokens, bound by bytes read).
    TACHYON_RETURN_IF_ERROR(ctx.grow(ctx.dequantized, static_cast<size_t>(a.out * ld) * 2, "dequantized weight"));
    uint16_t* expanded = ctx.dequantized.as<uint16_t>();
    TACHYON_CUDA_RETURN_IF_ERROR(
        gguf      ? detail::launch_dequantize_gguf(a, expanded, ld, stream)
        : ternary ? detail::launch_dequantize_ternary(a, expanded, ld, stream)
        : int4    ? detail::launch_dequantize_int4_groups(static_cast<const uint8_t*>(a.w), a.w_stride, a.w_scales,
                                                          a.w_zeros, a.w_group, a.out, a.in, expanded, ld, stream)
                  : detail::launch_dequantize_rows(a.w, a.w_dtype, a.w_stride, a.w_scales, a.out, a.in, expanded, ld,
                                                   stream));
    TACHYON_ASSIGN_OR_RETURN(const void* x16, rounded_activations(ctx, a, DType::kBF16, ld, stream));
    log_path_once("cuda linear: {} weight expanded to bf16, cuBLASLt bf16 x bf16 -> f32",
                  gguf ? gguf_format_name(a.gguf) : ternary ? "ternary" : int4 ? "int4" : dtype_name(a.w_dtype));
    TACHYON_RETURN_IF_ERROR(
        ctx.matmul(x16, ld, expanded, ld, DType::kBF16, bias, a.y, a.y_stride, a.n, a.in, a.out, stream));
  } else if (a.w_dtype == DType::kF32) {
    log_path_once("cuda linear: cuBLASLt f32 x f32 -> f32");
    TACHYON_RETURN_IF_ERROR(ctx.matmul(a.x, a.x_stride, a.w, a.w_stride, DType::kF32, bias, a.y, a.y_stride, a.n,
                                       a.in, a.out, stream));
  } else {
    TACHYON_ASSIGN_OR_RETURN(const void* x16, rounded_activations(ctx, a, a.w_dtype, ld, stream));
    log_path_once("cuda linear: cuBLASLt {0} x {0} -> f32 (activations rounded to {0})", dtype_name(a.w_dtype));
    TACHYON_RETURN_IF_ERROR(
        ctx.matmul(x16, ld, a.w, a.w_stride, a.w_dtype, bias, a.y, a.y_stride, a.n, a.in, a.out, stream));
  }
  if (a.bias != nullptr && !epilogue_bias) {
    log_path_once("cuda linear: {} bias added by a separate kernel", dtype_name(a.bias_dtype));
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_add_bias(a.y, a.y_stride, a.n, a.out, a.bias, a.bias_dtype, stream));
  }
  return Status::Ok();
}

// The GEMVs' split-K scratch for `shape` (null when it does not split).
Result<float*> split_partials(LinearContext::Impl& ctx, const LinearArgs& a, const detail::GemvShape& shape) {
  if (shape.splits <= 1) return static_cast<float*>(nullptr);
  TACHYON_RETURN_IF_ERROR(
      ctx.grow(ctx.partial, static_cast<size_t>(shape.splits * a.n * a.out) * sizeof(float), "split-K partial sums"));
  return ctx.partial.as<float>();
}

Status check_bias_and_strides(const LinearArgs& a) {
  TACHYON_CUDA_REQUIRE(a.bias == nullptr || a.bias_dtype == DType::kF32 || a.bias_dtype == DType::kF16 ||
                           a.bias_dtype == DType::kBF16,
                       "linear: bias dtype {}", dtype_name(a.bias_dtype));
  TACHYON_CUDA_REQUIRE(a.x_stride >= a.in && a.y_stride >= a.out, "linear: strides x {} y {} for in={} out={}",
                       a.x_stride, a.y_stride, a.in, a.out);
  return Status::Ok();
}

// GGUF block weights: the GEMV up to detail::kGemvGgufMaxTokens tokens (kAuto), beyond that the
// weight expanded to bf16 for cuBLASLt; no tensor-core GEMM reads these blocks.
Status linear_gguf(LinearContext::Impl& ctx, const LinearArgs& a, Stream stream, LinearAlgo algo) {
  const char* name = gguf_format_name(a.gguf);
  const bool q8_0 = a.gguf == GgufFormat::kQ8_0, separate = detail::gguf_separate_scales(a.gguf);
  const int64_t block = detail::gguf_block(a.gguf);
  const int64_t row_bytes = detail::gguf_packed_row_bytes(a.gguf, a.in);
  const int64_t align = detail::gguf_row_alignment(a.gguf);
  TACHYON_CUDA_REQUIRE(block > 0 && a.in % block == 0 && a.w_dtype == (q8_0 ? DType::kI8 : DType::kU8),
                       "linear: a {} weight needs in % {} == 0 and {} packed rows (got in = {}, {})", name, block,
                       q8_0 ? "i8" : "u8", a.in, dtype_name(a.w_dtype));
  TACHYON_CUDA_REQUIRE(a.w_stride >= row_bytes && a.w_stride % align == 0 &&
                           reinterpret_cast<uintptr_t>(a.w) % static_cast<uintptr_t>(align) == 0,
                       "linear: {} packed rows of {} bytes need a {}-byte aligned base and row stride (got {} at {})",
                       name, row_bytes, align, a.w_stride, a.w);
  TACHYON_CUDA_REQUIRE(separate == (a.w_scales_f16 != nullptr),
                       "linear: {} weight {} f16 block scales (got {})", name, separate ? "needs its" : "takes no",
                       static_cast<const void*>(a.w_scales_f16));
  TACHYON_RETURN_IF_ERROR(check_bias_and_strides(a));
  if (a.n == 0) return Status::Ok();
  if (algo == LinearAlgo::kAuto) algo = a.n <= detail::kGemvGgufMaxTokens ? LinearAlgo::kGemv : LinearAlgo::kCublasLt;
  TACHYON_CUDA_REQUIRE(algo != LinearAlgo::kMma && algo != LinearAlgo::kStream,
                       "linear: no tensor-core GEMM reads {} weights (GEMV or cuBLASLt)", name);
  if (algo == LinearAlgo::kGemv) {
    TACHYON_CUDA_REQUIRE(detail::gemv_gguf_supported(a), "linear: the {} GEMV takes 1..{} tokens (got {})", name,
                         detail::kGemvGgufMaxTokens, a.n);
    const detail::GemvShape shape = detail::plan_gemv_gguf(a, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: gemv {}", name);
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv_gguf(a, shape, partial, stream));
    return Status::Ok();
  }
  return linear_cublaslt(ctx, a, (a.in + 7) / 8 * 8, stream);
}

// The activations quantized per token (or to the weight's static scale) into the activation
// scratch: codes [n, ld] (ld: in rounded up to 16) and sx [n] after them.
struct QuantizedActivations {
  void* codes = nullptr;
  int64_t ld = 0;
  float* sx = nullptr;
};

Result<QuantizedActivations> quantize_activations(LinearContext::Impl& ctx, const LinearArgs& a, DType codes_dtype,
                                                  Stream stream) {
  QuantizedActivations q;
  q.ld = (a.in + 15) / 16 * 16;
  const size_t codes_bytes = static_cast<size_t>(a.n * q.ld + 15) / 16 * 16;
  TACHYON_RETURN_IF_ERROR(
      ctx.grow(ctx.activations, codes_bytes + static_cast<size_t>(a.n) * sizeof(float), "activations"));
  q.codes = ctx.activations.data();
  q.sx = reinterpret_cast<float*>(static_cast<char*>(ctx.activations.data()) + codes_bytes);
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_quantize_activations(a.x, a.x_stride, a.n, a.in, codes_dtype, q.codes, q.ld, q.sx, a.x_scale, stream));
  return q;
}

// W8A8: the activations quantized per token, then the dp4a GEMV up to
// kLinearAutoGemvMaxTokensW8A8 tokens (kAuto) and cuBLASLt's int8 GEMM beyond it, its int32 sums finished in place. Both give the
// CPU's bits. Where cuBLASLt has no int8 algorithm for the shape, the GEMV runs in chunks.
Status linear_w8a8(LinearContext::Impl& ctx, const LinearArgs& a, Stream stream, LinearAlgo algo) {
  TACHYON_CUDA_REQUIRE(a.w_dtype == DType::kI8 && a.w_scales != nullptr && a.w_stride >= a.in,
                       "linear: a W8A8 weight is i8 codes with per-row scales (got {}, scales {}, row stride {})",
                       dtype_name(a.w_dtype), static_cast<const void*>(a.w_scales), a.w_stride);
  TACHYON_CUDA_REQUIRE(a.in < (int64_t{1} << 17), "linear: W8A8 takes in < 2^17 (int32 sums), got {}", a.in);
  TACHYON_RETURN_IF_ERROR(check_bias_and_strides(a));
  if (a.n == 0) return Status::Ok();
  if (algo == LinearAlgo::kAuto) algo = a.n <= kLinearAutoGemvMaxTokensW8A8 ? LinearAlgo::kGemv : LinearAlgo::kCublasLt;
  TACHYON_CUDA_REQUIRE(algo != LinearAlgo::kMma && algo != LinearAlgo::kStream,
                       "linear: W8A8 runs the GEMV or cuBLASLt's int8 GEMM");
  TACHYON_CUDA_REQUIRE(algo != LinearAlgo::kGemv || a.n <= detail::kGemvW8A8MaxTokens,
                       "linear: the W8A8 GEMV takes 1..{} tokens (got {})", detail::kGemvW8A8MaxTokens, a.n);
  TACHYON_ASSIGN_OR_RETURN(QuantizedActivations q, quantize_activations(ctx, a, DType::kI8, stream));
  const int8_t* codes = static_cast<const int8_t*>(q.codes);
  // Tokens [t0, t0 + c.n) of the call (c: a's arguments for them).
  const auto gemv = [&](const LinearArgs& c, int64_t t0) -> Status {
    const detail::GemvShape shape = detail::plan_gemv_w8a8(c, q.ld, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, c, shape));
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv_w8a8(c, codes + t0 * q.ld, q.ld, q.sx + t0, shape,
                                                          reinterpret_cast<int32_t*>(partial), stream));
    return Status::Ok();
  };
  if (algo == LinearAlgo::kGemv) {
    log_path_once("cuda linear: w8a8 gemv (int8 activations, dp4a; {} scales)", a.x_scale > 0.0f ? "static" : "per-token");
    return gemv(a, 0);
  }
  Status s = ctx.matmul(codes, q.ld, a.w, a.w_stride, DType::kI8, nullptr, a.y, a.y_stride, a.n, a.in, a.out, stream);
  if (s.ok()) {
    log_path_once("cuda linear: w8a8 cuBLASLt int8 x int8 -> int32, scaled in place ({} activation scales)",
                  a.x_scale > 0.0f ? "static" : "per-token");
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_scale_sums(a.y, a.y_stride, a.n, a.out, /*int_sums=*/true, q.sx,
                                                           a.w_scales, a.bias, a.bias_dtype, stream));
    return Status::Ok();
  }
  if (s.code() != ErrorCode::kUnsupported) return s;
  log_path_once("cuda linear: w8a8 without a cuBLASLt int8 algorithm ({}): the GEMV in chunks", s.message());
  for (int64_t t0 = 0; t0 < a.n; t0 += detail::kGemvW8A8MaxTokens) {
    LinearArgs c = a;
    c.n = std::min<int64_t>(detail::kGemvW8A8MaxTokens, a.n - t0);
    c.y = a.y + t0 * a.y_stride;
    TACHYON_RETURN_IF_ERROR(gemv(c, t0));
  }
  return Status::Ok();
}

// Per-channel fp8 (e4m3) weights: the GEMV (f32 activations, like the CPU) up to
// kLinearAutoGemvMaxTokensFp8 tokens; beyond, on sm_89+, cuBLASLt's fp8 GEMM on activations
// quantized per token to e4m3 (to the static scale where the weight has one), the sums scaled in
// place; elsewhere (or where cuBLASLt has no fp8 algorithm) the weight expanded to bf16. A static
// activation scale rounds the activations for the GEMV and the bf16 path first
// (round_activation_row_fp8); the fp8 GEMM's codes are those same values.
Status linear_fp8(LinearContext::Impl& ctx, const LinearArgs& args, Stream stream, LinearAlgo algo) {
  TACHYON_CUDA_REQUIRE(args.w_scales != nullptr && args.w_stride >= args.in,
                       "linear: an fp8 weight needs its per-row scales (got {}, row stride {})",
                       static_cast<const void*>(args.w_scales), args.w_stride);
  TACHYON_RETURN_IF_ERROR(check_bias_and_strides(args));
  if (args.n == 0) return Status::Ok();
  const bool fp8_cores = ctx.compute_capability >= 89 && args.in % 16 == 0 && args.w_stride % 16 == 0;
  if (algo == LinearAlgo::kAuto) {
    algo = args.n <= kLinearAutoGemvMaxTokensFp8 ? LinearAlgo::kGemv : LinearAlgo::kCublasLt;
  }
  TACHYON_CUDA_REQUIRE(algo != LinearAlgo::kMma && algo != LinearAlgo::kStream,
                       "linear: fp8 weights run the GEMV or cuBLASLt");
  LinearArgs a = args;
  const auto round_static = [&]() -> Status {
    if (!(a.x_scale > 0.0f) || a.x != args.x) return Status::Ok();
    TACHYON_RETURN_IF_ERROR(
        ctx.grow(ctx.rounded, static_cast<size_t>(a.n * a.in) * sizeof(float), "fp8-rounded activations"));
    float* rounded = static_cast<float*>(ctx.rounded.data());
    TACHYON_CUDA_RETURN_IF_ERROR(
        detail::launch_round_activations_fp8(args.x, args.x_stride, a.n, a.in, a.x_scale, rounded, stream));
    log_path_once("cuda linear: fp8 activations rounded to their static scale");
    a.x = rounded;
    a.x_stride = a.in;
    return Status::Ok();
  };
  if (algo == LinearAlgo::kGemv) TACHYON_RETURN_IF_ERROR(round_static());
  if (algo == LinearAlgo::kGemv) {
    TACHYON_CUDA_REQUIRE(a.n <= detail::kGemvMaxTokens, "linear: the GEMV takes at most {} tokens, got {}",
                         detail::kGemvMaxTokens, a.n);
    const detail::GemvShape shape = detail::plan_gemv(a, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: gemv f8e4m3 ({})", shape.vector_loads ? "16-byte loads" : "scalar loads");
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv(a, shape, partial, stream));
    return Status::Ok();
  }
  if (fp8_cores) {
    TACHYON_ASSIGN_OR_RETURN(QuantizedActivations q, quantize_activations(ctx, a, DType::kF8E4M3, stream));
    Status s = ctx.matmul(q.codes, q.ld, a.w, a.w_stride, DType::kF8E4M3, nullptr, a.y, a.y_stride, a.n, a.in, a.out,
                          stream);
    if (s.ok()) {
      log_path_once("cuda linear: fp8 cuBLASLt e4m3 x e4m3 -> f32 ({} activation scales), scaled in place",
                    a.x_scale > 0.0f ? "static" : "per-token");
      TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_scale_sums(a.y, a.y_stride, a.n, a.out, /*int_sums=*/false, q.sx,
                                                             a.w_scales, a.bias, a.bias_dtype, stream));
      return Status::Ok();
    }
    if (s.code() != ErrorCode::kUnsupported) return s;
    log_path_once("cuda linear: no cuBLASLt fp8 algorithm ({}): the weight expanded to bf16", s.message());
  }
  TACHYON_RETURN_IF_ERROR(round_static());
  return linear_cublaslt(ctx, a, (a.in + 7) / 8 * 8, stream);
}

// Ternary weights: the GEMV up to kLinearAutoGemvMaxTokensTernary tokens (kAuto), beyond that the
// weight expanded to bf16 for cuBLASLt.
Status linear_ternary(LinearContext::Impl& ctx, const LinearArgs& a, Stream stream, LinearAlgo algo) {
  TACHYON_CUDA_REQUIRE(detail::ternary_weight_supported(a),
                       "linear: a ternary weight is u8 codes [out, in / 4] with 16-byte aligned rows, group 32, 64, "
                       "128 or 256 and in % 64 == 0 (got {}, group {}, in {}, row stride {})",
                       dtype_name(a.w_dtype), a.w_group, a.in, a.w_stride);
  TACHYON_RETURN_IF_ERROR(check_bias_and_strides(a));
  if (a.n == 0) return Status::Ok();
  if (algo == LinearAlgo::kAuto) {
    algo = a.n <= kLinearAutoGemvMaxTokensTernary && detail::gemv_ternary_supported(a) ? LinearAlgo::kGemv
                                                                                        : LinearAlgo::kCublasLt;
  }
  TACHYON_CUDA_REQUIRE(algo != LinearAlgo::kMma && algo != LinearAlgo::kStream,
                       "linear: no tensor-core GEMM reads ternary weights");
  if (algo == LinearAlgo::kGemv) {
    TACHYON_CUDA_REQUIRE(detail::gemv_ternary_supported(a),
                         "linear: the ternary GEMV takes 1..{} tokens with 16-byte aligned activation rows (got {})",
                         detail::kGemvTernaryMaxTokens, a.n);
    const detail::GemvShape shape = detail::plan_gemv_ternary(a, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: gemv ternary g{}", a.w_group);
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv_ternary(a, shape, partial, stream));
    return Status::Ok();
  }
  return linear_cublaslt(ctx, a, (a.in + 7) / 8 * 8, stream);
}

Status linear_int4_swiglu(LinearContext& context, const LinearArgs& a, Stream stream);

}  // namespace

Status linear_fused(LinearContext& context, const LinearArgs& a, const detail::GemvFusion& f, Stream stream) {
  TACHYON_CUDA_REQUIRE(a.x != nullptr && a.w != nullptr && a.y != nullptr,
                       "linear_fused: null pointer (x {}, w {}, y {})", static_cast<const void*>(a.x), a.w,
                       static_cast<void*>(a.y));
  TACHYON_CUDA_REQUIRE(a.n >= 0 && a.in > 0 && a.out > 0, "linear_fused: n={} in={} out={}", a.n, a.in, a.out);
  const auto unsupported = [] { return make_error(ErrorCode::kUnsupported, "linear_fused: not the GEMV's case"); };
  // One token only: at 2 and 4 the fused GEMV decoded 2 % slower than the GEMV and silu_mul
  // apart (batch 4: 692-697 against 708-709 output tok/s, docs/perf.md 2026-12-02). kAuto runs
  // the GEMV at that count for every weight the fused GEMV takes (gemv_fused_supported).
  static_assert(kLinearFusedMaxTokens <= kLinearAutoGemvMaxTokensInt8 &&
                kLinearFusedMaxTokens <= kLinearAutoGemvMaxTokensFp8 &&
                kLinearFusedMaxTokens <= kLinearAutoGemvMaxTokens);
  if (f.epilogue == detail::GemvEpilogue::kSwiGLU && a.w_dtype == DType::kU8 && a.gguf == GgufFormat::kNone &&
      a.scheme == QuantScheme::kNone) {
    return linear_int4_swiglu(context, a, stream);
  }
  if (a.n == 0 || a.n > kLinearFusedMaxTokens || a.gguf != GgufFormat::kNone || a.scheme != QuantScheme::kNone ||
      a.x_scale > 0.0f ||
      ((a.w_dtype == DType::kI8 || a.w_dtype == DType::kF8E4M3) && a.w_scales == nullptr) ||
      !detail::gemv_fused_supported(a, f)) {
    return unsupported();
  }
  TACHYON_CUDA_REQUIRE(a.w_stride >= a.in, "linear_fused: weight row stride {} for in={}", a.w_stride, a.in);
  TACHYON_CUDA_REQUIRE(a.bias == nullptr || a.bias_dtype == DType::kF32 || a.bias_dtype == DType::kF16 ||
                           a.bias_dtype == DType::kBF16,
                       "linear_fused: bias dtype {}", dtype_name(a.bias_dtype));
  const int64_t y_cols = f.epilogue == detail::GemvEpilogue::kSwiGLU ? a.out / 2 : a.out;
  TACHYON_CUDA_REQUIRE(a.x_stride >= a.in && a.y_stride >= y_cols, "linear_fused: strides x {} y {} for in={} out={}",
                       a.x_stride, a.y_stride, a.in, y_cols);
  LinearContext::Impl& ctx = context.impl();
  ctx.staged_for = {};  // y may be the rows it mirrors
  const detail::GemvShape shape = detail::plan_gemv(a, ctx.sm_count);
  TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
  log_path_once("cuda linear: gemv {} with {}", dtype_name(a.w_dtype),
                f.epilogue == detail::GemvEpilogue::kSwiGLU ? "swiglu"
                : f.epilogue == detail::GemvEpilogue::kAdd  ? "the residual add"
                                                            : "no epilogue");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv_fused(a, f, shape, partial, stream));
  return Status::Ok();
}

// Whether kAuto runs the streamed int4 GEMM where it applies: kInt4StreamByDefault, or
// TACHYON_INT4_STREAM=1 / =0 (to measure what it gains against the register-path GEMM).
static bool int4_stream_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TACHYON_INT4_STREAM");
    if (env == nullptr || *env == '\0') return kInt4StreamByDefault;
    return std::string_view(env) != "0";
  }();
  return enabled;
}

namespace {

// kAuto's pick for dense f16/bf16/f32, per-channel int8 and group-wise int4 weights (the other
// formats pick in their own functions above).
LinearAlgo auto_algo_dense(const LinearArgs& a, bool mma_fits, bool stream_fits) {
  if (a.w_dtype == DType::kU8) {
    // int4: the streamed GEMM at decode sizes on sm_90, the tensor-core GEMM where it applies
    // (group 128), else the GEMV while it holds the tokens, then the weight expanded to bf16 for
    // cuBLASLt.
    const bool small = a.n <= kLinearAutoGemvMaxTokensInt4Small && a.out <= kLinearAutoGemvMaxRowsInt4;
    if (stream_fits && int4_stream_enabled()) return LinearAlgo::kStream;
    if (mma_fits && !(small && detail::gemv_int4_supported(a))) return LinearAlgo::kMma;
    if (a.n <= kLinearAutoGemvMaxTokensInt4 && detail::gemv_int4_supported(a)) return LinearAlgo::kGemv;
    return LinearAlgo::kCublasLt;
  }
  if (a.w_dtype == DType::kI8) {
    // int8: the GEMV at the fewest tokens, the tensor-core GEMM up to its limit, then the weight
    // expanded to bf16 for cuBLASLt (prefill).
    if (a.n <= kLinearAutoGemvMaxTokensInt8 || (!mma_fits && a.n <= 8)) return LinearAlgo::kGemv;
    return mma_fits ? LinearAlgo::kMma : LinearAlgo::kCublasLt;
  }
  return a.n <= kLinearAutoGemvMaxTokens ? LinearAlgo::kGemv : LinearAlgo::kCublasLt;
}

bool mma_fits_dense(const LinearContext::Impl& ctx, const LinearArgs& a, int64_t ld) {
  return ctx.compute_capability >= 80 &&
         (a.w_dtype == DType::kU8 ? detail::gemm_mma_int4_supported(a, ld) : detail::gemm_mma_supported(a, ld));
}

// linear_fused's SwiGLU for group-128 int4 weights at 1..kGemmMmaInt4StageMaxTokens tokens: the
// staged tensor-core GEMM (what linear() runs there) with silu(gate) * up in its epilogue, so no
// silu_mul kernel and no [n, 2 * half] product. Unsupported wherever linear() would not stage.
Status linear_int4_swiglu(LinearContext& context, const LinearArgs& a, Stream stream) {
  LinearContext::Impl& ctx = context.impl();
  const auto unsupported = [] { return make_error(ErrorCode::kUnsupported, "linear_fused: not the int4 GEMM's case"); };
  const int64_t ld = (a.in + 7) / 8 * 8;
  const bool bias_ok = a.bias == nullptr || a.bias_dtype == DType::kF32 || a.bias_dtype == DType::kF16 ||
                       a.bias_dtype == DType::kBF16;
  if (a.n < 1 || a.n > detail::kGemmMmaInt4StageMaxTokens || a.out % 2 != 0 || !mma_fits_dense(ctx, a, ld) ||
      a.x_stride < a.in || a.y_stride < a.out / 2 || !bias_ok) {
    return unsupported();
  }
  const bool small = a.n <= kLinearAutoGemvMaxTokensInt4Small && a.out <= kLinearAutoGemvMaxRowsInt4;
  if ((small && detail::gemv_int4_supported(a)) ||
      (detail::gemm_int4_stream_supported(a, ctx.compute_capability) && int4_stream_enabled())) {
    return unsupported();  // kAuto runs another kernel there
  }
  const detail::GemvShape shape = detail::plan_gemm_mma_int4(a, ctx.sm_count);
  unsigned* counters =
      detail::gemm_mma_int4_row_blocks(a) <= detail::kSplitKCounters ? ctx.split_counters.as<unsigned>() : nullptr;
  if (!detail::gemm_mma_int4_stages_x(a, shape) || (shape.splits > 1 && counters == nullptr)) return unsupported();
  ctx.usable = {};
  ctx.staged_for = {};
  TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
  log_path_once("cuda linear: tensor-core GEMM int4 weights with swiglu");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemm_mma_int4(a, nullptr, 0, shape, partial, counters, stream, true));
  return Status::Ok();
}

}  // namespace

DType linear_activation_dtype(LinearContext& context, const LinearArgs& a) {
  const LinearContext::Impl& ctx = context.impl();
  if (a.n <= 0 || a.in <= 0) return DType::kF32;
  if (a.gguf != GgufFormat::kNone) return a.n <= detail::kGemvGgufMaxTokens ? DType::kF32 : DType::kBF16;
  if (a.scheme == QuantScheme::kW8A8) return DType::kF32;  // quantized to int8 per token
  if (a.scheme == QuantScheme::kTernary) {
    return a.n <= kLinearAutoGemvMaxTokensTernary && detail::gemv_ternary_supported(a) ? DType::kF32 : DType::kBF16;
  }
  if (a.w_dtype == DType::kF8E4M3) {
    const bool fp8_cores = ctx.compute_capability >= 89 && a.in % 16 == 0 && a.w_stride % 16 == 0;
    return a.n <= kLinearAutoGemvMaxTokensFp8 || fp8_cores ? DType::kF32 : DType::kBF16;
  }
  if (a.w_dtype == DType::kF32) return DType::kF32;
  const bool int4 = a.w_dtype == DType::kU8;
  const int64_t ld = (a.in + 7) / 8 * 8;
  const bool stream_fits = int4 && detail::gemm_int4_stream_supported(a, ctx.compute_capability);
  const DType rounded = int4 || a.w_dtype == DType::kI8 ? DType::kBF16 : a.w_dtype;
  switch (auto_algo_dense(a, mma_fits_dense(ctx, a, ld), stream_fits)) {
    case LinearAlgo::kMma:
      return int4 && detail::gemm_mma_int4_stages_x(a, detail::plan_gemm_mma_int4(a, ctx.sm_count)) ? DType::kF32
                                                                                                      : rounded;
    case LinearAlgo::kCublasLt: return rounded;
    default: return DType::kF32;
  }
}

Status linear(LinearContext& context, const LinearArgs& a, Stream stream, LinearAlgo algo) {
  TACHYON_CUDA_REQUIRE(a.x != nullptr && a.w != nullptr && a.y != nullptr, "linear: null pointer (x {}, w {}, y {})",
                       static_cast<const void*>(a.x), a.w, static_cast<void*>(a.y));
  TACHYON_CUDA_REQUIRE(a.n >= 0 && a.in > 0 && a.out > 0, "linear: n={} in={} out={}", a.n, a.in, a.out);
  // A staged copy is for this call only (rounded_activations reads it).
  context.impl().usable = std::exchange(context.impl().staged_for, {});
  if (a.gguf != GgufFormat::kNone) return linear_gguf(context.impl(), a, stream, algo);
  if (a.scheme == QuantScheme::kW8A8) return linear_w8a8(context.impl(), a, stream, algo);
  if (a.scheme == QuantScheme::kTernary) return linear_ternary(context.impl(), a, stream, algo);
  if (a.w_dtype == DType::kF8E4M3) return linear_fp8(context.impl(), a, stream, algo);
  const bool int4 = a.w_dtype == DType::kU8;
  TACHYON_CUDA_REQUIRE(a.w_dtype == DType::kF32 || a.w_dtype == DType::kF16 || a.w_dtype == DType::kBF16 ||
                           (a.w_dtype == DType::kI8 && a.w_scales != nullptr) ||
                           (int4 && a.w_scales != nullptr && a.w_zeros != nullptr && a.w_group > 0 &&
                            a.w_group % 32 == 0 && a.in % a.w_group == 0 && a.w_stride % 16 == 0),
                       "linear: weight dtype {} has no CUDA kernel (i8 needs its per-row scales; u8 is int4 with "
                       "scales, zeros, a group that is a multiple of 32 dividing in = {} (got {}) and 16-byte aligned "
                       "rows)",
                       dtype_name(a.w_dtype), a.in, a.w_group);
  TACHYON_RETURN_IF_ERROR(check_bias_and_strides(a));
  TACHYON_CUDA_REQUIRE((int4 ? 2 * a.w_stride : a.w_stride) >= a.in, "linear: weight row stride {} for in={}",
                       a.w_stride, a.in);
  if (a.n == 0) return Status::Ok();
  LinearContext::Impl& ctx = context.impl();
  const int64_t ld = (a.in + 7) / 8 * 8;  // 16-byte aligned rows for activations converted to 16 bits
  const bool mma_fits = mma_fits_dense(ctx, a, ld);
  const bool stream_fits = int4 && detail::gemm_int4_stream_supported(a, ctx.compute_capability);
  if (algo == LinearAlgo::kAuto) algo = auto_algo_dense(a, mma_fits, stream_fits);
  if (algo == LinearAlgo::kStream) {
    TACHYON_CUDA_REQUIRE(stream_fits,
                         "linear: the streamed int4 GEMM takes group-128 int4 weights with in % 512 == 0 at 1..{} "
                         "tokens, 16-byte aligned weight rows, scales, zeros and activations, on sm_90 (got {} x {} "
                         "-> {}, {}, group {}, sm_{})",
                         detail::kGemmInt4StreamMaxTokens, a.n, a.in, a.out, dtype_name(a.w_dtype), a.w_group,
                         ctx.compute_capability);
    const detail::Int4StreamPlan plan = detail::plan_gemm_int4_stream(a, ctx.sm_count);
    detail::GemvShape shape;  // what split_partials sizes
    shape.splits = plan.splits;
    shape.chunk = plan.chunk;
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: int4 decode GEMM, weights streamed through shared memory (bulk copies)");
    TACHYON_CUDA_RETURN_IF_ERROR(
        detail::launch_gemm_int4_stream(a, plan, partial, ctx.split_counters.as<unsigned>(), stream));
    return Status::Ok();
  }

  if (algo == LinearAlgo::kMma) {
    TACHYON_CUDA_REQUIRE(mma_fits,
                         "linear: the tensor-core GEMM takes f16/bf16 weights with in % 32 == 0 (int8: in % 64 == "
                         "0; int4: group 128, at most {} tokens), 16-byte aligned rows and at most {} tokens on "
                         "sm_80+ (got {} x {} -> {}, {}, sm_{})",
                         detail::kGemmMmaMaxTokensInt4, detail::kGemmMmaMaxTokens, a.n, a.in, a.out,
                         dtype_name(a.w_dtype), ctx.compute_capability);
    const DType x16 = a.w_dtype == DType::kI8 || int4 ? DType::kBF16 : a.w_dtype;
    const detail::GemvShape shape =
        int4 ? detail::plan_gemm_mma_int4(a, ctx.sm_count) : detail::plan_gemm_mma(a, ctx.sm_count);
    // The int4 GEMM at decode sizes rounds f32 activations itself: no conversion pass.
    const bool x32 = int4 && detail::gemm_mma_int4_stages_x(a, shape);
    const void* rounded = nullptr;
    if (!x32) {
      TACHYON_ASSIGN_OR_RETURN(rounded, rounded_activations(ctx, a, x16, ld, stream));
    }
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: tensor-core GEMM {} weights x {} -> f32 (activations rounded to {})",
                  int4 ? "int4" : dtype_name(a.w_dtype), dtype_name(x16), dtype_name(x16));
    if (int4) {
      unsigned* counters = detail::gemm_mma_int4_row_blocks(a) <= detail::kSplitKCounters
                               ? ctx.split_counters.as<unsigned>()
                               : nullptr;
      TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemm_mma_int4(a, static_cast<const uint16_t*>(rounded), ld, shape,
                                                                partial, counters, stream));
    } else {
      TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemm_mma(a, rounded, ld, shape, partial, stream));
    }
    return Status::Ok();
  }

  if (algo == LinearAlgo::kGemv && int4) {
    TACHYON_CUDA_REQUIRE(detail::gemv_int4_supported(a),
                         "linear: the int4 GEMV takes 1..{} tokens and a 16-byte aligned weight (got {} tokens)",
                         detail::kGemvInt4MaxTokens, a.n);
    const detail::GemvShape shape = detail::plan_gemv_int4(a, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: gemv int4 g{}", a.w_group);
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv_int4(a, shape, partial, stream));
    return Status::Ok();
  }

  if (algo == LinearAlgo::kGemv) {
    TACHYON_CUDA_REQUIRE(a.n <= detail::kGemvMaxTokens, "linear: the GEMV takes at most {} tokens, got {}",
                         detail::kGemvMaxTokens, a.n);
    const detail::GemvShape shape = detail::plan_gemv(a, ctx.sm_count);
    TACHYON_ASSIGN_OR_RETURN(float* partial, split_partials(ctx, a, shape));
    log_path_once("cuda linear: gemv {} ({})", dtype_name(a.w_dtype),
                  shape.vector_loads ? "16-byte loads" : "scalar loads: rows not 16-byte aligned");
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_gemv(a, shape, partial, stream));
    return Status::Ok();
  }

  return linear_cublaslt(ctx, a, ld, stream);
}

}  // namespace tachyon::ops::cuda
