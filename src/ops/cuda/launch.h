// The kernel launchers of the .cu files: raw pointers, strides and sizes in, the launch's
// cudaError_t out (configuration errors; execution errors surface at the next synchronisation).
// Internal to ops/cuda: cuda_ops.cpp checks arguments, turns errors into Status with file:line,
// and is the only caller. Nothing here includes fmt (nvcc cannot parse it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/cuda_types.h"

namespace tachyon::ops::cuda::detail {

// Whether launch_pdl() (pdl.cuh) asks for programmatic dependent launch: the current device is
// sm_90+ and set_programmatic_launch (cuda_ops.h) has not turned it off.
bool pdl_enabled();

// ---- linear (linear_gemv.cu) -------------------------------------------------------------------

constexpr int kGemvMaxTokens = 16;
constexpr int kGemvThreads = 128;  // 4 warps per block

// How the GEMV covers a problem: `splits` slices of the K dimension of `chunk` elements each (a
// multiple of the vector step, so every slice starts 16-byte aligned); with splits > 1 the slices'
// sums go to `partial` [splits, n, out] f32 and a second kernel adds them (and the bias) in a
// fixed order, so results do not depend on timing.
struct GemvShape {
  int splits = 1;
  int64_t chunk = 0;
  bool vector_loads = false;  // 16-byte loads (w, x rows 16-byte aligned); else scalar loads
  int rows_per_warp = 1;
  int64_t step = 0;  // elements one warp covers with one 16-byte load per lane
};
GemvShape plan_gemv(const LinearArgs& a, int sm_count);

// What every GEMV / skinny-GEMM launcher copies into its kernel's parameters from LinearArgs and
// the plan: the weight's row stride, bias, output, sizes, K split and split-K scratch (P: a
// parameter struct with fields of these names). The operands each launcher sets itself.
template <typename P, typename Partial>
inline void fill_common(P& p, const LinearArgs& a, const GemvShape& shape, Partial* partial) {
  p.w_stride = a.w_stride;
  p.bias = a.bias;
  p.bias_dtype = a.bias_dtype;
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.partial = partial;
  p.n = a.n;
  p.in = a.in;
  p.out = a.out;
  p.chunk = shape.chunk;
  p.splits = shape.splits;
}

// The K split the streaming GEMVs share: enough warps for ~warps_per_sm per SM given `row_warps`
// warps of rows, at most 32 slices, each at least `min_chunk` columns (one full unrolled
// iteration) and a multiple of `step` (so every slice starts on a vector boundary). Callers pass
// the one-token tile's row_warps and min_chunk whatever n is: the same slices, so the same
// summation order for a token alone or in any batch (LinearMode::kBatchInvariant relies on it).
// Sets chunk, splits.
inline void plan_k_splits(GemvShape& s, int64_t in, int64_t row_warps, int64_t min_chunk, int64_t step,
                          int sm_count, int64_t warps_per_sm = 32) {
  const int64_t target_warps = static_cast<int64_t>(sm_count > 1 ? sm_count : 1) * warps_per_sm;
  int64_t max_splits = in / min_chunk;
  max_splits = max_splits < 1 ? 1 : (max_splits > 32 ? 32 : max_splits);
  int64_t want = target_warps / (row_warps > 1 ? row_warps : 1);
  want = want < 1 ? 1 : (want > max_splits ? max_splits : want);
  const int64_t chunk = ((in + want - 1) / want + step - 1) / step * step;
  s.chunk = chunk > step ? chunk : step;
  s.splits = static_cast<int>((in + s.chunk - 1) / s.chunk);
}
cudaError_t launch_gemv(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream);

// The GEMV with linear_fused's epilogue (ops.h LinearFusion): the same plan, K split and per-row
// summation order as launch_gemv, so the same bits as the separate ops. SwiGLU pairs each warp's
// gate rows with their up rows.
enum class GemvEpilogue : uint8_t {
  kStore,   // y = the result
  kAdd,     // y += the result
  kSwiGLU,  // w's rows are gate then up (out even): y[:, j] = silu(gate_j) * up_j, j < out / 2
};
struct GemvFusion {
  GemvEpilogue epilogue = GemvEpilogue::kStore;
};
bool gemv_fused_supported(const LinearArgs& a, const GemvFusion& fusion);
cudaError_t launch_gemv_fused(const LinearArgs& a, const GemvFusion& fusion, const GemvShape& shape, float* partial,
                              Stream stream);

// The tensor-core skinny GEMM: y = x16 · w^T for 1..kGemmMmaMaxTokens tokens, x16 the activations
// already rounded to the weight's 16-bit type ([n, x_stride], 16-byte aligned rows); same split-K
// contract as the GEMV (partial [splits, n, out] when shape.splits > 1). Needs sm_80+.
constexpr int kGemmMmaMaxTokens = 64;
bool gemm_mma_supported(const LinearArgs& a, int64_t x_stride);
GemvShape plan_gemm_mma(const LinearArgs& a, int sm_count);
cudaError_t launch_gemm_mma(const LinearArgs& a, const void* x16, int64_t x_stride, const GemvShape& shape,
                            float* partial, Stream stream);

// For tachyon_cuda_bench only: the one-token bf16 GEMV (no K split, plain store) with another
// tile (rows per warp, loads in flight, warps per block), to compare against the one it keeps.
int gemv_probe_variants();
const char* gemv_probe_name(int variant);
cudaError_t launch_gemv_probe(const LinearArgs& a, int variant, Stream stream);

// y[t, o] = sum over splits of partial[s, t, o] (in split order) (* scales[o]) + bias[o].
cudaError_t launch_gemv_reduce(const float* partial, int splits, int64_t n, int64_t out, const void* bias,
                               DType bias_dtype, const float* scales, float* y, int64_t y_stride, Stream stream);

// The int4 GEMV (linear_int4.cu): LinearArgs with u8 (kInt4Group) weights, 1..kGemvInt4MaxTokens
// tokens, the group a multiple of 32 dividing in, 16-byte aligned weight rows. Same split-K
// contract as the GEMV.
constexpr int kGemvInt4MaxTokens = 8;
bool gemv_int4_supported(const LinearArgs& a);
GemvShape plan_gemv_int4(const LinearArgs& a, int sm_count);
cudaError_t launch_gemv_int4(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream);
// The int4 tensor-core GEMM (linear_int4.cu): group 128 only, 1..kGemmMmaMaxTokensInt4 tokens, x16
// the activations rounded to bf16, or null to read a.x (f32) and round it in the kernel where
// gemm_mma_int4_stages_x (up to kGemmMmaInt4StageMaxTokens tokens, 16-byte aligned rows, a K slice
// that fits shared memory). Same split-K contract, except that there, given `counters` (kSplitKCounters zeros, one
// per block column; left zero), the kernel adds the slices up itself. Needs sm_80+.
constexpr int kGemmMmaMaxTokensInt4 = 32;
// Staging the activations pays at 1-2 tokens; from 4 the block's staging loop costs more than the
// conversion pass (H200, docs/perf.md 2026-12-02).
constexpr int kGemmMmaInt4StageMaxTokens = 2;
bool gemm_mma_int4_supported(const LinearArgs& a, int64_t x_stride);
GemvShape plan_gemm_mma_int4(const LinearArgs& a, int sm_count);
bool gemm_mma_int4_stages_x(const LinearArgs& a, const GemvShape& shape);
// Block columns of the int4 GEMM's grid (what `counters` must cover).
int64_t gemm_mma_int4_row_blocks(const LinearArgs& a);
// swiglu: the staged kernel only (x16 null), with counters where K splits: a.out = 2 * half rows
// (gate, then up) and y [n, half] gets silu(gate) * up (+ each row's bias first), the bits of this
// linear followed by silu_mul.
cudaError_t launch_gemm_mma_int4(const LinearArgs& a, const uint16_t* x16, int64_t x_stride, const GemvShape& shape,
                                 float* partial, unsigned* counters, Stream stream, bool swiglu = false);
// The staged decode GEMM (1-2 tokens) in probe modes that leave parts out (see linear_int4.cu;
// wrong results, for tachyon_cuda_bench's --int4-sol); mode 0 is the kernel linear() runs. Needs
// out % 16 == 0 and counters.
int gemm_mma_int4_probe_modes();
const char* gemm_mma_int4_probe_name(int mode);
cudaError_t launch_gemm_mma_int4_probe(const LinearArgs& a, const GemvShape& shape, int mode, float* partial,
                                       unsigned* counters, Stream stream);
// Split-K arrival counters a LinearContext keeps (zeroed once; every kernel leaves them zero).
constexpr int64_t kSplitKCounters = 1 << 16;
// The int4 decode GEMM streamed through shared memory (linear_int4_stream.cu): group-128 weights
// with in % 512 == 0, 1..kGemmInt4StreamMaxTokens tokens, 16-byte aligned weight rows, scales,
// zeros and f32 activations (x_stride % 4 == 0), on sm_90 (bulk copies and mbarriers), its
// shared memory (every token's activations over the whole K) within kGemmInt4StreamMaxShared.
// A persistent grid of plan.blocks blocks takes plan.items items of 16 rows x one K slice; with
// plan.splits > 1 it needs partial [splits, n, out] and `counters` (one per 16-row tile, zero,
// left zero) and adds the slices up itself.
constexpr int kGemmInt4StreamMaxTokens = 2;
constexpr size_t kGemmInt4StreamMaxShared = 227 * 1024;
struct Int4StreamPlan {
  int64_t chunk = 0;  // K slice of an item, whole stages of 1024 columns
  int splits = 1;
  int64_t items = 0;  // 16-row tiles x splits
  int blocks = 0;     // min(items, SMs): one block per SM
};
bool gemm_int4_stream_supported(const LinearArgs& a, int compute_capability);
Int4StreamPlan plan_gemm_int4_stream(const LinearArgs& a, int sm_count);
cudaError_t launch_gemm_int4_stream(const LinearArgs& a, const Int4StreamPlan& plan, float* partial,
                                    unsigned* counters, Stream stream);
// For tachyon_cuda_bench only: the same kernel with 3, 4, 6 or 8 stages (and plan.blocks as given,
// e.g. two per SM where shared memory allows).
cudaError_t launch_gemm_int4_stream_probe(const LinearArgs& a, const Int4StreamPlan& plan, int stages, float* partial,
                                          unsigned* counters, Stream stream);
size_t gemm_int4_stream_shared_bytes(int64_t n, int64_t in, int stages);

// The GGUF block weights (linear_gguf.cu, the expansion in linear_gguf_expand.cu): LinearArgs with gguf set, packed rows whose base and
// stride are gguf_row_alignment() aligned. The GEMV takes 1..kGemvGgufMaxTokens tokens, with the
// same split-K contract as the GEMV; the expansion writes dst [out, in] bf16 (rows dst_stride
// apart, dst_stride % 8 == 0, dst 16-byte aligned) = the weight core/ggml_blocks.h decodes, for
// cuBLASLt.
constexpr int kGemvGgufMaxTokens = 8;
// What the launchers need of a format's packed rows (quant/quantize.h's kGguf* layouts): weights
// per block (32 or 256), bytes of a row of `in` weights, the alignment of the rows' base and
// stride (16, or what a row of Q4_1 / Q5_0 / Q5_1 / IQ4_NL blocks keeps: 4, 2, 8, 2), and whether
// the blocks' d come apart as w_scales_f16 (Q8_0, Q6_K) rather than inside the blocks.
int64_t gguf_block(GgufFormat format);
int64_t gguf_packed_row_bytes(GgufFormat format, int64_t in);
int64_t gguf_row_alignment(GgufFormat format);
bool gguf_separate_scales(GgufFormat format);
// The packed rows' base and stride are aligned as the format's layout needs (gguf_row_alignment),
// whole blocks, and the d tensor is there exactly when the format keeps it apart.
bool gguf_rows_fit(const LinearArgs& a);
bool gemv_gguf_supported(const LinearArgs& a);
GemvShape plan_gemv_gguf(const LinearArgs& a, int sm_count);
cudaError_t launch_gemv_gguf(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream);
cudaError_t launch_dequantize_gguf(const LinearArgs& a, uint16_t* dst, int64_t dst_stride, Stream stream);

// 8-bit activations (linear_w8a8.cu). Per token: codes [n, codes_stride] (i8: quant/quantize.h's
// quantize_activation_row, bit for bit; f8e4m3: sx = max|x| / 448 and codes x * (448 / max|x|)
// rounded to nearest even) and sx [n] f32; columns [in, codes_stride) get zero codes. A static
// scale s > 0 (LinearArgs::x_scale) replaces the per-token one: sx = s (NaN for a non-finite row),
// codes x * (1 / s) rounded alike (i8: quantize_activation_row_static, bit for bit).
cudaError_t launch_quantize_activations(const float* x, int64_t x_stride, int64_t n, int64_t in, DType codes_dtype,
                                        void* codes, int64_t codes_stride, float* sx, float static_scale,
                                        Stream stream);
// y [n, in] packed f32 = quant/quantize.h's round_activation_row_fp8 of each row of x, scale > 0.
cudaError_t launch_round_activations_fp8(const float* x, int64_t x_stride, int64_t n, int64_t in, float scale,
                                         float* y, Stream stream);
// The W8A8 GEMV: LinearArgs with scheme kW8A8, x_codes / sx from launch_quantize_activations
// (rows x_stride apart), 1..kGemvW8A8MaxTokens tokens, in < 2^17. With splits > 1 the slices'
// int32 sums go to partial [splits, n, out] and a second kernel finishes them.
constexpr int kGemvW8A8MaxTokens = 8;
bool gemv_w8a8_supported(const LinearArgs& a);
GemvShape plan_gemv_w8a8(const LinearArgs& a, int64_t x_stride, int sm_count);
cudaError_t launch_gemv_w8a8(const LinearArgs& a, const int8_t* x_codes, int64_t x_stride, const float* sx,
                             const GemvShape& shape, int32_t* partial, Stream stream);
// In place on y [n, out]: the sums of an 8-bit GEMM (int_sums: int32 in y's words, W8A8's
// epilogue; else f32) times sx[t] * sw[o], plus bias[o].
cudaError_t launch_scale_sums(float* y, int64_t y_stride, int64_t n, int64_t out, bool int_sums, const float* sx,
                              const float* sw, const void* bias, DType bias_dtype, Stream stream);

// Ternary weights (linear_ternary.cu): LinearArgs with scheme kTernary, u8 codes, group 32..256,
// in % 64 == 0, 16-byte aligned rows. The GEMV takes 1..kGemvTernaryMaxTokens tokens with 16-byte
// aligned x rows (same split-K contract as the GEMV); the expansion writes dst [out, in] bf16
// (dst_stride % 8 == 0, dst 16-byte aligned) for cuBLASLt.
constexpr int kGemvTernaryMaxTokens = 8;
bool ternary_weight_supported(const LinearArgs& a);
bool gemv_ternary_supported(const LinearArgs& a);
GemvShape plan_gemv_ternary(const LinearArgs& a, int sm_count);
cudaError_t launch_gemv_ternary(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream);
cudaError_t launch_dequantize_ternary(const LinearArgs& a, uint16_t* dst, int64_t dst_stride, Stream stream);

// dst[n, dst_stride] (f16/bf16, rounded to nearest even) = x[n, in] f32 (rows x_stride apart).
cudaError_t launch_convert_rows(const float* x, int64_t x_stride, int64_t n, int64_t in, void* dst, DType dst_dtype,
                                int64_t dst_stride, Stream stream);
// y[t, o] += bias[o].
cudaError_t launch_add_bias(float* y, int64_t y_stride, int64_t n, int64_t out, const void* bias, DType bias_dtype,
                            Stream stream);

// ---- row-wise ops (norm.cu, elementwise.cu) ------------------------------------------------------

// copy16 (rms_norm, add_rms_norm, silu_mul): y's rows also written rounded to 16 bits (cuda_types.h
// Rows16); null data: none.
cudaError_t launch_rms_norm(const float* x, const Rows& x_rows, const void* weight, DType weight_dtype, float eps,
                            float* y, const Rows& y_rows, const Rows16& copy16, Stream stream);
cudaError_t launch_add_rms_norm(float* residual, const Rows& residual_rows, const float* x, const Rows& x_rows,
                                const void* weight, DType weight_dtype, float eps, float* y, const Rows& y_rows,
                                const Rows16& copy16, Stream stream);
cudaError_t launch_add(float* y, const Rows& y_rows, const float* x, const Rows& x_rows, Stream stream);
cudaError_t launch_silu_mul(const float* gate, const Rows& gate_rows, const float* up, const Rows& up_rows, float* out,
                            const Rows& out_rows, const Rows16& copy16, Stream stream);
cudaError_t launch_embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab, int64_t d,
                             const int32_t* ids, int64_t n, float* out, int64_t out_stride, Stream stream);
