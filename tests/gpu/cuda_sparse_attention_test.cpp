// Block-sparse decode attention on the GPU against the CPU reference: the key bounds the
// compression kernel writes, the blocks select_kv_blocks keeps, and decode attention over them
// (tensor cores for a bf16 cache, CUDA cores for f32), a budget covering the context equal to
// dense bit for bit, and the 32k retrieval case.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops/sparse_util.h"

namespace tachyon {
namespace {

using testing::make_sparse_case;
using testing::SparseCase;
using testing::SparseSpec;

Tensor on(const Tensor& t, Device device) {
  if (!t.defined()) return Tensor();
  auto r = copy_to(t, device);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Tensor();
}

KvLayer layer_on(const KvLayer& l, Device d) {
  KvLayer o;
  o.k = on(l.k, d);
  o.v = on(l.v, d);
  o.k_scales = on(l.k_scales, d);
  o.v_scales = on(l.v_scales, d);
  o.hk = on(l.hk, d);
  o.hv = on(l.hv, d);
  o.hk_params = on(l.hk_params, d);
  o.hv_params = on(l.hv_params, d);
  o.kbounds = on(l.kbounds, d);
  o.kbound_params = on(l.kbound_params, d);
  return o;
}

AttentionMetadata meta_on(const AttentionMetadata& m, Device d) {
  AttentionMetadata o = m;
  o.query_start = on(m.query_start, d);
  o.context_lens = on(m.context_lens, d);
  o.block_tables = on(m.block_tables, d);
  o.slot_mapping = on(m.slot_mapping, d);
  o.sparse_budgets = on(m.sparse_budgets, d);
  o.sparse_tables = on(m.sparse_tables, d);
  o.sparse_lens = on(m.sparse_lens, d);
  return o;
}

SparseSpec mixed_spec(std::mt19937& rng, int bits, DType dtype) {
  SparseSpec spec;
  std::uniform_int_distribution<int> ctx(20, 3000);
  for (int s = 0; s < 6; ++s) spec.contexts.push_back(ctx(rng));
  spec.contexts[0] += 1000;
  spec.budgets = {16, 100, 0, 8192, 256, 512};
  spec.q_lens = {1, 1, 1, 1, 1 + static_cast<int>(rng() % 40), 1};  // a prompt chunk: the prefill kernels
  spec.num_heads = 16;
  spec.num_kv_heads = 2;
  spec.head_dim = 128;
  spec.bits = bits;
  spec.dtype = dtype;
  spec.resident_blocks = 4;
  return spec;
}

// The compression kernel's key bounds equal the reference's (the codes within one step where
// the decoded keys differ in their last bit), and the device's bounds hold for its own keys.
TEST(CudaSparseAttention, KeyBoundsMatchTheReference) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  for (int bits : {8, 4}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      const int64_t blocks = 40, bs = 16, kvh = 4, hd = 128;
      KvLayer host;
      host.k = testing::convert(testing::random_tensor({blocks, bs, kvh, hd}, rng, -3.0f, 3.0f), dtype);
      host.v = testing::convert(testing::random_tensor({blocks, bs, kvh, hd}, rng), dtype);
      const DType code = bits == 8 ? DType::kI8 : DType::kU8;
      host.hk = Tensor::zeros({blocks, bs, kvh, bits == 8 ? hd : hd / 2}, code);
      host.hv = Tensor::zeros({blocks, bs, kvh, bits == 8 ? hd : hd / 2}, code);
      const DType params_dtype = bits == 8 ? DType::kF32 : DType::kF16;
      host.hk_params = Tensor::zeros({blocks, bs, kvh, bits == 8 ? 1 : 2}, params_dtype);
      host.hv_params = Tensor::zeros({blocks, bs, kvh, bits == 8 ? 1 : 2}, params_dtype);
      host.kbounds = Tensor::zeros({blocks, kvh, 2, hd / 2}, DType::kU8);
      host.kbound_params = Tensor::zeros({blocks, kvh, ops::key_bound_groups(hd), 2}, DType::kF32);
      std::vector<int32_t> perm(blocks);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      Tensor pairs = Tensor::empty({blocks, 2}, DType::kI32);
      for (int64_t i = 0; i < blocks; ++i) {
        pairs.data<int32_t>()[2 * i] = static_cast<int32_t>(i);
        pairs.data<int32_t>()[2 * i + 1] = perm[static_cast<size_t>(i)];
      }
      KvLayer dev = layer_on(host, gpu);
      ops::reference::compress_kv_blocks(pairs, host);
      const Tensor dpairs = on(pairs, gpu);
      ops::compress_kv_blocks(dpairs, dev);
      ASSERT_TRUE(ops::synchronize(gpu).ok());
      const Tensor codes = on(dev.kbounds, cpu), params = on(dev.kbound_params, cpu);
      const Tensor hk = on(dev.hk, cpu), hk_params = on(dev.hk_params, cpu);
      ASSERT_TRUE(testing::bitwise_equal(hk, host.hk, "history codes"));
      ASSERT_TRUE(testing::bitwise_equal(hk_params, host.hk_params, "history params"));
      int64_t differing = 0;
      for (int64_t i = 0; i < 2 * codes.numel(); ++i) {  // 4-bit codes, two a byte
        const int shift = 4 * static_cast<int>(i % 2);
        const int a = (static_cast<const uint8_t*>(codes.raw_data())[i / 2] >> shift) & 0xf;
        const int b = (static_cast<const uint8_t*>(host.kbounds.raw_data())[i / 2] >> shift) & 0xf;
        ASSERT_LE(std::abs(a - b), 1) << "bound code " << i;
        differing += a != b;
      }
      EXPECT_LE(differing, 2 * codes.numel() / 100) << "bits " << bits;
      ASSERT_TRUE(testing::all_close(params, host.kbound_params, 1e-6, "bound params"));
    }
  }
}

