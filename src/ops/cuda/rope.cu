// rope, in place on x[n, heads, head_dim] (any token/head strides). One block per token and group
// of kHeadsPerBlock heads (a decode step's few tokens still spread over many SMs): the token's
// cos/sin pairs are computed into shared memory, then applied to the group's heads. The
// numerics are ops/cpu/reference.h's rope_cos_sin: angle = f32(position * inv_freq[i]) (one f32
// rounding), cos/sin in double, rounded to f32, times attention_scale; the rotation in double.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kHeadsPerBlock = 4;

__global__ void rope_kernel(float* x, int64_t heads, int64_t token_stride, int64_t head_stride,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int half,
                            bool interleaved, float attention_scale) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x;
  const int32_t pos = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);  // no contraction: one f32 rounding
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    cs[i] = __fmul_rn(static_cast<float>(c), attention_scale);
    cs[half + i] = __fmul_rn(static_cast<float>(s), attention_scale);
  }
  __syncthreads();
  float* xt = x + t * token_stride;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kHeadsPerBlock;
  const int64_t total = min64(kHeadsPerBlock, heads - h0) * half;
  for (int64_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int64_t h = h0 + idx / half;
    const int i = static_cast<int>(idx % half);
    float* v = xt + h * head_stride;
    const int i0 = interleaved ? 2 * i : i;
    const int i1 = interleaved ? 2 * i + 1 : i + half;
    const double a = v[i0], b = v[i1];
    const double c = cs[i], s = cs[half + i];
    v[i0] = static_cast<float>(__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s)));
    v[i1] = static_cast<float>(__dadd_rn(__dmul_rn(a, s), __dmul_rn(b, c)));
  }
}

}  // namespace

cudaError_t launch_rope(float* x, int64_t n, int64_t heads, int64_t token_stride, int64_t head_stride,
                        const int32_t* positions, const float* inv_freq, int rotary_dim, bool interleaved,
                        float attention_scale, Stream stream) {
  if (n == 0 || heads == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  const int half = rotary_dim / 2;
  const size_t shared = static_cast<size_t>(2 * half) * sizeof(float);
  const int64_t groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (groups > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(groups));
  rope_kernel<<<grid, 128, shared, stream>>>(x, heads, token_stride, head_stride, positions, inv_freq, half,
                                             interleaved, attention_scale);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
