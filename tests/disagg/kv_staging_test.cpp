// The KV staging pool's range allocator (first fit, merging on return, exhaustion), and the region
// message that names K/V left in device memory: round trip, corruption, and the header flag.
#include <random>

#include <gtest/gtest.h>

#include "disagg/kv_staging.h"
#include "disagg/kv_transfer.h"
#include "test_util.h"

namespace tachyon::disagg {
namespace {

TEST(RangeAllocator, FirstFitMergesAndRunsOut) {
  RangeAllocator a(4096, 256);
  EXPECT_EQ(a.take(0), std::nullopt);
  const auto x = a.take(100), y = a.take(256), z = a.take(1000);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 256u);   // 100 rounds up to 256
  EXPECT_EQ(*z, 512u);
  EXPECT_EQ(a.free_bytes(), 4096u - 256 - 256 - 1024);
  EXPECT_EQ(a.take(4096), std::nullopt);
  a.give_back(*y);
  EXPECT_EQ(a.take(300), std::optional<size_t>(1536)) << "the hole at 256 is too small for 512";
  EXPECT_EQ(a.take(200), std::optional<size_t>(256)) << "first fit takes the hole";
  a.give_back(*x);
  a.give_back(256);
  a.give_back(*z);
  a.give_back(1536);
  a.give_back(12345);  // not taken: ignored
  EXPECT_EQ(a.free_bytes(), 4096u);
  EXPECT_EQ(a.take(4096), std::optional<size_t>(0)) << "every hole merged back into one";
}

TEST(RangeAllocator, RandomTakesAndReturnsNeverOverlap) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  RangeAllocator a(1 << 20, 256);
  std::map<size_t, size_t> live;  // offset -> rounded length
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = 1 + rng() % 40000;
      const auto at = a.take(bytes);
      if (!at) continue;
      EXPECT_EQ(*at % 256, 0u);
      const size_t len = (bytes + 255) / 256 * 256;
      auto next = live.lower_bound(*at);
      if (next != live.end()) EXPECT_LE(*at + len, next->first);
      if (next != live.begin()) EXPECT_LE(std::prev(next)->first + std::prev(next)->second, *at);
      EXPECT_LE(*at + len, size_t{1} << 20);
      live.emplace(*at, len);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.give_back(it->first);
      live.erase(it);
    }
    size_t used = 0;
    for (const auto& [o, l] : live) used += l;
    ASSERT_EQ(a.free_bytes() + used, size_t{1} << 20);
  }
}

TEST(KvStagingPool, RegionsComeBackWhenTheLastCopyGoes) {
  std::vector<uint8_t> memory(1 << 16);
  int released = 0;
  std::optional<KvDeviceRegion> kept;
  {
    KvStagingPool pool(Device::cpu(), memory.data(), memory.size(), {9, 9}, [&] { ++released; });
    auto r = pool.take(1000);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->data, memory.data());
    EXPECT_EQ(r->bytes, 1000u);
    EXPECT_EQ(r->handle, (std::vector<uint8_t>{9, 9}));
    EXPECT_LT(pool.free_bytes(), pool.size());
    KvDeviceRegion copy = *r;  // shares the lease
    r.reset();
    EXPECT_LT(pool.free_bytes(), pool.size());
    copy = KvDeviceRegion{};
    EXPECT_EQ(pool.free_bytes(), pool.size());
    EXPECT_FALSE(pool.take(memory.size() + 1));
    kept = pool.take(10);
  }
  EXPECT_EQ(released, 0) << "a region outlives its pool object and keeps the memory";
  kept.reset();
  EXPECT_EQ(released, 1);
  // Without a GPU there is no shareable device memory.
  EXPECT_EQ(KvStagingPool::create(Device::cpu(), 1 << 20).status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(map_device_region(Device::cpu(), std::vector<uint8_t>(64), 0, 16).status().code(), ErrorCode::kUnsupported);
}

TEST(KvRegionMessage, RoundTripAndCorruption) {
  KvDeviceRegion region;
  region.handle = std::vector<uint8_t>(64, 0xab);
  region.offset = 123456;
  region.bytes = 7890;
  const std::vector<uint8_t> m = encode_kv_region(region, 77);
  auto back = decode_kv_region(m, 77);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->handle, region.handle);
  EXPECT_EQ(back->offset, region.offset);
  EXPECT_EQ(back->bytes, region.bytes);
  EXPECT_EQ(decode_kv_region(m, 78).status().code(), ErrorCode::kCorruptFile) << "another transfer's";
  for (size_t i = 0; i < m.size(); ++i) {
    std::vector<uint8_t> bad = m;
    bad[i] ^= 0x10;
    EXPECT_EQ(decode_kv_region(bad, 77).status().code(), ErrorCode::kCorruptFile) << "byte " << i;
  }
  EXPECT_EQ(decode_kv_region(std::span<const uint8_t>(m).first(10), 77).status().code(), ErrorCode::kCorruptFile);
}

TEST(KvRegionMessage, HeaderFlagsTheRegionAndChecksItsSize) {
  KvExport kv;
  kv.num_layers = 3;
  kv.num_kv_heads = 2;
  kv.head_dim = 8;
  kv.dtype = DType::kF32;
  kv.vocab_size = 100;
  kv.block_size = 16;
  kv.tokens = {5, 6, 7, 8};
  kv.num_prompt_tokens = 3;
  kv.num_computed = 3;
  KvDeviceRegion region;
  region.handle = {1, 2, 3};
  region.bytes = kv.layer_bytes() * 3;
  kv.device = region;
  auto header = encode_kv_header(kv, 5);
  ASSERT_TRUE(header.ok()) << header.status().to_string();
  auto decoded = decode_kv_header(*header, KvWireLimits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_TRUE(decoded->device_region);
  EXPECT_EQ(decoded->layer_bytes, std::vector<uint64_t>(3, kv.layer_bytes()));
  // A region of the wrong size, or host layers beside it, is the sender's bug.
  kv.device->bytes -= 1;
  EXPECT_EQ(encode_kv_header(kv, 5).status().code(), ErrorCode::kInvalidArgument);
  kv.device->bytes += 1;
  kv.layers.resize(3);
  EXPECT_EQ(encode_kv_header(kv, 5).status().code(), ErrorCode::kInvalidArgument);
  // The receiver checks the region message's size against the header.
  kv.layers.clear();
  auto [send_end, receive_end] = make_local_transport_pair();
  ASSERT_TRUE(send_end->send(*header, Millis(100)).ok());
  KvDeviceRegion wrong = region;
  wrong.bytes += 256;
  ASSERT_TRUE(send_end->send(encode_kv_region(wrong, 5), Millis(100)).ok());
  KvReceiveOptions o;
  o.wait_timeout = Millis(1000);
  o.map_region = [](std::span<const uint8_t>, uint64_t, uint64_t) -> Result<KvDeviceRegion> {
    ADD_FAILURE() << "a region of the wrong size must not be mapped";
    return KvDeviceRegion{};
  };
  auto r = receive_kv(*receive_end, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruptFile) << r.status().to_string();
}

}  // namespace
}  // namespace tachyon::disagg
