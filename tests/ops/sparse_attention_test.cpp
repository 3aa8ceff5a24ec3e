// Block-sparse decode attention (ops.h select_kv_blocks, paged_attention with sparse tables) and
// the key bounds it ranks blocks by: the bounds hold for every key the history decodes to and are
// within a step of the true extremes, a block's bound is at least every one of its keys' scores,
// the selection keeps the sinks, the window and the best-bounded candidates, a budget covering the
// context is dense attention bit for bit, sparse attention is attention over the kept blocks
// (every CPU kernel), and a key planted far back in a 32k context is found at every budget.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "ops/cpu/isa.h"
#include "ops/cpu/reference.h"
#include "ops/kv_history_util.h"
#include "ops/ops.h"
#include "ops/sparse_util.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using testing::make_sparse_case;
using testing::SparseCase;
using testing::SparseSpec;

float bound_value(float lo, float step, int c) {
  volatile float product = static_cast<float>(c) * step;
  return lo + product;
}

// The decoded key (kv head h, slot t) of history block b, element d.
float history_key(const KvLayer& cache, int64_t b, int64_t t, int64_t h, int64_t d) {
  const int bits = ops::kv_history_bits(cache);
  const int64_t hd = cache.k.size(3), kvh = cache.k.size(2), bs = cache.k.size(1);
  const int64_t r = (b * bs + t) * kvh + h;
  return ops::reference::history_value(static_cast<const uint8_t*>(cache.hk.raw_data()) + r * (bits == 8 ? hd : hd / 2),
                                       static_cast<const uint8_t*>(cache.hk_params.raw_data()) + r * 4, bits, d);
}

// Key bounds of (history block b, kv head h): its codes [2, head_dim / 2] and its groups' params.
const uint8_t* bound_codes(const KvLayer& cache, int64_t b, int64_t h) {
  return static_cast<const uint8_t*>(cache.kbounds.raw_data()) + (b * cache.k.size(2) + h) * cache.k.size(3);
}
const float* bound_params(const KvLayer& cache, int64_t b, int64_t h) {
  return cache.kbound_params.data<float>() + (b * cache.k.size(2) + h) * 2 * ops::key_bound_groups(cache.k.size(3));
}
// Dim d's min code (which 0) or max code (1).
int bound_code(const uint8_t* codes, int64_t hd, int which, int64_t d) {
  return (codes[which * hd / 2 + d / 2] >> (4 * (d % 2))) & 0xf;
}

TEST(KeyBounds, HoldForEveryDecodedKeyAndAreTight) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int bits : {8, 4}) {
    for (float range : {1.0f, 40.0f}) {
      SparseSpec spec;
      spec.contexts = {16 * 20 + 5, 16 * 7};
      spec.budgets = {64, 64};
      spec.bits = bits;
      spec.key_range = range;
      const SparseCase c = make_sparse_case(spec, rng);
      const int64_t nh = c.cache.hk.size(0), bs = 16, kvh = spec.num_kv_heads, hd = spec.head_dim;
      for (int64_t b = 0; b < nh; ++b) {
        for (int64_t h = 0; h < kvh; ++h) {
          const uint8_t* codes = bound_codes(c.cache, b, h);
          const float* params = bound_params(c.cache, b, h);
          for (int64_t d = 0; d < hd; ++d) {
            const float lo = params[2 * (d / ops::kKeyBoundGroup)], step = params[2 * (d / ops::kKeyBoundGroup) + 1];
            ASSERT_TRUE(std::isfinite(lo) && std::isfinite(step) && step >= 0.0f);
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t t = 0; t < bs; ++t) {
              mn = std::min(mn, history_key(c.cache, b, t, h, d));
              mx = std::max(mx, history_key(c.cache, b, t, h, d));
            }
            const int min_code = bound_code(codes, hd, 0, d), max_code = bound_code(codes, hd, 1, d);
            const float vmin = bound_value(lo, step, min_code), vmax = bound_value(lo, step, max_code);
            ASSERT_LE(vmin, mn) << "bits " << bits << " block " << b << " head " << h << " dim " << d;
            ASSERT_GE(vmax, mx) << "bits " << bits << " block " << b << " head " << h << " dim " << d;
            // The largest / smallest code that still bounds: the next one would not.
            if (min_code < 15) {
              ASSERT_GT(bound_value(lo, step, min_code + 1), mn);
            }
            if (max_code > 0) {
              ASSERT_LT(bound_value(lo, step, max_code - 1), mx);
            }
          }
          // A block's bound is at least each of its keys' q . k, for random query heads.
          for (int trial = 0; trial < 4; ++trial) {
            const Tensor q = testing::random_tensor({hd}, rng, -2.0f, 2.0f);
            const float bound = ops::reference::key_bound(q.data<float>(), codes, params, hd);
            for (int64_t t = 0; t < bs; ++t) {
              double dot = 0.0, mag = 0.0;
              for (int64_t d = 0; d < hd; ++d) {
                const double k = history_key(c.cache, b, t, h, d);
                dot += q.data<float>()[d] * k;
                mag += std::fabs(q.data<float>()[d] * k);
              }
              ASSERT_GE(bound, dot - 1e-5 * mag) << "bits " << bits << " block " << b << " slot " << t;
            }
          }
        }
      }
    }
  }
}

