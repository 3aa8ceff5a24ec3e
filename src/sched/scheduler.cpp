#include "sched/scheduler.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace tachyon {

const char* sequence_state_name(SequenceState state) {
  switch (state) {
    case SequenceState::kWaiting: return "waiting";
    case SequenceState::kPrefilling: return "prefilling";
    case SequenceState::kDecoding: return "decoding";
    case SequenceState::kPreempted: return "preempted";
    case SequenceState::kTransferring: return "transferring";
    case SequenceState::kFinished: return "finished";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager& blocks) : options_(options), blocks_(blocks) {
  TACHYON_CHECK(options.max_batched_tokens > 0 && options.max_seqs > 0, "scheduler: max_batched_tokens {} max_seqs {}",
                options.max_batched_tokens, options.max_seqs);
}

Status Scheduler::add(Sequence* seq) {
  TACHYON_CHECK(seq->state_ == SequenceState::kWaiting && seq->num_computed_ == 0 && seq->block_table_.empty(),
                "scheduler: sequence {} added twice", seq->id());
  if (seq->num_tokens() == 0) return make_error(ErrorCode::kInvalidArgument, "sequence {} has no tokens", seq->id());
  const int64_t capacity = static_cast<int64_t>(blocks_.num_blocks()) * blocks_.block_size();
  if (resident_bound(seq->num_tokens()) >= capacity) {
    return make_error(ErrorCode::kOutOfRange, "the prompt has {} tokens; the KV cache holds {} tokens in all{}",
                      seq->num_tokens(), capacity, window_note());
  }
  if (!options_.chunked_prefill && seq->num_tokens() > options_.max_batched_tokens) {
    return make_error(ErrorCode::kOutOfRange,
                      "the prompt has {} tokens, more than max_batched_tokens = {} (chunked prefill is off)",
                      seq->num_tokens(), options_.max_batched_tokens);
  }
  waiting_.push_back(seq);
  return Status::Ok();
}

int64_t Scheduler::resident_bound(int64_t num_tokens) const {
  const KvTierOptions& tiers = blocks_.tiers();
  if (!tiers.active()) return num_tokens;
  // A decode holds the window's blocks and one more (the window rarely starts on a boundary);
  // history tiers also what the history pool cannot take.
  const int64_t window = std::min<int64_t>(num_tokens, static_cast<int64_t>(tiers.window) + blocks_.block_size());
  if (tiers.history == KvHistory::kDrop) return window;
  return std::max(window, num_tokens - static_cast<int64_t>(blocks_.num_history_blocks()) * blocks_.block_size());
}

std::string Scheduler::window_note() const {
  const KvTierOptions& tiers = blocks_.tiers();
  if (!tiers.active()) return {};
  return fmt::format(" (of which a sequence keeps its last {} positions and their block)", tiers.window);
}

int Scheduler::room(const Sequence& seq) const {
  const BlockTable& t = seq.block_table_;
  const int64_t in_table = static_cast<int64_t>(t.blocks().size()) * t.block_size() - seq.num_computed_;
  const int64_t r = in_table + static_cast<int64_t>(blocks_.num_available()) * t.block_size();
  return static_cast<int>(std::min<int64_t>(r, INT32_MAX));
}

bool Scheduler::reserve(Sequence& seq, int n, SchedulerStep& step) {
  BlockTable& t = seq.block_table_;
  const int before = t.num_tokens();
  const int end = seq.num_computed_ + n;
  if (!blocks_.grow_to(t, end).ok()) return false;
  if (!blocks_.prepare_write(t, seq.num_computed_, end, step.copies).ok()) {
    blocks_.truncate(t, before);
    return false;
  }
  return true;
}

void Scheduler::add_chunk(Sequence& seq, int n, SchedulerStep& step, int num_draft) {
  ScheduledChunk c;
  c.seq = &seq;
  c.start = seq.num_computed_;
  c.num_tokens = n + num_draft;
  c.sample = seq.num_computed_ + n == seq.num_tokens();
  c.num_draft = num_draft;
  step.chunks.push_back(c);
  step.num_tokens += c.num_tokens;
  step.num_draft_tokens += num_draft;
  if (seq.state_ == SequenceState::kDecoding) {
    step.num_decode_tokens += c.num_tokens;
  } else {
    step.num_prefill_tokens += c.num_tokens;
  }
}

int Scheduler::reserve_draft(Sequence& seq, int n, int budget, SchedulerStep& step) {
  const int num_draft = static_cast<int>(seq.draft_.size());
  if (num_draft == 0) return 0;
  if (n != seq.num_uncomputed() || n + num_draft > budget || !reserve(seq, n + num_draft, step)) {
    seq.draft_.clear();
    seq.draft_parents_.clear();
    return 0;
  }
  return num_draft;
}

void Scheduler::preempt(Sequence* seq) {
  const auto it = std::find(running_.begin(), running_.end(), seq);
  TACHYON_CHECK(it != running_.end(), "preempt of sequence {} that is not running", seq->id());
  running_.erase(it);
  blocks_.free(seq->block_table_);
  seq->num_computed_ = 0;
  seq->draft_.clear();
  seq->draft_parents_.clear();
  seq->state_ = SequenceState::kPreempted;
  ++seq->num_preemptions_;
  ++num_preemptions_;
  // Ahead of every new arrival, behind sequences preempted earlier (they are older).
  auto pos = waiting_.begin();
  while (pos != waiting_.end() && (*pos)->state_ == SequenceState::kPreempted) ++pos;
  waiting_.insert(pos, seq);
}

SchedulerStep Scheduler::schedule() {
  SchedulerStep step;
  // Each round either schedules something, finds nothing to do, or preempts one sequence.
  for (;;) {
    int budget = options_.max_batched_tokens;
    bool preempted = false;

    // 1. Decodes, oldest first; a decode that finds no block preempts the newest sequence.
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i];
      if (seq->state_ != SequenceState::kDecoding) continue;
      const int n = std::min(seq->num_uncomputed(), budget);
      const int num_draft = reserve_draft(*seq, n, budget, step);
      bool self_preempted = false;
      while (num_draft == 0 && !reserve(*seq, n, step)) {
        Sequence* victim = running_.back();
        step.preempted.push_back(victim);
        preempt(victim);
        preempted = true;
        if (victim == seq) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;  // it was the newest: nothing after it is left to decode
      add_chunk(*seq, n, step, num_draft);
      budget -= n + num_draft;
    }

    // 2. Prompts already running: their next chunk, within the budget and the free blocks.
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i];
      if (seq->state_ != SequenceState::kPrefilling) continue;
      const int remaining = seq->num_uncomputed();
      const bool whole = !options_.chunked_prefill && remaining <= options_.max_batched_tokens;
      const int n = std::min({remaining, budget, room(*seq)});
      if (n <= 0 || (whole && n < remaining) || !reserve(*seq, n, step)) continue;
      add_chunk(*seq, n, step);
      budget -= n;
    }

    // 3. Admissions, preempted first, then in arrival order.
    while (!preempted && !waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < options_.max_seqs) {
      Sequence* seq = waiting_.front();
      if (seq->block_table_.empty() && seq->prefix_lookup_) {
        const int hit = blocks_.match_prefix(seq->block_table_, seq->tokens(), seq->num_tokens() - 1);
        seq->num_computed_ = hit;
        blocks_.retire(seq->block_table_, hit);  // matched blocks already out of the window
      }
      const int remaining = seq->num_uncomputed();
      const bool whole = !options_.chunked_prefill && remaining <= options_.max_batched_tokens;
      const int n = std::min({remaining, budget, room(*seq)});
      if (n <= 0 || (whole && n < remaining) || !reserve(*seq, n, step)) {
        blocks_.free(seq->block_table_);  // give matched blocks back; try again next step
        seq->num_computed_ = 0;
        break;
      }
      blocks_.record_prefix_query(seq->num_tokens(), seq->num_computed_);
      if (seq->num_cached_prompt_tokens_ < 0) {
        seq->num_cached_prompt_tokens_ = std::min(seq->num_computed_, seq->num_prompt_tokens());
      }
      waiting_.pop_front();
      running_.push_back(seq);
      seq->state_ = SequenceState::kPrefilling;
      add_chunk(*seq, n, step);
      budget -= n;
    }

    if (!step.chunks.empty() || running_.empty()) return step;
    // Every running sequence is stuck mid-prompt on a full cache: make room.
    Sequence* victim = running_.back();
    step.preempted.push_back(victim);
    preempt(victim);
  }
}

