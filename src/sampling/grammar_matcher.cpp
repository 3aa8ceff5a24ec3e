// GrammarMatcher: the stack-frame pool, the byte step over parser states, the memoized DFA over those states
// and the trie walk that turns it into a token mask. See grammar_matcher.h for the model.
#include "sampling/grammar_matcher.h"

#include <algorithm>
#include <utility>

namespace tachyon {

namespace {

// `bytes` for an error message: printable ASCII as is, anything else as \xHH, at most 64 bytes.
std::string quote_bytes(std::string_view bytes) {
  std::string out = "\"";
  for (size_t i = 0; i < bytes.size() && i < 64; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02X}", c);
    }
  }
  if (bytes.size() > 64)
    out += fmt::format("...\" ({} bytes)", bytes.size());
  else
    out += "\"";
  return out;
}

// The smallest code point that needs `length` UTF-8 bytes (shorter encodings of it are overlong).
uint32_t min_code_point(uint8_t length) {
  switch (length) {
    case 2: return 0x80;
    case 3: return 0x800;
    case 4: return 0x10000;
    default: return 0;
  }
}

void sort_unique(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

size_t GrammarMatcher::StateHash::operator()(const State& s) const {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t{s.partial_value} << 16) ^ (uint64_t{s.partial_remaining} << 8) ^
               s.partial_length;
  for (int32_t x : s.stacks) {
    h ^= static_cast<uint32_t>(x);
    h *= 0x100000001b3ull;
    h ^= h >> 32;
  }
  return static_cast<size_t>(h);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocabulary,
                               GrammarMatcherOptions options)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), options_(options) {}

Result<GrammarMatcher> GrammarMatcher::create(std::shared_ptr<const Grammar> grammar,
                                              std::shared_ptr<const TokenTrie> vocabulary,
                                              GrammarMatcherOptions options) {
  if (!grammar || !vocabulary) {
    return make_error(ErrorCode::kInvalidArgument, "grammar matcher: the grammar and the vocabulary are required");
  }
  if (options.max_stacks < 1 || options.max_rollback_tokens < 0 || options.max_cached_states < 1 ||
      options.max_states_per_call < 1 || options.max_stack_frames < 1 || options.max_cached_masks < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "grammar matcher options out of range: max_stacks {}, max_rollback_tokens {}, "
                      "max_cached_states {}, max_states_per_call {}, max_stack_frames {}, max_cached_masks {}",
                      options.max_stacks, options.max_rollback_tokens, options.max_cached_states,
                      options.max_states_per_call, options.max_stack_frames, options.max_cached_masks);
  }
  GrammarMatcher m(std::move(grammar), std::move(vocabulary), options);
  const Grammar& g = *m.grammar_;
  State initial;
  for (int32_t alt : g.alternatives(g.root_rule())) {
    if (g.elements()[alt].type == GrammarElementType::kEnd) {
      initial.stacks.push_back(kAccepted);
    } else {
      TACHYON_RETURN_IF_ERROR(m.expand(m.frame(alt, kAccepted), initial.stacks));
    }
  }
  sort_unique(initial.stacks);
  if (initial.stacks.size() > static_cast<size_t>(options.max_stacks)) {
    return make_error(ErrorCode::kOutOfRange, "grammar matcher: {} parse stacks at the start, over max_stacks {}",
                      initial.stacks.size(), options.max_stacks);
  }
  m.initial_ = initial;
  m.current_ = std::move(initial);
  return m;
}

