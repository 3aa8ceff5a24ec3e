// tachyon_bench: measures this machine's memory bandwidth and the CPU linear kernels against it.
//
//   tachyon_bench bandwidth [--size-mib 1024] [--repeats 5]
//   tachyon_bench gemv --rows R --cols C [--dtype bf16 | --quant FORMAT [--group G]] [--tokens 1] [--algo auto|gemv|gemm]
//                      [--repeats 7] [--hot] [--read-gbps X]
//   tachyon_bench suite            # bandwidth, then batch-1 bf16 GEMV on Qwen2.5-0.5B's shapes
//   tachyon_bench classify --profiles FILE [--tokens 512] [--repeats 20000]
//                                  # the prompt-kind choice of a draft, per prompt
//   common: [--threads N] [--isa scalar|avx2|avx512] [--json FILE]
//
// JSON goes to stdout (or --json FILE), a one-line summary per measurement to stderr.
// A GEMV is timed "cold" by default: it cycles through enough copies of the weight (>= 512 MiB)
// that every call streams its weight from DRAM, as a model's decode step does; --hot reuses one.
// GB/s of a GEMV counts weight bytes only; its fraction is of the read bandwidth measured in the
// same process (or --read-gbps): the better of a one-stream and a four-stream read per thread.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant_linear.h"
#include "quant/quantize.h"
#include "speculative/domain_classifier.h"

namespace tachyon::bench {
namespace {

using nlohmann::json;

struct Options {
  std::string command;
  std::map<std::string, std::string> values;
  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string get(const std::string& k, const std::string& fallback) const {
    auto it = values.find(k);
    return it == values.end() ? fallback : it->second;
  }
  int64_t get_int(const std::string& k, int64_t fallback) const {
    return has(k) ? std::strtoll(values.at(k).c_str(), nullptr, 10) : fallback;
  }
  double get_double(const std::string& k, double fallback) const {
    return has(k) ? std::strtod(values.at(k).c_str(), nullptr) : fallback;
  }
};

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "tachyon_bench: %s\n"
               "usage: tachyon_bench bandwidth [--size-mib 1024] [--repeats 5]\n"
               "       tachyon_bench gemv --rows R --cols C [--dtype bf16 | --quant FORMAT [--group 128]]\n"
               "                          (FORMAT: int8, int4, w8a8, fp8, ternary, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl,\n"
               "                          q4_k, q5_k or q6_k)\n"
               "                          [--tokens 1] [--algo auto|gemv|gemm]\n"
               "                          [--repeats 7] [--hot] [--read-gbps X]\n"
               "       tachyon_bench suite\n"
               "       tachyon_bench classify --profiles FILE [--tokens 512] [--repeats 20000]\n"
               "       common: [--threads N] [--isa scalar|avx2|avx512] [--json FILE]\n",
               error.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  if (argc < 2) usage("missing command");
  Options o;
  o.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) usage("unexpected argument '" + a + "'");
    a = a.substr(2);
    if (a == "hot") {
      o.values[a] = "1";
    } else {
      if (i + 1 >= argc) usage("--" + a + " needs a value");
      o.values[a] = argv[++i];
    }
  }
  return o;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<char, FreeDeleter>;

// Page-aligned memory, first touched by the worker threads (so pages land where they read).
Bytes alloc_touched(size_t bytes, uint8_t pattern_seed) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  char* p = static_cast<char*>(std::aligned_alloc(4096, rounded));
  if (p == nullptr) {
    std::fprintf(stderr, "tachyon_bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  parallel_for(static_cast<int64_t>(rounded / 4096), 64, [&](int64_t b, int64_t e) {
    for (int64_t page = b; page < e; ++page) {
      // A cheap non-constant pattern whose 16-bit halves are ordinary floats (no NaN/Inf).
      uint32_t* w = reinterpret_cast<uint32_t*>(p + page * 4096);
      uint32_t s = static_cast<uint32_t>(page) * 2654435761u + pattern_seed;
      for (int i = 0; i < 1024; ++i) {
        s = s * 1664525u + 1013904223u;
        w[i] = (s & 0x03ff03ffu) | 0x3c003c00u;  // f16/bf16 values in [1, 2)-ish
      }
    }
  });
  return Bytes(p);
}

