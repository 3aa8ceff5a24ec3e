// The CUDA backend's host-callable API: device helpers (count, properties, allocation and copies
// with out-of-memory messages that give the sizes) and one launcher per op of ops/ops.h, taking
// raw device pointers, strides in elements, sizes and a stream. Launchers check their arguments,
// return Status (with the values and file:line of a failing CUDA call) and never synchronise:
// execution errors surface at the caller's next synchronize(). Nothing here knows about tensors,
// requests or schedulers; the backend (backend.cpp) unwraps Tensors into these calls.
//
// Numerics follow ops.h and ops/cpu/reference.h: f32 activations, f32 accumulation, f16/bf16
// stored with round-to-nearest-even. linear() has a GEMV for 1..16 tokens (exact f32 math on the
// stored weights) and cuBLASLt beyond (activations rounded to the weight's 16-bit type first);
// kAuto switches at kLinearAutoGemvMaxTokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "ops/cuda/cuda_types.h"
#include "ops/ops.h"

namespace tachyon::ops::cuda {

// ---- errors ------------------------------------------------------------------------------------

// A Status naming the failed expression, the CUDA error and where it happened; Ok for cudaSuccess.
Status cuda_status(cudaError_t error, const char* expression, const char* file, int line);

}  // namespace tachyon::ops::cuda

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define TACHYON_CUDA_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                                      \
    const cudaError_t tachyon_cuda_error_ = (expr);                                                         \
    if (tachyon_cuda_error_ != cudaSuccess)                                                                 \
      return ::tachyon::ops::cuda::cuda_status(tachyon_cuda_error_, #expr, __FILE__, __LINE__);             \
  } while (0)

namespace tachyon::ops::cuda {

// ---- devices -----------------------------------------------------------------------------------

// CUDA devices visible to this process; 0 when there is no device or no driver (never an error).
int device_count();

struct DeviceProperties {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;            // bytes
  size_t l2_cache_bytes = 0;
  size_t shared_memory_per_block = 0;  // the opt-in maximum
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;
  std::string to_string() const;  // "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
};
Result<DeviceProperties> device_properties(int device);
Status set_device(int device);
// The multiprocessor count of the current device (sizes split-K grids).
Result<int> current_sm_count();
// The current device's compute capability as major * 10 + minor (90 for sm_90).
Result<int> current_compute_capability();
// Programmatic dependent launch of the kernels that support it (sm_90+: a kernel's blocks are
// scheduled while the kernel before it finishes). On by default; TACHYON_PDL=0 in the environment
// starts with it off. Results are the same either way; this is for comparisons and tests.
void set_programmatic_launch(bool enabled);
bool programmatic_launch();

// ---- memory ------------------------------------------------------------------------------------

// cudaMalloc; on failure the message names `what`, the bytes asked for and the device's free and
// total memory.
Result<void*> device_malloc(size_t bytes, std::string_view what);
void device_free(void* ptr);  // null is a no-op; errors are logged, not returned (used in destructors)

// Owns one device allocation. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(size_t bytes, std::string_view what);
  ~DeviceBuffer() { device_free(data_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous host <-> device copies (they wait for the default stream); asynchronous on-device ops.
Status copy_to_device(void* device_dst, const void* host_src, size_t bytes);
Status copy_to_host(void* host_dst, const void* device_src, size_t bytes);
Status copy_on_device(void* device_dst, const void* device_src, size_t bytes, Stream stream);
Status memset_device(void* device_dst, int byte, size_t bytes, Stream stream);
// Waits for the stream (null: the whole device) and returns any error its work raised.
Status synchronize(Stream stream);

// Uniform [lo, hi) values from a counter-based generator, written as f32/f16/bf16: the same
// `seed` gives the same contents on any device.
Status fill_random(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi, Stream stream);

// offset + bound * u with u uniform in [-1, 1): element i from (seed, stream, i), the very values
// ops/cpu's fill_uniform draws (synthetic weights identical on the CPU and the GPU).
Status fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, uint64_t stream, float bound, float offset,
                    Stream cuda_stream);

// ids[r] = index of the largest value of row r of x[n, d] (f32, rows x_stride apart); the first of
// equal maxima; non-finite values count as -inf (never chosen unless the row has nothing else).
// logprobs (nullable): log_softmax of the row (finite values only) at that index.
// workspace (optional) of argmax_workspace_bytes(n, d) lets a few long rows spread over many
// blocks (the same results either way).
Status argmax(const float* x, int64_t x_stride, int64_t n, int64_t d, int32_t* ids, float* logprobs, Stream stream,
              void* workspace = nullptr, size_t workspace_bytes = 0);
size_t argmax_workspace_bytes(int64_t n, int64_t d);
// ops::top_tokens on device pointers: ids and probs [n, m] packed; workspace of
// top_tokens_workspace_bytes(n, d, m).
Status top_tokens(const float* x, int64_t x_stride, int64_t n, int64_t d, int m, int32_t* ids, float* probs,
                  void* workspace, size_t workspace_bytes, Stream stream);
size_t top_tokens_workspace_bytes(int64_t n, int64_t d, int m);
// ops::advance_decode on device pointers (block_tables [n, columns] packed).
Status advance_decode(const int32_t* next_ids, int32_t* token_ids, int32_t* positions, int32_t* context_lens,
                      const int32_t* block_tables, int64_t columns, int block_size, int32_t* slot_mapping, int64_t n,
                      Stream stream);

// ops::sample's contract (ops/ops.h) on device pointers: params [n, 6] f32 (temperature, min_p,
// u_hi, u_lo, top_k, top_p), ids [n] i32, logprobs [n] f32, probs (nullable) [n, d] f32 packed.
Status sample(const float* x, int64_t x_stride, int64_t n, int64_t d, const float* params, int32_t* ids,
              float* logprobs, Stream stream, float* probs = nullptr);
// ops::quantize_int8_rows on device pointers: w [out, in] (dtype f32/f16/bf16, rows w_stride
// apart) -> packed [out, in] i8 and scales [out] f32 (NaN marks a row with a non-finite weight).
Status quantize_int8_rows(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in, int8_t* packed,
                          float* scales, Stream stream);
// ops::quantize_int4_groups on device pointers: w [out, in] -> packed [out, in / 2] u8, scales and
// zeros [out, in / group] f32 (NaN scale: a group with a non-finite weight, or too wide for f16).
Status quantize_int4_groups(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in, int group,
                            bool f16_scales, uint8_t* packed, float* scales, float* zeros, Stream stream);
// ops::adjust_logits's contract on device pointers: x [n, d] f32 rows x_stride apart, edits [m, 5].
Status adjust_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const float* edits, int64_t m, Stream stream);
// ops::mask_logits's contract on device pointers: x [n, d] f32 rows x_stride apart, masks
// [m, ops::token_mask_columns(d)] i32.
Status mask_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const int32_t* masks, int64_t m, Stream stream);

