// paged_attention (AVX2): online softmax over a sequence's cache blocks, read in place through its
// block table — never gathered, never an S x S score matrix.
//
// Work item = (sequence, kv head, a chunk of the sequence's query rows). Its rows are the chunk's
// tokens x the query heads sharing that kv head (GQA), at most kRowsPerItem, so a K/V block
// fetched once from memory serves every row from L1. Per row: q pre-scaled, running max m,
// running sum l, accumulator acc[head_dim]; per block: scores of the row's visible keys (causal,
// sliding window), one rescale of acc by e^(m_old - m_new), then acc += p_j v_j. Items are split
// over threads by estimated cost (rows x visible keys), contiguous per thread. A quantized cache
// (i8 / f8e4m3) is read as codes: a key's score is its code dot product times the row's scale,
// and a value's weight p_j is multiplied by its row's scale before the axpy.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/reference.h"
#include "ops/cpu/vec_avx2.h"

namespace tachyon::ops::cpu {
namespace {

constexpr int64_t kRowsPerItem = 16;

struct Item {
  int seq = 0;
  int64_t kv_head = 0;
  int64_t row_begin = 0, row_end = 0;  // query rows of the flattened batch
  double cost = 0.0;
};

struct Problem {
  const float* q;
  int64_t q_token_stride, q_head_stride;
  int64_t num_heads, group;
  const KvCacheView* cache;
  const AttentionBatch* batch;
  const AttentionParams* params;
  float* out;
  int64_t out_token_stride, out_head_stride;
};

// Per-thread scratch, reused across items.
struct Scratch {
  std::vector<float> q;       // [rows, head_dim] scaled queries
  std::vector<float> acc;     // [rows, head_dim]
  std::vector<float> m, l;    // [rows]
  std::vector<float> scores;  // [block_size]
  std::vector<float> hk, hv;  // [block_size, head_dim]: a history block's rows of one kv head, decoded
};

// Rows of kv head `kv_head` in history block `block` (ops.h KvLayer), decoded into k, v
// [block_size, head_dim] f32.
void decode_history_block(const KvCacheView& cache, int64_t block, int64_t kv_head, float* k, float* v) {
  const int64_t hd = cache.head_dim, bits = cache.history_bits;
  const int64_t code_bytes = bits == 8 ? hd : hd / 2;
  for (int64_t t = 0; t < cache.block_size; ++t) {
    const int64_t row = (block * cache.block_size + t) * cache.num_kv_heads + kv_head;
    for (int which = 0; which < 2; ++which) {
      const auto* codes = static_cast<const uint8_t*>(which == 0 ? cache.hk : cache.hv) + row * code_bytes;
      // 4 bytes of params a row: an f32 s (int8), or f16 s and lo (int4).
      const auto* params = static_cast<const uint8_t*>(which == 0 ? cache.hk_params : cache.hv_params) + row * 4;
      float* out = (which == 0 ? k : v) + t * hd;
      if (bits == 8) {
        const auto* c = reinterpret_cast<const int8_t*>(codes);
        const float s = *reinterpret_cast<const float*>(params);
        for (int64_t i = 0; i < hd; ++i) out[i] = static_cast<float>(c[i]) * s;
      } else {
        const auto [s, lo] = reference::int4_history_params(params);
        for (int64_t i = 0; i < hd; i += 2) {
          out[i] = lo + static_cast<float>(codes[i / 2] & 0xf) * s;
          out[i + 1] = lo + static_cast<float>(codes[i / 2] >> 4) * s;
        }
      }
    }
  }
}

template <class L>
inline float dot_row(const float* q, const typename L::T* k, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), L::load(k + i + 8), a1);
  }
  for (; i + 8 <= d; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load(k + i), a0);
  float s = avx2::hsum(_mm256_add_ps(a0, a1));
  for (; i < d; ++i) s += q[i] * L::scalar(k[i]);
  return s;
}

