// The launchers of cuda_ops.h other than linear: argument checks with the values in the message,
// then the kernel launch, its configuration error returned as a Status with file:line.
#include "ops/cuda/cuda_ops.h"

#include <algorithm>

#include "ops/cuda/host_util.h"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

Status check_rows(const char* op, const char* name, const void* data, const Rows& rows, const Rows& like) {
  TACHYON_CUDA_REQUIRE(rows.rows == like.rows && rows.cols == like.cols, "{}: {} has {} x {} rows, expected {} x {}",
                       op, name, rows.rows, rows.cols, like.rows, like.cols);
  TACHYON_CUDA_REQUIRE(rows.rows == 0 || data != nullptr, "{}: {} is null", op, name);
  TACHYON_CUDA_REQUIRE(rows.size1 >= 1 && rows.size2 >= 1 && rows.rows % (rows.size1 * rows.size2) == 0,
                       "{}: {} rows {} do not factor as [.., {}, {}]", op, name, rows.rows, rows.size1, rows.size2);
  return Status::Ok();
}

// A 16-bit copy of `like`'s rows (cuda_types.h Rows16), or none.
Status check_copy16(const char* op, const Rows16& copy, const Rows& like) {
  if (copy.data == nullptr) return Status::Ok();
  TACHYON_CUDA_REQUIRE((copy.dtype == DType::kBF16 || copy.dtype == DType::kF16) && copy.stride >= like.cols &&
                           (reinterpret_cast<uintptr_t>(copy.data) & 1u) == 0,
                       "{}: a 16-bit copy is f16/bf16 rows of at least {} elements (got {}, stride {})", op, like.cols,
                       dtype_name(copy.dtype), copy.stride);
  return Status::Ok();
}

bool is_quantized(DType d) { return d == DType::kI8 || d == DType::kF8E4M3; }

Status check_cache(const char* op, const KvCacheView& cache) {
  TACHYON_CUDA_REQUIRE(cache.k != nullptr && cache.v != nullptr, "{}: cache pointers are null", op);
  TACHYON_CUDA_REQUIRE(is_float(cache.dtype) || is_quantized(cache.dtype),
                       "{}: cache dtype {} is not f32/f16/bf16/i8/f8e4m3", op, dtype_name(cache.dtype));
  // The scales go with the codes: a quantized cache without them cannot be read, and scales on a
  // 16-bit cache mean the caller built the view from the wrong layer.
  if (is_quantized(cache.dtype)) {
    TACHYON_CUDA_REQUIRE(cache.k_scales != nullptr && cache.v_scales != nullptr,
                         "{}: a {} cache needs k_scales and v_scales (got {} and {})", op, dtype_name(cache.dtype),
                         static_cast<const void*>(cache.k_scales), static_cast<const void*>(cache.v_scales));
  } else {
    TACHYON_CUDA_REQUIRE(cache.k_scales == nullptr && cache.v_scales == nullptr,
                         "{}: a {} cache takes no scales (got k_scales {}, v_scales {})", op, dtype_name(cache.dtype),
                         static_cast<const void*>(cache.k_scales), static_cast<const void*>(cache.v_scales));
  }
  TACHYON_CUDA_REQUIRE(cache.num_blocks > 0 && cache.block_size > 0 && cache.num_kv_heads > 0 && cache.head_dim > 0,
                       "{}: cache [{}, {}, {}, {}]", op, cache.num_blocks, cache.block_size, cache.num_kv_heads,
                       cache.head_dim);
  return Status::Ok();
}

// Whether the tensor-core kernels of `algo` (kDecode or kPrefill) read this cache.
bool mma_supported(AttentionAlgo algo, const KvCacheView& cache) {
  // History blocks: the 16-bit pipelines decode them into their tiles; a quantized cache's
  // pipeline stages codes only, so it leaves them to the CUDA-core kernels.
  if (cache.history_bits != 0 && is_quantized(cache.dtype)) return false;
  return algo == AttentionAlgo::kDecode ? detail::mma_decode_supported(cache.dtype, cache.head_dim)
                                        : detail::mma_attention_supported(cache.dtype, cache.head_dim);
}

}  // namespace

