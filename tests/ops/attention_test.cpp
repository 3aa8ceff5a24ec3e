// store_kv and paged_attention. Chain of oracles: fast paged attention (shuffled block tables,
// several sequences, mixed prefill chunks and decode rows) == reference paged attention (naive
// gather) == textbook attention over each sequence's contiguous K/V. Cache slots a query must not
// read (unused blocks, positions before a sliding window) hold NaN (a quantized cache: NaN
// scales), so reading them shows up. Quantized caches (i8, f8e4m3) run the same chain over the
// values they hold (code * scale), and their error against a bf16 cache is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/device_memory.h"
#include "ops/cpu/reference.h"
#include "ops/kv_history_util.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;
using testing::all_close;

constexpr double kTol = 1e-5;

struct SeqSpec {
  int context_len;
  int q_len;
};

struct Scenario {
  int num_heads = 4, num_kv_heads = 2, head_dim = 64, block_size = 16;
  int sliding_window = 0;
  DType cache_dtype = DType::kF32;
  int history_bits = 0;  // 8 / 4: about half the blocks moved into history pools
  std::vector<SeqSpec> seqs;

  std::string describe() const {
    std::string s = fmt::format("heads={} kv_heads={} head_dim={} block={} window={} cache={} history={} seqs=",
                                num_heads, num_kv_heads, head_dim, block_size, sliding_window,
                                dtype_name(cache_dtype), history_bits);
    for (const auto& q : seqs) s += fmt::format("({} ctx, {} q)", q.context_len, q.q_len);
    return s;
  }
};

// A cache layer [num_blocks, block_size, num_kv_heads, head_dim] of `dtype` holding NaN
// everywhere (a quantized one: zero codes, NaN scales).
KvLayer nan_cache(const std::vector<int64_t>& shape, DType dtype) {
  KvLayer c;
  if (!ops::is_quantized_kv_dtype(dtype)) {
    c.k = testing::nan_tensor(shape, dtype);
    c.v = testing::nan_tensor(shape, dtype);
    return c;
  }
  c.k = Tensor::zeros(shape, dtype);
  c.v = Tensor::zeros(shape, dtype);
  c.k_scales = testing::nan_tensor({shape[0], shape[1], shape[2], 1});
  c.v_scales = testing::nan_tensor({shape[0], shape[1], shape[2], 1});
  return c;
}

// What a pool holds at `slots` as f32: [slots, num_kv_heads, head_dim] (code * scale when quantized).
Tensor read_back(const Tensor& pool, const Tensor& scales, const std::vector<int32_t>& slots) {
  const int64_t heads = pool.size(2), head_dim = pool.size(3);
  const Tensor values = pool.reshape({pool.size(0) * pool.size(1), heads, head_dim}).to_f32();
  Tensor out = Tensor::empty({static_cast<int64_t>(slots.size()), heads, head_dim}, DType::kF32);
  for (size_t j = 0; j < slots.size(); ++j) {
    for (int64_t h = 0; h < heads; ++h) {
      const float scale = scales.defined() ? scales.data<float>()[slots[j] * heads + h] : 1.0f;
      for (int64_t i = 0; i < head_dim; ++i) {
        out.data<float>()[(static_cast<int64_t>(j) * heads + h) * head_dim + i] =
            values.data<float>()[(slots[j] * heads + h) * head_dim + i] * scale;
      }
    }
  }
  return out;
}

struct Batch {
  Tensor q;       // [n, num_heads, head_dim] f32
  KvLayer cache;  // [num_blocks, block_size, num_kv_heads, head_dim] (+ scales)
  AttentionMetadata meta;
  AttentionParams params;
  std::vector<Tensor> k_seq, v_seq;  // per sequence [context_len, num_kv_heads, head_dim] f32, as cached
};