// ---- mixture of experts (moe.cu) ------------------------------------------------------------------

// ops::moe_route on device pointers: logits [n, num_experts] f32 (rows logits_stride apart,
// num_experts <= 512), ids [n, k] i32 and weights [n, k] f32 packed, 1 <= k <= min(num_experts, 32).
Status moe_route(const float* logits, int64_t logits_stride, int64_t n, int64_t num_experts, int64_t k, bool normalize,
                 int32_t* ids, float* weights, Stream stream);
// ops::moe_experts on device pointers (cuda_types.h MoeArgs): experts dense f32/f16/bf16,
// per-channel int8 (kI8) or group-wise int4 (kU8: group a multiple of 32, 16-byte aligned rows),
// gate, up and down of one format; workspace of moe_workspace_bytes(). A grouped CUDA-core GEMV
// (moe.cu) that reads each chosen expert's rows once per group of its tokens and none of the other
// experts'; a token's sums do not depend on its batch (LinearMode::kBatchInvariant holds). An id
// outside [0, num_experts) is never read through: its token's row of y becomes NaN.
size_t moe_workspace_bytes(int64_t n, int64_t k, int num_experts, int64_t hidden, int64_t inter);
Status moe_experts(const MoeArgs& args, void* workspace, size_t workspace_bytes, Stream stream);
// y[t, :] += sigmoid(gate[t * gate_stride]) * x[t, :] for y and x [n, d] f32 (rows y_stride /
// x_stride apart).
Status add_sigmoid_gated(float* y, int64_t y_stride, const float* x, int64_t x_stride, const float* gate,
                         int64_t gate_stride, int64_t n, int64_t d, Stream stream);

// ---- the backend of ops.h ------------------------------------------------------------------------

// Starts the CUDA backend on `device` and registers it with ops (ops/backend.h) and core
// (core/device_memory.h): from then on Tensors can live on Device::cuda(device) and every op on
// them runs here, in order on one stream. Device memory comes from a stream-ordered pool
// (cudaMallocAsync) that keeps freed memory for reuse. Idempotent for the same device; another
// device while one runs is an error (one device per process).
Status start_backend(int device);

