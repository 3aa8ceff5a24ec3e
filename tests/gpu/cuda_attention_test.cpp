// CUDA paged attention == the scalar reference's paged attention (which tests/ops ties to textbook
// attention over contiguous K/V): mixed batches (prefill chunks and decode rows) through the
// prefill kernel, all-decode batches through the split-K decode kernel at several split counts,
// each on the tensor-core kernels where the planner picks them and on the CUDA-core kernels,
// GQA group sizes 1..8, odd head dims, sliding windows, f32/f16/bf16 caches and the quantized
// i8/f8e4m3 ones (the reference reads the same codes and scales, so the CUDA-core kernels keep
// the f32 tolerances; the tensor-core kernels, decode and prefill, have bf16's), block sizes 16
// and 5, shuffled block tables. Cache slots a query must not
// read (unowned blocks, keys before a window) hold NaN (quantized: NaN scales), and released
// blocks are -1 in the table, so reading them shows up. The decode kernels' 16-bit copy of
// their output (for the o_proj linear) is that output rounded. The last tests run store_kv and
// paged_attention through ops.h on device tensors (the CUDA backend).
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "core/device_memory.h"
#include "core/dtype.h"
#include "gpu_test_util.h"
#include "ops/cpu/reference.h"
#include "ops/kv_history_util.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

using testing::all_close;
using testing::Mirror;
namespace cu = ::tachyon::ops::cuda;

struct SeqSpec {
  int context_len;
  int q_len;
};

struct Scenario {
  int num_heads = 4, num_kv_heads = 2, head_dim = 64, block_size = 16;
  int sliding_window = 0;
  DType cache_dtype = DType::kF32;
  int history_bits = 0;  // 8 / 4: about half the blocks moved into history pools
  std::vector<SeqSpec> seqs;

  std::string describe() const {
    std::string s = fmt::format("heads={} kv_heads={} head_dim={} block={} window={} cache={} history={} seqs=",
                                num_heads, num_kv_heads, head_dim, block_size, sliding_window,
                                dtype_name(cache_dtype), history_bits);
    for (const auto& q : seqs) s += fmt::format("({} ctx, {} q)", q.context_len, q.q_len);
    return s;
  }
};

// The host batch (what the reference reads) and its device mirror.
struct Batch {
  Tensor q;       // [n, num_heads, head_dim] f32
  KvLayer cache;  // [num_blocks, block_size, num_kv_heads, head_dim] (+ [.., 1] f32 scales if quantized)
  AttentionMetadata meta;
  AttentionParams params;
};

// A cache layer that reads as NaN everywhere: NaN values, or for a quantized cache NaN scales
// (and codes 0x7f: 127, or e4m3's NaN).
KvLayer nan_layer(const std::vector<int64_t>& shape, DType dtype) {
  KvLayer layer;
  if (!ops::is_quantized_kv_dtype(dtype)) {
    layer.k = testing::nan_tensor(shape, dtype);
    layer.v = testing::nan_tensor(shape, dtype);
    return layer;
  }
  layer.k = Tensor::empty(shape, dtype);
  std::memset(layer.k.raw_data(), 0x7f, layer.k.nbytes());
  layer.v = layer.k.contiguous();
  layer.k_scales = testing::nan_tensor({shape[0], shape[1], shape[2], 1});
  layer.v_scales = testing::nan_tensor({shape[0], shape[1], shape[2], 1});
  return layer;
}

Batch build(const Scenario& sc, std::mt19937& rng) {
  Batch b;
  const int num_seqs = static_cast<int>(sc.seqs.size());
  std::vector<int> blocks_needed;
  int total_blocks = 0, max_blocks = 0, n = 0;
  for (const auto& s : sc.seqs) {
    const int blocks = (s.context_len + sc.block_size - 1) / sc.block_size;
    blocks_needed.push_back(blocks);
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks);
    n += s.q_len;
  }
  const int pool = total_blocks + 3;  // a few blocks nobody owns (NaN)
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  const std::vector<int64_t> cache_shape = {pool, sc.block_size, sc.num_kv_heads, sc.head_dim};
  b.cache = nan_layer(cache_shape, sc.cache_dtype);
  b.meta.num_seqs = num_seqs;
  b.meta.block_size = sc.block_size;
  b.meta.query_start = Tensor::empty({num_seqs + 1}, DType::kI32);
  b.meta.context_lens = Tensor::empty({num_seqs}, DType::kI32);
  b.meta.block_tables = Tensor::empty({num_seqs, max_blocks + 2}, DType::kI32);
  std::fill_n(b.meta.block_tables.data<int32_t>(), b.meta.block_tables.numel(), -1);
  b.params.scale = 1.0f / std::sqrt(static_cast<float>(sc.head_dim));
  b.params.sliding_window = sc.sliding_window;
  b.q = testing::random_tensor({n, sc.num_heads, sc.head_dim}, rng);

  int next_block = 0, row = 0;
  b.meta.query_start.data<int32_t>()[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = sc.seqs[static_cast<size_t>(s)];
    int32_t* table = b.meta.block_tables.data<int32_t>() + s * (max_blocks + 2);
    for (int i = 0; i < blocks_needed[static_cast<size_t>(s)]; ++i) table[i] = ids[static_cast<size_t>(next_block++)];
    b.meta.context_lens.data<int32_t>()[s] = spec.context_len;
    b.meta.query_start.data<int32_t>()[s + 1] = row + spec.q_len;
    const Tensor k = testing::random_tensor({spec.context_len, sc.num_kv_heads, sc.head_dim}, rng);
    const Tensor v = testing::random_tensor({spec.context_len, sc.num_kv_heads, sc.head_dim}, rng);
    std::vector<int32_t> slots(static_cast<size_t>(spec.context_len));
    for (int j = 0; j < spec.context_len; ++j) {
      slots[static_cast<size_t>(j)] = table[j / sc.block_size] * sc.block_size + j % sc.block_size;
    }
    ops::reference::store_kv(k, v, testing::i32_tensor(slots), b.cache);
    if (sc.sliding_window > 0) {
      // Keys before the first query's window are never read: poison them, and drop whole blocks
      // from the table as a block manager that frees them would.
      const int first_key = std::max(0, spec.context_len - spec.q_len - sc.sliding_window + 1);
      Tensor nan_row = testing::nan_tensor({1, sc.num_kv_heads, sc.head_dim});
      for (int j = 0; j < first_key; ++j) {
        ops::reference::store_kv(nan_row, nan_row, testing::i32_tensor({slots[static_cast<size_t>(j)]}), b.cache);
      }
      for (int i = 0; (i + 1) * sc.block_size <= first_key; ++i) table[i] = -1;
    }
    row += spec.q_len;
  }
  b.meta.max_query_len = 0;
  b.meta.max_context_len = 0;
  for (const auto& s : sc.seqs) {
    b.meta.max_query_len = std::max(b.meta.max_query_len, s.q_len);
    b.meta.max_context_len = std::max(b.meta.max_context_len, s.context_len);
  }
  if (sc.history_bits != 0) testing::move_blocks_to_history(b.cache, b.meta, sc.history_bits, rng);
  return b;
}

