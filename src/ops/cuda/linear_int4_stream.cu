// The int4 decode GEMM of sm_90 (group-128 kInt4Group weights, 1..kGemmInt4StreamMaxTokens tokens):
// the weight streamed through shared memory by the copy engine, so that the bytes in flight no
// longer depend on what the warps are doing.
//
// Batch-1 decode is bound by reading the weight once. The register-path GEMM (linear_int4.cu)
// loads a round of weights, multiplies it, then loads the next: each warp waits a full memory
// latency per round, and the decoding is as long as that wait (docs/perf.md: 1.8-2.3x the time of
// its bytes). Here one block per SM (a persistent grid) has a producer warp that requests the
// weight's rows with bulk copies (cp.async.bulk, completing on an mbarrier) S stages ahead,
// for its next work items too, while eight consumer warps decode and multiply the stage that has
// arrived. The producer of a loaded model's weights (w_constant) starts before pdl_wait(): its
// first stages are in flight while the kernel before ends.
//
// Work: items of 16 rows (one mma tile) x one K slice; block b takes items b, b + grid, ... A stage
// is 16 rows x kStageCols columns (8 groups) plus those rows' 8 scales and 8 zeros; consumer warp
// w multiplies chunk w of it (int4_mma.cuh: 128 columns, one group), two chains of four mma steps.
// At the end of an item the eight warps' sums are added in warp order, so results never depend on
// timing; with K split, the last block to finish a tile's slices adds them in split order (as the
// reduction kernel would) and sets its counter back to zero.
//
// Shared memory: S stages (kStages in linear()), the item sums, the barriers, then every token's
// activations over the whole K rounded to bf16 in the operands' order (staged once per block).
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/int4_mma.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
constexpr int kTileRows = 16;
constexpr int kStageCols = 1024;                      // columns per stage: 8 chunks (groups) of 128
constexpr int kStageChunks = kStageCols / 128;
static_assert(kStageChunks == kConsumerWarps, "one chunk per consumer warp and stage");
constexpr int kStages = 6;  // what linear() runs (launch_gemm_int4_stream_probe times others)
// A staged row: its 512 bytes plus 64, so that the two rows of a quarter-warp's 16-byte loads
// (lanes g, g + 1) fall in different banks.
constexpr int kRowPitch = kStageCols / 2 + 64;
constexpr int kWeightBytes = kTileRows * kRowPitch;
constexpr int kScaleBytes = kTileRows * kStageChunks * 4;  // [16 rows][8 groups] f32
constexpr int kStageBytes = kWeightBytes + 2 * kScaleBytes;  // weights, scales, zeros
static_assert(kStageBytes % 128 == 0);
constexpr int kSumFloats = kConsumerWarps * kTileRows * 2;   // [warp][row][token], per item
constexpr int kSumBytes = 2 * kSumFloats * 4;                // two items' worth (alternating)

// Shared memory: S stages, the item sums, 2S barriers, then the staged activations.
__host__ __device__ constexpr int64_t stream_x_offset(int stages) {
  return static_cast<int64_t>(stages) * kStageBytes + kSumBytes + 2 * stages * 8;
}

struct StreamParams {
  const float* x;  // [n, in] f32, rows x_stride apart, 16-byte aligned
  int64_t x_stride;
  const uint8_t* w;  // [out, in / 2], rows w_stride bytes apart
  int64_t w_stride;
  const float* scales;  // [out, in / 128] f32
  const float* zeros;
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;      // [splits, n, out] when splits > 1
  unsigned* counters;  // one per row tile when splits > 1, zero between launches
  int64_t n, in, out;
  int64_t chunk;  // K slice of an item: a multiple of kStageCols
  int splits;
  int64_t items;  // row tiles x splits
  bool w_constant;
};

// ---- mbarriers and bulk copies (PTX ISA 8.0, sm_90) ----------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// Until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  const uint32_t addr = smem_address(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

// bytes (a multiple of 16; both addresses 16-byte aligned) from global to this block's shared
// memory, counted on `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// The consumer warps' own barrier (the producer never joins it).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
}