Status rms_norm(const float* x, const Rows& x_rows, const void* weight, DType weight_dtype, float eps, float* y,
                const Rows& y_rows, Stream stream, const Rows16& copy16) {
  TACHYON_RETURN_IF_ERROR(check_rows("rms_norm", "x", x, x_rows, x_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("rms_norm", "y", y, y_rows, x_rows));
  TACHYON_CUDA_REQUIRE(weight != nullptr && is_float(weight_dtype), "rms_norm: weight {} ({})", weight,
                       dtype_name(weight_dtype));
  TACHYON_RETURN_IF_ERROR(check_copy16("rms_norm", copy16, x_rows));
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_rms_norm(x, x_rows, weight, weight_dtype, eps, y, y_rows, copy16, stream));
  return Status::Ok();
}

Status add_rms_norm(float* residual, const Rows& residual_rows, const float* x, const Rows& x_rows,
                    const void* weight, DType weight_dtype, float eps, float* y, const Rows& y_rows, Stream stream,
                    const Rows16& copy16) {
  TACHYON_RETURN_IF_ERROR(check_rows("add_rms_norm", "residual", residual, residual_rows, residual_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("add_rms_norm", "x", x, x_rows, residual_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("add_rms_norm", "y", y, y_rows, residual_rows));
  TACHYON_CUDA_REQUIRE(weight != nullptr && is_float(weight_dtype), "add_rms_norm: weight {} ({})", weight,
                       dtype_name(weight_dtype));
  TACHYON_RETURN_IF_ERROR(check_copy16("add_rms_norm", copy16, residual_rows));
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_add_rms_norm(residual, residual_rows, x, x_rows, weight, weight_dtype,
                                                           eps, y, y_rows, copy16, stream));
  return Status::Ok();
}

Status rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
            const int32_t* positions, const float* inv_freq, int rotary_dim, RopeStyle style, float attention_scale,
            Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && heads >= 0, "rope: n={} heads={}", n, heads);
  TACHYON_CUDA_REQUIRE(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
                       "rope: rotary_dim {} for head_dim {}", rotary_dim, head_dim);
  TACHYON_CUDA_REQUIRE(n == 0 || (x != nullptr && positions != nullptr && inv_freq != nullptr),
                       "rope: null pointer (x {}, positions {}, inv_freq {})", static_cast<void*>(x),
                       static_cast<const void*>(positions), static_cast<const void*>(inv_freq));
  log_path_once("cuda rope: {}", style == RopeStyle::kNeox ? "neox" : "interleaved");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_rope(x, n, heads, token_stride, head_stride, positions, inv_freq,
                                                   rotary_dim, style == RopeStyle::kInterleaved, attention_scale,
                                                   stream));
  return Status::Ok();
}

Status silu_mul(const float* gate, const Rows& gate_rows, const float* up, const Rows& up_rows, float* out,
                const Rows& out_rows, Stream stream, const Rows16& copy16) {
  TACHYON_RETURN_IF_ERROR(check_rows("silu_mul", "gate", gate, gate_rows, gate_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("silu_mul", "up", up, up_rows, gate_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("silu_mul", "out", out, out_rows, gate_rows));
  TACHYON_RETURN_IF_ERROR(check_copy16("silu_mul", copy16, gate_rows));
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_silu_mul(gate, gate_rows, up, up_rows, out, out_rows, copy16, stream));
  return Status::Ok();
}

Status add(float* y, const Rows& y_rows, const float* x, const Rows& x_rows, Stream stream) {
  TACHYON_RETURN_IF_ERROR(check_rows("add", "y", y, y_rows, y_rows));
  TACHYON_RETURN_IF_ERROR(check_rows("add", "x", x, x_rows, y_rows));
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_add(y, y_rows, x, x_rows, stream));
  return Status::Ok();
}

