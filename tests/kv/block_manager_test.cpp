#include <algorithm>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace tachyon {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

void expect_ok(const BlockManager& m, std::vector<const BlockTable*> tables) {
  const Status s = m.check(tables);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(BlockManager, GrowIsAllOrNothing) {
  BlockManager m({4, 16, false, {}});
  BlockTable a(16), b(16);
  ASSERT_TRUE(m.grow_to(a, 40).ok());  // 3 blocks
  EXPECT_EQ(m.num_used(), 3);
  const Status s = m.grow_to(b, 17);  // needs 2, 1 free
  EXPECT_EQ(s.code(), ErrorCode::kOutOfRange);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(m.num_free(), 1);
  EXPECT_EQ(a.slot(16), a.blocks()[1] * 16);
  EXPECT_EQ(a.slot(5), a.blocks()[0] * 16 + 5);
  m.truncate(a, 16);
  EXPECT_EQ(a.blocks().size(), 1u);
  EXPECT_EQ(m.num_free(), 3);
  expect_ok(m, {&a, &b});
  m.free(a);
  EXPECT_EQ(m.num_free(), 4);
  expect_ok(m, {&a, &b});
}

TEST(BlockManager, PrefixCacheReusesFullBlocksAndCountsHits) {
  BlockManager m({16, 4, true, {}});
  const auto tokens = iota_tokens(10);  // blocks [0,4) [4,8) full, [8,10) partial
  BlockTable a(4);
  EXPECT_EQ(m.match_prefix(a, tokens, 9), 0);
  ASSERT_TRUE(m.grow_to(a, 10).ok());
  m.commit(a, tokens, 10);
  EXPECT_EQ(a.block_hashes().size(), 2u);
  // Same prompt: both full blocks come from the cache; never the block holding the last token.
  BlockTable b(4);
  EXPECT_EQ(m.match_prefix(b, tokens, 9), 8);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]);
  EXPECT_EQ(b.blocks()[1], a.blocks()[1]);
  EXPECT_EQ(m.ref_count(a.blocks()[0]), 2);
  // A limit inside the second block keeps only the first.
  BlockTable c(4);
  EXPECT_EQ(m.match_prefix(c, tokens, 7), 4);
  // A different second block: only the first matches (the chain includes the parent).
  auto other = tokens;
  other[5] = 7;
  BlockTable d(4);
  EXPECT_EQ(m.match_prefix(d, other, 9), 4);
  // Same second block after a different first block: no match at all.
  auto shifted = tokens;
  shifted[0] = 1;
  BlockTable e(4);
  EXPECT_EQ(m.match_prefix(e, shifted, 9), 0);
  expect_ok(m, {&a, &b, &c, &d, &e});
  for (BlockTable* t : {&a, &b, &c, &d, &e}) m.free(*t);
  // Registered blocks stay cached after their owners are gone.
  EXPECT_EQ(m.num_cached(), 2);
  EXPECT_EQ(m.num_used(), 0);
  BlockTable f(4);
  EXPECT_EQ(m.match_prefix(f, tokens, 9), 8);
  EXPECT_EQ(m.num_cached(), 0);
  m.free(f);
  expect_ok(m, {});
  m.clear_prefix_cache();
  EXPECT_EQ(m.num_free(), 16);
  BlockTable g(4);
  EXPECT_EQ(m.match_prefix(g, tokens, 9), 0);
}

TEST(BlockManager, EvictsLeastRecentlyReleasedOnlyWhenNeeded) {
  BlockManager m({4, 2, true, {}});
  const auto t1 = iota_tokens(4, 10), t2 = iota_tokens(4, 50);
  BlockTable a(2), b(2);
  ASSERT_TRUE(m.grow_to(a, 4).ok());
  m.commit(a, t1, 4);
  ASSERT_TRUE(m.grow_to(b, 4).ok());
  m.commit(b, t2, 4);
  m.free(a);  // released first: evicted first; within a table the tail goes first
  m.free(b);
  EXPECT_EQ(m.num_cached(), 4);
  EXPECT_EQ(m.num_free(), 0);
  BlockTable c(2);
  ASSERT_TRUE(m.grow_to(c, 2).ok());  // one eviction: a's tail block
  EXPECT_EQ(m.prefix_stats().evictions, 1);
  BlockTable d(2);
  EXPECT_EQ(m.match_prefix(d, t1, 4), 2);  // a's head block survived
  BlockTable e(2);
  EXPECT_EQ(m.match_prefix(e, t2, 4), 4);  // b untouched
  expect_ok(m, {&c, &d, &e});
  for (BlockTable* t : {&c, &d, &e}) m.free(*t);
  expect_ok(m, {});
}

