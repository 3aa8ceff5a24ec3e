// The router's pure decisions (router_policy.h): which decode and prefill worker take a request,
// when a request is held (rate matching) and when it is refused.
#include <vector>

#include <gtest/gtest.h>

#include "router/router_policy.h"

namespace tachyon::router {
namespace {

WorkerState up(int free, int total, int waiting = 0, int pending = 0, int assigned = 0) {
  WorkerState w;
  w.up = true;
  w.kv_blocks_free = free;
  w.kv_blocks_total = total;
  w.num_waiting = waiting;
  w.pending = pending;
  w.assigned = assigned;
  return w;
}

TEST(RouterPolicy, DecodePrefersTheShortestQueueThenTheMostFreeKv) {
  const RatePolicy policy;
  std::vector<WorkerState> w = {up(50, 100, 2), up(10, 100, 1), up(90, 100, 1)};
  WorkerPick p = pick_decode_worker(w, policy);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 2u);  // queue 1 ties with worker 1; more free blocks wins
  // The router's own sends since the last report count as queue.
  w[2].assigned = 3;
  p = pick_decode_worker(w, policy);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 1u);
  // Free KV as a fraction of each cache: 40 of 400 is less room than 30 of 60.
  std::vector<WorkerState> sizes = {up(40, 400), up(30, 60)};
  p = pick_decode_worker(sizes, policy);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 1u);
  // Ties everywhere: the lowest index.
  std::vector<WorkerState> same = {up(5, 10), up(5, 10)};
  EXPECT_EQ(pick_decode_worker(same, policy).index, 0u);
}

TEST(RouterPolicy, DownAndExcludedDecodeWorkersAreSkipped) {
  const RatePolicy policy;
  std::vector<WorkerState> w = {up(90, 100), up(50, 100)};
  w[0].up = false;
  WorkerPick p = pick_decode_worker(w, policy);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 1u);
  const std::vector<size_t> exclude = {1};
  EXPECT_EQ(pick_decode_worker(w, policy, exclude).kind, Pick::kNoneUp);
  w[1].up = false;
  EXPECT_EQ(pick_decode_worker(w, policy).kind, Pick::kNoneUp);
  EXPECT_EQ(pick_decode_worker({}, policy).kind, Pick::kNoneUp);
}

TEST(RouterPolicy, BusyDecodeWorkersHoldThenRefuseNewRequests) {
  RatePolicy policy;
  policy.max_decode_queue = 4;
  policy.min_decode_free_kv = 0.1;
  policy.max_held = 2;
  // One with a full queue (waiting + pending transfers + assigned), one nearly out of KV blocks.
  std::vector<WorkerState> w = {up(80, 100, 1, 2, 1), up(9, 100)};
  EXPECT_TRUE(decode_busy(w[0], policy));
  EXPECT_EQ(decode_queue(w[0]), 4);
  EXPECT_TRUE(decode_busy(w[1], policy));
  const WorkerPick p = pick_decode_worker(w, policy);
  EXPECT_EQ(p.kind, Pick::kAllBusy);
  EXPECT_EQ(admit(p.kind, 0, policy), Admission::kHold);
  EXPECT_EQ(admit(p.kind, 1, policy), Admission::kHold);
  EXPECT_EQ(admit(p.kind, 2, policy), Admission::kRefuse);  // the held queue is bounded
  // Room again on one of them: new requests start.
  w[1].kv_blocks_free = 10;
  const WorkerPick again = pick_decode_worker(w, policy);
  ASSERT_EQ(again.kind, Pick::kChosen);
  EXPECT_EQ(again.index, 1u);
  EXPECT_EQ(admit(again.kind, 2, policy), Admission::kStart);
  // Nobody up: refused at once, never held.
  EXPECT_EQ(admit(Pick::kNoneUp, 0, policy), Admission::kRefuse);
  // A worker with no cache reported yet has no room.
  EXPECT_TRUE(decode_busy(up(0, 0), policy));
}

TEST(RouterPolicy, PrefillPrefersTheShortestQueue) {
  std::vector<WorkerState> w = {up(0, 10, 3), up(0, 10, 1), up(0, 10, 1)};
  w[1].num_running = 2;
  WorkerPick p = pick_prefill_worker(w);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 2u);
  const std::vector<size_t> exclude = {2};
  p = pick_prefill_worker(w, exclude);
  ASSERT_EQ(p.kind, Pick::kChosen);
  EXPECT_EQ(p.index, 0u);  // queue 3 vs 3: the lower index
  for (auto& s : w) s.up = false;
  EXPECT_EQ(pick_prefill_worker(w).kind, Pick::kNoneUp);
}

}  // namespace
}  // namespace tachyon::router