void Scheduler::complete(const SchedulerStep& step) {
  for (const ScheduledChunk& c : step.chunks) {
    Sequence& seq = *c.seq;
    if (seq.state_ == SequenceState::kFinished) continue;  // aborted after scheduling
    TACHYON_CHECK(seq.num_computed_ == c.start, "sequence {}: chunk at {} but {} computed", seq.id(), c.start,
                  seq.num_computed_);
    seq.num_computed_ += c.num_tokens - c.num_draft;  // draft positions wait for accept_draft()
    blocks_.commit(seq.block_table_, seq.tokens(), seq.num_computed_);
    blocks_.retire(seq.block_table_, seq.num_computed_);
    if (c.sample) seq.state_ = SequenceState::kDecoding;
  }
}

void Scheduler::accept_draft(Sequence* seq, int num_accepted) {
  TACHYON_CHECK(seq->draft_parents_.empty(), "sequence {}: a draft tree accepted as a chain", seq->id());
  std::vector<int32_t> path(static_cast<size_t>(std::max(num_accepted, 0)));
  std::iota(path.begin(), path.end(), 0);
  const std::vector<SlotCopy> copies = accept_draft(seq, path);
  TACHYON_CHECK(copies.empty(), "sequence {}: a chain needs no slot copies", seq->id());
}