template <int S>
__global__ void __launch_bounds__(kThreads, 1) gemm_i4_stream_kernel(const StreamParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  float* sums = reinterpret_cast<float*>(smem + S * kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * kStageBytes + kSumBytes);
  uint64_t* empty = full + S;
  uint32_t* x_stage = reinterpret_cast<uint32_t*>(smem + stream_x_offset(S));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t groups = p.in / 128;
  const int64_t x_words = mma_i4_stage_stride(p.in);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full + s, 1);                // the producer's arrive (with the stage's bytes)
      mbar_init(empty + s, kConsumerWarps);  // one arrive per consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // Producer: stage after stage of this block's items, S ahead of the consumers. Lanes
    // 0-15 copy row lane's weights, lanes 16-31 its scales and zeros (rows past out: the last row
    // again, never stored).
    if (!p.w_constant) pdl_wait();
    unsigned it = 0;
    for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x) {
      const int64_t tile = item / p.splits;
      const int64_t k_begin = (item % p.splits) * p.chunk, k_end = min64(p.in, k_begin + p.chunk);
      const int64_t row = min64(tile * kTileRows + (lane & 15), p.out - 1);
      for (int64_t k0 = k_begin; k0 < k_end; k0 += kStageCols, ++it) {
        const int slot = static_cast<int>(it % S);
        if (it >= S) mbar_wait(empty + slot, ((it / S) & 1u) ^ 1u);
        const unsigned cols = static_cast<unsigned>(min64(kStageCols, k_end - k0));
        const unsigned w_bytes = cols / 2, s_bytes = cols / 128 * 4;
        if (lane == 0) mbar_arrive_expect_tx(full + slot, kTileRows * (w_bytes + 2 * s_bytes));
        __syncwarp();
        unsigned char* stage = smem + slot * kStageBytes;
        if (lane < 16) {
          bulk_copy(stage + lane * kRowPitch, p.w + row * p.w_stride + k0 / 2, w_bytes, full + slot);
        } else {
          const int64_t at = row * groups + k0 / 128;
          bulk_copy(stage + kWeightBytes + (lane - 16) * kStageChunks * 4, p.scales + at, s_bytes, full + slot);
          bulk_copy(stage + kWeightBytes + kScaleBytes + (lane - 16) * kStageChunks * 4, p.zeros + at, s_bytes,
                    full + slot);
        }
      }
    }
    pdl_wait();  // pdl.cuh's contract: every thread waits before it exits
    return;
  }

  // Consumers.
  pdl_wait();
  pdl_trigger();
  stage_int4_operands(p.x, p.x_stride, p.n, 0, p.in, x_stage, x_words, threadIdx.x, kConsumerWarps * 32);
  consumer_sync();
  const int g = lane >> 2, t = lane & 3;
  // Lane (g, t) reads token min(g, n - 1)'s operands (columns past n: never stored).
  const uint32_t* xs = x_stage + min64(g, p.n - 1) * x_words + 8 * t;
  unsigned it = 0, item_count = 0;
  for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x, ++item_count) {
    const int64_t tile = item / p.splits;
    const int split = static_cast<int>(item % p.splits);
    const int64_t k_begin = split * p.chunk, k_end = min64(p.in, k_begin + p.chunk);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // rows (g, g + 8) x tokens (2t, 2t + 1)
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kStageCols, ++it) {
      const int slot = static_cast<int>(it % S);
      mbar_wait(full + slot, (it / S) & 1u);
      if (k0 + 128 * warp < k_end) {
        const unsigned char* stage = smem + slot * kStageBytes;
        const uint4 wa = *reinterpret_cast<const uint4*>(stage + g * kRowPitch + 64 * warp + 16 * t);
        const uint4 wb = *reinterpret_cast<const uint4*>(stage + (g + 8) * kRowPitch + 64 * warp + 16 * t);
        const float* sc = reinterpret_cast<const float*>(stage + kWeightBytes);
        const float* zr = reinterpret_cast<const float*>(stage + kWeightBytes + kScaleBytes);
        const float sa = sc[g * kStageChunks + warp], sb = sc[(g + 8) * kStageChunks + warp];
        const __nv_bfloat162 za = biased_zero_pair(zr[g * kStageChunks + warp]);
        const __nv_bfloat162 zb = biased_zero_pair(zr[(g + 8) * kStageChunks + warp]);
        const uint32_t* xk = xs + (k0 + 128 * warp) / 2;
        // Two chains of four mma steps (halves of the chunk), so that each waits on half as many.
        float part0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, part1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        uint32_t b0[8], b1[8];
        load_int4_operands(xk, 0, b0);
        load_int4_operands(xk, 1, b1);
        int4_half_chunk_mma(wa, wb, 0, za, zb, b0, part0);
        int4_half_chunk_mma(wa, wb, 1, za, zb, b1, part1);
        acc[0] = fmaf(sa, part0[0] + part1[0], acc[0]);
        acc[1] = fmaf(sa, part0[1] + part1[1], acc[1]);
        acc[2] = fmaf(sb, part0[2] + part1[2], acc[2]);
        acc[3] = fmaf(sb, part0[3] + part1[3], acc[3]);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + slot);
    }
    // The item's sums: [warp][row][token] (lanes with t = 0 hold tokens 0 and 1), added in warp
    // order by warp 0. Two buffers alternate: a warp can be at most one item ahead of warp 0.
    float* item_sums = sums + (item_count & 1u) * kSumFloats;
    if (t == 0) {
      item_sums[warp * 32 + g * 2] = acc[0];
      item_sums[warp * 32 + g * 2 + 1] = acc[1];
      item_sums[warp * 32 + (g + 8) * 2] = acc[2];
      item_sums[warp * 32 + (g + 8) * 2 + 1] = acc[3];
    }
    consumer_sync();
    if (warp == 0) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) sum += item_sums[w * 32 + lane];
      const int64_t row = tile * kTileRows + lane / 2, tok = lane % 2;
      const bool stored = row < p.out && tok < p.n;
      if (p.splits == 1) {
        if (stored) p.y[tok * p.y_stride + row] = sum + (p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, row) : 0.0f);
      } else {
        if (stored) p.partial[(static_cast<int64_t>(split) * p.n + tok) * p.out + row] = sum;
        __threadfence();  // the slice's sums, visible before the count says they are there
        __syncwarp();
        unsigned last = 0;
        if (lane == 0) last = atomicAdd(p.counters + tile, 1u) == static_cast<unsigned>(p.splits - 1) ? 1u : 0u;
        last = __shfl_sync(0xffffffffu, last, 0);
        if (last != 0) {
          __threadfence();
          if (stored) {
            float total = 0.0f;
            for (int s = 0; s < p.splits; ++s) total += __ldcg(p.partial + (s * p.n + tok) * p.out + row);
            p.y[tok * p.y_stride + row] =
                total + (p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, row) : 0.0f);
          }
          if (lane == 0) p.counters[tile] = 0u;
        }
      }
    }
  }
