// Mixture-of-experts kernels (ops.h moe_route, moe_experts, add_sigmoid_gated).
//
// moe_experts runs as four launches on one stream, with no host synchronisation (so a decode step
// that holds it can be captured into a CUDA graph):
//   1. align: one block counts the n * k (token, choice) slots per expert, lays the experts'
//      rows out one after another, lists the experts that got a slot with their rows (active,
//      num_active) and maps every slot to its row, stably (slot order within an expert);
//   2. gate/up: a grouped GEMV over the active experts. Block (row tile, a) owns rows of expert
//      active[a]; each warp streams its gate rows and the matching up rows once per group of up
//      to NT_MAX of the expert's tokens (16-byte loads, up to two per row in flight; a second
//      group finds them in L2), and writes silu(gate) * up into row r of act [n * k, inter];
//   3. down: the same grouped GEMV over down's rows, act -> out [n * k, hidden];
//   4. combine: y[t] = sum_j weights[t, j] * out[row(t, j)], in j order.
// The grid of 2 and 3 is sized by min(E, n * k) experts (an upper bound of num_active): blocks
// past num_active return at once. Only the selected experts' weights are read.
//
// Numerics: f32 accumulation. A lane sums its columns of a row in column order and the warp adds
// its lanes in warp_sum()'s butterfly, whatever the token group size: each (token, expert) product
// is the same bits alone or in any batch (ops::LinearMode::kBatchInvariant holds for both modes).
// int8 rows are scaled once at the end, int4 blocks of 32 by their group's scale (the int4
// GEMV's form: (q - zero) exact, then scale * block sum); the reference dequantizes first, so
// the results agree within f32 rounding, not bit for bit.
//
// Measured (H100, CUDA graph replay, Qwen3-30B-A3B's experts: hidden 2048, inter 768, E 128, k 8;
// device copy 3.0 TB/s read + write): one token 35.8 us bf16 (2.1 TB/s of its 8 experts' 75 MB)
// and 23.8 us int4 (0.9 TB/s); 32 tokens 414 us bf16 (2.55 TB/s over 112 experts), 344 us int4.
// Of the one-token time, align and combine take several microseconds (under ncu 5.4 and 5.8 us
// at locked clocks); folding the align into the gate/up kernel for small batches is the next
// step there. Many tokens per expert (prefill) run on CUDA cores, far from the tensor-core rate.
//
// Must never: read a weight row of an expert no token chose, read out of bounds for an id outside
// [0, E) (such a slot gets no row; its token's y row becomes NaN), depend on timing for results,
// synchronise with the host or allocate.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gemv_store.cuh"  // flatten_sums
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

// ---- workspace ---------------------------------------------------------------------------------

constexpr size_t kAlign = 256;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// An expert with rows: its id and its rows [row_begin, row_end) of the permuted order.
struct alignas(16) ActiveExpert {
  int32_t expert, row_begin, row_end, unused;
};

// The pieces of the workspace, in this order.
struct MoeLayout {
  ActiveExpert* active = nullptr;   // [E]: the experts with rows, ascending; first num_active valid
  int32_t* num_active = nullptr;    // [1]
  int32_t* row_of = nullptr;        // [slots]: slot t * k + j -> its row (-1: id out of range)
  int32_t* token_of_row = nullptr;  // [slots]: row -> token
  float* act = nullptr;             // [slots, inter] silu(gate) * up, row order
  float* out = nullptr;             // [slots, hidden] down's output, row order
};

size_t layout_bytes(int64_t slots, int num_experts, int64_t hidden, int64_t inter, MoeLayout* layout, void* base) {
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += aligned(bytes);
    return static_cast<char*>(base) + here;
  };
  const size_t e = static_cast<size_t>(num_experts), s = static_cast<size_t>(slots);
  char* active = take(e * sizeof(ActiveExpert));
  char* num_active = take(sizeof(int32_t));
  char* row_of = take(s * sizeof(int32_t));
  char* token_of_row = take(s * sizeof(int32_t));
  char* act = take(s * static_cast<size_t>(inter) * sizeof(float));
  char* out = take(s * static_cast<size_t>(hidden) * sizeof(float));
  if (layout != nullptr) {
    layout->active = reinterpret_cast<ActiveExpert*>(active);
    layout->num_active = reinterpret_cast<int32_t*>(num_active);
    layout->row_of = reinterpret_cast<int32_t*>(row_of);
    layout->token_of_row = reinterpret_cast<int32_t*>(token_of_row);
    layout->act = reinterpret_cast<float*>(act);
    layout->out = reinterpret_cast<float*>(out);
  }
  return at;
}

