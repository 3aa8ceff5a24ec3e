// Helpers for the io tests: byte files, a minimal safetensors writer, a llama2.c checkpoint
// writer with position-coded values, and a mutation fuzzer that checks every outcome is either
// a clean Status or tensors that lie inside the mapped file.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/weight_source.h"
#include "test_util.h"

namespace tachyon::io_test {

// Removes the old file first: truncating a file in place makes some filesystems flush it to
// disk on close, which turns a fuzz loop of thousands of rewrites into minutes.
inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  return {s.begin(), s.end()};
}

template <typename T>
void put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
void poke(std::vector<uint8_t>* bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), bytes->size());
  std::memcpy(bytes->data() + at, &v, sizeof(T));
}

// ---- safetensors ----

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Tensors laid out back to back in the given order. `header_padding` spaces are appended to
// the JSON (the format allows trailing whitespace); pass a value that makes 8 + length
// non-aligned to exercise the copy path.
inline std::vector<uint8_t> build_safetensors(const std::vector<StTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata = {},
                                              size_t header_padding = 0) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump() + std::string(header_padding, ' ');
  std::vector<uint8_t> out;
  put<uint64_t>(&out, text.size());
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

// Bytes of `n` f32 values start, start+1, ...
inline std::vector<uint8_t> f32_bytes(int64_t n, float start = 0.0f) {
  std::vector<uint8_t> out;
  for (int64_t k = 0; k < n; ++k) put(&out, start + static_cast<float>(k));
  return out;
}

// ---- llama2.c ----

struct Llama2cSpec {
  int dim = 16, hidden_dim = 24, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 10, seq_len = 6;
  bool shared_classifier = true;
  int version = 0;  // 0 legacy, 1 "ak42" v1
};

// Array ids: the value of element k of array `id` is id * 100000 + k (exact in f32 for the
// small specs used here), so a reader's offsets can be checked element by element.
enum Llama2cArray { kEmbed = 1, kAttNorm, kWq, kWk, kWv, kWo, kFfnNorm, kW1, kW2, kW3, kNorm, kRope, kWcls };

inline float llama2c_value(int array, int64_t k) { return static_cast<float>(array * 100000 + k); }

inline std::vector<uint8_t> build_llama2c(const Llama2cSpec& s) {
  const int64_t head = s.dim / s.n_heads, kv = s.n_kv_heads * head, L = s.n_layers;
  const std::map<int, int64_t> counts = {
      {kEmbed, int64_t{s.vocab_size} * s.dim}, {kAttNorm, L * s.dim}, {kWq, L * s.dim * s.dim},
      {kWk, L * kv * s.dim}, {kWv, L * kv * s.dim}, {kWo, L * s.dim * s.dim}, {kFfnNorm, L * s.dim},
      {kW1, L * s.hidden_dim * s.dim}, {kW2, L * s.dim * s.hidden_dim}, {kW3, L * s.hidden_dim * s.dim},
      {kNorm, s.dim}, {kRope, 2 * (int64_t{s.seq_len} * head / 2)}, {kWcls, int64_t{s.vocab_size} * s.dim}};
  std::vector<uint8_t> out;
  std::vector<int> order;
  if (s.version == 0) {
    for (int32_t v : {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads,
                      s.shared_classifier ? s.vocab_size : -s.vocab_size, s.seq_len}) {
      put(&out, v);
    }
    order = {kEmbed, kAttNorm, kWq, kWk, kWv, kWo, kFfnNorm, kW1, kW2, kW3, kNorm, kRope};
  } else {
    put<uint32_t>(&out, 0x616b3432);
    put<int32_t>(&out, s.version);
    for (int32_t v : {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size, s.seq_len}) put(&out, v);
    put<uint8_t>(&out, s.shared_classifier ? 1 : 0);
    out.resize(256, 0);
    order = {kAttNorm, kFfnNorm, kNorm, kEmbed, kWq, kWk, kWv, kWo, kW1, kW2, kW3};
  }
  if (!s.shared_classifier) order.push_back(kWcls);
  for (int a : order) {
    for (int64_t k = 0; k < counts.at(a); ++k) put(&out, llama2c_value(a, k));
  }
  return out;
}