// Contiguous random K/V per sequence, scattered into a shared pool of shuffled blocks.
Batch build(const Scenario& sc, std::mt19937& rng) {
  Batch b;
  const int num_seqs = static_cast<int>(sc.seqs.size());
  std::vector<int> blocks_needed;
  int total_blocks = 0, max_blocks = 0, n = 0;
  for (const auto& s : sc.seqs) {
    const int blocks = (s.context_len + sc.block_size - 1) / sc.block_size;
    blocks_needed.push_back(blocks);
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks);
    n += s.q_len;
  }
  const int pool = total_blocks + 3;  // a few blocks nobody owns (NaN)
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  const std::vector<int64_t> cache_shape = {pool, sc.block_size, sc.num_kv_heads, sc.head_dim};
  b.cache = nan_cache(cache_shape, sc.cache_dtype);
  b.meta.num_seqs = num_seqs;
  b.meta.block_size = sc.block_size;
  b.meta.query_start = Tensor::empty({num_seqs + 1}, DType::kI32);
  b.meta.context_lens = Tensor::empty({num_seqs}, DType::kI32);
  b.meta.block_tables = Tensor::empty({num_seqs, max_blocks + 2}, DType::kI32);
  b.meta.slot_mapping = Tensor::empty({n}, DType::kI32);
  std::fill_n(b.meta.block_tables.data<int32_t>(), b.meta.block_tables.numel(), -1);
  b.params.scale = 1.0f / std::sqrt(static_cast<float>(sc.head_dim));
  b.params.sliding_window = sc.sliding_window;
  b.q = testing::random_tensor({n, sc.num_heads, sc.head_dim}, rng);

  int next_block = 0, row = 0;
  b.meta.query_start.data<int32_t>()[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = sc.seqs[static_cast<size_t>(s)];
    int32_t* table = b.meta.block_tables.data<int32_t>() + s * (max_blocks + 2);
    for (int i = 0; i < blocks_needed[static_cast<size_t>(s)]; ++i) table[i] = ids[static_cast<size_t>(next_block++)];
    b.meta.context_lens.data<int32_t>()[s] = spec.context_len;
    b.meta.query_start.data<int32_t>()[s + 1] = row + spec.q_len;

    std::vector<int32_t> slots(static_cast<size_t>(spec.context_len));
    for (int j = 0; j < spec.context_len; ++j) {
      slots[static_cast<size_t>(j)] = table[j / sc.block_size] * sc.block_size + j % sc.block_size;
    }
    // K/V as the cache holds them (rounded to its dtype, or quantized), read back from it.
    const Tensor k_in = testing::random_tensor({spec.context_len, sc.num_kv_heads, sc.head_dim}, rng);
    const Tensor v_in = testing::random_tensor({spec.context_len, sc.num_kv_heads, sc.head_dim}, rng);
    ops::reference::store_kv(k_in, v_in, testing::i32_tensor(slots), b.cache);
    const Tensor k = read_back(b.cache.k, b.cache.k_scales, slots);
    const Tensor v = read_back(b.cache.v, b.cache.v_scales, slots);
    for (int j = spec.context_len - spec.q_len; j < spec.context_len; ++j) {
      b.meta.slot_mapping.data<int32_t>()[row + j - (spec.context_len - spec.q_len)] = slots[static_cast<size_t>(j)];
    }
    b.k_seq.push_back(k);
    b.v_seq.push_back(v);

    if (sc.sliding_window > 0) {
      // Keys before the first query's window are never read: poison them, and drop whole
      // blocks from the table as a block manager that frees them would.
      const int first_key = std::max(0, spec.context_len - spec.q_len - sc.sliding_window + 1);
      Tensor nan_row = testing::nan_tensor({1, sc.num_kv_heads, sc.head_dim});
      for (int j = 0; j < first_key; ++j) {
        ops::reference::store_kv(nan_row, nan_row, testing::i32_tensor({slots[static_cast<size_t>(j)]}), b.cache);
      }
      for (int i = 0; (i + 1) * sc.block_size <= first_key; ++i) table[i] = -1;
    }
    row += spec.q_len;
  }
  b.meta.max_query_len = 0;
  b.meta.max_context_len = 0;
  for (const auto& s : sc.seqs) {
    b.meta.max_query_len = std::max(b.meta.max_query_len, s.q_len);
    b.meta.max_context_len = std::max(b.meta.max_context_len, s.context_len);
  }
  if (sc.history_bits != 0) {
    // History blocks: the sequences' K/V are now what those blocks decode to.
    testing::move_blocks_to_history(b.cache, b.meta, sc.history_bits, rng);
    for (int s = 0; s < num_seqs; ++s) {
      const int32_t* table = b.meta.block_tables.data<int32_t>() + s * b.meta.block_tables.size(1);
      const int ctx = sc.seqs[static_cast<size_t>(s)].context_len;
      const int64_t row = static_cast<int64_t>(sc.num_kv_heads) * sc.head_dim;  // floats per position
      for (int which = 0; which < 2; ++which) {
        const Tensor moved = testing::gather_sequence(b.cache, table, ctx, which);
        Tensor& kept = which == 0 ? b.k_seq[static_cast<size_t>(s)] : b.v_seq[static_cast<size_t>(s)];
        for (int j = 0; j < ctx; ++j) {
          if (table[j / sc.block_size] < b.cache.k.size(0)) continue;  // not in a history block
          const float* src = moved.data<float>() + j * row;
          if (!std::all_of(src, src + row, [](float x) { return std::isfinite(x); })) continue;  // poisoned: unseen
          std::copy(moved.data<float>() + j * row, moved.data<float>() + (j + 1) * row, kept.data<float>() + j * row);
        }
      }
    }
  }
  return b;
}