int32_t GrammarMatcher::frame(int32_t position, int32_t parent) {
  const uint64_t key = (uint64_t{static_cast<uint32_t>(position)} << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (inserted) {
    frames_.push_back(Frame{position, parent});
    successor_begin_.push_back(-1);
    successor_count_.push_back(0);
    visit_mark_.push_back(0);
  }
  return it->second;
}

Status GrammarMatcher::expand(int32_t stack, std::vector<int32_t>& out) {
  const std::vector<GrammarElement>& elements = grammar_->elements();
  if (++visit_generation_ == 0) {  // wrapped: old marks could collide
    std::fill(visit_mark_.begin(), visit_mark_.end(), 0);
    visit_generation_ = 1;
  }
  const size_t out_start = out.size();
  expand_work_.clear();
  expand_work_.push_back(stack);
  while (!expand_work_.empty()) {
    const int32_t x = expand_work_.back();
    expand_work_.pop_back();
    if (x == kAccepted) {
      out.push_back(kAccepted);
      continue;
    }
    if (visit_mark_[x] == visit_generation_) continue;
    visit_mark_[x] = visit_generation_;
    const Frame f = frames_[x];
    const GrammarElement e = elements[f.position];
    if (e.type == GrammarElementType::kChars) {
      out.push_back(x);
      if (out.size() - out_start > static_cast<size_t>(options_.max_stacks)) {
        return make_error(ErrorCode::kOutOfRange,
                          "grammar matcher: more than {} parse stacks at one point (the grammar is too ambiguous; "
                          "max_stacks)",
                          options_.max_stacks);
      }
      continue;
    }
    // A rule reference: continue after it (tail references pop the frame) under each alternative.
    const int32_t rest =
        elements[f.position + 1].type == GrammarElementType::kEnd ? f.parent : frame(f.position + 1, f.parent);
    for (int32_t alt : grammar_->alternatives(e.value)) {
      expand_work_.push_back(elements[alt].type == GrammarElementType::kEnd ? rest : frame(alt, rest));
    }
  }
  if (frames_.size() > static_cast<size_t>(options_.max_stack_frames)) {
    return make_error(ErrorCode::kOutOfRange, "grammar matcher: more than {} parse stack frames (max_stack_frames)",
                      options_.max_stack_frames);
  }
  return Status::Ok();
}

Status GrammarMatcher::successors(int32_t stack, std::span<const int32_t>& out) {
  if (successor_begin_[stack] < 0) {
    const std::vector<GrammarElement>& elements = grammar_->elements();
    const Frame f = frames_[stack];
    const int32_t next =
        elements[f.position + 1].type == GrammarElementType::kEnd ? f.parent : frame(f.position + 1, f.parent);
    std::vector<int32_t> found;
    TACHYON_RETURN_IF_ERROR(expand(next, found));
    sort_unique(found);
    successor_begin_[stack] = static_cast<int32_t>(successor_data_.size());
    successor_count_[stack] = static_cast<int32_t>(found.size());
    successor_data_.insert(successor_data_.end(), found.begin(), found.end());
  }
  out = {successor_data_.data() + successor_begin_[stack], static_cast<size_t>(successor_count_[stack])};
  return Status::Ok();
}

Status GrammarMatcher::advance_code_point(const State& from, uint32_t cp, State& to) {
  const std::vector<GrammarElement>& elements = grammar_->elements();
  to.stacks.clear();
  to.partial_value = 0;
  to.partial_remaining = 0;
  to.partial_length = 0;
  for (int32_t s : from.stacks) {
    if (s == kAccepted) continue;
    if (!grammar_->char_class(elements[frames_[s].position].value).contains(cp)) continue;
    std::span<const int32_t> next;
    TACHYON_RETURN_IF_ERROR(successors(s, next));
    to.stacks.insert(to.stacks.end(), next.begin(), next.end());
  }
  sort_unique(to.stacks);
  if (to.stacks.size() > static_cast<size_t>(options_.max_stacks)) {
    return make_error(ErrorCode::kOutOfRange,
                      "grammar matcher: {} parse stacks at one point, over the limit of {} (the grammar is too "
                      "ambiguous; max_stacks)",
                      to.stacks.size(), options_.max_stacks);
  }
  return Status::Ok();
}

Status GrammarMatcher::step(const State& from, uint8_t byte, State& to, bool& dead) {
  dead = true;
  to.stacks.clear();
  uint32_t value = 0;
  uint8_t remaining = 0;
  uint8_t length = 0;
  if (from.partial_remaining == 0) {
    if (byte < 0x80) {
      TACHYON_RETURN_IF_ERROR(advance_code_point(from, byte, to));
      dead = to.stacks.empty();
      return Status::Ok();
    }
    if (byte >= 0xC2 && byte <= 0xDF) {
      value = byte & 0x1F, length = 2;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      value = byte & 0x0F, length = 3;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      value = byte & 0x07, length = 4;
    } else {
      return Status::Ok();  // a continuation byte or one that never starts a character
    }
    remaining = static_cast<uint8_t>(length - 1);
  } else {
    if ((byte & 0xC0) != 0x80) return Status::Ok();
    value = (from.partial_value << 6) | (byte & 0x3F);
    remaining = static_cast<uint8_t>(from.partial_remaining - 1);
    length = from.partial_length;
    if (remaining == 0) {
      if (value < min_code_point(length) || value > kMaxCodePoint || (value >= 0xD800 && value <= 0xDFFF)) {
        return Status::Ok();
      }
      TACHYON_RETURN_IF_ERROR(advance_code_point(from, value, to));
      dead = to.stacks.empty();
      return Status::Ok();
    }
  }
  // A character is still unfinished: keep the stacks that can match some code point it may become.
  const unsigned shift = 6u * remaining;
  uint32_t lo = std::max(value << shift, min_code_point(length));
  uint32_t hi = std::min((value << shift) | ((1u << shift) - 1), kMaxCodePoint);
  if (lo > hi) return Status::Ok();
  const std::vector<GrammarElement>& elements = grammar_->elements();
  for (int32_t s : from.stacks) {
    if (s == kAccepted) continue;
    const CharClass& c = grammar_->char_class(elements[frames_[s].position].value);
    // Surrogates are no code points of UTF-8: test the interval around them.
    const bool viable = (lo <= 0xD7FF && c.intersects(lo, std::min(hi, 0xD7FFu))) ||
                        (hi >= 0xE000 && c.intersects(std::max(lo, 0xE000u), hi));
    if (viable) to.stacks.push_back(s);
  }
  to.partial_value = value;
  to.partial_remaining = remaining;
  to.partial_length = length;
  dead = to.stacks.empty();
  return Status::Ok();
}

int32_t GrammarMatcher::intern(const State& state) {
  auto it = state_ids_.find(state);
  if (it != state_ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(states_.size());
  states_.push_back(state);
  state_row_.push_back(-1);
  state_ids_.emplace(state, id);
  return id;
}

int32_t GrammarMatcher::transition(int32_t state_id, uint8_t byte) {
  const int32_t row = state_row_[state_id];
  if (row >= 0) {
    const int32_t cached = rows_[static_cast<size_t>(row) * 256 + byte];
    if (cached != kUnknown) return cached;
  }
  if (static_cast<int64_t>(states_.size()) - states_at_call_start_ > options_.max_states_per_call) {
    error_ = make_error(ErrorCode::kOutOfRange,
                        "grammar matcher: more than {} new parser states in one call (max_states_per_call)",
                        options_.max_states_per_call);
    return kFailed;
  }
  bool dead = true;
  const State from = states_[state_id];  // a copy: intern() below may grow states_
  Status status = step(from, byte, scratch_, dead);
  if (!status.ok()) {
    error_ = std::move(status);
    return kFailed;
  }
  const int32_t result = dead ? kDead : intern(scratch_);
  if (state_row_[state_id] < 0) {
    state_row_[state_id] = static_cast<int32_t>(rows_.size() / 256);
    rows_.resize(rows_.size() + 256, kUnknown);
  }
  rows_[static_cast<size_t>(state_row_[state_id]) * 256 + byte] = result;
  return result;
}

void GrammarMatcher::flush_cache_if_full() {
  if (states_.size() > static_cast<size_t>(options_.max_cached_states)) {
    states_.clear();
    state_ids_.clear();
    state_row_.clear();
    rows_.clear();
    mask_slot_of_state_.clear();
    mask_slot_state_.clear();
    mask_cache_.clear();
    next_mask_victim_ = 0;
    current_id_ = -1;
    ++cache_flushes_;
  }
  if (current_id_ < 0) current_id_ = intern(current_);
  states_at_call_start_ = static_cast<int32_t>(states_.size());
}

Status GrammarMatcher::run_bytes(std::string_view bytes, int32_t& state_id) {
  flush_cache_if_full();
  int32_t s = current_id_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    s = transition(s, static_cast<uint8_t>(bytes[i]));
    if (s == kFailed) return error_;
    if (s == kDead) {
      return make_error(ErrorCode::kInvalidArgument, "the grammar does not allow {} here (refused at byte {})",
                        quote_bytes(bytes), i);
    }
  }
  state_id = s;
  return Status::Ok();
}

void GrammarMatcher::remember() {
  if (options_.max_rollback_tokens == 0) return;
  if (history_.size() == static_cast<size_t>(options_.max_rollback_tokens)) history_.pop_front();
  history_.push_back(Snapshot{current_, terminated_});
}

Status GrammarMatcher::accept(int32_t token) {
  const TokenTrie& vocab = *vocabulary_;
  if (token < 0 || token >= vocab.vocab_size()) {
    return make_error(ErrorCode::kInvalidArgument, "token id {} is outside the vocabulary [0, {})", token,
                      vocab.vocab_size());
  }
  if (vocab.is_eos(token)) {
    if (!can_end()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "end-of-sequence token {} is not allowed: the grammar is not complete here", token);
    }
    remember();
    terminated_ = true;
    return Status::Ok();
  }
  if (!vocab.in_trie(token)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "token {} is a special token (or has no bytes); a grammar never allows it", token);
  }
  return accept_bytes(vocab.token_bytes(token));
}