Status embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab, int64_t d,
                 const int32_t* ids, int64_t n, float* out, int64_t out_stride, Stream stream) {
  TACHYON_CUDA_REQUIRE(is_float(table_dtype), "embedding: table dtype {}", dtype_name(table_dtype));
  TACHYON_CUDA_REQUIRE(vocab > 0 && d > 0 && n >= 0 && table_stride >= d && out_stride >= d,
                       "embedding: vocab={} d={} n={} strides table {} out {}", vocab, d, n, table_stride, out_stride);
  TACHYON_CUDA_REQUIRE(n == 0 || (table != nullptr && ids != nullptr && out != nullptr), "embedding: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_embedding(table, table_dtype, table_stride, vocab, d, ids, n, out, out_stride, stream));
  return Status::Ok();
}

Status store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v, int64_t v_token_stride,
                int64_t v_head_stride, int64_t n, const int32_t* slot_mapping, const KvCacheView& cache,
                Stream stream) {
  TACHYON_RETURN_IF_ERROR(check_cache("store_kv", cache));
  TACHYON_CUDA_REQUIRE(n == 0 || (k != nullptr && v != nullptr && slot_mapping != nullptr), "store_kv: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_store_kv(k, k_token_stride, k_head_stride, v, v_token_stride,
                                                       v_head_stride, n, slot_mapping, cache, stream));
  return Status::Ok();
}

Status rope_store_kv(const RopeStoreArgs& a, const KvCacheView& cache, Stream stream) {
  TACHYON_RETURN_IF_ERROR(check_cache("rope_store_kv", cache));
  TACHYON_CUDA_REQUIRE(is_float(cache.dtype), "rope_store_kv: a {} cache takes rope and store_kv apart",
                       dtype_name(cache.dtype));
  TACHYON_CUDA_REQUIRE(a.n >= 0 && a.q_heads >= 0, "rope_store_kv: n={} q_heads={}", a.n, a.q_heads);
  TACHYON_CUDA_REQUIRE(a.rotary_dim > 0 && a.rotary_dim % 2 == 0 && a.rotary_dim <= cache.head_dim,
                       "rope_store_kv: rotary_dim {} for head_dim {}", a.rotary_dim, cache.head_dim);
  TACHYON_CUDA_REQUIRE(a.n == 0 || (a.q != nullptr && a.k != nullptr && a.v != nullptr && a.positions != nullptr &&
                                    a.inv_freq != nullptr && a.slot_mapping != nullptr),
                       "rope_store_kv: null pointer");
  log_path_once("cuda rope_store_kv: {}, one launch", a.interleaved ? "interleaved" : "neox");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_rope_store_kv(a, cache, stream));
  return Status::Ok();
}

std::string AttentionPlan::describe() const {
  switch (algo) {
    case AttentionAlgo::kDecode:
      return fmt::format("decode{}, {} split(s), {} bytes of workspace", tensor_cores ? " (tensor cores)" : "",
                         num_splits, workspace_bytes);
    case AttentionAlgo::kPrefill:
      return tensor_cores ? "prefill (tensor cores, tiled online softmax)" : "prefill (tiled online softmax)";
    default: return "auto";
  }
}