// ---- align -------------------------------------------------------------------------------------
// One block of kAlignThreads threads (one per expert at most). Each warp owns a contiguous
// segment of the slots and counts it per expert into its own row of `cursor` [warps, E] (shared);
// one scan over the experts gives every expert's first row and its rank among the active ones,
// and turns each warp's counts into the first row its segment's slots of that expert take; then
// each warp walks its segment 32 slots at a time, ranking equal ids by lane (__match_any_sync).
// Segments in warp order and slots in order inside each: the permutation is stable.

constexpr int kAlignThreads = kMoeMaxExperts;
constexpr int kAlignWarps = kAlignThreads / 32;

// Exclusive prefix sum over the block (blockDim.x == kAlignThreads); `warp_totals` holds
// kAlignWarps values of shared memory.
__device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long v,
                                                                   unsigned long long* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const unsigned long long other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  unsigned long long before = 0;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  return before + inclusive - v;
}

__global__ void __launch_bounds__(kAlignThreads) moe_align_kernel(const int32_t* __restrict__ ids, int64_t slots,
                                                                 int k, int num_experts, MoeLayout layout,
                                                                 int64_t* expert_tokens) {
  extern __shared__ int32_t cursor[];  // [kAlignWarps, num_experts]
  __shared__ unsigned long long warp_totals[kAlignWarps];
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ne = num_experts;
  for (int i = threadIdx.x; i < kAlignWarps * ne; i += blockDim.x) cursor[i] = 0;
  __syncthreads();
  const int64_t segment = (slots + kAlignWarps - 1) / kAlignWarps;
  const int64_t s_begin = min64(slots, warp * segment), s_end = min64(slots, s_begin + segment);
  int32_t* mine = cursor + warp * ne;
  for (int64_t s = s_begin + lane; s < s_end; s += 32) {
    const int32_t id = ids[s];
    if (id >= 0 && id < ne) atomicAdd(mine + id, 1);
  }
  __syncthreads();
  // Thread e: expert e's total, first row and rank among the active experts (count in the high
  // word, "has rows" in the low one: one scan for both).
  const int e = threadIdx.x;
  int32_t total = 0;
  if (e < ne) {
    for (int w = 0; w < kAlignWarps; ++w) total += cursor[w * ne + e];
  }
  const unsigned long long packed = static_cast<unsigned long long>(total) << 32 | (total > 0 ? 1u : 0u);
  const unsigned long long before = block_exclusive_scan(packed, warp_totals);
  const int32_t first_row = static_cast<int32_t>(before >> 32);
  const int32_t rank = static_cast<int32_t>(before & 0xffffffffu);
  if (e < ne) {
    if (total > 0) layout.active[rank] = ActiveExpert{e, first_row, first_row + total, 0};
    int32_t next = first_row;
    for (int w = 0; w < kAlignWarps; ++w) {
      const int32_t c = cursor[w * ne + e];
      cursor[w * ne + e] = next;
      next += c;
    }
    if (e == ne - 1) *layout.num_active = rank + (total > 0 ? 1 : 0);
    if (expert_tokens != nullptr) {  // the counters of ops.h moe_experts
      auto* c = reinterpret_cast<unsigned long long*>(expert_tokens);
      if (total > 0) atomicAdd(c + e, static_cast<unsigned long long>(total));
      if (e == ne - 1) {
        atomicAdd(c + ne, static_cast<unsigned long long>(rank + (total > 0 ? 1 : 0)));
        atomicAdd(c + ne + 1, 1ull);
      }
    }
  }
  __syncthreads();
  const unsigned below = (1u << lane) - 1u;
  for (int64_t base = s_begin; base < s_end; base += 32) {
    const int64_t s = base + lane;
    const bool in = s < s_end;
    const int32_t id = in ? ids[s] : -1;
    const bool valid = in && id >= 0 && id < ne;
    const unsigned peers = __match_any_sync(kFullMask, valid ? id : -1);
    int32_t start = 0;
    if (valid) {
      start = mine[id];
      const int32_t row = start + __popc(peers & below);
      layout.row_of[s] = row;
      layout.token_of_row[row] = static_cast<int32_t>(s / k);
    } else if (in) {
      layout.row_of[s] = -1;
    }
    __syncwarp();
    if (valid && lane == __ffs(peers) - 1) mine[id] = start + __popc(peers);
    __syncwarp();
  }
}

// ---- grouped GEMV --------------------------------------------------------------------------------

enum class MoeWeight : uint8_t { kF32, kBF16, kF16, kI8, kInt4 };

// Per weight format: kCols weights per 16-byte load, decoded kChunk (4 or 8) at a time; chunk c
// of a load is columns [c * kChunk, (c + 1) * kChunk) of it. int4 values come out as q - zero
// (the group's scale applies to the block's sum); int8 as codes (the row's scale applies last).
template <MoeWeight F>
struct MoeFormat;