Status GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (terminated_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the grammar already ended (end-of-sequence accepted); {} cannot follow", quote_bytes(bytes));
  }
  int32_t next = -1;
  TACHYON_RETURN_IF_ERROR(run_bytes(bytes, next));
  remember();
  current_ = states_[next];
  current_id_ = next;
  return Status::Ok();
}

Status GrammarMatcher::fill_mask(std::span<uint32_t> bitmask) {
  const TokenTrie& vocab = *vocabulary_;
  const size_t words = grammar_mask_words(vocab.vocab_size());
  if (bitmask.size() < words) {
    return make_error(ErrorCode::kInvalidArgument, "token mask has {} words; a vocabulary of {} needs {}",
                      bitmask.size(), vocab.vocab_size(), words);
  }
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  auto set = [&](int32_t id) { bitmask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31); };
  if (terminated_) {
    for (int32_t id : vocab.eos_ids()) set(id);
    return Status::Ok();
  }
  flush_cache_if_full();
  if (auto cached = mask_slot_of_state_.find(current_id_); cached != mask_slot_of_state_.end()) {
    std::copy_n(mask_cache_.begin() + static_cast<ptrdiff_t>(cached->second * words), words, bitmask.begin());
    return Status::Ok();
  }
  depth_states_.resize(vocab.max_depth() + 1);
  depth_states_[0] = current_id_;
  bool any = false;
  const int32_t num_nodes = vocab.num_nodes();
  for (int32_t i = 0; i < num_nodes;) {
    const uint16_t depth = vocab.node_depth(i);
    const uint8_t byte = vocab.node_byte(i);
    const int32_t parent = depth_states_[depth - 1];
    // The cached transition inline; transition() computes the missing ones.
    const int32_t row = state_row_[parent];
    int32_t next = row >= 0 ? rows_[static_cast<size_t>(row) * 256 + byte] : kUnknown;
    if (next == kUnknown) next = transition(parent, byte);
    if (next < 0) {
      if (next == kFailed) return error_;
      i = vocab.subtree_end(i);
      continue;
    }
    depth_states_[depth] = next;
    for (int32_t id : vocab.node_tokens(i)) {
      set(id);
      any = true;
    }
    ++i;
  }
  if (can_end()) {
    for (int32_t id : vocab.eos_ids()) set(id);
    any = any || !vocab.eos_ids().empty();
  }
  if (!any) {
    return make_error(ErrorCode::kOutOfRange,
                      "no token of the vocabulary can continue the grammar here, and the grammar is not complete");
  }
  remember_mask(bitmask.first(words));
  return Status::Ok();
}