// Selection and attention on the device against the reference: the same kept blocks (scores
// differ only in summation order, far below the gaps of random data), attention within the
// cache's tolerance over them, and a budget covering every context equal to dense bit for bit.
// Every other case has a prompt chunk beside the decode rows (the prefill kernels, which attend
// densely for it and sparse for the others).
TEST(CudaSparseAttention, SelectionAndAttentionMatchTheReference) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  for (int bits : {8, 4}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      SparseSpec spec = mixed_spec(rng, bits, dtype);
      if (rng() % 2 == 0) spec.q_lens.clear();  // decode rows only: the decode kernels
      SparseCase c = make_sparse_case(spec, rng);
      const int64_t kvh = spec.num_kv_heads, cols = c.meta.block_tables.size(1);
      const std::string what = fmt::format("int{} history, {} cache", bits, dtype_name(dtype));
      Tensor tables = Tensor::empty({c.meta.num_seqs, kvh, cols}, DType::kI32);
      Tensor lens = Tensor::empty({c.meta.num_seqs, kvh}, DType::kI32);
      ops::select_kv_blocks(c.q, c.cache, c.meta, tables, lens);

      const KvLayer dev = layer_on(c.cache, gpu);
      AttentionMetadata dmeta = meta_on(c.meta, gpu);
      const Tensor dq = on(c.q, gpu);
      dmeta.sparse_tables = on(Tensor::zeros({c.meta.num_seqs, kvh, cols}, DType::kI32), gpu);
      dmeta.sparse_lens = on(Tensor::zeros({c.meta.num_seqs, kvh}, DType::kI32), gpu);
      ops::select_kv_blocks(dq, dev, dmeta, dmeta.sparse_tables, dmeta.sparse_lens);
      ASSERT_TRUE(ops::synchronize(gpu).ok());
      ASSERT_TRUE(testing::bitwise_equal(on(dmeta.sparse_tables, cpu), tables, what + ": kept blocks"));
      ASSERT_TRUE(testing::bitwise_equal(on(dmeta.sparse_lens, cpu), lens, what + ": kept positions"));

      c.meta.sparse_tables = tables;
      c.meta.sparse_lens = lens;
      const AttentionParams params{1.0f / std::sqrt(static_cast<float>(spec.head_dim)), 0};
      Tensor expected = testing::nan_tensor(c.q.shape());
      ops::reference::paged_attention(c.q, c.cache, c.meta, params, expected);
      Tensor dout = on(testing::nan_tensor(c.q.shape()), gpu);
      ops::paged_attention(dq, dev, dmeta, params, dout);
      ASSERT_TRUE(ops::synchronize(gpu).ok());
      ASSERT_TRUE(testing::all_close(on(dout, cpu), expected, dtype == DType::kF32 ? 1e-4 : 5e-2, what));

      // Every block kept (budgets past every context): dense, bit for bit.
      AttentionMetadata full = c.meta;
      full.sparse_budgets = Tensor::empty({c.meta.num_seqs}, DType::kI32);
      std::fill_n(full.sparse_budgets.data<int32_t>(), c.meta.num_seqs, 1 << 20);
      AttentionMetadata dfull = meta_on(full, gpu);
      ops::select_kv_blocks(dq, dev, dfull, dfull.sparse_tables, dfull.sparse_lens);
      AttentionMetadata ddense = dmeta;
      ddense.sparse_budgets = Tensor();
      ddense.sparse_tables = Tensor();
      ddense.sparse_lens = Tensor();
      Tensor a = on(testing::nan_tensor(c.q.shape()), gpu), b = on(testing::nan_tensor(c.q.shape()), gpu);
      ops::paged_attention(dq, dev, dfull, params, a);
      ops::paged_attention(dq, dev, ddense, params, b);
      ASSERT_TRUE(ops::synchronize(gpu).ok());
      ASSERT_TRUE(testing::bitwise_equal(on(a, cpu), on(b, cpu), what + ": every block kept against dense"));
    }
  }
}

TEST(CudaSparseAttention, FindsAKeyPlantedFarBackIn32kTokens) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  testing::PlantedKey planted = testing::make_planted_key_case(128, 4, 300.0f, rng);
  SparseCase& c = planted.c;
  const int32_t planted_id = planted.planted_id;
  const int planted_block = planted.planted_block;
  const KvLayer dev = layer_on(c.cache, gpu);
  const Tensor dq = on(c.q, gpu);
  for (int budget : {16, 64, 256, 2048, 8192}) {
    c.meta.sparse_budgets.data<int32_t>()[0] = budget;
    AttentionMetadata dmeta = meta_on(c.meta, gpu);
    dmeta.sparse_tables = on(Tensor::zeros({1, 1, c.meta.block_tables.size(1)}, DType::kI32), gpu);
    dmeta.sparse_lens = on(Tensor::zeros({1, 1}, DType::kI32), gpu);
    ops::select_kv_blocks(dq, dev, dmeta, dmeta.sparse_tables, dmeta.sparse_lens);
    ASSERT_TRUE(ops::synchronize(gpu).ok());
    const Tensor tables = on(dmeta.sparse_tables, cpu);
    const int n = (on(dmeta.sparse_lens, cpu).data<int32_t>()[0] + 15) / 16;
    EXPECT_EQ(n, 1 + budget / 16 + 32) << "budget " << budget;
    EXPECT_TRUE(std::find(tables.data<int32_t>(), tables.data<int32_t>() + n, planted_id) != tables.data<int32_t>() + n)
        << "budget " << budget << ": block " << planted_block << " not kept";
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