Status compress_kv_blocks(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache, Stream stream) {
  TACHYON_RETURN_IF_ERROR(check_cache("compress_kv_blocks", cache));
  TACHYON_CUDA_REQUIRE((cache.history_bits == 8 || cache.history_bits == 4) && cache.hk != nullptr &&
                           cache.hv != nullptr && cache.hk_params != nullptr && cache.hv_params != nullptr,
                       "compress_kv_blocks: history pools of {} bits", cache.history_bits);
  TACHYON_CUDA_REQUIRE(cache.head_dim % 4 == 0, "compress_kv_blocks: head_dim {} (a multiple of 4)", cache.head_dim);
  TACHYON_CUDA_REQUIRE(num_pairs == 0 || pairs != nullptr, "compress_kv_blocks: null pairs");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_compress_kv_blocks(pairs, num_pairs, cache, stream));
  TACHYON_CUDA_REQUIRE(cache.kbounds == nullptr || cache.head_dim <= detail::kDecodeMaxHeadDim,
                       "compress_kv_blocks: key bounds of head_dim {} (at most {})", cache.head_dim,
                       detail::kDecodeMaxHeadDim);
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_key_bounds(pairs, num_pairs, cache, stream));
  return Status::Ok();
}

size_t select_workspace_bytes(int num_seqs, int64_t num_kv_heads, int64_t cols) {
  return detail::select_workspace_bytes(num_seqs, num_kv_heads, cols);
}

Status select_kv_blocks(const float* q, int64_t q_token_stride, int64_t q_head_stride, int64_t num_heads,
                        const KvCacheView& cache, const AttentionBatch& batch, int32_t* tables, int32_t* lens,
                        void* workspace, size_t workspace_bytes, Stream stream) {
  TACHYON_RETURN_IF_ERROR(check_cache("select_kv_blocks", cache));
  TACHYON_CUDA_REQUIRE(cache.kbounds != nullptr && cache.kbound_params != nullptr && batch.sparse_budgets != nullptr,
                       "select_kv_blocks: needs key bounds and budgets");
  TACHYON_CUDA_REQUIRE(num_heads > 0 && num_heads % cache.num_kv_heads == 0 &&
                           num_heads / cache.num_kv_heads * cache.head_dim * 4 <= 48 * 1024,
                       "select_kv_blocks: {} heads over {} kv heads of head_dim {}", num_heads, cache.num_kv_heads,
                       cache.head_dim);
  TACHYON_CUDA_REQUIRE(workspace_bytes >= detail::select_workspace_bytes(batch.num_seqs, cache.num_kv_heads,
                                                                         batch.max_blocks_per_seq),
                       "select_kv_blocks: workspace of {} bytes", workspace_bytes);
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_select_kv_blocks(q, q_token_stride, q_head_stride, num_heads, cache, batch,
                                                               tables, lens, workspace, stream));
  return Status::Ok();
}

