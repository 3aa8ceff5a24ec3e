// tachyon_cuda_bench: the CUDA backend against the device's own ceilings, on random data.
//
//   tachyon_cuda_bench [--json FILE] [--quick] [--quant-formats A,B,...] [--ceilings | --moe | --prefill-only |
//                      --quant-only |
//                      --int4-only | --read-patterns |
//                      --decode-probe | --int4-slices | --int4-sol | --int4-stream-probe | --cublaslt-candidates |
//                      --cublaslt-splitk]
//
//   copy       cudaMemcpy device-to-device of 1 GiB; GB/s counts bytes read + bytes written
//              (--ceilings: the copy and the matmul alone)
//   moe        (--moe, with the copy) ops::moe_experts at Qwen3-30B-A3B's expert shape, bf16 and int4
//              g128, 1..512 tokens: GB/s of the distinct chosen experts' bytes, fraction of the copy
//   matmul     cuBLASLt bf16 x bf16 -> f32, 8192^3; TFLOP/s
//   gemv       the custom GEMV on Llama-3-8B's decode shapes (bf16 weights) at n = 1, 2, 4, 8, 16 tokens:
//              GB/s of weight bytes, and as a fraction of the measured copy bandwidth; cuBLASLt
//              on the same problem beside it
//   packed     bf16 and the packed formats (GGUF Q8_0 / Q4_K / Q6_K, W8A8 and fp8 with per-token or
//              static activation scales, ternary) on
//              Llama-3-8B's linear shapes through kAuto at n = 1, 2, 4, 8, 32, 256: GB/s of the
//              bytes one pass reads (packed rows + scales), the fraction of the copy bandwidth,
//              TFLOP/s, and the time against bf16's (--quant-only: the copy and this alone;
//              --quant-formats w8a8,w8a8-st: those formats and bf16 alone)
//   attention  decode attention (Llama-3-8B heads: 32 q / 8 kv, head_dim 128, bf16 and i8 caches,
//              blocks of 16) at batch 1 and 32, context 1k / 4k / 16k: GB/s of K/V bytes read
//              (an i8 cache's scales included)
//   cublaslt   (--cublaslt-candidates, alone) bf16 x bf16 -> f32 on Llama-3-8B's linear shapes at
//              16..256 tokens: cuBLASLt's first heuristic against the fastest of its top 8, each
//              timed; what an algorithm search at load time could gain. --cublaslt-splitk: at
//              8..64 tokens, every candidate again with its K split 1..16 ways
//   probe      (--decode-probe, alone) the pieces of a batch-1 decode step: the one-token GEMV
//              with other tiles, decode attention at 128..2048 keys by slice count, a chain of
//              one-row norms
//   slices     (--int4-slices, alone) the int4 decode GEMM (1-2 tokens) on the same shapes at every
//              K slicing, the planner's choice marked
//   sol        (--int4-sol, alone) the int4 decode GEMM at one token and the planner's slicing with
//              parts of it left out (no decoding or mma, no staging, weights read tile-major): what
//              its time is made of
//   stream     (--int4-stream-probe, alone) the streamed int4 GEMM (sm_90, 1-2 tokens) on the same
//              shapes with 3..8 stages and one or two blocks per SM, the planner's K split
//   prefill    causal prefill attention of one sequence (same heads, bf16 and i8 caches) at 512 to
//              32k tokens (the CUDA-core kernel up to 8k): TFLOP/s, and as a fraction of the
//              matmul's (--prefill-only: the matmul and this alone)
//
// Every kernel is timed with CUDA events over many calls after warm-up, median of 5 repetitions;
// GEMV and attention calls are captured in a CUDA graph and replayed (no host launch gaps).
// Weights and caches rotate through copies that together exceed the L2 many times, so each call
// reads from device memory as a model's step does. JSON goes to --json FILE (or stdout), then a
// short table is printed last.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/launch.h"
#include "quant/quantize.h"

namespace tachyon::bench {

Result<double> time_ms(const std::function<Status(int, cu::Stream)>& body, cu::Stream stream, int warmup, int iters,
                       int reps) {
  cudaEvent_t start = nullptr, stop = nullptr;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> samples;
  for (int i = 0; i < warmup; ++i) TACHYON_RETURN_IF_ERROR(body(i, stream));
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) TACHYON_RETURN_IF_ERROR(body(i, stream));
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms) / iters);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

Result<double> time_graph_ms(const std::function<Status(int, cu::Stream)>& body, int warmup, int iters, int reps) {
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < warmup; ++i) TACHYON_RETURN_IF_ERROR(body(i, stream));  // plans, scratch growth
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  Status captured = Status::Ok();
  for (int i = 0; i < iters && captured.ok(); ++i) captured = body(i, stream);
  cudaGraph_t graph = nullptr;
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  TACHYON_RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&](int, cu::Stream s) -> Status {
    BENCH_CUDA(cudaGraphLaunch(exec, s));
    return Status::Ok();
  };
  TACHYON_ASSIGN_OR_RETURN(double ms, time_ms(replay, stream, 2, 1, reps));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return ms / iters;
}

cu::LinearArgs io_args(const cu::DeviceBuffer& x, const cu::DeviceBuffer& y, const Shape& s, int64_t n) {
  cu::LinearArgs a;
  a.x = x.as<float>();
  a.x_stride = s.in;
  a.y = y.as<float>();
  a.y_stride = s.out;
  a.n = n;
  a.in = s.in;
  a.out = s.out;
  return a;
}

namespace {

// ---- copy ------------------------------------------------------------------------------------------

Result<double> bench_copy(nlohmann::json& out, const Options& opt) {
  const size_t bytes = opt.quick ? kGiB / 4 : kGiB;
  TACHYON_ASSIGN_OR_RETURN(auto src, cu::DeviceBuffer::allocate(bytes, "copy source"));
  TACHYON_ASSIGN_OR_RETURN(auto dst, cu::DeviceBuffer::allocate(bytes, "copy destination"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(src.data(), DType::kF32, static_cast<int64_t>(bytes / 4), 1, -1.f, 1.f, nullptr));
  TACHYON_ASSIGN_OR_RETURN(
      double ms,
      time_ms([&](int, cu::Stream st) { return cu::copy_on_device(dst.data(), src.data(), bytes, st); }, nullptr, 3, 10, 5));
  const double gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  out["copy"] = {{"bytes", bytes}, {"ms", ms}, {"gbps_read_plus_write", gbps}};
  std::fprintf(stderr, "copy: %zu bytes in %.3f ms: %.1f GB/s (read + write)\n", bytes, ms, gbps);
  return gbps;
}

// ---- matmul ----------------------------------------------------------------------------------------

Result<double> bench_matmul(cu::LinearContext& ctx, nlohmann::json& out, const Options& opt) {
  const int64_t m = opt.quick ? 4096 : 8192;
  TACHYON_ASSIGN_OR_RETURN(auto x, cu::DeviceBuffer::allocate(m * m * 2, "matmul x"));
  TACHYON_ASSIGN_OR_RETURN(auto w, cu::DeviceBuffer::allocate(m * m * 2, "matmul w"));
  TACHYON_ASSIGN_OR_RETURN(auto y, cu::DeviceBuffer::allocate(m * m * 4, "matmul y"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(x.data(), DType::kBF16, m * m, 2, -1.f, 1.f, nullptr));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(w.data(), DType::kBF16, m * m, 3, -1.f, 1.f, nullptr));
  TACHYON_ASSIGN_OR_RETURN(double ms, time_ms(
                                          [&](int, cu::Stream st) {
                                            return cu::gemm_bf16(ctx, x.as<uint16_t>(), m, w.as<uint16_t>(), m,
                                                                 nullptr, y.as<float>(), m, m, m, m, st);
                                          },
                                          nullptr, 3, 10, 5));
  const double tflops = 2.0 * static_cast<double>(m) * m * m / (ms * 1e-3) / 1e12;
  out["matmul"] = {{"m", m}, {"n", m}, {"k", m}, {"ms", ms}, {"tflops", tflops}, {"types", "bf16 x bf16 -> f32"}};
  std::fprintf(stderr, "matmul %lld^3 bf16: %.3f ms: %.1f TFLOP/s\n", static_cast<long long>(m), ms, tflops);
  return tflops;
}

// ---- gemv ------------------------------------------------------------------------------------------

// A bf16 weight of `s`'s shape in copies that together exceed `rotate_bytes` (call i reads copy
// i % copies, from device memory), with random activations for up to `max_n` tokens.
struct Bf16LinearCase {
  Shape s;
  size_t weight_bytes = 0;
  int copies = 1;
  cu::DeviceBuffer weights, x, y;

  cu::LinearArgs args(int i, int64_t n) const {
    cu::LinearArgs a = io_args(x, y, s, n);
    a.w = static_cast<const char*>(weights.data()) + static_cast<size_t>(i % copies) * weight_bytes;
    a.w_dtype = DType::kBF16;
    a.w_stride = s.in;
    return a;
  }
};

Result<Bf16LinearCase> make_bf16_linear(const Shape& s, size_t rotate_bytes, int64_t max_n) {
  Bf16LinearCase c;
  c.s = s;
  c.weight_bytes = static_cast<size_t>(s.in * s.out) * 2;
  c.copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + c.weight_bytes - 1) / c.weight_bytes));
  TACHYON_ASSIGN_OR_RETURN(c.weights, cu::DeviceBuffer::allocate(c.weight_bytes * c.copies, "bf16 weights"));
  TACHYON_RETURN_IF_ERROR(
      cu::fill_random(c.weights.data(), DType::kBF16, s.in * s.out * c.copies, 7, -0.05f, 0.05f, nullptr));
  TACHYON_ASSIGN_OR_RETURN(c.x, cu::DeviceBuffer::allocate(max_n * s.in * 4, "x"));
  TACHYON_ASSIGN_OR_RETURN(c.y, cu::DeviceBuffer::allocate(max_n * s.out * 4, "y"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c.x.data(), DType::kF32, max_n * s.in, 8, -1.f, 1.f, nullptr));
  return c;
}