// Decode rows, a whole prompt, a chunked-prefill tail, a context ending exactly on a block edge.
std::vector<SeqSpec> mixed_seqs(std::mt19937& rng, int block_size) {
  std::uniform_int_distribution<int> ctx(1, 150), prompt(1, 60), chunk(2, 20);
  std::vector<SeqSpec> seqs;
  seqs.push_back({ctx(rng), 1});
  const int p = prompt(rng);
  seqs.push_back({p, p});
  const int c = std::uniform_int_distribution<int>(30, 150)(rng);
  seqs.push_back({c, std::min(c, chunk(rng))});
  seqs.push_back({2 * block_size, 1});
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

std::vector<Scenario> scenarios(std::mt19937& rng) {
  std::vector<Scenario> out;
  const std::vector<std::pair<int, int>> head_configs = {{4, 4}, {8, 4}, {8, 2}, {14, 2}, {8, 1}};
  const std::vector<int> head_dims = {64, 128, 48, 20};
  const std::vector<int> windows = {0, 7, 40};
  const std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3};
  int i = 0;
  for (auto [h, kvh] : head_configs) {
    for (int hd : head_dims) {
      Scenario s;
      s.num_heads = h;
      s.num_kv_heads = kvh;
      s.head_dim = hd;
      s.block_size = (i % 4 == 3) ? 5 : 16;
      s.sliding_window = windows[static_cast<size_t>(i % 3)];
      s.cache_dtype = dtypes[static_cast<size_t>(i % 5)];
      s.history_bits = i % 4 == 1 ? 4 : i % 4 == 2 ? 8 : 0;
      s.seqs = mixed_seqs(rng, s.block_size);
      out.push_back(s);
      ++i;
    }
  }
  return out;
}

Tensor reference_paged(const Batch& b) {
  Tensor out = testing::nan_tensor(b.q.shape());
  ops::reference::paged_attention(b.q, b.cache, b.meta, b.params, out);
  return out;
}

TEST(PagedAttention, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (const Scenario& sc : scenarios(rng)) {
    const Batch b = build(sc, rng);
    const Tensor expected = reference_paged(b);
    for (Isa isa : testing::simd_isas()) {
      testing::IsaScope scope(isa);
      Tensor out = testing::nan_tensor(b.q.shape());
      ops::paged_attention(b.q, b.cache, b.meta, b.params, out);
      ASSERT_TRUE(all_close(out, expected, kTol, fmt::format("{} {}", ops::cpu::isa_name(isa), sc.describe())));
    }
  }
}

// The reference's paged gather == textbook attention over each sequence's contiguous K/V.
TEST(PagedAttention, ReferenceMatchesContiguousAttention) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (const Scenario& sc : scenarios(rng)) {
    const Batch b = build(sc, rng);
    const Tensor paged = reference_paged(b);
    int row = 0;
    for (size_t s = 0; s < sc.seqs.size(); ++s) {
      const int q_len = sc.seqs[s].q_len;
      const Tensor q = b.q.slice(0, row, row + q_len).contiguous();
      Tensor expected = testing::nan_tensor(q.shape());
      ops::reference::contiguous_attention(q, b.k_seq[s], b.v_seq[s], b.params, expected);
      ASSERT_TRUE(
          all_close(paged.slice(0, row, row + q_len), expected, 1e-6, fmt::format("seq {} of {}", s, sc.describe())));
      row += q_len;
    }
  }
}