// ---- linear ------------------------------------------------------------------------------------

// kAuto runs the GEMV up to this many tokens and cuBLASLt beyond: on the H200 the GEMV streams a
// bf16 weight faster than cuBLASLt at one token, cuBLASLt wins from 8 (docs/perf.md).
constexpr int kLinearAutoGemvMaxTokens = 4;
// For int8 weights kAuto runs the GEMV up to this many tokens (it does twice the arithmetic per
// byte of the bf16 one and falls behind from 3-4 tokens), the tensor-core GEMM (int8 expanded to
// bf16 in registers) up to kGemmMmaMaxTokens, and beyond that expands the weight to bf16 in memory
// for cuBLASLt (docs/perf.md).
constexpr int kLinearAutoGemvMaxTokensInt8 = 2;
// For int4 weights (kInt4Group) kAuto runs the streamed GEMM (LinearAlgo::kStream) where it applies
// and is enabled (kInt4StreamByDefault), else the tensor-core GEMM (group 128) up to its limit
// (detail::kGemmMmaMaxTokensInt4), except on matrices of at most kLinearAutoGemvMaxRowsInt4 rows at
// up to kLinearAutoGemvMaxTokensInt4Small tokens, where the int4 GEMV is faster; the GEMV up to
// kLinearAutoGemvMaxTokensInt4 tokens where the GEMM does not apply (other group sizes); beyond
// either, the weight expanded to bf16 for cuBLASLt (docs/perf.md).
constexpr int kLinearAutoGemvMaxTokensInt4Small = 2;
constexpr int64_t kLinearAutoGemvMaxRowsInt4 = 2048;
constexpr int kLinearAutoGemvMaxTokensInt4 = 8;
// For per-channel fp8 weights kAuto runs the GEMV (f32 activations) up to this many tokens and
// beyond it cuBLASLt's fp8 GEMM with the activations quantized per token to e4m3 (sm_89+; the
// weight expanded to bf16 elsewhere): on the H200 the GEMV falls behind from 3-4 tokens while
// cuBLASLt's fp8 GEMM streams the weight at 34-67 % of copy at 32 (docs/perf.md).
constexpr int kLinearAutoGemvMaxTokensFp8 = 2;
// For W8A8 the dp4a GEMV up to this many tokens, then cuBLASLt's int8 GEMM (both exact).
constexpr int kLinearAutoGemvMaxTokensW8A8 = 4;
// For ternary weights the GEMV up to this many tokens (its add/subtract/skip work grows with the
// tokens while the 2-bit weight is read once: from 8 tokens expanding the weight to bf16 for
// cuBLASLt is faster on the H200, docs/perf.md), then the weight expanded.
constexpr int kLinearAutoGemvMaxTokensTernary = 4;
// For the GGUF block formats (q8_0, q4_1, q5_0, q5_1, iq4_nl, q4_k, q5_k, q6_k) kAuto runs their
// GEMV up to detail::kGemvGgufMaxTokens (8) tokens and beyond that expands the weight to bf16 for
// cuBLASLt; there is no tensor-core GEMM for them.

enum class LinearAlgo : uint8_t {
  kAuto,      // GEMV for n <= kLinearAutoGemvMaxTokens (int8: ...Int8), cuBLASLt beyond
  kGemv,      // the custom GEMV (any n up to 16)
  kMma,       // the tensor-core skinny GEMM (16-bit weights, in % 32 == 0, n up to 64, sm_80+;
              // activations converted to the weight's dtype). Not chosen by kAuto: on the H200 it
              // streams weights at 30-68 % of copy against cuBLASLt's 51-105 % (docs/perf.md)
  kCublasLt,  // cuBLASLt (activations converted to the weight's dtype; f32 weights: plain f32)
  kStream,    // int4 group-128 weights at 1..2 tokens on sm_90: the weight streamed through shared
              // memory by bulk copies (launch.h detail::gemm_int4_stream_supported); kAuto's pick
              // where it applies when kInt4StreamByDefault or TACHYON_INT4_STREAM=1
};
// Off until the streamed int4 GEMM has been checked and timed on a GPU (it has not yet been run on
// one); TACHYON_INT4_STREAM=1 turns it on for kAuto.
constexpr bool kInt4StreamByDefault = false;

// What linear() needs across calls: the cuBLASLt handle, its workspace, scratch for converted
// activations and split-K partial sums (grown on demand, each growth logged), and the cuBLASLt
// algorithms already chosen per shape. One per stream that runs linears; not thread-safe.
class LinearContext {
 public:
  static Result<std::unique_ptr<LinearContext>> create();
  ~LinearContext();
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;

