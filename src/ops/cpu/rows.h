// RowLayout: the rows of an activation tensor whose last dim is contiguous (stride 1) and whose
// leading dims (up to three of them) have any strides, e.g. the q part of a fused QKV output
// ([n, num_heads, head_dim] with a row stride of (num_heads + 2 * num_kv_heads) * head_dim).
// Row-wise kernels (norms, softmax, activations) walk rows through it and never assume packing.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon::ops::cpu {

struct RowLayout {
  int64_t rows = 0;   // product of the leading dims
  int64_t cols = 0;   // the last dim
  int64_t size1 = 1;  // leading dims, innermost last: rows = size0 * size1 * size2
  int64_t size2 = 1;
  int64_t stride0 = 0;  // strides in elements of the leading dims
  int64_t stride1 = 0;
  int64_t stride2 = 0;

  // Element offset of row r's first element.
  int64_t offset(int64_t r) const {
    const int64_t i2 = r % size2;
    const int64_t r1 = r / size2;
    const int64_t i1 = r1 % size1;
    const int64_t i0 = r1 / size1;
    return i0 * stride0 + i1 * stride1 + i2 * stride2;
  }

  static RowLayout of(const Tensor& t) {
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
};

}  // namespace tachyon::ops::cpu
