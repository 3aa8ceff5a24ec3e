// One sequence as the scheduler sees it: its tokens (prompt, then generated), how many of them
// have K/V in the cache, and the blocks holding those K/V. A sequence is always in exactly one
// named state, and only the Scheduler changes it:
//
//   kWaiting --admit--> kPrefilling --prompt done--> kDecoding --finish--> kFinished
//                           |   ^                        |
//                           |   +------- resume ---------+-- kPreempted (KV dropped; recomputed
//                           +--------------------------------^            from its tokens later)
//
// Disaggregation (disagg/) adds kTransferring, a sequence out of the batch whose blocks are held
// while its K/V move between engines:
//   prefill side  kDecoding --hold_for_transfer--> kTransferring --finish (K/V copied out)--> kFinished
//   decode side   kWaiting --reserve_adopted--> kTransferring --admit_adopted (K/V written)--> kDecoding
//
// Generation does not care which state produced a token: a preempted sequence re-runs its prompt
// and everything it generated as one prefill, then continues where it stopped.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_manager.h"

namespace tachyon {

enum class SequenceState : uint8_t { kWaiting, kPrefilling, kDecoding, kPreempted, kTransferring, kFinished };
const char* sequence_state_name(SequenceState state);

class Sequence {
 public:
  Sequence(uint64_t id, std::vector<int32_t> prompt, int block_size)
      : id_(id), tokens_(std::move(prompt)), num_prompt_tokens_(static_cast<int>(tokens_.size())),
        block_table_(block_size) {}

  uint64_t id() const { return id_; }
  SequenceState state() const { return state_; }
  bool finished() const { return state_ == SequenceState::kFinished; }

  std::span<const int32_t> tokens() const { return tokens_; }    // [num_tokens]: prompt, then output
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  int num_generated() const { return num_tokens() - num_prompt_tokens_; }
  std::span<const int32_t> generated() const { return std::span<const int32_t>(tokens_).subspan(num_prompt_tokens_); }
  int32_t last_token() const { return tokens_.back(); }
  // A sampled token joins the sequence; its K/V are computed by the next step.
  void append_token(int32_t token) { tokens_.push_back(token); }

  // Speculative decoding: tokens proposed to follow the sequence, set before a step. If the
  // scheduler takes them, the step runs them after the last token (writing their K/V) and they
  // join the sequence only as far as the verifier accepts them (Scheduler::accept_draft).
  // A tree of drafts (several branches verified at once) also has parents: draft_parents()[i] is
  // the index of draft i's parent in the draft (< i), or -1 when it follows the last token;
  // empty for a chain (each draft follows the one before).
  std::span<const int32_t> draft() const { return draft_; }
  std::span<const int32_t> draft_parents() const { return draft_parents_; }
  void set_draft(std::vector<int32_t> draft, std::vector<int32_t> parents = {}) {
    draft_ = std::move(draft);
    draft_parents_ = std::move(parents);
  }

  int num_computed() const { return num_computed_; }   // leading tokens whose K/V are in the cache
  int num_uncomputed() const { return num_tokens() - num_computed_; }
  const BlockTable& block_table() const { return block_table_; }

  // Whether admission may take the prompt's leading blocks from the prefix cache (default). A
  // request that needs every prompt position computed (prompt logprobs: a cached position has no
  // logits) turns it off until it has what it needs. The engine's setting; it changes no state.
  bool prefix_lookup() const { return prefix_lookup_; }
  void set_prefix_lookup(bool allowed) { prefix_lookup_ = allowed; }

  int num_preemptions() const { return num_preemptions_; }
  // Prompt tokens found in the prefix cache when the sequence was first admitted (-1: not yet).
  int num_cached_prompt_tokens() const { return num_cached_prompt_tokens_; }

 private:
  friend class Scheduler;
  uint64_t id_;
  std::vector<int32_t> tokens_;
  int num_prompt_tokens_;
  int num_computed_ = 0;
  BlockTable block_table_;
  SequenceState state_ = SequenceState::kWaiting;
  int num_preemptions_ = 0;
  int num_cached_prompt_tokens_ = -1;
  bool prefix_lookup_ = true;
  std::vector<int32_t> draft_;          // [<= K] proposed, not yet verified
  std::vector<int32_t> draft_parents_;  // [draft_.size()] for a tree, or empty
};

}  // namespace tachyon
