// Round-to-nearest weight quantization into the packed formats of quant_weight.h, and the
// dequantization that defines what a packed weight means. dequantize() is the definition every
// kernel is checked against (tests compare a kernel with "dequantize, then the reference
// linear"); the kernels must decode the same layout bit for bit.
//
// Layouts (row-major, one output row after another):
// - kInt8Channel: packed [out, in] i8, scales [out] f32; w[o, i] = packed[o, i] * scales[o],
//   scales[o] = max_i |w[o, i]| / 127 (0 for an all-zero row).
// - kInt4Group:  packed [out, in / 2] u8 in blocks of 32 weights = 16 bytes; byte j of a block
//   holds weight j in its low nibble and weight j + 16 in its high nibble (the GGUF Q4_0 order:
//   one load and two nibble masks give 16 consecutive weights each). scales, zeros
//   [out, in / group] f32; w[o, i] = (q - zeros[o, g]) * scales[o, g] with g = i / group.
//   The range of each group is widened to include 0, so zeros are integers in [0, 15] (they fit
//   4 bits, as AutoAWQ's qzeros need) and the error of every weight is at most scales / 2.
//   (Weights read from GPTQ v1 checkpoints may hold a zero of 16: see unpack_gptq.)
// - kW8A8: the weight exactly as kInt8Channel (packed [out, in] i8, scales [out] f32), and the
//   activations quantized per token when the linear runs (quantize_activation_row):
//     y[t, o] = fma(f32(sum_i qx[t, i] * packed[o, i]), sx[t] * scales[o], bias[o])
//   (without a bias, the product alone), the integer sum exact (int32), so every kernel gives
//   the same bits. dequantize() gives the weight alone. A static input_scale s > 0 replaces sx[t]
//   by s (quantize_activation_row_static).
// - kFp8Channel: packed [out, in] f8e4m3 codes (core/dtype.h's OCP e4m3fn), scales [out] f32;
//   w[o, i] = f8e4m3_to_f32(packed[o, i]) * scales[o], scales[o] = max_i |w[o, i]| / 448 (0 for
//   an all-zero row), codes = f32_to_f8e4m3(w * (1 / scales[o])) rounded to nearest even. With
//   a static input_scale s > 0 the activations are first rounded to e4m3 codes times s
//   (round_activation_row_fp8); without one they stay as they are.
// - kTernary (BitNet b1.58's weights): packed [out, in / 4] u8 in blocks of 32 weights = 8 bytes;
//   byte j of a block holds weights j, j + 8, j + 16, j + 24 in bits 0-1, 2-3, 4-5, 6-7 as
//   t + 1 (0: -1, 1: 0, 2: +1; 3 never appears), so one 8-byte load and a shift give 8
//   consecutive weights. scales [out, in / group] f32; w[o, i] = t * scales[o, i / group], the
//   scale the group's mean |w| and t = clamp(rint(w / scale), -1, 1) (absmean quantization).
// - The GGUF block formats (core/ggml_blocks.h defines the blocks and their values), kept as the
//   file stores them except where a block's fields would sit misaligned; group_size is the block:
//   - kGgufQ8_0: packed [out, in] i8 (the blocks' codes), scales [out, in / 32] f16 (their d);
//     w[o, i] = f32(scales[o, i / 32]) * packed[o, i].
//   - kGgufQ4_K: packed [out, in / 256 * 144] u8, the Q4_K blocks as stored (144 bytes, so a row
//     of whole blocks stays 16-byte aligned); no scales or zeros tensor.
//   - kGgufQ6_K: packed [out, in / 256 * 208] u8, each Q6_K block less its trailing d (ql[128],
//     qh[64], scales[16]: 208 bytes, 16-byte aligned), scales [out, in / 256] f16 (the blocks' d).
//   - kGgufQ4_1, kGgufQ5_0, kGgufQ5_1, kGgufIq4Nl (blocks of 32) and kGgufQ5_K (256): packed
//     [out, in / block * block bytes] u8, the blocks as stored (20, 22, 24, 18 and 176 bytes: the
//     32-weight blocks sit 2- or 4-byte aligned, so kernels read them with unaligned loads); no
//     scales or zeros tensor.
//   These bytes are exactly the file's (Q6_K's d just moves), so the weight is the file's weight.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace tachyon {

