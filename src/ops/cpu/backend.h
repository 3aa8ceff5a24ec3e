// The CPU backend of the op interface: ops.cpp hands it every op whose tensors are on the host,
// their shapes, dtypes and devices already checked. Each op runs before it returns (the kernels
// parallelise themselves), through the SIMD kernels of ops/cpu or, while the active ISA is
// kScalar, the scalar reference (reference.h). What it checks itself is what only the host can:
// the values of index tensors (token ids, slots, the batch's block tables and tree masks, logit
// edits, decode blocks), read in place before a kernel indexes memory with them. Its errors (the
// injected faults of ops/errors.h) are recorded per thread. Built in: backend_for() returns it for
// every CPU device, with nothing to start or register.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/ops.h"

namespace tachyon::ops::cpu {

class CpuBackend final : public Backend {
 public:
  std::string describe() const override;  // "cpu kernels: avx512" (ops::backend_info)

  void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode) override;
  void add(Tensor& y, const Tensor& x) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) override;
  void rope(Tensor& x, const Tensor& positions, const RopeTable& table) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache) override;
  void compress_kv_blocks(const Tensor& pairs, KvLayer& cache) override;
  void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                        Tensor& lens) override;
  void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                       const AttentionParams& params, Tensor& out) override;
  void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) override;
  void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y,
                   LinearMode mode, Tensor* expert_tokens) override;
  void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) override;
  void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) override;
  void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                      const Tensor& block_tables, int block_size, Tensor& slot_mapping) override;
  void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) override;
  void adjust_logits(Tensor& x, const Tensor& edits) override;
  void mask_logits(Tensor& x, const Tensor& masks) override;
  void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) override;
  void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) override;
  void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales,
                            Tensor& zeros) override;
  // No device kernel: ops::softmax calls it here, not through Backend.
  void softmax(Tensor& x);

  // Every op ran before it returned: nothing to wait for (its errors are taken with take_error).
  Status synchronize() override { return Status::Ok(); }
  Status take_error() override;  // this thread's first error since the last call
  // The host runs its ops as they come; nothing is recorded to replay.
  Status begin_capture() override;
  Result<std::shared_ptr<void>> end_capture() override;
  Status replay(const std::shared_ptr<void>& graph) override;
};

// The one CPU backend (stateless: the ISA choice is ops/cpu/isa.h's, errors are per thread).
CpuBackend& backend();

}  // namespace tachyon::ops::cpu