TEST(BlockManager, CopyOnWriteOfSharedBlocks) {
  BlockManager m({8, 4, true, {}});
  const auto tokens = iota_tokens(6);
  BlockTable a(4);
  ASSERT_TRUE(m.grow_to(a, 6).ok());
  m.commit(a, tokens, 6);
  BlockTable b(4);
  m.fork(a, b);
  EXPECT_EQ(m.ref_count(a.blocks()[1]), 2);
  // b appends into the shared partial block: it gets its own copy of it, a keeps the original.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.grow_to(b, 7).ok());
  ASSERT_TRUE(m.prepare_write(b, 6, 7, copies).ok());
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.blocks()[1]);
  EXPECT_EQ(copies[0].dst, b.blocks()[1]);
  EXPECT_NE(a.blocks()[1], b.blocks()[1]);
  EXPECT_EQ(a.blocks()[0], b.blocks()[0]);
  // a writes into its partial block, now private: no copy.
  copies.clear();
  ASSERT_TRUE(m.grow_to(a, 7).ok());
  ASSERT_TRUE(m.prepare_write(a, 6, 7, copies).ok());
  EXPECT_TRUE(copies.empty());
  // a rolls back into block 0, shared with b and registered: rewriting it copies it.
  m.truncate(a, 3);
  copies.clear();
  ASSERT_TRUE(m.prepare_write(a, 2, 3, copies).ok());
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, b.blocks()[0]);
  EXPECT_NE(a.blocks()[0], b.blocks()[0]);
  BlockTable probe(4);
  EXPECT_EQ(m.match_prefix(probe, tokens, 5), 4);  // the original is still cached
  EXPECT_EQ(probe.blocks()[0], b.blocks()[0]);
  m.free(probe);
  // A private registered block rolled back and rewritten is unregistered, not copied.
  BlockTable c(4);
  const auto other = iota_tokens(5, 500);
  ASSERT_TRUE(m.grow_to(c, 4).ok());
  m.commit(c, other, 4);
  m.truncate(c, 2);
  copies.clear();
  ASSERT_TRUE(m.grow_to(c, 3).ok());
  ASSERT_TRUE(m.prepare_write(c, 2, 3, copies).ok());
  EXPECT_TRUE(copies.empty());
  BlockTable probe2(4);
  EXPECT_EQ(m.match_prefix(probe2, other, 5), 0);
  expect_ok(m, {&a, &b, &c, &probe2});
  m.free(c);
  expect_ok(m, {&a, &b});
  m.free(a);
  m.free(b);
  expect_ok(m, {});
  EXPECT_EQ(m.num_used(), 0);
}

TEST(BlockManager, CopyOnWriteOfAFullSharedBlock) {
  BlockManager m({8, 4, true, {}});
  const auto tokens = iota_tokens(8);
  BlockTable a(4), b(4);
  ASSERT_TRUE(m.grow_to(a, 8).ok());
  m.commit(a, tokens, 8);
  EXPECT_EQ(m.match_prefix(b, tokens, 8), 8);
  // b rolls back into its second (shared, registered) block and rewrites it: copy, and a's
  // registered block keeps its contents and its cache entry.
  m.truncate(b, 6);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.grow_to(b, 8).ok());
  ASSERT_TRUE(m.prepare_write(b, 6, 8, copies).ok());
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.blocks()[1]);
  BlockTable c(4);
  EXPECT_EQ(m.match_prefix(c, tokens, 8), 8);
  EXPECT_EQ(c.blocks()[1], a.blocks()[1]);
  expect_ok(m, {&a, &b, &c});
  for (BlockTable* t : {&a, &b, &c}) m.free(*t);
  expect_ok(m, {});
}