// Tolerance for a plan: the CUDA-core kernels compute in f32 on the cache's values (tight); the
// tensor-core kernels round the scaled query and the softmax weights to the cache's 16-bit type
// (bf16 for a quantized cache, its weights times the V scales), an error of up to 2^-9 (bf16) or
// 2^-12 (f16) of |v| per term. all_close measures against the batch's RMS, which long rows
// (averages of many random values) pull down to ~0.07 while a row that sees 2 keys has outputs
// near |v| ~ 0.5: hence ~0.004 / 0.07 for bf16.
double tolerance(const cu::AttentionPlan& plan, DType cache_dtype, double f32_tol) {
  if (!plan.tensor_cores) return f32_tol;
  return cache_dtype == DType::kF16 ? 8e-3 : 5e-2;
}

// The plan as made, and (when it chose tensor cores) the same plan on the CUDA-core kernels.
std::vector<cu::AttentionPlan> both_kernels(const cu::AttentionPlan& plan) {
  std::vector<cu::AttentionPlan> plans = {plan};
  if (plan.tensor_cores) {
    plans.push_back(plan);
    plans.back().tensor_cores = false;
  }
  return plans;
}

Tensor reference(const Batch& b) {
  Tensor out = testing::nan_tensor(b.q.shape());
  ops::reference::paged_attention(b.q, b.cache, b.meta, b.params, out);
  return out;
}

Mirror mirror_if_defined(const Tensor& t) { return t.defined() ? Mirror(t) : Mirror(); }

// The batch on the device.
struct DeviceBatch {
  Mirror k, v, k_scales, v_scales, hk, hv, hk_params, hv_params, query_start, context_lens, block_tables;
  cu::KvCacheView cache;
  cu::AttentionBatch batch;

  explicit DeviceBatch(const Batch& b)
      : k(b.cache.k), v(b.cache.v), k_scales(mirror_if_defined(b.cache.k_scales)),
        v_scales(mirror_if_defined(b.cache.v_scales)), hk(mirror_if_defined(b.cache.hk)),
        hv(mirror_if_defined(b.cache.hv)), hk_params(mirror_if_defined(b.cache.hk_params)),
        hv_params(mirror_if_defined(b.cache.hv_params)), query_start(b.meta.query_start),
        context_lens(b.meta.context_lens), block_tables(b.meta.block_tables) {
    cache.k = k.ptr<void>();
    cache.v = v.ptr<void>();
    if (b.cache.k_scales.defined()) {
      cache.k_scales = k_scales.ptr<float>();
      cache.v_scales = v_scales.ptr<float>();
    }
    cache.dtype = b.cache.k.dtype();
    cache.num_blocks = b.cache.k.size(0);
    cache.block_size = b.cache.k.size(1);
    cache.num_kv_heads = b.cache.k.size(2);
    cache.head_dim = b.cache.k.size(3);
    if (b.cache.hk.defined()) {
      cache.hk = hk.ptr<void>();
      cache.hv = hv.ptr<void>();
      cache.hk_params = hk_params.ptr<void>();
      cache.hv_params = hv_params.ptr<void>();
      cache.history_bits = ops::kv_history_bits(b.cache);
      cache.num_history_blocks = b.cache.hk.size(0);
    }
    batch.num_seqs = b.meta.num_seqs;
    batch.query_start = query_start.ptr<int32_t>();
    batch.context_lens = context_lens.ptr<int32_t>();
    batch.block_tables = block_tables.ptr<int32_t>();
    batch.max_blocks_per_seq = b.meta.block_tables.size(1);
    batch.max_query_len = b.meta.max_query_len;
    batch.max_context_len = b.meta.max_context_len;
  }
};

