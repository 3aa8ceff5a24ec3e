// tachyon_cuda_bench's int4 tables: group-wise int4 weights (group 128) on Llama-3-8B's decode
// shapes (see cuda_bench.cpp's header for how every table is timed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "ops/cuda/launch.h"

namespace tachyon::bench {
namespace {

// Llama-3-8B's decode linears, as the int4 tables run them.
const std::vector<Shape>& int4_shapes() {
  static const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                            {"k/v 4096->1024", 4096, 1024},
                                            {"qkv 4096->6144", 4096, 6144},
                                            {"gate+up 4096->28672", 4096, 28672},
                                            {"down 14336->4096", 14336, 4096}};
  return shapes;
}

// One random bf16 weight quantized to group-128 int4, in enough copies to rotate past L2, with
// activations for up to 64 tokens and their outputs. Bytes read per pass: half a byte per weight
// plus a scale and a zero (f32) per group.
struct Int4Weights {
  static constexpr int kGroup = 128;
  Shape shape{};
  size_t packed_bytes = 0, group_count = 0, bytes = 0;
  int copies = 1;
  cu::DeviceBuffer packed, scales, zeros, x, y;

  // Copy c's linear over n tokens.
  cu::LinearArgs args(int c, int64_t n) const {
    cu::LinearArgs a = io_args(x, y, shape, n);
    a.w = static_cast<const char*>(packed.data()) + static_cast<size_t>(c) * packed_bytes;
    a.w_dtype = DType::kU8;
    a.w_stride = shape.in / 2;
    a.w_constant = true;  // as a loaded model's weights
    a.w_scales = scales.as<float>() + c * group_count;
    a.w_zeros = zeros.as<float>() + c * group_count;
    a.w_group = kGroup;
    return a;
  }
};

Result<Int4Weights> make_int4_weights(const Shape& s, const Options& opt) {
  Int4Weights w;
  w.shape = s;
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  w.packed_bytes = static_cast<size_t>(s.in * s.out) / 2;
  w.group_count = static_cast<size_t>(s.out * (s.in / Int4Weights::kGroup));
  w.bytes = w.packed_bytes + w.group_count * 8;
  w.copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + w.bytes - 1) / w.bytes));
  TACHYON_ASSIGN_OR_RETURN(auto dense, cu::DeviceBuffer::allocate(static_cast<size_t>(s.in * s.out) * 2, "bf16 weight"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(dense.data(), DType::kBF16, s.in * s.out, 9, -0.05f, 0.05f, nullptr));
  TACHYON_ASSIGN_OR_RETURN(w.packed, cu::DeviceBuffer::allocate(w.packed_bytes * w.copies, "int4 weights"));
  TACHYON_ASSIGN_OR_RETURN(w.scales, cu::DeviceBuffer::allocate(w.group_count * 4 * w.copies, "int4 scales"));
  TACHYON_ASSIGN_OR_RETURN(w.zeros, cu::DeviceBuffer::allocate(w.group_count * 4 * w.copies, "int4 zeros"));
  for (int c = 0; c < w.copies; ++c) {
    TACHYON_RETURN_IF_ERROR(cu::quantize_int4_groups(
        dense.data(), DType::kBF16, s.in, s.out, s.in, Int4Weights::kGroup, /*f16_scales=*/true,
        static_cast<uint8_t*>(w.packed.data()) + c * w.packed_bytes, w.scales.as<float>() + c * w.group_count,
        w.zeros.as<float>() + c * w.group_count, nullptr));
  }
  TACHYON_ASSIGN_OR_RETURN(w.x, cu::DeviceBuffer::allocate(64 * s.in * 4, "gemv x"));
  TACHYON_ASSIGN_OR_RETURN(w.y, cu::DeviceBuffer::allocate(64 * s.out * 4, "gemv y"));
  TACHYON_RETURN_IF_ERROR(cu::fill_random(w.x.data(), DType::kF32, 64 * s.in, 8, -1.f, 1.f, nullptr));
  return w;
}

}  // namespace