cudaError_t launch_fill_random(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi,
                               Stream stream);

// ---- reductions and the synthetic-weight fill (reduce.cu) -------------------------------------------
// With workspace of argmax_workspace_bytes(n, d) (0: not needed), rows with few siblings are split
// over several blocks; otherwise (or with less workspace) one block per row.
size_t argmax_workspace_bytes(int64_t n, int64_t d);
cudaError_t launch_argmax(const float* x, int64_t x_stride, int64_t n, int64_t d, int32_t* ids, float* logprobs,
                          void* workspace, size_t workspace_bytes, Stream stream);
cudaError_t launch_fill_uniform(void* data, DType dtype, int64_t count, uint64_t base, float bound, float offset,
                                Stream stream);
// ops::top_tokens with m in [1, kMaxTopTokens]; needs workspace of top_tokens_workspace_bytes.
size_t top_tokens_workspace_bytes(int64_t n, int64_t d, int m);
cudaError_t launch_top_tokens(const float* x, int64_t x_stride, int64_t n, int64_t d, int m, int32_t* ids,
                              float* probs, void* workspace, size_t workspace_bytes, Stream stream);
// ops::advance_decode (block_tables [n, columns] packed).
cudaError_t launch_advance_decode(const int32_t* next_ids, int32_t* token_ids, int32_t* positions,
                                  int32_t* context_lens, const int32_t* block_tables, int64_t columns, int block_size,
                                  int32_t* slot_mapping, int64_t n, Stream stream);