// ---- checks ----

// Every tensor of `source` is either refused with a Status or lies inside `file` (views) and
// is fully readable. Returns the number of tensors read.
inline int touch_all_tensors(const WeightSource& source, const MappedFile* file) {
  int read = 0;
  for (const auto& name : source.tensor_names()) {
    auto t = source.tensor(name);
    if (!t.ok()) continue;
    ++read;
    const auto* p = static_cast<const uint8_t*>(t->raw_data());
    if (file != nullptr && p >= file->data() && p < file->data() + file->size()) {
      EXPECT_LE(p + t->nbytes(), file->data() + file->size()) << name;
    }
    volatile uint8_t sink = 0;
    for (size_t k = 0; k < t->nbytes(); k += 61) sink = sink ^ p[k];
    if (t->nbytes() > 0) sink = sink ^ p[t->nbytes() - 1];
    (void)sink;
  }
  return read;
}

// Expects a non-Ok status whose message names `path` and contains every one of `needles`.
inline void expect_error(const Status& status, ErrorCode code, const std::string& path,
                         const std::vector<std::string>& needles = {}) {
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_NE(status.message().find(path), std::string::npos) << "message does not name " << path << ": "
                                                            << status.message();
  for (const auto& n : needles) {
    EXPECT_NE(status.message().find(n), std::string::npos) << "message lacks '" << n << "': " << status.message();
  }
}

// Applies `count` random mutations to `base` (byte flips, interesting u32/u64 values written
// over random positions, truncations, random garbage runs), writes each to `path` and calls
// `check(status_or_ok)`; `open` must return a Status and never crash.
inline void fuzz_file(const std::vector<uint8_t>& base, const std::string& path, uint32_t seed, int count,
                      const std::function<Status(const std::string&)>& open) {
  std::mt19937 rng(seed);
  static const uint64_t kInteresting[] = {0,          1,          2,          3,          4,          7,
                                          8,          31,         32,         255,        256,        0x7f,
                                          0x80,       0xff,       0xffff,     0x7fffffff, 0x80000000, 0xffffffff,
                                          1ull << 32, 1ull << 40, 1ull << 62, 1ull << 63, ~0ull,      ~0ull - 7};
  int errors = 0;
  for (int iteration = 0; iteration < count; ++iteration) {
    std::vector<uint8_t> bytes = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      // Bias half of the edits into the first 512 bytes, where the headers live.
      const size_t span = (rng() % 2 == 0) ? std::min<size_t>(bytes.size(), 512) : bytes.size();
      const size_t at = rng() % span;
      switch (rng() % 6) {
        case 0: bytes[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: bytes[at] = static_cast<uint8_t>(rng()); break;
        case 2: {
          const uint64_t v = kInteresting[rng() % std::size(kInteresting)];
          const size_t width = (rng() % 2) ? 8 : 4;
          for (size_t b = 0; b < width && at + b < bytes.size(); ++b) bytes[at + b] = static_cast<uint8_t>(v >> (8 * b));
          break;
        }
        case 3: bytes.resize(at); break;
        case 4: {
          const size_t n = 1 + rng() % 16;
          for (size_t b = 0; b < n && at + b < bytes.size(); ++b) bytes[at + b] = static_cast<uint8_t>(rng());
          break;
        }
        case 5: {  // printable garbage: hits JSON headers harder than random bytes do
          static const char kChars[] = "{}[]\":,0123456789-eE.abcfnrtu\\ ";
          bytes[at] = static_cast<uint8_t>(kChars[rng() % (sizeof(kChars) - 1)]);
          break;
        }
      }
    }
    write_file(path, bytes);
    const Status s = open(path);
    if (!s.ok()) {
      ++errors;
      EXPECT_NE(s.code(), ErrorCode::kInternal) << s.to_string();
      EXPECT_FALSE(s.message().empty());
    }
  }
  // Most mutations of a small file must be detected; a fuzzer that never fails anything is
  // mutating nothing.
  EXPECT_GT(errors, count / 10) << "seed " << seed;
}

}  // namespace tachyon::io_test