template <>
struct MoeFormat<MoeWeight::kF32> {
  static constexpr int kCols = 4, kChunk = 4, kBytes = 4;
  __device__ __forceinline__ static void decode(const uint4& raw, int, float, float (&f)[kChunk]) {
    Elem<DType::kF32>::unpack(raw, f);
  }
  __device__ __forceinline__ static float scalar(const uint8_t* row, int64_t col) {
    return __ldg(reinterpret_cast<const float*>(row) + col);
  }
};

template <>
struct MoeFormat<MoeWeight::kBF16> {
  static constexpr int kCols = 8, kChunk = 8, kBytes = 2;
  __device__ __forceinline__ static void decode(const uint4& raw, int, float, float (&f)[kChunk]) {
    Elem<DType::kBF16>::unpack(raw, f);
  }
  __device__ __forceinline__ static float scalar(const uint8_t* row, int64_t col) {
    return bf16_bits_to_f32(__ldg(reinterpret_cast<const unsigned short*>(row) + col));
  }
};

template <>
struct MoeFormat<MoeWeight::kF16> {
  static constexpr int kCols = 8, kChunk = 8, kBytes = 2;
  __device__ __forceinline__ static void decode(const uint4& raw, int, float, float (&f)[kChunk]) {
    Elem<DType::kF16>::unpack(raw, f);
  }
  __device__ __forceinline__ static float scalar(const uint8_t* row, int64_t col) {
    return f16_bits_to_f32(__ldg(reinterpret_cast<const unsigned short*>(row) + col));
  }
};

// Elem<kI8>'s trick: byte b ^ 0x80 in the mantissa of 2^23 is 2^23 + 128 + b.
template <>
struct MoeFormat<MoeWeight::kI8> {
  static constexpr int kCols = 16, kChunk = 8, kBytes = 1;
  __device__ __forceinline__ static void decode(const uint4& raw, int c, float, float (&f)[kChunk]) {
    const uint32_t lo = (c == 0 ? raw.x : raw.z) ^ 0x80808080u, hi = (c == 0 ? raw.y : raw.w) ^ 0x80808080u;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      f[b] = __uint_as_float(__byte_perm(lo, 0x4b000000u, 0x7540u | b)) - 8388736.0f;
      f[4 + b] = __uint_as_float(__byte_perm(hi, 0x4b000000u, 0x7540u | b)) - 8388736.0f;
    }
  }
  __device__ __forceinline__ static float scalar(const uint8_t* row, int64_t col) {
    return static_cast<float>(__ldg(reinterpret_cast<const signed char*>(row) + col));
  }
};

// A load is one block of 32 weights (byte j: weight j in the low nibble, j + 16 in the high one):
// chunk 0 = low nibbles of bytes 0-7, 1 = low of 8-15, 2 = high of 0-7, 3 = high of 8-15. A nibble
// q in the mantissa of 2^23 minus magic_zero = 2^23 + zero gives q - zero exactly (zeros are
// integers, quant/quantize.h).
template <>
struct MoeFormat<MoeWeight::kInt4> {
  static constexpr int kCols = 32, kChunk = 8, kBytes = 0;  // half a byte
  __device__ __forceinline__ static void decode(const uint4& raw, int c, float magic_zero, float (&f)[kChunk]) {
    uint32_t lo = (c & 1) ? raw.z : raw.x, hi = (c & 1) ? raw.w : raw.y;
    if (c >> 1) {
      lo >>= 4;
      hi >>= 4;
    }
    lo &= 0x0f0f0f0fu;
    hi &= 0x0f0f0f0fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      f[b] = __uint_as_float(__byte_perm(lo, 0x4b000000u, 0x7440u | b)) - magic_zero;
      f[4 + b] = __uint_as_float(__byte_perm(hi, 0x4b000000u, 0x7440u | b)) - magic_zero;
    }
  }
  __device__ __forceinline__ static float scalar(const uint8_t*, int64_t) { return 0.0f; }  // never: in % 32 == 0
};

template <MoeWeight F>
__device__ __forceinline__ int64_t byte_offset(int64_t col) {
  if constexpr (F == MoeWeight::kInt4) {
    return col / 2;
  } else {
    return col * MoeFormat<F>::kBytes;
  }
}

constexpr int kMoeThreads = 128;
constexpr int kMoeWarps = kMoeThreads / 32;
// Weight rows per warp (gate/up: half gate rows, half the up rows that pair with them): int4
// rows are short (half a byte per weight), so a warp takes twice as many, for as many bytes in
// flight per warp and fewer warps to schedule.
template <MoeWeight F>
constexpr int kRowsFor = F == MoeWeight::kInt4 ? 8 : 4;
// 16-byte loads in flight per row: two for few tokens; from 4 tokens a load feeds enough
// arithmetic (and the registers hold the tokens' sums instead).
template <int NT>
constexpr int kStepsFor = NT >= 4 ? 1 : 2;

