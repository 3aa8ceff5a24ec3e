// Device helpers of the CUDA backend: error -> Status conversion, device queries, allocation with
// sized out-of-memory messages, copies, and the once-per-process kernel log.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/host_util.h"
#include "ops/cuda/launch.h"
#include "ops/cpu/kernels.h"

namespace tachyon::ops::cuda {
namespace {

std::string gib(size_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

Status cuda_status(cudaError_t error, const char* expression, const char* file, int line) {
  if (error == cudaSuccess) return Status::Ok();
  const ErrorCode code = error == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  return make_error(code, "{}:{}: {} failed: {} ({})", file, line, expression, cudaGetErrorString(error),
                    cudaGetErrorName(error));
}

void log_path_once(std::string_view path) {
  if (static_cast<int>(log_level()) < static_cast<int>(LogLevel::kInfo)) return;
  static std::mutex mutex;
  static std::unordered_set<std::string> seen;
  std::string key(path);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.insert(key).second) return;
  }
  TACHYON_LOG_INFO("{}", key);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::string DeviceProperties::to_string() const {
  return fmt::format("{} (sm_{}{}, {} SMs, {}, L2 {} MiB)", name, compute_major, compute_minor, multiprocessors,
                     gib(total_memory), l2_cache_bytes >> 20);
}

Result<DeviceProperties> device_properties(int device) {
  cudaDeviceProp prop{};
  TACHYON_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  DeviceProperties p;
  p.index = device;
  p.name = prop.name;
  p.compute_major = prop.major;
  p.compute_minor = prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  p.total_memory = prop.totalGlobalMem;
  p.l2_cache_bytes = static_cast<size_t>(prop.l2CacheSize);
  p.shared_memory_per_block = prop.sharedMemPerBlockOptin;
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess) p.memory_clock_khz = clock_khz;
  if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) p.memory_bus_bits = bus_bits;
  (void)cudaGetLastError();
  return p;
}

Status set_device(int device) {
  TACHYON_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return Status::Ok();
}

Result<int> current_sm_count() {
  int device = 0, sms = 0;
  TACHYON_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

Result<int> current_compute_capability() {
  // Asked once per attention call: remembered per device (a device's capability never changes).
  static std::array<std::atomic<int>, 64> known{};
  int device = 0, major = 0, minor = 0;
  TACHYON_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device >= 0 && device < static_cast<int>(known.size())) {
    const int cc = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
    if (cc > 0) return cc;
  }
  TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = major * 10 + minor;
  if (device >= 0 && device < static_cast<int>(known.size())) known[static_cast<size_t>(device)].store(cc);
  return cc;
}

namespace {

std::atomic<bool>& programmatic_launch_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("TACHYON_PDL");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return flag;
}

}  // namespace

void set_programmatic_launch(bool enabled) { programmatic_launch_flag().store(enabled); }
bool programmatic_launch() { return programmatic_launch_flag().load(); }

namespace detail {

bool pdl_enabled() {
  if (!programmatic_launch_flag().load(std::memory_order_relaxed)) return false;
  const Result<int> cc = current_compute_capability();
  return cc.ok() && *cc >= 90;
}

}  // namespace detail

Result<void*> device_malloc(size_t bytes, std::string_view what) {
  void* ptr = nullptr;
  if (bytes == 0) return ptr;
  const cudaError_t error = cudaMalloc(&ptr, bytes);
  if (error == cudaSuccess) return ptr;
  (void)cudaGetLastError();
  size_t free_bytes = 0, total_bytes = 0;
  int device = -1;
  (void)cudaGetDevice(&device);
  const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  (void)cudaGetLastError();
  const std::string info = have_info ? fmt::format("; device {} has {} free of {}", device, gib(free_bytes), gib(total_bytes))
                                     : std::string();
  if (error == cudaErrorMemoryAllocation) {
    return make_error(ErrorCode::kOutOfMemory, "out of device memory allocating {} ({} bytes = {}){}", what, bytes,
                      gib(bytes), info);
  }
  return make_error(ErrorCode::kInternal, "cudaMalloc of {} bytes for {} failed: {} ({}){}", bytes, what,
                    cudaGetErrorString(error), cudaGetErrorName(error), info);
}

