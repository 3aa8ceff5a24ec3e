// The op interface the model forward is written against. Each op checks its arguments once
// (shapes, dtypes, one device for all its tensors: internal invariants, TACHYON_CHECK) and
// dispatches on the device of its tensors to that device's backend (ops/backend.h: the CPU's of
// ops/cpu, or the CUDA one of ops/cuda once started). Activations are row-major [n_tokens, ...] f32
// with a packed last dim; their leading dims may be strided views (e.g. q/k/v slices of a fused
// QKV output, gate/up halves of a fused gate_up output) — every op accepts that. Weights, norm
// weights and caches are packed. Nothing here knows about requests or schedulers: a batch is
// described by AttentionMetadata, planned once per step and reused by every layer.
//
// CPU backend: the SIMD kernels of ops/cpu (AVX2 baseline, AVX-512 for linear where the CPU has
// it), or the scalar reference kernels (ops/cpu/reference.h) under TACHYON_ISA=scalar. The first
// call of each kernel variant logs its name at info level.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_types.h"
#include "quant/quant_weight.h"

namespace tachyon {

enum class RopeStyle : uint8_t {
  kNeox,         // rotate halves: (x[i], x[i + d/2]) — HF Llama/Qwen/Mistral, GGUF qwen2/qwen3
  kInterleaved,  // rotate adjacent pairs: (x[2i], x[2i+1]) — llama2.c, GGUF llama (permuted weights)
};

enum class RopeScaling : uint8_t { kNone, kLinear, kLlama3, kYarn };

struct RopeConfig {
  float theta = 10000.0f;
  int rotary_dim = 0;  // dims rotated per head (== head_dim for every family here)
  RopeStyle style = RopeStyle::kNeox;
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;                    // linear / llama3 / yarn
  float low_freq_factor = 1.0f;           // llama3
  float high_freq_factor = 4.0f;          // llama3
  int original_max_position = 8192;       // llama3 / yarn
  float yarn_beta_fast = 32.0f;           // yarn
  float yarn_beta_slow = 1.0f;            // yarn
  float yarn_attention_factor = 0.0f;     // yarn mscale; 0 = 0.1 * ln(factor) + 1 (1 when factor <= 1)
  bool yarn_truncate = true;              // yarn: round the correction range outwards (HF `truncate`)
};

// Per-dimension-pair inverse frequencies and the cos/sin magnitude, derived once from RopeConfig
// (the scaling schemes follow Hugging Face transformers' rope initialisation). Position p rotates
// pair i by the angle f32(p * inv_freq[i]) (one f32 rounding, as HF computes it), and cos/sin are
// multiplied by attention_scale.
struct RopeTable {
  RopeStyle style = RopeStyle::kNeox;
  int rotary_dim = 0;
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_scale = 1.0f; // multiplies cos and sin (yarn); 1 otherwise
};
RopeTable make_rope_table(const RopeConfig& config);

// The batch as attention sees it, planned once per step. Sequence s owns query rows
// [query_start[s], query_start[s+1]) of the flattened batch; after this step's K/V are stored,
// its cache holds context_lens[s] tokens, the last (query_start[s+1] - query_start[s]) of which
// are this step's queries (causal within them). Its cache positions live in the blocks
// block_tables[s, 0 .. ceil(context_lens[s] / block_size)).
//
// Token trees (speculative verification of several branches in one forward): with tree_masks
// defined, query row t of a sequence whose chunk starts at cache index c0 = context_lens[s] -
// q_len sees every key before c0 and, of the chunk's own keys c0 + j (j < 64), those whose bit j
// is set in tree_masks[t] (its ancestors and itself). Its cache index stays c0 + (t - q_begin);
// only RoPE positions (ForwardBatch::positions) follow the depth in the tree. A mask of all ones
// is plain causal attention (the rows of every other chunk of the batch, of any length); any
// other mask holds the row's own bit and no later one, in a chunk of at most kMaxTreeTokens
// queries. No sliding window with trees.
struct AttentionMetadata {
  int num_seqs = 0;
  int block_size = 16;
  int max_query_len = 0;
  int max_context_len = 0;
  Tensor query_start;   // [num_seqs + 1] i32
  Tensor context_lens;  // [num_seqs] i32
  Tensor block_tables;  // [num_seqs, max_blocks_per_seq] i32 (unused entries: -1)
  Tensor slot_mapping;  // [n_tokens] i32: block * block_size + offset where each new K/V goes
  Tensor tree_masks;    // [n_tokens] i64 (bits of a u64), or undefined: causal chunks
  // Block-sparse decode attention (select_kv_blocks(), paged_attention()): undefined for dense.
  // sparse_budgets [num_seqs] i32: the history tokens each sequence's query may attend to, <= 0
  // for all of them; it applies to sequences with one query this step (the others attend densely).
  Tensor sparse_budgets;
  int sparse_sink_blocks = 1;  // leading history blocks every sparse query attends to
  // What select_kv_blocks() chose for one layer, which paged_attention() then reads:
  // sparse_tables [num_seqs, num_kv_heads, block_tables.size(1)] i32 and sparse_lens
  // [num_seqs, num_kv_heads] i32.
  Tensor sparse_tables;
  Tensor sparse_lens;
};
inline constexpr int kMaxTreeTokens = 64;  // a chunk with tree masks holds at most this many queries

struct AttentionParams {
  float scale = 1.0f;      // usually 1/sqrt(head_dim)
  int sliding_window = 0;  // attend to the last `sliding_window` positions only; 0 = unlimited
};

// One layer of the paged KV cache as the attention ops read and write it. k and v are
// [num_blocks, block_size, num_kv_heads, head_dim], packed: f32 (the CPU reference), f16/bf16, or
// a quantized cache (i8, f8e4m3) whose k_scales and v_scales [num_blocks, block_size,
// num_kv_heads, 1] f32 hold one scale per (slot, kv head) row; undefined for the 16-bit caches.
//
// Quantized rows: store_kv() writes the head_dim values x of a (token, kv head) as codes c and a
// scale s with x ~ c * s: s = max|x| / Q (Q = 127 for i8, 448 for f8e4m3, f32 division), and
// c = clamp(rint(x / s), -127, 127) for i8 or c = f32_to_f8e4m3(x / s) (nearest, ties to even)
// for f8e4m3. An all-zero row has s = 0 and codes 0; a row holding a non-finite value gets
// s = NaN (it reads back as NaN, as a 16-bit cache would carry it). The scale is per slot rather
// than per block: a block fills one token at a time, and a block scale fixed by its first tokens
// would clip later outliers, while rescaling the block would round its earlier codes twice.
//
// History (long context, kv/block_manager.h KvHistory int8 / int4): blocks re-quantized when they
// left the window of recent positions live in separate pools, and a block table entry
// b >= num_blocks (k.size(0)) names history block b - num_blocks. Rows are (slot, kv head) rows
// as above, quantized from their values as the cache read them (code * scale for i8 / f8e4m3):
//   int8  hk, hv [num_history_blocks, block_size, num_kv_heads, head_dim] i8, hk_params and
//         hv_params [.., 1] f32: the i8 cache's rows (x ~ c * s).
//   int4  hk, hv [.., head_dim / 2] u8 (element 2i in the low nibble, 2i + 1 in the high one),
//         params [.., 2] f16 (s, lo): lo = f16(min x), s = f16((max x - lo) / 15) (each rounded
//         to nearest, clamped to f16's finite range first, s >= 0; the f32 arithmetic uses the
//         rounded lo), c = clamp(rint((x - lo) / s), 0, 15) (0 when s = 0), x ~ lo + c * s, all
//         in f32 on the f16 values. 68 bytes a row of 128 where bf16 takes 256. A row holding a
//         non-finite value gets s = lo = NaN; values beyond f16's range are clipped to it.
//
// Key bounds (block-sparse attention; with history pools only): per (history block, kv head), the
// element-wise minimum mn[d] and maximum mx[d] over the block's block_size keys, as their history
// codes decode (history_value), coded outward in 4 bits per group of kKeyBoundGroup dims (dims
// 32 g .. 32 g + 31): kbounds [num_history_blocks, num_kv_heads, 2, head_dim / 2] u8 (the min
// codes, then the max codes; dim 2i in the low nibble, 2i + 1 in the high one) and kbound_params
// [.., num_kv_heads, key_bound_groups(head_dim), 2] f32 (lo, step) per group: lo = min of the
// group's mn, step = (max of its mx - lo) / 14 (f32); code c stands for value(c) = lo + f32(c *
// step) (one rounding each, never fused); the min code is the largest c in [0, 15] with value(c)
// <= mn[d], the max code the smallest with value(c) >= mx[d]. A block whose keys hold a non-finite
// value gets lo = step = NaN in every group and codes 0. 160 bytes per (block, kv head) of
// head_dim 128: 1.95 % of a bf16 block's K and V.
// (kKeyBoundGroup and key_bound_groups() are in ops/kernel_types.h, which the kernels share.)
struct KvLayer {
  Tensor k, v;                // [num_blocks, block_size, num_kv_heads, head_dim]
  Tensor k_scales, v_scales;  // [num_blocks, block_size, num_kv_heads, 1] f32, quantized caches only
  Tensor hk, hv;              // history codes (above), or undefined: no history pools
  Tensor hk_params, hv_params;
  Tensor kbounds, kbound_params;  // key bounds of the history blocks (above), or undefined
};


namespace ops {

// One line naming the CPU kernels in use ("cpu kernels: avx512"), for `tachyon info` and logs.
std::string backend_info();

// How linear() may trade reproducibility for speed.
enum class LinearMode : uint8_t {
  kFastest,         // the fastest kernel for the batch's size (GEMV for few tokens, GEMM beyond)
  kBatchInvariant,  // every token row through the same kernel and summation order, whatever the
                    // batch: a sequence's outputs are bit-identical alone or batched with others
};

// y[n, out] = x[n, in] · W[out, in]^T (+ bias[out]). x, y f32 (y must not overlap x); W dense
// f32/f16/bf16 (quantized formats come with quant/); bias f32/f16/bf16. Accumulates in f32.
void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode = LinearMode::kFastest);

// What a pre-norm block does on either side of a linear, which a backend may run inside the
// linear's own kernel instead of as separate ops (CUDA: the residual add and SwiGLU in the GEMV
// of one token). The result is bit for bit that of the separate ops, wherever they run.
struct LinearFusion {
  // Before: the linear reads rms_norm(x, *norm_weight, norm_eps) instead of x. With pending_add
  // (a result an earlier linear_fused deferred), x is the residual stream and first becomes
  // x + *pending_add, written back (add_rms_norm); otherwise x is not changed.
  const Tensor* norm_weight = nullptr;
  float norm_eps = 0.0f;
  const Tensor* pending_add = nullptr;
  // After (at most one of the two):
  bool add_to_output = false;  // y += the linear's result (a residual add)
  bool swiglu = false;         // W stacks gate rows over up rows [2f, in]: y[n, f] = silu(gate) * up
  // With add_to_output: where the backend cannot add inside the linear's kernel, the result is
  // left in scratch_y and not added (linear_fused returns true), for the caller to add with the
  // next norm (pending_add, add_rms_norm): one pass less than adding it here.
  bool may_defer_add = false;
  // Where the parts run apart: scratch_x [n, in] f32 receives rms_norm(x) (needed with
  // norm_weight), scratch_y [n, W.out] f32 the linear's result (needed with add_to_output or
  // swiglu). Their contents afterwards are unspecified (but for a deferred add's result).
  Tensor* scratch_x = nullptr;
  Tensor* scratch_y = nullptr;
};

// linear(x, w, bias) with the prologue and epilogue of `fusion`; y must not overlap x or the
// scratch tensors, except that a SwiGLU's y may be the gate half of scratch_y (the separate ops
// then run silu_mul in place). Without norm_weight, add_to_output or swiglu it is linear().
// Returns true when it deferred the residual add (may_defer_add): y is unchanged and the result
// is in scratch_y.
[[nodiscard]] bool linear_fused(Tensor& x, const Weight& w, const Tensor* bias, const LinearFusion& fusion, Tensor& y,
                                LinearMode mode = LinearMode::kFastest);

// y[n, d] += x[n, d] (f32, packed last dims).
void add(Tensor& y, const Tensor& x);

// y[..., d] = x / rms(x) * weight[d], over the last dim of x (rank 1..4; e.g. [n, d], or
// [n, heads, head_dim] for per-head q/k norms). weight f32/f16/bf16. y may be x.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y);

// residual[n, d] += x; y = rms_norm(residual) (one pass; the pre-norm block's residual add).
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y);