Result<AttentionPlan> plan_paged_attention(const AttentionBatch& batch, int64_t num_heads, const KvCacheView& cache,
                                           const AttentionParams& params, int sm_count, AttentionAlgo algo) {
  TACHYON_RETURN_IF_ERROR(check_cache("paged_attention", cache));
  TACHYON_CUDA_REQUIRE(num_heads > 0 && num_heads % cache.num_kv_heads == 0,
                       "paged_attention: {} heads is not a multiple of {} kv heads", num_heads, cache.num_kv_heads);
  TACHYON_CUDA_REQUIRE(cache.head_dim % 4 == 0 && cache.head_dim <= detail::kPrefillMaxHeadDim,
                       "paged_attention: head_dim {} (the CUDA kernels take multiples of 4 up to {})", cache.head_dim,
                       detail::kPrefillMaxHeadDim);
  TACHYON_CUDA_REQUIRE(params.sliding_window >= 0, "paged_attention: sliding_window {}", params.sliding_window);
  TACHYON_CUDA_REQUIRE(batch.num_seqs >= 0 && batch.max_query_len >= 0 && batch.max_context_len >= 0,
                       "paged_attention: {} sequences, max query {} / context {}", batch.num_seqs, batch.max_query_len,
                       batch.max_context_len);
  const int64_t group = num_heads / cache.num_kv_heads;
  const bool decode_fits =
      batch.max_query_len <= 1 && group <= detail::kDecodeMaxGroup && cache.head_dim <= detail::kDecodeMaxHeadDim;
  if (algo == AttentionAlgo::kAuto) {
    algo = decode_fits ? AttentionAlgo::kDecode : AttentionAlgo::kPrefill;
    if (!decode_fits && batch.max_query_len <= 1) {
      log_path_once("cuda paged_attention: {} query heads per KV head: decode batches run the prefill kernel", group);
    }
  }
  TACHYON_CUDA_REQUIRE(algo != AttentionAlgo::kDecode || decode_fits,
                       "paged_attention: the decode kernel takes one query per sequence (max {}) and at most {} query "
                       "heads per KV head (got {})",
                       batch.max_query_len, detail::kDecodeMaxGroup, group);
  AttentionPlan plan;
  plan.algo = algo;
  if (mma_supported(algo, cache)) {
    TACHYON_ASSIGN_OR_RETURN(const int cc, current_compute_capability());
    // History rows take 35 KB more shared memory (104 KB at head_dim 128): more than sm_86 / sm_89
    // give a block, so there the CUDA-core kernels read them.
    plan.tensor_cores = cc >= 80 && (cache.history_bits == 0 || cc == 80 || cc >= 90);
  }
  if (algo == AttentionAlgo::kDecode) {
    // CUDA cores: enough blocks for ~4 per SM, each slice at least 64 keys (2 tiles), at most 64
    // slices: at batch 1 and short contexts the kernel is latency-bound, and more, shorter slices
    // win. Tensor cores (3 blocks of 70 KB shared memory per SM, each slice pipelined over its
    // tiles): ~2 blocks per SM, and no split at all once the (sequence, KV head) pairs alone
    // give every SM one, which also saves the combine kernel (batch 32 of Llama-3-8B: 3 slices
    // took 19.4 + 7.2 us per layer under ncu), unless slices would exceed 1024 keys (long
    // contexts still stream faster split: 87 % of copy at batch 32 and 4k keys with 3 slices,
    // 74 % with one).
    int64_t keys = batch.max_context_len;
    if (params.sliding_window > 0) keys = std::min<int64_t>(keys, params.sliding_window);
    const int64_t blocks = std::max<int64_t>(1, static_cast<int64_t>(batch.num_seqs) * cache.num_kv_heads);
    const int64_t sms = std::max(sm_count, 1);
    const int64_t want = plan.tensor_cores ? std::max<int64_t>({1, sms * 2 / blocks, (keys + 1023) / 1024})
                                           : (sms * 4 + blocks - 1) / blocks;
    const int64_t by_length = std::max<int64_t>(1, (keys + 63) / 64);
    plan.num_splits = static_cast<int>(std::clamp<int64_t>(std::min(want, by_length), 1, detail::kDecodeMaxSplits));
    plan.workspace_bytes =
        detail::decode_workspace_floats(batch.num_seqs, num_heads, cache.head_dim, plan.num_splits) * sizeof(float);
  }
  return plan;
}