// w_dense [out, in] f32/f16/bf16 on the host (any row stride, unit column stride).
Result<QuantWeight> quantize_int8_channel(const Tensor& w_dense);
// group: 32, 64 or 128, dividing in. Scales exact in f32 (Int4Scales::kF32 below).
Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group);
// Per-channel fp8 e4m3 (kFp8Channel).
Result<QuantWeight> quantize_fp8_channel(const Tensor& w_dense);
// Ternary absmean (kTernary); group 32, 64, 128 or 256 dividing in.
Result<QuantWeight> quantize_ternary(const Tensor& w_dense, int group);

// How kInt4Group scales are chosen. kF32: (hi - lo) / 15 exactly. kF16: the smallest value f16
// can hold that is >= (hi - lo) / 15, so the group's range is still covered (every weight stays
// within scale / 2) and the weight survives a checkpoint that stores f16 scales (AutoAWQ, GPTQ)
// bit for bit. Codes and zeros are computed with the rounded scale.
enum class Int4Scales : uint8_t { kF32, kF16 };
Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group, Int4Scales scales);

// How quantize_int4_group rounds one group whose values span [lo, hi] (lo <= 0 <= hi): its
// scale (Inf when f16 cannot hold it), 1 / scale (0 for a zero scale) and integer zero point,
// and the code of a value. For callers that need the rounded values without the packing (AWQ's
// search); the codes are the ones quantize_int4_group stores.
struct Int4GroupParams {
  float scale = 0.0f;
  float inv_scale = 0.0f;
  float zero = 0.0f;
};
Int4GroupParams int4_group_params(float lo, float hi, Int4Scales scales);
inline float int4_code(float w, const Int4GroupParams& p) {
  return std::clamp(std::nearbyint(w * p.inv_scale) + p.zero, 0.0f, 15.0f);
}

// Symmetric int8 of one activation row x[0, n): returns sx = max|x| / 127 and writes
// codes[i] = clamp(rint(x[i] * (127 / max|x|)), -127, 127). An all-zero row gives sx = 0 and zero
// codes; a row holding NaN or Inf gives sx = NaN (its outputs become NaN) and zero codes. What
// every W8A8 kernel runs on its inputs.
float quantize_activation_row(const float* x, int64_t n, int8_t* codes);
// The same with a static scale s > 0 (QuantWeight::input_scale, calibrated offline): codes[i] =
// clamp(rint(x[i] * (1 / s)), -127, 127); returns s, or NaN with zero codes for a row holding NaN
// or Inf. What W8A8 kernels run on a weight with an input scale.
float quantize_activation_row_static(const float* x, int64_t n, float scale, int8_t* codes);
// An fp8 weight's static activation scale s > 0: each x[i] rounded to s times an e4m3 code,
// out[i] = f8e4m3_to_f32(f32_to_f8e4m3(x[i] * (1 / s))) * s (saturating at +-448 s, NaN stays
// NaN) -- the activations of a W8A8 fp8 checkpoint, which every kernel then multiplies as f32.
void round_activation_row_fp8(const float* x, int64_t n, float scale, float* out);

// Row o of a dense weight [out, in] (f32/f16/bf16 on the host, unit column stride) as f32 into
// row[0, in): what the quantizers read.
void load_row_f32(const Tensor& w, int64_t o, float* row);

// The weight a packed one stands for: [out, in] f32, any format.
Tensor dequantize(const QuantWeight& w);