// The int4 GEMV (to 8 tokens), the tensor-core GEMM (to 32), the streamed GEMM (sm_90, to 2) and
// kAuto's pick on the decode shapes, against the fastest bf16 path at the same token count.
Status bench_int4_gemv(cu::LinearContext& ctx, double copy_gbps, const std::vector<GemvRow>& bf16_rows,
                       nlohmann::json& out, const Options& opt) {
  constexpr int kGroup = Int4Weights::kGroup;
  TACHYON_ASSIGN_OR_RETURN(const int cc, cu::current_compute_capability());
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : int4_shapes()) {
    TACHYON_ASSIGN_OR_RETURN(const Int4Weights w, make_int4_weights(s, opt));
    const int copies = w.copies;
    const size_t bytes = w.bytes;
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      const auto body = [&, n](cu::LinearAlgo algo) {
        return [&, n, algo](int i, cu::Stream st) { return cu::linear(ctx, w.args(i % copies, n), st, algo); };
      };
      // Each path where it runs, then kAuto's pick.
      double gemv_ms = 0.0, mma_ms = 0.0, stream_ms = 0.0;
      if (n <= cu::detail::kGemvInt4MaxTokens) {
        TACHYON_ASSIGN_OR_RETURN(gemv_ms, time_graph_ms(body(cu::LinearAlgo::kGemv), copies, std::max(copies, 40), 5));
      }
      if (n <= cu::detail::kGemmMmaMaxTokensInt4) {
        TACHYON_ASSIGN_OR_RETURN(mma_ms, time_graph_ms(body(cu::LinearAlgo::kMma), copies, std::max(copies, 40), 5));
      }
      if (cu::detail::gemm_int4_stream_supported(w.args(0, n), cc)) {
        TACHYON_ASSIGN_OR_RETURN(stream_ms,
                                 time_graph_ms(body(cu::LinearAlgo::kStream), copies, std::max(copies, 40), 5));
      }
      TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body(cu::LinearAlgo::kAuto), copies, std::max(copies, 40), 5));
      const auto gbps = [&](double t) { return t > 0.0 ? bytes / (t * 1e-3) / 1e9 : 0.0; };
      double bf16_us = 0.0;
      for (const GemvRow& r : bf16_rows) {
        if (r.name == s.name && r.n == n) bf16_us = r.gemv_us > 0.0 ? std::min(r.gemv_us, r.cublas_us) : r.cublas_us;
      }
      list.push_back({{"shape", s.name}, {"n", n}, {"bytes", bytes}, {"gemv_us", gemv_ms * 1e3},
                      {"mma_us", mma_ms * 1e3}, {"stream_us", stream_ms * 1e3}, {"auto_us", ms * 1e3},
                      {"auto_gbps", gbps(ms)},
                      {"auto_fraction_of_copy", gbps(ms) / copy_gbps}, {"bf16_best_us", bf16_us}});
      std::fprintf(stderr,
                   "int4 g%d %-22s n=%2lld: gemv %8.2f us (%3.0f%%) | mma %8.2f us (%3.0f%%) | stream %8.2f us "
                   "(%3.0f%%) | auto %8.2f us (%3.0f%% of copy) | bf16 best %8.2f us: %.2fx\n",
                   kGroup, s.name, static_cast<long long>(n), gemv_ms * 1e3, 100.0 * gbps(gemv_ms) / copy_gbps,
                   mma_ms * 1e3, 100.0 * gbps(mma_ms) / copy_gbps, stream_ms * 1e3, 100.0 * gbps(stream_ms) / copy_gbps,
                   ms * 1e3, 100.0 * gbps(ms) / copy_gbps, bf16_us,
                   ms > 0 ? bf16_us / (ms * 1e3) : 0.0);
    }
  }
  out["int4_gemv"] = list;
  return Status::Ok();
}

