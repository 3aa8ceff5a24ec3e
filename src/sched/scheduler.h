// Continuous batching: every step picks, under a token budget and a sequence limit, which
// sequences run and how many of their tokens, so that one forward mixes decode tokens and prompt
// chunks of many requests.
//
// Policy (first come, first served):
//   1. running decodes, oldest first, one token each. When the KV cache has no block for one,
//      the newest running sequence is preempted (its blocks freed, its KV recomputed later from
//      its tokens) until it fits — possibly the decoding sequence itself.
//   2. running prefills (prompts already partly computed), oldest first: the next chunk, as much
//      as the budget and the free blocks allow (chunked prefill); never preempts anyone.
//   3. waiting sequences, preempted ones first, then in arrival order, while the budget, the
//      sequence limit and the free blocks allow; skipped in a step that preempted. On admission
//      the prefix cache supplies every cached full block of the tokens but the last (unless the
//      sequence turned prefix lookup off: Sequence::set_prefix_lookup).
// A decoding sequence with a draft (speculative decoding) runs its last token and the draft in one
// chunk, charged to the budget at full length; the draft is dropped — never the decode itself, and
// never anyone preempted for it — when the budget or the free blocks cannot take it whole.
// Without chunked prefill a prompt is scheduled whole or not at all. If nothing could be
// scheduled while sequences run (all stuck mid-prefill on a full cache), the newest is preempted.
//
// The scheduler owns no sequences: the engine does, and tells it when one finishes or aborts.
// Every block a sequence holds goes back to the block manager when it is finished or preempted.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/block_manager.h"
#include "sched/sequence.h"

namespace tachyon {

struct SchedulerOptions {
  int max_batched_tokens = 2048;  // tokens per step: prefill chunks plus decode tokens
  int max_seqs = 256;             // sequences running at once
  bool chunked_prefill = true;    // split prompts over steps; off: a prompt runs in one step
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0;       // position of the chunk's first token (== seq->num_computed() at schedule time)
  int num_tokens = 0;
  bool sample = false; // the chunk ends at the sequence's last token: its logits give the next token
  int num_draft = 0;   // of num_tokens, the trailing draft tokens (not yet part of the sequence)
};

struct SchedulerStep {
  std::vector<ScheduledChunk> chunks;    // decodes first, then prefill chunks
  std::vector<BlockCopy> copies;         // copy-on-write to run on the KV storage before the forward
  std::vector<Sequence*> preempted;      // preempted while planning this step
  int num_tokens = 0;
  int num_decode_tokens = 0;
  int num_prefill_tokens = 0;
  int num_draft_tokens = 0;              // included in num_decode_tokens
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, BlockManager& blocks);

  const SchedulerOptions& options() const { return options_; }
  // Queues a new sequence (state kWaiting). Fails if it could never run: more tokens than the
  // whole KV cache holds, or (without chunked prefill) more than one step's token budget.
  Status add(Sequence* seq);
  // Plans one step. The blocks for every scheduled token are allocated.
  SchedulerStep schedule();
  // After the step's forward wrote its K/V: advances each chunk's sequence, registers newly full
  // blocks in the prefix cache, and moves sequences whose prompt is done to kDecoding.
  void complete(const SchedulerStep& step);
  // Finished or aborted, from any state: frees its blocks and forgets it (state kFinished).
  void finish(Sequence* seq);
  // After a step verified seq's draft and the engine appended what it emitted: the first
  // `num_accepted` draft tokens are now the sequence's tokens after its computed ones and keep
  // their K/V; the positions of the rest are rolled back (block-table truncation, no copy), so the
  // table is what a run that never proposed them would hold. Clears the draft. No-op once finished.
  void accept_draft(Sequence* seq, int num_accepted);
  // The same for a draft tree (Sequence::draft_parents): `path` lists the accepted drafts' indices
  // from the root down (each the parent of the next). Their K/V sit where the step wrote them
  // (the last token's cache index + 1 + draft index); the returned copies, run in order
  // (KvCache::copy_slots) before the next step, move them to the positions they now hold. Drafts
  // already in place (a path along the first branch) need none.
  std::vector<SlotCopy> accept_draft(Sequence* seq, std::span<const int32_t> path);

  // Disaggregation (disagg/): a sequence's K/V leave one engine and join another's block table.
  // Prefill side: a decoding sequence (prompt computed, first token appended) leaves the batch with
  // its blocks held (state kTransferring) so that their K/V can be copied out; finish() frees them.
  void hold_for_transfer(Sequence* seq);
  // Decode side, step 1: a new sequence (never add()ed) whose tokens are the prompt and the tokens
  // generated elsewhere, and whose first `num_computed` (== num_tokens - 1) positions' K/V come
  // from elsewhere, gets blocks for those positions: the prefix cache's full blocks where it holds
  // them, fresh ones for the rest (with dropped history, only for the window's positions).
  // With history_blocks > 0 (int8 / int4 history), its first history_blocks blocks' positions
  // arrive re-quantized: fresh history blocks lead its table, and the prefix cache is not asked.
  // Returns how many leading positions the prefix cache supplied, the window left out or history
  // holds (their K/V must not be written as full precision); state kTransferring. All-or-nothing:
  // kOutOfRange (nothing changed) when max_seqs sequences already run or the blocks (or history
  // blocks) are not available.
  Result<int> reserve_adopted(Sequence* seq, int num_computed, int history_blocks = 0);
  // Step 2, once the caller wrote the K/V of positions [returned, num_computed): registers the
  // full blocks in the prefix cache, retires what the window has passed (history tiers: queued
  // compressions) and runs the sequence as decoding (its prompt is done). To give
  // up between the two steps instead, finish() it.
  void admit_adopted(Sequence* seq);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }  // includes preempted
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const BlockManager& block_manager() const { return blocks_; }

 private:
  void preempt(Sequence* seq);
  // Most tokens from seq->num_computed() on that its table can hold if it takes every available block.
  int room(const Sequence& seq) const;
  // Positions of a sequence of `num_tokens` tokens that must be resident at once to decode its
  // last one: all of them, or with dropped history about the window's.
  int64_t resident_bound(int64_t num_tokens) const;
  std::string window_note() const;  // for capacity errors: what the window keeps, or nothing
  // Allocates and makes writable [num_computed, num_computed + n); all-or-nothing.
  bool reserve(Sequence& seq, int n, SchedulerStep& step);
  void add_chunk(Sequence& seq, int n, SchedulerStep& step, int num_draft = 0);
  // Reserves a decode of n tokens plus seq's draft; returns the draft's length, or 0 after
  // dropping a draft that does not fit the budget or the free blocks (nothing reserved then).
  int reserve_draft(Sequence& seq, int n, int budget, SchedulerStep& step);

  SchedulerOptions options_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;  // preempted sequences at the front, in their original order
  std::vector<Sequence*> running_; // in admission order: the back is the newest
  int64_t num_preemptions_ = 0;
};

}  // namespace tachyon