// ---- int8 weights (quant.cu) ---------------------------------------------------------------------
// ops::quantize_int8_rows: w [out, in] (dtype, rows w_stride apart) -> packed [out, in] i8, scales
// [out] f32 (NaN for a row with a non-finite weight).
cudaError_t launch_quantize_int8_rows(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in,
                                      int8_t* packed, float* scales, Stream stream);
// dst [out, in] bf16 (rows dst_stride apart) = packed * scales (packed i8 or f8e4m3 codes), for
// cuBLASLt.
cudaError_t launch_dequantize_rows(const void* packed, DType dtype, int64_t w_stride, const float* scales, int64_t out,
                                   int64_t in, uint16_t* dst, int64_t dst_stride, Stream stream);
// ops::quantize_int4_groups: w [out, in] (dtype, rows w_stride apart) -> packed [out, in / 2] u8,
// scales and zeros [out, in / group] f32 (a NaN scale for a group with a non-finite weight, or
// one too wide for an f16 scale).
cudaError_t launch_quantize_int4_groups(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in,
                                        int group, bool f16_scales, uint8_t* packed, float* scales, float* zeros,
                                        Stream stream);
// dst [out, in] bf16 (rows dst_stride apart) = (q - zeros) * scales, for cuBLASLt. Needs 16-byte
// aligned packed rows (w_stride % 16 == 0) and dst rows (dst_stride % 8 == 0).
cudaError_t launch_dequantize_int4_groups(const uint8_t* packed, int64_t w_stride, const float* scales,
                                          const float* zeros, int group, int64_t out, int64_t in, uint16_t* dst,
                                          int64_t dst_stride, Stream stream);