TEST(KeyBounds, ANonFiniteKeyGivesNaNBoundsThatAlwaysRankFirst) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  SparseSpec spec;
  spec.contexts = {16 * 12};
  spec.budgets = {16};
  spec.num_kv_heads = 1;
  spec.num_heads = 2;
  spec.resident_blocks = 2;
  const int poisoned_entry = 5;
  SparseCase c = make_sparse_case(spec, rng, [&](SparseCase& sc) {
    const int32_t block = sc.meta.block_tables.data<int32_t>()[poisoned_entry];
    sc.cache.k.data<float>()[(block * 16 + 3) * spec.head_dim + 7] = INFINITY;
  });
  const int64_t hb = c.meta.block_tables.data<int32_t>()[poisoned_entry] - c.cache.k.size(0);
  for (int64_t g = 0; g < ops::key_bound_groups(spec.head_dim); ++g) {
    EXPECT_TRUE(std::isnan(bound_params(c.cache, hb, 0)[2 * g]));
  }
  Tensor tables = Tensor::empty({1, 1, c.meta.block_tables.size(1)}, DType::kI32);
  Tensor lens = Tensor::empty({1, 1}, DType::kI32);
  ops::select_kv_blocks(c.q, c.cache, c.meta, tables, lens);
  // Sink, the poisoned block (the budget's one block), the two window blocks.
  const int32_t* t = tables.data<int32_t>();
  const int32_t* table = c.meta.block_tables.data<int32_t>();
  EXPECT_EQ(t[0], table[0]);
  EXPECT_EQ(t[1], table[poisoned_entry]);
  EXPECT_EQ(t[2], table[10]);
  EXPECT_EQ(t[3], table[11]);
  EXPECT_EQ(t[4], -1);
  EXPECT_EQ(lens.data<int32_t>()[0], 4 * 16);
}

