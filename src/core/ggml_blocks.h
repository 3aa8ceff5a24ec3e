// The ggml block formats GGUF files store quantized tensors in: their sizes, the decoding of whole
// blocks to f32 (the definition every loader and kernel is checked against) and round-to-nearest
// encoders. Little-endian, as ggml writes them; a tensor is its rows' blocks one after another.
//
// - Q8_0 (32 weights, 34 bytes): f16 d, i8 q[32]; w = d * q.
// - Q4_0 (32 weights, 18 bytes): f16 d, u8 qs[16]; w[j] = d * ((qs[j] & 15) - 8) and
//   w[j + 16] = d * ((qs[j] >> 4) - 8).
// - Q4_K (256 weights, 144 bytes): f16 d, f16 dmin, u8 scales[12], u8 qs[128]. Eight sub-blocks of
//   32 weights, sub-block s with a 6-bit scale sc[s] and a 6-bit min m[s] (q4_k_scale_min unpacks
//   them from `scales`). Chunk c (0..3) of 64 weights reads qs[32c .. 32c + 32): for l in 0..32
//     w[64c + l]      = (d * sc[2c])     * (qs[32c + l] & 15) - dmin * m[2c]
//     w[64c + 32 + l] = (d * sc[2c + 1]) * (qs[32c + l] >> 4) - dmin * m[2c + 1]
//   in f32. d * sc and dmin * m are exact (11 x 6 significant bits), so each weight rounds once.
// - Q6_K (256 weights, 210 bytes): u8 ql[128], u8 qh[64], i8 scales[16], f16 d. Half h (0..1) of
//   128 weights reads L = ql + 64h and H = qh + 32h: for l in 0..32 the 6-bit codes
//     q[128h + l]      = (L[l] & 15)      | ((H[l] & 3) << 4)
//     q[128h + 32 + l] = (L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)
//     q[128h + 64 + l] = (L[l] >> 4)      | (((H[l] >> 4) & 3) << 4)
//     q[128h + 96 + l] = (L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)
//   and w[i] = (d * scales[i / 16]) * (q[i] - 32) in f32 (d * scales[] exact).
// - Q4_1 (32, 20 bytes): f16 d, f16 m, u8 qs[16]; w[j] = d * (qs[j] & 15) + m, w[j + 16] with
//   qs[j] >> 4.
// - Q5_0 (32, 22 bytes): f16 d, u8 qh[4] (bit j: the fifth bit of weight j), u8 qs[16]; w[j] =
//   d * (((qs[j] & 15) | bit j << 4) - 16), w[j + 16] = d * (((qs[j] >> 4) | bit j + 16 << 4) - 16).
// - Q5_1 (32, 24 bytes): f16 d, f16 m, qh[4], qs[16]; Q5_0's codes unbiased, w = d * q + m.
// - IQ4_NL (32, 18 bytes): f16 d, u8 qs[16]; Q4_0's nibbles index a fixed non-uniform table,
//   w = d * kIq4NlValues[code].
// - Q5_K (256, 176 bytes): f16 d, f16 dmin, u8 scales[12] (Q4_K's), u8 qh[32], u8 qs[128]; chunk
//   c of 64 weights as Q4_K's, each nibble plus 16 where bit 2c (low nibble) or 2c + 1 (high) of
//   qh[l] is set.
//
// Decoded only (GGUF files load them as dense weights; no kernel reads them packed):
// - Q2_K (256, 84 bytes): u8 scales[16] (low nibble a scale, high a min, per 16 weights), u8
//   qs[64], f16 d, f16 dmin. Half h (0..1) of 128 weights reads Q = qs + 32h: weight
//   128h + 32k + l (k = 0..3, l = 0..31) is the 2-bit code at shift 2k of Q[l], and
//   w = (d * (sc & 15)) * q - dmin * (sc >> 4) with sc = scales[8h + 2k + l / 16].
// - Q3_K (256, 110 bytes): u8 hmask[32], u8 qs[64], u8 scales[12] (sixteen 6-bit scales), f16 d.
//   As Q2_K's layout, each 2-bit code minus 4 where its hmask bit (bit 4h + k of hmask[l]) is
//   clear; w = (d * (scale - 32)) * q.
#pragma once