// ---- sampling (sample.cu) -------------------------------------------------------------------------
// ops::sample on the device: one block per row; params [n, 6] f32 (ops::kSampleParams); probs
// (nullable) [n, d] packed.
cudaError_t launch_sample(const float* x, int64_t x_stride, int64_t n, int64_t d, const float* params, int32_t* ids,
                          float* logprobs, float* probs, Stream stream);
// ops::adjust_logits: edits [m, 5] f32 (row, token, bias, repetition, subtract); edits naming a
// place outside x[n, d] are skipped (the caller checks them).
cudaError_t launch_adjust_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const float* edits, int64_t m,
                                 Stream stream);
// ops::mask_logits: a block row per mask; masks naming a row outside x are skipped (the caller
// checks them).
cudaError_t launch_mask_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const int32_t* masks, int64_t m,
                               Stream stream);

// ---- mixture of experts (moe.cu) --------------------------------------------------------------
// ops.h's limits (ops.h itself is not for nvcc).
constexpr int kMoeMaxExperts = 512;
constexpr int kMoeMaxExpertsPerTok = 32;
// ops::moe_route: one warp per row of logits [n, num_experts] (rows logits_stride apart), ids and
// weights [n, k] packed.
cudaError_t launch_moe_route(const float* logits, int64_t logits_stride, int64_t n, int num_experts, int k,
                             bool normalize, int32_t* ids, float* weights, Stream stream);