// A prompt attended in one prefill == the same prompt in chunks and then decode steps.
TEST(PagedAttention, ChunkedPrefillAndDecodeMatchOneShot) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  Scenario sc;
  sc.num_heads = 8;
  sc.num_kv_heads = 2;
  sc.head_dim = 64;
  const int length = 70;
  sc.seqs = {{length, length}};
  const Batch whole = build(sc, rng);
  Tensor one_shot = testing::nan_tensor(whole.q.shape());
  ops::paged_attention(whole.q, whole.cache, whole.meta, whole.params, one_shot);

  // Steps: [0, 30), [30, 61), then one token at a time; each step sees the cache up to its end.
  std::vector<std::pair<int, int>> steps = {{0, 30}, {30, 61}};
  for (int p = 61; p < length; ++p) steps.push_back({p, p + 1});
  for (auto [begin, end] : steps) {
    AttentionMetadata meta = whole.meta;
    meta.query_start = testing::i32_tensor({0, end - begin});
    meta.context_lens = testing::i32_tensor({end});
    Tensor q = whole.q.slice(0, begin, end);
    Tensor out = testing::nan_tensor(q.shape());
    ops::paged_attention(q, whole.cache, meta, whole.params, out);
    ASSERT_TRUE(all_close(out, one_shot.slice(0, begin, end), 1e-6, fmt::format("step [{}, {})", begin, end)));
  }
}

// Random token-tree masks for a chunk of q_len queries: each query's parent is an earlier query
// (or none), its mask its parent's plus itself (ops.h AttentionMetadata::tree_masks).
std::vector<uint64_t> random_tree_masks(int q_len, std::mt19937& rng) {
  std::vector<uint64_t> masks(static_cast<size_t>(q_len));
  for (int i = 0; i < q_len; ++i) {
    const int parent = std::uniform_int_distribution<int>(-1, i - 1)(rng);
    masks[static_cast<size_t>(i)] = (parent < 0 ? 0 : masks[static_cast<size_t>(parent)]) | uint64_t{1} << i;
  }
  return masks;
}

// Token trees: every tree query equals textbook attention over the cache before its chunk plus
// its own ancestors (gathered into one contiguous context), and the fast kernels equal the
// reference; chunks of the same batch without a tree (all-ones masks: a decode row, a long
// prefill chunk) equal plain causal attention.
TEST(PagedAttention, TreeMasksSeeTheirAncestorsOnly) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Scenario sc;
    sc.num_heads = 8;
    sc.num_kv_heads = 2;
    sc.head_dim = 64;
    sc.block_size = dtype == DType::kF32 ? 16 : 5;
    sc.cache_dtype = dtype;
    const int tree_len = std::uniform_int_distribution<int>(2, kMaxTreeTokens)(rng);
    sc.seqs = {{37, 1}, {90, 70}, {tree_len + 23, tree_len}, {tree_len, tree_len}};  // the last tree starts at 0
    const Batch b = build(sc, rng);
    const Tensor causal = reference_paged(b);

    AttentionMetadata meta = b.meta;
    meta.tree_masks = Tensor::empty({b.q.size(0)}, DType::kI64);
    auto* masks = static_cast<uint64_t*>(meta.tree_masks.raw_data());
    std::fill_n(masks, b.q.size(0), ~uint64_t{0});
    std::vector<std::vector<uint64_t>> trees(sc.seqs.size());
    int row = 0;
    for (size_t s = 0; s < sc.seqs.size(); ++s) {
      if (s >= 2) {
        trees[s] = random_tree_masks(sc.seqs[s].q_len, rng);
        std::copy(trees[s].begin(), trees[s].end(), masks + row);
      }
      row += sc.seqs[s].q_len;
    }
    Tensor expected = testing::nan_tensor(b.q.shape());
    ops::reference::paged_attention(b.q, b.cache, meta, b.params, expected);

    row = 0;
    for (size_t s = 0; s < sc.seqs.size(); ++s) {
      const SeqSpec& spec = sc.seqs[s];
      const int chunk_start = spec.context_len - spec.q_len;
      for (int t = 0; t < spec.q_len; ++t, ++row) {
        const std::string what = fmt::format("{} seq {} query {}", dtype_name(dtype), s, t);
        if (trees[s].empty()) {
          ASSERT_TRUE(all_close(expected.slice(0, row, row + 1), causal.slice(0, row, row + 1), 1e-6, what));
          continue;
        }
        std::vector<int64_t> keys(static_cast<size_t>(chunk_start));
        std::iota(keys.begin(), keys.end(), 0);
        for (int j = 0; j <= t; ++j) {
          if (trees[s][static_cast<size_t>(t)] >> j & 1) keys.push_back(chunk_start + j);
        }
        const int64_t n = static_cast<int64_t>(keys.size());
        Tensor k = Tensor::empty({n, sc.num_kv_heads, sc.head_dim}, DType::kF32);
        Tensor v = Tensor::empty({n, sc.num_kv_heads, sc.head_dim}, DType::kF32);
        for (int64_t i = 0; i < n; ++i) {
          Tensor k_row = k.select(0, i), v_row = v.select(0, i);
          ASSERT_TRUE(copy_into(k_row, b.k_seq[s].select(0, keys[static_cast<size_t>(i)])).ok());
          ASSERT_TRUE(copy_into(v_row, b.v_seq[s].select(0, keys[static_cast<size_t>(i)])).ok());
        }
        const Tensor q = b.q.slice(0, row, row + 1).contiguous();
        Tensor textbook = testing::nan_tensor(q.shape());
        ops::reference::contiguous_attention(q, k, v, b.params, textbook);
        ASSERT_TRUE(all_close(expected.slice(0, row, row + 1), textbook, 1e-6, what));
      }
    }
    for (Isa isa : testing::simd_isas()) {
      testing::IsaScope scope(isa);
      Tensor out = testing::nan_tensor(b.q.shape());
      ops::paged_attention(b.q, b.cache, meta, b.params, out);
      ASSERT_TRUE(all_close(out, expected, kTol, fmt::format("{} {}", ops::cpu::isa_name(isa), sc.describe())));
    }
  }
}