Status bench_gemv(cu::LinearContext& ctx, double copy_gbps, nlohmann::json& out, std::vector<GemvRow>& rows,
                  const Options& opt) {
  const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                     {"k/v 4096->1024", 4096, 1024},
                                     {"qkv 4096->6144", 4096, 6144},
                                     {"gate/up 4096->14336", 4096, 14336},
                                     {"gate+up 4096->28672", 4096, 28672},
                                     {"down 14336->4096", 14336, 4096},
                                     {"lm_head 4096->128256", 4096, 128256}};
  TACHYON_ASSIGN_OR_RETURN(const int cc, cu::current_compute_capability());
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  TACHYON_RETURN_IF_ERROR(ctx.reserve(64, 14336, 128256));
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : shapes) {
    TACHYON_ASSIGN_OR_RETURN(Bf16LinearCase c, make_bf16_linear(s, rotate_bytes, 64));
    const size_t weight_bytes = c.weight_bytes;
    const int copies = c.copies;
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      auto run = [&](cu::LinearAlgo algo) {
        return [&, algo](int i, cu::Stream st) { return cu::linear(ctx, c.args(i, n), st, algo); };
      };
      const int iters = std::max(copies, 40);
      double gemv_ms = 0.0, mma_ms = 0.0;
      if (n <= 16) {
        TACHYON_ASSIGN_OR_RETURN(gemv_ms, time_graph_ms(run(cu::LinearAlgo::kGemv), copies, iters, 5));
      }
      TACHYON_ASSIGN_OR_RETURN(double cublas_ms, time_graph_ms(run(cu::LinearAlgo::kCublasLt), copies, iters, 5));
      if (cc >= 80) {
        TACHYON_ASSIGN_OR_RETURN(mma_ms, time_graph_ms(run(cu::LinearAlgo::kMma), copies, iters, 5));
      }
      const auto gbps = [&](double ms) { return ms > 0.0 ? weight_bytes / (ms * 1e-3) / 1e9 : 0.0; };
      GemvRow r{s.name, s.in, s.out, n, gemv_ms * 1e3, gbps(gemv_ms), cublas_ms * 1e3, gbps(cublas_ms),
                mma_ms * 1e3, gbps(mma_ms)};
      rows.push_back(r);
      list.push_back({{"shape", s.name}, {"in", s.in}, {"out", s.out}, {"n", n}, {"weight_bytes", weight_bytes},
                      {"gemv_us", r.gemv_us}, {"gemv_gbps", r.gemv_gbps}, {"gemv_fraction_of_copy", r.gemv_gbps / copy_gbps},
                      {"cublaslt_us", r.cublas_us}, {"cublaslt_gbps", r.cublas_gbps},
                      {"cublaslt_fraction_of_copy", r.cublas_gbps / copy_gbps}, {"mma_us", r.mma_us},
                      {"mma_gbps", r.mma_gbps}, {"mma_fraction_of_copy", r.mma_gbps / copy_gbps}});
      std::fprintf(stderr,
                   "gemv %-22s n=%2lld: %8.2f us %7.1f GB/s (%.0f%% of copy) | cublasLt %8.2f us %7.1f GB/s | "
                   "mma %8.2f us %7.1f GB/s\n",
                   s.name, static_cast<long long>(n), r.gemv_us, r.gemv_gbps, 100.0 * r.gemv_gbps / copy_gbps,
                   r.cublas_us, r.cublas_gbps, r.mma_us, r.mma_gbps);
    }
  }
  out["gemv"] = list;
  return Status::Ok();
}

// ---- int8 weights ------------------------------------------------------------------------------------

// Per-channel int8 weights on the same shapes, through the GEMV (to 16 tokens) and the tensor-core
// GEMM: half the bytes of bf16, against the fastest bf16 path at the same token count.
Status bench_int8_gemv(cu::LinearContext& ctx, double copy_gbps, const std::vector<GemvRow>& bf16_rows,
                       nlohmann::json& out, const Options& opt) {
  const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                     {"qkv 4096->6144", 4096, 6144},
                                     {"gate+up 4096->28672", 4096, 28672},
                                     {"down 14336->4096", 14336, 4096}};
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : shapes) {
    const size_t weight_bytes = static_cast<size_t>(s.in * s.out);
    const int copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + weight_bytes - 1) / weight_bytes));
    TACHYON_ASSIGN_OR_RETURN(auto dense, cu::DeviceBuffer::allocate(weight_bytes * 2, "bf16 weight"));
    TACHYON_RETURN_IF_ERROR(cu::fill_random(dense.data(), DType::kBF16, s.in * s.out, 9, -0.05f, 0.05f, nullptr));
    TACHYON_ASSIGN_OR_RETURN(auto packed, cu::DeviceBuffer::allocate(weight_bytes * copies, "int8 weights"));
    TACHYON_ASSIGN_OR_RETURN(auto scales, cu::DeviceBuffer::allocate(static_cast<size_t>(s.out) * 4, "int8 scales"));
    for (int c = 0; c < copies; ++c) {
      TACHYON_RETURN_IF_ERROR(cu::quantize_int8_rows(dense.data(), DType::kBF16, s.in, s.out, s.in,
                                                     static_cast<int8_t*>(packed.data()) + c * weight_bytes,
                                                     scales.as<float>(), nullptr));
    }
    TACHYON_ASSIGN_OR_RETURN(auto x, cu::DeviceBuffer::allocate(64 * s.in * 4, "gemv x"));
    TACHYON_ASSIGN_OR_RETURN(auto y, cu::DeviceBuffer::allocate(64 * s.out * 4, "gemv y"));
    TACHYON_RETURN_IF_ERROR(cu::fill_random(x.data(), DType::kF32, 64 * s.in, 8, -1.f, 1.f, nullptr));
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      auto body = [&, n](cu::LinearAlgo algo) {
        return [&, n, algo](int i, cu::Stream st) {
        cu::LinearArgs a;
        a.x = x.as<float>();
        a.x_stride = s.in;
        a.w = static_cast<const char*>(packed.data()) + static_cast<size_t>(i % copies) * weight_bytes;
        a.w_dtype = DType::kI8;
        a.w_stride = s.in;
        a.w_scales = scales.as<float>();
        a.y = y.as<float>();
        a.y_stride = s.out;
        a.n = n;
        a.in = s.in;
        a.out = s.out;
        return cu::linear(ctx, a, st, algo);
        };
      };
      double gemv_ms = 0.0;
      if (n <= 16) {
        TACHYON_ASSIGN_OR_RETURN(gemv_ms, time_graph_ms(body(cu::LinearAlgo::kGemv), copies, std::max(copies, 40), 5));
      }
      TACHYON_ASSIGN_OR_RETURN(double mma_ms, time_graph_ms(body(cu::LinearAlgo::kMma), copies, std::max(copies, 40), 5));
      const auto gbps = [&](double ms) { return ms > 0.0 ? weight_bytes / (ms * 1e-3) / 1e9 : 0.0; };
      // The fastest bf16 path at this n (GEMV to 16 tokens, cuBLASLt), the same weight in 16 bits.
      double bf16_us = 0.0;
      for (const GemvRow& r : bf16_rows) {
        if (r.name == s.name && r.n == n) bf16_us = r.gemv_us > 0.0 ? std::min(r.gemv_us, r.cublas_us) : r.cublas_us;
      }
      list.push_back({{"shape", s.name}, {"n", n}, {"weight_bytes", weight_bytes}, {"gemv_us", gemv_ms * 1e3},
                      {"gemv_gbps", gbps(gemv_ms)}, {"mma_us", mma_ms * 1e3}, {"mma_gbps", gbps(mma_ms)},
                      {"bf16_best_us", bf16_us}});
      const double best = gemv_ms > 0.0 ? std::min(gemv_ms, mma_ms) : mma_ms;
      std::fprintf(stderr,
                   "int8 %-22s n=%2lld: gemv %8.2f us (%3.0f%% of copy) | mma %8.2f us (%3.0f%% of copy) | bf16 best "
                   "%8.2f us: %.2fx\n",
                   s.name, static_cast<long long>(n), gemv_ms * 1e3, 100.0 * gbps(gemv_ms) / copy_gbps, mma_ms * 1e3,
                   100.0 * gbps(mma_ms) / copy_gbps, bf16_us, best > 0 ? bf16_us / (best * 1e3) : 0.0);
    }
  }
  out["int8_gemv"] = list;
  return Status::Ok();
}