// Sum of every float in [p, p + bytes): eight independent accumulators, 256 bytes per iteration.
float read_sum(const char* p, size_t bytes) {
  const float* f = reinterpret_cast<const float*>(p);
  const size_t n = bytes / sizeof(float);
  size_t i = 0;
  float total = 0.0f;
#if defined(__x86_64__)
  __m256 a[8];
  for (auto& v : a) v = _mm256_setzero_ps();
  for (; i + 64 <= n; i += 64) {
    for (int k = 0; k < 8; ++k) a[k] = _mm256_add_ps(a[k], _mm256_load_ps(f + i + 8 * k));
  }
  __m256 s = a[0];
  for (int k = 1; k < 8; ++k) s = _mm256_add_ps(s, a[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  for (float v : lanes) total += v;
#endif
  for (; i < n; ++i) total += f[i];
  return total;
}

// The same over `streams` equal parts of [p, p + bytes) read in lockstep, 256 bytes of each in
// turn: several concurrent streams per core (as a GEMV over a few rows has) keep more cache-line
// fills in flight than one.
float read_sum_streams(const char* p, size_t bytes, int streams) {
  const size_t part = bytes / static_cast<size_t>(streams) / 256 * 256;
  float total = 0.0f;
#if defined(__x86_64__)
  __m256 a[8];
  for (auto& v : a) v = _mm256_setzero_ps();
  for (size_t off = 0; off < part; off += 256) {
    for (int s = 0; s < streams; ++s) {
      const float* f = reinterpret_cast<const float*>(p + static_cast<size_t>(s) * part + off);
      for (int k = 0; k < 8; ++k) a[k] = _mm256_add_ps(a[k], _mm256_load_ps(f + 8 * k));
    }
  }
  __m256 sum = a[0];
  for (int k = 1; k < 8; ++k) sum = _mm256_add_ps(sum, a[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  for (float v : lanes) total += v;
#else
  for (int s = 0; s < streams; ++s) total += read_sum(p + static_cast<size_t>(s) * part, part);
#endif
  return total;
}

struct Bandwidth {
  double read_gbps = 0.0;  // best of repeats, the better of one and four streams per thread
  double read_gbps_median = 0.0;
  double read_1stream_gbps = 0.0;  // best of repeats
  double read_4stream_gbps = 0.0;
  double copy_gbps = 0.0;  // (bytes read + bytes written) / time, best of repeats
  double copy_gbps_median = 0.0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Bandwidth measure_bandwidth(size_t bytes, int repeats) {
  Bandwidth bw;
  const Bytes src = alloc_touched(bytes, 1);
  const int threads = num_threads();
  // Each thread reads (or copies) a contiguous 1/threads of the buffer.
  const int64_t chunk = static_cast<int64_t>(bytes / static_cast<size_t>(threads)) / 4096 * 4096;
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<double> reads[2], copies;
  for (int streams_index = 0; streams_index < 2; ++streams_index) {
    const int streams = streams_index == 0 ? 1 : 4;
    for (int r = 0; r < repeats + 1; ++r) {
      Timer timer;
      parallel_for(threads, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const char* p = src.get() + t * chunk;
          sink[static_cast<size_t>(t)] += streams == 1 ? read_sum(p, static_cast<size_t>(chunk))
                                                       : read_sum_streams(p, static_cast<size_t>(chunk), streams);
        }
      });
      const double s = timer.seconds();
      if (r > 0) reads[streams_index].push_back(static_cast<double>(chunk) * threads / s / 1e9);  // r = 0 warms up
    }
  }
  {
    const size_t half = bytes / 2;  // copy the first half over the second (both touched)
    const int64_t cchunk = static_cast<int64_t>(half / static_cast<size_t>(threads)) / 4096 * 4096;
    for (int r = 0; r < repeats + 1; ++r) {
      Timer timer;
      parallel_for(threads, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          std::memcpy(src.get() + half + t * cchunk, src.get() + t * cchunk, static_cast<size_t>(cchunk));
        }
      });
      const double s = timer.seconds();
      if (r > 0) copies.push_back(2.0 * static_cast<double>(cchunk) * threads / s / 1e9);
    }
  }
  float total = 0.0f;
  for (float v : sink) total += v;
  if (total == 12345.678f) std::fprintf(stderr, " ");  // keep the sums alive
  bw.read_1stream_gbps = *std::max_element(reads[0].begin(), reads[0].end());
  bw.read_4stream_gbps = *std::max_element(reads[1].begin(), reads[1].end());
  const int better = bw.read_4stream_gbps > bw.read_1stream_gbps ? 1 : 0;
  bw.read_gbps = std::max(bw.read_1stream_gbps, bw.read_4stream_gbps);
  bw.read_gbps_median = median(reads[better]);
  bw.copy_gbps = *std::max_element(copies.begin(), copies.end());
  bw.copy_gbps_median = median(copies);
  return bw;
}

json bandwidth_json(const Bandwidth& bw, size_t bytes, int repeats) {
  return json{{"bench", "bandwidth"},
              {"threads", num_threads()},
              {"buffer_bytes", bytes},
              {"repeats", repeats},
              {"read_gbps_best", bw.read_gbps},
              {"read_gbps_median", bw.read_gbps_median},
              {"read_1stream_gbps_best", bw.read_1stream_gbps},
              {"read_4stream_gbps_best", bw.read_4stream_gbps},
              {"copy_gbps_best", bw.copy_gbps},
              {"copy_gbps_median", bw.copy_gbps_median},
              {"copy_counts", "bytes read + bytes written"}};
}

struct GemvSpec {
  int64_t rows = 0, cols = 0, tokens = 1;
  DType dtype = DType::kBF16;
  std::string quant;  // a --quant format (quant/quantize.h parse_quant_spec); empty: dense `dtype`
  int group = 128;
  ops::cpu::LinearAlgo algo = ops::cpu::LinearAlgo::kAuto;
  int repeats = 7;
  bool hot = false;
};

// Copies of one random weight quantized to `spec.quant`, enough of them to pass the last-level
// cache (cold) or one (hot); bytes per call counts everything a call reads of the weight.
struct QuantCopies {
  std::vector<QuantWeight> weights;
  size_t bytes = 0;
};

QuantCopies quantized_copies(const GemvSpec& spec) {
  auto qspec = parse_quant_spec(spec.quant, spec.group);
  if (!qspec.ok()) usage(qspec.status().message());
  Weight dense;
  dense.dense = Tensor::empty({spec.rows, spec.cols}, DType::kF32);
  float* w = dense.dense.data<float>();
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < spec.rows * spec.cols; ++i) {  // uniform in [-0.05, 0.05)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    w[i] = (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
  }
  auto q = quantize_weight(dense, *qspec);
  if (!q.ok()) usage(q.status().message());
  QuantCopies c;
  for (const Tensor* t : {&q->quant->packed, &q->quant->scales, &q->quant->zeros}) c.bytes += t->defined() ? t->nbytes() : 0;
  const size_t cold_target = size_t{1024} << 20;
  const int copies = spec.hot ? 1 : static_cast<int>(std::max<size_t>(1, (cold_target + c.bytes - 1) / c.bytes));
  for (int i = 0; i < copies; ++i) {
    QuantWeight copy = *q->quant;
    for (Tensor* t : {&copy.packed, &copy.scales, &copy.zeros}) {  // a buffer of its own
      if (!t->defined()) continue;
      Tensor fresh = Tensor::empty(t->shape(), t->dtype());
      std::memcpy(fresh.raw_data(), t->contiguous().raw_data(), t->nbytes());
      *t = fresh;
    }
    c.weights.push_back(std::move(copy));
  }
  return c;
}