// In place: x[n, heads, head_dim] rotated by positions[n] (i32). The first table.rotary_dim dims
// of each head rotate (<= head_dim; the rest are left as they are).
void rope(Tensor& x, const Tensor& positions, const RopeTable& table);

// out[n, ff] = silu(gate[n, ff]) * up[n, ff].
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);

// out[n, d] (f32) = table[ids[n], :] (table f32/f16/bf16 [vocab, d]; ids i32, checked < vocab).
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);

// ids[r] (i32) = the index of the largest finite value of row r of x[n, d] (f32); the first on
// ties (the sampler's greedy choice). A row without a finite value gives 0. logprobs (optional,
// [n] f32): log_softmax over the row's finite values at that index (the sampler's greedy logprob).
void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs = nullptr);

// The m likeliest tokens of each row of x[n, d] (f32) under softmax at temperature 1 over the
// row's finite values: ids[n, m] (i32) ranked by value descending, then id ascending (so ids[r, 0]
// is argmax()'s choice), and probs[n, m] (f32) their probabilities. A row with fewer than m finite
// values fills the rest with id -1 and probability 0. 1 <= m <= kMaxTopTokens. A draft model's
// token tree takes its side branches from these.
void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs);
inline constexpr int64_t kMaxTopTokens = 64;