int sm_count() {
  auto sms = cu::current_sm_count();
  return sms.ok() ? *sms : 1;
}

// Runs `plan` on the device; q and out are views of wider poisoned buffers when `strided`.
::testing::AssertionResult run(const Batch& b, const DeviceBatch& d, const cu::AttentionPlan& plan, bool strided,
                               Tensor* result) {
  const int64_t n = b.q.size(0), heads = b.q.size(1), hd = b.q.size(2);
  const int64_t extra = strided ? 2 : 0;
  Tensor q_wide = testing::nan_tensor({n, heads + extra, hd});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < hd; ++i) {
        q_wide.data<float>()[(t * (heads + extra) + h + extra / 2) * hd + i] = b.q.data<float>()[(t * heads + h) * hd + i];
      }
    }
  }
  Mirror dq(q_wide), dout(testing::nan_tensor({n, heads + extra, hd}));
  const Tensor q = dq.host().slice(1, extra / 2, extra / 2 + heads);
  const Tensor out = dout.host().slice(1, extra / 2, extra / 2 + heads);
  auto ws = cu::DeviceBuffer::allocate(std::max<size_t>(plan.workspace_bytes, 16), "attention workspace");
  if (!ws.ok()) return ::testing::AssertionFailure() << ws.status().to_string();
  Status s = cu::paged_attention(plan, dq.ptr<float>(q), q.stride(0), q.stride(1), heads, d.cache, d.batch, b.params,
                                 dout.ptr<float>(out), out.stride(0), out.stride(1), ws->data(), ws->bytes(), nullptr);
  if (s.ok()) s = cu::synchronize(nullptr);
  if (s.ok()) s = dout.download();
  if (!s.ok()) return ::testing::AssertionFailure() << s.to_string();
  if (strided) {
    auto left = testing::all_nan(dout.host().slice(1, 0, 1), "out padding (left)");
    if (!left) return left;
    auto right = testing::all_nan(dout.host().slice(1, heads + 1, heads + 2), "out padding (right)");
    if (!right) return right;
  }
  *result = out.contiguous();
  return ::testing::AssertionSuccess();
}

// Decode rows, a whole prompt, a chunked-prefill tail, a context ending on a block edge, a long
// prompt spanning several query and key tiles.
std::vector<SeqSpec> mixed_seqs(std::mt19937& rng, int block_size) {
  std::uniform_int_distribution<int> ctx(1, 150), prompt(1, 60), chunk(2, 40);
  std::vector<SeqSpec> seqs;
  seqs.push_back({ctx(rng), 1});
  const int p = prompt(rng);
  seqs.push_back({p, p});
  const int c = std::uniform_int_distribution<int>(30, 150)(rng);
  seqs.push_back({c, std::min(c, chunk(rng))});
  seqs.push_back({2 * block_size, 1});
  const int long_ctx = std::uniform_int_distribution<int>(200, 300)(rng);
  seqs.push_back({long_ctx, long_ctx - std::uniform_int_distribution<int>(0, 100)(rng)});
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

const std::vector<DType> kFloatCaches = {DType::kF32, DType::kBF16, DType::kF16};
const std::vector<DType> kQuantizedCaches = {DType::kI8, DType::kF8E4M3};

// Every head configuration and head dim, the cache dtypes taken in turn (in runs of 3, across
// the windows).
std::vector<Scenario> scenarios(std::mt19937& rng, bool decode_only, const std::vector<DType>& dtypes) {
  std::vector<Scenario> out;
  const std::vector<std::pair<int, int>> head_configs = {{4, 4}, {8, 4}, {8, 2}, {14, 2}, {8, 1}, {32, 8}};
  const std::vector<int> head_dims = {64, 128, 48, 20, 256, 96};
  const std::vector<int> windows = {0, 7, 40};
  int i = 0;
  for (auto [h, kvh] : head_configs) {
    for (int hd : head_dims) {
      if (h / kvh * hd > 4096) continue;
      Scenario s;
      s.num_heads = h;
      s.num_kv_heads = kvh;
      s.head_dim = hd;
      s.block_size = (i % 4 == 3) ? 5 : 16;
      s.sliding_window = windows[static_cast<size_t>(i % 3)];
      s.cache_dtype = dtypes[static_cast<size_t>(i / 3) % dtypes.size()];
      s.history_bits = i % 4 == 1 ? 4 : i % 4 == 2 ? 8 : 0;
      if (decode_only) {
        std::uniform_int_distribution<int> ctx(1, 2500);
        for (int j = 0; j < 5; ++j) s.seqs.push_back({ctx(rng), 1});
        s.seqs.push_back({3 * s.block_size, 1});
        s.seqs.push_back({1, 1});
      } else {
        s.seqs = mixed_seqs(rng, s.block_size);
      }
      out.push_back(s);
      ++i;
    }
  }
  return out;
}

// Mixed batches through the prefill kernels (as planned, and on CUDA cores).
void check_prefill_kernels(const std::vector<DType>& dtypes) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (const Scenario& sc : scenarios(rng, false, dtypes)) {
    const Batch b = build(sc, rng);
    const DeviceBatch d(b);
    auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    ASSERT_EQ(planned->algo, cu::AttentionAlgo::kPrefill) << sc.describe();
    const Tensor expected = reference(b);
    for (const cu::AttentionPlan& plan : both_kernels(*planned)) {
      Tensor out;
      ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
      ASSERT_TRUE(all_close(out, expected, tolerance(plan, sc.cache_dtype, 2e-5), plan.describe() + " " + sc.describe()));
    }
  }
}