// Malformed tree masks are refused: a later key, a missing own bit.
TEST(PagedAttention, RejectsMalformedTreeMasks) {
  std::mt19937 rng(1);
  Scenario sc;
  sc.seqs = {{80, 4}};
  const Batch b = build(sc, rng);
  Tensor out = testing::nan_tensor(b.q.shape());
  for (const std::vector<uint64_t>& bad : std::vector<std::vector<uint64_t>>{{1, 3, 0xF, 0xF}, {1, 1, 5, 9}}) {
    AttentionMetadata meta = b.meta;
    meta.tree_masks = Tensor::empty({4}, DType::kI64);
    std::copy(bad.begin(), bad.end(), static_cast<uint64_t*>(meta.tree_masks.raw_data()));
    EXPECT_DEATH(ops::paged_attention(b.q, b.cache, meta, b.params, out), "tree mask");
  }
}

// q and out as strided views (q of a fused QKV output; out inside a wider buffer).
TEST(PagedAttention, StridedQueryAndOutput) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  Scenario sc;
  sc.num_heads = 6;
  sc.num_kv_heads = 2;
  sc.head_dim = 32;
  sc.seqs = {{40, 5}, {17, 1}};
  const Batch b = build(sc, rng);
  const int64_t n = b.q.size(0);
  Tensor qkv = testing::random_tensor({n, sc.num_heads + 2 * sc.num_kv_heads, sc.head_dim}, rng);
  Tensor q = qkv.slice(1, 0, sc.num_heads);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < sc.num_heads; ++h) {
      for (int64_t i = 0; i < sc.head_dim; ++i) {
        q.data<float>()[t * q.stride(0) + h * q.stride(1) + i] =
            b.q.data<float>()[(t * sc.num_heads + h) * sc.head_dim + i];
      }
    }
  }
  Tensor wide = testing::nan_tensor({n, sc.num_heads + 1, sc.head_dim});
  Tensor out = wide.slice(1, 1, sc.num_heads + 1);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    ops::paged_attention(q, b.cache, b.meta, b.params, out);
    ASSERT_TRUE(all_close(out, reference_paged(b), kTol, ops::cpu::isa_name(isa)));
  }
}

TEST(PagedAttention, ThreadCountsAgree) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  Scenario sc;
  sc.num_heads = 14;
  sc.num_kv_heads = 2;
  sc.head_dim = 64;
  sc.seqs = mixed_seqs(rng, sc.block_size);
  const Batch b = build(sc, rng);
  const Tensor expected = reference_paged(b);
  for (int threads : {1, 2, 3, 7}) {
    testing::ThreadScope ts(threads);
    Tensor out = testing::nan_tensor(b.q.shape());
    ops::paged_attention(b.q, b.cache, b.meta, b.params, out);
    ASSERT_TRUE(all_close(out, expected, kTol, fmt::format("threads={} {}", threads, sc.describe())));
  }
}

