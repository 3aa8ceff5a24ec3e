#include "model/forward_batch.h"

#include <algorithm>

namespace tachyon {

ForwardBatch build_forward_batch(const std::vector<SequenceChunk>& chunks) {
  TACHYON_CHECK(!chunks.empty(), "empty batch");
  int64_t n_tokens = 0, n_logits = 0;
  size_t max_blocks = 0;
  bool any_tree = false;
  const int block_size = chunks[0].block_table->block_size();
  for (const auto& c : chunks) {
    TACHYON_CHECK(c.block_table->block_size() == block_size, "mixed block sizes");
    TACHYON_CHECK(c.block_table->num_tokens() >= c.start_position + static_cast<int>(c.tokens.size()),
                  "block table holds {} tokens, chunk ends at {}", c.block_table->num_tokens(),
                  c.start_position + c.tokens.size());
    n_tokens += static_cast<int64_t>(c.tokens.size());
    n_logits += c.logits == LogitsWanted::kAll ? static_cast<int64_t>(c.tokens.size())
                : c.logits == LogitsWanted::kLast ? 1 : 0;
    max_blocks = std::max(max_blocks, c.block_table->blocks().size());
    if (!c.tree_parents.empty()) {
      TACHYON_CHECK(c.tree_parents.size() == c.tokens.size() && c.tokens.size() <= static_cast<size_t>(kMaxTreeTokens),
                    "a token tree of {} parents for {} tokens (at most {})", c.tree_parents.size(), c.tokens.size(),
                    kMaxTreeTokens);
      for (size_t i = 0; i < c.tree_parents.size(); ++i) {
        const int32_t parent = c.tree_parents[i];
        TACHYON_CHECK(i == 0 ? parent == -1 : parent >= 0 && parent < static_cast<int32_t>(i),
                      "token tree: token {} has parent {}", i, parent);
      }
      any_tree = any_tree || c.tokens.size() > 1;
    }
  }
  const int num_seqs = static_cast<int>(chunks.size());
  ForwardBatch b;
  b.token_ids = Tensor::empty({n_tokens}, DType::kI32);
  b.positions = Tensor::empty({n_tokens}, DType::kI32);
  b.logits_rows = Tensor::empty({n_logits}, DType::kI32);
  AttentionMetadata& m = b.attention;
  m.num_seqs = num_seqs;
  m.block_size = block_size;
  m.query_start = Tensor::empty({num_seqs + 1}, DType::kI32);
  m.context_lens = Tensor::empty({num_seqs}, DType::kI32);
  m.block_tables = Tensor::empty({num_seqs, static_cast<int64_t>(std::max<size_t>(max_blocks, 1))}, DType::kI32);
  m.slot_mapping = Tensor::empty({n_tokens}, DType::kI32);
  int32_t* ids = b.token_ids.data<int32_t>();
  int32_t* pos = b.positions.data<int32_t>();
  int32_t* slots = m.slot_mapping.data<int32_t>();
  int32_t* rows = b.logits_rows.data<int32_t>();
  int32_t* qs = m.query_start.data<int32_t>();
  int32_t* ctx = m.context_lens.data<int32_t>();
  int32_t* tables = m.block_tables.data<int32_t>();
  std::fill(tables, tables + m.block_tables.numel(), -1);
  uint64_t* masks = nullptr;
  if (any_tree) {
    m.tree_masks = Tensor::empty({n_tokens}, DType::kI64);
    masks = static_cast<uint64_t*>(m.tree_masks.raw_data());
  }
  int32_t row = 0, logit_row = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const SequenceChunk& c = chunks[static_cast<size_t>(s)];
    qs[s] = row;
    const int len = static_cast<int>(c.tokens.size());
    ctx[s] = c.start_position + len;
    m.max_query_len = std::max(m.max_query_len, len);
    m.max_context_len = std::max(m.max_context_len, ctx[s]);
    const auto& blocks = c.block_table->blocks();
    std::copy(blocks.begin(), blocks.end(), tables + static_cast<size_t>(s) * static_cast<size_t>(m.block_tables.size(1)));
    for (int i = 0; i < len; ++i) {
      ids[row + i] = c.tokens[static_cast<size_t>(i)];
      pos[row + i] = c.start_position + i;
      slots[row + i] = c.block_table->slot(c.start_position + i);
      if (c.logits == LogitsWanted::kAll) rows[logit_row++] = row + i;
      if (masks == nullptr) continue;
      if (c.tree_parents.empty()) {  // a chain: causal
        masks[row + i] = ~uint64_t{0};
      } else {  // ancestors and itself; depth from the parent's position
        const int32_t parent = c.tree_parents[static_cast<size_t>(i)];
        masks[row + i] = (parent < 0 ? 0 : masks[row + parent]) | uint64_t{1} << i;
        pos[row + i] = parent < 0 ? c.start_position : pos[row + parent] + 1;
      }
    }
    if (c.logits == LogitsWanted::kLast && len > 0) rows[logit_row++] = row + len - 1;
    row += len;
  }
  qs[num_seqs] = row;
  // Block-sparse attention applies to one-token chunks (decode steps); the others attend densely.
  const auto sparse_budget = [](const SequenceChunk& c) { return c.tokens.size() == 1 ? std::max(0, c.sparse_budget) : 0; };
  if (std::any_of(chunks.begin(), chunks.end(), [&](const SequenceChunk& c) { return sparse_budget(c) > 0; })) {
    m.sparse_budgets = Tensor::empty({num_seqs}, DType::kI32);
    for (int s = 0; s < num_seqs; ++s) m.sparse_budgets.data<int32_t>()[s] = sparse_budget(chunks[static_cast<size_t>(s)]);
  }
  return b;
}

}  // namespace tachyon