// The device workspace launch_moe_experts needs: the expert grouping of the n * k slots and the
// grouped products ([n * k, inter] and [n * k, hidden] f32).
size_t moe_workspace_bytes(int64_t n, int64_t k, int num_experts, int64_t hidden, int64_t inter);
// ops::moe_experts on checked arguments (cuda_ops.cpp): align, gate/up, down, combine.
cudaError_t launch_moe_experts(const MoeArgs& a, void* workspace, Stream stream);
// y[t, :] += sigmoid(gate[t * gate_stride]) * x[t, :] over [n, d].
cudaError_t launch_add_sigmoid_gated(float* y, int64_t y_stride, const float* x, int64_t x_stride, const float* gate,
                                     int64_t gate_stride, int64_t n, int64_t d, Stream stream);

// ---- rope (rope.cu) ----------------------------------------------------------------------------

cudaError_t launch_rope(float* x, int64_t n, int64_t heads, int64_t token_stride, int64_t head_stride,
                        const int32_t* positions, const float* inv_freq, int rotary_dim, bool interleaved,
                        float attention_scale, Stream stream);
// rope on q and k and store_kv of k and v in one launch (f32/f16/bf16 caches): the same bits as
// launch_rope twice, then launch_store_kv.
cudaError_t launch_rope_store_kv(const RopeStoreArgs& a, const KvCacheView& cache, Stream stream);