TEST(CudaPagedAttention, PrefillKernelMatchesReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  check_prefill_kernels(kFloatCaches);
}

TEST(CudaPagedAttention, PrefillKernelMatchesReferenceOnQuantizedCaches) {
  TACHYON_SKIP_WITHOUT_GPU();
  check_prefill_kernels(kQuantizedCaches);
}

// The planner picks the tensor-core kernels exactly where they apply (head_dim 64 or 128, sm_80+;
// a 16-bit or quantized cache, for decode and for prefill), and a tensor-core plan for a cache
// they cannot read is an error, not a launch.
TEST(CudaPagedAttention, TensorCoresArePlannedWhereTheyApply) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto cc = cu::current_compute_capability();
  ASSERT_TRUE(cc.ok()) << cc.status().to_string();
  std::mt19937 rng(7);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
    for (int hd : {48, 64, 128, 256}) {
      for (int max_query : {5, 1}) {  // the prefill planner, then the decode one
        Scenario sc;
        sc.head_dim = hd;
        sc.cache_dtype = dtype;
        sc.seqs = {{40, max_query}, {9, 1}};
        const Batch b = build(sc, rng);
        const DeviceBatch d(b);
        auto plan = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const bool sixteen_bit = dtype == DType::kBF16 || dtype == DType::kF16;
        const bool quantized = ops::is_quantized_kv_dtype(dtype);
        const bool decode = plan->algo == cu::AttentionAlgo::kDecode;
        ASSERT_EQ(decode, max_query == 1) << sc.describe();
        const bool readable = (sixteen_bit || quantized) && (hd == 64 || hd == 128);
        EXPECT_EQ(plan->tensor_cores, *cc >= 80 && readable) << sc.describe();
        if (!readable) {
          cu::AttentionPlan forced = *plan;
          forced.tensor_cores = true;
          Tensor out;
          const ::testing::AssertionResult ran = run(b, d, forced, false, &out);
          EXPECT_FALSE(ran) << sc.describe();
          // The Status names the cache and its head_dim.
          EXPECT_NE(std::string(ran.message()).find(fmt::format("{} cache, head_dim {}", dtype_name(dtype), hd)),
                    std::string::npos)
              << ran.message();
        }
      }
    }
  }
}

// History blocks: the CUDA compression writes the reference's codes and parameters bit for bit
// from every cache dtype; a 16-bit cache with history pools keeps the tensor-core kernels (their
// pipelines decode history rows into the 16-bit tile), a quantized one runs on CUDA cores (the
// decode and prefill checks above run every kernel on batches with history blocks).
TEST(CudaKvHistory, CompressionMatchesTheReferenceAndHistoryIsPlanned) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
    for (int bits : {8, 4}) {
      for (int hd : {64, 128, 20}) {
        Scenario sc;
        sc.head_dim = hd;
        sc.cache_dtype = dtype;
        sc.seqs = {{70, 1}, {33, 1}};
        Batch b = build(sc, rng);
        if (dtype == DType::kF32) {  // an outlier and a constant row among the random values
          b.cache.k.data<float>()[3] = 40.0f;
          for (int64_t i = 0; i < hd; ++i) b.cache.k.data<float>()[hd + i] = 0.5f;
        }
        const DeviceBatch before(b);  // the primary pools on the device, before the move poisons them
        const std::vector<int32_t> old_tables(b.meta.block_tables.data<int32_t>(),
                                              b.meta.block_tables.data<int32_t>() + b.meta.block_tables.numel());
        testing::move_blocks_to_history(b.cache, b.meta, bits, rng, 0.7);
        const std::string what = fmt::format("{} cache, {}-bit history, head_dim {}", dtype_name(dtype), bits, hd);
        // The same moves on the device: (primary block, history block) from the tables before and after.
        std::vector<int32_t> pairs;
        for (size_t i = 0; i < old_tables.size(); ++i) {
          const int32_t id = b.meta.block_tables.data<int32_t>()[i];
          if (id < b.cache.k.size(0)) continue;
          pairs.push_back(old_tables[i]);
          pairs.push_back(id - static_cast<int32_t>(b.cache.k.size(0)));
        }
        if (pairs.empty()) continue;
        cu::KvCacheView view = before.cache;
        Mirror hk(Tensor::zeros(b.cache.hk.shape(), b.cache.hk.dtype()));
        Mirror hv(Tensor::zeros(b.cache.hv.shape(), b.cache.hv.dtype()));
        Mirror hkp(Tensor::zeros(b.cache.hk_params.shape(), b.cache.hk_params.dtype()));
        Mirror hvp(Tensor::zeros(b.cache.hv_params.shape(), b.cache.hv_params.dtype()));
        view.hk = hk.ptr<void>();
        view.hv = hv.ptr<void>();
        view.hk_params = hkp.ptr<void>();
        view.hv_params = hvp.ptr<void>();
        view.history_bits = bits;
        view.num_history_blocks = b.cache.hk.size(0);
        Mirror dpairs(testing::i32_tensor(pairs));
        ASSERT_TRUE(cu::compress_kv_blocks(dpairs.ptr<int32_t>(), static_cast<int64_t>(pairs.size() / 2), view, nullptr).ok());
        ASSERT_TRUE(cu::synchronize(nullptr).ok());
        for (auto [mirror, host] : {std::pair{&hk, &b.cache.hk}, std::pair{&hv, &b.cache.hv},
                                    std::pair{&hkp, &b.cache.hk_params}, std::pair{&hvp, &b.cache.hv_params}}) {
          ASSERT_TRUE(mirror->download().ok());
          EXPECT_EQ(std::memcmp(mirror->host().raw_data(), host->raw_data(), host->nbytes()), 0) << what;
        }
        // Tensor cores for a 16-bit cache (its pipeline decodes history rows into the tile), CUDA
        // cores otherwise; both read the moved blocks as the reference does.
        const DeviceBatch d(b);
        auto plan = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        auto cc = cu::current_compute_capability();
        ASSERT_TRUE(cc.ok());
        const bool sixteen_bit = dtype == DType::kBF16 || dtype == DType::kF16;
        EXPECT_EQ(plan->tensor_cores, *cc >= 80 && sixteen_bit && (hd == 64 || hd == 128)) << what;
        for (const cu::AttentionPlan& p : both_kernels(*plan)) {
          Tensor out;
          ASSERT_TRUE(run(b, d, p, false, &out)) << what;
          EXPECT_TRUE(all_close(out, reference(b), tolerance(p, dtype, 5e-5), p.describe() + " " + what));
        }
      }
    }
  }
}

