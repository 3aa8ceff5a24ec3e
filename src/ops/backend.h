// A backend of the op interface: ops.cpp checks each op's arguments once (the rules that hold on
// every device: ranks, dtypes, shapes, one device for all its tensors) and sends it to the backend
// of its tensors' device. The CPU's (ops/cpu/backend.h) is built in; a device backend registers
// when it starts (ops/cuda: ops::cuda::start_backend()). A backend runs its kernels on checked
// arguments; it checks only what it alone cannot do (its capability checks) and, where it can read
// them, the values of index tensors. A device backend runs its kernels in order on its stream and
// ops never wait for the device, so errors raised while kernels run surface at synchronize().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/kernel_types.h"
#include "ops/ops.h"

namespace tachyon::ops {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string describe() const = 0;  // "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"

  virtual void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode) = 0;
  // linear_fused() in as few launches as the backend can: true when it ran the whole op, false
  // when it did nothing (ops::linear_fused then runs the separate ops). Never asked to defer an
  // add (a false return lets the caller defer it).
  virtual bool try_linear_fused(const Tensor& x, const Weight& w, const Tensor* bias, const LinearFusion& fusion,
                                Tensor& y, LinearMode mode) {
    (void)x, (void)w, (void)bias, (void)fusion, (void)y, (void)mode;
    return false;
  }
  virtual void add(Tensor& y, const Tensor& x) = 0;
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) = 0;
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) = 0;
  virtual void rope(Tensor& x, const Tensor& positions, const RopeTable& table) = 0;
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  virtual void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache) = 0;
  // rope(q), rope(k), store_kv(k, v); a backend may do them in one launch.
  virtual void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeTable& table,
                             const Tensor& slot_mapping, KvLayer& cache) {
    rope(q, positions, table);
    rope(k, positions, table);
    store_kv(k, v, slot_mapping, cache);
  }
  virtual void compress_kv_blocks(const Tensor& pairs, KvLayer& cache) = 0;
  virtual void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                               const AttentionParams& params, Tensor& out) = 0;
  virtual void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                                Tensor& lens) = 0;
  virtual void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) = 0;
  virtual void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) = 0;
  virtual void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                              const Tensor& block_tables, int block_size, Tensor& slot_mapping) = 0;
  virtual void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) = 0;
  virtual void adjust_logits(Tensor& x, const Tensor& edits) = 0;
  virtual void mask_logits(Tensor& x, const Tensor& masks) = 0;
  virtual void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) = 0;
  virtual void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) = 0;
  virtual void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales,
                                    Tensor& zeros) = 0;
  virtual void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) = 0;
  virtual void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights,
                           Tensor& y, LinearMode mode, Tensor* expert_tokens) = 0;
  virtual void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) = 0;
  // Waits for every op issued so far; returns the first error any of them raised.
  virtual Status synchronize() = 0;
  // The first error an op recorded since the last call (ops/errors.h), which it clears; the ops
  // after an error do nothing until then.
  virtual Status take_error() = 0;

  // Graphs: the ops issued between begin_capture() and end_capture() are recorded, not run, and
  // replay() runs them again with the same arguments (device pointers included: the inputs must
  // be rewritten in place between replays). Nothing may wait for the device while capturing.
  virtual Status begin_capture() = 0;
  virtual Result<std::shared_ptr<void>> end_capture() = 0;  // an opaque executable graph
  virtual Status replay(const std::shared_ptr<void>& graph) = 0;
  // Changes whenever the backend replaces a scratch buffer that captured graphs may point at
  // (workspaces grown for a larger shape): graphs captured before a change must not be replayed.
  virtual uint64_t scratch_epoch() const { return 0; }
};

// The kernels' view (ops/kernel_types.h) of one layer of the cache, whose tensors have passed
// check_kv_layer(): the same for every backend, the pointers in that backend's memory. The scale
// pools' [.., 1] is packed, so they are plain [num_blocks, block_size, num_kv_heads] arrays.
inline KvCacheView kv_cache_view(const KvLayer& layer) {
  KvCacheView view;
  view.k = layer.k.raw_data();
  view.v = layer.v.raw_data();
  if (layer.k_scales.defined()) {
    view.k_scales = layer.k_scales.data<float>();
    view.v_scales = layer.v_scales.data<float>();
  }
  view.dtype = layer.k.dtype();
  view.num_blocks = layer.k.size(0);
  view.block_size = layer.k.size(1);
  view.num_kv_heads = layer.k.size(2);
  view.head_dim = layer.k.size(3);
  if (layer.hk.defined()) {
    view.hk = layer.hk.raw_data();
    view.hv = layer.hv.raw_data();
    view.hk_params = layer.hk_params.raw_data();
    view.hv_params = layer.hv_params.raw_data();
    view.history_bits = layer.hk.dtype() == DType::kI8 ? 8 : 4;
    view.num_history_blocks = layer.hk.size(0);
    if (layer.kbounds.defined()) {
      view.kbounds = static_cast<const uint8_t*>(layer.kbounds.raw_data());
      view.kbound_params = layer.kbound_params.data<float>();
    }
  }
  return view;
}

// The kernels' view of a step's batch (AttentionMetadata, checked by ops.cpp): its index arrays
// pointers, in the backend's memory, and the maxima.
inline AttentionBatch attention_batch(const AttentionMetadata& meta) {
  AttentionBatch batch;
  batch.num_seqs = meta.num_seqs;
  batch.query_start = meta.query_start.data<int32_t>();
  batch.context_lens = meta.context_lens.data<int32_t>();
  batch.block_tables = meta.block_tables.data<int32_t>();
  batch.max_blocks_per_seq = meta.block_tables.size(1);
  batch.max_query_len = meta.max_query_len;
  batch.max_context_len = meta.max_context_len;
  if (meta.tree_masks.defined()) batch.tree_masks = static_cast<const uint64_t*>(meta.tree_masks.raw_data());
  if (meta.sparse_tables.defined()) {
    batch.sparse_tables = meta.sparse_tables.data<int32_t>();
    batch.sparse_lens = meta.sparse_lens.data<int32_t>();
  }
  if (meta.sparse_budgets.defined()) batch.sparse_budgets = meta.sparse_budgets.data<int32_t>();
  batch.sparse_sink_blocks = meta.sparse_sink_blocks;
  return batch;
}

// Registers (null: removes) the backend of a device type other than the CPU.
void register_backend(DeviceType type, Backend* backend);
// The backend running `device`'s type: the CPU's for the CPU, else the registered one or null
// (then ops on it fail their checks).
Backend* backend_for(Device device);

}  // namespace tachyon::ops