// One weight row of a warp: its bytes, and for int8 its scale, for int4 its group scales and zeros.
struct RowRef {
  const uint8_t* w;
  const float* scales;  // int4: [groups] of this row
  const float* zeros;   // int4: [groups] of this row
  float scale;          // int8: the row's scale
};

struct MoeProjectParams {
  MoeWeightView w0, w1;  // gate and up (SwiGLU), or down (w0 alone)
  int64_t rows;          // outputs of one expert (inter, or hidden for down)
  int64_t in;            // columns of the weights
  int64_t vec_end;       // columns read by 16-byte loads: [0, vec_end); the rest one at a time
  const float* x;        // gate/up: x [n, in] rows x_stride apart, by token; down: act by row
  int64_t x_stride;
  bool gather;           // x row of row r: x[token_of_row[r]] (gate/up) or x[r] (down)
  bool x_vec;            // x rows 16-byte aligned
  float* y;              // [slots, rows] f32, by row
  const ActiveExpert* active;
  const int32_t* num_active;
  const int32_t* token_of_row;
};

// C consecutive values of an activation row (x_vec: x 16-byte aligned).
template <int C>
__device__ __forceinline__ void load_x(const float* x, bool x_vec, float (&xv)[C]) {
  if (x_vec) {
#pragma unroll
    for (int j = 0; j < C; j += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(x + j));
      xv[j] = q.x;
      xv[j + 1] = q.y;
      xv[j + 2] = q.z;
      xv[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < C; ++j) xv[j] = __ldg(x + j);
  }
}

// acc[r][t] += row r · x_t over the kCols columns of one load per row at column `col`.
template <MoeWeight F, int ROWS, int NT>
__device__ __forceinline__ void consume(const uint4 (&raw)[ROWS], const float (&scale)[ROWS],
                                        const float (&magic_zero)[ROWS], const float* const (&xs)[NT], bool x_vec,
                                        int64_t col, float (&acc)[ROWS][NT]) {
  using Fmt = MoeFormat<F>;
  constexpr int C = Fmt::kChunk;
  constexpr bool kInt4 = F == MoeWeight::kInt4;
  float block[ROWS][NT];  // int4: the block's sums before its scale
  if constexpr (kInt4) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) block[r][t] = 0.0f;
    }
  }
  // Few tokens: the chunk's x values first, then one row decoded at a time (fewer live registers
  // for the 32-weight int4 and 16-weight int8 loads); many tokens: the rows decoded first, each x
  // value then feeding every row. The same sums in the same order either way.
#pragma unroll
  for (int c = 0; c < Fmt::kCols / C; ++c) {
    if constexpr (NT <= 2) {
      float xv[NT][C];
#pragma unroll
      for (int t = 0; t < NT; ++t) load_x<C>(xs[t] + col + c * C, x_vec, xv[t]);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float wf[C];
        Fmt::decode(raw[r], c, magic_zero[r], wf);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
          for (int j = 0; j < C; ++j) {
            if constexpr (kInt4) {
              block[r][t] = fmaf(wf[j], xv[t][j], block[r][t]);
            } else {
              acc[r][t] = fmaf(wf[j], xv[t][j], acc[r][t]);
            }
          }
        }
      }
    } else {
      float wf[ROWS][C];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) Fmt::decode(raw[r], c, magic_zero[r], wf[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float xv[C];
        load_x<C>(xs[t] + col + c * C, x_vec, xv);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
          for (int j = 0; j < C; ++j) {
            if constexpr (kInt4) {
              block[r][t] = fmaf(wf[r][j], xv[j], block[r][t]);
            } else {
              acc[r][t] = fmaf(wf[r][j], xv[j], acc[r][t]);
            }
          }
        }
      }
    }
  }
  if constexpr (kInt4) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(scale[r], block[r][t], acc[r][t]);
    }
  } else {
    (void)scale;
  }
}

// Loads of the ROWS rows at column `col`, with their int4 group scales and zeros.
template <MoeWeight F, int ROWS>
__device__ __forceinline__ void load_step(const RowRef (&rows)[ROWS], int64_t col, int group, uint4 (&raw)[ROWS],
                                          float (&scale)[ROWS], float (&magic_zero)[ROWS]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) raw[r] = load_stream_16(rows[r].w + byte_offset<F>(col));
  if constexpr (F == MoeWeight::kInt4) {
    const int g = static_cast<int>(col) / group;  // 32-bit: in < 2^31
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      scale[r] = __ldg(rows[r].scales + g);
      magic_zero[r] = 8388608.0f + __ldg(rows[r].zeros + g);
    }
  } else {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) scale[r] = magic_zero[r] = 0.0f;
  }
}