// What load-time quantization turns linear weights into.
struct QuantSpec {
  QuantFormat format = QuantFormat::kInt8Channel;
  int group_size = 128;  // kInt4Group and kTernary (the GGUF formats' blocks are fixed)
  // kInt4Group only. f16 by default: `--quant int4` at load time and a `tachyon quantize`
  // checkpoint of the same weights (f16 scales on disk) are then the same weights, bit for bit.
  Int4Scales int4_scales = Int4Scales::kF16;
  // kInt4Group group 32 encoded by GGUF Q4_0's rule (quantize_q4_0: symmetric, zero 8, f16 d), so
  // the weight is what a Q4_0 file of it would hold ("q4_0").
  bool gguf_q4_0 = false;
};
// "int8", "int4" (with `group`), "w8a8", "fp8", "ternary" (with `group`) or a GGUF block format
// ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k", "q5_k", "q6_k") -> a spec; anything
// else is an error naming the choices.
Result<QuantSpec> parse_quant_spec(const std::string& name, int group);

// The name parse_quant_spec and `--quant-policy` rules read back: "int8", "int4:g64", "q4_0",
// "q5_k", "ternary:g128", ...
std::string quant_spec_name(const QuantSpec& spec);
// The K-quants need in_features in whole super-blocks of 256; a weight that has none (a 640-wide
// down_proj, Qwen2.5-0.5B's 896-wide inputs) takes the 32-wide block format llama.cpp's quantizer
// falls back to: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. Returns whether `spec` changed.
bool k_quant_fallback(QuantSpec& spec, int64_t in_features);

// A dense weight on the host quantized as `spec`; an already quantized weight is an error.
Result<Weight> quantize_weight(const Weight& w, const QuantSpec& spec);

// ---- Checkpoint layouts ----
// Conversions between kInt4Group / kInt8Channel and the tensors of quantized Hugging Face
// checkpoints. They move 4-bit codes from one packing to the other and never go through dense
// floats. Shapes and dtypes are checked; a mismatch is a Status naming the tensor, its shape and
// the shape expected (callers add the module's name).

// AutoAWQ "GEMM" (quant_method "awq", version "gemm"; also what vLLM and transformers read):
//   qweight [in, out / 8] i32: bits 4i .. 4i + 3 of qweight[k, c] hold the code of weight
//           (row o = 8c + kAwqPackOrder[i], column k);
//   qzeros  [in / group, out / 8] i32, the zero points packed the same way (stored as is);
//   scales  [in / group, out] f16;
//   w[o, k] = (code - zero[k / group, o]) * scale[k / group, o].
inline constexpr int kAwqPackOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
struct AwqGemmTensors {
  Tensor qweight;  // [in, out / 8] i32
  Tensor qzeros;   // [in / group, out / 8] i32
  Tensor scales;   // [in / group, out] f16
};
// `w` is kInt4Group with out a multiple of 8, integer zeros in [0, 15] and scales f16 holds
// exactly (quantize_int4_group with Int4Scales::kF16 makes such weights); anything else is an
// error rather than a silently rounded checkpoint.
Result<AwqGemmTensors> pack_awq_gemm(const QuantWeight& w);
// The weight [out, in] the AutoAWQ tensors stand for. scales may be f16, bf16 or f32. group: a
// multiple of 32 dividing in (the CPU kernels decode blocks of 32); out a multiple of 8.
Result<QuantWeight> unpack_awq_gemm(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales,
                                    int64_t out, int64_t in, int group);

// GPTQ (AutoGPTQ / GPTQModel, quant_method "gptq", desc_act false):
//   qweight [in / 8, out] i32: bits 4i .. 4i + 3 of qweight[r, o] hold the code of weight (o, 8r + i);
//   qzeros  [in / group, out / 8] i32: bits 4i .. 4i + 3 of qzeros[g, c] hold the zero of row 8c + i;
//   scales  [in / group, out] f16;  g_idx [in] i32 (must be k / group: no act-order).
// checkpoint_format "gptq" (v1, and checkpoints that do not say) stores zero - 1 in 4 bits and
// the kernels add 1 back, so a stored 15 means 16; "gptq_v2" stores the zero itself.
enum class GptqZeros : uint8_t { kStoredMinusOne, kStored };
// g_idx: undefined, or [in] i32/i64 equal to k / group for every k.
Result<QuantWeight> unpack_gptq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales,
                                const Tensor& g_idx, int64_t out, int64_t in, int group, GptqZeros zeros);