// ---- paged KV cache and attention (kv_cache.cu, attention_decode.cu, attention_prefill.cu) -------

// f32/f16/bf16 caches: one thread per element. Quantized caches (i8, f8e4m3; k_scales and
// v_scales set): one warp per (token, kv head) row, codes and scale as ops.h KvLayer defines them,
// bit-identical to ops/cpu/reference.cpp's quantize_kv_row.
// compress_kv_blocks (ops.h): pairs [num_pairs, 2] i32 (primary block, history block) on the
// device; rows bit-identical to ops/cpu/reference.cpp's compress_kv_blocks.
cudaError_t launch_compress_kv_blocks(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache,
                                      Stream stream);
// Key bounds (ops.h KvLayer) of each pair's history block, from its keys' codes; nothing without
// kbounds. Bit-identical to the reference's where the decoded keys are.
cudaError_t launch_key_bounds(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache, Stream stream);
// select_kv_blocks (ops.h), batch.sparse_budgets set: workspace of select_workspace_bytes().
size_t select_workspace_bytes(int num_seqs, int64_t num_kv_heads, int64_t cols);
cudaError_t launch_select_kv_blocks(const float* q, int64_t q_token_stride, int64_t q_head_stride, int64_t num_heads,
                                    const KvCacheView& cache, const AttentionBatch& batch, int32_t* tables,
                                    int32_t* lens, void* workspace, Stream stream);