// Random append / fork / truncate / write / free / prefix-match sequences keep every invariant:
// ref counts equal owners, no block in two pools, accounting adds up; and a shared block is never
// handed out for writing.
TEST(BlockManager, RandomOperationsKeepInvariants) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  constexpr int kBlocks = 48, kBlockSize = 4;
  for (int config = 0; config < 3; ++config) {
    const bool caching = config != 0;
    const bool history = config == 2;  // retire into a small int4 history pool
    BlockManager m({kBlocks, kBlockSize, caching, history ? KvTierOptions{6, KvHistory::kInt4} : KvTierOptions{},
                    history ? 20 : 0});
    struct Seq {
      BlockTable table{kBlockSize};
      std::vector<int32_t> tokens;
      int computed = 0;
    };
    std::vector<Seq> seqs(8);
    const auto tables = [&]() {
      std::vector<const BlockTable*> t;
      for (const auto& s : seqs) t.push_back(&s.table);
      return t;
    };
    for (int step = 0; step < 4000; ++step) {
      Seq& s = seqs[rng() % seqs.size()];
      switch (rng() % 6) {
        case 0: {  // append and write a few tokens (tokens from a tiny alphabet: prefixes repeat)
          const int n = 1 + static_cast<int>(rng() % 9);
          const int begin = s.computed;
          const int before_free = m.num_available();
          if (!m.grow_to(s.table, begin + n).ok()) {
            ASSERT_EQ(m.num_available(), before_free) << "seed " << seed;
            break;
          }
          std::vector<BlockCopy> copies;
          if (!m.prepare_write(s.table, begin, begin + n, copies).ok()) {
            m.truncate(s.table, begin);
            break;
          }
          for (int i = 0; i < n; ++i) {
            const int32_t pos_block = (begin + i) / kBlockSize;
            ASSERT_EQ(m.ref_count(s.table.blocks()[static_cast<size_t>(pos_block)]), 1) << "seed " << seed;
          }
          s.tokens.resize(static_cast<size_t>(begin));
          for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 3));
          s.computed = begin + n;
          m.commit(s.table, s.tokens, s.computed);
          break;
        }
        case 1: {  // roll back (never into released history)
          const int first = s.table.first_resident_position();
          if (s.computed < first) break;
          const int keep = first + static_cast<int>(rng() % static_cast<unsigned>(s.computed - first + 1));
          m.truncate(s.table, keep);
          s.computed = keep;
          s.tokens.resize(static_cast<size_t>(keep));
          break;
        }
        case 2: {  // fork into an empty sequence
          Seq& d = seqs[rng() % seqs.size()];
          if (&d != &s && d.table.empty()) {
            m.fork(s.table, d.table);
            d.tokens = s.tokens;
            d.computed = s.computed;
          }
          break;
        }
        case 3:
          m.free(s.table);
          s.tokens.clear();
          s.computed = 0;
          break;
        case 4: {  // a new sequence over a random short prompt, through the prefix cache
          if (!s.table.empty()) break;
          std::vector<int32_t> prompt(1 + rng() % 16);
          for (auto& t : prompt) t = static_cast<int32_t>(rng() % 3);
          const int hit = m.match_prefix(s.table, prompt, static_cast<int>(prompt.size()) - 1);
          ASSERT_EQ(hit % kBlockSize, 0);
          ASSERT_LT(hit, static_cast<int>(prompt.size()));
          s.tokens.assign(prompt.begin(), prompt.begin() + hit);
          s.computed = hit;
          break;
        }
        case 5:
          if (rng() % 50 == 0) m.clear_prefix_cache();
          if (history) {
            m.retire(s.table, s.computed);
            for (const BlockCompression& c : m.take_compressions()) {
              ASSERT_GE(c.src, 0);
              ASSERT_LT(c.dst, m.num_history_blocks());
            }
          } else if (rng() % 4 == 0) {
            m.release_before(s.table, static_cast<int>(rng() % static_cast<unsigned>(s.computed + 1)));
          }
          break;
      }
      const Status st = m.check(tables());
      ASSERT_TRUE(st.ok()) << st.to_string() << " at step " << step << " seed " << seed;
    }
    for (auto& s : seqs) m.free(s.table);
    ASSERT_TRUE(m.check({}).ok());
    EXPECT_EQ(m.num_used(), 0);
    EXPECT_EQ(m.num_history_used(), 0);
    EXPECT_EQ(m.num_free() + m.num_cached(), kBlocks);
  }
}

