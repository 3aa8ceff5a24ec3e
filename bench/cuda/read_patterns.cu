// How fast a weight streams from HBM by the shape of one warp instruction's 16-byte loads: each
// instruction reads `P` contiguous bytes from each of 32 / (P / 16) rows. A warp owns 16 rows and
// one K slice of them and keeps 8 loads per lane in flight (4 KB per warp and round), as the
// decode GEMVs do; the loaded words are folded into one value per lane so nothing is elided.
// P = 64 is the tensor-core int4/int8 GEMMs' pattern (a quad per row), P = 512 the GEMVs' (a
// warp per row). For the benchmark only (tachyon_cuda_bench --read-patterns).
#include <cstdint>

#include <cuda_runtime.h>

#include "ops/cuda/device_math.cuh"  // load_stream_16

namespace tachyon::bench {
namespace {

using ops::cuda::detail::load_stream_16;

template <int P>
__global__ void __launch_bounds__(128) read_pattern_kernel(const uint8_t* w, int64_t rows, int64_t row_bytes,
                                                           int64_t slice_bytes, unsigned* sink) {
  constexpr int kLanesPerRow = P / 16, kRowsPerLoad = 32 / kLanesPerRow, kGroups = 16 / kRowsPerLoad;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * 4 + warp) * 16;
  if (row0 >= rows) return;
  const int64_t k0 = blockIdx.y * slice_bytes;
  const int64_t loads = kGroups * (slice_bytes / P);  // (column block, row group) pairs, row group fastest
  const int sub_row = lane / kLanesPerRow, sub_col = (lane % kLanesPerRow) * 16;
  unsigned fold = 0;
  for (int64_t base = 0; base < loads; base += 8) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t idx = base + j < loads ? base + j : loads - 1;
      const int64_t row = row0 + (idx % kGroups) * kRowsPerLoad + sub_row;
      const int64_t col = k0 + (idx / kGroups) * P + sub_col;
      v[j] = load_stream_16(w + (row < rows ? row : rows - 1) * row_bytes + col);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) fold ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (fold == 0x9e3779b9u) sink[0] = fold;  // practically never: keeps the loads
}

}  // namespace

// rows x row_bytes at w; slices of slice_bytes (a multiple of P) over the grid's y.
cudaError_t launch_read_pattern(int p, const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t slice_bytes,
                                unsigned* sink, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((rows + 63) / 64), static_cast<unsigned>(row_bytes / slice_bytes));
  switch (p) {
    case 64: read_pattern_kernel<64><<<grid, 128, 0, stream>>>(w, rows, row_bytes, slice_bytes, sink); break;
    case 128: read_pattern_kernel<128><<<grid, 128, 0, stream>>>(w, rows, row_bytes, slice_bytes, sink); break;
    case 256: read_pattern_kernel<256><<<grid, 128, 0, stream>>>(w, rows, row_bytes, slice_bytes, sink); break;
    case 512: read_pattern_kernel<512><<<grid, 128, 0, stream>>>(w, rows, row_bytes, slice_bytes, sink); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tachyon::bench