TEST(StoreKv, MatchesReferenceBitwise) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
      const int64_t num_blocks = 7, block_size = 16, kv_heads = 3, head_dim = 24, n = 29;
      // k, v as strided views of a fused QKV output.
      Tensor qkv = testing::random_tensor({n, 2 + 2 * kv_heads, head_dim}, rng, -70000.0f, 70000.0f);
      Tensor k = qkv.slice(1, 2, 2 + kv_heads), v = qkv.slice(1, 2 + kv_heads, 2 + 2 * kv_heads);
      for (int64_t i = 0; i < head_dim; ++i) {
        k.data<float>()[5 * k.stride(0) + i] = 0.0f;  // an all-zero row: scale 0
        v.data<float>()[6 * v.stride(0) + v.stride(1) + i] = 0.0f;
      }
      k.data<float>()[7 * k.stride(0) + 2 * k.stride(1) + 3] = std::numeric_limits<float>::quiet_NaN();
      v.data<float>()[8 * v.stride(0) + 4] = std::numeric_limits<float>::infinity();
      std::vector<int32_t> all_slots(static_cast<size_t>(num_blocks * block_size));
      std::iota(all_slots.begin(), all_slots.end(), 0);
      std::shuffle(all_slots.begin(), all_slots.end(), rng);
      std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
      slots[3] = -1;  // padding tokens store nothing
      slots[17] = -1;
      const Tensor slot_mapping = testing::i32_tensor(slots);
      KvLayer cache = nan_cache({num_blocks, block_size, kv_heads, head_dim}, dtype);
      KvLayer ref = cache;
      for (Tensor* t : {&ref.k, &ref.v, &ref.k_scales, &ref.v_scales}) {
        if (t->defined()) *t = t->contiguous();
      }
      ops::store_kv(k, v, slot_mapping, cache);
      ops::reference::store_kv(k.contiguous(), v.contiguous(), slot_mapping, ref);
      ASSERT_TRUE(testing::bitwise_equal(cache.k, ref.k, fmt::format("k {}", dtype_name(dtype))));
      ASSERT_TRUE(testing::bitwise_equal(cache.v, ref.v, fmt::format("v {}", dtype_name(dtype))));
      if (ops::is_quantized_kv_dtype(dtype)) {
        ASSERT_TRUE(testing::bitwise_equal(cache.k_scales, ref.k_scales, fmt::format("k scales {}", dtype_name(dtype))));
        ASSERT_TRUE(testing::bitwise_equal(cache.v_scales, ref.v_scales, fmt::format("v scales {}", dtype_name(dtype))));
      }
    }
  }
}

// Quantized rows by the rule of ops.h KvLayer, checked from its definition: the scale is the
// row's max |x| over Q, every code dequantizes to within half a step of x (i8: half the scale;
// f8e4m3: half an e4m3 step at |x| / scale), the largest |x| maps to +-Q exactly, an all-zero row
// stores zeros with scale 0, and a row holding a non-finite value gets a NaN scale.
TEST(StoreKv, QuantizedRowsFollowTheRule) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t kv_heads = 2, head_dim = 40, n = 6;
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    const double q_max = dtype == DType::kI8 ? 127.0 : 448.0;
    Tensor k = testing::random_tensor({n, kv_heads, head_dim}, rng, -3.0f, 3.0f);
    for (int64_t i = 0; i < head_dim; ++i) k.data<float>()[(1 * kv_heads + 1) * head_dim + i] = 0.0f;
    k.data<float>()[(2 * kv_heads) * head_dim + 7] = std::numeric_limits<float>::infinity();
    k.data<float>()[(3 * kv_heads) * head_dim] = 1e-30f;  // tiny values next to ordinary ones
    const Tensor v = k.contiguous();
    std::vector<int32_t> slots(static_cast<size_t>(n));
    std::iota(slots.begin(), slots.end(), 0);
    KvLayer cache = nan_cache({1, 8, kv_heads, head_dim}, dtype);
    ops::store_kv(k, v, testing::i32_tensor(slots), cache);
    const Tensor codes = cache.k.reshape({8 * kv_heads, head_dim}).to_f32();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t row = t * kv_heads + h;
        const float* x = k.data<float>() + row * head_dim;
        const float scale = cache.k_scales.data<float>()[row];
        const std::string what = fmt::format("{} token {} head {}", dtype_name(dtype), t, h);
        if (t == 2 && h == 0) {
          EXPECT_TRUE(std::isnan(scale)) << what;
          continue;
        }
        double amax = 0.0;
        for (int64_t i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
        EXPECT_EQ(scale, static_cast<float>(amax) / static_cast<float>(q_max)) << what;
        for (int64_t i = 0; i < head_dim; ++i) {
          const double c = codes.data<float>()[row * head_dim + i];
          if (amax == 0.0) {
            EXPECT_EQ(c, 0.0) << what;
            continue;
          }
          const double r = x[i] / static_cast<double>(scale);  // where x falls in code units
          if (std::fabs(x[i]) == amax) EXPECT_NEAR(std::fabs(c), q_max, 0.0) << what << " i " << i;
          // i8 steps are 1; e4m3 steps are 2^(floor(log2 |r|) - 3), at least 2^-9.
          const double step =
              dtype == DType::kI8 ? 1.0 : std::ldexp(1.0, std::max(-9, static_cast<int>(std::floor(std::log2(std::fabs(r) + 1e-300))) - 3));
          EXPECT_LE(std::fabs(c - r), step / 2 * (1 + 1e-6)) << what << " i " << i << " x " << x[i];
        }
      }
    }
  }
}