std::vector<SlotCopy> Scheduler::accept_draft(Sequence* seq, std::span<const int32_t> path) {
  const std::vector<int32_t> draft = std::move(seq->draft_);
  const std::vector<int32_t> parents = std::move(seq->draft_parents_);
  seq->draft_.clear();
  seq->draft_parents_.clear();
  std::vector<SlotCopy> copies;
  if (seq->state_ == SequenceState::kFinished) return copies;
  const int num_accepted = static_cast<int>(path.size());
  TACHYON_CHECK(num_accepted <= static_cast<int>(draft.size()) && seq->num_computed_ + num_accepted < seq->num_tokens(),
                "sequence {}: {} of {} draft tokens accepted, {} computed of {} tokens", seq->id(), num_accepted,
                draft.size(), seq->num_computed_, seq->num_tokens());
  const int base = seq->num_computed_;  // the first draft position: draft i was written at base + i
  for (int d = 0; d < num_accepted; ++d) {
    const int32_t node = path[static_cast<size_t>(d)];
    TACHYON_CHECK(node >= 0 && node < static_cast<int32_t>(draft.size()), "sequence {}: accepted draft {} of {}",
                  seq->id(), node, draft.size());
    const int32_t parent = parents.empty() ? node - 1 : parents[static_cast<size_t>(node)];
    TACHYON_CHECK(parent == (d == 0 ? -1 : path[static_cast<size_t>(d) - 1]),
                  "sequence {}: accepted draft {} does not follow draft {}", seq->id(), node,
                  d == 0 ? -1 : path[static_cast<size_t>(d) - 1]);
    TACHYON_CHECK(seq->tokens_[static_cast<size_t>(base + d)] == draft[static_cast<size_t>(node)],
                  "sequence {}: accepted draft token {} is not the sequence's", seq->id(), d);
    // Parents come before children, so node >= d: every source lies at or after its destination
    // and after the destinations copied before it.
    if (node != d) copies.push_back({seq->block_table_.slot(base + node), seq->block_table_.slot(base + d)});
  }
  seq->num_computed_ += num_accepted;
  blocks_.truncate(seq->block_table_, seq->num_computed_);
  blocks_.commit(seq->block_table_, seq->tokens(), seq->num_computed_);
  blocks_.retire(seq->block_table_, seq->num_computed_);
  return copies;
}