// ---- packed (quantized) weights ------------------------------------------------------------------

struct PackedRow {
  std::string format, shape;
  int64_t n;
  size_t bytes;
  double us, gbps, tflops;
};

// bf16 (the yardstick, dense) and every packed format the backend runs — GGUF Q8_0 / Q4_1 / Q5_0 /
// Q5_1 / IQ4_NL / Q4_K / Q5_K / Q6_K, W8A8, per-channel fp8 (both also with a static activation
// scale: w8a8-st, fp8-st), ternary g128 — on the decode shapes
// through linear()'s kAuto at 1, 2, 4, 8 tokens (the formats' GEMVs), 32 and 256 (their GEMMs:
// cuBLASLt int8 for W8A8, fp8 for fp8, the weight expanded to bf16 for the others). Bytes read:
// the packed rows plus their scales. The weights are a quantized 512-row slab of random values
// tiled over the rows (the kernels' speed does not depend on the values), rotated through copies
// that exceed the L2 many times.
Status bench_packed_gemv(cu::LinearContext& ctx, double copy_gbps, nlohmann::json& out, std::vector<PackedRow>& rows,
                         const Options& opt) {
  using tachyon::QuantFormat;
  const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                     {"qkv 4096->6144", 4096, 6144},
                                     {"gate+up 4096->28672", 4096, 28672},
                                     {"down 14336->4096", 14336, 4096}};
  struct Format {
    const char* name;
    bool dense;
    QuantFormat format;
    float x_scale = 0.0f;  // a static activation scale (w8a8-st, fp8-st)
  };
  const Format formats[] = {{"bf16", true, QuantFormat::kInt8Channel},      {"q8_0", false, QuantFormat::kGgufQ8_0},
                            {"q4_1", false, QuantFormat::kGgufQ4_1},        {"q5_0", false, QuantFormat::kGgufQ5_0},
                            {"q5_1", false, QuantFormat::kGgufQ5_1},        {"iq4_nl", false, QuantFormat::kGgufIq4Nl},
                            {"q4_k", false, QuantFormat::kGgufQ4_K},        {"q5_k", false, QuantFormat::kGgufQ5_K},
                            {"q6_k", false, QuantFormat::kGgufQ6_K},        {"w8a8", false, QuantFormat::kW8A8},
                            {"w8a8-st", false, QuantFormat::kW8A8, 0.01f},  {"fp8", false, QuantFormat::kFp8Channel},
                            {"fp8-st", false, QuantFormat::kFp8Channel, 0.003f},
                            {"ternary", false, QuantFormat::kTernary}};
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  constexpr int64_t kSlabRows = 512, kMaxTokens = 256;
  nlohmann::json list = nlohmann::json::array();
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  for (const Format& f : formats) {
    if (!f.dense && !opt.quant_formats.empty() &&
        std::find(opt.quant_formats.begin(), opt.quant_formats.end(), f.name) == opt.quant_formats.end()) {
      continue;
    }
    for (const Shape& s : shapes) {
      tachyon::Tensor dense = tachyon::Tensor::empty({kSlabRows, s.in}, DType::kF32);
      for (int64_t i = 0; i < dense.numel(); ++i) dense.data<float>()[i] = uniform(rng);
      tachyon::Tensor packed, scales;
      if (f.dense) {
        packed = tachyon::Tensor::empty({kSlabRows, s.in}, DType::kBF16);
        for (int64_t i = 0; i < dense.numel(); ++i) {
          packed.data<uint16_t>()[i] = tachyon::f32_to_bf16(dense.data<float>()[i]);
        }
      } else {
        tachyon::QuantSpec spec;
        spec.format = f.format;
        spec.group_size = 128;
        tachyon::Weight w;
        w.dense = dense;
        TACHYON_ASSIGN_OR_RETURN(tachyon::Weight q, tachyon::quantize_weight(w, spec));
        packed = q.quant->packed;
        scales = q.quant->scales;
      }
      const size_t row_bytes = packed.nbytes() / kSlabRows;
      const size_t scale_row = scales.defined() ? scales.nbytes() / kSlabRows : 0;
      const size_t packed_bytes = row_bytes * s.out, scale_bytes = scale_row * s.out;
      const size_t bytes = (packed_bytes + scale_bytes + 255) / 256 * 256;  // what one pass reads, aligned
      const int copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + bytes - 1) / bytes));
      // One copy tiled from the slab on the host, the others copied on the device.
      std::vector<uint8_t> host(bytes);
      for (int64_t r = 0; r < s.out; ++r) {
        const int64_t src = r % kSlabRows;
        std::memcpy(host.data() + r * row_bytes, static_cast<const uint8_t*>(packed.raw_data()) + src * row_bytes,
                    row_bytes);
        if (scale_row > 0) {
          std::memcpy(host.data() + packed_bytes + r * scale_row,
                      static_cast<const uint8_t*>(scales.raw_data()) + src * scale_row, scale_row);
        }
      }
      TACHYON_ASSIGN_OR_RETURN(auto weights, cu::DeviceBuffer::allocate(bytes * copies, "packed weights"));
      auto* base = static_cast<uint8_t*>(weights.data());
      TACHYON_RETURN_IF_ERROR(cu::copy_to_device(base, host.data(), bytes));
      for (int c = 1; c < copies; ++c) {
        TACHYON_RETURN_IF_ERROR(cu::copy_on_device(base + c * bytes, base, bytes, nullptr));
      }
      TACHYON_ASSIGN_OR_RETURN(auto x, cu::DeviceBuffer::allocate(kMaxTokens * s.in * 4, "gemv x"));
      TACHYON_ASSIGN_OR_RETURN(auto y, cu::DeviceBuffer::allocate(kMaxTokens * s.out * 4, "gemv y"));
      TACHYON_RETURN_IF_ERROR(cu::fill_random(x.data(), DType::kF32, kMaxTokens * s.in, 8, -1.f, 1.f, nullptr));
      for (int64_t n : {1, 2, 4, 8, 32, 256}) {
        const auto body = [&, n](int i, cu::Stream st) {
          const uint8_t* w = base + static_cast<size_t>(i % copies) * bytes;  // copies are 256-byte aligned
          cu::LinearArgs a;
          a.x = x.as<float>();
          a.x_stride = s.in;
          a.w = w;
          a.w_dtype = packed.dtype();
          a.w_stride = packed.stride(0) * static_cast<int64_t>(tachyon::dtype_size(packed.dtype()));
          if (f.dense) a.w_stride = s.in;
          switch (f.format) {
            case QuantFormat::kGgufQ8_0: a.gguf = cu::GgufFormat::kQ8_0; break;
            case QuantFormat::kGgufQ4_1: a.gguf = cu::GgufFormat::kQ4_1; break;
            case QuantFormat::kGgufQ5_0: a.gguf = cu::GgufFormat::kQ5_0; break;
            case QuantFormat::kGgufQ5_1: a.gguf = cu::GgufFormat::kQ5_1; break;
            case QuantFormat::kGgufIq4Nl: a.gguf = cu::GgufFormat::kIq4Nl; break;
            case QuantFormat::kGgufQ4_K: a.gguf = cu::GgufFormat::kQ4_K; break;
            case QuantFormat::kGgufQ5_K: a.gguf = cu::GgufFormat::kQ5_K; break;
            case QuantFormat::kGgufQ6_K: a.gguf = cu::GgufFormat::kQ6_K; break;
            case QuantFormat::kW8A8: a.scheme = cu::QuantScheme::kW8A8; break;
            case QuantFormat::kTernary:
              a.scheme = cu::QuantScheme::kTernary;
              a.w_group = 128;
              break;
            default: break;
          }
          if (!f.dense && scale_row > 0) {
            if (a.gguf != cu::GgufFormat::kNone) {
              a.w_scales_f16 = reinterpret_cast<const uint16_t*>(w + packed_bytes);
            } else {
              a.w_scales = reinterpret_cast<const float*>(w + packed_bytes);
            }
          }
          a.x_scale = f.x_scale;
          a.y = y.as<float>();
          a.y_stride = s.out;
          a.n = n;
          a.in = s.in;
          a.out = s.out;
          return cu::linear(ctx, a, st, cu::LinearAlgo::kAuto);
        };
        const int iters = n >= 256 ? std::max(copies, 10) : std::max(copies, 40);
        TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, copies, iters, 5));
        const double gbps = bytes / (ms * 1e-3) / 1e9;
        const double tflops = 2.0 * static_cast<double>(n) * s.in * s.out / (ms * 1e-3) / 1e12;
        rows.push_back({f.name, s.name, n, bytes, ms * 1e3, gbps, tflops});
        list.push_back({{"format", f.name}, {"shape", s.name}, {"in", s.in}, {"out", s.out}, {"n", n},
                        {"algo", "auto"}, {"bytes", bytes}, {"us", ms * 1e3}, {"gbps", gbps},
                        {"fraction_of_copy", gbps / copy_gbps}, {"tflops", tflops}});
        std::fprintf(stderr, "%-7s %-22s n=%3lld: %9.2f us %7.1f GB/s (%3.0f%% of copy) %6.1f TFLOP/s\n", f.name,
                     s.name, static_cast<long long>(n), ms * 1e3, gbps, 100.0 * gbps / copy_gbps, tflops);
      }
    }
  }
  out["packed_gemv"] = list;
  return Status::Ok();
}