  // Grows the scratch buffers for up to `max_tokens` x `max_in` activations (so that no
  // allocation happens later, e.g. during graph capture).
  Status reserve(int64_t max_tokens, int64_t max_in, int64_t max_out);
  // Counts the scratch reallocations so far (graphs captured before one point at freed memory).
  uint64_t generation() const;

  // The cuBLASLt and tensor-core paths of linear() multiply activations rounded to 16 bits, which
  // takes a pass over x of its own. A kernel that writes x (rms_norm, add_rms_norm, silu_mul) can
  // write that rounding as well (its copy16 argument): stage_activations() returns where to, for
  // x [n, in] f32 (rows x_stride apart) rounded to `dtype` (linear_activation_dtype), and notes it.
  // The next linear() call, and only that one, then reads the copy instead of converting x, if its
  // x, n, in and rounding are those noted (the same bits either way). Whoever changes x between
  // the producer and that call must forget_staged(); the CUDA backend forgets it on every op.
  Result<Rows16> stage_activations(const float* x, int64_t x_stride, int64_t n, int64_t in, DType dtype);
  void forget_staged();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit LinearContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

Status linear(LinearContext& context, const LinearArgs& args, Stream stream, LinearAlgo algo = LinearAlgo::kAuto);

// The 16-bit type (kBF16 / kF16) linear(kAuto) rounds args.x to before multiplying (cuBLASLt or
// the tensor-core GEMM), or kF32 where its kernel reads the f32 activations itself (the GEMVs,
// the streamed and decode int4 GEMMs, W8A8's and fp8's per-token quantization).
DType linear_activation_dtype(LinearContext& context, const LinearArgs& args);

// linear() with linear_fused's residual-add or SwiGLU epilogue inside the GEMV (launch.h
// detail::GemvFusion) for 16-bit, f32, per-channel int8 and fp8 weights at up to
// kLinearFusedMaxTokens tokens (where kAuto runs the plain GEMV), and SwiGLU inside the staged
// tensor-core GEMM for group-128 int4 weights at 1..2 tokens (where kAuto runs that GEMM);
// otherwise kUnsupported, having done nothing (the caller runs the separate ops). SwiGLU: args.out
// is the weight's rows (gate then up), y holds out / 2 columns.
constexpr int kLinearFusedMaxTokens = 1;
namespace detail {
struct GemvFusion;
}
Status linear_fused(LinearContext& context, const LinearArgs& args, const detail::GemvFusion& fusion, Stream stream);

// y[n, out] (f32, rows y_stride apart) = x[n, in] · w[out, in]^T with x and w bf16 (rows
// x_stride / w_stride apart), f32 accumulation, through cuBLASLt; bias f32 [out] or null.
Status gemm_bf16(LinearContext& context, const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride,
                 const float* bias, float* y, int64_t y_stride, int64_t n, int64_t in, int64_t out, Stream stream);

// ---- norms, rope, activations, embedding -----------------------------------------------------------

// y[r] = x[r] / rms(x[r]) * weight (weight [cols] f32/f16/bf16, packed). y may be x. copy16
// (rms_norm, add_rms_norm, silu_mul): y's rows also written rounded to 16 bits (LinearContext::
// stage_activations); none by default.
Status rms_norm(const float* x, const Rows& x_rows, const void* weight, DType weight_dtype, float eps, float* y,
                const Rows& y_rows, Stream stream,
                const Rows16& copy16 = {});
// residual[r] += x[r]; y[r] = rms_norm(residual[r]).
Status add_rms_norm(float* residual, const Rows& residual_rows, const float* x, const Rows& x_rows,
                    const void* weight, DType weight_dtype, float eps, float* y, const Rows& y_rows, Stream stream,
                const Rows16& copy16 = {});

// In place on x[n, heads, head_dim] (x[t, h, :] at x + t * token_stride + h * head_stride);
// positions [n] i32 and inv_freq [rotary_dim / 2] f32 on the device; the rest of RopeTable here.
Status rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
            const int32_t* positions, const float* inv_freq, int rotary_dim, RopeStyle style, float attention_scale,
            Stream stream);

// out = silu(gate) * up, row by row.
Status silu_mul(const float* gate, const Rows& gate_rows, const float* up, const Rows& up_rows, float* out,
                const Rows& out_rows, Stream stream,
                const Rows16& copy16 = {});