#else
  pdl_wait();
  __trap();
#endif
}

size_t stream_shared_bytes(int64_t n, int64_t in, int stages = kStages) {
  return static_cast<size_t>(stream_x_offset(stages) + n * mma_i4_stage_stride(in) * 4);
}

template <int S>
cudaError_t launch_stream_stages(const StreamParams& p, int blocks, Stream stream) {
  const size_t shared = stream_shared_bytes(p.n, p.in, S);
  if (shared > kGemmInt4StreamMaxShared) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(gemm_i4_stream_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  return launch_pdl(gemm_i4_stream_kernel<S>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared, stream, p);
}

StreamParams stream_params(const LinearArgs& a, const Int4StreamPlan& plan, float* partial, unsigned* counters) {
  StreamParams p;
  GemvShape shape;  // the K split, as fill_common reads it
  shape.splits = plan.splits;
  shape.chunk = plan.chunk;
  fill_common(p, a, shape, partial);
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  p.scales = a.w_scales;
  p.zeros = a.w_zeros;
  p.counters = counters;
  p.items = plan.items;
  p.w_constant = a.w_constant;
  return p;
}

}  // namespace

bool gemm_int4_stream_supported(const LinearArgs& a, int compute_capability) {
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  return compute_capability / 10 == 9 && a.w_dtype == DType::kU8 && a.w_scales != nullptr && a.w_zeros != nullptr &&
         a.w_group == 128 && a.in % 512 == 0 && a.n >= 1 && a.n <= kGemmInt4StreamMaxTokens && a.out >= 1 &&
         a.w_stride % 16 == 0 && aligned16(a.w) && aligned16(a.w_scales) && aligned16(a.w_zeros) && aligned16(a.x) &&
         a.x_stride % 4 == 0 && stream_shared_bytes(a.n, a.in) <= kGemmInt4StreamMaxShared;
}

Int4StreamPlan plan_gemm_int4_stream(const LinearArgs& a, int sm_count) {
  // The K split that fills the SMs' waves best (a split only where it gains over 5 %), slices of
  // whole stages.
  const int64_t sms = std::max(sm_count, 1);
  const int64_t tiles = (a.out + kTileRows - 1) / kTileRows;
  const int64_t stages = (a.in + kStageCols - 1) / kStageCols;
  Int4StreamPlan best;
  double best_fill = 0.0;
  for (int64_t want = 1; want <= 4 && want <= stages; ++want) {
    const int64_t chunk = (stages + want - 1) / want * kStageCols;
    const int64_t splits = (a.in + chunk - 1) / chunk;
    if (splits > 1 && tiles > kSplitKCounters) break;
    const int64_t items = tiles * splits;
    const int64_t waves = (items + sms - 1) / sms;
    const double fill = static_cast<double>(items) / static_cast<double>(waves * sms);
    if (best.items == 0 || fill > best_fill * 1.05) {
      best.chunk = chunk;
      best.splits = static_cast<int>(splits);
      best.items = items;
      best_fill = fill;
    }
  }
  best.blocks = static_cast<int>(std::min<int64_t>(best.items, sms));
  return best;
}

cudaError_t launch_gemm_int4_stream(const LinearArgs& a, const Int4StreamPlan& plan, float* partial,
                                    unsigned* counters, Stream stream) {
  return launch_gemm_int4_stream_probe(a, plan, kStages, partial, counters, stream);
}

size_t gemm_int4_stream_shared_bytes(int64_t n, int64_t in, int stages) { return stream_shared_bytes(n, in, stages); }

cudaError_t launch_gemm_int4_stream_probe(const LinearArgs& a, const Int4StreamPlan& plan, int stages, float* partial,
                                          unsigned* counters, Stream stream) {
  if (plan.splits > 1 && (partial == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  const StreamParams p = stream_params(a, plan, partial, counters);
  switch (stages) {
    case 3:
      return launch_stream_stages<3>(p, plan.blocks, stream);
    case 4:
      return launch_stream_stages<4>(p, plan.blocks, stream);
    case 6:
      return launch_stream_stages<6>(p, plan.blocks, stream);
    case 8:
      return launch_stream_stages<8>(p, plan.blocks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tachyon::ops::cuda::detail
