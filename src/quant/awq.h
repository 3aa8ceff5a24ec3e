// Activation-aware weight quantization (AWQ, Lin et al. 2023), the math without the model.
// A few input channels of a linear layer carry activations far larger than the rest; rounding
// their weights costs the most output error. AWQ scales input channel i of W by
// s_i = mean|x_i|^alpha before int4 round-to-nearest and folds 1/s_i into whatever produces x
// (a norm weight, or the rows of the linear before), so the model is unchanged in exact
// arithmetic and only the rounding moves: large-activation channels get finer steps. alpha is
// searched on a grid, keeping the one with the smallest output error on calibration data.
//
// The error is the caller's to measure (it runs the matmuls; this file sits below ops/): it gets
// the candidate weights as they act on the unscaled input, dequantize(Q(W diag(s))) diag(1/s),
// and returns the summed squared output error ||X W^T - X W_candidate^T||^2 over its rows.
// alpha = 0 is on the grid and gives s = 1, plain round-to-nearest, so the chosen alpha never
// does worse than RTN on the rows measured.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

struct AwqOptions {
  int group_size = 128;  // int4 group of the quantized weight: 32, 64 or 128
  int grid = 20;         // alpha in {0, 1/grid, ..., (grid - 1)/grid}
};

// s_i = max(mean_abs[i]^alpha, 1e-4), then divided by sqrt(max(s) * min(s)) so that the
// scales straddle 1 (the folded norm weights neither blow up nor vanish). [in] f32.
std::vector<float> awq_scales(std::span<const float> mean_abs, float alpha);

// w [out, in] (f32/f16/bf16) times diag(column_scales) and, when row_scales is not empty,
// diag(row_scales) from the left: a contiguous f32 copy. Empty column_scales: 1.
Tensor scale_weight(const Tensor& w, std::span<const float> column_scales, std::span<const float> row_scales = {});

// dequantize(Q(w diag(s))) diag(1/s): what the weight quantized with input scales s computes on
// the unscaled input. Q is int4 group round-to-nearest with f16 scales (what checkpoints hold).
// [out, in] f32.
Result<Tensor> awq_fake_quantize(const Tensor& w, std::span<const float> s, int group);

struct AwqSearchResult {
  float alpha = 0.0f;
  std::vector<float> scales;  // [in]: awq_scales(mean_abs, alpha)
  double error = 0.0;         // the caller's squared output error at alpha
  double rtn_error = 0.0;     // at alpha = 0 (round-to-nearest)
  std::vector<double> errors; // per grid point
};

// Squared output error of candidate weights (one per weight of the group, [out_i, in] f32, in
// the unscaled basis).
using AwqErrorFn = std::function<Result<double>(const std::vector<Tensor>& candidates)>;

// Searches alpha for the weights sharing one input (q/k/v, or gate/up, or one weight), each
// [out_i, in]; mean_abs [in] is the mean |x| of each input channel over calibration tokens. Ties
// go to the smaller alpha.
Result<AwqSearchResult> awq_search(const std::vector<Tensor>& weights, std::span<const float> mean_abs,
                                   const AwqOptions& options, const AwqErrorFn& error);

// ---- Clipping (AutoAWQ's clip search) ----
// After scaling, each (row, group) of the weight may round better over a narrower range: the
// weights clamped to [r lo, r hi] (lo <= 0 <= hi the group's extremes) get a finer int4 step,
// and the few clamped ones pay for it. r is searched per (row, group) on a grid from 1 down to
// min_ratio, keeping the one whose output error on the calibration inputs is smallest:
// d^T G d, d the group's rounding error (weight minus its int4 value) and G = X_g^T X_g the Gram
// matrix of the group's input columns. Groups are chosen independently (the cross terms between
// one group's error and another's in the same output are left out, as AutoAWQ does). r = 1 (no
// clipping) is on the grid, so each group's error is never worse than plain rounding's on those
// inputs.

struct AwqClipOptions {
  int group_size = 128;    // 32, 64 or 128
  int grid = 20;           // ratios 1, 1 - (1 - min_ratio) / grid, ..., min_ratio + step
  float min_ratio = 0.5f;
};

// G_g = X_g^T X_g for each group g of x [n, in] f32 (x divided column-wise by `column_scales`
// when given: the input as the scaled weight sees it): groups x group x group doubles, g-major.
std::vector<double> group_gram(const Tensor& x, std::span<const float> column_scales, int group);

struct AwqClipResult {
  Tensor weight;            // [out, in] f32: w with each (row, group) clamped to its chosen range
  double mean_ratio = 1.0;  // over the (row, group)s
  double error = 0.0;            // sum over (row, group) of d^T G d at the chosen ratios
  double unclipped_error = 0.0;  // the same at r = 1
};

// w [out, in] f32 (the scaled weight, to be quantized int4 with f16 scales); gram from
// group_gram() of the same input.
Result<AwqClipResult> awq_clip(const Tensor& w, std::span<const double> gram, const AwqClipOptions& options);

}  // namespace tachyon