void Scheduler::hold_for_transfer(Sequence* seq) {
  TACHYON_CHECK(seq->state_ == SequenceState::kDecoding && seq->draft_.empty(),
                "sequence {}: held for transfer in state {}", seq->id(), sequence_state_name(seq->state_));
  const auto it = std::find(running_.begin(), running_.end(), seq);
  TACHYON_CHECK(it != running_.end(), "sequence {}: held for transfer but not running", seq->id());
  running_.erase(it);
  seq->state_ = SequenceState::kTransferring;
}

Result<int> Scheduler::reserve_adopted(Sequence* seq, int num_computed, int history_blocks) {
  TACHYON_CHECK(seq->state_ == SequenceState::kWaiting && seq->num_computed_ == 0 && seq->block_table_.empty(),
                "scheduler: sequence {} adopted twice", seq->id());
  TACHYON_CHECK(num_computed > 0 && num_computed == seq->num_tokens() - 1,
                "sequence {}: {} computed positions of {} tokens", seq->id(), num_computed, seq->num_tokens());
  const int64_t capacity = static_cast<int64_t>(blocks_.num_blocks()) * blocks_.block_size();
  if (resident_bound(seq->num_tokens()) >= capacity) {
    return make_error(ErrorCode::kOutOfRange, "the sequence has {} tokens; the KV cache holds {} tokens in all{}",
                      seq->num_tokens(), capacity, window_note());
  }
  if (static_cast<int>(running_.size()) >= options_.max_seqs) {
    return make_error(ErrorCode::kOutOfRange, "{} sequences already run (max_seqs)", running_.size());
  }
  BlockTable& t = seq->block_table_;
  if (history_blocks > 0) {
    // Its older positions arrive as history blocks (never shared with the prefix cache).
    TACHYON_RETURN_IF_ERROR(blocks_.take_history(t, history_blocks));
    if (Status st = blocks_.grow_to(t, num_computed); !st.ok()) {
      blocks_.free(t);
      return st;
    }
    seq->num_computed_ = num_computed;
    seq->state_ = SequenceState::kTransferring;
    return t.first_resident_position();
  }
  const int hit = blocks_.match_prefix(t, seq->tokens(), num_computed);
  // With drop, only the window's blocks are taken; history tiers retire once the K/V are written
  // (admit_adopted).
  if (blocks_.tiers().attention_window() > 0) blocks_.retire(t, num_computed);
  if (Status st = blocks_.grow_to(t, num_computed); !st.ok()) {
    blocks_.free(t);
    return st;
  }
  blocks_.record_prefix_query(num_computed, hit);
  seq->num_computed_ = num_computed;
  seq->num_cached_prompt_tokens_ = std::min(hit, seq->num_prompt_tokens());
  seq->state_ = SequenceState::kTransferring;
  return std::max(hit, t.first_resident_position());
}

void Scheduler::admit_adopted(Sequence* seq) {
  TACHYON_CHECK(seq->state_ == SequenceState::kTransferring && seq->num_computed_ > 0,
                "sequence {}: admitted in state {}", seq->id(), sequence_state_name(seq->state_));
  blocks_.commit(seq->block_table_, seq->tokens(), seq->num_computed_);
  blocks_.retire(seq->block_table_, seq->num_computed_);
  running_.push_back(seq);
  seq->state_ = SequenceState::kDecoding;
}

void Scheduler::finish(Sequence* seq) {
  if (seq->state_ == SequenceState::kFinished) return;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  blocks_.free(seq->block_table_);
  seq->num_computed_ = 0;
  seq->draft_.clear();
  seq->draft_parents_.clear();
  seq->state_ = SequenceState::kFinished;
}

}  // namespace tachyon