// A decode batch (one token per sequence) moved on by one greedy step, in place: for each
// sequence s, token_ids[s] = next_ids[s], positions[s] and context_lens[s] grow by one, and
// slot_mapping[s] = block_tables[s, p / block_size] * block_size + p % block_size for the new
// position p, whose block the table must already hold. All [num_seqs] i32 but block_tables
// ([num_seqs, columns] i32, packed), on one device: a chain of draft steps runs with no host round
// trip between them.
void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                    const Tensor& block_tables, int block_size, Tensor& slot_mapping);

// One token per row of x[n, d] (f32), drawn as the Sampler (sampling/sampler.h) draws when a
// request asks for no top logprobs (penalties and logit bias go first, through adjust_logits()).
// params[n, 6] (f32, contiguous) holds per row: the temperature T (0: greedy), min_p, the uniform
// draw u in [0, 1) as two f32 whose sum is the double (u_hi, u_lo), top_k (an integer; 0 = off)
// and top_p (1 = off). Over the finite values, t = (x - max) * (1 / T) and w = exp(t); tokens are
// ranked by t descending, then id ascending. top-k keeps the first k of that ranking; top-p keeps
// the shortest prefix of what top-k left whose sum of w reaches top_p * (1 - 1e-6) of its whole
// sum; min-p then drops w < min_p. The token is the first, in id order, at which the running sum
// of the kept w exceeds u * their sum (the argmax when rounding leaves none). Greedy rows take the
// argmax (first of equal maxima) and T = 1 for the logprob. ids [n] i32; logprobs [n] f32 =
// t(token) - log(sum of every w), the Sampler's reported logprob. A row without a finite value
// gives 0, -inf. probs (optional, [n, d] f32 packed): the law each token was drawn from, the kept
// w over their sum and 0 elsewhere (one-hot for greedy rows, zeros for a row without a finite
// value), which a speculative verifier needs as a draft's q.
void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs = nullptr);
inline constexpr int64_t kSampleParams = 6;  // columns of sample()'s params