// us per format and shape, with each format's time against bf16's at the same n beside it.
void print_packed_table(const std::vector<PackedRow>& rows, double copy_gbps) {
  std::printf("%-7s %-22s %3s %9s %8s %6s %8s %7s\n", "weights", "linear", "n", "us", "GB/s", "%copy", "TFLOP/s",
              "vs bf16");
  for (const PackedRow& r : rows) {
    double bf16_us = 0.0;
    for (const PackedRow& b : rows) {
      if (b.format == "bf16" && b.shape == r.shape && b.n == r.n) bf16_us = b.us;
    }
    std::printf("%-7s %-22s %3lld %9.2f %8.1f %5.0f%% %8.1f %6.2fx\n", r.format.c_str(), r.shape.c_str(),
                static_cast<long long>(r.n), r.us, r.gbps, 100.0 * r.gbps / copy_gbps, r.tflops,
                bf16_us > 0.0 ? bf16_us / r.us : 0.0);
  }
}

// ---- attention -------------------------------------------------------------------------------------

struct AttentionRow {
  DType cache;
  int batch, context, splits;
  bool tensor_cores;
  double us, gbps;
};

struct PrefillRow {
  DType cache;
  int tokens;
  bool tensor_cores;
  double us, tflops;
};

// One step's decode attention over a paged cache of Llama-3-8B's heads: `layers` caches of shuffled
// blocks (a paged cache after a while) rotated past L2, random keys and values (an i8 cache's
// codes are random bytes, its scales random), every sequence at `context` tokens.
struct DecodeAttentionCase {
  static constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;
  int batch = 0, layers = 0;
  int64_t blocks_per_seq = 0;
  size_t kv_bytes = 0;  // K + V read per call (an i8 cache's scales included)
  cu::DeviceBuffer k, v, k_scales, v_scales, tables, query_start, context_lens, q, o;
  cu::KvCacheView cache;
  cu::AttentionBatch b;
  tachyon::AttentionParams params;

  // paged_attention of layer i % layers.
  Status run(const cu::AttentionPlan& plan, const cu::DeviceBuffer& ws, int i, cu::Stream st) const {
    cu::AttentionBatch bl = b;
    bl.block_tables = tables.as<int32_t>() + static_cast<int64_t>(i % layers) * batch * blocks_per_seq;
    return cu::paged_attention(plan, q.as<float>(), kHeads * kHeadDim, kHeadDim, kHeads, cache, bl, params,
                               o.as<float>(), kHeads * kHeadDim, kHeadDim, ws.data(), ws.bytes(), st);
  }
};

Result<std::unique_ptr<DecodeAttentionCase>> make_decode_attention(DType cache_dtype, int batch, int context,
                                                                   size_t rotate_bytes, std::mt19937& rng) {
  using C = DecodeAttentionCase;
  auto c = std::make_unique<C>();
  const bool quantized = cache_dtype == DType::kI8;
  const size_t elem_bytes = tachyon::dtype_size(cache_dtype);
  const size_t block_bytes = static_cast<size_t>(C::kBlockSize * C::kKvHeads * C::kHeadDim) * elem_bytes;  // K or V
  // One (token, kv head) row of K or of V as attention reads it: its codes, and its f32 scale.
  const size_t row_bytes = static_cast<size_t>(C::kHeadDim) * elem_bytes + (quantized ? sizeof(float) : 0);
  c->batch = batch;
  c->blocks_per_seq = (context + C::kBlockSize - 1) / C::kBlockSize;
  c->kv_bytes = static_cast<size_t>(batch) * context * C::kKvHeads * row_bytes * 2;
  c->layers = static_cast<int>(std::clamp<size_t>((rotate_bytes + c->kv_bytes - 1) / c->kv_bytes, 1, 64));
  const int64_t num_blocks = c->layers * batch * c->blocks_per_seq;
  TACHYON_ASSIGN_OR_RETURN(c->k, cu::DeviceBuffer::allocate(num_blocks * block_bytes, "k cache"));
  TACHYON_ASSIGN_OR_RETURN(c->v, cu::DeviceBuffer::allocate(num_blocks * block_bytes, "v cache"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c->k.data(), DType::kBF16, num_blocks * block_bytes / 2, 21, -1.f, 1.f, nullptr));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c->v.data(), DType::kBF16, num_blocks * block_bytes / 2, 22, -1.f, 1.f, nullptr));
  // i8: scales [num_blocks, block_size, kv_heads] f32 (a DeviceBuffer of 16 bytes otherwise).
  const int64_t scale_count = quantized ? num_blocks * C::kBlockSize * C::kKvHeads : 4;
  TACHYON_ASSIGN_OR_RETURN(c->k_scales, cu::DeviceBuffer::allocate(scale_count * sizeof(float), "k scales"));
  TACHYON_ASSIGN_OR_RETURN(c->v_scales, cu::DeviceBuffer::allocate(scale_count * sizeof(float), "v scales"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c->k_scales.data(), DType::kF32, scale_count, 24, 1.f / 508, 1.f / 127, nullptr));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c->v_scales.data(), DType::kF32, scale_count, 25, 1.f / 508, 1.f / 127, nullptr));
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> query_start(batch + 1), context_lens(batch, context);
  for (int s = 0; s <= batch; ++s) query_start[s] = s;
  TACHYON_ASSIGN_OR_RETURN(c->tables, cu::DeviceBuffer::allocate(ids.size() * 4, "block tables"));
  TACHYON_ASSIGN_OR_RETURN(c->query_start, cu::DeviceBuffer::allocate(query_start.size() * 4, "query_start"));
  TACHYON_ASSIGN_OR_RETURN(c->context_lens, cu::DeviceBuffer::allocate(context_lens.size() * 4, "context_lens"));
  TACHYON_RETURN_IF_ERROR(cu::copy_to_device(c->tables.data(), ids.data(), ids.size() * 4));
  TACHYON_RETURN_IF_ERROR(cu::copy_to_device(c->query_start.data(), query_start.data(), query_start.size() * 4));
  TACHYON_RETURN_IF_ERROR(cu::copy_to_device(c->context_lens.data(), context_lens.data(), context_lens.size() * 4));
  const int64_t q_floats = batch * C::kHeads * C::kHeadDim;
  TACHYON_ASSIGN_OR_RETURN(c->q, cu::DeviceBuffer::allocate(q_floats * 4, "q"));
  TACHYON_ASSIGN_OR_RETURN(c->o, cu::DeviceBuffer::allocate(q_floats * 4, "out"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(c->q.data(), DType::kF32, q_floats, 23, -1.f, 1.f, nullptr));
  c->cache.k = c->k.data();
  c->cache.v = c->v.data();
  if (quantized) {
    c->cache.k_scales = c->k_scales.as<float>();
    c->cache.v_scales = c->v_scales.as<float>();
  }
  c->cache.dtype = cache_dtype;
  c->cache.num_blocks = num_blocks;
  c->cache.block_size = C::kBlockSize;
  c->cache.num_kv_heads = C::kKvHeads;
  c->cache.head_dim = C::kHeadDim;
  c->b.num_seqs = batch;
  c->b.query_start = c->query_start.as<int32_t>();
  c->b.context_lens = c->context_lens.as<int32_t>();
  c->b.max_blocks_per_seq = c->blocks_per_seq;
  c->b.max_query_len = 1;
  c->b.max_context_len = context;
  c->params.scale = 1.0f / std::sqrt(static_cast<float>(C::kHeadDim));
  return c;
}

