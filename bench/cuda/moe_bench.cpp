// tachyon_cuda_bench --moe: ops::moe_experts at Qwen3-30B-A3B's expert shape (128 experts of
// 768, hidden 2048, top 8) for 1..512 tokens, bf16 and int4 g128 experts: each call's tokens
// routed by their own random router logits (8 routings in turn, so consecutive calls read other
// experts, as a model's layers do), the calls captured in a graph and replayed, the median of 5
// replays. GB/s counts the distinct chosen experts' bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "core/device_memory.h"
#include "ops/backend.h"
#include "ops/errors.h"
#include "ops/ops.h"

namespace tachyon::bench {

Status bench_moe(double copy_gbps, nlohmann::json& out, std::vector<MoeRow>& rows) {
  TACHYON_RETURN_IF_ERROR(cu::start_backend(0));
  const Device gpu = Device::cuda(0);
  ops::Backend* backend = ops::backend_for(gpu);
  constexpr int kExperts = 128, kTopK = 8, kRoutings = 8;
  constexpr int64_t kHidden = 2048, kInter = 768;
  for (const bool int4 : {false, true}) {
    const auto stack = [&](int64_t rows_, int64_t cols, uint64_t seed) -> Result<Weight> {
      TACHYON_ASSIGN_OR_RETURN(Tensor d, empty_on({rows_, cols}, DType::kBF16, gpu, "experts"));
      ops::fill_uniform(d, seed, 0, 0.05f, 0.0f);
      Weight w;
      w.constant = true;
      if (!int4) {
        w.dense = d;
        return w;
      }
      auto q = std::make_shared<QuantWeight>();
      q->format = QuantFormat::kInt4Group;
      q->out_features = rows_;
      q->in_features = cols;
      q->group_size = 128;
      TACHYON_ASSIGN_OR_RETURN(q->packed, empty_on({rows_, cols / 2}, DType::kU8, gpu, "experts"));
      TACHYON_ASSIGN_OR_RETURN(q->scales, empty_on({rows_, cols / 128}, DType::kF32, gpu, "experts"));
      TACHYON_ASSIGN_OR_RETURN(q->zeros, empty_on({rows_, cols / 128}, DType::kF32, gpu, "experts"));
      ops::quantize_int4_groups(d, 128, false, q->packed, q->scales, q->zeros);
      w.quant = std::move(q);
      return w;
    };
    ops::MoeExperts experts;
    experts.num_experts = kExperts;
    experts.inter = kInter;
    TACHYON_ASSIGN_OR_RETURN(experts.gate, stack(kExperts * kInter, kHidden, 1));
    TACHYON_ASSIGN_OR_RETURN(experts.up, stack(kExperts * kInter, kHidden, 2));
    TACHYON_ASSIGN_OR_RETURN(experts.down, stack(kExperts * kHidden, kInter, 3));
    const double expert_bytes =
        static_cast<double>(experts.gate.nbytes() + experts.up.nbytes() + experts.down.nbytes()) / kExperts;
    for (const int64_t n : {1, 4, 32, 128, 512}) {
      TACHYON_ASSIGN_OR_RETURN(Tensor x, empty_on({n, kHidden}, DType::kF32, gpu, "x"));
      TACHYON_ASSIGN_OR_RETURN(Tensor y, empty_on({n, kHidden}, DType::kF32, gpu, "y"));
      ops::fill_uniform(x, 9, 0, 1.0f, 0.0f);
      std::vector<Tensor> ids(kRoutings), weights(kRoutings);
      double distinct = 0;
      for (int r = 0; r < kRoutings; ++r) {
        TACHYON_ASSIGN_OR_RETURN(Tensor logits, empty_on({n, kExperts}, DType::kF32, gpu, "logits"));
        ops::fill_uniform(logits, 100 + r, static_cast<uint64_t>(n), 3.0f, 0.0f);
        TACHYON_ASSIGN_OR_RETURN(ids[r], empty_on({n, kTopK}, DType::kI32, gpu, "ids"));
        TACHYON_ASSIGN_OR_RETURN(weights[r], empty_on({n, kTopK}, DType::kF32, gpu, "weights"));
        ops::moe_route(logits, true, ids[r], weights[r]);
        TACHYON_ASSIGN_OR_RETURN(Tensor host, copy_to(ids[r], Device::cpu(), "ids"));
        std::vector<bool> seen(kExperts, false);
        for (int64_t i = 0; i < n * kTopK; ++i) {
          distinct += seen[host.data<int32_t>()[i]] ? 0 : 1;
          seen[host.data<int32_t>()[i]] = true;
        }
      }
      distinct /= kRoutings;
      const int calls = n >= 128 ? 16 : 128;
      const auto enqueue = [&] {
        for (int i = 0; i < calls; ++i) ops::moe_experts(x, experts, ids[i % kRoutings], weights[i % kRoutings], y);
      };
      enqueue();  // warm-up: the workspace grows outside the graph
      TACHYON_RETURN_IF_ERROR(ops::synchronize(gpu));
      TACHYON_RETURN_IF_ERROR(backend->begin_capture());
      enqueue();
      TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<void> graph, backend->end_capture());
      TACHYON_RETURN_IF_ERROR(backend->replay(graph));
      TACHYON_RETURN_IF_ERROR(ops::synchronize(gpu));
      std::vector<double> samples;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        TACHYON_RETURN_IF_ERROR(backend->replay(graph));
        TACHYON_RETURN_IF_ERROR(ops::synchronize(gpu));
        samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
      }
      std::sort(samples.begin(), samples.end());
      MoeRow row;
      row.format = int4 ? "int4-g128" : "bf16";
      row.tokens = n;
      row.distinct = distinct;
      row.us = samples[2] * 1e6;
      row.gbps = distinct * expert_bytes / samples[2] / 1e9;
      out["moe"].push_back({{"format", row.format},
                            {"tokens", n},
                            {"distinct_experts", distinct},
                            {"us", row.us},
                            {"expert_gbps", row.gbps},
                            {"fraction_of_copy", row.gbps / copy_gbps}});
      rows.push_back(row);
    }
  }
  return ops::take_error(gpu);
}

void print_moe_table(const std::vector<MoeRow>& rows, double copy_gbps) {
  std::printf("moe_experts, 128 experts of 768 x 2048, top 8 (copy %.1f GB/s)\n", copy_gbps);
  std::printf("%-10s %6s %9s %10s %10s %8s\n", "format", "tokens", "experts", "us", "GB/s", "of copy");
  for (const MoeRow& r : rows) {
    std::printf("%-10s %6lld %9.1f %10.1f %10.1f %7.0f%%\n", r.format.c_str(), static_cast<long long>(r.tokens),
                r.distinct, r.us, r.gbps, 100.0 * r.gbps / copy_gbps);
  }
}

}  // namespace tachyon::bench
