// The CUDA backend of ops.h: unwraps the Tensors that ops.cpp checked into the raw-pointer
// launchers of cuda_ops.h, all on one stream, and provides core's device memory (a stream-ordered
// pool) so that Tensors can live on the GPU. Its own checks are capability checks only (what these
// kernels cannot run: a weight format without a kernel, a strided bias or norm weight, a tensor on
// another GPU), and abort like ops.cpp's. A workspace that cannot be allocated or a launch that
// fails is recorded instead (ops/errors.h): the ops after it do nothing until the model takes the
// error at the end of its forward. Execution errors surface at synchronize() or the next copy to
// the host.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device_memory.h"
#include "core/log.h"
#include "ops/backend.h"
#include "ops/device_backends.h"
#include "ops/errors.h"
#include "ops/cpu/rows.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/launch.h"
#include "quant/quantize.h"

namespace tachyon::ops::cuda {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// The kernels' name of a GGUF block format (quant/quantize.h's kGguf*); kNone for the others.
GgufFormat gguf_format_of(QuantFormat format) {
  switch (format) {
    case QuantFormat::kGgufQ8_0: return GgufFormat::kQ8_0;
    case QuantFormat::kGgufQ4_1: return GgufFormat::kQ4_1;
    case QuantFormat::kGgufQ5_0: return GgufFormat::kQ5_0;
    case QuantFormat::kGgufQ5_1: return GgufFormat::kQ5_1;
    case QuantFormat::kGgufIq4Nl: return GgufFormat::kIq4Nl;
    case QuantFormat::kGgufQ4_K: return GgufFormat::kQ4_K;
    case QuantFormat::kGgufQ5_K: return GgufFormat::kQ5_K;
    case QuantFormat::kGgufQ6_K: return GgufFormat::kQ6_K;
    default: return GgufFormat::kNone;
  }
}

// The kernels' rows of an activation (ops/kernel_types.h RowLayout).
Rows rows_of(const Tensor& t) { return cpu::row_layout(t); }

class CudaBackend final : public ops::Backend, public DeviceMemory {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int device) {
    TACHYON_RETURN_IF_ERROR(set_device(device));
    TACHYON_ASSIGN_OR_RETURN(DeviceProperties props, device_properties(device));
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend(device, std::move(props)));
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
    // Keep freed blocks in the pool: activations are allocated and freed every step.
    cudaMemPool_t pool = nullptr;
    TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    TACHYON_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    TACHYON_ASSIGN_OR_RETURN(b->linear_, LinearContext::create());
    return b;
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& [key, p] : opened_) cudaIpcCloseMemHandle(p);
    workspace_ = Scratch();
    argmax_workspace_ = Scratch();
    top_workspace_ = Scratch();
    moe_workspace_ = Scratch();
    rope_tables_.clear();
    linear_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int device() const { return device_; }

  // ---- DeviceMemory ------------------------------------------------------------------------------

  Result<void*> allocate(Device device, size_t bytes, std::string_view what) override {
    TACHYON_RETURN_IF_ERROR(check_device(device));
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return make_error(ErrorCode::kOutOfMemory,
                        "cuda:{}: out of memory allocating {} ({:.2f} MiB; {:.2f} GiB free of {:.2f} GiB): {}", device_,
                        what, static_cast<double>(bytes) / (1 << 20), static_cast<double>(free_bytes) / (1 << 30),
                        static_cast<double>(total_bytes) / (1 << 30), cudaGetErrorString(e));
    }
    return p;
  }

  void deallocate(Device, void* ptr) override {
    if (ptr == nullptr) return;
    const cudaError_t e = cudaFreeAsync(ptr, stream_);
    if (e != cudaSuccess) TACHYON_LOG_WARN("cudaFreeAsync: {}", cudaGetErrorString(e));
  }

  Status copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (!dst_device.is_cpu()) TACHYON_RETURN_IF_ERROR(check_device(dst_device));
    if (!src_device.is_cpu()) TACHYON_RETURN_IF_ERROR(check_device(src_device));
    if (!dst_device.is_cpu()) linear_->forget_staged();
    TACHYON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    // The host side is free (or filled) only once the copy ran.
    if (dst_device.is_cpu() || src_device.is_cpu()) TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  Status memset(void* dst, Device device, int byte, size_t bytes) override {
    TACHYON_RETURN_IF_ERROR(check_device(device));
    linear_->forget_staged();
    TACHYON_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, byte, bytes, stream_));
    return Status::Ok();
  }

  Status memory_info(Device device, size_t& free_bytes, size_t& total_bytes) override {
    TACHYON_RETURN_IF_ERROR(check_device(device));
    // Freed blocks stay in the pool (see create()) and count as used: hand them back first, so
    // that memory freed since (16-bit weights replaced by quantized ones, say) is seen as free.
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    cudaMemPool_t pool = nullptr;
    TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device_));
    TACHYON_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool, 0));
    TACHYON_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return Status::Ok();
  }

  // Legacy CUDA IPC: cudaMalloc'd memory (stream-ordered pool memory cannot be shared this way),
  // named by a 64-byte cudaIpcMemHandle_t that another process opens.
  Result<Shared> allocate_shared(Device device, size_t bytes, std::string_view what) override {
    TACHYON_RETURN_IF_ERROR(check_device(device));
    Shared out;
    const cudaError_t e = cudaMalloc(&out.data, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return make_error(ErrorCode::kOutOfMemory, "cuda:{}: out of memory allocating {} ({:.2f} MiB, shareable): {}",
                        device_, what, static_cast<double>(bytes) / (1 << 20), cudaGetErrorString(e));
    }
    cudaIpcMemHandle_t handle;
    const cudaError_t h = cudaIpcGetMemHandle(&handle, out.data);
    if (h != cudaSuccess) {
      cudaGetLastError();
      cudaFree(out.data);
      return make_error(ErrorCode::kUnsupported, "cuda:{}: {} cannot be shared with other processes: {}", device_, what,
                        cudaGetErrorString(h));
    }
    const auto* raw = reinterpret_cast<const uint8_t*>(&handle);
    out.handle.assign(raw, raw + sizeof(handle));
    return out;
  }

  void deallocate_shared(Device, void* data) override {
    if (data == nullptr) return;
    cudaStreamSynchronize(stream_);  // no copy of ours still reads or writes it
    const cudaError_t e = cudaFree(data);
    if (e != cudaSuccess) TACHYON_LOG_WARN("cudaFree: {}", cudaGetErrorString(e));
  }

  Result<void*> open_shared(Device device, std::span<const uint8_t> handle) override {
    TACHYON_RETURN_IF_ERROR(check_device(device));
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return make_error(ErrorCode::kInvalidArgument, "cuda:{}: an IPC handle of {} bytes (a CUDA one has {})", device_,
                        handle.size(), sizeof(cudaIpcMemHandle_t));
    }
    const std::string key(handle.begin(), handle.end());
    std::lock_guard lock(shared_mu_);
    if (auto it = opened_.find(key); it != opened_.end()) return it->second;
    TACHYON_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // a receiver thread's device need not be ours yet
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return make_error(ErrorCode::kUnsupported,
                        "cuda:{}: cannot map the other process's device memory (CUDA IPC needs both processes on one "
                        "host, GPUs that can reach each other, and two distinct processes): {}",
                        device_, cudaGetErrorString(e));
    }
    opened_.emplace(key, p);
    return p;
  }

  // ---- ops ---------------------------------------------------------------------------------------

  std::string describe() const override { return fmt::format("cuda:{} {}", device_, props_.to_string()); }

  // The arguments of cuda::linear for linear(x, w, bias) into y (swiglu: y holds half the
  // weight's rows), whose shapes and layouts ops.cpp checked.
  LinearArgs linear_args(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y) const {
    // Capability: the weight formats these kernels read (every QuantFormat today; a new one
    // needs its kernel here before it can run on the GPU).
    const QuantFormat format = w.quant ? w.quant->format : QuantFormat::kInt8Channel;
    TACHYON_CHECK(!w.quant || format == QuantFormat::kInt8Channel || format == QuantFormat::kW8A8 ||
                      format == QuantFormat::kFp8Channel || format == QuantFormat::kInt4Group ||
                      format == QuantFormat::kTernary || is_gguf_block_format(format),
                  "linear: the CUDA backend runs dense f32/f16/bf16, per-channel int8, w8a8, fp8, group-wise int4, "
                  "ternary and GGUF q8_0/q4_1/q5_0/q5_1/iq4_nl/q4_k/q5_k/q6_k weights (got {})",
                  quant_format_name(format));
    // Capability: the kernels read the bias packed (the CPU's copies a strided one).
    TACHYON_CHECK(bias == nullptr || bias->is_contiguous(), "linear: the CUDA kernels read a packed bias (got {})",
                  bias->shape_string());
    const Tensor& wd = w.quant ? w.quant->packed : w.dense;
    LinearArgs a;
    a.x = x.data<float>();
    a.x_stride = x.stride(0);
    a.w = wd.raw_data();
    a.w_dtype = wd.dtype();
    a.w_stride = wd.stride(0);
    // TACHYON_EARLY_WEIGHTS=0: kernels never read weights before waiting for the kernel before
    // them (the same bits; for measuring what the early reads gain).
    static const bool early_weights = [] {
      const char* env = std::getenv("TACHYON_EARLY_WEIGHTS");
      return env == nullptr || std::string_view(env) != "0";
    }();
    a.w_constant = w.constant && early_weights;
    if (w.quant) {
      const QuantWeight& q = *w.quant;
      if (format == QuantFormat::kInt4Group) {
        a.w_scales = q.scales.data<float>();
        a.w_zeros = q.zeros.data<float>();
        a.w_group = q.group_size;
      } else if (format == QuantFormat::kTernary) {
        a.w_scales = q.scales.data<float>();
        a.w_group = q.group_size;
        a.scheme = QuantScheme::kTernary;
      } else if (is_gguf_block_format(format)) {
        // Q8_0 and Q6_K keep their blocks' d apart (f16), the other formats' blocks hold it.
        a.gguf = gguf_format_of(format);
        if (q.scales.defined()) a.w_scales_f16 = q.scales.data<uint16_t>();
      } else {  // per output channel: int8, w8a8, fp8
        a.w_scales = q.scales.data<float>();
        if (format != QuantFormat::kInt8Channel) a.x_scale = q.input_scale;
        if (format == QuantFormat::kW8A8) a.scheme = QuantScheme::kW8A8;
      }
    }
    if (bias != nullptr) {
      a.bias = bias->raw_data();
      a.bias_dtype = bias->dtype();
    }
    a.y = y.data<float>();
    a.y_stride = y.stride(0);
    a.n = x.size(0);
    a.in = x.size(1);
    a.out = wd.size(0);
    return a;
  }

  void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, ops::LinearMode mode) override {
    if (!runnable("linear", x)) return;
    if (ops::detail::consume_fault(DeviceType::kCuda, ops::Fault::kKernel)) {
      require_ok(ops::detail::injected_error(ops::Fault::kKernel, "linear"));
      return;
    }
    const LinearArgs a = linear_args(x, w, bias, y);
    if (a.n == 0) return;
    if (mode == ops::LinearMode::kBatchInvariant) {
      // Every token through the GEMV, whose per-output summation order does not depend on n: a
      // row's result is the same alone or in any batch.
      const int64_t kChunk = a.gguf != GgufFormat::kNone                ? detail::kGemvGgufMaxTokens
                             : a.scheme == QuantScheme::kW8A8     ? detail::kGemvW8A8MaxTokens
                             : a.scheme == QuantScheme::kTernary  ? detail::kGemvTernaryMaxTokens
                             : a.w_dtype == DType::kU8                  ? kLinearAutoGemvMaxTokensInt4
                                                                        : 16;
      for (int64_t t0 = 0; t0 < a.n; t0 += kChunk) {
        LinearArgs c = a;
        c.x = a.x + t0 * a.x_stride;
        c.y = a.y + t0 * a.y_stride;
        c.n = std::min(kChunk, a.n - t0);
        require_ok(cuda::linear(*linear_, c, stream_, LinearAlgo::kGemv));
      }
      return;
    }
    require_ok(cuda::linear(*linear_, a, stream_, LinearAlgo::kAuto));
  }

  bool try_linear_fused(const Tensor& x, const Weight& w, const Tensor* bias, const ops::LinearFusion& f, Tensor& y,
                        ops::LinearMode mode) override {
    if (!runnable("linear_fused", x)) return true;
    // TACHYON_FUSED_LINEAR=0: always the separate ops (the same bits; for measuring the fusion).
    static const bool enabled = [] {
      const char* env = std::getenv("TACHYON_FUSED_LINEAR");
      return env == nullptr || std::string_view(env) != "0";
    }();
    // A norm inside the GEMV (each block normalizing x into shared memory before its K loop) cost
    // more than the norm kernel it saved: the norm runs apart (docs/perf.md, 2026-12-02).
    if (!enabled || mode != ops::LinearMode::kFastest) return false;
    if (f.norm_weight != nullptr) return norm_then_linear(x, w, bias, f, y);
    const LinearArgs a = linear_args(x, w, bias, y);
    detail::GemvFusion g;
    g.epilogue = f.swiglu ? detail::GemvEpilogue::kSwiGLU
                 : f.add_to_output ? detail::GemvEpilogue::kAdd
                                   : detail::GemvEpilogue::kStore;
    const Status s = cuda::linear_fused(*linear_, a, g, stream_);
    if (s.code() == ErrorCode::kUnsupported) return false;
    require_ok(s);
    return true;
  }

  // Mixture of experts (moe.cu).
  void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) override {
    if (!begin("moe_route", logits)) return;
    require_ok(cuda::moe_route(logits.data<float>(), logits.stride(0), logits.size(0), logits.size(1), ids.size(1),
                               normalize, ids.data<int32_t>(), weights.data<float>(), stream_));
  }

  // Every mode runs the grouped CUDA-core GEMV, whose sums for a token do not depend on the other
  // tokens of the batch: kBatchInvariant holds, and kFastest is the same kernels.
  void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y,
                   ops::LinearMode, Tensor* expert_tokens) override {
    if (!begin("moe_experts", x)) return;
    MoeArgs a;
    a.x = x.data<float>();
    a.x_stride = x.stride(0);
    a.ids = ids.data<int32_t>();
    a.weights = weights.data<float>();
    a.y = y.data<float>();
    a.y_stride = y.stride(0);
    a.n = x.size(0);
    a.k = ids.size(1);
    a.hidden = x.size(1);
    a.inter = experts.inter;
    a.num_experts = experts.num_experts;
    if (expert_tokens != nullptr) a.expert_tokens = expert_tokens->data<int64_t>();
    if (!moe_weight_view(experts.gate, a.gate) || !moe_weight_view(experts.up, a.up) ||
        !moe_weight_view(experts.down, a.down)) {
      return;
    }
    if (a.n == 0) return;
    const size_t bytes = cuda::moe_workspace_bytes(a.n, a.k, a.num_experts, a.hidden, a.inter);
    if (!grow_scratch(moe_workspace_, bytes, "moe workspace")) return;
    require_ok(cuda::moe_experts(a, moe_workspace_.data.get(), moe_workspace_.bytes, stream_));
  }

  void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) override {
    if (!begin("add_sigmoid_gated", y)) return;
    require_ok(cuda::add_sigmoid_gated(y.data<float>(), y.stride(0), x.data<float>(), x.stride(0), gate.data<float>(),
                                       gate.stride(0), y.size(0), y.size(1), stream_));
  }

  void add(Tensor& y, const Tensor& x) override {
    if (!begin("add", y)) return;
    require_ok(cuda::add(y.data<float>(), rows_of(y), x.data<float>(), rows_of(x), stream_));
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) override {
    if (!begin("rms_norm", x)) return;
    norm(nullptr, x, weight, eps, y, Rows16{});
  }

  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) override {
    if (!begin("add_rms_norm", x)) return;
    norm(&residual, x, weight, eps, y, Rows16{});
  }

  void rope(Tensor& x, const Tensor& positions, const RopeTable& table) override {
    if (!begin("rope", x)) return;
    const float* inv_freq = inv_freq_on_device(table);
    if (inv_freq == nullptr) return;
    require_ok(cuda::rope(x.data<float>(), x.size(0), x.size(1), x.size(2), x.stride(0), x.stride(1),
                          positions.data<int32_t>(), inv_freq, table.rotary_dim, table.style, table.attention_scale,
                          stream_));
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    if (!begin("silu_mul", gate)) return;
    silu_mul_rows(gate, up, out, Rows16{});
  }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    if (!begin("embedding", out)) return;
    // The ids were checked against the vocabulary on the host (LlamaModel::forward); one outside
    // the table gives a NaN row rather than a read out of bounds.
    require_ok(cuda::embedding(table.raw_data(), table.dtype(), table.stride(0), table.size(0), table.size(1),
                               ids.data<int32_t>(), ids.size(0), out.data<float>(), out.stride(0), stream_));
  }

  void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& layer) override {
    if (!begin("store_kv", k)) return;
    const KvCacheView cache = kv_cache_view(layer);
    require_ok(cuda::store_kv(k.data<float>(), k.stride(0), k.stride(1), v.data<float>(), v.stride(0), v.stride(1),
                              k.size(0), slot_mapping.data<int32_t>(), cache, stream_));
  }

  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeTable& table,
                     const Tensor& slot_mapping, KvLayer& layer) override {
    if (!begin("rope_store_kv", q)) return;
    const KvCacheView cache = kv_cache_view(layer);
    // The one-launch kernel writes 16- and 32-bit caches; a quantized one takes the separate ops.
    if (!is_float(cache.dtype)) return Backend::rope_store_kv(q, k, v, positions, table, slot_mapping, layer);
    RopeStoreArgs a;
    a.q = q.data<float>();
    a.q_heads = q.size(1);
    a.q_token_stride = q.stride(0);
    a.q_head_stride = q.stride(1);
    a.k = k.data<float>();
    a.k_token_stride = k.stride(0);
    a.k_head_stride = k.stride(1);
    a.v = v.data<float>();
    a.v_token_stride = v.stride(0);
    a.v_head_stride = v.stride(1);
    a.n = q.size(0);
    a.positions = positions.data<int32_t>();
    a.inv_freq = inv_freq_on_device(table);
    if (a.inv_freq == nullptr) return;
    a.rotary_dim = table.rotary_dim;
    a.interleaved = table.style == RopeStyle::kInterleaved;
    a.attention_scale = table.attention_scale;
    a.slot_mapping = slot_mapping.data<int32_t>();
    require_ok(cuda::rope_store_kv(a, cache, stream_));
  }

  void compress_kv_blocks(const Tensor& pairs, KvLayer& layer) override {
    if (!begin("compress_kv_blocks", pairs)) return;
    require_ok(cuda::compress_kv_blocks(pairs.data<int32_t>(), pairs.size(0), kv_cache_view(layer), stream_));
  }

  void select_kv_blocks(const Tensor& q, const KvLayer& layer, const AttentionMetadata& meta, Tensor& tables,
                        Tensor& lens) override {
    if (!begin("select_kv_blocks", q)) return;
    const KvCacheView cache = kv_cache_view(layer);
    const AttentionBatch batch = attention_batch(meta);
    const size_t bytes = cuda::select_workspace_bytes(batch.num_seqs, cache.num_kv_heads, batch.max_blocks_per_seq);
    if (!grow_scratch(select_workspace_, bytes, "block selection workspace")) return;
    require_ok(cuda::select_kv_blocks(q.data<float>(), q.stride(0), q.stride(1), q.size(1), cache, batch,
                                      tables.data<int32_t>(), lens.data<int32_t>(), select_workspace_.data.get(),
                                      select_workspace_.bytes, stream_));
  }

  void paged_attention(const Tensor& q, const KvLayer& layer, const AttentionMetadata& meta,
                       const AttentionParams& params, Tensor& out) override {
    if (!begin("paged_attention", q)) return;
    const KvCacheView cache = kv_cache_view(layer);
    if (q.size(0) == 0) return;
    AttentionBatch batch = attention_batch(meta);
    auto plan = plan_paged_attention(batch, q.size(1), cache, params, props_.multiprocessors);
    if (!require_ok(plan.status())) return;
    if (ops::detail::consume_fault(DeviceType::kCuda, ops::Fault::kWorkspace)) {
      require_ok(ops::detail::injected_error(ops::Fault::kWorkspace, "attention workspace"));
      return;
    }
    if (!grow_scratch(workspace_, plan->workspace_bytes, "attention workspace")) return;
    // Past the GEMV's token counts the o_proj linear after a decode step's attention multiplies
    // in 16 bits, as the block's other linears do (norm_then_linear records their rounding): the
    // attention kernels write that rounding of their rows too, and the linear converts nothing.
    // Where the linear turns out not to read them, they are only a copy written.
    Rows16 out16;
    if (plan->algo == cuda::AttentionAlgo::kDecode && q.size(0) > kLinearAutoGemvMaxTokens &&
        activation_rounding_ != DType::kF32 && out.stride(1) == out.size(2)) {
      auto staged = linear_->stage_activations(out.data<float>(), out.stride(0), out.size(0), out.size(1) * out.size(2),
                                               activation_rounding_);
      if (!require_ok(staged.status())) return;
      out16 = *staged;
    }
    require_ok(cuda::paged_attention(*plan, q.data<float>(), q.stride(0), q.stride(1), q.size(1), cache, batch, params,
                                     out.data<float>(), out.stride(0), out.stride(1), workspace_.data.get(),
                                     workspace_.bytes, stream_, out16));
  }

  void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) override {
    if (!begin("argmax", x)) return;
    if (!grow_scratch(argmax_workspace_, argmax_workspace_bytes(x.size(0), x.size(1)), "argmax workspace")) return;
    require_ok(cuda::argmax(x.data<float>(), x.stride(0), x.size(0), x.size(1), ids.data<int32_t>(),
                            logprobs != nullptr ? logprobs->data<float>() : nullptr, stream_,
                            argmax_workspace_.data.get(), argmax_workspace_.bytes));
  }

  void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) override {
    if (!begin("top_tokens", x)) return;
    const int m = static_cast<int>(ids.size(1));
    if (!grow_scratch(top_workspace_, top_tokens_workspace_bytes(x.size(0), x.size(1), m), "top tokens workspace")) return;
    require_ok(cuda::top_tokens(x.data<float>(), x.stride(0), x.size(0), x.size(1), m, ids.data<int32_t>(),
                                probs.data<float>(), top_workspace_.data.get(), top_workspace_.bytes, stream_));
  }

  void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                      const Tensor& block_tables, int block_size, Tensor& slot_mapping) override {
    if (!begin("advance_decode", token_ids)) return;
    const int64_t n = token_ids.size(0);
    require_ok(cuda::advance_decode(next_ids.data<int32_t>(), token_ids.data<int32_t>(), positions.data<int32_t>(),
                                    context_lens.data<int32_t>(), block_tables.data<int32_t>(), block_tables.size(1),
                                    block_size, slot_mapping.data<int32_t>(), n, stream_));
  }

  void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) override {
    if (!begin("sample", x)) return;
    require_ok(cuda::sample(x.data<float>(), x.stride(0), x.size(0), x.size(1), params.data<float>(),
                            ids.data<int32_t>(), logprobs.data<float>(), stream_,
                            probs != nullptr ? probs->data<float>() : nullptr));
  }

  void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) override {
    if (!begin("quantize_int8_rows", w)) return;
    require_ok(cuda::quantize_int8_rows(w.raw_data(), w.dtype(), w.stride(0), w.size(0), w.size(1),
                                        packed.data<int8_t>(), scales.data<float>(), stream_));
  }

  void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales,
                            Tensor& zeros) override {
    if (!begin("quantize_int4_groups", w)) return;
    require_ok(cuda::quantize_int4_groups(w.raw_data(), w.dtype(), w.stride(0), w.size(0), w.size(1), group,
                                          f16_scales, packed.data<uint8_t>(), scales.data<float>(),
                                          zeros.data<float>(), stream_));
  }

  void adjust_logits(Tensor& x, const Tensor& edits) override {
    if (!begin("adjust_logits", x)) return;
    require_ok(cuda::adjust_logits(x.data<float>(), x.stride(0), x.size(0), x.size(1), edits.data<float>(),
                                   edits.size(0), stream_));
  }

  void mask_logits(Tensor& x, const Tensor& masks) override {
    if (!begin("mask_logits", x)) return;
    require_ok(cuda::mask_logits(x.data<float>(), x.stride(0), x.size(0), x.size(1), masks.data<int32_t>(),
                                 masks.size(0), stream_));
  }

  void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) override {
    if (!begin("fill_uniform", t)) return;
    require_ok(cuda::fill_uniform(t.raw_data(), t.dtype(), t.numel(), seed, stream, bound, offset, stream_));
  }

  Status synchronize() override {
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return error_;
  }

  Status take_error() override { return std::exchange(error_, Status::Ok()); }

  Status begin_capture() override {
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    return Status::Ok();
  }

  Result<std::shared_ptr<void>> end_capture() override {
    cudaGraph_t graph = nullptr;
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TACHYON_CUDA_RETURN_IF_ERROR(e);
    ++graphs_captured_;
    return std::shared_ptr<void>(exec, [](void* g) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g)); });
  }

  Status replay(const std::shared_ptr<void>& graph) override {
    TACHYON_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), stream_));
    return Status::Ok();
  }

  uint64_t scratch_epoch() const override { return epoch_ + linear_->generation(); }

 private:
  CudaBackend(int device, DeviceProperties props) : device_(device), props_(std::move(props)) {}

  // The kernels' view of a stacked expert projection (ops.h MoeExperts; dense ones packed, ops.cpp
  // checked); false, the error recorded, for a format moe.cu has no kernel for.
  bool moe_weight_view(const Weight& w, MoeWeightView& v) {
    if (!w.quant) {
      v.w = w.dense.raw_data();
      v.w_dtype = w.dense.dtype();
      v.w_stride = w.dense.stride(0);
      return true;
    }
    const QuantWeight& q = *w.quant;
    if (q.format != QuantFormat::kInt8Channel && q.format != QuantFormat::kInt4Group) {
      require_ok(make_error(ErrorCode::kUnsupported,
                            "moe_experts: the CUDA backend runs dense f32/f16/bf16, per-channel int8 and group-wise "
                            "int4 experts (got {})",
                            quant_format_name(q.format)));
      return false;
    }
    v.w = q.packed.raw_data();
    v.w_dtype = q.packed.dtype();
    v.w_stride = q.packed.stride(0);
    v.scales = q.scales.data<float>();
    if (q.format == QuantFormat::kInt4Group) {
      v.zeros = q.zeros.data<float>();
      v.group = q.group_size;
    }
    return true;
  }

  // rms_norm (residual null) or add_rms_norm on checked tensors; copy16: y again in 16 bits.
  void norm(Tensor* residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y, const Rows16& copy16) {
    // Capability: the kernels read the weight packed (the CPU's copies a strided one).
    TACHYON_CHECK(weight.is_contiguous(), "{}: the CUDA kernels read a packed norm weight (got {})",
                  residual != nullptr ? "add_rms_norm" : "rms_norm", weight.shape_string());
    if (residual != nullptr) {
      require_ok(cuda::add_rms_norm(residual->data<float>(), rows_of(*residual), x.data<float>(), rows_of(x),
                                    weight.raw_data(), weight.dtype(), eps, y.data<float>(), rows_of(y), stream_,
                                    copy16));
    } else {
      require_ok(cuda::rms_norm(x.data<float>(), rows_of(x), weight.raw_data(), weight.dtype(), eps, y.data<float>(),
                                rows_of(y), stream_, copy16));
    }
  }

  void silu_mul_rows(const Tensor& gate, const Tensor& up, Tensor& out, const Rows16& copy16) {
    require_ok(cuda::silu_mul(gate.data<float>(), rows_of(gate), up.data<float>(), rows_of(up), out.data<float>(),
                              rows_of(out), stream_, copy16));
  }

  // linear_fused with a norm before the linear, where linear() multiplies in 16 bits (cuBLASLt,
  // the tensor-core GEMM: linear_activation_dtype): the norm (with its pending residual add) and
  // SwiGLU run as the separate ops would, but each also writes its rows rounded to 16 bits
  // (LinearContext::stage_activations), so that neither this linear nor the next one (SwiGLU's
  // down projection) runs a conversion pass. The same bits as the separate ops. False, having done
  // nothing, elsewhere and with a residual add after the linear.
  bool norm_then_linear(const Tensor& x, const Weight& w, const Tensor* bias, const ops::LinearFusion& f, Tensor& y) {
    if (f.add_to_output || x.size(0) <= kLinearAutoGemvMaxTokens) return false;
    Tensor& normed = *f.scratch_x;
    Tensor& product = f.swiglu ? *f.scratch_y : y;
    const LinearArgs a = linear_args(normed, w, bias, product);
    const DType rounded = cuda::linear_activation_dtype(*linear_, a);
    if (rounded == DType::kF32) return false;
    activation_rounding_ = rounded;
    linear_->forget_staged();  // the norm writes rows a staged copy may hold
    // x is the residual stream when an add is pending (it becomes x + pending_add).
    Tensor residual = x;
    auto copy = linear_->stage_activations(a.x, a.x_stride, a.n, a.in, rounded);
    if (!require_ok(copy.status())) return true;
    if (f.pending_add != nullptr) {
      norm(&residual, *f.pending_add, *f.norm_weight, f.norm_eps, normed, *copy);
    } else {
      norm(nullptr, x, *f.norm_weight, f.norm_eps, normed, *copy);
    }
    require_ok(cuda::linear(*linear_, a, stream_, LinearAlgo::kAuto));
    if (f.swiglu) {
      const int64_t half = y.size(1);
      const Tensor gate = product.slice(1, 0, half), up = product.slice(1, half, 2 * half);
      // For the down projection, at this linear's rounding.
      auto next = linear_->stage_activations(y.data<float>(), y.stride(0), y.size(0), half, rounded);
      if (!require_ok(next.status())) return true;
      silu_mul_rows(gate, up, y, *next);
    }
    return true;
  }

  Status check_device(Device device) const {
    if (device.type == DeviceType::kCuda && device.index == device_) return Status::Ok();
    return make_error(ErrorCode::kInvalidArgument, "{} requested, but the CUDA backend runs cuda:{}",
                      device.to_string(), device_);
  }

  // The start of every op: false (the op does nothing) while an earlier op's error is not taken
  // (ops/errors.h). Capability: this backend runs one device; ops.cpp put all the op's tensors on
  // the device of `t`.
  bool runnable(const char* op, const Tensor& t) const {
    TACHYON_CHECK(t.device().index == device_, "{}: a tensor is on {}, but the CUDA backend runs cuda:{}", op,
                  t.device().to_string(), device_);
    return !failed();
  }

  // runnable() for every op but linear(), which may also write rows of activations staged for the
  // next linear (LinearContext::stage_activations): those are forgotten.
  bool begin(const char* op, const Tensor& t) {
    if (!runnable(op, t)) return false;
    linear_->forget_staged();
    return true;
  }

  // The table's frequencies on the device, uploaded on first use. Keyed by the table's address but
  // checked against its values: a freed model's table may come back at the same address.
  const float* inv_freq_on_device(const RopeTable& table) {
    const float* key = table.inv_freq.data();
    auto it = rope_tables_.find(key);
    if (it == rope_tables_.end() || it->second.values != table.inv_freq) {
      RopeUpload up;
      up.values = table.inv_freq;
      auto buf = DeviceBuffer::allocate(table.inv_freq.size() * sizeof(float), "rope frequencies");
      if (!require_ok(buf.status())) return nullptr;
      up.device = std::move(*buf);
      if (!require_ok(copy_to_device(up.device.data(), table.inv_freq.data(), up.device.bytes()))) return nullptr;
      if (it != rope_tables_.end()) ++epoch_;  // the old upload, which graphs may hold, is freed
      it = rope_tables_.insert_or_assign(key, std::move(up)).first;
    }
    return it->second.device.as<float>();
  }

  struct RopeUpload {
    std::vector<float> values;
    DeviceBuffer device;
  };

  int device_;
  DeviceProperties props_;
  Stream stream_ = nullptr;
  std::unique_ptr<LinearContext> linear_;
  // A device buffer kept across calls and grown on demand; captured graphs hold its pointer, so
  // every replacement moves scratch_epoch().
  struct Scratch {
    std::shared_ptr<void> data;
    size_t bytes = 0;
  };
  // False (the error recorded) when the buffer could not grow: the op must not run.
  bool grow_scratch(Scratch& s, size_t bytes, const char* what) {
    if (bytes <= s.bytes) return true;
    s = Scratch();
    ++epoch_;  // the old buffer, which graphs may hold, is gone
    auto p = allocate(Device::cuda(device_), bytes, what);
    if (!require_ok(p.status())) return false;
    s.data = std::shared_ptr<void>(*p, [this](void* ptr) { deallocate(Device::cuda(device_), ptr); });
    s.bytes = bytes;
    return true;
  }

  // Records the first error of an op (ops/errors.h); false when `status` is one.
  bool require_ok(const Status& status) {
    if (status.ok()) return true;
    if (error_.ok()) error_ = status;
    return false;
  }
  bool failed() const { return !error_.ok(); }

  Scratch workspace_;         // paged attention (decode partial results)
  Scratch select_workspace_;  // select_kv_blocks' scores
  Scratch argmax_workspace_;  // argmax chunks
  Scratch top_workspace_;     // top_tokens candidates
  Scratch moe_workspace_;     // moe_experts: the expert grouping and the grouped products
  uint64_t epoch_ = 0;        // scratch replacements here (the linear context counts its own)
  Status error_;              // the first op error not yet taken (ops/errors.h)
  std::unordered_map<const float*, RopeUpload> rope_tables_;
  std::mutex shared_mu_;                             // open_shared() runs on receiver threads
  std::unordered_map<std::string, void*> opened_;    // IPC handle bytes -> this process's mapping
  int64_t graphs_captured_ = 0;
  // The 16-bit rounding the last norm_then_linear staged for its linear (kF32: none yet), which a
  // decode step's attention also writes for the o_proj linear after it.
  DType activation_rounding_ = DType::kF32;
};