// Long prefills (several 64-row query tiles and 64-key tiles, the causal diagonal inside and
// across tiles, chunks that start mid-context) on the shapes the tensor-core kernels serve, 16-bit
// and quantized caches (their unowned blocks, the unused tail of each sequence's last block and
// the keys before a window NaN-scaled: the tiles zero-fill what no row may read).
TEST(CudaPagedAttention, TensorCorePrefillOnLongChunks) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
    for (int hd : {64, 128}) {
      for (int window : {0, 100}) {
        Scenario sc;
        sc.num_heads = 8;
        sc.num_kv_heads = 2;
        sc.head_dim = hd;
        sc.cache_dtype = dtype;
        sc.sliding_window = window;
        sc.seqs = {{517, 517}, {700, 131}, {64, 64}, {200, 1}, {129, 65}};
        const Batch b = build(sc, rng);
        const DeviceBatch d(b);
        auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
        ASSERT_TRUE(planned.ok()) << planned.status().to_string();
        const Tensor expected = reference(b);
        for (const cu::AttentionPlan& plan : both_kernels(*planned)) {
          Tensor out;
          ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
          ASSERT_TRUE(all_close(out, expected, tolerance(plan, dtype, 2e-5), plan.describe() + " " + sc.describe()));
        }
      }
    }
  }
}

// Token trees (ops.h AttentionMetadata::tree_masks): tree chunks of up to 64 queries, one
// starting at cache index 0, beside a decode row and a long causal chunk (all-ones masks), on
// both prefill kernels (16-bit, f32 and quantized caches), against the reference (which tests/ops
// ties to textbook attention over each query's ancestors).
TEST(CudaPagedAttention, TreeMasksMatchReference) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32, DType::kI8, DType::kF8E4M3}) {
    for (int hd : {64, 128}) {
      Scenario sc;
      sc.num_heads = 8;
      sc.num_kv_heads = 2;
      sc.head_dim = hd;
      sc.cache_dtype = dtype;
      const int tree_len = std::uniform_int_distribution<int>(2, kMaxTreeTokens)(rng);
      sc.seqs = {{37, 1}, {150, 70}, {tree_len + 83, tree_len}, {kMaxTreeTokens, kMaxTreeTokens}};
      Batch b = build(sc, rng);
      b.meta.tree_masks = Tensor::empty({b.q.size(0)}, DType::kI64);
      auto* masks = static_cast<uint64_t*>(b.meta.tree_masks.raw_data());
      std::fill_n(masks, b.q.size(0), ~uint64_t{0});
      int row = 0;
      for (size_t s = 0; s < sc.seqs.size(); ++s) {
        const int q_len = sc.seqs[s].q_len;
        if (s >= 2) {
          for (int i = 0; i < q_len; ++i) {
            const int parent = std::uniform_int_distribution<int>(-1, i - 1)(rng);
            masks[row + i] = (parent < 0 ? 0 : masks[row + parent]) | uint64_t{1} << i;
          }
        }
        row += q_len;
      }
      const Tensor expected = reference(b);
      DeviceBatch d(b);
      Mirror tree(b.meta.tree_masks);
      d.batch.tree_masks = tree.ptr<uint64_t>();
      auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
      ASSERT_TRUE(planned.ok()) << planned.status().to_string();
      ASSERT_EQ(planned->algo, cu::AttentionAlgo::kPrefill);
      for (const cu::AttentionPlan& plan : both_kernels(*planned)) {
        Tensor out;
        ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
        ASSERT_TRUE(all_close(out, expected, tolerance(plan, dtype, 2e-5), plan.describe() + " " + sc.describe()));
      }
    }
  }
}

