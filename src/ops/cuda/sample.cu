// Sampling on the device: ops::sample, ops::adjust_logits and ops::mask_logits (ops/ops.h has the
// contract; the plain CPU form in ops.cpp is what the GPU tests compare against).
//
// sample_kernel: one block of kThreads per row. Warp w owns the contiguous ids
// [w * span, (w + 1) * span) (span a multiple of 32, so lanes read coalesced); every pass over the
// row keeps kUnroll loads in flight per thread (the row stays in L2 between passes).
//   1. the argmax and max m, each thread's largest value; the sum of every weight w = exp(t),
//      t = (x - m) * (1 / T);
//   2. top-k and top-p, fast path: a threshold below which no kept token can lie, from the
//      threads' largest values sorted in shared memory (the k-th largest of the maxima, or, for
//      top-p alone, the value of the threads' four largest at which their weights alone reach the
//      top-p mass); the tokens at or above it are gathered into
//      shared memory (at most kCandidates), sorted by (t descending, id ascending), and the kept
//      prefix of that ranking is cut there: top-k at k, top-p where the running mass reaches the
//      target. Its last member (key, id) decides membership for the draw;
//   2'. slow path, when no threshold is found or too many tokens pass it (flat distributions): the
//      boundary key by bisection over the 32-bit order key of t, each probe a counting (top-k) or
//      mass (top-p) pass over the row, then the tied tokens at the boundary taken in id order;
//   3. the draw: the warps' kept masses meet in warp order, thread 0 finds the warp whose range
//      holds u * kept, that warp walks its range 32 ids at a time with a prefix sum.
// Every block-wide sum is reduced in a fixed order (lanes, then warps in order) and the gathered
// tokens are sorted by a total order, so the same row and draw give the same token on every run.
// Ties and boundaries follow the CPU reference: the kept set is a prefix of the ranking.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kParams = 6;         // ops::kSampleParams
constexpr int kUnroll = 8;         // loads in flight per thread in a pass over the row
constexpr int kCandidates = 4096;  // tokens the fast path gathers at most
static_assert(2 * kCandidates >= 4 * kThreads, "the gathering buffer also holds four floats per thread");

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Block-wide sums of a and b in a fixed order; every thread gets them. Ends synchronised, so the
// scratch may be reused at once.
struct Pair {
  double a, b;
};
__device__ __forceinline__ Pair block_sum2(double a, double b, double* scratch_a, double* scratch_b) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_sum_f64(a);
  b = warp_sum_f64(b);
  if (lane == 0) {
    scratch_a[warp] = a;
    scratch_b[warp] = b;
  }
  __syncthreads();
  Pair s{0.0, 0.0};
  for (int w = 0; w < kWarps; ++w) {
    s.a += scratch_a[w];
    s.b += scratch_b[w];
  }
  __syncthreads();
  return s;
}

// The order key of a processed logit: larger t, larger key (-0 is made +0 first, as the ranking
// compares values). Keys of finite t are above 0x007fffff, the key of -inf.
__device__ __forceinline__ uint32_t order_key(float t) {
  const uint32_t u = __float_as_uint(t + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}
// A gathered token: its key above its inverted id, so that sorting descending ranks by t
// descending, then id ascending. 0 (below every real entry) pads the sort.
__device__ __forceinline__ uint64_t rank_entry(uint32_t key, int64_t id) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}
__device__ __forceinline__ uint32_t entry_key(uint64_t e) { return static_cast<uint32_t>(e >> 32); }
__device__ __forceinline__ int64_t entry_id(uint64_t e) { return ~static_cast<uint32_t>(e); }

struct RowView {
  const float* x;
  float m;      // the row's largest finite value
  float scale;  // 1 / T
  // t of a logit; -inf for a non-finite one (excluded everywhere).
  __device__ __forceinline__ float t_of(float v) const { return isfinite(v) ? (v - m) * scale : -INFINITY; }
  __device__ __forceinline__ float t(int64_t j) const { return t_of(x[j]); }
};

// What top-k and top-p kept: a prefix of the ranking, given by its last member's key and id
// (tokens with a larger key, or the same key and an id up to `last`).
struct Prefix {
  bool on = false;
  uint32_t key = 0;
  int64_t last = INT64_MAX;
  __device__ __forceinline__ bool holds(uint32_t k, int64_t j) const {
    return !on || k > key || (k == key && j <= last);
  }
};