// One group of NT rows of the permuted order, starting at `row0`: every weight row of the warp
// against the NT tokens' x rows, then the epilogue. No block-wide synchronisation.
template <MoeWeight F, bool SWIGLU, int ROWS, int NT>
__device__ __forceinline__ void project_group(const MoeProjectParams& p, const RowRef (&rows)[ROWS], int64_t first,
                                              int32_t row0, int group) {
  using Fmt = MoeFormat<F>;
  constexpr int V = Fmt::kCols;
  constexpr int64_t kStep = 32 * V;  // columns one warp covers with one load per lane
  const int lane = threadIdx.x & 31;
  constexpr int kSteps = kStepsFor<NT>;
  const float* xs[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int64_t xr = p.gather ? p.token_of_row[row0 + t] : row0 + t;
    xs[t] = p.x + xr * p.x_stride;
  }
  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  // Lanes may run different numbers of loads at the end (no shuffles until the epilogue).
  int64_t k = lane * V;
  for (; k + (kSteps - 1) * kStep < p.vec_end; k += kSteps * kStep) {
    uint4 raw[kSteps][ROWS];
    float scale[kSteps][ROWS], magic_zero[kSteps][ROWS];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) load_step<F, ROWS>(rows, k + u * kStep, group, raw[u], scale[u], magic_zero[u]);
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      consume<F, ROWS, NT>(raw[u], scale[u], magic_zero[u], xs, p.x_vec, k + u * kStep, acc);
    }
  }
  for (; k < p.vec_end; k += kStep) {
    uint4 raw[ROWS];
    float scale[ROWS], magic_zero[ROWS];
    load_step<F, ROWS>(rows, k, group, raw, scale, magic_zero);
    consume<F, ROWS, NT>(raw, scale, magic_zero, xs, p.x_vec, k, acc);
  }
  if constexpr (F != MoeWeight::kInt4) {
    for (int64_t c = p.vec_end + lane; c < p.in; c += 32) {
      float xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) xv[t] = __ldg(xs[t] + c);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float w = Fmt::scalar(rows[r].w, c);
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(w, xv[t], acc[r][t]);
      }
    }
  }
  // Value r * NT + t ends in lane r * NT + t (warp_transpose_sum: warp_sum()'s bits for any NT).
  constexpr int kValues = ROWS * NT;
  float part[kValues];
  flatten_sums<ROWS, NT>(acc, part);
  float v = warp_transpose_sum<kValues>(part);
  const int r = (lane % kValues) / NT, t = lane % NT;
  if constexpr (F == MoeWeight::kI8) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) s = i == r ? rows[i].scale : s;
    v *= s;
  }
  if constexpr (SWIGLU) {
    // Rows [0, ROWS / 2) are gate rows first, first + 1, ...; the rest the up rows that pair with them.
    constexpr int kHalf = ROWS / 2 * NT;
    const float up = __shfl_down_sync(kFullMask, v, kHalf);
    const int64_t row = first + r;
    if (lane < kHalf && row < p.rows) p.y[(row0 + t) * p.rows + row] = v / (1.0f + expf(-v)) * up;
  } else {
    const int64_t row = first + r;
    if (lane < kValues && row < p.rows) p.y[(row0 + t) * p.rows + row] = v;
  }
}