std::mutex g_mutex;
// Never destroyed: device tensors held by static objects may be freed during exit, and the CUDA
// runtime tears itself down then anyway.
CudaBackend* g_backend = nullptr;

}  // namespace

Status start_backend(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_backend) {
    if (g_backend->device() == device) return Status::Ok();
    return make_error(ErrorCode::kUnsupported, "the CUDA backend already runs cuda:{}; cuda:{} needs another process",
                      g_backend->device(), device);
  }
  const int count = device_count();
  if (device < 0 || device >= count) {
    return make_error(ErrorCode::kNotFound, "cuda:{} requested, but {} CUDA device(s) are visible", device, count);
  }
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::create(device));
  g_backend = backend.release();
  register_device_memory(DeviceType::kCuda, g_backend);
  ops::register_backend(DeviceType::kCuda, g_backend);
  TACHYON_LOG_INFO("cuda backend: {}", g_backend->describe());
  return Status::Ok();
}

}  // namespace tachyon::ops::cuda

namespace tachyon::ops {

// ops/device_backends.h in the CUDA build.
bool has_device_backend(DeviceType type) { return type == DeviceType::kCpu || type == DeviceType::kCuda; }

int available_devices(DeviceType type) {
  if (type == DeviceType::kCpu) return 1;
  return type == DeviceType::kCuda ? cuda::device_count() : 0;
}

std::string device_description(Device device) {
  if (device.is_cpu()) return device.to_string();
  auto p = cuda::device_properties(device.index);
  return p.ok() ? p->name : device.to_string();
}

Status start_device_backend(Device device) {
  if (device.is_cpu()) return Status::Ok();
  return cuda::start_backend(device.index);
}

}  // namespace tachyon::ops
