// tachyon_cuda_bench --cublaslt-candidates / --cublaslt-splitk: cuBLASLt's first heuristic
// against the fastest of its top candidates on Llama-3-8B's linear shapes (see cuda_bench.cpp's
// header for how every table is timed).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/cuda/launch.h"

namespace tachyon::bench {

// For each shape and token count: the first of cuBLASLt's heuristic results (what linear() runs)
// and the fastest of its top 8 when each is timed over rotating weights (median of 5).
Status bench_cublaslt_candidates(nlohmann::json& out, const Options& opt) {
  const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096},
                                     {"qkv 4096->6144", 4096, 6144},
                                     {"gate+up 4096->28672", 4096, 28672},
                                     {"down 14336->4096", 14336, 4096},
                                     {"lm_head 4096->128256", 4096, 128256}};
  const size_t rotate_bytes = opt.quick ? kGiB / 2 : 2 * kGiB;
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) return tachyon::make_error(tachyon::ErrorCode::kInternal, "cublasLtCreate failed");
  constexpr size_t kWorkspace = 32u << 20;
  TACHYON_ASSIGN_OR_RETURN(auto workspace, cu::DeviceBuffer::allocate(kWorkspace, "cuBLASLt workspace"));
  nlohmann::json list = nlohmann::json::array();
  for (const Shape& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.in * s.out) * 2;
    const int copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + wbytes - 1) / wbytes));
    TACHYON_ASSIGN_OR_RETURN(auto w, cu::DeviceBuffer::allocate(wbytes * copies, "weights"));
    TACHYON_RETURN_IF_ERROR(cu::fill_random(w.data(), DType::kBF16, s.in * s.out * copies, 7, -0.05f, 0.05f, nullptr));
    TACHYON_ASSIGN_OR_RETURN(auto x, cu::DeviceBuffer::allocate(256 * s.in * 2, "x"));
    TACHYON_RETURN_IF_ERROR(cu::fill_random(x.data(), DType::kBF16, 256 * s.in, 8, -1.f, 1.f, nullptr));
    TACHYON_ASSIGN_OR_RETURN(auto y, cu::DeviceBuffer::allocate(256 * s.out * 4, "y"));
    for (int64_t n : opt.cublaslt_splitk ? std::vector<int64_t>{8, 16, 32, 64} : std::vector<int64_t>{16, 32, 64, 128, 256}) {
      cublasLtMatmulDesc_t op = nullptr;
      cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
      cublasLtMatmulPreference_t pref = nullptr;
      cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
      cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.in, s.out, s.in);
      cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.in, n, s.in);
      cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, s.out, n, s.out);
      cublasLtMatmulPreferenceCreate(&pref);
      const uint64_t ws = kWorkspace;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      cublasLtMatmulHeuristicResult_t results[8] = {};
      int found = 0;
      cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 8, results, &found);
      const auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> double {
        const auto body = [&](int i, cu::Stream st) -> Status {
          const float alpha = 1.0f, beta = 0.0f;
          const char* wi = static_cast<const char*>(w.data()) + static_cast<size_t>(i % copies) * wbytes;
          if (cublasLtMatmul(handle, op, &alpha, wi, a, x.data(), b, &beta, y.data(), c, y.data(), c, &algo,
                             workspace.data(), kWorkspace, st) != CUBLAS_STATUS_SUCCESS) {
            return tachyon::make_error(tachyon::ErrorCode::kUnsupported, "the algorithm fails");
          }
          return Status::Ok();
        };
        auto ms = time_ms(body, nullptr, copies, std::max(copies, 20), 5);
        return ms.ok() ? *ms * 1e3 : INFINITY;
      };
      std::vector<double> us;
      for (int k = 0; k < found; ++k) us.push_back(time_algo(results[k].algo));
      // --cublaslt-splitk: every candidate again with its K split 1..16 ways (each reduction scheme
      // cuBLASLt accepts for it): do the small matrices gain what their few output tiles lose?
      if (opt.cublaslt_splitk && found > 0) {
        double best_us = INFINITY;
        int best_k = -1, best_split = 0;
        unsigned best_scheme = 0;
        for (int k = 0; k < found; ++k) {
          int32_t own_split = 1;
          size_t written = 0;
          cublasLtMatmulAlgoConfigGetAttribute(&results[k].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &own_split,
                                               sizeof(own_split), &written);
          for (int32_t split : {1, 2, 3, 4, 6, 8, 12, 16}) {
            for (uint32_t scheme : {CUBLASLT_REDUCTION_SCHEME_NONE, CUBLASLT_REDUCTION_SCHEME_INPLACE,
                                    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}) {
              if ((split == 1) != (scheme == CUBLASLT_REDUCTION_SCHEME_NONE)) continue;
              cublasLtMatmulAlgo_t algo = results[k].algo;
              cublasLtMatmulHeuristicResult_t checked{};
              if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split)) !=
                      CUBLAS_STATUS_SUCCESS ||
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                       sizeof(scheme)) != CUBLAS_STATUS_SUCCESS ||
                  cublasLtMatmulAlgoCheck(handle, op, a, b, c, c, &algo, &checked) != CUBLAS_STATUS_SUCCESS ||
                  checked.workspaceSize > kWorkspace) {
                continue;
              }
              const double t = time_algo(algo);
              if (t < best_us) best_us = t, best_k = k, best_split = split, best_scheme = scheme;
            }
          }
          std::printf("  candidate #%d: its own split %d, %8.2f us\n", k, own_split, us[static_cast<size_t>(k)]);
        }
        list.push_back({{"shape", s.name}, {"n", n}, {"splitk_best_us", best_us}, {"splitk_best_index", best_k},
                        {"splitk", best_split}, {"reduction_scheme", best_scheme}, {"first_us", us[0]}});
        std::printf("%-22s n=%3lld: first %8.2f us, best split-K %8.2f us (%5.0f GB/s; #%d split %d scheme %u), %.2fx\n",
                    s.name, static_cast<long long>(n), us[0], best_us, wbytes / best_us / 1e3, best_k, best_split,
                    best_scheme, us[0] / best_us);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(c);
      cublasLtMatrixLayoutDestroy(b);
      cublasLtMatrixLayoutDestroy(a);
      cublasLtMatmulDescDestroy(op);
      if (us.empty()) continue;
      const size_t best = static_cast<size_t>(std::min_element(us.begin(), us.end()) - us.begin());
      list.push_back({{"shape", s.name}, {"n", n}, {"candidates", found}, {"first_us", us[0]},
                      {"best_us", us[best]}, {"best_index", best}, {"speedup", us[0] / us[best]}});
      std::printf("%-22s n=%3lld: %d candidates, first %8.2f us (%5.0f GB/s), best #%zu %8.2f us, %.2fx\n", s.name,
                  static_cast<long long>(n), found, us[0], wbytes / us[0] / 1e3, best, us[best], us[0] / us[best]);
    }
  }
  cublasLtDestroy(handle);
  out["cublaslt_candidates"] = list;
  return Status::Ok();
}

}  // namespace tachyon::bench