// All-decode batches through the decode kernels at several split counts, and through the prefill
// kernels.
void check_decode_kernels(const std::vector<DType>& dtypes) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (const Scenario& sc : scenarios(rng, true, dtypes)) {
    const Batch b = build(sc, rng);
    const DeviceBatch d(b);
    const Tensor expected = reference(b);
    auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    ASSERT_EQ(planned->algo, cu::AttentionAlgo::kDecode) << sc.describe();
    for (const cu::AttentionPlan& kernel : both_kernels(*planned)) {
      for (int splits : {0, 1, 3, 8, 64}) {  // 0: as planned
        cu::AttentionPlan plan = kernel;
        if (splits > 0) {
          plan.num_splits = splits;
          plan.workspace_bytes = static_cast<size_t>(b.meta.num_seqs) * splits * sc.num_heads * (sc.head_dim + 2) * 4;
        }
        Tensor out;
        ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
        ASSERT_TRUE(all_close(out, expected, tolerance(plan, sc.cache_dtype, 5e-5),
                              fmt::format("decode {} {}", plan.describe(), sc.describe())));
      }
    }
    // The prefill kernel serves decode rows too, and agrees.
    auto prefill = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count(),
                                            cu::AttentionAlgo::kPrefill);
    ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
    for (const cu::AttentionPlan& plan : both_kernels(*prefill)) {
      Tensor out;
      ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
      ASSERT_TRUE(all_close(out, expected, tolerance(plan, sc.cache_dtype, 5e-5),
                            "prefill on decode rows " + plan.describe() + " " + sc.describe()));
    }
  }
}

TEST(CudaPagedAttention, DecodeKernelMatchesReferenceAtEverySplitCount) {
  TACHYON_SKIP_WITHOUT_GPU();
  check_decode_kernels(kFloatCaches);
}

TEST(CudaPagedAttention, DecodeKernelMatchesReferenceAtEverySplitCountOnQuantizedCaches) {
  TACHYON_SKIP_WITHOUT_GPU();
  check_decode_kernels(kQuantizedCaches);
}

// Sequences with no query this step are skipped by both kernels (16-bit and quantized caches).
TEST(CudaPagedAttention, SequencesWithoutQueriesAreSkipped) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kBF16, DType::kI8}) {
    for (bool decode : {true, false}) {
      Scenario sc;
      sc.num_heads = 8;
      sc.num_kv_heads = 2;
      sc.head_dim = 64;
      sc.cache_dtype = dtype;
      sc.seqs = {{40, 1}, {33, 0}, {300, 1}, {17, 0}};
      if (!decode) sc.seqs[2].q_len = 20;
      const Batch b = build(sc, rng);
      const DeviceBatch d(b);
      auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
      ASSERT_TRUE(planned.ok()) << planned.status().to_string();
      for (const cu::AttentionPlan& plan : both_kernels(*planned)) {
        Tensor out;
        ASSERT_TRUE(run(b, d, plan, false, &out)) << sc.describe();
        ASSERT_TRUE(all_close(out, reference(b), tolerance(plan, sc.cache_dtype, 2e-5),
                              plan.describe() + " " + sc.describe()));
      }
    }
  }
}

TEST(CudaPagedAttention, StridedQueryAndOutput) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (auto algo : {cu::AttentionAlgo::kDecode, cu::AttentionAlgo::kPrefill}) {
    Scenario sc;
    sc.num_heads = 6;
    sc.num_kv_heads = 2;
    sc.head_dim = 64;
    sc.cache_dtype = DType::kF16;
    sc.seqs = {{400, 1}, {17, 1}, {1, 1}};
    const Batch b = build(sc, rng);
    const DeviceBatch d(b);
    auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count(), algo);
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    for (const cu::AttentionPlan& plan : both_kernels(*planned)) {
      Tensor out;
      ASSERT_TRUE(run(b, d, plan, true, &out)) << sc.describe();
      ASSERT_TRUE(all_close(out, reference(b), tolerance(plan, sc.cache_dtype, 2e-5), plan.describe()));
    }
  }
}

Tensor to_device(const Tensor& t, Device device) {
  auto r = copy_to(t, device);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Tensor();
}