Status bench_attention(double copy_gbps, nlohmann::json& out, std::vector<AttentionRow>& rows, const Options& opt) {
  using C = DecodeAttentionCase;
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  TACHYON_ASSIGN_OR_RETURN(int sms, cu::current_sm_count());
  nlohmann::json list = nlohmann::json::array();
  std::mt19937 rng(11);
  for (DType cache_dtype : {DType::kBF16, DType::kI8}) {
    for (int batch : {1, 32}) {
      for (int context : {1024, 4096, 16384}) {
        TACHYON_ASSIGN_OR_RETURN(auto c, make_decode_attention(cache_dtype, batch, context, rotate_bytes, rng));
        TACHYON_ASSIGN_OR_RETURN(auto planned, cu::plan_paged_attention(c->b, C::kHeads, c->cache, c->params, sms));
        TACHYON_ASSIGN_OR_RETURN(auto ws, cu::DeviceBuffer::allocate(std::max<size_t>(planned.workspace_bytes, 16), "ws"));
        // The planner's kernel, and the CUDA-core kernel beside it when the planner chose tensor cores.
        for (bool tensor_cores : {true, false}) {
          if (tensor_cores && !planned.tensor_cores) continue;
          cu::AttentionPlan plan = planned;
          plan.tensor_cores = tensor_cores;
          auto body = [&](int i, cu::Stream st) { return c->run(plan, ws, i, st); };
          TACHYON_ASSIGN_OR_RETURN(double ms, time_graph_ms(body, c->layers, std::max(c->layers, 40), 5));
          AttentionRow r{cache_dtype, batch, context, plan.num_splits, tensor_cores, ms * 1e3,
                         c->kv_bytes / (ms * 1e-3) / 1e9};
          rows.push_back(r);
          list.push_back({{"batch", batch}, {"context", context}, {"heads", C::kHeads}, {"kv_heads", C::kKvHeads},
                          {"head_dim", C::kHeadDim}, {"cache", tachyon::dtype_name(cache_dtype)},
                          {"splits", plan.num_splits}, {"tensor_cores", tensor_cores}, {"kv_bytes", c->kv_bytes},
                          {"us", r.us}, {"gbps", r.gbps}, {"fraction_of_copy", r.gbps / copy_gbps}});
          std::fprintf(stderr,
                       "attention decode %s batch %2d ctx %5d (%d splits, %s): %8.2f us %7.1f GB/s (%.0f%% of copy)\n",
                       tachyon::dtype_name(cache_dtype), batch, context, plan.num_splits,
                       tensor_cores ? "tensor cores" : "CUDA cores", r.us, r.gbps, 100.0 * r.gbps / copy_gbps);
        }
      }
    }
  }
  out["attention_decode"] = list;
  return Status::Ok();
}