Status paged_attention(const AttentionPlan& plan, const float* q, int64_t q_token_stride, int64_t q_head_stride,
                       int64_t num_heads, const KvCacheView& cache, const AttentionBatch& batch,
                       const AttentionParams& params, float* out, int64_t out_token_stride, int64_t out_head_stride,
                       void* workspace, size_t workspace_bytes, Stream stream, const Rows16& out16) {
  TACHYON_RETURN_IF_ERROR(check_cache("paged_attention", cache));
  TACHYON_CUDA_REQUIRE(out16.data == nullptr ||
                           (plan.algo == AttentionAlgo::kDecode && out_head_stride == cache.head_dim &&
                            out16.stride >= num_heads * cache.head_dim && out16.stride % 4 == 0 &&
                            (reinterpret_cast<uintptr_t>(out16.data) & 7u) == 0 &&
                            (out16.dtype == DType::kBF16 || out16.dtype == DType::kF16)),
                       "paged_attention: a 16-bit copy of the output (rows {} apart, {}) needs a decode plan, heads "
                       "packed in out's rows (head stride {} for head_dim {}) and 8-byte aligned rows of {} values",
                       out16.stride, dtype_name(out16.dtype), out_head_stride, cache.head_dim,
                       num_heads * cache.head_dim);
  TACHYON_CUDA_REQUIRE(num_heads > 0 && num_heads % cache.num_kv_heads == 0,
                       "paged_attention: {} heads is not a multiple of {} kv heads", num_heads, cache.num_kv_heads);
  TACHYON_CUDA_REQUIRE(cache.head_dim % 4 == 0 && cache.head_dim <= detail::kPrefillMaxHeadDim,
                       "paged_attention: head_dim {}", cache.head_dim);
  TACHYON_CUDA_REQUIRE(workspace_bytes >= plan.workspace_bytes && (plan.workspace_bytes == 0 || workspace != nullptr),
                       "paged_attention: workspace of {} bytes, the plan needs {}", workspace_bytes,
                       plan.workspace_bytes);
  const uintptr_t cache_bits = reinterpret_cast<uintptr_t>(cache.k) | reinterpret_cast<uintptr_t>(cache.v) |
                               reinterpret_cast<uintptr_t>(workspace);
  TACHYON_CUDA_REQUIRE((cache_bits & 15u) == 0, "paged_attention: caches and workspace must be 16-byte aligned");
  const uintptr_t scale_bits = reinterpret_cast<uintptr_t>(cache.k_scales) | reinterpret_cast<uintptr_t>(cache.v_scales);
  TACHYON_CUDA_REQUIRE((scale_bits & 3u) == 0, "paged_attention: cache scales must be 4-byte aligned");
  TACHYON_CUDA_REQUIRE(!plan.tensor_cores || mma_supported(plan.algo, cache),
                       "paged_attention: the tensor-core kernels take f16/bf16/i8/f8e4m3 caches with head_dim 64 or "
                       "128 (got a {} {} cache, head_dim {}); plan with tensor_cores = false",
                       plan.algo == AttentionAlgo::kDecode ? "decode" : "prefill", dtype_name(cache.dtype),
                       cache.head_dim);
  if (batch.num_seqs == 0) return Status::Ok();
  TACHYON_CUDA_REQUIRE(q != nullptr && out != nullptr && batch.query_start != nullptr &&
                           batch.context_lens != nullptr && batch.block_tables != nullptr,
                       "paged_attention: null pointer");
  detail::AttentionQuery query;
  query.q = q;
  query.q_token_stride = q_token_stride;
  query.q_head_stride = q_head_stride;
  query.out = out;
  query.out_token_stride = out_token_stride;
  query.out_head_stride = out_head_stride;
  query.num_heads = num_heads;
  query.scale = params.scale;
  query.sliding_window = params.sliding_window;
  query.out16 = out16;
  if (plan.algo == AttentionAlgo::kDecode) {
    TACHYON_CUDA_REQUIRE(batch.max_query_len <= 1, "paged_attention: a decode plan for a batch with {}-row queries",
                         batch.max_query_len);
    TACHYON_CUDA_REQUIRE(plan.num_splits >= 1 && plan.num_splits <= detail::kDecodeMaxSplits,
                         "paged_attention: a decode plan of {} slices (1 to {})", plan.num_splits,
                         detail::kDecodeMaxSplits);
    log_path_once("cuda paged_attention: decode ({} cache{}, split-K, {})", dtype_name(cache.dtype),
                  cache.history_bits != 0 ? fmt::format(" with int{} history blocks", cache.history_bits) : "",
                  plan.tensor_cores ? "tensor cores" : "CUDA cores");
    TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_attention_decode(query, cache, batch, plan.num_splits,
                                                                 plan.tensor_cores, static_cast<float*>(workspace),
                                                                 stream));
  } else {
    log_path_once("cuda paged_attention: prefill ({} cache{}, tiled online softmax, {})", dtype_name(cache.dtype),
                  cache.history_bits != 0 ? fmt::format(" with int{} history blocks", cache.history_bits) : "",
                  plan.tensor_cores ? "tensor cores" : "CUDA cores");
    TACHYON_CUDA_RETURN_IF_ERROR(
        detail::launch_attention_prefill(query, cache, batch, plan.tensor_cores, stream));
  }
  return Status::Ok();
}