void device_free(void* ptr) {
  if (ptr == nullptr) return;
  const cudaError_t error = cudaFree(ptr);
  if (error != cudaSuccess) TACHYON_LOG_WARN("cudaFree failed: {}", cudaGetErrorString(error));
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, std::string_view what) {
  TACHYON_ASSIGN_OR_RETURN(void* ptr, device_malloc(bytes, what));
  DeviceBuffer b;
  b.data_ = ptr;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    device_free(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Status copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  TACHYON_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  TACHYON_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status copy_on_device(void* device_dst, const void* device_src, size_t bytes, Stream stream) {
  if (bytes == 0) return Status::Ok();
  TACHYON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream));
  return Status::Ok();
}

Status memset_device(void* device_dst, int byte, size_t bytes, Stream stream) {
  if (bytes == 0) return Status::Ok();
  TACHYON_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_dst, byte, bytes, stream));
  return Status::Ok();
}

Status synchronize(Stream stream) {
  if (stream == nullptr) {
    TACHYON_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  } else {
    TACHYON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  return Status::Ok();
}

Status fill_random(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi, Stream stream) {
  TACHYON_CUDA_REQUIRE(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                       "fill_random: dtype {} is not f32/f16/bf16", dtype_name(dtype));
  TACHYON_CUDA_REQUIRE(count >= 0 && (count == 0 || data != nullptr), "fill_random: {} elements at {}", count, data);
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_fill_random(data, dtype, count, seed, lo, hi, stream));
  return Status::Ok();
}

}  // namespace tachyon::ops::cuda

namespace tachyon::ops::cuda {

Status fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, uint64_t stream, float bound, float offset,
                    Stream cuda_stream) {
  TACHYON_CUDA_REQUIRE(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                       "fill_uniform: dtype {} is not f32/f16/bf16", dtype_name(dtype));
  TACHYON_CUDA_REQUIRE(count >= 0 && (count == 0 || data != nullptr), "fill_uniform: {} elements at {}", count, data);
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_fill_uniform(data, dtype, count, cpu::fill_uniform_base(seed, stream),
                                                           bound, offset, cuda_stream));
  return Status::Ok();
}

Status argmax(const float* x, int64_t x_stride, int64_t n, int64_t d, int32_t* ids, float* logprobs, Stream stream,
              void* workspace, size_t workspace_bytes) {
  TACHYON_CUDA_REQUIRE(n >= 0 && d >= 1 && x_stride >= d, "argmax: [{}, {}] rows {} apart", n, d, x_stride);
  TACHYON_CUDA_REQUIRE(n == 0 || (x != nullptr && ids != nullptr), "argmax: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_argmax(x, x_stride, n, d, ids, logprobs, workspace, workspace_bytes, stream));
  return Status::Ok();
}

size_t argmax_workspace_bytes(int64_t n, int64_t d) { return detail::argmax_workspace_bytes(n, d); }

Status top_tokens(const float* x, int64_t x_stride, int64_t n, int64_t d, int m, int32_t* ids, float* probs,
                  void* workspace, size_t workspace_bytes, Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && n <= 65535 && d >= 1 && d < 0x7fffffff && x_stride >= d,
                       "top_tokens: [{}, {}] rows {} apart", n, d, x_stride);
  TACHYON_CUDA_REQUIRE(m >= 1 && m <= kMaxTopTokens, "top_tokens: m {} outside [1, {}]", m, kMaxTopTokens);
  TACHYON_CUDA_REQUIRE(n == 0 || (x != nullptr && ids != nullptr && probs != nullptr), "top_tokens: null pointer");
  TACHYON_CUDA_REQUIRE(n == 0 || (workspace != nullptr && workspace_bytes >= top_tokens_workspace_bytes(n, d, m)),
                       "top_tokens: {} bytes of workspace, {} needed", workspace_bytes,
                       top_tokens_workspace_bytes(n, d, m));
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_top_tokens(x, x_stride, n, d, m, ids, probs, workspace, workspace_bytes, stream));
  return Status::Ok();
}

size_t top_tokens_workspace_bytes(int64_t n, int64_t d, int m) { return detail::top_tokens_workspace_bytes(n, d, m); }