// Grid (row tiles, min(E, slots)); block (tile, a) runs expert active[a]'s rows of the tile for
// all of its tokens, NT_MAX at a time at most (the rest in groups of 4, 2, 1: a group's size
// changes no result, only how often the rows are streamed).
template <MoeWeight F, bool SWIGLU, int NT_MAX>
__global__ void __launch_bounds__(kMoeThreads) moe_project_kernel(const MoeProjectParams p) {
  pdl_wait();
  pdl_trigger();
  const int a = blockIdx.y;
  // Both loads at once (active[a] past num_active is stale, and unused): one round trip before
  // the weights.
  const int32_t num_active = *p.num_active;
  const ActiveExpert expert = p.active[a];
  if (a >= num_active) return;
  const int e = expert.expert;
  const int32_t r_begin = expert.row_begin, r_end = expert.row_end;
  const int warp = threadIdx.x >> 5;
  constexpr int kRows = kRowsFor<F>;
  constexpr int kRowsPerWarp = SWIGLU ? kRows / 2 : kRows;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kMoeWarps + warp) * kRowsPerWarp;
  if (first >= p.rows) return;
  const int group = p.w0.group;
  const int64_t groups = group > 0 ? p.in / group : 0;
  const size_t row_bytes = F == MoeWeight::kInt4 ? 1 : MoeFormat<F>::kBytes;  // per w_stride element
  RowRef rows[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const bool second = SWIGLU && i >= kRowsPerWarp;
    const MoeWeightView& w = second ? p.w1 : p.w0;
    // Clamped: rows past the expert's are read again, never stored.
    const int64_t local = min64(first + (second ? i - kRowsPerWarp : i), p.rows - 1);
    const int64_t row = static_cast<int64_t>(e) * p.rows + local;
    rows[i].w = static_cast<const uint8_t*>(w.w) + static_cast<size_t>(row * w.w_stride) * row_bytes;
    rows[i].scales = F == MoeWeight::kInt4 ? w.scales + row * groups : nullptr;
    rows[i].zeros = F == MoeWeight::kInt4 ? w.zeros + row * groups : nullptr;
    rows[i].scale = F == MoeWeight::kI8 ? __ldg(w.scales + row) : 1.0f;
  }
  int32_t r = r_begin;
  if constexpr (NT_MAX >= 8) {
    for (; r_end - r >= 8; r += 8) project_group<F, SWIGLU, kRows, 8>(p, rows, first, r, group);
  }
  if constexpr (NT_MAX >= 4) {
    for (; r_end - r >= 4; r += 4) project_group<F, SWIGLU, kRows, 4>(p, rows, first, r, group);
  }
  if constexpr (NT_MAX >= 2) {
    for (; r_end - r >= 2; r += 2) project_group<F, SWIGLU, kRows, 2>(p, rows, first, r, group);
  }
  for (; r < r_end; ++r) project_group<F, SWIGLU, kRows, 1>(p, rows, first, r, group);
}

// ---- combine -------------------------------------------------------------------------------------

// Grid (column blocks, tokens with a grid-stride): y[t, c] = sum_j weights[t, j] * out[row, c],
// j in order (the first product alone, then fused multiply-adds); a slot without a row (id out of
// range) makes the value NaN. The token's rows and weights go to shared memory first, so that a
// thread's k loads of out are independent of each other (all in flight at once).
__global__ void moe_combine_kernel(const float* __restrict__ out, int64_t hidden, const int32_t* __restrict__ row_of,
                                   const float* __restrict__ weights, int k, float* __restrict__ y, int64_t y_stride,
                                   int64_t n, bool vec) {
  __shared__ int32_t rows[kMoeMaxExpertsPerTok];
  __shared__ float w[kMoeMaxExpertsPerTok];
  pdl_wait();
  pdl_trigger();
  const float nan = __int_as_float(0x7fc00000);
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    __syncthreads();  // the previous token's rows are read
    if (threadIdx.x < k) {
      rows[threadIdx.x] = row_of[t * k + threadIdx.x];
      w[threadIdx.x] = weights[t * k + threadIdx.x];
    }
    __syncthreads();
    float* yt = y + t * y_stride;
    if (vec) {
      for (int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4; c < hidden;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int j = 0; j < k; ++j) {
          const int32_t row = rows[j];
          const float4 o = row >= 0 ? *reinterpret_cast<const float4*>(out + row * hidden + c)
                                    : make_float4(nan, nan, nan, nan);
          const float wj = w[j];
          if (j == 0) {
            acc = make_float4(wj * o.x, wj * o.y, wj * o.z, wj * o.w);
          } else {
            acc = make_float4(fmaf(wj, o.x, acc.x), fmaf(wj, o.y, acc.y), fmaf(wj, o.z, acc.z), fmaf(wj, o.w, acc.w));
          }
        }
        *reinterpret_cast<float4*>(yt + c) = acc;
      }
    } else {
      for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < hidden;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int j = 0; j < k; ++j) {
          const int32_t row = rows[j];
          const float o = row >= 0 ? out[row * hidden + c] : nan;
          acc = j == 0 ? w[j] * o : fmaf(w[j], o, acc);
        }
        yt[c] = acc;
      }
    }
  }
}

// ---- router --------------------------------------------------------------------------------------

constexpr int kRouteWarps = 4;
constexpr int kRoutePerLane = kMoeMaxExperts / 32;