#include <cstdint>
#include <vector>

namespace tachyon {

inline constexpr int64_t kGgmlBlock32 = 32;    // weights per Q8_0 / Q4_0 block
inline constexpr int64_t kGgmlBlockK = 256;    // weights per Q4_K / Q6_K super-block
inline constexpr int64_t kQ8_0Bytes = 34;
inline constexpr int64_t kQ4_0Bytes = 18;
inline constexpr int64_t kQ4_KBytes = 144;
inline constexpr int64_t kQ6_KBytes = 210;
inline constexpr int64_t kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ5_1Bytes = 24;
inline constexpr int64_t kQ2_KBytes = 84, kQ3_KBytes = 110, kQ5_KBytes = 176, kIq4NlBytes = 18;
// Offsets inside a Q5_K block.
inline constexpr int64_t kQ5_KQh = 16, kQ5_KQs = 48;
// IQ4_NL's 16 levels (a code indexes them).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// Offsets inside a Q6_K block.
inline constexpr int64_t kQ6_KQh = 128, kQ6_KScales = 192, kQ6_KD = 208;

// Scale and min of sub-block s (0..7) of a Q4_K block, from its 12 packed bytes: s < 4 takes the
// low 6 bits of bytes s and s + 4; s >= 4 takes a nibble of byte s + 4 and the top 2 bits of bytes
// s - 4 (scale) and s (min).
inline void q4_k_scale_min(const uint8_t* scales, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *m = scales[s + 4] & 63;
  } else {
    *sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
    *m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// Decodes `n_blocks` consecutive blocks into out [n_blocks * weights per block] f32.
void dequantize_q8_0(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q4_0(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q4_k(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q6_k(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q4_1(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q5_0(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q5_1(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q2_k(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q3_k(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_q5_k(const uint8_t* blocks, int64_t n_blocks, float* out);
void dequantize_iq4_nl(const uint8_t* blocks, int64_t n_blocks, float* out);

// Encodes `count` f32 values (a multiple of the block) as blocks appended to `out`, round to
// nearest (no error search: these make test models and load-time quantization, not shipped files).
// Q8_0: d = max|x| / 127, q = round(x / d). Q4_0: d = m / -8 where m is the value of largest
// magnitude (sign kept), q = min(15, trunc(x / d + 8.5)).
// Q4_K: each sub-block's range [lo, hi] widened to hold 0; its step (hi - lo) / 15 is quantized to
// 6 bits against d = max step / 63 rounding up (so the step never shrinks) and its min -lo against
// dmin = max min / 63 to nearest, then q = round((x + dmin * m) / (d * sc)) clamped to 0..15.
// Q6_K: each 16 weights' step max|x| / 31 is quantized to an int8 scale against
// d = max step / 127 rounding up, then q = round(x / (d * sc)) + 32 clamped to 0..63.
// d and dmin are stored as f16 (rounded up too, for the same reason).
// Q5_0: Q4_0's rule with 32 levels, d = m / -16, q = min(31, trunc(x / d + 16.5)).
// Q4_1 / Q5_1: the block's range [lo, hi], d = (hi - lo) / 15 (31) stored as f16 rounding up, m =
// f16(lo), q = round((x - m) / d) clamped to 0..15 (0..31).
// Q5_K: Q4_K's rule with steps (hi - lo) / 31 and codes 0..31.
// IQ4_NL: d = m / -127 (m the value of largest magnitude, which maps to the table's -127), each
// code the nearest level to x / d.
void quantize_q8_0(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q4_0(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q4_k(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q6_k(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q4_1(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q5_0(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q5_1(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_q5_k(const float* values, int64_t count, std::vector<uint8_t>* out);
void quantize_iq4_nl(const float* values, int64_t count, std::vector<uint8_t>* out);

}  // namespace tachyon
