#include "core/ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace tachyon {
namespace {

float load_f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

void put_f16(std::vector<uint8_t>* out, uint16_t bits) {
  out->push_back(static_cast<uint8_t>(bits & 0xff));
  out->push_back(static_cast<uint8_t>(bits >> 8));
}

// The smallest f16 >= v (v finite, >= 0, within f16's range).
uint16_t f16_at_least(float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;  // positive f16 values order like their bits
  return h;
}

int round_clamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

}  // namespace

void dequantize_q8_0(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ8_0Bytes;
    const float d = load_f16(block);
    const auto* q = reinterpret_cast<const int8_t*>(block + 2);
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(q[j]);
  }
}

void dequantize_q4_0(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ4_0Bytes;
    const float d = load_f16(block);
    const uint8_t* qs = block + 2;
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      out[b * 32 + j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

namespace {
// Q4_K's and Q5_K's chunk c (64 weights): the step and offset of its two sub-blocks (2c, 2c + 1),
// d * sc and dmin * m (exact products).
struct ChunkScales {
  float s0, o0, s1, o1;
};
ChunkScales chunk_scales(const uint8_t* scales, int c, float d, float dmin) {
  int sc0, m0, sc1, m1;
  q4_k_scale_min(scales, 2 * c, &sc0, &m0);
  q4_k_scale_min(scales, 2 * c + 1, &sc1, &m1);
  return {d * static_cast<float>(sc0), dmin * static_cast<float>(m0), d * static_cast<float>(sc1),
          dmin * static_cast<float>(m1)};
}
}  // namespace

void dequantize_q4_k(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ4_KBytes;
    const float d = load_f16(block), dmin = load_f16(block + 2);
    const uint8_t* scales = block + 4;
    const uint8_t* qs = block + 16;
    float* y = out + b * kGgmlBlockK;
    for (int c = 0; c < 4; ++c) {
      const ChunkScales k = chunk_scales(scales, c, d, dmin);
      const float s0 = k.s0, o0 = k.o0, s1 = k.s1, o1 = k.o1;
      for (int l = 0; l < 32; ++l) {
        y[64 * c + l] = s0 * static_cast<float>(qs[32 * c + l] & 15) - o0;
        y[64 * c + 32 + l] = s1 * static_cast<float>(qs[32 * c + l] >> 4) - o1;
      }
    }
  }
}

// Q4_1 / Q5_0 / Q5_1: 32 weights; `high` (null for Q4_1) the 32 fifth bits, `bias` 16 for Q5_0.
namespace {
void dequantize_32(const uint8_t* qs, const uint8_t* high, float d, float m, bool offset_m, int bias, float* y) {
  uint32_t qh = 0;
  if (high != nullptr) std::memcpy(&qh, high, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    if (offset_m) {
      y[j] = d * static_cast<float>(lo) + m;
      y[j + 16] = d * static_cast<float>(hi) + m;
    } else {
      y[j] = d * static_cast<float>(lo - bias);
      y[j + 16] = d * static_cast<float>(hi - bias);
    }
  }
}
}  // namespace

void dequantize_q4_1(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ4_1Bytes;
    dequantize_32(block + 4, nullptr, load_f16(block), load_f16(block + 2), true, 0, out + b * kGgmlBlock32);
  }
}

void dequantize_q5_0(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ5_0Bytes;
    dequantize_32(block + 6, block + 2, load_f16(block), 0.0f, false, 16, out + b * kGgmlBlock32);
  }
}

void dequantize_q5_1(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ5_1Bytes;
    dequantize_32(block + 8, block + 4, load_f16(block), load_f16(block + 2), true, 0, out + b * kGgmlBlock32);
  }
}

void dequantize_iq4_nl(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kIq4NlBytes;
    const float d = load_f16(block);
    const uint8_t* qs = block + 2;
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + j] = d * static_cast<float>(kIq4NlValues[qs[j] & 15]);
      out[b * 32 + j + 16] = d * static_cast<float>(kIq4NlValues[qs[j] >> 4]);
    }
  }
}

