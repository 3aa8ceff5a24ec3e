// The scheduler without a model: a driver plays the engine (runs every planned chunk, appends a
// token to sequences whose chunk samples, finishes them after a fixed number of tokens) and
// checks the policy and the block accounting after every step.
#include <algorithm>
#include <map>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "sched/scheduler.h"
#include "test_util.h"

namespace tachyon {
namespace {

struct Driver {
  BlockManager blocks;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::map<uint64_t, int> max_new;  // tokens to generate per sequence
  std::vector<SchedulerStep> history;
  int64_t total_preempted = 0;

  Driver(BlockManagerOptions b, SchedulerOptions s) : blocks(b), scheduler(s, blocks) {}

  Sequence* add(int prompt_len, int new_tokens, int32_t first_token = 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (int i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = first_token + i;
    auto seq = std::make_unique<Sequence>(seqs.size() + 1, std::move(prompt), blocks.block_size());
    const Status s = scheduler.add(seq.get());
    EXPECT_TRUE(s.ok()) << s.to_string();
    max_new[seq->id()] = new_tokens;
    seqs.push_back(std::move(seq));
    return seqs.back().get();
  }

  std::vector<const BlockTable*> live_tables() const {
    std::vector<const BlockTable*> t;
    for (const auto& s : seqs) {
      if (!s->finished()) t.push_back(&s->block_table());
    }
    return t;
  }

  // One engine step; checks the plan against the options and the invariants.
  SchedulerStep step() {
    SchedulerStep plan = scheduler.schedule();
    const SchedulerOptions& o = scheduler.options();
    EXPECT_LE(plan.num_tokens, o.max_batched_tokens);
    EXPECT_LE(scheduler.num_running(), o.max_seqs);
    bool seen_prefill = false;
    for (const auto& c : plan.chunks) {
      EXPECT_EQ(c.start, c.seq->num_computed());
      EXPECT_GE(c.seq->block_table().num_tokens(), c.start + c.num_tokens);
      EXPECT_EQ(c.sample, c.start + c.num_tokens == c.seq->num_tokens());
      const bool decode = c.seq->state() == SequenceState::kDecoding;
      if (decode) {
        EXPECT_FALSE(seen_prefill) << "a decode after a prefill chunk";
      }
      seen_prefill |= !decode;
      if (!o.chunked_prefill && !decode) {
        EXPECT_TRUE(c.sample) << "an unchunked prompt split";
      }
    }
    total_preempted += static_cast<int64_t>(plan.preempted.size());
    scheduler.complete(plan);
    for (const auto& c : plan.chunks) {
      if (!c.sample) continue;
      Sequence* s = c.seq;
      s->append_token(static_cast<int32_t>(1000 + s->num_generated()));
      if (s->num_generated() >= max_new[s->id()]) scheduler.finish(s);
    }
    const Status st = blocks.check(live_tables());
    EXPECT_TRUE(st.ok()) << st.to_string();
    history.push_back(plan);
    return plan;
  }

  int run(int max_steps = 100000) {
    int steps = 0;
    while (!scheduler.idle() && steps < max_steps) {
      step();
      ++steps;
    }
    EXPECT_TRUE(scheduler.idle()) << "still busy after " << steps << " steps";
    return steps;
  }
};

TEST(Scheduler, DecodesKeepFlowingWhileALongPromptIsChunked) {
  Driver d({256, 16, false, {}}, {64, 16, true});
  Sequence* a = d.add(10, 40);
  d.step();  // a's prompt in one chunk
  EXPECT_EQ(a->state(), SequenceState::kDecoding);
  Sequence* b = d.add(300, 4);  // needs 300 / (64 - 1) -> 5 steps of chunks
  int chunks_of_b = 0;
  for (int i = 0; i < 5; ++i) {
    const SchedulerStep p = d.step();
    ASSERT_GE(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].seq, a) << "the decode goes first";
    EXPECT_EQ(p.chunks[0].num_tokens, 1);
    if (p.chunks.size() > 1) {
      EXPECT_EQ(p.chunks[1].seq, b);
      EXPECT_LE(p.num_tokens, 64);
      ++chunks_of_b;
    }
  }
  EXPECT_EQ(chunks_of_b, 5);
  EXPECT_EQ(b->num_generated(), 1);
  d.run();
  EXPECT_EQ(a->num_generated(), 40);
  EXPECT_EQ(d.blocks.num_used(), 0);
}

TEST(Scheduler, WithoutChunkingAPromptRunsWhole) {
  Driver d({256, 16, false, {}}, {300, 16, false});
  Sequence* a = d.add(10, 30);
  d.step();
  Sequence* b = d.add(295, 2);  // does not fit next to a's decode token + budget? 1 + 295 <= 300: fits
  Sequence* c = d.add(200, 2);  // 1 + 295 + 200 > 300: waits a step
  SchedulerStep p = d.step();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[1].seq, b);
  EXPECT_EQ(p.chunks[1].num_tokens, 295);
  p = d.step();
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[2].seq, c);
  EXPECT_EQ(p.chunks[2].num_tokens, 200);
  d.run();
  EXPECT_EQ(a->num_generated(), 30);
  Driver e({256, 16, false, {}}, {100, 16, false});
  std::vector<int32_t> long_prompt(101, 1);
  Sequence too_long(99, long_prompt, 16);
  EXPECT_EQ(e.scheduler.add(&too_long).code(), ErrorCode::kOutOfRange);
}