cudaError_t launch_store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v,
                            int64_t v_token_stride, int64_t v_head_stride, int64_t n, const int32_t* slot_mapping,
                            const KvCacheView& cache, Stream stream);

struct AttentionQuery {
  const float* q = nullptr;  // [n, num_heads, head_dim] f32
  int64_t q_token_stride = 0, q_head_stride = 0;
  float* out = nullptr;  // [n, num_heads, head_dim] f32
  int64_t out_token_stride = 0, out_head_stride = 0;
  int64_t num_heads = 0;
  float scale = 1.0f;
  int sliding_window = 0;
  // The decode kernels only: out's rows again in 16 bits (token t's head h at
  // t * stride + h * head_dim), for the linear that reads them next; none when data is null.
  Rows16 out16;
};

// Decode (every sequence has at most one query row): grid (splits, kv heads, sequences); each
// block reads one slice of one sequence's context for one KV head once, for all the query heads
// of its group. With splits > 1, `workspace` holds the partial results (decode_workspace_floats)
// and a second kernel combines them.
// The tensor-core (mma) kernels, decode and prefill, take f16/bf16 caches and the quantized i8 /
// f8e4m3 ones with head_dim 64 or 128, on sm_80 and later (the caller checks the device): a
// quantized cache's codes exact in bf16, the scales applied to the f32 scores and to the softmax
// weights before those are rounded to bf16. The CUDA-core kernels read any cache (a quantized
// one as code * scale exactly).
inline bool mma_attention_supported(DType dtype, int64_t head_dim) {
  return (dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kI8 || dtype == DType::kF8E4M3) &&
         (head_dim == 64 || head_dim == 128);
}
// The decode kernel's set, the same as the prefill kernel's.
inline bool mma_decode_supported(DType dtype, int64_t head_dim) { return mma_attention_supported(dtype, head_dim); }

constexpr int kDecodeMaxGroup = 8;       // query heads per KV head
constexpr int kDecodeMaxHeadDim = 256;
constexpr int kDecodeMaxSplits = 64;     // slices of a context
size_t decode_workspace_floats(int num_seqs, int64_t num_heads, int64_t head_dim, int splits);
size_t decode_shared_bytes(int64_t group, int64_t head_dim);
cudaError_t launch_attention_decode(const AttentionQuery& query, const KvCacheView& cache,
                                    const AttentionBatch& batch, int splits, bool tensor_cores, float* workspace,
                                    Stream stream);

// Prefill / mixed batches: grid (query tiles, heads, sequences); K/V tiles staged in shared
// memory, online softmax, no score matrix in memory. Any batch (decode rows included).
constexpr int kPrefillMaxHeadDim = 256;
size_t prefill_shared_bytes(int64_t head_dim);
cudaError_t launch_attention_prefill(const AttentionQuery& query, const KvCacheView& cache,
                                     const AttentionBatch& batch, bool tensor_cores, Stream stream);

}  // namespace tachyon::ops::cuda::detail