// ---- mixture of experts ------------------------------------------------------------------------------

Status moe_route(const float* logits, int64_t logits_stride, int64_t n, int64_t num_experts, int64_t k, bool normalize,
                 int32_t* ids, float* weights, Stream stream) {
  TACHYON_CUDA_REQUIRE(num_experts >= 1 && num_experts <= detail::kMoeMaxExperts && k >= 1 &&
                           k <= std::min<int64_t>(num_experts, detail::kMoeMaxExpertsPerTok) && n >= 0 &&
                           logits_stride >= num_experts,
                       "moe_route: {} tokens of {} experts (rows {} apart), {} chosen (1 to min(experts, {}); at most "
                       "{} experts)",
                       n, num_experts, logits_stride, k, detail::kMoeMaxExpertsPerTok, detail::kMoeMaxExperts);
  TACHYON_CUDA_REQUIRE(n == 0 || (logits != nullptr && ids != nullptr && weights != nullptr),
                       "moe_route: null pointer");
  log_path_once("cuda moe_route: one warp per token, {} rounds of a warp argmax", k);
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_moe_route(logits, logits_stride, n, static_cast<int>(num_experts),
                                                        static_cast<int>(k), normalize, ids, weights, stream));
  return Status::Ok();
}

size_t moe_workspace_bytes(int64_t n, int64_t k, int num_experts, int64_t hidden, int64_t inter) {
  return detail::moe_workspace_bytes(n, k, num_experts, hidden, inter);
}

namespace {

// One stacked projection [num_experts * rows, cols] of moe_experts in a format the kernels read.
Status check_moe_weight(const char* name, const MoeWeightView& w, DType format, int num_experts, int64_t rows,
                        int64_t cols) {
  TACHYON_CUDA_REQUIRE(w.w != nullptr, "moe_experts: {} is null", name);
  TACHYON_CUDA_REQUIRE(w.w_dtype == format, "moe_experts: {} is {}, gate is {} (one format for all three)", name,
                       dtype_name(w.w_dtype), dtype_name(format));
  switch (w.w_dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      TACHYON_CUDA_REQUIRE(w.w_stride >= cols, "moe_experts: {} rows {} apart for {} columns", name, w.w_stride, cols);
      return Status::Ok();
    case DType::kI8:
      TACHYON_CUDA_REQUIRE(w.w_stride >= cols && w.scales != nullptr,
                           "moe_experts: int8 {} needs scales and rows of {} columns (stride {})", name, cols,
                           w.w_stride);
      return Status::Ok();
    case DType::kU8:
      TACHYON_CUDA_REQUIRE(w.scales != nullptr && w.zeros != nullptr && w.w_stride >= cols / 2,
                           "moe_experts: int4 {} needs scales, zeros and rows of {} bytes (stride {})", name, cols / 2,
                           w.w_stride);
      if (w.group <= 0 || w.group % 32 != 0 || cols % w.group != 0 ||
          (reinterpret_cast<uintptr_t>(w.w) & 15u) != 0 || w.w_stride % 16 != 0) {
        return make_error(ErrorCode::kUnsupported,
                          "moe_experts: the CUDA kernels read int4 experts in groups of a multiple of 32 dividing the "
                          "{} columns, rows 16-byte aligned ({}: group {}, rows {} bytes apart)",
                          cols, name, w.group, w.w_stride);
      }
      return Status::Ok();
    default:
      return make_error(ErrorCode::kUnsupported,
                        "moe_experts: the CUDA kernels read f32/f16/bf16, int8 and int4 experts ({} is {}, {} experts "
                        "of {} rows)",
                        name, dtype_name(w.w_dtype), num_experts, rows);
  }
}

}  // namespace