TEST(BlockManager, ReleasedHistoryGoesBackToThePoolAndStaysHashed) {
  BlockManager m({8, 4, true, {}});
  const auto tokens = iota_tokens(20);
  BlockTable a(4);
  ASSERT_TRUE(m.grow_to(a, 20).ok());
  m.commit(a, tokens, 20);
  const std::vector<int32_t> before = a.blocks();
  m.release_before(a, 9);  // positions 0..7 lie wholly before 9: blocks 0 and 1
  EXPECT_EQ(a.num_released(), 2);
  EXPECT_EQ(a.first_resident_position(), 8);
  EXPECT_EQ(a.num_resident(), 3);
  EXPECT_EQ(a.blocks()[0], kReleasedBlock);
  EXPECT_EQ(a.blocks()[1], kReleasedBlock);
  EXPECT_EQ(a.blocks()[2], before[2]);
  EXPECT_EQ(a.slot(8), before[2] * 4);
  EXPECT_EQ(a.block_hashes().size(), 5u);  // the hash chain continues past released blocks
  EXPECT_EQ(m.num_cached(), 2);             // registered: reusable by a later prompt
  EXPECT_EQ(m.num_used(), 3);
  expect_ok(m, {&a});
  // Releasing again, or less, changes nothing.
  m.release_before(a, 4);
  EXPECT_EQ(a.num_released(), 2);
  // The same prompt again finds the released blocks in the prefix cache.
  BlockTable b(4);
  EXPECT_EQ(m.match_prefix(b, tokens, 19), 16);
  EXPECT_EQ(b.blocks()[0], before[0]);
  EXPECT_EQ(m.num_cached(), 0);
  // A fork shares only what is resident.
  m.free(b);
  BlockTable c(4);
  m.fork(a, c);
  EXPECT_EQ(c.num_released(), 2);
  EXPECT_EQ(m.ref_count(before[2]), 2);
  expect_ok(m, {&a, &c});
  // Growing and writing go on after the released entries; truncation stops at the first resident position.
  ASSERT_TRUE(m.grow_to(a, 24).ok());
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.prepare_write(a, 20, 24, copies).ok());
  m.truncate(a, 8);
  EXPECT_EQ(a.num_tokens(), 8);
  EXPECT_EQ(a.num_resident(), 0);
  expect_ok(m, {&a, &c});
  m.free(a);
  m.free(c);
  expect_ok(m, {});
  EXPECT_EQ(m.num_used(), 0);
  EXPECT_EQ(m.num_free() + m.num_cached(), 8);
}

TEST(BlockManager, ReleaseBeforeGrowsAShortTableWithReleasedEntries) {
  BlockManager m({4, 4, false, {}});
  BlockTable t(4);
  m.release_before(t, 10);  // an adopted sequence whose K/V start at position 8
  EXPECT_EQ(t.num_released(), 2);
  EXPECT_EQ(t.num_tokens(), 8);
  EXPECT_EQ(m.num_used(), 0);
  ASSERT_TRUE(m.grow_to(t, 12).ok());
  EXPECT_EQ(t.num_resident(), 1);
  EXPECT_EQ(m.num_used(), 1);
  expect_ok(m, {&t});
  m.free(t);
  EXPECT_EQ(m.num_free(), 4);
}

TEST(BlockManager, RetireDropsWhatTheWindowNoLongerSees) {
  BlockManager m({16, 4, false, KvTierOptions{6, KvHistory::kDrop}});
  BlockTable t(4);
  ASSERT_TRUE(m.grow_to(t, 20).ok());
  // The next query (position 20) sees keys 15..20: blocks [0,4) [4,8) [8,12) go.
  m.retire(t, 20);
  EXPECT_EQ(t.num_released(), 3);
  EXPECT_EQ(m.num_used(), 2);
  // Without the drop tier nothing is retired.
  BlockManager same({16, 4, false, KvTierOptions{6, KvHistory::kSame}});
  BlockTable u(4);
  ASSERT_TRUE(same.grow_to(u, 20).ok());
  same.retire(u, 20);
  EXPECT_EQ(u.num_released(), 0);
  // A decode that runs on and on holds about the window's blocks.
  for (int n = 20; n < 400; ++n) {
    ASSERT_TRUE(m.grow_to(t, n + 1).ok()) << n;
    m.retire(t, n + 1);
    ASSERT_LE(t.num_resident(), (6 + 4 - 2) / 4 + 2) << n;
    expect_ok(m, {&t});
  }
  m.free(t);
  EXPECT_EQ(m.num_free(), 16);
}

