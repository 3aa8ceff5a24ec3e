// GrammarMatcher: one request's position in a Grammar, advanced token by token, and the token mask that says
// which vocabulary tokens may come next.
//
// Parse state. A set of pushdown stacks, as llama.cpp's grammar does: a stack is a chain of frames, each a
// position in the flat grammar still to be matched, the top one always at a character class. Frames are
// hash-consed into a per-matcher pool (frame = (position, parent frame)), so a stack is one int32 and a parser
// state is a small sorted set of them plus an unfinished UTF-8 character. Chosen over an Earley parser because
// that state does not mention the input position: the same states recur step after step (inside a JSON string
// the state is the same after every character), so byte transitions between states are memoized into a lazily
// built DFA, and a mask costs one table lookup per live trie node after warm-up. Earley item sets carry origin
// positions and never repeat, so they cannot be cached that way. The price is that left-recursive grammars are
// refused (GrammarBuilder does that) and ambiguous ones hold several stacks (capped: max_stacks).
//
// Bytes, not characters. Tokens may end inside a UTF-8 character; the state keeps the partial character and
// only stacks whose class can still match one of its completions (interval test on the code points the
// prefix allows). Invalid UTF-8 (overlong forms, surrogates, stray continuation bytes) is never accepted.
//
// Tokens. Masks come from a walk over the shared TokenTrie (and, for states seen again, from a small per-state mask
// cache: the mask is a function of the state alone). EOS (any of the trie's EOS ids) is allowed exactly
// when the root rule is complete (can_end()); when nothing else can follow, it is the only token allowed.
// Special tokens other than EOS are never allowed. After EOS is accepted the matcher is terminated: the mask
// allows only EOS again, and other tokens are refused.
//
// Ownership and threads: the Grammar and the TokenTrie are shared, immutable and thread-safe; a GrammarMatcher
// belongs to one sequence and is not thread-safe. Copying one (n > 1 sampling, beam forks) copies its state,
// caches and history; the copies are independent.
// Must never: abort on a request's tokens (refusals and blowups are Status errors; the state is unchanged by a
// refused call), or allow a token the brute-force definition (accept it, see whether the parse survives)
// would refuse.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "sampling/grammar.h"
#include "sampling/token_trie.h"

namespace tachyon {

struct GrammarMatcherOptions {
  int32_t max_stacks = 4096;              // parse stacks alive at one point (ambiguity guard)
  int32_t max_rollback_tokens = 64;       // accepted tokens that rollback() can undo
  int32_t max_cached_states = 4096;       // DFA states kept between calls (~1 KiB each with transitions)
  int32_t max_states_per_call = 1 << 16;  // new DFA states one call may create before it gives up
  int32_t max_stack_frames = 1 << 22;     // frames in the pool (a request's whole life)
  // Whole token masks kept per DFA state (vocab / 8 bytes each, 16 KiB at 128k tokens): a state that comes back
  // (inside a JSON string it does at every step) gets its mask by a copy instead of a trie walk. 0: off.
  int32_t max_cached_masks = 8;
};

class GrammarMatcher {
 public:
  static Result<GrammarMatcher> create(std::shared_ptr<const Grammar> grammar,
                                       std::shared_ptr<const TokenTrie> vocabulary, GrammarMatcherOptions options = {});

  // Advances by one token. A token the grammar does not allow here, a special token, or an id out of range
  // is an error and leaves the matcher unchanged.
  Status accept(int32_t token);
  // Advances by raw bytes as if they were one token (tests, forced prefixes); rollback(1) undoes them.
  Status accept_bytes(std::string_view bytes);
  // Writes the allowed tokens: bit (id % 32) of bitmask[id / 32], grammar_mask_words(vocab) words or more.
  // An error if no token at all may follow (the vocabulary cannot spell any continuation), or on a blowup.
  Status fill_mask(std::span<uint32_t> bitmask);

  // Whether EOS may come next: the root rule is complete and no UTF-8 character is half done (or the matcher
  // already accepted EOS).
  bool can_end() const;
  bool is_terminated() const { return terminated_; }
  // Undoes the last `num_tokens` accepted tokens (speculative decoding's rejected drafts). An error, with no
  // change, if fewer than that are remembered (see max_rollback_tokens).
  Status rollback(int32_t num_tokens);
  int32_t rollback_capacity() const { return static_cast<int32_t>(history_.size()); }
  // Back to the start of the grammar; caches are kept.
  void reset();

