// rope, in place on x[n, heads, head_dim] (any token/head strides). One block per token and group
// of kHeadsPerBlock heads (a decode step's few tokens still spread over many SMs): the token's
// cos/sin pairs are computed into shared memory, then applied to the group's heads. The
// numerics are ops/cpu/reference.h's rope_cos_sin: angle = f32(position * inv_freq[i]) (one f32
// rounding), cos/sin in double, rounded to f32, times attention_scale; the rotation in double.
// rope_store_kv does q's and k's rotations and k's and v's store into the paged cache in one
// launch, with store_kv's rounding (kv_cache.cu), for f32/f16/bf16 caches.
// Launched with launch_pdl(): the cos/sin table is made before pdl_wait() from positions and
// inv_freq, which are host copies, never the output of the kernel just before.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kHeadsPerBlock = 4;

// The token's cos/sin pairs into cs ([half] cos, then [half] sin), by the block's threads.
__device__ __forceinline__ void rope_table(int32_t pos, const float* __restrict__ inv_freq, int half,
                                           float attention_scale, float* cs) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);  // no contraction: one f32 rounding
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    cs[i] = __fmul_rn(static_cast<float>(c), attention_scale);
    cs[half + i] = __fmul_rn(static_cast<float>(s), attention_scale);
  }
}

// One pair (a, b) rotated by (c, s), in double.
__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float cf, float sf) {
  const double a = x0, b = x1;
  const double c = cf, s = sf;
  x0 = static_cast<float>(__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s)));
  x1 = static_cast<float>(__dadd_rn(__dmul_rn(a, s), __dmul_rn(b, c)));
}

__global__ void rope_kernel(float* x, int64_t heads, int64_t token_stride, int64_t head_stride,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int half,
                            bool interleaved, float attention_scale) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x;
  rope_table(positions[t], inv_freq, half, attention_scale, cs);
  pdl_wait();
  pdl_trigger();
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
    rotate_pair(v[i0], v[i1], cs[i], cs[half + i]);
  }
}

// One block per token and group of kHeadsPerBlock heads: the q groups first, then the k groups,
// which also store their rotated k heads (and the dims past rotary_dim) and the same v heads.
__global__ void rope_store_kv_kernel(const RopeStoreArgs a, const KvCacheView cache) {
  extern __shared__ float cs[];
  const int64_t t = blockIdx.x;
  const int half = a.rotary_dim / 2;
  rope_table(a.positions[t], a.inv_freq, half, a.attention_scale, cs);
  pdl_wait();
  pdl_trigger();
  __syncthreads();
  const int64_t q_groups = (a.q_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const bool is_q = blockIdx.y < q_groups;
  const int64_t heads = is_q ? a.q_heads : cache.num_kv_heads;
  const int64_t h0 = (is_q ? static_cast<int64_t>(blockIdx.y) : blockIdx.y - q_groups) * kHeadsPerBlock;
  const int64_t hn = min64(kHeadsPerBlock, heads - h0);
  float* xt = is_q ? a.q + t * a.q_token_stride : a.k + t * a.k_token_stride;
  const int64_t head_stride = is_q ? a.q_head_stride : a.k_head_stride;
  const int32_t slot = is_q ? -1 : a.slot_mapping[t];
  const int64_t hd = cache.head_dim;
  const int64_t row0 = static_cast<int64_t>(slot) * cache.num_kv_heads;  // the slot's first (slot, head) row
  for (int64_t idx = threadIdx.x; idx < hn * half; idx += blockDim.x) {
    const int64_t h = h0 + idx / half;
    const int i = static_cast<int>(idx % half);
    float* v = xt + h * head_stride;
    const int i0 = a.interleaved ? 2 * i : i;
    const int i1 = a.interleaved ? 2 * i + 1 : i + half;
    rotate_pair(v[i0], v[i1], cs[i], cs[half + i]);
    if (slot >= 0) {
      store_from_f32(cache.k, cache.dtype, (row0 + h) * hd + i0, v[i0]);
      store_from_f32(cache.k, cache.dtype, (row0 + h) * hd + i1, v[i1]);
    }
  }
  if (slot < 0) return;
  const int64_t rest = hd - a.rotary_dim;  // k dims that do not rotate
  for (int64_t idx = threadIdx.x; idx < hn * rest; idx += blockDim.x) {
    const int64_t h = h0 + idx / rest, d = a.rotary_dim + idx % rest;
    store_from_f32(cache.k, cache.dtype, (row0 + h) * hd + d, xt[h * head_stride + d]);
  }
  const float* vt = a.v + t * a.v_token_stride;
  for (int64_t idx = threadIdx.x; idx < hn * hd; idx += blockDim.x) {
    const int64_t h = h0 + idx / hd, d = idx % hd;
    store_from_f32(cache.v, cache.dtype, (row0 + h) * hd + d, vt[h * a.v_head_stride + d]);
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
  return launch_pdl(rope_kernel, grid, 128, shared, stream, x, heads, token_stride, head_stride, positions, inv_freq,
                    half, interleaved, attention_scale);
}

cudaError_t launch_rope_store_kv(const RopeStoreArgs& a, const KvCacheView& cache, Stream stream) {
  if (a.n == 0) return cudaSuccess;
  if (a.n > 0x7fffffff) return cudaErrorInvalidValue;
  const int half = a.rotary_dim / 2;
  const size_t shared = static_cast<size_t>(2 * half) * sizeof(float);
  const int64_t groups = (a.q_heads + kHeadsPerBlock - 1) / kHeadsPerBlock +
                         (cache.num_kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (groups == 0) return cudaSuccess;
  if (groups > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(groups));
  return launch_pdl(rope_store_kv_kernel, grid, 128, shared, stream, a, cache);
}

}  // namespace tachyon::ops::cuda::detail