// The int4 decode GEMM (1-2 tokens, activations staged in the kernel) at every K slicing of each
// shape, the planner's marked: what its cost model is checked against.
Status bench_int4_slices(double copy_gbps, nlohmann::json& out, const Options& opt) {
  TACHYON_ASSIGN_OR_RETURN(const int sm_count, cu::current_sm_count());
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : int4_shapes()) {
    TACHYON_ASSIGN_OR_RETURN(const Int4Weights w, make_int4_weights(s, opt));
    const int64_t chunks = s.in / Int4Weights::kGroup;
    TACHYON_ASSIGN_OR_RETURN(auto partial, cu::DeviceBuffer::allocate(32 * 2 * s.out * 4, "split-K partials"));
    for (int64_t n = 1; n <= cu::detail::kGemmMmaInt4StageMaxTokens; ++n) {
      const cu::LinearArgs a0 = w.args(0, n);
      const cu::detail::GemvShape planned = cu::detail::plan_gemm_mma_int4(a0, sm_count);
      const int64_t row_blocks = cu::detail::gemm_mma_int4_row_blocks(a0);
      TACHYON_ASSIGN_OR_RETURN(auto counters, cu::DeviceBuffer::allocate(row_blocks * 4, "split-K counters"));
      BENCH_CUDA(cudaMemset(counters.data(), 0, row_blocks * 4));
      // Every slicing into equal slices of whole chunks, and the planner's where it is not one of
      // them (its slices hold whole rounds of the kernel, so the last one may be shorter).
      std::vector<cu::detail::GemvShape> shapes;
      for (int64_t splits = 1; splits <= std::min<int64_t>(chunks, 32); ++splits) {
        cu::detail::GemvShape shape = planned;
        shape.chunk = (chunks + splits - 1) / splits * Int4Weights::kGroup;
        if ((s.in + shape.chunk - 1) / shape.chunk != splits) continue;  // the slicing of fewer splits
        shape.splits = static_cast<int>(splits);
        shapes.push_back(shape);
      }
      if (std::none_of(shapes.begin(), shapes.end(), [&](const auto& x) { return x.chunk == planned.chunk; })) {
        shapes.push_back(planned);
      }
      for (const cu::detail::GemvShape& shape : shapes) {
        const int64_t splits = shape.splits;
        if (!cu::detail::gemm_mma_int4_stages_x(a0, shape)) continue;
        const auto body = [&](int i, cu::Stream st) -> Status {
          BENCH_CUDA(cu::detail::launch_gemm_mma_int4(w.args(i % w.copies, n), nullptr, 0, shape, partial.as<float>(),
                                                      counters.as<unsigned>(), st));
          return Status::Ok();
        };
        TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, w.copies, std::max(w.copies, 40), 5));
        const bool is_planned = shape.chunk == planned.chunk;
        const double fraction = static_cast<double>(w.bytes) / (ms * 1e-3) / 1e9 / copy_gbps;
        list.push_back({{"shape", s.name}, {"n", n}, {"splits", splits}, {"slice_chunks", shape.chunk / 128},
                        {"planned", is_planned}, {"us", ms * 1e3}, {"fraction_of_copy", fraction}});
        std::printf("int4 slices %-22s n=%lld splits %2lld (%2lld chunks)%s: %7.2f us (%3.0f%% of copy)\n", s.name,
                    static_cast<long long>(n), static_cast<long long>(splits),
                    static_cast<long long>(shape.chunk / 128), is_planned ? " planned" : "        ", ms * 1e3,
                    100.0 * fraction);
      }
    }
  }
  out["int4_slices"] = list;
  return Status::Ok();
}

// The int4 decode GEMM at one token and the planner's slicing in each probe mode
// (launch_gemm_mma_int4_probe): the whole kernel, then with parts left out.
Status bench_int4_sol(double copy_gbps, nlohmann::json& out, const Options& opt) {
  TACHYON_ASSIGN_OR_RETURN(const int sm_count, cu::current_sm_count());
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : int4_shapes()) {
    TACHYON_ASSIGN_OR_RETURN(const Int4Weights w, make_int4_weights(s, opt));
    TACHYON_ASSIGN_OR_RETURN(auto partial, cu::DeviceBuffer::allocate(32 * 2 * s.out * 4, "split-K partials"));
    const cu::LinearArgs a0 = w.args(0, 1);
    const cu::detail::GemvShape shape = cu::detail::plan_gemm_mma_int4(a0, sm_count);
    const int64_t row_blocks = cu::detail::gemm_mma_int4_row_blocks(a0);
    TACHYON_ASSIGN_OR_RETURN(auto counters, cu::DeviceBuffer::allocate(row_blocks * 4, "split-K counters"));
    BENCH_CUDA(cudaMemset(counters.data(), 0, row_blocks * 4));
    for (int mode = 0; mode < cu::detail::gemm_mma_int4_probe_modes(); ++mode) {
      const auto body = [&](int i, cu::Stream st) -> Status {
        BENCH_CUDA(cu::detail::launch_gemm_mma_int4_probe(w.args(i % w.copies, 1), shape, mode, partial.as<float>(),
                                                          counters.as<unsigned>(), st));
        return Status::Ok();
      };
      TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, w.copies, std::max(w.copies, 40), 5));
      const double fraction = static_cast<double>(w.bytes) / (ms * 1e-3) / 1e9 / copy_gbps;
      list.push_back({{"shape", s.name}, {"splits", shape.splits}, {"slice_chunks", shape.chunk / 128},
                      {"mode", cu::detail::gemm_mma_int4_probe_name(mode)}, {"us", ms * 1e3},
                      {"fraction_of_copy", fraction}});
      std::printf("int4 sol %-22s splits %2d: %-32s %7.2f us (%3.0f%% of copy)\n", s.name, shape.splits,
                  cu::detail::gemm_mma_int4_probe_name(mode), ms * 1e3, 100.0 * fraction);
    }
  }
  out["int4_sol"] = list;
  return Status::Ok();
}

