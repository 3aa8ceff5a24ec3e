// row_layout: the RowLayout (ops/kernel_types.h) of a Tensor whose last dim is contiguous (stride
// 1) and whose leading dims (up to three of them) have any strides. The CPU kernels and the CUDA
// backend (its rows_of) build their row arguments with it.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/kernel_types.h"

namespace tachyon::ops::cpu {

inline RowLayout row_layout(const Tensor& t) {
  TACHYON_CHECK(t.dim() >= 1 && t.stride(-1) == 1, "tensor {} needs a contiguous last dim", t.shape_string());
  RowLayout l;
  l.cols = t.size(-1);
  const int lead = t.dim() - 1;
  TACHYON_CHECK(lead <= 3, "tensor {} has more than 3 leading dims", t.shape_string());
  int64_t sizes[3] = {1, 1, 1};
  int64_t strides[3] = {0, 0, 0};
  for (int d = 0; d < lead; ++d) {
    sizes[3 - lead + d] = t.size(d);
    strides[3 - lead + d] = t.stride(d);
  }
  l.size1 = sizes[1];
  l.size2 = sizes[2];
  l.stride0 = strides[0];
  l.stride1 = strides[1];
  l.stride2 = strides[2];
  l.rows = sizes[0] * sizes[1] * sizes[2];
  return l;
}

}  // namespace tachyon::ops::cpu