// Whether (a, ia) ranks above (b, ib): the larger value, a number above NaN, the lower id on ties.
__device__ __forceinline__ bool ranks_above(float a, int ia, float b, int ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

// One warp per token: lane l holds experts l, l + 32, ...; k rounds of a warp argmax (each lane's
// best untaken expert, then a butterfly that leaves the same winner in every lane); lane j keeps
// the j-th chosen expert and its probability.
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(const float* __restrict__ logits,
                                                                    int64_t logits_stride, int64_t n, int num_experts,
                                                                    int k, bool normalize, int32_t* __restrict__ ids,
                                                                    float* __restrict__ weights) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + (threadIdx.x >> 5);
  if (t >= n) return;
  const float* row = logits + t * logits_stride;
  const float nan = __int_as_float(0x7fc00000);
  float v[kRoutePerLane];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int id = i * 32 + lane;
    v[i] = id < num_experts ? row[id] : nan;
    if (id < num_experts && v[i] == v[i]) m = fmaxf(m, v[i]);
  }
  m = warp_max(m);
  float sum = 0.0f;  // a NaN logit makes it NaN, as in the reference
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    if (i * 32 + lane < num_experts) sum += expf(v[i] - m);
  }
  sum = warp_sum(sum);
  unsigned taken = 0;  // bit i: expert i * 32 + lane chosen
  int32_t my_id = 0;
  float my_p = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = nan;
    int best_id = 0x7fffffff;  // below every expert
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int id = i * 32 + lane;
      if (id < num_experts && !(taken >> i & 1u) && ranks_above(v[i], id, best, best_id)) {
        best = v[i];
        best_id = id;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int other_id = __shfl_xor_sync(kFullMask, best_id, offset);
      if (ranks_above(other, other_id, best, best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    if ((best_id & 31) == lane) taken |= 1u << (best_id >> 5);
    if (lane == j) {
      my_id = best_id;
      my_p = expf(best - m);
    }
  }
  const float chosen = warp_sum(lane < k ? my_p : 0.0f);
  if (lane < k) {
    ids[t * k + lane] = my_id;
    weights[t * k + lane] = my_p / (normalize ? chosen : sum);
  }
}

// ---- add_sigmoid_gated ---------------------------------------------------------------------------

// Grid (column blocks, rows with a grid-stride).
__global__ void add_sigmoid_gated_kernel(float* __restrict__ y, int64_t y_stride, const float* __restrict__ x,
                                         int64_t x_stride, const float* __restrict__ gate, int64_t gate_stride,
                                         int64_t n, int64_t d) {
  pdl_wait();
  pdl_trigger();
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float s = 1.0f / (1.0f + expf(-gate[t * gate_stride]));
    float* yt = y + t * y_stride;
    const float* xt = x + t * x_stride;
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < d;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      yt[c] = fmaf(s, xt[c], yt[c]);
    }
  }
}

// ---- launchers -----------------------------------------------------------------------------------

MoeWeight moe_weight_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MoeWeight::kF32;
    case DType::kF16: return MoeWeight::kF16;
    case DType::kI8: return MoeWeight::kI8;
    case DType::kU8: return MoeWeight::kInt4;
    default: return MoeWeight::kBF16;
  }
}

// Columns of one load per lane, and the bytes of one w_stride step.
int cols_per_load(MoeWeight f) {
  switch (f) {
    case MoeWeight::kF32: return 4;
    case MoeWeight::kI8: return 16;
    case MoeWeight::kInt4: return 32;
    default: return 8;
  }
}
int64_t bytes_per_element(MoeWeight f) {
  switch (f) {
    case MoeWeight::kF32: return 4;
    case MoeWeight::kBF16:
    case MoeWeight::kF16: return 2;
    default: return 1;
  }
}

// Whether every row of the view starts 16-byte aligned (16-byte loads apply).
bool rows_aligned(const MoeWeightView& w, MoeWeight f) {
  return (reinterpret_cast<uintptr_t>(w.w) & 15u) == 0 && (w.w_stride * bytes_per_element(f)) % 16 == 0;
}

template <MoeWeight F, bool SWIGLU>
cudaError_t launch_project(const MoeProjectParams& p, unsigned experts, int nt_max, Stream stream) {
  constexpr int kRowsPerWarp = SWIGLU ? kRowsFor<F> / 2 : kRowsFor<F>;
  constexpr int64_t kRowsPerBlock = static_cast<int64_t>(kMoeWarps) * kRowsPerWarp;
  const dim3 grid(static_cast<unsigned>((p.rows + kRowsPerBlock - 1) / kRowsPerBlock), experts);
  // int4 holds each block's sums apart from the totals: eight tokens' worth spills.
  if constexpr (F != MoeWeight::kInt4) {
    if (nt_max >= 8) return launch_pdl(moe_project_kernel<F, SWIGLU, 8>, grid, kMoeThreads, 0, stream, p);
  }
  if (nt_max >= 4) return launch_pdl(moe_project_kernel<F, SWIGLU, 4>, grid, kMoeThreads, 0, stream, p);
  return launch_pdl(moe_project_kernel<F, SWIGLU, 1>, grid, kMoeThreads, 0, stream, p);
}

