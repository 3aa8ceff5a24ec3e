#include <random>
#include <set>

#include <gtest/gtest.h>

#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace tachyon {
namespace {

TEST(BlockAllocator, AllOrNothing) {
  BlockAllocator a(4);
  auto three = a.allocate(3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(a.num_free(), 1);
  auto two = a.allocate(2);
  EXPECT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(a.num_free(), 1);  // nothing taken by the failed request
  for (int32_t b : *three) a.release(b);
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockTable, GrowTruncateAndSlots) {
  BlockAllocator a(8);
  BlockTable t(16);
  ASSERT_TRUE(t.grow_to(17, a).ok());
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(t.slot(16), t.blocks()[1] * 16);
  EXPECT_EQ(t.slot(5), t.blocks()[0] * 16 + 5);
  t.truncate(16, a);
  EXPECT_EQ(t.blocks().size(), 1u);
  EXPECT_EQ(a.num_free(), 7);
  EXPECT_FALSE(t.grow_to(16 * 9, a).ok());  // needs 8 more, 7 free
  EXPECT_EQ(t.num_tokens(), 16);
  EXPECT_EQ(a.num_free(), 7);
  t.release_all(a);
  EXPECT_EQ(a.num_free(), 8);
}

// Random grow / truncate / share / release sequences keep the invariants: every block is
// either free or referenced exactly as often as tables hold it, and accounting adds up.
TEST(BlockTable, RandomOperationsKeepInvariants) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  constexpr int kBlocks = 64;
  BlockAllocator a(kBlocks);
  std::vector<BlockTable> tables(6, BlockTable(4));
  std::vector<std::vector<int32_t>> extra_refs(6);  // blocks retained as "shared" by table i
  for (int step = 0; step < 5000; ++step) {
    const size_t i = rng() % tables.size();
    switch (rng() % 4) {
      case 0: {
        const int target = tables[i].num_tokens() + static_cast<int>(rng() % 20);
        const int before_free = a.num_free();
        const Status s = tables[i].grow_to(target, a);
        if (!s.ok()) {
          ASSERT_EQ(a.num_free(), before_free) << "seed " << seed;
        }
        break;
      }
      case 1: tables[i].truncate(static_cast<int>(rng() % (tables[i].num_tokens() + 1)), a); break;
      case 2:
        if (!tables[i].blocks().empty()) {
          const int32_t b = tables[i].blocks()[rng() % tables[i].blocks().size()];
          a.retain(b);
          extra_refs[i].push_back(b);
        }
        break;
      case 3:
        for (int32_t b : extra_refs[i]) a.release(b);
        extra_refs[i].clear();
        break;
    }
    std::vector<int> expected(kBlocks, 0);
    for (size_t t = 0; t < tables.size(); ++t) {
      ASSERT_EQ(tables[t].blocks().size(), static_cast<size_t>((tables[t].num_tokens() + 3) / 4)) << "seed " << seed;
      for (int32_t b : tables[t].blocks()) expected[static_cast<size_t>(b)]++;
      for (int32_t b : extra_refs[t]) expected[static_cast<size_t>(b)]++;
    }
    int used = 0;
    for (int b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(a.ref_count(b), expected[static_cast<size_t>(b)]) << "block " << b << " seed " << seed;
      used += expected[static_cast<size_t>(b)] > 0;
    }
    ASSERT_EQ(a.num_used(), used) << "seed " << seed;
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    tables[t].release_all(a);
    for (int32_t b : extra_refs[t]) a.release(b);
  }
  EXPECT_EQ(a.num_free(), kBlocks);
}

TEST(KvCache, SizesFromBudget) {
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
  EXPECT_EQ(cache->k(1).shape(), (std::vector<int64_t>{10, 16, 2, 8}));
  c.num_blocks = 0;
  EXPECT_FALSE(KvCache::create(c).ok());
}

}  // namespace
}  // namespace tachyon