// acc = acc * alpha.
inline void scale_acc(float* acc, float alpha, int64_t d) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), va));
  for (; i < d; ++i) acc[i] *= alpha;
}

// acc += p * v.
template <class L>
inline void axpy_row(float* acc, float p, const typename L::T* v, int64_t d) {
  const __m256 vp = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, L::load(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < d; ++i) acc[i] += p * L::scalar(v[i]);
}

// scores[0, n) = e^(scores - m); returns their sum.
inline float exp_and_sum(float* scores, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(scores + i), vm));
    _mm256_storeu_ps(scores + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = avx2::hsum(vsum);
  for (; i < n; ++i) {
    scores[i] = std::exp(scores[i] - m);
    sum += scores[i];
  }
  return sum;
}

template <class L>
void run_item(const Problem& p, const Item& it, Scratch& sc) {
  using T = typename L::T;
  const KvCacheView& cache = *p.cache;
  const AttentionBatch& batch = *p.batch;
  const int64_t head_dim = cache.head_dim;
  const int64_t block_size = cache.block_size;
  const int64_t key_stride = cache.num_kv_heads * head_dim;  // between consecutive slots
  const int64_t window = p.params->sliding_window;
  const int64_t q_begin = batch.query_start[it.seq], q_end = batch.query_start[it.seq + 1];
  // Block-sparse: the kept blocks of this kv head are the query's context (ops.h paged_attention).
  const bool sparse = batch.sparse_tables != nullptr;
  const int64_t sparse_row = it.seq * cache.num_kv_heads + it.kv_head;
  const int64_t context_len = sparse ? batch.sparse_lens[sparse_row] : batch.context_lens[it.seq];
  const int64_t pos0 = context_len - (q_end - q_begin) - q_begin;  // position of row r = pos0 + r
  const int64_t chunk_start = context_len - (q_end - q_begin);     // cache index of the chunk's first key
  const int32_t* block_table = sparse ? batch.sparse_tables + sparse_row * batch.max_blocks_per_seq
                                      : batch.block_tables + it.seq * batch.max_blocks_per_seq;
  const T* k_base = static_cast<const T*>(cache.k) + it.kv_head * head_dim;
  const T* v_base = static_cast<const T*>(cache.v) + it.kv_head * head_dim;
  // Quantized caches: the (slot, head) scales of this kv head, num_kv_heads apart per slot.
  const float* k_scales = cache.k_scales != nullptr ? cache.k_scales + it.kv_head : nullptr;
  const float* v_scales = cache.v_scales != nullptr ? cache.v_scales + it.kv_head : nullptr;

  const int64_t rows = (it.row_end - it.row_begin) * p.group;
  auto row_token = [&](int64_t r) { return it.row_begin + r / p.group; };
  auto row_head = [&](int64_t r) { return it.kv_head * p.group + r % p.group; };
  auto first_key = [&](int64_t pos) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : int64_t{0}; };

  const float scale = p.params->scale;
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = p.q + row_token(r) * p.q_token_stride + row_head(r) * p.q_head_stride;
    float* qs = sc.q.data() + r * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) qs[i] = qr[i] * scale;
    std::fill(sc.acc.begin() + r * head_dim, sc.acc.begin() + (r + 1) * head_dim, 0.0f);
    sc.m[static_cast<size_t>(r)] = -std::numeric_limits<float>::infinity();
    sc.l[static_cast<size_t>(r)] = 0.0f;
  }

  const int64_t key_min = first_key(pos0 + it.row_begin);
  const int64_t key_max = pos0 + it.row_end - 1;
  // One block's keys for every row: k/v rows `stride` elements apart, their scales (quantized
  // caches) `scale_stride` apart. LB reads the rows (the cache's dtype, or f32 history scratch).
  const auto attend = [&]<class LB>(LB, const typename LB::T* kb, const typename LB::T* vb, const float* ksb,
                                    const float* vsb, int64_t stride, int64_t scale_stride, int64_t j_first) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = pos0 + row_token(r);
      const int64_t lo = std::max(j_first, first_key(pos));
      const int64_t hi = std::min(j_first + block_size - 1, pos);
      if (lo > hi) continue;
      const int64_t count = hi - lo + 1;
      const float* qs = sc.q.data() + r * head_dim;
      float* acc = sc.acc.data() + r * head_dim;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = lo; j <= hi; ++j) {
        float s = dot_row<LB>(qs, kb + (j - j_first) * stride, head_dim);
        if (ksb != nullptr) s *= ksb[(j - j_first) * scale_stride];
        sc.scores[static_cast<size_t>(j - lo)] = s;
        block_max = std::max(block_max, s);
      }
      const uint64_t mask = batch.tree_masks != nullptr ? batch.tree_masks[row_token(r)] : ~uint64_t{0};
      if (mask != ~uint64_t{0} && hi >= chunk_start) {  // tree: only the row's ancestors in the chunk
        block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= hi; ++j) {
          float& s = sc.scores[static_cast<size_t>(j - lo)];
          if (j >= chunk_start && (mask >> (j - chunk_start) & 1) == 0) s = -std::numeric_limits<float>::infinity();
          block_max = std::max(block_max, s);
        }
        if (block_max == -std::numeric_limits<float>::infinity()) continue;  // no key of this block is seen
      }
      float& m = sc.m[static_cast<size_t>(r)];
      float& l = sc.l[static_cast<size_t>(r)];
      if (block_max > m) {
        const float alpha = std::exp(m - block_max);  // 0 on the first block (m = -inf)
        scale_acc(acc, alpha, head_dim);
        l *= alpha;
        m = block_max;
      }
      l += exp_and_sum(sc.scores.data(), count, m);
      for (int64_t j = lo; j <= hi; ++j) {
        float pj = sc.scores[static_cast<size_t>(j - lo)];
        if (vsb != nullptr) pj *= vsb[(j - j_first) * scale_stride];
        axpy_row<LB>(acc, pj, vb + (j - j_first) * stride, head_dim);
      }
    }
  };
  for (int64_t b = key_min / block_size; b <= key_max / block_size; ++b) {
    const int64_t block = block_table[b];
    TACHYON_CHECK(block >= 0 && block < cache.num_blocks + cache.num_history_blocks,
                  "paged_attention: seq {} block {} -> {} (cache has {}, and {} history blocks)", it.seq, b, block,
                  cache.num_blocks, cache.num_history_blocks);
    const int64_t j_first = b * block_size;  // position of the block's slot 0
    if (block >= cache.num_blocks) {  // history: this head's rows decoded into f32 scratch
      decode_history_block(cache, block - cache.num_blocks, it.kv_head, sc.hk.data(), sc.hv.data());
      attend(avx2::LoadF32{}, sc.hk.data(), sc.hv.data(), nullptr, nullptr, head_dim, 0, j_first);
      continue;
    }
    const T* kb = k_base + block * block_size * key_stride;
    const T* vb = v_base + block * block_size * key_stride;
    const float* ksb = k_scales != nullptr ? k_scales + block * block_size * cache.num_kv_heads : nullptr;
    const float* vsb = v_scales != nullptr ? v_scales + block * block_size * cache.num_kv_heads : nullptr;
    attend(L{}, kb, vb, ksb, vsb, key_stride, cache.num_kv_heads, j_first);
  }

  for (int64_t r = 0; r < rows; ++r) {
    float* o = p.out + row_token(r) * p.out_token_stride + row_head(r) * p.out_head_stride;
    const float* acc = sc.acc.data() + r * head_dim;
    const float inv = 1.0f / sc.l[static_cast<size_t>(r)];
    for (int64_t i = 0; i < head_dim; ++i) o[i] = acc[i] * inv;
  }
}

