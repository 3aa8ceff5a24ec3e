// What tachyon_cuda_bench's tables share: the options, the timers, the decode shapes and the
// linear arguments around them (defined in cuda_bench.cpp), and the int4 tables (int4_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/cuda/cuda_ops.h"

namespace tachyon::bench {

namespace cu = ops::cuda;

#define BENCH_CUDA(expr) TACHYON_CUDA_RETURN_IF_ERROR(expr)

constexpr size_t kGiB = size_t{1} << 30;

struct Options {
  std::string json_path;
  bool quick = false;
  bool ceilings = false;      // the copy and the matmul alone (the yardsticks of the model benchmarks)
  bool moe = false;           // the copy and ops::moe_experts at Qwen3-30B-A3B's expert shape
  bool prefill_only = false;  // the matmul (the prefill table's yardstick) and prefill attention only
  bool quant_only = false;    // the copy (the packed table's yardstick) and the packed weights only
  std::vector<std::string> quant_formats;  // --quant-formats: the packed table's formats (bf16 always); empty: all
  bool cublaslt_candidates = false;  // the cuBLASLt algorithm candidates table only
  bool cublaslt_splitk = false;      // ... with each candidate's K split 1..16 ways
  bool int4_only = false;  // the copy, the 16-bit linears (the yardstick) and the int4 linears only
  bool read_patterns = false;  // the copy and the weight read patterns only
  bool decode_probe = false;   // the copy and the pieces of a one-token decode step only
  bool int4_slices = false;    // the copy and the int4 decode GEMM at every K slicing only
  bool int4_sol = false;       // the copy and the int4 decode GEMM in its probe modes only
  bool int4_stream_probe = false;  // the copy and the streamed int4 GEMM's stages and blocks per SM only
};

// Median over `reps` of the mean time per call of `iters` calls of `body` on `stream` (ms).
Result<double> time_ms(const std::function<Status(int, cu::Stream)>& body, cu::Stream stream, int warmup, int iters,
                       int reps);

// The same, with the `iters` calls captured once as a CUDA graph and the graph replayed: small
// kernels are timed without the host's launch gaps between them (as a captured decode step runs).
Result<double> time_graph_ms(const std::function<Status(int, cu::Stream)>& body, int warmup, int iters, int reps);

struct Shape {
  const char* name;
  int64_t in, out;
};

struct GemvRow {
  std::string name;
  int64_t in, out, n;
  double gemv_us, gemv_gbps, cublas_us, cublas_gbps;
  double mma_us = 0.0, mma_gbps = 0.0;  // the tensor-core GEMM (0: not run)
};

// A linear's activations and outputs: x [n, s.in] and y [n, s.out], packed rows.
cu::LinearArgs io_args(const cu::DeviceBuffer& x, const cu::DeviceBuffer& y, const Shape& s, int64_t n);

// int4_bench.cpp. Group-wise int4 weights (group 128) on the decode shapes: the GEMV, the
// tensor-core GEMM and kAuto's pick against the fastest bf16 path (bf16_rows) ...
Status bench_int4_gemv(cu::LinearContext& ctx, double copy_gbps, const std::vector<GemvRow>& bf16_rows,
                       nlohmann::json& out, const Options& opt);
// ... and the decode GEMM (1-2 tokens) at every K slicing, the planner's pick marked.
Status bench_int4_slices(double copy_gbps, nlohmann::json& out, const Options& opt);
Status bench_int4_sol(double copy_gbps, nlohmann::json& out, const Options& opt);
Status bench_int4_stream_probe(double copy_gbps, nlohmann::json& out, const Options& opt);

// cublaslt_bench.cpp (--cublaslt-candidates, --cublaslt-splitk).
Status bench_cublaslt_candidates(nlohmann::json& out, const Options& opt);

// moe_bench.cpp (--moe). One row per (format, tokens).
struct MoeRow {
  std::string format;
  int64_t tokens = 0;
  double distinct = 0, us = 0, gbps = 0;
};
Status bench_moe(double copy_gbps, nlohmann::json& out, std::vector<MoeRow>& rows);
void print_moe_table(const std::vector<MoeRow>& rows, double copy_gbps);

}  // namespace tachyon::bench