TEST(BlockManager, RetireMovesBlocksIntoHistoryWhileThePoolHasRoom) {
  BlockManager m({8, 4, true, KvTierOptions{4, KvHistory::kInt4}, 3});
  const auto tokens = iota_tokens(20);
  BlockTable t(4);
  ASSERT_TRUE(m.grow_to(t, 20).ok());
  m.commit(t, tokens, 20);
  const std::vector<int32_t> before = t.blocks();
  // The next query (position 20) sees keys 17..20: blocks [0, 16) leave, but the pool holds 3.
  m.retire(t, 20);
  EXPECT_EQ(t.num_history(), 3);
  EXPECT_EQ(t.num_released(), 0);
  EXPECT_EQ(t.first_known_position(), 0);
  EXPECT_EQ(t.first_resident_position(), 12);
  EXPECT_EQ(m.num_history_used(), 3);
  EXPECT_EQ(m.num_used(), 2);
  EXPECT_EQ(m.num_cached(), 3);  // the full-precision copies stay reusable by a later prompt
  const std::vector<BlockCompression> moves = m.take_compressions();
  ASSERT_EQ(moves.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(moves[static_cast<size_t>(i)].src, before[static_cast<size_t>(i)]);
    EXPECT_EQ(t.blocks()[static_cast<size_t>(i)], m.num_blocks() + moves[static_cast<size_t>(i)].dst);
  }
  EXPECT_FALSE(m.has_compressions());
  expect_ok(m, {&t});
  // Nothing new to move until the pool has room.
  ASSERT_TRUE(m.grow_to(t, 21).ok());
  m.retire(t, 21);
  EXPECT_FALSE(m.has_compressions());
  // A fork shares the history blocks; freeing both gives everything back.
  BlockTable u(4);
  m.fork(t, u);
  EXPECT_EQ(u.num_history(), 3);
  expect_ok(m, {&t, &u});
  m.free(t);
  EXPECT_EQ(m.num_history_used(), 3);
  m.free(u);
  EXPECT_EQ(m.num_history_used(), 0);
  expect_ok(m, {});
  // Now the pool has room again: a new table's blocks move.
  BlockTable w(4);
  ASSERT_TRUE(m.grow_to(w, 12).ok());
  m.retire(w, 12);
  EXPECT_EQ(w.num_history(), 2);
  EXPECT_EQ(m.take_compressions().size(), 2u);
  m.free(w);
  expect_ok(m, {});
}

TEST(KvCache, SizesFromBudgetAndCopiesBlocks) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 16;
  EXPECT_EQ(c.bytes_per_token(), 2u * 2 * 2 * 8 * 4);
  c.num_blocks = c.blocks_for_budget(10 * c.bytes_per_block() + 1);
  EXPECT_EQ(c.num_blocks, 10);
  auto cache = KvCache::create(c);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->layer(1).k.shape(), (std::vector<int64_t>{10, 16, 2, 8}));
  const int64_t per_block = 16 * 2 * 8;
  for (int l = 0; l < 2; ++l) {
    for (int64_t i = 0; i < 10 * per_block; ++i) {
      cache->layer(l).k.data<float>()[i] = static_cast<float>(i + l * 100000);
      cache->layer(l).v.data<float>()[i] = -static_cast<float>(i + l * 100000);
    }
  }
  const std::vector<BlockCopy> copies = {{3, 7}, {0, 1}};
  cache->copy_blocks(copies);
  for (int l = 0; l < 2; ++l) {
    for (const BlockCopy& cp : copies) {
      for (int64_t i = 0; i < per_block; ++i) {
        ASSERT_EQ(cache->layer(l).k.data<float>()[cp.dst * per_block + i], cache->layer(l).k.data<float>()[cp.src * per_block + i]);
        ASSERT_EQ(cache->layer(l).v.data<float>()[cp.dst * per_block + i], cache->layer(l).v.data<float>()[cp.src * per_block + i]);
      }
    }
    EXPECT_EQ(cache->layer(l).k.data<float>()[2 * per_block], static_cast<float>(2 * per_block + l * 100000));
  }
  c.num_blocks = 0;
  EXPECT_FALSE(KvCache::create(c).ok());
}

