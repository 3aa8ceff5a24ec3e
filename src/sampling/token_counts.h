// TokenCounts: the token history the penalties read, kept sparse (one entry per distinct token,
// never a dense [vocab] array), so a step costs O(distinct tokens seen), not O(vocab).
// Prompt tokens are recorded once (they feed only the repetition penalty); each generated token
// is added as it is accepted (it feeds all three penalties).
// Invariant: every entry has in_prompt or output_count > 0.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

namespace tachyon {

class TokenCounts {
 public:
  struct Entry {
    int32_t output_count = 0;  // times generated so far
    bool in_prompt = false;    // appears in the prompt at least once
  };

  // Marks every token of `prompt_tokens` as seen in the prompt. May be called more than once
  // (for a prompt fed in chunks); a repeated token stays one entry.
  void add_prompt(std::span<const int32_t> prompt_tokens);
  // Records one generated token.
  void add_output(int32_t token);
  void clear() { entries_.clear(); }

  int32_t output_count(int32_t token) const;
  bool in_prompt(int32_t token) const;
  // Token id -> entry; iteration order is unspecified (each penalty touches one token, so the
  // order never changes a result).
  const std::unordered_map<int32_t, Entry>& entries() const { return entries_; }

 private:
  std::unordered_map<int32_t, Entry> entries_;
};

}  // namespace tachyon