// Causal prefill attention of one sequence (Llama-3-8B heads, bf16 and i8 caches, shuffled
// blocks): FLOPs 4 * head_dim * heads * (tokens * (tokens + 1) / 2) (QK^T and P·V over the causal
// half).
Status bench_attention_prefill(double matmul_tflops, nlohmann::json& out, std::vector<PrefillRow>& rows) {
  const int64_t heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  TACHYON_ASSIGN_OR_RETURN(int sms, cu::current_sm_count());
  nlohmann::json list = nlohmann::json::array();
  std::mt19937 rng(12);
  for (DType cache_dtype : {DType::kBF16, DType::kI8}) {
    const bool quantized = cache_dtype == DType::kI8;
    for (int tokens : {512, 2048, 4096, 8192, 16384, 32768}) {
      const int64_t blocks = (tokens + block_size - 1) / block_size;
      const int64_t rows_count = blocks * block_size * kv_heads;  // (slot, kv head) rows
      const size_t cache_bytes = static_cast<size_t>(rows_count * head_dim) * tachyon::dtype_size(cache_dtype);
      TACHYON_ASSIGN_OR_RETURN(auto k, cu::DeviceBuffer::allocate(cache_bytes, "k cache"));
      TACHYON_ASSIGN_OR_RETURN(auto v, cu::DeviceBuffer::allocate(cache_bytes, "v cache"));
      // Random bf16 bits (as i8 codes: random bytes, any of which is a code).
      TACHYON_RETURN_IF_ERROR(
          cu::fill_random(k.data(), DType::kBF16, static_cast<int64_t>(cache_bytes / 2), 31, -1.f, 1.f, nullptr));
      TACHYON_RETURN_IF_ERROR(
          cu::fill_random(v.data(), DType::kBF16, static_cast<int64_t>(cache_bytes / 2), 32, -1.f, 1.f, nullptr));
      // i8: scales [blocks, block_size, kv_heads] f32 (a DeviceBuffer of 16 bytes otherwise).
      const int64_t scale_count = quantized ? rows_count : 4;
      TACHYON_ASSIGN_OR_RETURN(auto k_scales, cu::DeviceBuffer::allocate(scale_count * sizeof(float), "k scales"));
      TACHYON_ASSIGN_OR_RETURN(auto v_scales, cu::DeviceBuffer::allocate(scale_count * sizeof(float), "v scales"));
      TACHYON_RETURN_IF_ERROR(
          cu::fill_random(k_scales.data(), DType::kF32, scale_count, 34, 1.f / 508, 1.f / 127, nullptr));
      TACHYON_RETURN_IF_ERROR(
          cu::fill_random(v_scales.data(), DType::kF32, scale_count, 35, 1.f / 508, 1.f / 127, nullptr));
      std::vector<int32_t> ids(static_cast<size_t>(blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      const std::vector<int32_t> query_start = {0, tokens}, context_lens = {tokens};
      TACHYON_ASSIGN_OR_RETURN(auto d_tables, cu::DeviceBuffer::allocate(ids.size() * 4, "block tables"));
      TACHYON_ASSIGN_OR_RETURN(auto d_qs, cu::DeviceBuffer::allocate(8, "query_start"));
      TACHYON_ASSIGN_OR_RETURN(auto d_ctx, cu::DeviceBuffer::allocate(4, "context_lens"));
      TACHYON_RETURN_IF_ERROR(cu::copy_to_device(d_tables.data(), ids.data(), ids.size() * 4));
      TACHYON_RETURN_IF_ERROR(cu::copy_to_device(d_qs.data(), query_start.data(), 8));
      TACHYON_RETURN_IF_ERROR(cu::copy_to_device(d_ctx.data(), context_lens.data(), 4));
      const int64_t q_elems = static_cast<int64_t>(tokens) * heads * head_dim;
      TACHYON_ASSIGN_OR_RETURN(auto q, cu::DeviceBuffer::allocate(q_elems * 4, "q"));
      TACHYON_ASSIGN_OR_RETURN(auto o, cu::DeviceBuffer::allocate(q_elems * 4, "out"));
      TACHYON_RETURN_IF_ERROR(cu::fill_random(q.data(), DType::kF32, q_elems, 33, -1.f, 1.f, nullptr));
      cu::KvCacheView cache;
      cache.k = k.data();
      cache.v = v.data();
      if (quantized) {
        cache.k_scales = k_scales.as<float>();
        cache.v_scales = v_scales.as<float>();
      }
      cache.dtype = cache_dtype;
      cache.num_blocks = blocks;
      cache.block_size = block_size;
      cache.num_kv_heads = kv_heads;
      cache.head_dim = head_dim;
      cu::AttentionBatch b;
      b.num_seqs = 1;
      b.query_start = d_qs.as<int32_t>();
      b.context_lens = d_ctx.as<int32_t>();
      b.block_tables = d_tables.as<int32_t>();
      b.max_blocks_per_seq = blocks;
      b.max_query_len = tokens;
      b.max_context_len = tokens;
      tachyon::AttentionParams params;
      params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      TACHYON_ASSIGN_OR_RETURN(auto planned, cu::plan_paged_attention(b, heads, cache, params, sms));
      const double flops = 4.0 * head_dim * heads * (static_cast<double>(tokens) * (tokens + 1) / 2);
      for (bool tensor_cores : {true, false}) {
        if (tensor_cores && !planned.tensor_cores) continue;
        if (!tensor_cores && tokens > 8192) continue;  // seconds a call: the tensor-core kernel is the one served
        cu::AttentionPlan plan = planned;
        plan.tensor_cores = tensor_cores;
        auto body = [&](int, cu::Stream st) {
          return cu::paged_attention(plan, q.as<float>(), heads * head_dim, head_dim, heads, cache, b, params,
                                     o.as<float>(), heads * head_dim, head_dim, nullptr, 0, st);
        };
        const int iters = tokens >= 16384 ? 1 : tokens >= 8192 ? 3 : 10;
        TACHYON_ASSIGN_OR_RETURN(double ms, time_graph_ms(body, 1, iters, 3));
        PrefillRow r{cache_dtype, tokens, tensor_cores, ms * 1e3, flops / (ms * 1e-3) / 1e12};
        rows.push_back(r);
        list.push_back({{"tokens", tokens}, {"heads", heads}, {"kv_heads", kv_heads}, {"head_dim", head_dim},
                        {"cache", tachyon::dtype_name(cache_dtype)}, {"tensor_cores", tensor_cores}, {"flops", flops},
                        {"us", r.us}, {"tflops", r.tflops}, {"fraction_of_matmul", r.tflops / matmul_tflops}});
        std::fprintf(stderr, "attention prefill %s %5d tokens (%s): %9.1f us %6.1f TFLOP/s (%.0f%% of matmul)\n",
                     tachyon::dtype_name(cache_dtype), tokens, tensor_cores ? "tensor cores" : "CUDA cores", r.us,
                     r.tflops, 100.0 * r.tflops / matmul_tflops);
      }
    }
  }
  out["attention_prefill"] = list;
  return Status::Ok();
}

void print_prefill_table(const std::vector<PrefillRow>& rows, double matmul_tflops) {
  std::printf("%-30s %-13s %9s %8s %6s\n", "prefill attention (KV dtype)", "kernel", "us", "TFLOP/s", "%mm");
  for (const PrefillRow& r : rows) {
    std::printf("%-4s causal, %5d tokens %6s %-13s %9.1f %8.1f %5.0f%%\n", tachyon::dtype_name(r.cache), r.tokens, "",
                r.tensor_cores ? "tensor cores" : "CUDA cores", r.us, r.tflops, 100.0 * r.tflops / matmul_tflops);
  }
}

Status write_json(const nlohmann::json& out, const Options& opt) {
  const std::string json = out.dump(2);
  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << json << "\n";
    if (!f) return tachyon::make_error(tachyon::ErrorCode::kIo, "cannot write {}", opt.json_path);
  } else {
    std::printf("%s\n", json.c_str());
  }
  return Status::Ok();
}

// ---- sampling --------------------------------------------------------------------------------------

// ops::sample over Llama-3's vocabulary at decode batch sizes: temperature only, top-k, top-p and
// both, on flat logits (uniform in [-5, 5): a nucleus of many thousand tokens) and peaked ones
// (x 25: a nucleus of a few).
Status bench_sample(nlohmann::json& out) {
  constexpr int64_t d = 128256;
  nlohmann::json list = nlohmann::json::array();
  for (int64_t n : {1, 32}) {
    TACHYON_ASSIGN_OR_RETURN(auto x, cu::DeviceBuffer::allocate(static_cast<size_t>(n * d) * 4, "logits"));
    TACHYON_ASSIGN_OR_RETURN(auto params, cu::DeviceBuffer::allocate(static_cast<size_t>(n) * 6 * 4, "params"));
    TACHYON_ASSIGN_OR_RETURN(auto ids, cu::DeviceBuffer::allocate(static_cast<size_t>(n) * 4, "ids"));
    TACHYON_ASSIGN_OR_RETURN(auto lps, cu::DeviceBuffer::allocate(static_cast<size_t>(n) * 4, "logprobs"));
    for (float spread : {5.0f, 125.0f}) {
      TACHYON_RETURN_IF_ERROR(cu::fill_random(x.data(), DType::kF32, n * d, 41, -spread, spread, nullptr));
      const struct {
        const char* name;
        float top_k, top_p;
      } cases[] = {{"temperature", 0, 1.0f}, {"top-k 50", 50, 1.0f}, {"top-p 0.9", 0, 0.9f}, {"top-k 50 + top-p 0.9", 50, 0.9f}};
      for (const auto& c : cases) {
        std::vector<float> h(static_cast<size_t>(n) * 6);
        for (int64_t r = 0; r < n; ++r) {
          const float p[6] = {1.0f, 0.0f, 0.37f + 0.01f * static_cast<float>(r % 50), 0.0f, c.top_k, c.top_p};
          std::copy(p, p + 6, h.begin() + r * 6);
        }
        TACHYON_RETURN_IF_ERROR(cu::copy_to_device(params.data(), h.data(), h.size() * 4));
        auto body = [&](int, cu::Stream st) {
          return cu::sample(x.as<float>(), d, n, d, params.as<float>(), ids.as<int32_t>(), lps.as<float>(), st);
        };
        TACHYON_ASSIGN_OR_RETURN(double ms, time_ms(body, nullptr, 2, 10, 3));
        const char* logits = spread < 10.0f ? "flat" : "peaked";
        list.push_back({{"n", n}, {"vocab", d}, {"logits", logits}, {"case", c.name}, {"us", ms * 1e3}});
        std::fprintf(stderr, "sample n=%-3lld %-6s %-22s %9.1f us\n", static_cast<long long>(n), logits, c.name, ms * 1e3);
      }
    }
  }
  out["sample"] = list;
  return Status::Ok();
}

// ---- weight read patterns ----------------------------------------------------------------------

}  // namespace

cudaError_t launch_read_pattern(int p, const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t slice_bytes,
                                unsigned* sink, cudaStream_t stream);

namespace {

// read_patterns.cu's probe on int4 Llama-3-8B shapes (half a byte per weight), slices as the
// tensor-core GEMM plans them at one token: bytes per second by the contiguous bytes per row of one
// warp instruction.
Status bench_read_patterns(double copy_gbps, nlohmann::json& out, const Options& opt) {
  struct ReadShape {
    const char* name;
    int64_t rows, row_bytes, slice_bytes;
  };
  const std::vector<ReadShape> shapes = {{"q/o 4096x4096 int4", 4096, 2048, 512},
                                         {"gate+up 4096->28672 int4", 28672, 2048, 1024},
                                         {"down 14336->4096 int4", 4096, 7168, 512}};
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  TACHYON_ASSIGN_OR_RETURN(auto sink, cu::DeviceBuffer::allocate(256, "read sink"));
  nlohmann::json list = nlohmann::json::array();
  for (const ReadShape& s : shapes) {
    const size_t bytes = static_cast<size_t>(s.rows * s.row_bytes);
    const int copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + bytes - 1) / bytes));
    TACHYON_ASSIGN_OR_RETURN(auto w, cu::DeviceBuffer::allocate(bytes * copies, "read pattern weights"));
    TACHYON_RETURN_IF_ERROR(cu::fill_random(w.data(), DType::kF32, static_cast<int64_t>(bytes * copies / 4), 5, -1.f,
                                            1.f, nullptr));
    for (int p : {64, 128, 256, 512}) {
      TACHYON_ASSIGN_OR_RETURN(
          const double ms, time_graph_ms(
                               [&](int i, cu::Stream st) -> Status {
                                 BENCH_CUDA(tachyon::bench::launch_read_pattern(
                                     p, static_cast<const uint8_t*>(w.data()) + (i % copies) * bytes, s.rows,
                                     s.row_bytes, s.slice_bytes, sink.as<unsigned>(), static_cast<cudaStream_t>(st)));
                                 return Status::Ok();
                               },
                               copies, std::max(copies, 40), 5));
      const double gbps = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
      list.push_back({{"shape", s.name}, {"bytes_per_row_per_load", p}, {"us", ms * 1e3}, {"gbps", gbps},
                      {"fraction_of_copy", gbps / copy_gbps}});
      std::printf("read %-26s %3d B/row/load: %8.2f us %8.1f GB/s (%3.0f%% of copy)\n", s.name, p, ms * 1e3, gbps,
                  100.0 * gbps / copy_gbps);
    }
  }
  out["read_patterns"] = list;
  return Status::Ok();
}

