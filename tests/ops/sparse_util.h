// Test helpers for block-sparse decode attention (ops.h select_kv_blocks): decode batches whose
// sequences hold their older blocks in int8 / int4 history pools with key bounds, laid out as a
// block manager lays them out (history entries first, then the full-precision window).
#pragma once

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace tachyon::testing {

struct SparseCase {
  Tensor q;        // [rows, num_heads, head_dim] f32: each sequence's queries (SparseSpec::q_lens)
  KvLayer cache;   // primary pools (history blocks' primaries poisoned), history pools, key bounds
  AttentionMetadata meta;  // with sparse_budgets
};

struct SparseSpec {
  std::vector<int> contexts;  // per sequence
  std::vector<int> budgets;   // per sequence (tokens; 0: dense)
  std::vector<int> q_lens;    // per sequence: its queries, the last positions (empty: one each)
  int num_heads = 4, num_kv_heads = 2, head_dim = 64, block_size = 16;
  DType dtype = DType::kF32;
  int bits = 4;
  int resident_blocks = 3;  // the window: the last entries of each table stay full precision
  int sink_blocks = 1;
  float key_range = 1.0f;   // keys uniform in [-key_range, key_range]
};

// The primary pool holds every sequence's blocks at shuffled ids; all but each table's last
// resident_blocks entries are compressed (the reference, which also computes their key bounds)
// into history blocks in table order. `prepare` may change the keys (and q) first.
inline SparseCase make_sparse_case(const SparseSpec& spec, std::mt19937& rng,
                                   const std::function<void(SparseCase&)>& prepare = {}) {
  const int64_t bs = spec.block_size, kvh = spec.num_kv_heads, hd = spec.head_dim;
  const int num_seqs = static_cast<int>(spec.contexts.size());
  std::vector<int64_t> entries(static_cast<size_t>(num_seqs));
  int64_t total = 0, max_entries = 1, max_context = 0;
  for (int s = 0; s < num_seqs; ++s) {
    entries[static_cast<size_t>(s)] = (spec.contexts[static_cast<size_t>(s)] + bs - 1) / bs;
    total += entries[static_cast<size_t>(s)];
    max_entries = std::max(max_entries, entries[static_cast<size_t>(s)]);
    max_context = std::max<int64_t>(max_context, spec.contexts[static_cast<size_t>(s)]);
  }
  SparseCase c;
  const std::vector<int64_t> shape = {total, bs, kvh, hd};
  c.cache.k = convert(random_tensor(shape, rng, -spec.key_range, spec.key_range), spec.dtype);
  c.cache.v = convert(random_tensor(shape, rng, -1.0f, 1.0f), spec.dtype);
  std::vector<int32_t> ids(static_cast<size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  AttentionMetadata& m = c.meta;
  m.num_seqs = num_seqs;
  m.block_size = static_cast<int>(bs);
  m.max_query_len = 1;
  int total_rows = 0;
  const auto q_len = [&](int s) { return spec.q_lens.empty() ? 1 : spec.q_lens[static_cast<size_t>(s)]; };
  for (int s = 0; s < num_seqs; ++s) {
    total_rows += q_len(s);
    m.max_query_len = std::max(m.max_query_len, q_len(s));
  }
  m.max_context_len = static_cast<int>(max_context);
  m.sparse_sink_blocks = spec.sink_blocks;
  m.query_start = Tensor::empty({num_seqs + 1}, DType::kI32);
  m.context_lens = Tensor::empty({num_seqs}, DType::kI32);
  m.block_tables = Tensor::empty({num_seqs, max_entries}, DType::kI32);
  m.slot_mapping = Tensor::zeros({total_rows}, DType::kI32);
  m.sparse_budgets = Tensor::empty({num_seqs}, DType::kI32);
  int32_t* tables = m.block_tables.data<int32_t>();
  std::fill(tables, tables + m.block_tables.numel(), -1);
  size_t next = 0;
  std::vector<std::pair<int32_t*, int32_t>> to_history;  // (entry, primary block)
  int next_row = 0;
  for (int s = 0; s < num_seqs; ++s) {
    m.query_start.data<int32_t>()[s] = next_row;
    next_row += q_len(s);
    m.context_lens.data<int32_t>()[s] = spec.contexts[static_cast<size_t>(s)];
    m.sparse_budgets.data<int32_t>()[s] = spec.budgets[static_cast<size_t>(s)];
    const int64_t e = entries[static_cast<size_t>(s)];
    for (int64_t i = 0; i < e; ++i) {
      int32_t* entry = tables + s * max_entries + i;
      *entry = ids[next++];
      if (i < e - spec.resident_blocks) to_history.emplace_back(entry, *entry);
    }
  }
  m.query_start.data<int32_t>()[num_seqs] = total_rows;
  c.q = random_tensor({total_rows, spec.num_heads, hd}, rng, -1.0f, 1.0f);
  if (prepare) prepare(c);

  const int64_t nh = std::max<int64_t>(1, static_cast<int64_t>(to_history.size()));
  const DType code_dtype = spec.bits == 8 ? DType::kI8 : DType::kU8;
  const int64_t row = spec.bits == 8 ? hd : hd / 2, params = spec.bits == 8 ? 1 : 2;
  c.cache.hk = Tensor::zeros({nh, bs, kvh, row}, code_dtype);
  c.cache.hv = Tensor::zeros({nh, bs, kvh, row}, code_dtype);
  const DType params_dtype = spec.bits == 8 ? DType::kF32 : DType::kF16;
  c.cache.hk_params = nan_tensor({nh, bs, kvh, params}, params_dtype);
  c.cache.hv_params = nan_tensor({nh, bs, kvh, params}, params_dtype);
  c.cache.kbounds = Tensor::zeros({nh, kvh, 2, hd / 2}, DType::kU8);
  c.cache.kbound_params = nan_tensor({nh, kvh, ops::key_bound_groups(hd), 2});
  Tensor pairs = Tensor::empty({static_cast<int64_t>(to_history.size()), 2}, DType::kI32);
  for (size_t h = 0; h < to_history.size(); ++h) {
    pairs.data<int32_t>()[2 * h] = to_history[h].second;
    pairs.data<int32_t>()[2 * h + 1] = static_cast<int32_t>(h);
  }
  if (!to_history.empty()) ops::reference::compress_kv_blocks(pairs, c.cache);
  for (size_t h = 0; h < to_history.size(); ++h) {
    for (Tensor* pool : {&c.cache.k, &c.cache.v}) {
      Tensor block = pool->select(0, to_history[h].second);
      fill_nan(block);
    }
    *to_history[h].first = static_cast<int32_t>(total + static_cast<int64_t>(h));
  }
  return c;
}

// The retrieval case: one sequence of 32,768 positions (one kv head, four query heads, a 512-token
// window of full-precision blocks) whose key at (planted_block, planted_slot) is q(query head
// planted_head) * score / |q|^2, so that q . k = score stands far above random keys' scores.
struct PlantedKey {
  SparseCase c;
  int planted_block = 0;  // the table entry
  int32_t planted_id = 0; // its history block's table id
};
inline PlantedKey make_planted_key_case(int head_dim, int bits, float score, std::mt19937& rng) {
  SparseSpec spec;
  spec.contexts = {32768};
  spec.budgets = {16};
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_dim = head_dim;
  spec.bits = bits;
  spec.resident_blocks = 32;
  PlantedKey p;
  p.planted_block = 37 + static_cast<int>(rng() % 1500);
  const int slot = static_cast<int>(rng() % 16), head = static_cast<int>(rng() % 4);
  p.c = make_sparse_case(spec, rng, [&](SparseCase& sc) {
    const int32_t block = sc.meta.block_tables.data<int32_t>()[p.planted_block];
    const float* q = sc.q.data<float>() + head * head_dim;
    double norm2 = 0.0;
    for (int d = 0; d < head_dim; ++d) norm2 += q[d] * q[d];
    float* k = sc.cache.k.data<float>() + (block * 16 + slot) * head_dim;
    for (int d = 0; d < head_dim; ++d) k[d] = static_cast<float>(q[d] * score / norm2);
  });
  p.planted_id = p.c.meta.block_tables.data<int32_t>()[p.planted_block];
  return p;
}

}  // namespace tachyon::testing
