// Options and helpers shared by the subcommands: model loading with a clear error line,
// thread count, log level.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace tachyon::cli {

struct CommonOptions {
  std::string model;
  std::string device = "auto";  // auto (a GPU when there is one, else the CPU), cpu, cuda, cuda:N
  int threads = 0;  // 0 = all cores
  bool verbose = false;
  // Load-time weight quantization of the layers' linear weights: "" (as stored) or a format name
  // (quant/quantize.h parse_quant_spec; --quant-group inputs per scale for int4 and ternary), and
  // a per-module policy file (quant/quant_policy.h) that overrides it module by module.
  std::string quant;
  int quant_group = 128;
  std::string quant_policy;
  // The LM head's format ("" keeps it as stored; int8: per channel), apart from --quant.
  std::string quant_lm_head;
  // The weights exactly as stored: no directory quant_policy.txt (the reference of --kl).
  bool as_stored = false;
  // The guard of quantized loads (cli/quant_check.h): mean KL over the probe past which modules
  // return to 16 bits; 0 checks finiteness only.
  double quant_guard_kl = 0.5;  // cli/quant_check.h kDefaultGuardKl
};

void add_common_options(CLI::App& cmd, CommonOptions& options);

// A model directory holding this file (`tachyon quantize --budget` writes one) is loaded with it
// as its --quant-policy, unless --quant or --quant-policy is given.
inline constexpr const char* kDirectoryQuantPolicy = "quant_policy.txt";

// Checks for option values whose messages stay one short line (CLI11's NonNegativeNumber prints
// the largest double, 309 digits). Each refuses NaN and values its option cannot hold.
const CLI::Validator& non_negative_int();  // 0 .. 2^31 - 1
const CLI::Validator& positive_int();      // 1 .. 2^31 - 1
const CLI::Validator& non_negative_real();  // finite, >= 0
const CLI::Validator& fraction();          // (0, 1]
// A seed: a decimal integer 0 .. 2^64 - 1, refused (not saturated) beyond.
const CLI::Validator& seed_value();
// A --seed value that seed_value() accepted; empty: a fresh random seed.
uint64_t seed_or_random(const std::string& text);

// Run-time options of the serving engine (KV cache, batching), shared by generate/bench/serve.
struct EngineArgs {
  std::string kv_cache_mem;        // "2GiB", "512M", "1e9"; empty: a fraction of free memory
  double kv_cache_fraction = 0.0;  // 0: 0.25 of available host memory, 0.9 of a GPU's free memory
  std::string kv_dtype = "auto";
  int block_size = kDefaultBlockSize;
  int max_model_len = 0;
  int max_batched_tokens = 2048;
  int max_seqs = 256;
  bool no_chunked_prefill = false;
  bool no_prefix_caching = false;
  bool batch_invariant = false;
  bool enforce_eager = false;  // no CUDA graphs
  int kv_window = 0;           // --kv-window: positions kept as they are (0: all)
  std::string kv_history = "same";  // --kv-history: what becomes of older ones
  int sparse_budget = 0;       // --sparse-budget: block-sparse decode attention (0: dense)
};
void add_engine_options(CLI::App& cmd, EngineArgs& args);
// --kv-window and --kv-history, bound to `window` and `history`.
void add_kv_tier_options(CLI::App& cmd, int& window, std::string& history);
// --sparse-budget (EngineOptions::sparse_budget).
void add_sparse_option(CLI::App& cmd, int& budget);
Result<EngineOptions> engine_options(const EngineArgs& args);
// --kv-window / --kv-history values (shared by the engine commands and perplexity).
Result<KvTierOptions> parse_kv_tiers(int window, const std::string& history);
// A `--kv` value: a KV cache dtype (f32, f16, bf16, int8, fp8 and their aliases), else an error
// naming the choices.
Result<DType> parse_kv_dtype(const std::string& name);
// "2GiB", "512MiB", "1.5G", "100M", "4096" (bytes); K/M/G/T are powers of 1000 with "B" or
// alone, of 1024 with "iB".
Result<size_t> parse_bytes(const std::string& text);
// "cpu", "cuda" (device 0) or "cuda:N"; "auto": cuda:0 when this build has the CUDA backend and a
// device is visible, else the CPU.
Result<Device> parse_device(const std::string& text);
// Applies threads/verbosity, starts the device's backend, loads the model onto the device and
// quantizes its linear weights when --quant, --quant-policy or the directory's quant_policy.txt asks; weight_dtypes then names the format too. A
// quantized model whose logits on a short probe are not all finite is dropped, with a warning, for
// the weights as stored (cli/quant_check.h).
Result<LoadedModel> load(const CommonOptions& options, DType synthetic_dtype = DType::kBF16);
// Without --device (auto): says on stderr, once, where the model runs (`device`) and how to
// choose. Called when a command starts its work, after its checks (an error stays the only line).
void announce_device(const CommonOptions& options, Device device);
// Prints "tachyon: error: <status>" and returns 1.
int report(const Status& status);

}  // namespace tachyon::cli
