// The scheduler's side of speculative decoding, without a model: a decoding sequence's draft is
// charged to the token budget at full length, taken whole or dropped (never preempting anyone),
// and accept_draft() keeps the accepted positions and rolls the rest back by truncation.
#include <gtest/gtest.h>

#include "sched/scheduler.h"

namespace tachyon {
namespace {

// A sequence of `prompt_len` tokens prefilled and one token sampled: decoding, 1 uncomputed token.
std::unique_ptr<Sequence> decoding_sequence(Scheduler& s, int prompt_len, uint64_t id = 1) {
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = 100 + i;
  auto seq = std::make_unique<Sequence>(id, std::move(prompt), 4);
  EXPECT_TRUE(s.add(seq.get()).ok());
  const SchedulerStep prefill = s.schedule();
  s.complete(prefill);
  seq->append_token(7);
  EXPECT_EQ(seq->state(), SequenceState::kDecoding);
  return seq;
}

TEST(SchedulerDraft, ADraftIsChargedAtFullLengthAndRolledBackOnRejection) {
  BlockManager blocks(BlockManagerOptions{16, 4, true});
  Scheduler s(SchedulerOptions{64, 4, true}, blocks);
  auto seq = decoding_sequence(s, 6);
  seq->set_draft({8, 9, 10, 11});
  const SchedulerStep step = s.schedule();
  ASSERT_EQ(step.chunks.size(), 1u);
  const ScheduledChunk& c = step.chunks[0];
  EXPECT_EQ(c.start, 6);
  EXPECT_EQ(c.num_tokens, 5);
  EXPECT_EQ(c.num_draft, 4);
  EXPECT_TRUE(c.sample);
  EXPECT_EQ(step.num_tokens, 5);
  EXPECT_EQ(step.num_decode_tokens, 5);
  EXPECT_EQ(step.num_draft_tokens, 4);
  EXPECT_EQ(seq->block_table().num_tokens(), 11);  // room for the draft's K/V
  s.complete(step);
  EXPECT_EQ(seq->num_computed(), 7);               // the draft is not the sequence's yet
  // Two drafts accepted, then the target's own token.
  for (int32_t t : {8, 9, 42}) seq->append_token(t);
  s.accept_draft(seq.get(), 2);
  EXPECT_TRUE(seq->draft().empty());
  EXPECT_EQ(seq->num_computed(), 9);
  EXPECT_EQ(seq->num_uncomputed(), 1);
  EXPECT_EQ(seq->block_table().num_tokens(), 9);
  EXPECT_EQ(seq->block_table().blocks().size(), 3u);
  EXPECT_EQ(seq->block_table().block_hashes().size(), 2u);  // the two full blocks, drafts included
  const BlockTable* tables[] = {&seq->block_table()};
  EXPECT_TRUE(blocks.check(tables).ok());
  s.finish(seq.get());
  EXPECT_EQ(blocks.num_used(), 0);
}

TEST(SchedulerDraft, ADraftThatDoesNotFitIsDroppedNotTheDecode) {
  // Budget: 3 tokens, a draft of 4 needs 5.
  BlockManager blocks(BlockManagerOptions{16, 4, false});
  Scheduler s(SchedulerOptions{3, 4, true}, blocks);
  auto seq = decoding_sequence(s, 3);
  seq->set_draft({1, 2, 3, 4});
  SchedulerStep step = s.schedule();
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].num_tokens, 1);
  EXPECT_EQ(step.chunks[0].num_draft, 0);
  EXPECT_TRUE(seq->draft().empty());
  s.complete(step);
  s.finish(seq.get());

  // Blocks: a cache with room for the decode but not the draft. Nobody is preempted for it.
  BlockManager few(BlockManagerOptions{3, 4, false});
  Scheduler s2(SchedulerOptions{64, 4, true}, few);
  auto a = std::make_unique<Sequence>(1, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, 4);  // 2 blocks
  auto b = std::make_unique<Sequence>(2, std::vector<int32_t>{1, 2}, 4);                 // 1 block
  ASSERT_TRUE(s2.add(a.get()).ok());
  ASSERT_TRUE(s2.add(b.get()).ok());
  s2.complete(s2.schedule());
  a->append_token(8);  // its decode fits the second block
  b->append_token(3);
  ASSERT_EQ(few.num_free(), 0);
  a->set_draft({1, 2, 3});
  step = s2.schedule();
  EXPECT_TRUE(step.preempted.empty());
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[0].num_draft, 0);
  EXPECT_EQ(step.chunks[0].num_tokens, 1);
  s2.complete(step);
  s2.finish(a.get());
  s2.finish(b.get());
  EXPECT_EQ(few.num_used(), 0);
}

TEST(SchedulerDraft, PreemptionAndFinishClearTheDraft) {
  BlockManager blocks(BlockManagerOptions{16, 4, false});
  Scheduler s(SchedulerOptions{64, 4, true}, blocks);
  auto seq = decoding_sequence(s, 5);
  seq->set_draft({1, 2});
  const SchedulerStep step = s.schedule();
  s.complete(step);
  seq->append_token(1);
  seq->append_token(5);
  s.finish(seq.get());
  EXPECT_TRUE(seq->draft().empty());
  s.accept_draft(seq.get(), 1);  // no-op once finished
  EXPECT_EQ(blocks.num_used(), 0);
}

}  // namespace
}  // namespace tachyon