void dequantize_q2_k(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ2_KBytes;
    const uint8_t* scales = block;
    const float d = load_f16(block + 80), dmin = load_f16(block + 82);
    float* y = out + b * kGgmlBlockK;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = block + 16 + 32 * h;
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t sc = scales[8 * h + 2 * k + l / 16];
          const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
          y[128 * h + 32 * k + l] = dl * static_cast<float>((q[l] >> (2 * k)) & 3) - ml;
        }
      }
    }
  }
}

void dequantize_q3_k(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ3_KBytes;
    const uint8_t* hmask = block;
    const uint8_t* s = block + 96;
    const float d = load_f16(block + 108);
    // Sixteen 6-bit scales: the low nibbles of s[0..8) (scales 0-7) and their high nibbles
    // (8-15), the top two bits of each from s[8..12) (2 bits per scale, scale i at byte i % 4,
    // shift 2 (i / 4)).
    int scale[16];
    for (int i = 0; i < 16; ++i) {
      const int low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
      const int top = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
      scale[i] = (low | (top << 4)) - 32;
    }
    float* y = out + b * kGgmlBlockK;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = block + 32 + 32 * h;
      for (int k = 0; k < 4; ++k) {
        const uint8_t bit = static_cast<uint8_t>(1u << (4 * h + k));
        for (int l = 0; l < 32; ++l) {
          const float dl = d * static_cast<float>(scale[8 * h + 2 * k + l / 16]);
          const int code = ((q[l] >> (2 * k)) & 3) - ((hmask[l] & bit) ? 0 : 4);
          y[128 * h + 32 * k + l] = dl * static_cast<float>(code);
        }
      }
    }
  }
}

void dequantize_q5_k(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ5_KBytes;
    const float d = load_f16(block), dmin = load_f16(block + 2);
    const uint8_t* scales = block + 4;
    const uint8_t* qh = block + 16;
    const uint8_t* qs = block + 48;
    float* y = out + b * kGgmlBlockK;
    for (int c = 0; c < 4; ++c) {
      const ChunkScales k = chunk_scales(scales, c, d, dmin);
      const float s0 = k.s0, o0 = k.o0, s1 = k.s1, o1 = k.o1;
      for (int l = 0; l < 32; ++l) {
        const int lo = (qs[32 * c + l] & 15) + ((qh[l] >> (2 * c)) & 1) * 16;
        const int hi = (qs[32 * c + l] >> 4) + ((qh[l] >> (2 * c + 1)) & 1) * 16;
        y[64 * c + l] = s0 * static_cast<float>(lo) - o0;
        y[64 * c + 32 + l] = s1 * static_cast<float>(hi) - o1;
      }
    }
  }
}

void dequantize_q6_k(const uint8_t* blocks, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = blocks + b * kQ6_KBytes;
    const auto* scales = reinterpret_cast<const int8_t*>(block + kQ6_KScales);
    const float d = load_f16(block + kQ6_KD);
    float* y = out + b * kGgmlBlockK;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* L = block + 64 * h;
      const uint8_t* H = block + kQ6_KQh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {(L[l] & 15) | ((H[l] & 3) << 4), (L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4),
                          (L[l] >> 4) | (((H[l] >> 4) & 3) << 4), (L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)};
        for (int k = 0; k < 4; ++k) {
          const int i = 128 * h + 32 * k + l;
          y[i] = (d * static_cast<float>(scales[i / 16])) * static_cast<float>(q[k] - 32);
        }
      }
    }
  }
}

void quantize_q8_0(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* x = values + b * 32;  // [32] f32
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, f32_to_f16(d));
    for (int j = 0; j < 32; ++j) out->push_back(static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * inv_d))));
  }
}

void quantize_q4_0(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* x = values + b * 32;  // [32] f32
    float amax = 0.0f, signed_max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        signed_max = x[j];
      }
    }
    // The largest-magnitude value maps to -8 exactly; the other side reaches at most +7.
    const float d = signed_max / -8.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, f32_to_f16(d));
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(x[j] * inv_d + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + 16] * inv_d + 8.5f));
      out->push_back(static_cast<uint8_t>(lo | (hi << 4)));
    }
  }
}