TEST(Scheduler, AdmitsInArrivalOrderUpToTheSequenceLimit) {
  Driver d({256, 16, false, {}}, {1000, 3, true});
  std::vector<Sequence*> s;
  for (int i = 0; i < 6; ++i) s.push_back(d.add(5 + i, 3));
  SchedulerStep p = d.step();
  ASSERT_EQ(p.chunks.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.chunks[static_cast<size_t>(i)].seq, s[static_cast<size_t>(i)]);
  EXPECT_EQ(d.scheduler.num_waiting(), 3);
  d.run();
  for (Sequence* q : s) EXPECT_EQ(q->num_generated(), 3);
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOutAndResumesIt) {
  // 12 blocks of 4 tokens = 48 tokens for three sequences that each grow to 8 + 20 = 28.
  Driver d({12, 4, false, {}}, {64, 8, true});
  Sequence* a = d.add(8, 20, 0);
  Sequence* b = d.add(8, 20, 100);
  Sequence* c = d.add(8, 20, 200);
  bool first_victim_checked = false;
  while (!d.scheduler.idle()) {
    const SchedulerStep p = d.step();
    if (!p.preempted.empty() && !first_victim_checked) {
      EXPECT_EQ(p.preempted[0], c) << "the newest goes first";
      first_victim_checked = true;
    }
    ASSERT_LT(d.history.size(), 1000u);
  }
  EXPECT_TRUE(first_victim_checked);
  EXPECT_GT(d.scheduler.num_preemptions(), 0);
  for (Sequence* s : {a, b, c}) {
    EXPECT_EQ(s->num_generated(), 20);
    // The tokens are what the driver appended in order: a resumed sequence lost nothing.
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s->generated()[static_cast<size_t>(i)], 1000 + i);
  }
  EXPECT_EQ(d.blocks.num_used(), 0);
  EXPECT_EQ(d.blocks.num_free(), 12);
}

TEST(Scheduler, PrefixCacheServesARepeatedPromptAndAPreemptedResume) {
  Driver d({64, 4, true, {}}, {64, 8, true});
  Sequence* a = d.add(18, 3);
  d.run();
  Sequence* b = d.add(18, 3);  // same tokens as a
  d.step();
  EXPECT_EQ(b->num_cached_prompt_tokens(), 16);  // four full blocks; the last token is recomputed
  d.run();
  EXPECT_EQ(a->num_generated(), 3);
  EXPECT_EQ(d.blocks.prefix_stats().hit_tokens, 16);
  EXPECT_EQ(d.blocks.prefix_stats().query_tokens, 36);
  EXPECT_EQ(d.blocks.num_used(), 0);
}

TEST(Scheduler, FinishingFromAnyStateFreesEverything) {
  Driver d({32, 4, true, {}}, {8, 8, true});
  Sequence* decoding = d.add(3, 100);
  d.step();
  Sequence* prefilling = d.add(40, 100);
  Sequence* waiting = d.add(10, 100);
  d.step();
  EXPECT_EQ(decoding->state(), SequenceState::kDecoding);
  EXPECT_EQ(prefilling->state(), SequenceState::kPrefilling);
  EXPECT_EQ(waiting->state(), SequenceState::kWaiting);
  for (Sequence* s : {waiting, prefilling, decoding}) {
    d.scheduler.finish(s);
    EXPECT_EQ(s->state(), SequenceState::kFinished);
    EXPECT_TRUE(d.blocks.check(d.live_tables()).ok());
  }
  EXPECT_TRUE(d.scheduler.idle());
  EXPECT_EQ(d.blocks.num_used(), 0);
}