template <class L>
void run_all(const Problem& p, const std::vector<Item>& items, const std::vector<size_t>& bounds) {
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  parallel_for(parts, 1, [&](int64_t part_begin, int64_t part_end) {
    Scratch sc;
    const int64_t max_rows = kRowsPerItem * std::max<int64_t>(1, p.group);
    sc.q.resize(static_cast<size_t>(max_rows * p.cache->head_dim));
    sc.acc.resize(sc.q.size());
    sc.m.resize(static_cast<size_t>(max_rows));
    sc.l.resize(static_cast<size_t>(max_rows));
    sc.scores.resize(static_cast<size_t>(p.cache->block_size));
    if (p.cache->history_bits != 0) {
      sc.hk.resize(static_cast<size_t>(p.cache->block_size * p.cache->head_dim));
      sc.hv.resize(sc.hk.size());
    }
    for (size_t i = bounds[static_cast<size_t>(part_begin)]; i < bounds[static_cast<size_t>(part_end)]; ++i) {
      run_item<L>(p, items[i], sc);
    }
  });
}

}  // namespace

void paged_attention(const float* q, int64_t q_token_stride, int64_t q_head_stride, int64_t num_heads,
                     const KvCacheView& cache, const AttentionBatch& batch, const AttentionParams& params, float* out,
                     int64_t out_token_stride, int64_t out_head_stride) {
  log_path_once("paged_attention: avx2 online-softmax {} cache{}", dtype_name(cache.dtype),
                cache.history_bits != 0 ? fmt::format(" with int{} history blocks", cache.history_bits) : "");
  const int64_t group = num_heads / cache.num_kv_heads;
  const int64_t tokens_per_item = std::max<int64_t>(1, kRowsPerItem / group);

  std::vector<Item> items;
  double total_cost = 0.0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int64_t q_begin = batch.query_start[s], q_end = batch.query_start[s + 1];
    const int64_t context_len = batch.context_lens[s];
    for (int64_t h = 0; h < cache.num_kv_heads; ++h) {
      for (int64_t r = q_begin; r < q_end; r += tokens_per_item) {
        Item it;
        it.seq = s;
        it.kv_head = h;
        it.row_begin = r;
        it.row_end = std::min(q_end, r + tokens_per_item);
        const int64_t last_pos = context_len - (q_end - it.row_end) - 1;
        const int64_t keys =
            params.sliding_window > 0 ? std::min<int64_t>(last_pos + 1, params.sliding_window) : last_pos + 1;
        it.cost = static_cast<double>((it.row_end - it.row_begin) * group) * static_cast<double>(keys + 16);
        total_cost += it.cost;
        items.push_back(it);
      }
    }
  }
  if (items.empty()) return;

  // Contiguous runs of items of about equal cost, one per thread.
  const int64_t parts = std::min<int64_t>(num_threads(), static_cast<int64_t>(items.size()));
  std::vector<size_t> bounds(1, 0);
  double running = 0.0;
  for (size_t i = 0; i < items.size(); ++i) {
    running += items[i].cost;
    const double target = total_cost * static_cast<double>(bounds.size()) / static_cast<double>(parts);
    if (running >= target && static_cast<int64_t>(bounds.size()) < parts) bounds.push_back(i + 1);
  }
  bounds.push_back(items.size());

  Problem p{q,      q_token_stride, q_head_stride, num_heads,        group,          &cache,
            &batch, &params,        out,           out_token_stride, out_head_stride};
  switch (cache.dtype) {
    case DType::kF32: run_all<avx2::LoadF32>(p, items, bounds); break;
    case DType::kBF16: run_all<avx2::LoadBf16>(p, items, bounds); break;
    case DType::kF16: run_all<avx2::LoadF16>(p, items, bounds); break;
    case DType::kI8: run_all<avx2::LoadI8>(p, items, bounds); break;
    case DType::kF8E4M3: run_all<avx2::LoadF8E4M3>(p, items, bounds); break;
    default: TACHYON_CHECK(false, "paged_attention: cache dtype {}", dtype_name(cache.dtype));
  }
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