// History rows (ops.h KvLayer) decode within half a step of every value: int8 with the i8 rule,
// int4 asymmetric with its row's min and (max - min) / 15; a constant row is exact and a row
// holding a non-finite value gets NaN parameters. compress_kv_blocks moves a whole block of any
// cache dtype, each row quantized from the value the cache holds.
TEST(KvHistory, RowsFollowTheRuleAndBlocksMoveWhole) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t hd = 48;
  for (int bits : {8, 4}) {
    for (int trial = 0; trial < 200; ++trial) {
      Tensor x = testing::random_tensor({hd}, rng, -4.0f, 4.0f);
      float* v = x.data<float>();
      if (trial % 7 == 1) std::fill(v, v + hd, 0.75f);                            // constant
      if (trial % 7 == 2) v[trial % hd] = 300.0f;                                 // an outlier
      if (trial % 7 == 3) v[trial % hd] = std::numeric_limits<float>::infinity();  // non-finite
      std::vector<uint8_t> codes(static_cast<size_t>(hd));
      float params[2] = {0.0f, 0.0f};
      ops::reference::quantize_history_row(v, hd, bits, codes.data(), params);
      const std::string what = fmt::format("bits {} trial {}", bits, trial);
      if (trial % 7 == 3) {
        EXPECT_TRUE(bits == 8 ? std::isnan(params[0]) : std::isnan(ops::reference::int4_history_params(params).first))
            << what;
        continue;
      }
      float lo = v[0], hi = v[0], amax = 0.0f;
      for (int64_t i = 0; i < hd; ++i) {
        lo = std::min(lo, v[i]);
        hi = std::max(hi, v[i]);
        amax = std::max(amax, std::fabs(v[i]));
      }
      const double step = bits == 8 ? amax / 127.0 : (hi - lo) / 15.0;
      // int4's s and lo are f16 (relative rounding 2^-11 each): half a step widened by that much.
      const double tol =
          bits == 8 ? step / 2 : step / 2 * (1 + std::ldexp(1.0, -10)) + std::fabs(lo) * std::ldexp(1.0, -11);
      for (int64_t i = 0; i < hd; ++i) {
        const float back = ops::reference::history_value(codes.data(), params, bits, i);
        EXPECT_LE(std::fabs(back - v[i]), tol + 1e-6 * (std::fabs(v[i]) + 1.0)) << what << " i " << i;
        if (trial % 7 == 1 && bits == 4) EXPECT_EQ(back, v[i]) << what;
      }
    }
  }
  // Whole blocks through ops::compress_kv_blocks (the CPU backend) from every cache dtype.
  const int64_t bs = 5, kvh = 3;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
    for (int bits : {8, 4}) {
      KvLayer cache = nan_cache({4, bs, kvh, hd}, dtype);
      std::vector<int32_t> slots(static_cast<size_t>(4 * bs));
      std::iota(slots.begin(), slots.end(), 0);
      const Tensor k = testing::random_tensor({4 * bs, kvh, hd}, rng);
      const Tensor v = testing::random_tensor({4 * bs, kvh, hd}, rng);
      ops::reference::store_kv(k, v, testing::i32_tensor(slots), cache);
      AttentionMetadata meta;
      meta.block_tables = testing::i32_tensor({2, 0, 3});
      meta.block_tables = meta.block_tables.reshape({1, 3});
      const Tensor k_before = testing::gather_sequence(cache, meta.block_tables.data<int32_t>(), static_cast<int>(3 * bs), 0);
      const Tensor v_before = testing::gather_sequence(cache, meta.block_tables.data<int32_t>(), static_cast<int>(3 * bs), 1);
      testing::move_blocks_to_history(cache, meta, bits, rng, 1.0);  // every block: the reference's rows
      KvLayer through_ops = cache;
      through_ops.hk = Tensor::zeros(cache.hk.shape(), cache.hk.dtype());
      through_ops.hv = Tensor::zeros(cache.hv.shape(), cache.hv.dtype());
      through_ops.hk_params = testing::nan_tensor(cache.hk_params.shape(), cache.hk_params.dtype());
      through_ops.hv_params = testing::nan_tensor(cache.hv_params.shape(), cache.hv_params.dtype());
      const std::string what = fmt::format("{} into {}-bit history", dtype_name(dtype), bits);
      // The primary blocks were poisoned after the move: compress from an unpoisoned copy.
      KvLayer source = nan_cache({4, bs, kvh, hd}, dtype);
      ops::reference::store_kv(k, v, testing::i32_tensor(slots), source);
      source.hk = through_ops.hk;
      source.hv = through_ops.hv;
      source.hk_params = through_ops.hk_params;
      source.hv_params = through_ops.hv_params;
      ops::compress_kv_blocks(testing::i32_tensor({2, 0, 0, 1, 3, 2}).reshape({3, 2}), source);
      for (const auto& [a, b] : {std::pair{&cache.hk, &source.hk}, std::pair{&cache.hv, &source.hv},
                                 std::pair{&cache.hk_params, &source.hk_params},
                                 std::pair{&cache.hv_params, &source.hv_params}}) {
        EXPECT_EQ(std::memcmp(a->raw_data(), b->raw_data(), a->nbytes()), 0) << what;
      }
      // Every position decodes within half a step of what the cache held.
      const Tensor k_after = testing::gather_sequence(cache, meta.block_tables.data<int32_t>(), static_cast<int>(3 * bs), 0);
      const Tensor v_after = testing::gather_sequence(cache, meta.block_tables.data<int32_t>(), static_cast<int>(3 * bs), 1);
      EXPECT_TRUE(all_close(k_after, k_before, bits == 8 ? 1.5e-2 : 0.25, what + " K"));
      EXPECT_TRUE(all_close(v_after, v_before, bits == 8 ? 1.5e-2 : 0.25, what + " V"));
    }
  }
}