void GrammarMatcher::remember_mask(std::span<const uint32_t> mask) {
  if (options_.max_cached_masks <= 0) return;
  int32_t slot = 0;
  if (static_cast<int32_t>(mask_slot_state_.size()) < options_.max_cached_masks) {
    slot = static_cast<int32_t>(mask_slot_state_.size());
    mask_slot_state_.push_back(current_id_);
    mask_cache_.resize(mask_cache_.size() + mask.size());
  } else {  // round robin: cheap, and good enough for the few states a grammar keeps returning to
    slot = next_mask_victim_;
    next_mask_victim_ = (next_mask_victim_ + 1) % options_.max_cached_masks;
    mask_slot_of_state_.erase(mask_slot_state_[slot]);
    mask_slot_state_[slot] = current_id_;
  }
  mask_slot_of_state_[current_id_] = slot;
  std::copy(mask.begin(), mask.end(), mask_cache_.begin() + static_cast<ptrdiff_t>(slot * mask.size()));
}

bool GrammarMatcher::can_end() const {
  if (terminated_) return true;
  return current_.partial_remaining == 0 && !current_.stacks.empty() && current_.stacks.front() == kAccepted;
}

Status GrammarMatcher::rollback(int32_t num_tokens) {
  if (num_tokens < 0 || static_cast<size_t>(num_tokens) > history_.size()) {
    return make_error(ErrorCode::kOutOfRange,
                      "grammar matcher: cannot roll back {} tokens; {} are remembered (max_rollback_tokens {})",
                      num_tokens, history_.size(), options_.max_rollback_tokens);
  }
  if (num_tokens == 0) return Status::Ok();
  const Snapshot& target = history_[history_.size() - static_cast<size_t>(num_tokens)];
  current_ = target.state;
  terminated_ = target.terminated;
  history_.resize(history_.size() - static_cast<size_t>(num_tokens));
  current_id_ = -1;
  return Status::Ok();
}

void GrammarMatcher::reset() {
  current_ = initial_;
  current_id_ = -1;
  terminated_ = false;
  history_.clear();
}

}  // namespace tachyon