// Penalties and logit bias of the Sampler (steps 0-2 of sampling/sampler.h) as sparse edits of
// x[n, d] (f32) in place: each row of edits[m, 5] (f32, contiguous; row and token are integers,
// exact in f32 below 2^24) is (row, token, bias, repetition, subtract) and sets
//   v = x[row, token] + bias;  v = v > 0 ? v / repetition : v * repetition;  x[row, token] = v - subtract.
// No (row, token) pair may appear twice. A non-finite logit stays non-finite (excluded later).
void adjust_logits(Tensor& x, const Tensor& edits);
inline constexpr int64_t kLogitEditColumns = 5;

// Token masks of constrained decoding (sampling/grammar_matcher.h) on x[n, d] (f32) in place: each
// row of masks[m, token_mask_columns(d)] (i32, contiguous) names a row of x in its first column,
// then holds that row's allowed tokens as bits (bit t % 32 of the word in column 1 + t / 32), and
// x[row, t] becomes -inf for every token t whose bit is clear. Rows of x not named are unchanged;
// a row named twice keeps what both masks allow.
void mask_logits(Tensor& x, const Tensor& masks);
inline constexpr int64_t token_mask_columns(int64_t d) { return 1 + (d + 31) / 32; }

// Fills t (f32/f16/bf16, contiguous) with offset + bound * u, u uniform in [-1, 1), element i drawn
// from (seed, stream, i) alone: the same values on every device and thread count.
void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset);