// What select_kv_blocks must have chosen, checked from its definition: the kept entries in table
// order are the sinks, k candidates whose scores are at least every dropped candidate's (ties to
// the earlier entry), and the window; lens counts their positions.
void check_selection(const SparseCase& c, const Tensor& tables, const Tensor& lens) {
  const int64_t kvh = c.cache.k.size(2), hd = c.cache.k.size(3), bs = c.cache.k.size(1), nb = c.cache.k.size(0);
  const int64_t group = c.q.size(1) / kvh, cols = c.meta.block_tables.size(1);
  for (int s = 0; s < c.meta.num_seqs; ++s) {
    const int32_t* table = c.meta.block_tables.data<int32_t>() + s * cols;
    const int ctx = c.meta.context_lens.data<int32_t>()[s];
    const int64_t entries = (ctx + bs - 1) / bs;
    int64_t history = 0;
    while (history < entries && table[history] >= nb) ++history;
    const int64_t sinks = std::min<int64_t>(c.meta.sparse_sink_blocks, history);
    const int budget = c.meta.sparse_budgets.data<int32_t>()[s];
    const int64_t k = std::max<int64_t>(1, budget / bs);
    for (int64_t h = 0; h < kvh; ++h) {
      const int32_t* kept = tables.data<int32_t>() + (s * kvh + h) * cols;
      const int len = lens.data<int32_t>()[s * kvh + h];
      const int q_len = c.meta.query_start.data<int32_t>()[s + 1] - c.meta.query_start.data<int32_t>()[s];
      if (budget <= 0 || k >= history - sinks || q_len != 1) {
        for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(kept[i], i < entries ? table[i] : -1) << "seq " << s;
        ASSERT_EQ(len, ctx);
        continue;
      }
      std::vector<float> score(static_cast<size_t>(entries), 0.0f);
      for (int64_t i = sinks; i < history; ++i) {
        const int64_t hb = table[i] - nb;
        float best = -INFINITY;
        for (int64_t g = 0; g < group; ++g) {
          const int row = c.meta.query_start.data<int32_t>()[s];
          const float* q = c.q.data<float>() + (row * c.q.size(1) + h * group + g) * hd;
          const float b =
              ops::reference::key_bound(q, bound_codes(c.cache, hb, h), bound_params(c.cache, hb, h), hd);
          best = std::isnan(b) ? INFINITY : std::max(best, b);
        }
        score[static_cast<size_t>(i)] = best;
      }
      std::set<int32_t> kept_ids;
      int64_t n = 0;
      while (n < cols && kept[n] >= 0) kept_ids.insert(kept[n++]);
      ASSERT_EQ(n, sinks + k + (entries - history)) << "seq " << s << " head " << h;
      ASSERT_EQ(len, ctx - (entries - n) * bs);
      int64_t at = 0;  // kept entries appear in table order
      for (int64_t i = 0; i < entries; ++i) {
        if (at < n && kept[at] == table[i]) ++at;
      }
      ASSERT_EQ(at, n) << "kept blocks out of table order";
      for (int64_t i = 0; i < entries; ++i) {
        const bool must = i < sinks || i >= history;
        if (must) {
          ASSERT_TRUE(kept_ids.count(table[i])) << "sink / window entry " << i << " dropped";
        }
      }
      for (int64_t i = sinks; i < history; ++i) {
        if (!kept_ids.count(table[i])) continue;
        for (int64_t j = sinks; j < history; ++j) {
          if (kept_ids.count(table[j])) continue;
          ASSERT_TRUE(score[static_cast<size_t>(i)] > score[static_cast<size_t>(j)] ||
                      (score[static_cast<size_t>(i)] == score[static_cast<size_t>(j)] && i < j))
              << "seq " << s << " head " << h << ": kept " << i << " (" << score[static_cast<size_t>(i)]
              << ") over dropped " << j << " (" << score[static_cast<size_t>(j)] << ")";
        }
      }
    }
  }
}

// Five sequences of random contexts and budgets; the fourth's chunk has several queries (a prompt
// chunk in the same step), which attend densely whatever its budget.
SparseSpec mixed_spec(std::mt19937& rng, int bits) {
  SparseSpec spec;
  std::uniform_int_distribution<int> ctx(40, 700);
  for (int s = 0; s < 5; ++s) spec.contexts.push_back(ctx(rng));
  spec.contexts[0] += 300;  // one long enough to choose among its blocks
  spec.budgets = {16, 100, 0, 48, 48};
  spec.q_lens = {1, 1, 1, 1 + static_cast<int>(rng() % 20), 1};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.bits = bits;
  spec.sink_blocks = 1 + static_cast<int>(rng() % 2);
  return spec;
}

TEST(SelectKvBlocks, KeepsSinksWindowAndTheBestBoundedBlocks) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int bits : {8, 4}) {
    const SparseCase c = make_sparse_case(mixed_spec(rng, bits), rng);
    Tensor tables = Tensor::empty({c.meta.num_seqs, 2, c.meta.block_tables.size(1)}, DType::kI32);
    Tensor lens = Tensor::empty({c.meta.num_seqs, 2}, DType::kI32);
    ops::select_kv_blocks(c.q, c.cache, c.meta, tables, lens);
    check_selection(c, tables, lens);
    EXPECT_LT(lens.data<int32_t>()[0], c.meta.context_lens.data<int32_t>()[0]) << "the first sequence kept everything";
  }
}