namespace {

// Q4_K's and Q5_K's scales for one super-block x[256] with codes 0..levels: each sub-block's range
// [lo, hi] widened to hold 0, its step (hi - lo) / levels quantized to 6 bits against d = max step /
// 63 rounding up (so the step never shrinks), its min -lo against dmin = max min / 63 to nearest;
// d and dmin stored as f16, rounded up. Writes the block's first 16 bytes (d, dmin, scales[12]) and
// each sub-block's step d * sc and offset dmin * m.
void k_quant_scales(const float* x, int levels, uint8_t* head, float* step_out, float* offset_out) {
  float step[8], min[8], max_step = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    float lo = 0.0f, hi = 0.0f;
    for (int j = 0; j < 32; ++j) {
      lo = std::min(lo, x[32 * s + j]);
      hi = std::max(hi, x[32 * s + j]);
    }
    step[s] = (hi - lo) / static_cast<float>(levels);
    min[s] = -lo;
    max_step = std::max(max_step, step[s]);
    max_min = std::max(max_min, min[s]);
  }
  const uint16_t d_bits = f16_at_least(max_step / 63.0f), dmin_bits = f16_at_least(max_min / 63.0f);
  const float d = f16_to_f32(d_bits), dmin = f16_to_f32(dmin_bits);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0.0f ? std::clamp(static_cast<int>(std::ceil(step[s] / d)), 0, 63) : 0;
    m[s] = dmin > 0.0f ? round_clamp(min[s] / dmin, 0, 63) : 0;
    step_out[s] = d * static_cast<float>(sc[s]);
    offset_out[s] = dmin * static_cast<float>(m[s]);
  }
  std::memcpy(head, &d_bits, 2);
  std::memcpy(head + 2, &dmin_bits, 2);
  uint8_t* scales = head + 4;
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = static_cast<uint8_t>((m[s] & 63) | ((m[s + 4] >> 4) << 6));
    scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 15) | ((m[s + 4] & 15) << 4));
  }
}

}  // namespace

void quantize_q4_k(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / kGgmlBlockK; ++b) {
    const float* x = values + b * kGgmlBlockK;  // [256] f32
    uint8_t block[kQ4_KBytes];
    float step[8], offset[8];
    k_quant_scales(x, 15, block, step, offset);
    uint8_t* qs = block + 16;
    for (int c = 0; c < 4; ++c) {
      const float s0 = step[2 * c], o0 = offset[2 * c], s1 = step[2 * c + 1], o1 = offset[2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        const int q0 = s0 > 0.0f ? round_clamp((x[64 * c + l] + o0) / s0, 0, 15) : 0;
        const int q1 = s1 > 0.0f ? round_clamp((x[64 * c + 32 + l] + o1) / s1, 0, 15) : 0;
        qs[32 * c + l] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
    out->insert(out->end(), block, block + kQ4_KBytes);
  }
}

void quantize_q6_k(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / kGgmlBlockK; ++b) {
    const float* x = values + b * kGgmlBlockK;  // [256] f32
    float step[16], max_step = 0.0f;
    for (int s = 0; s < 16; ++s) {
      float amax = 0.0f;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[16 * s + j]));
      step[s] = amax / 31.0f;
      max_step = std::max(max_step, step[s]);
    }
    const uint16_t d_bits = f16_at_least(max_step / 127.0f);
    const float d = f16_to_f32(d_bits);
    int8_t scales[16];
    int q[256];
    for (int s = 0; s < 16; ++s) {
      scales[s] = static_cast<int8_t>(d > 0.0f ? std::clamp(static_cast<int>(std::ceil(step[s] / d)), 0, 127) : 0);
      const float st = d * static_cast<float>(scales[s]);
      for (int j = 0; j < 16; ++j) q[16 * s + j] = st > 0.0f ? round_clamp(x[16 * s + j] / st, -32, 31) + 32 : 32;
    }
    uint8_t block[kQ6_KBytes] = {};
    for (int h = 0; h < 2; ++h) {
      uint8_t* L = block + 64 * h;
      uint8_t* H = block + kQ6_KQh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int* qq = q + 128 * h + l;  // qq[32 k] is code k of this l
        L[l] = static_cast<uint8_t>((qq[0] & 15) | ((qq[64] & 15) << 4));
        L[l + 32] = static_cast<uint8_t>((qq[32] & 15) | ((qq[96] & 15) << 4));
        H[l] = static_cast<uint8_t>((qq[0] >> 4) | ((qq[32] >> 4) << 2) | ((qq[64] >> 4) << 4) | ((qq[96] >> 4) << 6));
      }
    }
    std::memcpy(block + kQ6_KScales, scales, 16);
    std::memcpy(block + kQ6_KD, &d_bits, 2);
    out->insert(out->end(), block, block + kQ6_KBytes);
  }
}