// Per-output-channel symmetric int8 of w[out, in] (f32/f16/bf16, unit column stride), exactly as
// quant/quantize.h defines kInt8Channel: scales[o] = max_i |w[o, i]| / 127 (f32), packed[o, i] =
// clamp(rint(w[o, i] * (1 / scales[o])), -127, 127) (0 for an all-zero row). packed [out, in] i8
// and scales [out] f32, contiguous, on w's device. Non-finite weights are the caller's to reject.
void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales);

// Group-wise asymmetric int4 of w[out, in] (f32/f16/bf16, unit column stride), exactly as
// quant/quantize.h's quantize_int4_group defines kInt4Group (group 32, 64 or 128 dividing in),
// with scales rounded up to f16 values when f16_scales (Int4Scales::kF16) or exact (kF32):
// packed [out, in / 2] u8, scales and zeros [out, in / group] f32, contiguous, on w's device.
// On a device a group holding a non-finite weight (or too wide for an f16 scale) gets a NaN
// scale (the caller checks); on the host either is an error.
void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales, Tensor& zeros);

// Mixture of experts (Qwen3-MoE, Qwen2-MoE, Mixtral). The experts of one layer, each an MLP
// down(silu(gate x) * up x), as stacked weights: expert e owns rows [e * inter, (e + 1) * inter)
// of gate and up ([num_experts * inter, hidden]) and rows [e * hidden, (e + 1) * hidden) of down
// ([num_experts * hidden, inter]). Dense f32/f16/bf16, or packed (a QuantWeight's tensors hold
// one row per output, so its rows stack the same way); gate, up and down share one format.
struct MoeExperts {
  int num_experts = 0;
  int64_t inter = 0;  // each expert's intermediate size
  Weight gate, up, down;
  int64_t hidden() const { return down.defined() ? down.out_features() / std::max(num_experts, 1) : 0; }
};
inline constexpr int kMaxExperts = 512;     // experts of one layer
inline constexpr int kMaxExpertsPerTok = 32;  // experts chosen per token

// Router: for each row of logits[n, E] (f32; E <= kMaxExperts), ids[n, k] (i32) = the experts of
// the k largest logits in descending order, ties to the lower expert id (a NaN ranks below every
// number; so the k most probable under softmax), and weights[n, k] (f32) their probabilities
// p = softmax(row), divided by the sum of the k chosen when `normalize` (Qwen3-MoE, Mixtral;
// Qwen2-MoE's norm_topk_prob is off). Within f32 rounding: backends may sum in their own order.
// 1 <= k <= min(E, kMaxExpertsPerTok).
void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights);

// y[t, :] = sum over j < k of weights[t, j] * expert_{ids[t, j]}(x[t, :]), summed in j order, for
// each token t of x[n, hidden] (f32): the expert MLPs of the tokens' chosen experts, each expert's
// weights read once for all of its tokens (tokens grouped by expert, one grouped product per
// projection). ids [n, k] i32 (each in [0, num_experts), checked on the host; a device records an
// error), weights [n, k] f32, y [n, hidden] f32 (must not overlap x). kBatchInvariant: each
// (token, expert) product is that of the token alone, whatever else the batch routes there.
// expert_tokens (optional, [num_experts + 2] i64 on x's device): counters the call adds to: [e] the
// slots routed to expert e, [num_experts] the distinct experts chosen, [num_experts + 1] one.
void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y,
                 LinearMode mode = LinearMode::kFastest, Tensor* expert_tokens = nullptr);

// y[n, d] += sigmoid(gate[n, 0]) * x[n, d] (f32): Qwen2-MoE's shared expert, scaled by its gate.
void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate);

// Rows [row0, row0 + rows) of a linear weight (dense or packed), as a view: one expert of a stack.
Weight weight_rows(const Weight& w, int64_t row0, int64_t rows);

// Waits for the ops issued on `device` (nothing for the CPU) and returns the first error any of
// them raised.
Status synchronize(Device device);

// In place softmax over the last dim of x[n, d] (f32), on the CPU (no device backend has one).
void softmax(Tensor& x);