Status advance_decode(const int32_t* next_ids, int32_t* token_ids, int32_t* positions, int32_t* context_lens,
                      const int32_t* block_tables, int64_t columns, int block_size, int32_t* slot_mapping, int64_t n,
                      Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && n < 0x7fffffff && columns >= 0 && block_size >= 1,
                       "advance_decode: {} sequences, {} table columns, block size {}", n, columns, block_size);
  TACHYON_CUDA_REQUIRE(n == 0 || (next_ids != nullptr && token_ids != nullptr && positions != nullptr &&
                                  context_lens != nullptr && block_tables != nullptr && slot_mapping != nullptr),
                       "advance_decode: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_advance_decode(next_ids, token_ids, positions, context_lens, block_tables,
                                                             columns, block_size, slot_mapping, n, stream));
  return Status::Ok();
}

Status sample(const float* x, int64_t x_stride, int64_t n, int64_t d, const float* params, int32_t* ids,
              float* logprobs, Stream stream, float* probs) {
  TACHYON_CUDA_REQUIRE(n >= 0 && d >= 1 && x_stride >= d, "sample: [{}, {}] rows {} apart", n, d, x_stride);
  TACHYON_CUDA_REQUIRE(n == 0 || (x != nullptr && params != nullptr && ids != nullptr && logprobs != nullptr),
                       "sample: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_sample(x, x_stride, n, d, params, ids, logprobs, probs, stream));
  return Status::Ok();
}

Status quantize_int8_rows(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in, int8_t* packed,
                          float* scales, Stream stream) {
  TACHYON_CUDA_REQUIRE(out >= 0 && in >= 0 && w_stride >= in, "quantize_int8_rows: [{}, {}] rows {} apart", out, in,
                       w_stride);
  TACHYON_CUDA_REQUIRE(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                       "quantize_int8_rows: weight dtype {}", dtype_name(dtype));
  TACHYON_CUDA_REQUIRE(out == 0 || in == 0 || (w != nullptr && packed != nullptr && scales != nullptr),
                       "quantize_int8_rows: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_quantize_int8_rows(w, dtype, w_stride, out, in, packed, scales, stream));
  return Status::Ok();
}

Status quantize_int4_groups(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in, int group,
                            bool f16_scales, uint8_t* packed, float* scales, float* zeros, Stream stream) {
  TACHYON_CUDA_REQUIRE(out >= 0 && in >= 0 && w_stride >= in, "quantize_int4_groups: [{}, {}] rows {} apart", out, in,
                       w_stride);
  TACHYON_CUDA_REQUIRE(group > 0 && group % 32 == 0 && in % group == 0,
                       "quantize_int4_groups: group {} (a multiple of 32 dividing in = {})", group, in);
  TACHYON_CUDA_REQUIRE(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                       "quantize_int4_groups: weight dtype {}", dtype_name(dtype));
  TACHYON_CUDA_REQUIRE(out == 0 || in == 0 || (w != nullptr && packed != nullptr && scales != nullptr && zeros != nullptr),
                       "quantize_int4_groups: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(
      detail::launch_quantize_int4_groups(w, dtype, w_stride, out, in, group, f16_scales, packed, scales, zeros, stream));
  return Status::Ok();
}

Status adjust_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const float* edits, int64_t m, Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && d >= 1 && x_stride >= d && m >= 0, "adjust_logits: [{}, {}] rows {} apart, {} edits",
                       n, d, x_stride, m);
  TACHYON_CUDA_REQUIRE(m == 0 || (x != nullptr && edits != nullptr), "adjust_logits: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_adjust_logits(x, x_stride, n, d, edits, m, stream));
  return Status::Ok();
}

Status mask_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const int32_t* masks, int64_t m, Stream stream) {
  TACHYON_CUDA_REQUIRE(n >= 0 && d >= 1 && x_stride >= d && m >= 0, "mask_logits: [{}, {}] rows {} apart, {} masks", n,
                       d, x_stride, m);
  TACHYON_CUDA_REQUIRE(m == 0 || (x != nullptr && masks != nullptr), "mask_logits: null pointer");
  TACHYON_CUDA_RETURN_IF_ERROR(detail::launch_mask_logits(x, x_stride, n, d, masks, m, stream));
  return Status::Ok();
}

}  // namespace tachyon::ops::cuda