template <bool SWIGLU>
cudaError_t launch_project_format(const MoeProjectParams& p, MoeWeight f, unsigned experts, int nt_max,
                                  Stream stream) {
  switch (f) {
    case MoeWeight::kF32: return launch_project<MoeWeight::kF32, SWIGLU>(p, experts, nt_max, stream);
    case MoeWeight::kF16: return launch_project<MoeWeight::kF16, SWIGLU>(p, experts, nt_max, stream);
    case MoeWeight::kI8: return launch_project<MoeWeight::kI8, SWIGLU>(p, experts, nt_max, stream);
    case MoeWeight::kInt4: return launch_project<MoeWeight::kInt4, SWIGLU>(p, experts, nt_max, stream);
    default: return launch_project<MoeWeight::kBF16, SWIGLU>(p, experts, nt_max, stream);
  }
}

}  // namespace

size_t moe_workspace_bytes(int64_t n, int64_t k, int num_experts, int64_t hidden, int64_t inter) {
  return layout_bytes(n * k, num_experts, hidden, inter, nullptr, nullptr);
}

cudaError_t launch_moe_experts(const MoeArgs& a, void* workspace, Stream stream) {
  const int64_t slots = a.n * a.k;
  if (slots == 0) return cudaSuccess;
  if (slots > 0x7fffffff / 2 || a.num_experts < 1 || a.num_experts > kMoeMaxExperts) return cudaErrorInvalidValue;
  MoeLayout layout;
  layout_bytes(slots, a.num_experts, a.hidden, a.inter, &layout, workspace);

  const size_t align_shared = static_cast<size_t>(kAlignWarps) * a.num_experts * sizeof(int32_t);
  cudaError_t e = launch_pdl(moe_align_kernel, 1, kAlignThreads, align_shared, stream, a.ids, slots,
                             static_cast<int>(a.k), a.num_experts, layout, a.expert_tokens);
  if (e != cudaSuccess) return e;

  // At most min(E, slots) experts have rows; the tokens an active expert gets on average choose
  // the group size the kernels are built for (it changes no result).
  const int64_t experts = std::min<int64_t>(a.num_experts, slots);
  const int64_t per_expert = (slots + experts - 1) / experts;
  const int nt_max = per_expert <= 1 ? 1 : per_expert <= 4 ? 4 : 8;
  const MoeWeight f = moe_weight_of(a.gate.w_dtype);
  const int64_t v = cols_per_load(f);

  MoeProjectParams up;
  up.w0 = a.gate;
  up.w1 = a.up;
  up.rows = a.inter;
  up.in = a.hidden;
  up.vec_end = rows_aligned(a.gate, f) && rows_aligned(a.up, f) ? a.hidden / v * v : 0;
  up.x = a.x;
  up.x_stride = a.x_stride;
  up.gather = true;
  up.x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.x_stride % 4 == 0;
  up.y = layout.act;
  up.active = layout.active;
  up.num_active = layout.num_active;
  up.token_of_row = layout.token_of_row;
  e = launch_project_format<true>(up, f, static_cast<unsigned>(experts), nt_max, stream);
  if (e != cudaSuccess) return e;

  MoeProjectParams down = up;
  down.w0 = a.down;
  down.w1 = a.down;
  down.rows = a.hidden;
  down.in = a.inter;
  down.vec_end = rows_aligned(a.down, f) ? a.inter / v * v : 0;
  down.x = layout.act;
  down.x_stride = a.inter;
  down.gather = false;
  down.x_vec = a.inter % 4 == 0;
  down.y = layout.out;
  e = launch_project_format<false>(down, f, static_cast<unsigned>(experts), nt_max, stream);
  if (e != cudaSuccess) return e;

  const bool vec = a.hidden % 4 == 0 && (reinterpret_cast<uintptr_t>(a.y) & 15u) == 0 && a.y_stride % 4 == 0;
  const int threads = 256;
  const int64_t per_block = threads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((a.hidden + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min<int64_t>(a.n, 65535)));
  return launch_pdl(moe_combine_kernel, grid, threads, 0, stream, layout.out, a.hidden, layout.row_of, a.weights,
                    static_cast<int>(a.k), a.y, a.y_stride, a.n, vec);
}

cudaError_t launch_moe_route(const float* logits, int64_t logits_stride, int64_t n, int num_experts, int k,
                             bool normalize, int32_t* ids, float* weights, Stream stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kRouteWarps - 1) / kRouteWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_pdl(moe_route_kernel, static_cast<unsigned>(blocks), kRouteWarps * 32, 0, stream, logits,
                    logits_stride, n, num_experts, k, normalize, ids, weights);
}

cudaError_t launch_add_sigmoid_gated(float* y, int64_t y_stride, const float* x, int64_t x_stride, const float* gate,
                                     int64_t gate_stride, int64_t n, int64_t d, Stream stream) {
  if (n == 0 || d == 0) return cudaSuccess;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((d + threads - 1) / threads, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  return launch_pdl(add_sigmoid_gated_kernel, grid, threads, 0, stream, y, y_stride, x, x_stride, gate, gate_stride,
                    n, d);
}

}  // namespace tachyon::ops::cuda::detail