// Asked for (AttentionQuery::out16), the decode kernels also write each output row rounded to 16
// bits, in rows of their own stride: the f32 output rounded to nearest even, bit for bit, every
// element of the rows written and nothing past them. Tensor cores and CUDA cores, one slice (the
// kernel writes the rows) and several (the combine kernel does), bf16 and f16 copies.
TEST(CudaPagedAttention, DecodeKernelsWriteTheirRowsRoundedTo16Bits) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (const auto& [cache_dtype, head_dim] :
       std::vector<std::pair<DType, int>>{{DType::kBF16, 128}, {DType::kF16, 64}, {DType::kF32, 48}}) {
    Scenario sc;
    sc.num_heads = 8;
    sc.num_kv_heads = 2;
    sc.head_dim = head_dim;
    sc.cache_dtype = cache_dtype;
    sc.seqs = {{300, 1}, {17, 1}, {1, 1}, {90, 1}, {45, 1}};
    const Batch b = build(sc, rng);
    const DeviceBatch d(b);
    auto planned = cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, sm_count());
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    const int64_t n = b.q.size(0), width = sc.num_heads * head_dim, stride = width + 8;
    int round = 0;
    for (cu::AttentionPlan plan : both_kernels(*planned)) {
      for (int splits : {1, 3}) {
        plan.num_splits = splits;
        plan.workspace_bytes = static_cast<size_t>(b.meta.num_seqs) * splits * sc.num_heads * (head_dim + 2) * 4;
        const DType copy_dtype = round++ % 2 == 0 ? DType::kBF16 : DType::kF16;
        const std::string what = fmt::format("{} splits {} {} copy {}", plan.describe(), splits, sc.describe(),
                                             dtype_name(copy_dtype));
        Tensor poison = Tensor::empty({n, stride}, copy_dtype);
        std::fill(poison.data<uint16_t>(), poison.data<uint16_t>() + poison.numel(), uint16_t{0x7fff});
        Mirror dq(b.q), dout(testing::nan_tensor({n, sc.num_heads, head_dim})), dcopy(poison);
        auto ws = cu::DeviceBuffer::allocate(plan.workspace_bytes, "attention workspace");
        ASSERT_TRUE(ws.ok()) << ws.status().to_string();
        cu::Rows16 out16;
        out16.data = dcopy.ptr<uint16_t>();
        out16.stride = stride;
        out16.dtype = copy_dtype;
        ASSERT_OK(cu::paged_attention(plan, dq.ptr<float>(), width, head_dim, sc.num_heads, d.cache, d.batch, b.params,
                                      dout.ptr<float>(), width, head_dim, ws->data(), ws->bytes(), nullptr, out16));
        ASSERT_OK(cu::synchronize(nullptr));
        ASSERT_OK(dout.download());
        ASSERT_OK(dcopy.download());
        ASSERT_TRUE(all_close(dout.host(), reference(b), tolerance(plan, cache_dtype, 5e-5), what));
        const float* out = dout.host().data<float>();
        const uint16_t* copy = dcopy.host().data<uint16_t>();
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t i = 0; i < stride; ++i) {
            const uint16_t want = i >= width                      ? uint16_t{0x7fff}
                                  : copy_dtype == DType::kBF16 ? f32_to_bf16(out[t * width + i])
                                                                  : f32_to_f16(out[t * width + i]);
            ASSERT_EQ(copy[t * stride + i], want) << what << ": row " << t << " element " << i;
          }
        }
      }
    }
  }
}

// Through the backend, past the GEMV's token counts, a decode step's attention also rounds its
// output for the o_proj linear after it (at the rounding the block's norm last staged): the
// linear's result is the one it gives on the same rows written by anything else, bit for bit.
TEST(CudaPagedAttention, TheOProjectionReadsTheAttentionsRoundingThroughTheBackend) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  Scenario sc;
  sc.num_heads = 8;
  sc.num_kv_heads = 2;
  sc.head_dim = 128;
  sc.cache_dtype = DType::kBF16;
  for (int s = 0; s < 40; ++s) sc.seqs.push_back({std::uniform_int_distribution<int>(1, 200)(rng), 1});
  const Batch b = build(sc, rng);
  const int64_t n = b.q.size(0), width = sc.num_heads * sc.head_dim;
  for (DType w_dtype : {DType::kBF16, DType::kF16}) {
    const std::string what = dtype_name(w_dtype);
    Weight w;  // the linears before and after: [width, width]
    w.dense = to_device(testing::convert(testing::random_tensor({width, width}, rng, -0.05f, 0.05f), w_dtype), gpu);
    // A norm, then a linear at this weight's rounding: what a block runs before attention.
    const Tensor norm_w = to_device(testing::random_tensor({width}, rng, 0.5f, 1.5f), gpu);
    Tensor x = to_device(testing::random_tensor({n, width}, rng), gpu);
    Tensor h = to_device(testing::nan_tensor({n, width}), gpu), qkv = to_device(testing::nan_tensor({n, width}), gpu);
    ops::LinearFusion f;
    f.norm_weight = &norm_w;
    f.norm_eps = 1e-5f;
    f.scratch_x = &h;
    ASSERT_FALSE(ops::linear_fused(x, w, nullptr, f, qkv));

    KvLayer layer;
    layer.k = to_device(b.cache.k, gpu);
    layer.v = to_device(b.cache.v, gpu);
    AttentionMetadata meta = b.meta;
    meta.query_start = to_device(b.meta.query_start, gpu);
    meta.context_lens = to_device(b.meta.context_lens, gpu);
    meta.block_tables = to_device(b.meta.block_tables, gpu);
    const Tensor dq = to_device(b.q, gpu);
    Tensor attn = to_device(testing::nan_tensor(b.q.shape()), gpu);
    ops::paged_attention(dq, layer, meta, b.params, attn);
    const Tensor rows = attn.reshape({n, width});
    Tensor y = to_device(testing::nan_tensor({n, width}), gpu);
    ops::linear(rows, w, nullptr, y);
    // The same rows, copied (nothing staged for the copy), through the same linear.
    Tensor again = to_device(testing::nan_tensor({n, width}), gpu), y_again = to_device(testing::nan_tensor({n, width}), gpu);
    ASSERT_OK(copy_into(again, rows));
    ops::linear(again, w, nullptr, y_again);
    ASSERT_OK(ops::synchronize(gpu));
    ASSERT_TRUE(all_close(to_device(attn, cpu), reference(b), 5e-2, what + ": attention"));
    ASSERT_TRUE(testing::bitwise_equal(to_device(y, cpu), to_device(y_again, cpu), what + ": o_proj"));
  }
}

