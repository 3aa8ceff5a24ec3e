// TokenCounts: sparse per-request token history for the sampling penalties.
#include "sampling/token_counts.h"

namespace tachyon {

void TokenCounts::add_prompt(std::span<const int32_t> prompt_tokens) {
  for (const int32_t token : prompt_tokens) entries_[token].in_prompt = true;
}

void TokenCounts::add_output(int32_t token) { ++entries_[token].output_count; }

int32_t TokenCounts::output_count(int32_t token) const {
  const auto it = entries_.find(token);
  return it == entries_.end() ? 0 : it->second.output_count;
}

bool TokenCounts::in_prompt(int32_t token) const {
  const auto it = entries_.find(token);
  return it != entries_.end() && it->second.in_prompt;
}

}  // namespace tachyon