// ---- the pieces of a one-token decode step ---------------------------------------------------------

// What a batch-1 decode step of Llama-3-8B spends outside its weights' bytes: the one-token bf16
// GEMV with other tiles (launch_gemv_probe), decode attention at short contexts by its number of
// slices (1: no combine kernel), and a chain of the smallest kernel (rms_norm of one 4096 row).
Status bench_decode_probe(double copy_gbps, nlohmann::json& out, const Options& opt) {
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  nlohmann::json gemv = nlohmann::json::array();
  const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                     {"qkv 4096->6144", 4096, 6144},
                                     {"gate+up 4096->28672", 4096, 28672},
                                     {"down 14336->4096", 14336, 4096}};
  for (const Shape& s : shapes) {
    TACHYON_ASSIGN_OR_RETURN(Bf16LinearCase c, make_bf16_linear(s, rotate_bytes, 1));
    const size_t weight_bytes = c.weight_bytes;
    const int copies = c.copies;
    for (int v = 0; v < cu::detail::gemv_probe_variants(); ++v) {
      auto body = [&](int i, cu::Stream st) -> Status {
        BENCH_CUDA(cu::detail::launch_gemv_probe(c.args(i, 1), v, st));
        return Status::Ok();
      };
      TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, copies, std::max(copies, 40), 5));
      const double gbps = weight_bytes / (ms * 1e-3) / 1e9;
      gemv.push_back({{"shape", s.name}, {"tile", cu::detail::gemv_probe_name(v)}, {"us", ms * 1e3}, {"gbps", gbps},
                      {"fraction_of_copy", gbps / copy_gbps}});
      std::printf("probe gemv %-22s %-30s %8.2f us %3.0f%% of copy\n", s.name, cu::detail::gemv_probe_name(v),
                  ms * 1e3, 100.0 * gbps / copy_gbps);
    }
  }
  out["probe_gemv"] = gemv;

  using C = DecodeAttentionCase;
  TACHYON_ASSIGN_OR_RETURN(int sms, cu::current_sm_count());
  std::mt19937 rng(13);
  nlohmann::json attention = nlohmann::json::array();
  constexpr int kMaxSplits = 16;
  for (int context : {128, 256, 384, 512, 1024, 2048}) {
    TACHYON_ASSIGN_OR_RETURN(auto c, make_decode_attention(DType::kBF16, 1, context, rotate_bytes, rng));
    TACHYON_ASSIGN_OR_RETURN(auto planned, cu::plan_paged_attention(c->b, C::kHeads, c->cache, c->params, sms));
    const size_t ws_bytes = cu::detail::decode_workspace_floats(1, C::kHeads, C::kHeadDim, 64) * sizeof(float);
    TACHYON_ASSIGN_OR_RETURN(auto ws, cu::DeviceBuffer::allocate(ws_bytes, "ws"));
    for (int splits : {planned.num_splits, 1, 2, 3, 4, 6, 8, 12, kMaxSplits}) {
      if (splits * 64 > context && splits != planned.num_splits && splits != 1) continue;
      cu::AttentionPlan plan = planned;
      plan.num_splits = splits;
      plan.workspace_bytes = cu::detail::decode_workspace_floats(1, C::kHeads, C::kHeadDim, splits) * sizeof(float);
      auto body = [&](int i, cu::Stream st) { return c->run(plan, ws, i, st); };
      TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, c->layers, std::max(c->layers, 40), 5));
      attention.push_back({{"context", context}, {"splits", splits}, {"planned", splits == planned.num_splits},
                           {"tensor_cores", plan.tensor_cores}, {"us", ms * 1e3}});
      std::printf("probe attention batch 1 ctx %5d splits %2d%s: %6.2f us\n", context, splits,
                  splits == planned.num_splits ? " (planned)" : "", ms * 1e3);
    }
  }
  out["probe_attention"] = attention;

  TACHYON_ASSIGN_OR_RETURN(auto nx, cu::DeviceBuffer::allocate(4096 * 4, "norm x"));
  TACHYON_ASSIGN_OR_RETURN(auto ny, cu::DeviceBuffer::allocate(4096 * 4, "norm y"));
  TACHYON_ASSIGN_OR_RETURN(auto nw, cu::DeviceBuffer::allocate(4096 * 2, "norm weight"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(nx.data(), DType::kF32, 4096, 9, -1.f, 1.f, nullptr));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(nw.data(), DType::kBF16, 4096, 10, 0.5f, 1.5f, nullptr));
  const cu::Rows rows = cu::Rows::packed(1, 4096, 4096);
  auto norm = [&](int i, cu::Stream st) {
    // Alternating directions: each norm reads the previous one's output, as a step's chain does.
    const bool even = i % 2 == 0;
    return cu::rms_norm(even ? nx.as<float>() : ny.as<float>(), rows, nw.data(), DType::kBF16, 1e-5f,
                        even ? ny.as<float>() : nx.as<float>(), rows, st);
  };
  TACHYON_ASSIGN_OR_RETURN(const double norm_ms, time_graph_ms(norm, 2, 64, 5));
  out["probe_rms_norm_chain_us"] = norm_ms * 1e3;
  std::printf("probe rms_norm 1x4096, chained: %6.2f us per kernel\n", norm_ms * 1e3);
  return Status::Ok();
}

