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
  BlockManager blocks(BlockManagerOptions{16, 4, true, {}});
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

// A draft tree: its nodes are charged like a chain; the accepted path's K/V are moved from where
// the step wrote them (last token's index + 1 + node) to the positions they now hold, in order.
TEST(SchedulerDraft, AnAcceptedTreePathMovesIntoPlace) {
  BlockManager blocks(BlockManagerOptions{16, 4, false, {}});
  Scheduler s(SchedulerOptions{64, 4, true}, blocks);
  auto seq = decoding_sequence(s, 6);  // the last token (7) sits at index 6
  // Branches 8 -> 9 (nodes 0, 1) and 10 -> 11 -> 12 (nodes 2, 3, 4).
  seq->set_draft({8, 9, 10, 11, 12}, {-1, 0, -1, 2, 3});
  const SchedulerStep step = s.schedule();
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].num_draft, 5);
  EXPECT_EQ(seq->block_table().num_tokens(), 12);
  s.complete(step);
  std::vector<int32_t> slot_of(12);
  for (int p = 0; p < 12; ++p) slot_of[static_cast<size_t>(p)] = seq->block_table().slot(p);
  for (int32_t t : {10, 11, 40}) seq->append_token(t);
  const std::vector<int32_t> path = {2, 3};
  const std::vector<SlotCopy> copies = s.accept_draft(seq.get(), path);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].src, slot_of[9]);  // node 2 (index 6 + 1 + 2) to position 7
  EXPECT_EQ(copies[0].dst, slot_of[7]);
  EXPECT_EQ(copies[1].src, slot_of[10]);  // node 3 to position 8
  EXPECT_EQ(copies[1].dst, slot_of[8]);
  EXPECT_TRUE(seq->draft().empty() && seq->draft_parents().empty());
  EXPECT_EQ(seq->num_computed(), 9);
  EXPECT_EQ(seq->block_table().num_tokens(), 9);
  // The first branch needs no copy; a path that skips a level is refused.
  seq->set_draft({1, 2, 3}, {-1, 0, -1});
  s.complete(s.schedule());
  for (int32_t t : {1, 2, 5}) seq->append_token(t);
  EXPECT_TRUE(s.accept_draft(seq.get(), std::vector<int32_t>{0, 1}).empty());
  EXPECT_EQ(seq->num_computed(), 12);
  seq->set_draft({1, 2, 3}, {-1, 0, 1});
  s.complete(s.schedule());
  for (int32_t t : {2, 9}) seq->append_token(t);
  EXPECT_DEATH(s.accept_draft(seq.get(), std::vector<int32_t>{1}), "does not follow");
  s.finish(seq.get());
  EXPECT_EQ(blocks.num_used(), 0);
}

TEST(SchedulerDraft, ADraftThatDoesNotFitIsDroppedNotTheDecode) {
  // Budget: 3 tokens, a draft of 4 needs 5.
  BlockManager blocks(BlockManagerOptions{16, 4, false, {}});
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
  BlockManager few(BlockManagerOptions{3, 4, false, {}});
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
  BlockManager blocks(BlockManagerOptions{16, 4, false, {}});
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
