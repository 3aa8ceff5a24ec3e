#include "test_util.h"

#include "ops/cpu/isa.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

namespace tachyon::testing {

namespace fs = std::filesystem;

std::string source_dir() {
  // Binaries built on one machine and run on another (scripts/gpu-check --prebuilt) are told
  // where the checkout is.
  if (const char* env = std::getenv("TACHYON_SOURCE_DIR")) return env;
  return TACHYON_SOURCE_DIR;
}

std::optional<std::string> shared_dir() {
  if (const char* env = std::getenv("TACHYON_SHARED_DIR")) {
    if (fs::is_directory(env)) return std::string(env);
    return std::nullopt;
  }
  const fs::path p = fs::path(TACHYON_SOURCE_DIR).parent_path() / "shared";
  if (fs::is_directory(p / "models")) return p.string();
  return std::nullopt;
}

namespace {
struct ScratchRegistry {
  std::vector<fs::path> dirs;
  ~ScratchRegistry() {
    std::error_code ec;
    for (auto& d : dirs) fs::remove_all(d, ec);
  }
};
ScratchRegistry& registry() {
  static ScratchRegistry r;
  return r;
}
}  // namespace

std::string scratch_dir(const std::string& tag) {
  static int counter = 0;
  const fs::path p = fs::temp_directory_path() /
                     ("tachyon-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  registry().dirs.push_back(p);
  return p.string();
}

std::string tachyon_binary() {
  // As for source_dir(): prebuilt binaries carried to another machine name where the CLI is.
  if (const char* env = std::getenv("TACHYON_BINARY_PATH")) return env;
  return TACHYON_BINARY;
}

uint32_t fresh_seed() {
  if (const char* env = std::getenv("TACHYON_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  return static_cast<uint32_t>(std::random_device{}() ^
                               static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
}

Tensor random_tensor(const std::vector<int64_t>& shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

CommandResult run_command(const std::string& command) {
  const std::string dir = scratch_dir("cmd");
  const std::string out_path = dir + "/out";
  const std::string err_path = dir + "/err";
  const std::string full = command + " >" + out_path + " 2>" + err_path + " </dev/null";
  CommandResult r;
  const int status = std::system(full.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

std::vector<int32_t> greedy_ids(const LlamaModel& model, const std::vector<int32_t>& prompt, int max_tokens,
                                std::optional<DType> kv_dtype) {
  EngineOptions eo;
  eo.kv.dtype = kv_dtype;
  eo.max_model_len = std::min<int>(model.config().max_position_embeddings,
                                   static_cast<int>(prompt.size()) + max_tokens + 1);
  eo.kv.num_blocks = (eo.max_model_len + eo.kv.block_size - 1) / eo.kv.block_size;
  eo.scheduler.max_seqs = 1;
  auto engine = Engine::create(model, nullptr, {}, eo);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status().to_string();
    return {};
  }
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  auto id = (*engine)->add_request(prompt, p);
  if (!id.ok()) {
    ADD_FAILURE() << id.status().to_string();
    return {};
  }
  std::vector<int32_t> out;
  while ((*engine)->has_unfinished()) {
    auto outputs = (*engine)->step();
    if (!outputs.ok()) {
      ADD_FAILURE() << outputs.status().to_string();
      return out;
    }
    for (const auto& o : *outputs) out.insert(out.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  const Status leaks = (*engine)->check_no_leaks();
  if (!leaks.ok()) ADD_FAILURE() << leaks.to_string();
  return out;
}

// Regularized upper incomplete gamma Q(a, x): a series for x < a + 1, else a continued fraction
// (modified Lentz). Accurate to ~1e-12 for the sizes used here.
double upper_incomplete_gamma(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (term < sum * 1e-16) break;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

double chi_square_p_value(double statistic, int degrees_of_freedom) {
  return upper_incomplete_gamma(0.5 * degrees_of_freedom, 0.5 * statistic);
}

ExactQuantizedLinears::ExactQuantizedLinears() { ops::cpu::set_int8_dot(false); }
ExactQuantizedLinears::~ExactQuantizedLinears() { ops::cpu::clear_int8_dot_override(); }

LoadedModel load_model_or_fail(const std::string& path, Device device) {
  LoadOptions o;
  o.path = path;
  o.device = device;
  auto m = load_model(o);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().to_string();
  return std::move(m).value();
}

}  // namespace tachyon::testing