namespace {

// The largest-magnitude value of x[0, n), sign kept.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, m = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  return m;
}

// Q4_1 / Q5_1 (levels 15 or 31): f16 d, f16 m, then for Q5_1 the fifth bits, then the nibbles.
void quantize_offset_32(const float* values, int64_t count, int levels, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* x = values + b * 32;  // [32] f32
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    const uint16_t d_bits = f16_at_least((hi - lo) / static_cast<float>(levels)), m_bits = f32_to_f16(lo);
    const float d = f16_to_f32(d_bits), m = f16_to_f32(m_bits);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = d > 0.0f ? round_clamp((x[j] - m) / d, 0, levels) : 0;
    put_f16(out, d_bits);
    put_f16(out, m_bits);
    if (levels == 31) {
      uint32_t qh = 0;
      for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      for (int k = 0; k < 4; ++k) out->push_back(static_cast<uint8_t>(qh >> (8 * k)));
    }
    for (int j = 0; j < 16; ++j) out->push_back(static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4)));
  }
}

}  // namespace

void quantize_q4_1(const float* values, int64_t count, std::vector<uint8_t>* out) {
  quantize_offset_32(values, count, 15, out);
}

void quantize_q5_1(const float* values, int64_t count, std::vector<uint8_t>* out) {
  quantize_offset_32(values, count, 31, out);
}

void quantize_q5_0(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* x = values + b * 32;  // [32] f32
    // The largest-magnitude value maps to -16 exactly; the other side reaches at most +15.
    const float d = signed_absmax(x, 32) / -16.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>(x[j] * inv_d + 16.5f), 0, 31);
    put_f16(out, f32_to_f16(d));
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    for (int k = 0; k < 4; ++k) out->push_back(static_cast<uint8_t>(qh >> (8 * k)));
    for (int j = 0; j < 16; ++j) out->push_back(static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4)));
  }
}

void quantize_iq4_nl(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* x = values + b * 32;  // [32] f32
    const uint16_t d_bits = f32_to_f16(signed_absmax(x, 32) / static_cast<float>(kIq4NlValues[0]));
    const float d = f16_to_f32(d_bits);
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int j = 0; j < 32; ++j) {
      const float v = x[j] * inv_d;
      int best = 0;
      for (int k = 1; k < 16; ++k) {
        if (std::fabs(v - kIq4NlValues[k]) < std::fabs(v - kIq4NlValues[best])) best = k;
      }
      q[j] = best;
    }
    put_f16(out, d_bits);
    for (int j = 0; j < 16; ++j) out->push_back(static_cast<uint8_t>(q[j] | (q[j + 16] << 4)));
  }
}

void quantize_q5_k(const float* values, int64_t count, std::vector<uint8_t>* out) {
  for (int64_t b = 0; b < count / kGgmlBlockK; ++b) {
    const float* x = values + b * kGgmlBlockK;  // [256] f32
    uint8_t block[kQ5_KBytes] = {};
    float step[8], offset[8];
    k_quant_scales(x, 31, block, step, offset);
    uint8_t* qh = block + kQ5_KQh;
    uint8_t* qs = block + kQ5_KQs;
    for (int c = 0; c < 4; ++c) {
      const float s0 = step[2 * c], o0 = offset[2 * c], s1 = step[2 * c + 1], o1 = offset[2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        const int q0 = s0 > 0.0f ? round_clamp((x[64 * c + l] + o0) / s0, 0, 31) : 0;
        const int q1 = s1 > 0.0f ? round_clamp((x[64 * c + 32 + l] + o1) / s1, 0, 31) : 0;
        qs[32 * c + l] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
        qh[l] = static_cast<uint8_t>(qh[l] | ((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
      }
    }
    out->insert(out->end(), block, block + kQ5_KBytes);
  }
}

}  // namespace tachyon