// Per-channel int8 as compressed-tensors ("int-quantized", strategy "channel", symmetric) stores
// it: weight [out, in] i8 and weight_scale [out, 1] (f32 as `tachyon quantize` writes it; f16/bf16 accepted).
struct Int8ChannelTensors {
  Tensor weight;        // [out, in] i8
  Tensor weight_scale;  // [out, 1] f32
};
// w is kInt8Channel, kW8A8 or kFp8Channel (an invariant); fp8 codes come out as F8_E4M3.
Int8ChannelTensors pack_int8_channel(const QuantWeight& w);
// Per-channel (or per-tensor) fp8 e4m3 as compressed-tensors' "float-quantized" stores it: weight
// [out, in] F8_E4M3 and weight_scale [out, 1] (strategy "channel") or a single value ([1], [1, 1]
// or a scalar: strategy "tensor", repeated over the rows); f32, f16 or bf16.
Result<QuantWeight> unpack_fp8_channel(const Tensor& weight, const Tensor& weight_scale, int64_t out, int64_t in);
Result<QuantWeight> unpack_int8_channel(const Tensor& weight, const Tensor& weight_scale, int64_t out, int64_t in);
// kTernary as a checkpoint stores it: weight_packed [out, in / 4] u8 (every 2-bit field 0, 1 or 2)
// and weight_scale [out, in / group] (f32, f16 or bf16; finite, >= 0). CorruptFile otherwise.
Result<QuantWeight> unpack_ternary(const Tensor& weight_packed, const Tensor& weight_scale, int64_t out, int64_t in,
                                   int group);

// GGUF Q4_0 (io/gguf.h): blocks of 32 weights, an f16 d and 16 bytes whose byte j holds weight j
// in its low nibble and weight j + 16 in its high one; w = (q - 8) * d. That is kInt4Group with
// group 32 exactly: the same nibbles, scale d (f16, exact in f32), zero 8, so the weight is
// repacked (codes and scales pulled apart), never expanded. blocks: the tensor's stored bytes
// [out * in / 32 * 18] u8, row after row (in a multiple of 32).
Result<QuantWeight> unpack_gguf_q4_0(const Tensor& blocks, int64_t out, int64_t in);

// GGUF Q8_0 / Q4_K / Q6_K tensors [out, in] from their stored bytes (blocks: [nbytes] u8, row after
// row; in a multiple of the block) into the kGguf* layouts above. Q4_K and Q6_K blocks whose d
// (or dmin) is not finite are an error naming the row; Q8_0 blocks likewise.
Result<QuantWeight> unpack_gguf_blocks(QuantFormat format, const Tensor& blocks, int64_t out, int64_t in);
// A dense weight [out, in] (f32/f16/bf16 on the host, in a multiple of the block) encoded with
// core/ggml_blocks.h's round-to-nearest encoders into a kGguf* format: load-time `--quant q4_k`
// and test weights.
Result<QuantWeight> quantize_gguf_blocks(const Tensor& w_dense, QuantFormat format);
// A dense weight encoded as GGUF Q4_0 blocks (core/ggml_blocks.h) and held as kInt4Group group 32
// (unpack_gguf_q4_0): load-time `--quant q4_0`.
Result<QuantWeight> quantize_gguf_q4_0(const Tensor& w_dense);
// The bytes of one row of a kGguf* weight's stored blocks: what a GGUF file holds per row.
int64_t gguf_row_bytes(QuantFormat format, int64_t in);
// The weights per block of a kGguf* format: 32 or 256.
int64_t gguf_block_weights(QuantFormat format);
bool is_gguf_block_format(QuantFormat format);

}  // namespace tachyon