  const Grammar& grammar() const { return *grammar_; }
  const TokenTrie& vocabulary() const { return *vocabulary_; }
  // Sizes of the caches, for benchmarks and tests.
  int32_t num_cached_states() const { return static_cast<int32_t>(states_.size()); }
  int32_t num_stack_frames() const { return static_cast<int32_t>(frames_.size()); }
  // Times the DFA cache was emptied for going over max_cached_states (each costs a rebuild of the states used).
  int64_t num_cache_flushes() const { return cache_flushes_; }

 private:
  static constexpr int32_t kAccepted = -1;  // a stack that has matched the whole root rule
  static constexpr int32_t kDead = -1;      // a DFA transition to "no parse survives"
  static constexpr int32_t kUnknown = -2;   // a DFA transition not computed yet
  static constexpr int32_t kFailed = -3;    // a transition that hit a limit; error_ holds the Status

  struct Frame {
    int32_t position = 0;  // index into grammar.elements(): the next element this frame must match
    int32_t parent = kAccepted;
  };
  // A parser state. Invariant: stacks sorted and unique; with a partial character, only stacks whose top
  // class can still match one of its completions, and no kAccepted.
  struct State {
    std::vector<int32_t> stacks;
    uint32_t partial_value = 0;     // bits of the unfinished UTF-8 character so far
    uint8_t partial_remaining = 0;  // continuation bytes still to come (0: none pending)
    uint8_t partial_length = 0;     // total bytes of that character
    bool operator==(const State&) const = default;
  };
  struct StateHash {
    size_t operator()(const State& s) const;
  };
  struct Snapshot {
    State state;
    bool terminated = false;
  };

  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocabulary,
                 GrammarMatcherOptions options);

  int32_t frame(int32_t position, int32_t parent);
  // The stacks (tops at character classes, or kAccepted) that `stack` stands for once its rule references
  // are expanded; appended to `out`.
  Status expand(int32_t stack, std::vector<int32_t>& out);
  // expand() of what follows the top frame of `stack` once its character is matched (memoized per frame).
  Status successors(int32_t stack, std::span<const int32_t>& out);
  // One byte on a state; `dead` when no stack survives.
  Status step(const State& from, uint8_t byte, State& to, bool& dead);
  Status advance_code_point(const State& from, uint32_t cp, State& to);
  // DFA: the id of an interned state, and the memoized byte transition (kDead, kFailed or a state id).
  int32_t intern(const State& state);
  int32_t transition(int32_t state_id, uint8_t byte);
  void flush_cache_if_full();
  Status run_bytes(std::string_view bytes, int32_t& state_id);
  void remember_mask(std::span<const uint32_t> mask);  // caches the current state's mask
  void remember();                                     // pushes the current state on the rollback history

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> vocabulary_;
  GrammarMatcherOptions options_;

  // Stack frame pool (hash-consed) and the memoized successors of each frame.
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<int32_t> successor_begin_;  // [frames], offset into successor_data_, or -1 not computed
  std::vector<int32_t> successor_count_;  // [frames]
  std::vector<int32_t> successor_data_;
  std::vector<uint32_t> visit_mark_;  // [frames], expand()'s visited set by generation
  uint32_t visit_generation_ = 0;
  std::vector<int32_t> expand_work_;  // scratch

  // The DFA over states: interned states, and per state a row of 256 transitions (allocated on first use).
  std::vector<State> states_;
  std::unordered_map<State, int32_t, StateHash> state_ids_;
  std::vector<int32_t> state_row_;  // [states], row index or -1
  std::vector<int32_t> rows_;       // [rows * 256]
  int32_t states_at_call_start_ = 0;
  int64_t cache_flushes_ = 0;
  Status error_;  // why a transition returned kFailed

  State initial_;  // the state before any input
  State current_;
  int32_t current_id_ = -1;  // current_ interned, or -1 after a flush or rollback
  bool terminated_ = false;
  std::deque<Snapshot> history_;       // oldest first; at most max_rollback_tokens
  std::vector<int32_t> depth_states_;  // fill_mask scratch: DFA state per trie depth
  // Mask cache: state id -> slot of mask_cache_ ([slots, mask words]); emptied with the DFA cache.
  std::unordered_map<int32_t, int32_t> mask_slot_of_state_;
  std::vector<int32_t> mask_slot_state_;  // [slots]: the state each slot holds
  std::vector<uint32_t> mask_cache_;
  int32_t next_mask_victim_ = 0;
  State scratch_;
};

}  // namespace tachyon