// Sparse attention through the kept tables: every CPU kernel agrees with the reference, and the
// reference equals textbook attention over the kept blocks' keys gathered in order.
TEST(SparseAttention, AttendsToTheKeptBlocksAsItsContext) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int bits : {8, 4}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SparseSpec spec = mixed_spec(rng, bits);
      spec.dtype = dtype;
      SparseCase c = make_sparse_case(spec, rng);
      const int64_t kvh = 2, cols = c.meta.block_tables.size(1), group = 4;
      c.meta.sparse_tables = Tensor::empty({c.meta.num_seqs, kvh, cols}, DType::kI32);
      c.meta.sparse_lens = Tensor::empty({c.meta.num_seqs, kvh}, DType::kI32);
      ops::select_kv_blocks(c.q, c.cache, c.meta, c.meta.sparse_tables, c.meta.sparse_lens);
      Tensor expected = testing::nan_tensor(c.q.shape());
      ops::reference::paged_attention(c.q, c.cache, c.meta, AttentionParams{0.125f, 0}, expected);
      for (auto isa : testing::simd_isas()) {
        testing::IsaScope scope(isa);
        Tensor out = testing::nan_tensor(c.q.shape());
        ops::paged_attention(c.q, c.cache, c.meta, AttentionParams{0.125f, 0}, out);
        ASSERT_TRUE(testing::all_close(out, expected, 1e-5, "sparse attention"));
      }
      for (int s = 0; s < c.meta.num_seqs; ++s) {
        for (int64_t h = 0; h < kvh; ++h) {
          const int len = c.meta.sparse_lens.data<int32_t>()[s * kvh + h];
          const int32_t* row = c.meta.sparse_tables.data<int32_t>() + (s * kvh + h) * cols;
          const Tensor k = testing::gather_sequence(c.cache, row, len, 0).slice(1, h, h + 1).contiguous();
          const Tensor v = testing::gather_sequence(c.cache, row, len, 1).slice(1, h, h + 1).contiguous();
          const int r0 = c.meta.query_start.data<int32_t>()[s], r1 = c.meta.query_start.data<int32_t>()[s + 1];
          const Tensor q = c.q.slice(0, r0, r1).slice(1, h * group, (h + 1) * group).contiguous();
          Tensor out = testing::nan_tensor(q.shape());
          ops::reference::contiguous_attention(q, k, v, AttentionParams{0.125f, 0}, out);
          const Tensor got = expected.slice(0, r0, r1).slice(1, h * group, (h + 1) * group).contiguous();
          ASSERT_TRUE(testing::all_close(got, out, 1e-5, fmt::format("seq {} kv head {}", s, h)));
        }
      }
    }
  }
}

TEST(SparseAttention, ABudgetCoveringTheContextIsDenseBitForBit) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  SparseSpec spec = mixed_spec(rng, 4);
  spec.budgets = {4096, 0, 4096, 100000, 0};
  spec.dtype = DType::kBF16;
  SparseCase c = make_sparse_case(spec, rng);
  const int64_t cols = c.meta.block_tables.size(1);
  AttentionMetadata sparse = c.meta;
  sparse.sparse_tables = Tensor::empty({c.meta.num_seqs, 2, cols}, DType::kI32);
  sparse.sparse_lens = Tensor::empty({c.meta.num_seqs, 2}, DType::kI32);
  ops::select_kv_blocks(c.q, c.cache, c.meta, sparse.sparse_tables, sparse.sparse_lens);
  AttentionMetadata dense = c.meta;
  dense.sparse_budgets = Tensor();
  std::vector<ops::cpu::Isa> isas = testing::simd_isas();
  isas.push_back(ops::cpu::Isa::kScalar);
  for (auto isa : isas) {
    testing::IsaScope scope(isa);
    Tensor a = testing::nan_tensor(c.q.shape()), b = testing::nan_tensor(c.q.shape());
    ops::paged_attention(c.q, c.cache, sparse, AttentionParams{0.125f, 0}, a);
    ops::paged_attention(c.q, c.cache, dense, AttentionParams{0.125f, 0}, b);
    ASSERT_TRUE(testing::bitwise_equal(a, b, "sparse with every block kept against dense"));
  }
}

// A key whose score dominates, planted far back in a 32k context of random keys, is in the
// selection at every budget of at least one block, for the query head it answers and so for
// its kv head.
TEST(SelectKvBlocks, FindsAKeyPlantedFarBackIn32kTokens) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int bits : {8, 4}) {
    testing::PlantedKey planted = testing::make_planted_key_case(64, bits, 200.0f, rng);
    SparseCase& c = planted.c;
    const int32_t planted_id = planted.planted_id, planted_block = planted.planted_block;
    for (int budget : {16, 64, 256, 2048, 8192}) {
      c.meta.sparse_budgets.data<int32_t>()[0] = budget;
      Tensor tables = Tensor::empty({1, 1, c.meta.block_tables.size(1)}, DType::kI32);
      Tensor lens = Tensor::empty({1, 1}, DType::kI32);
      ops::select_kv_blocks(c.q, c.cache, c.meta, tables, lens);
      const int64_t n = (lens.data<int32_t>()[0] + 15) / 16;
      EXPECT_EQ(n, 1 + budget / 16 + 32) << "bits " << bits << " budget " << budget;
      EXPECT_TRUE(std::find(tables.data<int32_t>(), tables.data<int32_t>() + n, planted_id) != tables.data<int32_t>() + n)
          << "bits " << bits << " budget " << budget << ": block " << planted_block << " not kept";
    }
  }
}

}  // namespace
}  // namespace tachyon
