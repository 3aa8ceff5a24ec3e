// make_rope_table: RoPE inverse frequencies and the cos/sin magnitude from a RopeConfig, with the
// context-extension schemes of Hugging Face transformers (linear, Llama 3.1, YaRN) reproduced from
// their published definitions. Computed in double and rounded once to f32. The config comes from a
// model's config file: the model loader validates it (rotary_dim even and > 0, factor > 0); here
// those are invariants.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/ops.h"

namespace tachyon {
namespace {

// Llama 3.1: frequencies whose wavelength is long compared to the original context are divided
// by `factor`, short ones kept, and the band between blended smoothly.
double llama3_scale(double inv_freq, const RopeConfig& c) {
  const double original = c.original_max_position;
  const double low_freq_wavelen = original / c.low_freq_factor;
  const double high_freq_wavelen = original / c.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / inv_freq;
  if (wavelen < high_freq_wavelen) return inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / c.factor;
  const double smooth = (original / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  return (1.0 - smooth) * inv_freq / c.factor + smooth * inv_freq;
}

// YaRN: the pair index at which a frequency completes `rotations` turns over the original context.
double yarn_correction_dim(double rotations, int rotary_dim, double theta, double original) {
  return rotary_dim * std::log(original / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& config) {
  TACHYON_CHECK(config.rotary_dim > 0 && config.rotary_dim % 2 == 0, "rope: rotary_dim {} must be even and > 0",
                config.rotary_dim);
  TACHYON_CHECK(config.theta > 0.0f, "rope: theta {} must be > 0", config.theta);
  TACHYON_CHECK(config.scaling == RopeScaling::kNone || config.factor > 0.0f, "rope: scaling factor {} must be > 0",
                config.factor);
  RopeTable table;
  table.style = config.style;
  table.rotary_dim = config.rotary_dim;
  const int half = config.rotary_dim / 2;
  const double theta = config.theta;
  table.inv_freq.resize(static_cast<size_t>(half));

  // YaRN ramp bounds (pair indices); unused by the other schemes.
  double ramp_low = 0.0, ramp_high = 1.0;
  if (config.scaling == RopeScaling::kYarn) {
    double low = yarn_correction_dim(config.yarn_beta_fast, config.rotary_dim, theta, config.original_max_position);
    double high = yarn_correction_dim(config.yarn_beta_slow, config.rotary_dim, theta, config.original_max_position);
    if (config.yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    ramp_low = std::max(low, 0.0);
    ramp_high = std::min(high, static_cast<double>(config.rotary_dim - 1));
    if (ramp_low == ramp_high) ramp_high += 0.001;  // avoid a zero-width ramp
  }

  for (int i = 0; i < half; ++i) {
    const double base = 1.0 / std::pow(theta, 2.0 * i / config.rotary_dim);
    double inv = base;
    switch (config.scaling) {
      case RopeScaling::kNone: break;
      case RopeScaling::kLinear: inv = base / config.factor; break;
      case RopeScaling::kLlama3: inv = llama3_scale(base, config); break;
      case RopeScaling::kYarn: {
        // ramp 0: keep the original frequency (extrapolate); ramp 1: divide by factor (interpolate).
        const double ramp = std::clamp((i - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
        inv = base / config.factor * ramp + base * (1.0 - ramp);
        break;
      }
    }
    table.inv_freq[static_cast<size_t>(i)] = static_cast<float>(inv);
  }

  if (config.scaling == RopeScaling::kYarn) {
    if (config.yarn_attention_factor > 0.0f) {
      table.attention_scale = config.yarn_attention_factor;
    } else {
      table.attention_scale = config.factor <= 1.0f ? 1.0f : static_cast<float>(0.1 * std::log(config.factor) + 1.0);
    }
  }
  return table;
}

}  // namespace tachyon