// The bound: attention over an i8 cache is within 1e-2 (relative, over the whole output)
// of the same attention over a bf16 cache; f8e4m3 (3 mantissa bits) is reported with its own,
// looser bound.
TEST(PagedAttention, QuantizedCacheErrorAgainstBf16) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (auto [dtype, bound] : {std::pair{DType::kI8, 1e-2}, std::pair{DType::kF8E4M3, 5e-2}}) {
    std::mt19937 rng_q(seed), rng_b(seed);
    Scenario sc;
    sc.num_heads = 8;
    sc.num_kv_heads = 2;
    sc.head_dim = 64;
    sc.seqs = {{300, 1}, {64, 64}, {150, 9}, {1, 1}};
    sc.cache_dtype = dtype;
    const Batch quantized = build(sc, rng_q);
    sc.cache_dtype = DType::kBF16;
    const Batch bf16 = build(sc, rng_b);  // the same draws: the same q, K and V before rounding
    const Tensor a = reference_paged(quantized), b = reference_paged(bf16);
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double d = static_cast<double>(a.data<float>()[i]) - b.data<float>()[i];
      diff += d * d;
      norm += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
    }
    const double rel = std::sqrt(diff / norm);
    RecordProperty(fmt::format("relative_error_{}", dtype_name(dtype)), fmt::format("{:.2e}", rel));
    EXPECT_LT(rel, bound) << dtype_name(dtype);
    std::printf("attention over a %s cache: relative error %.2e against bf16\n", dtype_name(dtype), rel);
  }
}

}  // namespace
}  // namespace tachyon