int fail(const Status& s) {
  std::fprintf(stderr, "tachyon_cuda_bench: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

// The program: the options, then the tables they ask for (main's body).
int run(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      opt.json_path = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--moe") {
      opt.moe = true;
    } else if (a == "--ceilings") {
      opt.ceilings = true;
    } else if (a == "--prefill-only") {
      opt.prefill_only = true;
    } else if (a == "--quant-only") {
      opt.quant_only = true;
    } else if (a == "--quant-formats" && i + 1 < argc) {
      // A comma-separated list of the packed table's format names (w8a8,w8a8-st,...).
      std::string list = argv[++i];
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        if (comma > start) opt.quant_formats.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (a == "--cublaslt-candidates") {
      opt.cublaslt_candidates = true;
    } else if (a == "--cublaslt-splitk") {
      opt.cublaslt_candidates = true;
      opt.cublaslt_splitk = true;
    } else if (a == "--int4-only") {
      opt.int4_only = true;
    } else if (a == "--read-patterns") {
      opt.read_patterns = true;
    } else if (a == "--decode-probe") {
      opt.decode_probe = true;
    } else if (a == "--int4-slices") {
      opt.int4_slices = true;
    } else if (a == "--int4-sol") {
      opt.int4_sol = true;
    } else if (a == "--int4-stream-probe") {
      opt.int4_stream_probe = true;
    } else {
      std::fprintf(stderr,
                   "usage: tachyon_cuda_bench [--json FILE] [--quick] [--quant-formats A,B,...] "
                   "[--ceilings | --moe | --prefill-only | "
                   "--quant-only | --int4-only | "
                   "--read-patterns | --decode-probe | --int4-slices | --int4-sol | --int4-stream-probe | "
                   "--cublaslt-candidates | --cublaslt-splitk]\n");
      return 2;
    }
  }
  if (cu::device_count() == 0) {
    std::fprintf(stderr, "tachyon_cuda_bench: no CUDA device\n");
    return 1;
  }
  auto props = cu::device_properties(0);
  if (!props.ok()) return fail(props.status());
  std::fprintf(stderr, "device: %s\n", props->to_string().c_str());
  nlohmann::json out;
  out["device"] = {{"name", props->name},
                   {"sm", props->compute_major * 10 + props->compute_minor},
                   {"multiprocessors", props->multiprocessors},
                   {"memory_bytes", props->total_memory},
                   {"l2_bytes", props->l2_cache_bytes}};
  // Kernels chained in a graph overlap their neighbours' ends when this is on (TACHYON_PDL=0: off).
  out["programmatic_launch"] = cu::programmatic_launch() && props->compute_major >= 9;
  std::fprintf(stderr, "programmatic dependent launch: %s\n", out["programmatic_launch"].get<bool>() ? "on" : "off");

  auto ctx = cu::LinearContext::create();
  if (!ctx.ok()) return fail(ctx.status());
  if (opt.moe) {
    auto copy = bench_copy(out, opt);
    if (!copy.ok()) return fail(copy.status());
    std::vector<MoeRow> moe_rows;
    if (Status s = bench_moe(*copy, out, moe_rows); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    std::printf("\n== %s ==\n", props->to_string().c_str());
    print_moe_table(moe_rows, *copy);
    return 0;
  }
  if (opt.ceilings) {  // the two ceilings the model benchmarks' targets are shares of
    auto copy = bench_copy(out, opt);
    if (!copy.ok()) return fail(copy.status());
    auto tflops = bench_matmul(**ctx, out, opt);
    if (!tflops.ok()) return fail(tflops.status());
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    std::printf("%s: copy %.1f GB/s (read + write), bf16 matmul %.1f TFLOP/s\n", props->to_string().c_str(), *copy,
                *tflops);
    return 0;
  }
  if (opt.prefill_only) {
    auto tflops = bench_matmul(**ctx, out, opt);
    if (!tflops.ok()) return fail(tflops.status());
    std::vector<PrefillRow> prefill_rows;
    if (Status s = bench_attention_prefill(*tflops, out, prefill_rows); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    std::printf("\n== %s ==\n", props->to_string().c_str());
    std::printf("cuBLASLt bf16 matmul %lld^3 %6.1f TFLOP/s\n",
                static_cast<long long>(out["matmul"]["m"].get<int64_t>()), *tflops);
    print_prefill_table(prefill_rows, *tflops);
    return 0;
  }
  if (opt.cublaslt_candidates) {
    std::printf("\n== %s: cuBLASLt bf16 candidates ==\n", props->to_string().c_str());
    if (Status s = bench_cublaslt_candidates(out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  auto copy = bench_copy(out, opt);
  if (!copy.ok()) return fail(copy.status());
  std::vector<PackedRow> packed_rows;
  if (opt.quant_only) {
    if (Status s = bench_packed_gemv(**ctx, *copy, out, packed_rows, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    std::printf("\n== %s ==\n", props->to_string().c_str());
    std::printf("copy D2D (read+write)      %8.1f GB/s\n", *copy);
    print_packed_table(packed_rows, *copy);
    return 0;
  }
  if (opt.decode_probe) {
    if (Status s = bench_decode_probe(*copy, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  if (opt.int4_slices) {
    if (Status s = bench_int4_slices(*copy, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  if (opt.int4_sol) {
    if (Status s = bench_int4_sol(*copy, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  if (opt.int4_stream_probe) {
    if (Status s = bench_int4_stream_probe(*copy, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  if (opt.read_patterns) {
    if (Status s = bench_read_patterns(*copy, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    return 0;
  }
  std::vector<GemvRow> gemv_rows;
  if (opt.int4_only) {
    if (Status s = bench_gemv(**ctx, *copy, out, gemv_rows, opt); !s.ok()) return fail(s);
    if (Status s = bench_int4_gemv(**ctx, *copy, gemv_rows, out, opt); !s.ok()) return fail(s);
    if (Status s = write_json(out, opt); !s.ok()) return fail(s);
    std::printf("\n== %s ==\ncopy D2D (read+write)      %8.1f GB/s\n", props->to_string().c_str(), *copy);
    return 0;
  }
  auto tflops = bench_matmul(**ctx, out, opt);
  if (!tflops.ok()) return fail(tflops.status());
  if (Status s = bench_gemv(**ctx, *copy, out, gemv_rows, opt); !s.ok()) return fail(s);
  if (Status s = bench_int8_gemv(**ctx, *copy, gemv_rows, out, opt); !s.ok()) return fail(s);
  if (Status s = bench_int4_gemv(**ctx, *copy, gemv_rows, out, opt); !s.ok()) return fail(s);
  if (Status s = bench_packed_gemv(**ctx, *copy, out, packed_rows, opt); !s.ok()) return fail(s);
  std::vector<AttentionRow> attn_rows;
  if (Status s = bench_attention(*copy, out, attn_rows, opt); !s.ok()) return fail(s);
  std::vector<PrefillRow> prefill_rows;
  if (Status s = bench_attention_prefill(*tflops, out, prefill_rows); !s.ok()) return fail(s);
  if (Status s = bench_sample(out); !s.ok()) return fail(s);

  // Llama-3-8B's linears for one decoded token at n = 1: 32 layers x (q, k, v, o, gate, up, down) + lm head.
  double step_us = 0.0, step_bytes = 0.0;
  for (const GemvRow& r : gemv_rows) {
    if (r.n != 1) continue;
    const std::string name = r.name;
    if (name.rfind("qkv", 0) == 0 || name.rfind("gate+up", 0) == 0) continue;  // fused shapes: counted unfused
    const double count = name.rfind("lm_head", 0) == 0 ? 1.0 : 32.0 * (name.rfind("down", 0) == 0 ? 1.0 : 2.0);
    step_us += count * r.gemv_us;
    step_bytes += count * static_cast<double>(r.in * r.out * 2);
  }
  out["llama3_8b_linears_n1"] = {{"us_per_token", step_us}, {"weight_bytes", step_bytes},
                                 {"gbps", step_bytes / (step_us * 1e-6) / 1e9},
                                 {"fraction_of_copy", step_bytes / (step_us * 1e-6) / 1e9 / *copy}};

  if (Status s = write_json(out, opt); !s.ok()) return fail(s);

  std::printf("\n== %s ==\n", props->to_string().c_str());
  std::printf("copy D2D (read+write)      %8.1f GB/s\n", *copy);
  std::printf("cuBLASLt bf16 matmul %lld^3 %6.1f TFLOP/s\n", static_cast<long long>(out["matmul"]["m"].get<int64_t>()),
              *tflops);
  std::printf("%-22s %3s %9s %8s %6s %9s %8s %6s %9s %8s %6s\n", "linear (bf16 weights)", "n", "gemv us", "GB/s",
              "%copy", "cuBLASLt", "GB/s", "%copy", "mma us", "GB/s", "%copy");
  for (const GemvRow& r : gemv_rows) {
    std::printf("%-22s %3lld %9.2f %8.1f %5.0f%% %9.2f %8.1f %5.0f%% %9.2f %8.1f %5.0f%%\n", r.name.c_str(),
                static_cast<long long>(r.n), r.gemv_us, r.gemv_gbps, 100.0 * r.gemv_gbps / *copy, r.cublas_us,
                r.cublas_gbps, 100.0 * r.cublas_gbps / *copy, r.mma_us, r.mma_gbps, 100.0 * r.mma_gbps / *copy);
  }
  std::printf("Llama-3-8B linears, 1 token: %.1f us/token = %.1f GB/s (%.0f%% of copy)\n", step_us,
              step_bytes / (step_us * 1e-6) / 1e9, 100.0 * step_bytes / (step_us * 1e-6) / 1e9 / *copy);
  std::printf("%-30s %6s %-13s %9s %8s %6s\n", "decode attention (KV dtype)", "splits", "kernel", "us", "GB/s", "%copy");
  for (const AttentionRow& r : attn_rows) {
    std::printf("%-4s batch %2d context %5d %9d %-13s %9.2f %8.1f %5.0f%%\n", tachyon::dtype_name(r.cache), r.batch,
                r.context, r.splits, r.tensor_cores ? "tensor cores" : "CUDA cores", r.us, r.gbps,
                100.0 * r.gbps / *copy);
  }
  print_packed_table(packed_rows, *copy);
  print_prefill_table(prefill_rows, *tflops);
  return 0;
}

}  // namespace tachyon::bench

int main(int argc, char** argv) { return tachyon::bench::run(argc, argv); }