// y[r] += x[r], row by row.
Status add(float* y, const Rows& y_rows, const float* x, const Rows& x_rows, Stream stream);

// out[n, d] f32 (rows out_stride apart) = table[ids[n], :] (table [vocab, d] f32/f16/bf16, rows
// table_stride apart). ids [n] i32 on the device, checked by the caller; an id outside the table
// yields a NaN row.
Status embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab, int64_t d,
                 const int32_t* ids, int64_t n, float* out, int64_t out_stride, Stream stream);

// ---- paged KV cache and attention ------------------------------------------------------------------

// k/v[t, h, :] at k + t * k_token_stride + h * k_head_stride ([n, num_kv_heads, head_dim] f32)
// stored at slot_mapping[t] (i32, device; < 0: skip) of the cache: f32/f16/bf16 rounded to
// nearest even, i8/f8e4m3 as codes and one scale per (slot, kv head) row (ops.h KvLayer), bit for
// bit as the CPU reference stores them. A quantized cache needs k_scales and v_scales, the others
// none.
Status store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v, int64_t v_token_stride,
                int64_t v_head_stride, int64_t n, const int32_t* slot_mapping, const KvCacheView& cache,
                Stream stream);

// ops::compress_kv_blocks on device pointers: pairs [num_pairs, 2] i32 (primary block, history
// block); the cache must have history pools (history_bits 8 or 4).
Status compress_kv_blocks(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache, Stream stream);
// ops::select_kv_blocks on device pointers (batch.sparse_budgets set); workspace of
// select_workspace_bytes(num_seqs, num_kv_heads, batch.max_blocks_per_seq).
Status select_kv_blocks(const float* q, int64_t q_token_stride, int64_t q_head_stride, int64_t num_heads,
                        const KvCacheView& cache, const AttentionBatch& batch, int32_t* tables, int32_t* lens,
                        void* workspace, size_t workspace_bytes, Stream stream);
size_t select_workspace_bytes(int num_seqs, int64_t num_kv_heads, int64_t cols);

// rope (as above) on q and k, then store_kv of k and v, in one launch: the same bits as rope(q),
// rope(k), store_kv(k, v). f32/f16/bf16 caches only (a quantized one: the separate ops).
Status rope_store_kv(const RopeStoreArgs& args, const KvCacheView& cache, Stream stream);

enum class AttentionAlgo : uint8_t {
  kAuto,     // decode when every sequence has at most one query row, prefill otherwise
  kDecode,   // split-K over the context, GQA groups share each K/V read
  kPrefill,  // tiled online softmax over query tiles (any batch)
};

// How paged_attention runs one step's batch: planned once per step, reused by every layer.
struct AttentionPlan {
  AttentionAlgo algo = AttentionAlgo::kPrefill;
  int num_splits = 1;          // decode: slices of each context
  // The tensor-core kernels (sm_80+, head_dim 64 or 128, f16/bf16 caches and the quantized i8 /
  // f8e4m3 ones, those with bf16 queries and softmax weights): chosen by the planner where they
  // apply; false runs the CUDA-core kernels (any dtype and head_dim, a quantized cache read
  // exactly as code * scale), true where they do not apply is an error.
  bool tensor_cores = false;
  size_t workspace_bytes = 0;  // device scratch paged_attention needs (decode partials)
  std::string describe() const;
};
Result<AttentionPlan> plan_paged_attention(const AttentionBatch& batch, int64_t num_heads, const KvCacheView& cache,
                                           const AttentionParams& params, int sm_count,
                                           AttentionAlgo algo = AttentionAlgo::kAuto);

// out[n, num_heads, head_dim] = attention of q[n, num_heads, head_dim] (f32, device, any token
// and head strides) over the paged cache, with ops.h's semantics (AttentionMetadata, causal
// within the chunk, sliding window, GQA). `workspace` holds at least plan.workspace_bytes.
// out16 (decode plans, heads packed in out's rows): out again, each row num_heads * head_dim
// values rounded to 16 bits, out16.stride apart (LinearContext::stage_activations's rows).
Status paged_attention(const AttentionPlan& plan, const float* q, int64_t q_token_stride, int64_t q_head_stride,
                       int64_t num_heads, const KvCacheView& cache, const AttentionBatch& batch,
                       const AttentionParams& params, float* out, int64_t out_token_stride, int64_t out_head_stride,
                       void* workspace, size_t workspace_bytes, Stream stream, const Rows16& out16 = {});

}  // namespace tachyon::ops::cuda