json run_gemv(const GemvSpec& spec, double read_gbps) {
  QuantCopies quant;
  if (!spec.quant.empty()) quant = quantized_copies(spec);
  const size_t weight_bytes =
      spec.quant.empty() ? static_cast<size_t>(spec.rows * spec.cols) * dtype_size(spec.dtype) : quant.bytes;
  const size_t cold_target = size_t{512} << 20;
  const int copies = !spec.quant.empty() ? static_cast<int>(quant.weights.size())
                     : spec.hot ? 1
                                : static_cast<int>(std::max<size_t>(1, (cold_target + weight_bytes - 1) / weight_bytes));
  std::vector<Bytes> weights;
  if (spec.quant.empty()) {
    for (int c = 0; c < copies; ++c) weights.push_back(alloc_touched(weight_bytes, static_cast<uint8_t>(c)));
  }
  const Bytes x_bytes = alloc_touched(static_cast<size_t>(spec.tokens * spec.cols) * 4, 7);
  // x as small floats: reinterpret the pattern's bits is fine for timing, but keep it finite.
  float* x = reinterpret_cast<float*>(x_bytes.get());
  for (int64_t i = 0; i < spec.tokens * spec.cols; ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  std::vector<float> y(static_cast<size_t>(spec.tokens * spec.rows));

  ops::cpu::LinearArgs a;
  a.x = x;
  a.x_stride = spec.cols;
  a.w_dtype = spec.dtype;
  a.w_stride = spec.cols;
  a.y = y.data();
  a.y_stride = spec.rows;
  a.n = spec.tokens;
  a.in = spec.cols;
  a.out = spec.rows;

  // One pass = one call on each copy; a repeat is enough passes for >= 0.2 s.
  ops::cpu::QuantLinearArgs qa;
  qa.x = x;
  qa.x_stride = spec.cols;
  qa.y = y.data();
  qa.y_stride = spec.rows;
  qa.n = spec.tokens;
  auto pass = [&]() {
    for (int c = 0; c < copies; ++c) {
      if (spec.quant.empty()) {
        a.w = weights[static_cast<size_t>(c)].get();
        ops::cpu::linear(a, spec.algo);
      } else {
        qa.w = &quant.weights[static_cast<size_t>(c)];
        ops::cpu::quant_linear(qa);
      }
    }
  };
  pass();  // warm-up (also faults in nothing new: memory is touched)
  Timer probe;
  pass();
  const double pass_s = std::max(probe.seconds(), 1e-9);
  const int passes = static_cast<int>(std::max(1.0, 0.2 / pass_s));
  std::vector<double> per_call;
  for (int r = 0; r < spec.repeats; ++r) {
    Timer timer;
    for (int p = 0; p < passes; ++p) pass();
    per_call.push_back(timer.seconds() / (static_cast<double>(passes) * copies));
  }
  const double best = *std::min_element(per_call.begin(), per_call.end());
  const double med = median(per_call);
  const double gbps_best = static_cast<double>(weight_bytes) / best / 1e9;
  const double gbps_median = static_cast<double>(weight_bytes) / med / 1e9;
  const double flops = 2.0 * static_cast<double>(spec.rows * spec.cols * spec.tokens);
  json j{{"bench", "gemv"},
         {"rows", spec.rows},
         {"cols", spec.cols},
         {"tokens", spec.tokens},
         {"dtype", spec.quant.empty() ? std::string(dtype_name(spec.dtype))
                                       : spec.quant + (spec.quant == "int4" ? fmt::format("-g{}", spec.group) : "")},
         {"algo", spec.algo == ops::cpu::LinearAlgo::kGemm   ? "gemm"
                  : spec.algo == ops::cpu::LinearAlgo::kGemv ? "gemv"
                                                             : "auto"},
         {"isa", ops::cpu::isa_name(ops::cpu::active_isa())},
         {"threads", num_threads()},
         {"weight_bytes", weight_bytes},
         {"cold", !spec.hot},
         {"weight_copies", copies},
         {"repeats", spec.repeats},
         {"time_us_best", best * 1e6},
         {"time_us_median", med * 1e6},
         {"weight_gbps_best", gbps_best},
         {"weight_gbps_median", gbps_median},
         {"gflops_best", flops / best / 1e9}};
  if (read_gbps > 0) {
    j["read_gbps_reference"] = read_gbps;
    j["fraction_of_read_bw_best"] = gbps_best / read_gbps;
    j["fraction_of_read_bw_median"] = gbps_median / read_gbps;
  }
  return j;
}

void summarize_gemv(const json& j) {
  std::fprintf(stderr, "gemv %lldx%lld %s n=%lld %s %s: %.1f us best (%.1f median), %.2f GB/s",
               j["rows"].get<long long>(), j["cols"].get<long long>(), j["dtype"].get<std::string>().c_str(),
               j["tokens"].get<long long>(), j["isa"].get<std::string>().c_str(),
               j["cold"].get<bool>() ? "cold" : "hot", j["time_us_best"].get<double>(),
               j["time_us_median"].get<double>(), j["weight_gbps_best"].get<double>());
  if (j.contains("fraction_of_read_bw_best")) {
    std::fprintf(stderr, " = %.0f%% of read bandwidth", 100.0 * j["fraction_of_read_bw_best"].get<double>());
  }
  if (j["tokens"].get<long long>() > 1) std::fprintf(stderr, ", %.1f GFLOP/s", j["gflops_best"].get<double>());
  std::fprintf(stderr, "\n");
}

void summarize_bandwidth(const Bandwidth& bw) {
  std::fprintf(
      stderr,
      "bandwidth (%d threads): read %.2f GB/s best (%.2f median; 1 stream/thread %.2f, 4 streams/thread %.2f), "
      "copy %.2f GB/s best (%.2f median)\n",
      num_threads(), bw.read_gbps, bw.read_gbps_median, bw.read_1stream_gbps, bw.read_4stream_gbps, bw.copy_gbps,
      bw.copy_gbps_median);
}

GemvSpec gemv_spec(const Options& o) {
  GemvSpec s;
  s.rows = o.get_int("rows", 0);
  s.cols = o.get_int("cols", 0);
  if (s.rows <= 0 || s.cols <= 0) usage("gemv needs --rows and --cols > 0");
  s.tokens = o.get_int("tokens", 1);
  if (s.tokens <= 0) usage("--tokens must be > 0");
  const auto dtype = parse_dtype(o.get("dtype", "bf16"));
  if (!dtype || (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16)) {
    usage("--dtype must be f32, f16 or bf16");
  }
  s.dtype = *dtype;
  s.quant = o.get("quant", "");
  s.group = static_cast<int>(o.get_int("group", 128));
  const std::string algo = o.get("algo", "auto");
  if (algo == "gemv") {
    s.algo = ops::cpu::LinearAlgo::kGemv;
  } else if (algo == "gemm") {
    s.algo = ops::cpu::LinearAlgo::kGemm;
  } else if (algo != "auto") {
    usage("--algo must be auto, gemv or gemm");
  }
  s.repeats = static_cast<int>(std::max<int64_t>(1, o.get_int("repeats", 7)));
  s.hot = o.has("hot");
  return s;
}

int run(const Options& o) {
  if (o.has("threads")) set_num_threads(static_cast<int>(o.get_int("threads", 1)));
  if (o.has("isa")) {
    const auto isa = ops::cpu::parse_isa(o.get("isa", ""));
    if (!isa || !ops::cpu::isa_supported(*isa)) usage("--isa " + o.get("isa", "") + " is unknown or unsupported here");
    ops::cpu::set_isa(*isa);
  }
  json out;
  if (o.command == "classify") {
    // DomainClassifier::classify on a prompt of --tokens random ids (the classifier reads at most
    // its last kMaxTokens), once per request in the engine.
    const auto c = DomainClassifier::load(o.get("profiles", ""), 1 << 24);
    if (!c.ok()) usage(c.status().to_string());
    const int64_t n = std::max<int64_t>(1, o.get_int("tokens", 512));
    const int repeats = static_cast<int>(std::max<int64_t>(1, o.get_int("repeats", 20000)));
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    uint32_t s = 12345;
    for (int32_t& t : tokens) t = static_cast<int32_t>((s = s * 1664525u + 1013904223u) >> 8) % c->vocab_size();
    int sink = c->classify(tokens);
    Timer timer;
    for (int r = 0; r < repeats; ++r) sink += c->classify(tokens);
    const double us = timer.seconds() / repeats * 1e6;
    out = {{"bench", "classify"}, {"profiles", o.get("profiles", "")}, {"kinds", c->kinds()},
           {"prompt_tokens", n}, {"tokens_read", std::min<int64_t>(n, DomainClassifier::kMaxTokens)},
           {"repeats", repeats}, {"us_per_prompt", us}, {"sink", sink}};
    std::fprintf(stderr, "classify: %lld-token prompt, %zu kinds: %.2f us per prompt\n", static_cast<long long>(n),
                 c->kinds().size(), us);
  } else if (ops::cpu::active_isa() == ops::cpu::Isa::kScalar) {
    usage("the scalar ISA has no kernels to time here");
  } else if (o.command == "bandwidth") {
    const size_t bytes = static_cast<size_t>(o.get_int("size-mib", 1024)) << 20;
    const int repeats = static_cast<int>(std::max<int64_t>(1, o.get_int("repeats", 5)));
    const Bandwidth bw = measure_bandwidth(bytes, repeats);
    out = bandwidth_json(bw, bytes, repeats);
    summarize_bandwidth(bw);
  } else if (o.command == "gemv") {
    const GemvSpec spec = gemv_spec(o);
    double read_gbps = o.get_double("read-gbps", 0.0);
    if (read_gbps <= 0) read_gbps = measure_bandwidth(size_t{512} << 20, 3).read_gbps;
    out = run_gemv(spec, read_gbps);
    summarize_gemv(out);
  } else if (o.command == "suite") {
    const size_t bytes = size_t{1024} << 20;
    const Bandwidth bw = measure_bandwidth(bytes, 5);
    summarize_bandwidth(bw);
    out["bandwidth"] = bandwidth_json(bw, bytes, 5);
    out["gemv"] = json::array();
    // Qwen2.5-0.5B: q/o (896x896), gate/up (4864x896), down (896x4864), lm_head (151936x896).
    for (auto [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{896, 896}, {4864, 896}, {896, 4864}, {151936, 896}}) {
      GemvSpec spec;
      spec.rows = rows;
      spec.cols = cols;
      spec.repeats = static_cast<int>(std::max<int64_t>(1, o.get_int("repeats", 7)));
      const json j = run_gemv(spec, bw.read_gbps);
      summarize_gemv(j);
      out["gemv"].push_back(j);
    }
  } else {
    usage("unknown command '" + o.command + "'");
  }
  const std::string text = out.dump(2);
  if (o.has("json")) {
    std::ofstream f(o.get("json", ""));
    f << text << "\n";
    if (!f) {
      std::fprintf(stderr, "tachyon_bench: cannot write %s\n", o.get("json", "").c_str());
      return 1;
    }
  } else {
    std::cout << text << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace tachyon::bench

int main(int argc, char** argv) { return tachyon::bench::run(tachyon::bench::parse(argc, argv)); }