struct Shared {
  double a[kWarps], b[kWarps];
  float best_v[kWarps];
  int best_i[kWarps];
  int warp_count[kWarps];
  int64_t found[3];
  double before, target, kept;
  int chosen_warp;
  int token;
  int gathered;
  float maxima[kThreads];             // each thread's largest finite logit, then sorted descending
  uint64_t entries[kCandidates];      // gathered tokens (rank_entry), then sorted descending; before
                                      // that, for top-p alone, the threads' four largest logits
};

// body(j, x, valid) for every id of this warp's range [begin, end), kUnroll loads in flight per
// lane; called by every lane of the warp together (valid is false past the end), so the body may
// use warp votes.
template <typename Body>
__device__ __forceinline__ void for_row(const float* x, int64_t begin, int64_t end, Body body) {
  const int lane = threadIdx.x & 31;
  for (int64_t base = begin; base < end; base += 32 * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int64_t j = base + 32 * i + lane;
      v[i] = j < end ? x[j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int64_t j = base + 32 * i + lane;
      body(j, v[i], j < end);
    }
  }
}

// Sorts v[0, n) descending (n a power of two, at most 2 * kThreads * 64); the block ends synchronised.
template <typename T>
__device__ void bitonic_sort_descending(T* v, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const T a = v[lo], b = v[hi];
        if ((a < b) == descending) {
          v[lo] = b;
          v[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// The first i in [0, n) at which the running sum of value(i) reaches target; -1 if it never does.
// Warp 0 scans 32 values at a time; every thread gets the answer.
template <typename Value>
__device__ int first_reaching(Value value, int n, double target, Shared& s) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    double running = 0.0;
    int found = -1;
    for (int base = 0; base < n; base += 32) {
      const int i = base + lane;
      double incl = i < n ? value(i) : 0.0;
      for (int o = 1; o < 32; o <<= 1) {
        const double up = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += up;
      }
      const unsigned hit = __ballot_sync(kFullMask, i < n && running + incl >= target);
      if (hit != 0) {
        found = base + __ffs(hit) - 1;
        break;
      }
      running += __shfl_sync(kFullMask, incl, 31);
    }
    if (lane == 0) s.found[0] = found;
  }
  __syncthreads();
  const int found = static_cast<int>(s.found[0]);
  __syncthreads();
  return found;
}

// The id of the n-th (1-based) token, in id order, for which pred(j) holds; -1 when fewer hold.
template <typename Pred>
__device__ int64_t nth_in_id_order(Pred pred, int64_t n, int64_t begin, int64_t end, Shared& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int count = 0;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t j = base + lane;
    count += __popc(__ballot_sync(kFullMask, j < end && pred(j)));
  }
  if (lane == 0) s.warp_count[warp] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t left = n;
    int w = 0;
    for (; w < kWarps && left > s.warp_count[w]; ++w) left -= s.warp_count[w];
    s.found[0] = w;
    s.found[1] = left;
    s.found[2] = -1;
  }
  __syncthreads();
  if (warp == s.found[0]) {
    int64_t left = s.found[1];
    for (int64_t base = begin; base < end; base += 32) {
      const int64_t j = base + lane;
      unsigned hits = __ballot_sync(kFullMask, j < end && pred(j));
      if (left <= __popc(hits)) {
        if (lane == 0) {
          for (int64_t i = 1; i < left; ++i) hits &= hits - 1;
          s.found[2] = base + __ffs(hits) - 1;
        }
        break;
      }
      left -= __popc(hits);
    }
  }
  __syncthreads();
  const int64_t id = s.found[2];
  __syncthreads();
  return id;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* x, int64_t x_stride, int64_t d,
                                                         const float* params, int32_t* ids, float* logprobs,
                                                         float* probs) {
  __shared__ Shared s;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  const float* p = params + static_cast<int64_t>(blockIdx.x) * kParams;
  const float temperature = p[0], min_p = p[1], top_p = p[5];
  const double u = static_cast<double>(p[2]) + static_cast<double>(p[3]);
  const int64_t top_k = static_cast<int64_t>(p[4]);
  const bool greedy = temperature == 0.0f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t span = ((d + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int64_t begin = static_cast<int64_t>(warp) * span;
  const int64_t end = min64(d, begin + span);

  // 1. The argmax (first of equal maxima), each thread's largest value, the sum of every weight.
  float best_v = -INFINITY;
  int best_i = 0x7fffffff;
  for_row(row, begin, end, [&](int64_t j, float v, bool valid) {
    if (valid && isfinite(v) && (v > best_v || (v == best_v && j < best_i))) {
      best_v = v;
      best_i = static_cast<int>(j);
    }
  });
  s.maxima[threadIdx.x] = best_v;
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_down_sync(kFullMask, best_v, o);
    const int i = __shfl_down_sync(kFullMask, best_i, o);
    if (v > best_v || (v == best_v && i < best_i)) {
      best_v = v;
      best_i = i;
    }
  }
  if (lane == 0) {
    s.best_v[warp] = best_v;
    s.best_i[warp] = best_i;
  }
  __syncthreads();
  best_v = -INFINITY;
  best_i = 0x7fffffff;
  for (int w = 0; w < kWarps; ++w) {  // warps hold increasing ids: the first maximum wins
    if (s.best_v[w] > best_v) {
      best_v = s.best_v[w];
      best_i = s.best_i[w];
    }
  }
  float* q = probs != nullptr ? probs + static_cast<int64_t>(blockIdx.x) * d : nullptr;
  if (best_v == -INFINITY) {
    if (threadIdx.x == 0) {
      ids[blockIdx.x] = 0;
      logprobs[blockIdx.x] = -INFINITY;
    }
    if (q != nullptr) {
      for (int64_t j = begin + lane; j < end; j += 32) q[j] = 0.0f;
    }
    return;
  }
  const RowView rv{row, best_v, 1.0f / (greedy ? 1.0f : temperature)};
  double all = 0.0, finite = 0.0;
  for_row(row, begin, end, [&](int64_t, float v, bool valid) {
    const float t = rv.t_of(v);
    if (valid && t != -INFINITY) {
      all += expf(t);
      finite += 1.0;
    }
  });
  const Pair totals = block_sum2(all, finite, s.a, s.b);
  all = totals.a;

  if (threadIdx.x == 0) s.token = best_i;
  if (!greedy) {
    const bool use_k = top_k > 0 && static_cast<double>(top_k) < totals.b;
    const bool use_p = top_p < 1.0f;
    Prefix k_set, p_set;
    bool fast = false;
    if (use_k || use_p) {
      // 2. A threshold no kept token lies below. top-k: the k-th largest of the threads' maxima
      // (k tokens are at or above it). top-p alone: each thread's four largest values, sorted;
      // the one at which their weights reach the target (that much mass is at or above it).
      float threshold = -INFINITY;
      if (use_k) {
        bitonic_sort_descending(s.maxima, kThreads);
        if (top_k <= kThreads && s.maxima[top_k - 1] != -INFINITY) threshold = s.maxima[top_k - 1];
      } else {
        float top[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // descending
        for_row(row, begin, end, [&](int64_t, float v, bool valid) {
          if (!valid || !isfinite(v) || !(v > top[3])) return;
          top[3] = v;
#pragma unroll
          for (int i = 3; i > 0; --i) {
            if (top[i] > top[i - 1]) {
              const float t = top[i];
              top[i] = top[i - 1];
              top[i - 1] = t;
            }
          }
        });
        float* values = reinterpret_cast<float*>(s.entries);  // 4 * kThreads floats
#pragma unroll
        for (int i = 0; i < 4; ++i) values[4 * threadIdx.x + i] = top[i];
        __syncthreads();
        bitonic_sort_descending(values, 4 * kThreads);
        const double target = static_cast<double>(top_p) * all * (1.0 - 1e-6);
        const int i = first_reaching(
            [&](int i) {
              const float v = values[i];
              return v == -INFINITY ? 0.0 : static_cast<double>(expf(rv.t_of(v)));
            },
            4 * kThreads, target, s);
        if (i >= 0) threshold = values[i];
        __syncthreads();  // the values are overwritten by the gathering below
      }
      if (threshold != -INFINITY) {
        const float t_min = rv.t_of(threshold);
        if (threadIdx.x == 0) s.gathered = 0;
        __syncthreads();
        for_row(row, begin, end, [&](int64_t j, float v, bool valid) {
          const float t = rv.t_of(v);
          const bool take = valid && t != -INFINITY && t >= t_min;
          const unsigned mask = __ballot_sync(kFullMask, take);
          if (mask != 0) {
            int at = 0;
            if (lane == 0) at = atomicAdd(&s.gathered, __popc(mask));
            at = __shfl_sync(kFullMask, at, 0) + __popc(mask & ((1u << lane) - 1));
            if (take && at < kCandidates) s.entries[at] = rank_entry(order_key(t), j);
          }
        });
        __syncthreads();
        const int gathered = s.gathered;
        fast = gathered <= kCandidates;
        if (fast) {
          int padded = 2;
          while (padded < gathered) padded <<= 1;
          for (int i = gathered + static_cast<int>(threadIdx.x); i < padded; i += kThreads) s.entries[i] = 0;
          __syncthreads();
          bitonic_sort_descending(s.entries, padded);
          int last = gathered - 1;
          if (use_k) last = static_cast<int>(top_k) - 1;
          if (use_p) {
            double whole = all;
            if (use_k) {
              double m = 0.0;
              for (int i = threadIdx.x; i <= last; i += kThreads) m += expf(key_value(entry_key(s.entries[i])));
              whole = block_sum2(m, 0.0, s.a, s.b).a;
            }
            const double target = static_cast<double>(top_p) * whole * (1.0 - 1e-6);
            const int i = first_reaching(
                [&](int i) { return static_cast<double>(expf(key_value(entry_key(s.entries[i])))); }, last + 1,
                target, s);
            if (i >= 0) last = i;
          }
          k_set.on = true;
          k_set.key = entry_key(s.entries[last]);
          k_set.last = entry_id(s.entries[last]);
        }
      }
    }
    if (!fast && use_k) {
      // 2'. top-k by bisection: the largest key with at least k tokens at or above it.
      const auto count_from = [&](uint32_t from) {
        double c = 0.0;
        for_row(row, begin, end, [&](int64_t, float v, bool valid) {
          const float t = rv.t_of(v);
          c += valid && t != -INFINITY && order_key(t) >= from ? 1.0 : 0.0;
        });
        return block_sum2(c, 0.0, s.a, s.b).a;
      };
      uint32_t lo = 0, hi = 0xffffffffu;
      while (lo < hi) {
        const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
        if (count_from(mid) >= static_cast<double>(top_k)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      k_set.on = true;
      k_set.key = lo;
      const double above = lo == 0xffffffffu ? 0.0 : count_from(lo + 1);
      const double at = count_from(lo) - above;
      const double need = static_cast<double>(top_k) - above;  // >= 1
      if (need < at) {
        k_set.last = nth_in_id_order(
            [&](int64_t j) {
              const float t = rv.t(j);
              return t != -INFINITY && order_key(t) == k_set.key;
            },
            static_cast<int64_t>(need), begin, end, s);
      }
    }
    if (!fast && use_p) {
      // 2'. top-p over what top-k kept, by bisection on the mass at or above a key.
      const auto mass_from = [&](uint32_t from) {
        double m = 0.0, c = 0.0;
        for_row(row, begin, end, [&](int64_t j, float v, bool valid) {
          const float t = rv.t_of(v);
          if (!valid || t == -INFINITY) return;
          const uint32_t key = order_key(t);
          if (key >= from && k_set.holds(key, j)) {
            m += expf(t);
            c += 1.0;
          }
        });
        return block_sum2(m, c, s.a, s.b);
      };
      const double whole = k_set.on ? mass_from(0).a : all;
      const double target = static_cast<double>(top_p) * whole * (1.0 - 1e-6);
      uint32_t lo = 0, hi = 0xffffffffu;
      while (lo < hi) {
        const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
        if (mass_from(mid).a >= target) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      p_set.on = true;
      p_set.key = lo;
      const Pair above = lo == 0xffffffffu ? Pair{0.0, 0.0} : mass_from(lo + 1);
      const double at = mass_from(lo).b - above.b;
      // The tied tokens at the boundary key all weigh the same: take them in id order until the
      // running mass reaches the target.
      const double w_tie = expf(key_value(lo));
      double cumulative = above.a, need = 0.0;
      while (need < at && cumulative < target) {
        cumulative += w_tie;
        need += 1.0;
      }
      if (need >= 1.0 && need < at) {
        p_set.last = nth_in_id_order(
            [&](int64_t j) {
              const float t = rv.t(j);
              if (t == -INFINITY) return false;
              const uint32_t key = order_key(t);
              return key == p_set.key && k_set.holds(key, j);
            },
            static_cast<int64_t>(need), begin, end, s);
      }
    }

    // 3. The draw over the kept tokens, in id order.
    const auto weight_of = [&](int64_t j, float v) {
      const float t = rv.t_of(v);
      if (t == -INFINITY) return 0.0f;
      const float w = expf(t);
      const uint32_t key = order_key(t);
      return w >= min_p && k_set.holds(key, j) && p_set.holds(key, j) ? w : 0.0f;
    };
    double kept = 0.0;
    for_row(row, begin, end, [&](int64_t j, float v, bool valid) {
      if (valid) kept += weight_of(j, v);
    });
    kept = warp_sum_f64(kept);
    if (lane == 0) s.a[warp] = kept;
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0.0;
      for (int w = 0; w < kWarps; ++w) total += s.a[w];
      s.kept = total;
      s.target = u * total;
      s.chosen_warp = -1;
      double cumulative = 0.0;
      for (int w = 0; w < kWarps; ++w) {
        if (cumulative + s.a[w] > s.target) {
          s.chosen_warp = w;
          break;
        }
        cumulative += s.a[w];
      }
      s.before = cumulative;
    }
    __syncthreads();
    if (warp == s.chosen_warp) {
      double running = s.before;
      const double target = s.target;
      for (int64_t base = begin; base < end; base += 32) {
        const int64_t j = base + lane;
        const float w = j < end ? weight_of(j, row[j]) : 0.0f;
        double incl = w;  // inclusive prefix over the lanes
        for (int o = 1; o < 32; o <<= 1) {
          const double up = __shfl_up_sync(kFullMask, incl, o);
          if (lane >= o) incl += up;
        }
        const unsigned hit = __ballot_sync(kFullMask, running + incl > target && w > 0.0f);
        if (hit != 0) {
          if (lane == 0) s.token = static_cast<int>(base + __ffs(hit) - 1);
          break;
        }
        running += __shfl_sync(kFullMask, incl, 31);
      }
    }
    if (q != nullptr) {  // the law the token was drawn from
      const float inv = static_cast<float>(1.0 / s.kept);
      for (int64_t j = begin + lane; j < end; j += 32) q[j] = weight_of(j, row[j]) * inv;
    }
  }
  __syncthreads();
  if (greedy && q != nullptr) {
    const int token = s.token;
    for (int64_t j = begin + lane; j < end; j += 32) q[j] = j == token ? 1.0f : 0.0f;
  }
  if (threadIdx.x == 0) {
    const int token = s.token;
    ids[blockIdx.x] = token;
    logprobs[blockIdx.x] = static_cast<float>((row[token] - rv.m) * rv.scale - log(all));
  }
}

// One thread per edit: (row, token, bias, repetition, subtract), see ops::adjust_logits.
__global__ void adjust_logits_kernel(float* x, int64_t x_stride, int64_t n, int64_t d, const float* edits,
                                     int64_t m) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < m;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* p = edits + e * 5;
    const auto r = static_cast<int64_t>(p[0]), token = static_cast<int64_t>(p[1]);
    if (r < 0 || r >= n || token < 0 || token >= d) continue;  // the host checked; never write outside
    float& v = x[r * x_stride + token];
    float y = v + p[2];
    y = y > 0.0f ? y / p[3] : y * p[3];
    v = y - p[4];
  }
}

// Grid (tiles of tokens, masks): each thread one token of one masked row.
__global__ void mask_logits_kernel(float* x, int64_t x_stride, int64_t n, int64_t d, const int32_t* masks,
                                   int64_t columns) {
  const int32_t* mask = masks + static_cast<int64_t>(blockIdx.y) * columns;
  const int64_t r = mask[0];
  if (r < 0 || r >= n) return;  // the host checked; never write outside
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < d;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (((static_cast<uint32_t>(mask[1 + (t >> 5)]) >> (t & 31)) & 1u) == 0) x[r * x_stride + t] = -INFINITY;
  }
}

}  // namespace

cudaError_t launch_sample(const float* x, int64_t x_stride, int64_t n, int64_t d, const float* params, int32_t* ids,
                          float* logprobs, float* probs, Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7ffffffe) return cudaErrorInvalidValue;
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, x_stride, d, params, ids, logprobs, probs);
  return cudaGetLastError();
}

cudaError_t launch_adjust_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const float* edits, int64_t m,
                                 Stream stream) {
  if (m == 0) return cudaSuccess;
  const int threads = 256;
  adjust_logits_kernel<<<grid_for(m, threads), threads, 0, stream>>>(x, x_stride, n, d, edits, m);
  return cudaGetLastError();
}

cudaError_t launch_mask_logits(float* x, int64_t x_stride, int64_t n, int64_t d, const int32_t* masks, int64_t m,
                               Stream stream) {
  if (m == 0) return cudaSuccess;
  if (m > 65535) return cudaErrorInvalidValue;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((d + threads - 1) / threads, 256)), static_cast<unsigned>(m));
  mask_logits_kernel<<<grid, threads, 0, stream>>>(x, x_stride, n, d, masks, 1 + (d + 31) / 32);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