// History pools and key bounds: what nbytes() counts is what the layers hold, for int8 and int4
// history, with and without bounds, at a head_dim that fills its last bound group and one that
// does not (an int4 row of 128 takes 68 bytes, the bounds 160 per block and kv head).
TEST(KvCache, HistoryBytesAreWhatTheLayersHold) {
  for (KvHistory history : {KvHistory::kInt8, KvHistory::kInt4}) {
    for (bool bounds : {false, true}) {
      for (int head_dim : {128, 80}) {
        KvCacheConfig c;
        c.num_layers = 2;
        c.num_kv_heads = 3;
        c.head_dim = head_dim;
        c.block_size = 16;
        c.dtype = DType::kBF16;
        c.num_blocks = 4;
        c.tiers = KvTierOptions{64, history};
        c.num_history_blocks = 7;
        c.key_bounds = bounds;
        auto cache = KvCache::create(c);
        ASSERT_TRUE(cache.ok()) << cache.status().to_string();
        size_t held = 0;
        for (int l = 0; l < c.num_layers; ++l) {
          const KvLayer& layer = cache->layer(l);
          for (const Tensor* t : {&layer.k, &layer.v, &layer.hk, &layer.hv, &layer.hk_params, &layer.hv_params,
                                  &layer.kbounds, &layer.kbound_params}) {
            if (t->defined()) held += t->nbytes();
          }
        }
        EXPECT_EQ(cache->nbytes(), held) << kv_history_name(history) << " bounds " << bounds << " hd " << head_dim;
        if (history == KvHistory::kInt4 && head_dim == 128) {
          const size_t row = 68, bound = bounds ? 160 : 0;
          EXPECT_EQ(c.bytes_per_history_block(), 2u * 3 * (2 * 16 * row + bound));
        }
      }
    }
  }
}

// A quantized cache: a scale per (slot, kv head) beside the codes, counted in its bytes, and
// moved with them by block and slot copies.
TEST(KvCache, QuantizedPoolsCarryTheirScales) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    KvCacheConfig c;
    c.num_layers = 2;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.block_size = 4;
    c.dtype = dtype;
    EXPECT_EQ(c.bytes_per_token(), 2u * 2 * 2 * (8 * 1 + 4));
    c.num_blocks = 5;
    auto cache = KvCache::create(c);
    ASSERT_TRUE(cache.ok());
    EXPECT_EQ(cache->layer(0).k_scales.shape(), (std::vector<int64_t>{5, 4, 2, 1}));
    ASSERT_EQ(cache->pools(1).size(), 4u);
    for (int l = 0; l < 2; ++l) {
      int p = 0;
      for (Tensor* t : cache->pools(l)) {
        auto* bytes = static_cast<uint8_t*>(t->raw_data());
        for (size_t i = 0; i < t->nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + p * 31 + l * 3);
        ++p;
      }
    }
    const auto snapshot = [&] {
      std::vector<std::vector<uint8_t>> out;
      for (int l = 0; l < 2; ++l) {
        for (Tensor* t : cache->pools(l)) {
          const auto* b = static_cast<const uint8_t*>(t->raw_data());
          out.emplace_back(b, b + t->nbytes());
        }
      }
      return out;
    };
    const auto before = snapshot();
    cache->copy_blocks(std::vector<BlockCopy>{{1, 3}});
    cache->copy_slots(std::vector<SlotCopy>{{2, 17}});  // slot 2 (block 0) to slot 17 (block 4)
    const auto after = snapshot();
    size_t pool = 0;
    for (int l = 0; l < 2; ++l) {
      for (Tensor* t : cache->pools(l)) {
        const size_t slot_bytes = t->nbytes() / (5 * 4);
        for (size_t i = 0; i < t->nbytes(); ++i) {
          const size_t slot = i / slot_bytes, in_slot = i % slot_bytes;
          size_t src = i;
          if (slot / 4 == 3) src = (4 + slot % 4) * slot_bytes + in_slot;  // block 3 <- block 1
          if (slot == 17) src = 2 * slot_bytes + in_slot;
          ASSERT_EQ(after[pool][i], before[pool][src]) << dtype_name(dtype) << " layer " << l << " pool " << pool;
        }
        ++pool;
      }
    }
  }
  KvCacheConfig bad;
  bad.num_layers = bad.num_kv_heads = bad.head_dim = bad.num_blocks = 1;
  bad.dtype = DType::kI32;
  EXPECT_FALSE(KvCache::create(bad).ok());
}

}  // namespace
}  // namespace tachyon