// store_kv and paged_attention through ops.h on device tensors, i.e. through the CUDA backend
// (its layer checks, the scales it hands the kernels): this step's K/V rows stored on the device
// are the reference's codes and scales bit for bit, and attention over the device cache matches
// the reference over the host one, for a decode batch and a mixed batch with a window (head_dim
// 128: both on tensor cores where the device has them).
TEST(CudaPagedAttention, QuantizedCachesThroughTheBackend) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  auto cc = cu::current_compute_capability();
  ASSERT_TRUE(cc.ok()) << cc.status().to_string();
  const Device gpu = Device::cuda(0);
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (DType dtype : kQuantizedCaches) {
    for (const auto& [head_dim, decode] :
         std::vector<std::pair<int, bool>>{{80, true}, {80, false}, {128, true}, {128, false}}) {
      Scenario sc;
      sc.num_heads = 12;
      sc.num_kv_heads = 3;
      sc.head_dim = head_dim;
      sc.cache_dtype = dtype;
      sc.sliding_window = decode ? 0 : 50;
      sc.seqs = decode ? std::vector<SeqSpec>{{300, 1}, {17, 1}, {1, 1}}
                       : std::vector<SeqSpec>{{300, 20}, {17, 17}, {64, 1}};
      Batch b = build(sc, rng);
      // This step's rows: fresh K/V for every query token, at its position (replacing what
      // build() stored there).
      const int64_t n = b.q.size(0);
      const Tensor k = testing::random_tensor({n, sc.num_kv_heads, sc.head_dim}, rng, -2.0f, 2.0f);
      const Tensor v = testing::random_tensor({n, sc.num_kv_heads, sc.head_dim}, rng, -2.0f, 2.0f);
      std::vector<int32_t> slots;
      for (size_t s = 0; s < sc.seqs.size(); ++s) {
        const int32_t* table = b.meta.block_tables.data<int32_t>() + s * b.meta.block_tables.size(1);
        for (int j = 0; j < sc.seqs[s].q_len; ++j) {
          const int pos = sc.seqs[s].context_len - sc.seqs[s].q_len + j;
          slots.push_back(table[pos / sc.block_size] * sc.block_size + pos % sc.block_size);
        }
      }
      b.meta.slot_mapping = testing::i32_tensor(slots);

      KvLayer layer;
      layer.k = to_device(b.cache.k, gpu);
      layer.v = to_device(b.cache.v, gpu);
      layer.k_scales = to_device(b.cache.k_scales, gpu);
      layer.v_scales = to_device(b.cache.v_scales, gpu);
      AttentionMetadata meta = b.meta;
      meta.query_start = to_device(b.meta.query_start, gpu);
      meta.context_lens = to_device(b.meta.context_lens, gpu);
      meta.block_tables = to_device(b.meta.block_tables, gpu);
      meta.slot_mapping = to_device(b.meta.slot_mapping, gpu);
      const Tensor dq = to_device(b.q, gpu), dk = to_device(k, gpu), dv = to_device(v, gpu);
      Tensor dout = to_device(testing::nan_tensor(b.q.shape()), gpu);
      ops::store_kv(dk, dv, meta.slot_mapping, layer);
      ops::paged_attention(dq, layer, meta, b.params, dout);
      ASSERT_OK(ops::synchronize(gpu));

      ops::reference::store_kv(k, v, b.meta.slot_mapping, b.cache);
      const Tensor expected = reference(b);
      const std::string what = sc.describe();
      ASSERT_TRUE(testing::bitwise_equal(to_device(layer.k, Device::cpu()), b.cache.k, what + " k codes"));
      ASSERT_TRUE(testing::bitwise_equal(to_device(layer.v, Device::cpu()), b.cache.v, what + " v codes"));
      ASSERT_TRUE(testing::bitwise_equal(to_device(layer.k_scales, Device::cpu()), b.cache.k_scales, what + " k scales"));
      ASSERT_TRUE(testing::bitwise_equal(to_device(layer.v_scales, Device::cpu()), b.cache.v_scales, what + " v scales"));
      const bool tensor_cores = head_dim == 128 && *cc >= 80;  // the planner's choice
      ASSERT_TRUE(all_close(to_device(dout, Device::cpu()), expected, tensor_cores ? 5e-2 : 5e-5, "backend " + what));
    }
  }
}

TEST(CudaPagedAttention, BadArgumentsAreStatusErrors) {
  TACHYON_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  Scenario sc;
  sc.seqs = {{40, 5}};
  const Batch b = build(sc, rng);
  const DeviceBatch d(b);
  // Decode forced on a batch with 5-row queries.
  EXPECT_FALSE(cu::plan_paged_attention(d.batch, sc.num_heads, d.cache, b.params, 132, cu::AttentionAlgo::kDecode).ok());
  // Heads not a multiple of the KV heads.
  EXPECT_FALSE(cu::plan_paged_attention(d.batch, 3, d.cache, b.params, 132).ok());
  // A head_dim the kernels do not take.
  cu::KvCacheView odd = d.cache;
  odd.head_dim = 18;
  EXPECT_FALSE(cu::plan_paged_attention(d.batch, sc.num_heads, odd, b.params, 132).ok());
  // A workspace smaller than the plan.
  cu::AttentionPlan plan;
  plan.algo = cu::AttentionAlgo::kDecode;
  plan.num_splits = 4;
  plan.workspace_bytes = 1 << 20;
  const Status s = cu::paged_attention(plan, nullptr, 0, 0, sc.num_heads, d.cache, d.batch, b.params, nullptr, 0, 0,
                                       nullptr, 100, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("100"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