Status moe_experts(const MoeArgs& a, void* workspace, size_t workspace_bytes, Stream stream) {
  TACHYON_CUDA_REQUIRE(a.num_experts >= 1 && a.num_experts <= detail::kMoeMaxExperts && a.k >= 1 &&
                           a.k <= detail::kMoeMaxExpertsPerTok && a.n >= 0 && a.hidden >= 1 && a.inter >= 1,
                       "moe_experts: {} tokens, {} of {} experts (at most {} of {}), hidden {}, inter {}", a.n, a.k,
                       a.num_experts, detail::kMoeMaxExpertsPerTok, detail::kMoeMaxExperts, a.hidden, a.inter);
  TACHYON_CUDA_REQUIRE(a.n * a.k <= (int64_t{1} << 30), "moe_experts: {} x {} slots", a.n, a.k);
  TACHYON_CUDA_REQUIRE(a.x_stride >= a.hidden && a.y_stride >= a.hidden, "moe_experts: rows x {} / y {} apart for {}",
                       a.x_stride, a.y_stride, a.hidden);
  TACHYON_RETURN_IF_ERROR(check_moe_weight("gate", a.gate, a.gate.w_dtype, a.num_experts, a.inter, a.hidden));
  TACHYON_RETURN_IF_ERROR(check_moe_weight("up", a.up, a.gate.w_dtype, a.num_experts, a.inter, a.hidden));
  TACHYON_RETURN_IF_ERROR(check_moe_weight("down", a.down, a.gate.w_dtype, a.num_experts, a.hidden, a.inter));
  // gate and up run in one kernel, which takes one group size for both.
  TACHYON_CUDA_REQUIRE(a.gate.group == a.up.group, "moe_experts: gate in groups of {}, up in groups of {}",
                       a.gate.group, a.up.group);
  if (a.n == 0) return Status::Ok();
  TACHYON_CUDA_REQUIRE(a.x != nullptr && a.ids != nullptr && a.weights != nullptr && a.y != nullptr,
                       "moe_experts: null pointer");
  const size_t need = detail::moe_workspace_bytes(a.n, a.k, a.num_experts, a.hidden, a.inter);
  TACHYON_CUDA_REQUIRE(workspace != nullptr && workspace_bytes >= need &&
                           (reinterpret_cast<uintptr_t>(workspace) & 15u) == 0,
                       "moe_experts: workspace of {} bytes, {} needed (16-byte aligned)", workspace_bytes, need);
  log_path_once("cuda moe_experts: grouped CUDA-core GEMV, {} experts",
                a.gate.w_dtype == DType::kU8  ? "int4"
                : a.gate.w_dtype == DType::kI8 ? "int8"
                                               : dtype_name(a.gate.w_dtype));
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_moe_experts(a, workspace, stream));
  return Status::Ok();
}

Status add_sigmoid_gated(float* y, int64_t y_stride, const float* x, int64_t x_stride, const float* gate,
                         int64_t gate_stride, int64_t n, int64_t d, Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && d >= 0 && y_stride >= d && x_stride >= d, "add_sigmoid_gated: [{}, {}], strides {} {}",
                       n, d, y_stride, x_stride);
  TACHYON_CUDA_REQUIRE(n == 0 || d == 0 || (y != nullptr && x != nullptr && gate != nullptr),
                       "add_sigmoid_gated: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_add_sigmoid_gated(y, y_stride, x, x_stride, gate, gate_stride, n, d, stream));
  return Status::Ok();
}

}  // namespace tachyon::ops::cuda