// The KV cache dtypes: f32, f16, bf16, and the quantized i8 and f8e4m3.
bool is_kv_cache_dtype(DType dtype);
bool is_quantized_kv_dtype(DType dtype);     // i8, f8e4m3
float quantized_kv_max(DType dtype);          // Q above: 127 (i8) or 448 (f8e4m3)
// Bytes one (token, kv head) row of K or V takes in a cache of `dtype`: the head_dim values, and
// a quantized cache's f32 scale.
size_t kv_row_bytes(DType dtype, int64_t head_dim);
// Checks a layer's shapes, dtypes and packing (on any device): an internal invariant, so a
// mismatch aborts with the shapes in the message.
void check_kv_layer(const char* op, const KvLayer& cache);

// Bits per history code of a layer: 0 (no history pools), 8 or 4.
int kv_history_bits(const KvLayer& cache);

// Moves blocks into history: for each row (src, dst) of pairs [m, 2] (i32, on the cache's device),
// every (slot, kv head) row of K and V of block src (< num_blocks) is read as f32 and written,
// quantized as KvLayer says, to history block dst (< num_history_blocks), and where the layer
// keeps key bounds, dst's are computed from its history keys. Block src is left as it was. The
// rows of one pair never depend on another's.
void compress_kv_blocks(const Tensor& pairs, KvLayer& cache);

// The upper bound of q . k over the keys of a history block that its key bounds give, for one
// query head q[head_dim]: the sum over d of max(q[d] * value(min code), q[d] * value(max code))
// (KvLayer, with the lo and step of d's group), f32, NaN for a block whose bounds are NaN.
// Summation order is the kernel's own.
//
// Block-sparse decode attention, step 1 (of 2, with paged_attention()): which blocks each (sequence,
// kv head) attends to. For sequence s with one query (at position context_lens[s] - 1) and
// meta.sparse_budgets[s] = B > 0: its table's leading entries that name history blocks (ids >=
// num_blocks: H of them) are the candidates, less the first min(meta.sparse_sink_blocks, H) (the
// attention sinks, always kept), and the entries after them (the full-precision window) are always
// kept. Of the candidates, the k = max(1, B / block_size) with the highest score are kept, where a
// candidate's score for kv head h is the largest bound over h's query heads (NaN ranks above every
// number), ties to the earlier entry; with k >= the candidates, all of them. tables[s, h, :] lists
// the kept entries in table order, then -1; lens[s, h] is the context's positions in the kept
// blocks (context_lens[s] less block_size per entry left out). A sequence with B <= 0, or with
// no query or several, keeps every entry: its table, and lens = context_lens[s]. q [n, num_heads,
// head_dim] (the batch's query rows, after RoPE, as attention reads them); tables [num_seqs, num_kv_heads, meta.block_tables.size(1)] i32, lens
// [num_seqs, num_kv_heads] i32, packed, on q's device. The layer must keep key bounds.
void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                      Tensor& lens);

// Writes k, v [n, num_kv_heads, head_dim] (f32) into the paged cache at slot_mapping[n] (f16/bf16
// rounded to nearest even; quantized caches as above); a negative slot (a padding token) stores
// nothing.
void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache);

// rope(q), rope(k) (both in place), then store_kv(k, v): what an attention block does between its
// projections and attention, in one launch where the backend has one (CUDA, 16/32-bit caches).
void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeTable& table,
                   const Tensor& slot_mapping, KvLayer& cache);

// out[n, num_heads, head_dim] = causal attention of q[n, num_heads, head_dim] over the paged
// cache, through block tables (GQA: query head h reads kv head h / (num_heads / num_kv_heads)).
// The query at position p sees keys [p - sliding_window + 1, p] (all of [0, p] without a window);
// blocks wholly outside every query's window are never read. A quantized cache's keys and values
// are read as code * scale, history blocks (entries >= num_blocks) as their codes decode.
// Block-sparse (meta.sparse_tables defined, as select_kv_blocks() fills it; no sliding window):
// the query heads of kv head h of sequence s attend to the keys of the blocks
// sparse_tables[s, h, :] as if they were its whole context, of sparse_lens[s, h] positions, its
// queries the last. With every block kept (as for the sequences without a budget) this is dense
// attention, bit for bit.
void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                     const AttentionParams& params, Tensor& out);

}  // namespace ops
}  // namespace tachyon