// The streamed int4 GEMM (sm_90, 1-2 tokens) with 3, 4, 6 and 8 stages and one or two blocks per
// SM (where two fit in shared memory), at the planner's K split: what its stage count and grid are
// checked against.
Status bench_int4_stream_probe(double copy_gbps, nlohmann::json& out, const Options& opt) {
  TACHYON_ASSIGN_OR_RETURN(const int sm_count, cu::current_sm_count());
  TACHYON_ASSIGN_OR_RETURN(const int cc, cu::current_compute_capability());
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : int4_shapes()) {
    TACHYON_ASSIGN_OR_RETURN(const Int4Weights w, make_int4_weights(s, opt));
    const int64_t tiles = (s.out + 15) / 16;
    TACHYON_ASSIGN_OR_RETURN(auto partial, cu::DeviceBuffer::allocate(4 * 2 * s.out * 4, "split-K partials"));
    TACHYON_ASSIGN_OR_RETURN(auto counters, cu::DeviceBuffer::allocate(tiles * 4, "split-K counters"));
    BENCH_CUDA(cudaMemset(counters.data(), 0, tiles * 4));
    for (int64_t n = 1; n <= cu::detail::kGemmInt4StreamMaxTokens; ++n) {
      const cu::LinearArgs a0 = w.args(0, n);
      if (!cu::detail::gemm_int4_stream_supported(a0, cc)) continue;
      const cu::detail::Int4StreamPlan planned = cu::detail::plan_gemm_int4_stream(a0, sm_count);
      for (int stages : {3, 4, 6, 8}) {
        for (int per_sm : {1, 2}) {
          // Two blocks of a persistent grid per SM only where both are resident at once.
          const size_t shared = cu::detail::gemm_int4_stream_shared_bytes(n, s.in, stages);
          if (shared > cu::detail::kGemmInt4StreamMaxShared || (per_sm == 2 && 2 * (shared + 1024) > 228 * 1024)) {
            continue;
          }
          cu::detail::Int4StreamPlan plan = planned;
          plan.blocks = static_cast<int>(std::min<int64_t>(plan.items, int64_t{per_sm} * sm_count));
          const auto body = [&](int i, cu::Stream st) -> Status {
            BENCH_CUDA(cu::detail::launch_gemm_int4_stream_probe(w.args(i % w.copies, n), plan, stages,
                                                                 partial.as<float>(), counters.as<unsigned>(), st));
            return Status::Ok();
          };
          TACHYON_ASSIGN_OR_RETURN(const double ms, time_graph_ms(body, w.copies, std::max(w.copies, 40), 5));
          const double fraction = static_cast<double>(w.bytes) / (ms * 1e-3) / 1e9 / copy_gbps;
          list.push_back({{"shape", s.name}, {"n", n}, {"stages", stages}, {"blocks_per_sm", per_sm},
                          {"splits", plan.splits}, {"us", ms * 1e3}, {"fraction_of_copy", fraction}});
          std::printf("int4 stream %-22s n=%lld stages %d x%d per SM (splits %d): %7.2f us (%3.0f%% of copy)\n",
                      s.name, static_cast<long long>(n), stages, per_sm, plan.splits, ms * 1e3, 100.0 * fraction);
        }
      }
    }
  }
  out["int4_stream_probe"] = list;
  return Status::Ok();
}

}  // namespace tachyon::bench