// Random arrivals, lengths and aborts under a tight cache: every sequence ends with all its
// tokens or is aborted, the policy holds at every step (checked by the driver) and no block leaks.
TEST(Scheduler, RandomWorkloadsNeverLeakOrStall) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  int64_t preemptions = 0;
  for (int round = 0; round < 20; ++round) {
    const bool chunked = rng() % 2 == 0, caching = rng() % 2 == 0;
    const int block_size = 1 + static_cast<int>(rng() % 8);
    const int num_blocks = 60 / block_size + 8;
    const int capacity = num_blocks * block_size;
    Driver d({num_blocks, block_size, caching, {}},
             {chunked ? 8 + static_cast<int>(rng() % 40) : capacity, 1 + static_cast<int>(rng() % 6), chunked});
    int added = 0;
    for (int step = 0; step < 3000 && (added < 30 || !d.scheduler.idle()); ++step) {
      if (added < 30 && rng() % 3 == 0) {
        const int prompt = 1 + static_cast<int>(rng() % static_cast<unsigned>(capacity / 3));
        d.add(prompt, 1 + static_cast<int>(rng() % static_cast<unsigned>(capacity / 3)), static_cast<int32_t>(rng() % 3));
        ++added;
      }
      if (rng() % 40 == 0 && !d.seqs.empty()) {
        Sequence* victim = d.seqs[rng() % d.seqs.size()].get();
        d.scheduler.finish(victim);
      }
      if (!d.scheduler.idle()) d.step();
      ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed << " round " << round;
    }
    ASSERT_TRUE(d.scheduler.idle()) << "stalled; seed " << seed << " round " << round;
    preemptions += d.scheduler.num_preemptions();
    EXPECT_EQ(d.blocks.num_used(), 0);
    for (const auto& s : d.seqs) EXPECT_TRUE(s->finished());
  }
  EXPECT_GT(preemptions, 0) << "the workloads never filled the cache; seed " << seed;
}

// With dropped history (a sliding window), or history moved into a pool of int4 blocks large
// enough for it, sequences far longer than the full-precision cache run to the end, each holding
// about its window's blocks, and every block (and history block) comes back.
class SchedulerTiers : public ::testing::TestWithParam<KvHistory> {};

TEST_P(SchedulerTiers, SequencesLongerThanTheFullPrecisionCacheRun) {
  const KvHistory mode = GetParam();
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  int64_t longest_overall = 0;  // the longest sequence's tokens per 1000 tokens of the cache
  for (int round = 0; round < 12; ++round) {
    const bool chunked = rng() % 2 == 0, caching = rng() % 2 == 0;
    const int block_size = 1 + static_cast<int>(rng() % 8);
    const int window = 1 + static_cast<int>(rng() % 24);
    const int num_blocks = (window + 2 * block_size) * 3 / block_size + 4;
    const int capacity = num_blocks * block_size;
    const int budget = chunked ? 4 + static_cast<int>(rng() % 16) : capacity;
    const int history_blocks = mode == KvHistory::kDrop ? 0 : 40 * capacity / block_size;
    Driver d({num_blocks, block_size, caching, KvTierOptions{window, mode}, history_blocks},
             {budget, 1 + static_cast<int>(rng() % 4), chunked});
    const int resident_limit = (window + block_size - 2) / block_size + 2;
    for (int i = 0; i < 10; ++i) {
      // Prompts up to the whole cache when chunked, and outputs several times longer.
      const int prompt = 1 + static_cast<int>(rng() % static_cast<unsigned>(chunked ? capacity : capacity / 4));
      d.add(prompt, 1 + static_cast<int>(rng() % static_cast<unsigned>(3 * capacity)), static_cast<int32_t>(rng() % 2));
    }
    for (int step = 0; step < 200000 && !d.scheduler.idle(); ++step) {
      d.step();
      for (const BlockCompression& c : d.blocks.take_compressions()) ASSERT_LT(c.dst, history_blocks);
      for (const auto& seq : d.seqs) {
        if (seq->state() != SequenceState::kDecoding) continue;
        ASSERT_LE(seq->block_table().num_resident(), resident_limit)
            << "window " << window << " block size " << block_size << "; seed " << seed << " round " << round;
        ASSERT_LE(seq->block_table().first_resident_position(), std::max(0, seq->num_computed() - window + 1));
      }
      ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed << " round " << round;
    }
    ASSERT_TRUE(d.scheduler.idle()) << "stalled; seed " << seed << " round " << round;
    EXPECT_EQ(d.blocks.num_used(), 0);
    EXPECT_EQ(d.blocks.num_history_used(), 0);
    EXPECT_EQ(d.blocks.num_free() + d.blocks.num_cached(), num_blocks);
    int64_t longest = 0;
    for (const auto& seq : d.seqs) longest = std::max<int64_t>(longest, seq->num_tokens());
    longest_overall = std::max(longest_overall, longest * 1000 / capacity);
  }
  EXPECT_GT(longest_overall, 2000) << "no sequence outgrew the cache twice over; seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Modes, SchedulerTiers, ::testing::Values(KvHistory::kDrop, KvHistory::kInt4),
                         [](const auto& info) { return std::string(kv_history_name(info.param)); });

}  // namespace
}  // namespace tachyon
