// Helpers shared by the test executables: where the source tree and ../shared are, scratch
// directories, random tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "core/tensor.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace tachyon::testing {

// The repository root ($TACHYON_SOURCE_DIR, else the one this binary was built from).
std::string source_dir();
// ../shared beside the checkout (or $TACHYON_SHARED_DIR); nullopt when absent, so tests
// that need it can GTEST_SKIP().
std::optional<std::string> shared_dir();
// A fresh empty directory under the system temp dir, removed at process exit.
std::string scratch_dir(const std::string& tag);
// The built CLI binary.
std::string tachyon_binary();

// Uniform [lo, hi) f32 tensor from a fresh seed (printed on failure by the caller).
Tensor random_tensor(const std::vector<int64_t>& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f);
uint32_t fresh_seed();

// While alive, GGUF block / int8 / int4 weights run through the CPU's exact f32 kernels rather than the
// integer dot products on int8 activations (ops/cpu/isa.h set_int8_dot): for tests that hold a
// quantized model to what its weights compute in f32.
class ExactQuantizedLinears {
 public:
  ExactQuantizedLinears();
  ~ExactQuantizedLinears();
  ExactQuantizedLinears(const ExactQuantizedLinears&) = delete;
  ExactQuantizedLinears& operator=(const ExactQuantizedLinears&) = delete;
};

// Runs a shell command, returning exit code and captured stdout+stderr.
struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
CommandResult run_command(const std::string& command);

// Regularized upper incomplete gamma Q(a, x), and the p-value of Pearson's chi-square statistic.
double upper_incomplete_gamma(double a, double x);
double chi_square_p_value(double statistic, int degrees_of_freedom);

// load_model on `path` (on `device`); a failure is a test failure naming the path and the error.
LoadedModel load_model_or_fail(const std::string& path, Device device = Device::cpu());

// Greedy continuation of `prompt` (ids) by one request through the Engine, EOS ignored.
// Small default engine options: a KV cache just large enough for the request, on the model's
// device, of `kv_dtype` (default: the engine's for that device).
std::vector<int32_t> greedy_ids(const LlamaModel& model, const std::vector<int32_t>& prompt, int max_tokens,
                                std::optional<DType> kv_dtype = std::nullopt);

}  // namespace tachyon::testing

#define TACHYON_SKIP_WITHOUT_SHARED(var)                                          \
  auto var##_opt = ::tachyon::testing::shared_dir();                             \
  if (!var##_opt) GTEST_SKIP() << "../shared is absent; skipping";               \
  const std::string var = *var##_opt
