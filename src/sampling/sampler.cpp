// Sampler: the logits-to-token pipeline documented in sampler.h. Everything here works on one
// request's [vocab] row; no state survives a call except the request's RNG.
//
// Scratch: the [vocab] work arrays live in a thread_local Workspace. They are pure scratch,
// overwritten at the start of every call, never read across calls; keeping them per thread
// rather than per Sampler saves a few MB per live request at a 150k vocabulary.
#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "sampling/row_kernels.h"

namespace tachyon {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kBlock = 1024;              // tokens per block of the block maxima and block sums
constexpr double kTopPRelativeSlack = 1e-6;  // see sampler.h, step 5
constexpr size_t kHistogramAbove = 4096;     // top-p candidates beyond which a histogram narrows them
// Mass histogram for top-p: a token's bin is its weight's f32 encoding shifted right by 19 bits
// (exponent and 4 mantissa bits: 16 bins per factor of 2), so bins are ordered as the weights.
// Weights are in [0, 1], so the bin of 1.0 is the last.
constexpr int kHistogramShift = 19;
constexpr size_t kHistogramBins = (std::bit_cast<uint32_t>(1.0f) >> kHistogramShift) + 1;

using row::kChunk;  // tokens per vectorized "anything here?" test

// One token in a selection: processed logit t (<= 0), weight w = e^t, id.
struct Candidate {
  float t;
  float w;
  int32_t id;
};

// The ranking of sampler.h: processed logit descending, then id ascending. A strict total order,
// so every selection below has one answer whatever arrangement the standard library leaves.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.t > b.t || (a.t == b.t && a.id < b.id);
}

struct Workspace {
  std::vector<float> t;                // [vocab] (x - max) * (1 / T) after steps 0-3; -inf = excluded
  std::vector<float> w;                // [vocab] e^t: unnormalized probabilities, 1 at the argmax
  std::vector<float> block_max;        // [ceil(vocab / kBlock)] max x per block, before scaling
  std::vector<uint8_t> block_touched;  // [ceil(vocab / kBlock)] a penalty or bias changed the block
  std::vector<double> block_mass;      // [ceil(vocab / kBlock)] sum of w per block
  std::vector<double> histogram;       // [4, kHistogramBins] sum of w per bin, four interleaved copies
  std::vector<int32_t> ids;            // [<= vocab + kChunk] compaction target; only ever grows
  std::vector<Candidate> candidates;
  std::vector<Candidate> scratch;
};

Workspace& thread_workspace() {
  thread_local Workspace workspace;
  return workspace;
}

// What process() leaves besides the workspace arrays.
struct Processed {
  int32_t argmax = -1;  // lowest id with the largest logit after penalties
  double mass = 0.0;    // sum of w
  double log_mass = 0.0;
};

// Steps 1-2 of sampler.h, touching only the tokens in the history.
Status apply_penalties(const SamplingParams& params, const TokenCounts& history, float* logits,
                       int vocab_size, uint8_t* block_touched) {
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
  if (!repetition && !additive) return Status::Ok();
  for (const auto& [token, entry] : history.entries()) {
    if (token < 0 || token >= vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "token history holds id {}, outside the vocabulary [0, {})", token, vocab_size);
    }
    block_touched[static_cast<size_t>(token) / kBlock] = 1;
    float& x = logits[token];
    if (repetition && (entry.in_prompt || entry.output_count > 0)) {
      x = x > 0.0f ? x / params.repetition_penalty : x * params.repetition_penalty;
    }
    if (additive && entry.output_count > 0) {
      x -= params.frequency_penalty * static_cast<float>(entry.output_count) + params.presence_penalty;
    }
  }
  return Status::Ok();
}

// Steps 0-3: fills ws.t, ws.w and ws.block_mass for the row.
Result<Processed> process(const SamplingParams& params, const float* logits, int vocab_size,
                          const TokenCounts& history, Workspace& ws) {
  if (logits == nullptr) return make_error(ErrorCode::kInvalidArgument, "sampler: logits pointer is null");
  if (vocab_size <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "sampler: vocab_size must be positive, got {}",
                      vocab_size);
  }
  const size_t vocab = static_cast<size_t>(vocab_size);
  const size_t num_blocks = (vocab + kBlock - 1) / kBlock;
  ws.t.resize(vocab);
  ws.w.resize(vocab);
  ws.block_max.resize(num_blocks);
  ws.block_mass.resize(num_blocks);
  ws.block_touched.assign(num_blocks, 0);
  float* t = ws.t.data();
  float* w = ws.w.data();
  const auto block_begin = [](size_t b) { return b * kBlock; };
  const auto block_size = [&](size_t b) { return std::min(vocab, (b + 1) * kBlock) - b * kBlock; };

  for (size_t b = 0; b < num_blocks; ++b) {
    ws.block_max[b] = row::sanitize(logits + block_begin(b), t + block_begin(b), block_size(b));
  }
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "logit_bias token id {} is outside the vocabulary [0, {})", token, vocab_size);
    }
    ws.block_touched[static_cast<size_t>(token) / kBlock] = 1;
    t[token] += bias;
  }
  TACHYON_RETURN_IF_ERROR(apply_penalties(params, history, t, vocab_size, ws.block_touched.data()));
  for (size_t b = 0; b < num_blocks; ++b) {
    if (ws.block_touched[b]) ws.block_max[b] = row::max_value(t + block_begin(b), block_size(b));
  }

  Processed out;
  const float max_logit = *std::max_element(ws.block_max.begin(), ws.block_max.end());
  if (max_logit == kNegInf) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sampler: all {} logits are non-finite (NaN or infinite) after penalties", vocab_size);
  }
  const size_t argmax_block = static_cast<size_t>(
      std::find(ws.block_max.begin(), ws.block_max.end(), max_logit) - ws.block_max.begin());
  out.argmax = static_cast<int32_t>(
      block_begin(argmax_block) +
      row::first_index_of(t + block_begin(argmax_block), block_size(argmax_block), max_logit));

  // Subtracting the max before scaling keeps every t in [-inf, 0], whatever the temperature.
  const float scale = 1.0f / (params.greedy() ? 1.0f : params.temperature);
  for (size_t b = 0; b < num_blocks; ++b) {
    ws.block_mass[b] =
        row::scale_exp_sum(t + block_begin(b), w + block_begin(b), block_size(b), max_logit, scale);
    out.mass += ws.block_mass[b];
  }
  out.log_mass = std::log(out.mass);
  return out;
}

// Appends {t, w, id} of each id in ids to out.
void materialize(const Workspace& ws, const int32_t* ids, size_t count, std::vector<Candidate>& out) {
  out.clear();
  out.reserve(count);
  for (size_t j = 0; j < count; ++j) {
    const int32_t i = ids[j];
    out.push_back({ws.t[static_cast<size_t>(i)], ws.w[static_cast<size_t>(i)], i});
  }
}

// The k best-ranked tokens with t > -inf, in unspecified order. O(vocab): ids are collected
// into a buffer of about 2k that is cut back to its best k whenever it fills; after a cut only
// tokens beating the k-th best so far can enter (a later token with an equal t has a larger id,
// so it ranks after). Chunks with no such token are skipped by one vectorized test, the others
// compacted without branches as in gather_ids.
void select_top(Workspace& ws, size_t k, std::vector<Candidate>& out) {
  const size_t vocab = ws.t.size();
  const size_t cut_at = std::max<size_t>(2 * k, 256);
  if (ws.ids.size() < cut_at + kChunk) ws.ids.resize(cut_at + kChunk);
  int32_t* ids = ws.ids.data();
  const float* t = ws.t.data();
  const auto id_ranks_before = [t](int32_t a, int32_t b) { return t[a] > t[b] || (t[a] == t[b] && a < b); };
  size_t count = 0;
  float threshold = kNegInf;
  for (size_t begin = 0; begin < vocab; begin += kChunk) {
    const size_t end = std::min(vocab, begin + kChunk);
    const bool any = end - begin == kChunk ? row::chunk_any_greater(t + begin, threshold)
                                           : row::any_greater(t, begin, end, threshold);
    if (!any) continue;
    for (size_t i = begin; i < end; ++i) {
      ids[count] = static_cast<int32_t>(i);
      count += static_cast<size_t>(t[i] > threshold);
    }
    if (count >= cut_at) {
      std::nth_element(ids, ids + (k - 1), ids + count, id_ranks_before);
      count = k;
      threshold = t[ids[k - 1]];
    }
  }
  if (count > k) {
    std::nth_element(ids, ids + (k - 1), ids + count, id_ranks_before);
    count = k;
  }
  materialize(ws, ids, count, out);
}

// Ids of the tokens with w >= weight_floor (> 0) into ws.ids, in id order; returns how many.
// They are a prefix of the ranking. Chunks without one are skipped by a vectorized test; the
// others are compacted without branches (every id is written, the count advances only for
// wanted ones), as wanted tokens are often a scattered few percent that would make a branch
// mispredict constantly.
size_t gather_ids(Workspace& ws, float weight_floor) {
  const size_t vocab = ws.t.size();
  const float* w = ws.w.data();
  if (ws.ids.size() < vocab + kChunk) ws.ids.resize(vocab + kChunk);
  int32_t* ids = ws.ids.data();
  size_t count = 0;
  for (size_t begin = 0; begin < vocab; begin += kChunk) {
    const size_t end = std::min(vocab, begin + kChunk);
    const bool any = end - begin == kChunk ? row::chunk_any_at_least(w + begin, weight_floor)
                                           : row::any_at_least(w, begin, end, weight_floor);
    if (!any) continue;
    for (size_t i = begin; i < end; ++i) {
      ids[count] = static_cast<int32_t>(i);
      count += static_cast<size_t>(w[i] >= weight_floor);
    }
  }
  return count;
}

// Keeps, in order, the ids among ws.ids[0, count) with w >= weight_floor; returns how many.
size_t filter_ids(Workspace& ws, size_t count, float weight_floor) {
  int32_t* ids = ws.ids.data();
  size_t kept = 0;
  for (size_t j = 0; j < count; ++j) {
    ids[kept] = ids[j];
    kept += static_cast<size_t>(ws.w[static_cast<size_t>(ids[j])] >= weight_floor);
  }
  return kept;
}

// A weight floor above which a top-p nucleus reaching `target` must end, from a mass histogram
// of the tokens ws.ids[0, count) (a prefix of the ranking): bins are taken from the heaviest
// until their mass passes target by a margin larger than any rounding; 0 when they never do.
// Four interleaved histograms keep consecutive tokens of one bin from waiting on each other.
float nucleus_weight_floor(Workspace& ws, size_t count, double target) {
  constexpr size_t kWays = 4;
  ws.histogram.assign(kWays * kHistogramBins, 0.0);
  double* histogram = ws.histogram.data();
  const int32_t* ids = ws.ids.data();
  const float* w = ws.w.data();
  const auto bin = [](float weight) {
    return static_cast<size_t>(std::bit_cast<uint32_t>(weight) >> kHistogramShift);
  };
  size_t j = 0;
  for (; j + kWays <= count; j += kWays) {
    for (size_t way = 0; way < kWays; ++way) {
      const float weight = w[static_cast<size_t>(ids[j + way])];
      histogram[way * kHistogramBins + bin(weight)] += weight;
    }
  }
  for (; j < count; ++j) histogram[bin(w[static_cast<size_t>(ids[j])])] += w[static_cast<size_t>(ids[j])];
  double cumulative = 0.0;
  for (size_t b = kHistogramBins; b-- > 0;) {
    for (size_t way = 0; way < kWays; ++way) cumulative += histogram[way * kHistogramBins + b];
    if (cumulative >= target * (1.0 + kTopPRelativeSlack)) {
      return std::bit_cast<float>(static_cast<uint32_t>(b << kHistogramShift));
    }
  }
  return 0.0f;
}

// Reorders c so that its best-ranked prefix with the least count whose mass reaches `target`
// comes first, and returns that count (all of c when even the whole falls short by rounding).
// Expected O(n): a quickselect that descends by accumulated mass instead of by count.
size_t nucleus_prefix(std::vector<Candidate>& c, double target) {
  size_t lo = 0, hi = c.size();
  double mass_before_lo = 0.0;  // mass of c[0, lo), all ranked before c[lo, hi); < target
  while (lo < hi) {
    // Median of three as the pivot, parked at hi - 1 during the partition.
    const size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (ranks_before(c[mid], c[lo])) std::swap(c[mid], c[lo]);
    if (ranks_before(c[last], c[lo])) std::swap(c[last], c[lo]);
    if (ranks_before(c[mid], c[last])) std::swap(c[mid], c[last]);
    const Candidate pivot = c[last];
    const auto split =
        std::partition(c.begin() + static_cast<ptrdiff_t>(lo), c.begin() + static_cast<ptrdiff_t>(last),
                       [&](const Candidate& x) { return ranks_before(x, pivot); });
    const size_t p = static_cast<size_t>(split - c.begin());
    std::swap(c[p], c[last]);
    double mass = 0.0;
    for (size_t i = lo; i < p; ++i) mass += c[i].w;
    if (mass_before_lo + mass >= target) {
      hi = p;
    } else if (mass_before_lo + mass + c[p].w >= target) {
      return p + 1;
    } else {
      mass_before_lo += mass + c[p].w;
      lo = p + 1;
    }
  }
  return lo;
}

// Steps 4-6. Returns true when every token is kept; otherwise ws.candidates holds the kept set
// in increasing id order (a prefix of the ranking, never empty: the argmax is always in it).
bool select_kept(const SamplingParams& params, const Processed& processed, Workspace& ws) {
  const size_t vocab = ws.t.size();
  const bool use_k = params.top_k_enabled() && static_cast<size_t>(params.top_k) < vocab;
  const bool use_p = params.top_p < 1.0f;
  const bool use_min_p = params.min_p > 0.0f;
  if (!use_k && !use_p && !use_min_p) return true;

  std::vector<Candidate>& c = ws.candidates;
  if (use_k) {
    // At most k tokens: truncate them in place, then sort by id.
    select_top(ws, static_cast<size_t>(params.top_k), c);
    if (use_p) {
      double top_k_mass = 0.0;
      for (const Candidate& x : c) top_k_mass += x.w;
      c.resize(nucleus_prefix(c, params.top_p * top_k_mass * (1.0 - kTopPRelativeSlack)));
    }
    if (use_min_p) std::erase_if(c, [&](const Candidate& x) { return x.w < params.min_p; });
    std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    return false;
  }
  // Gather, in id order, only what can survive. For min-p: w >= min_p (w is 1 at the argmax, so
  // w is p / p_max). For top-p: tokens with w below the floor together weigh less than
  // (1 - top_p) / 2 of the mass, so the nucleus ends before reaching any of them. Every set here
  // is a prefix of the ranking, so the nucleus is measured exactly as over the whole vocabulary.
  const double target = params.top_p * processed.mass;
  float floor = use_min_p ? params.min_p : 0.0f;
  if (use_p) {
    floor = std::max(
        floor, static_cast<float>(0.5 * (1.0 - params.top_p) * processed.mass / static_cast<double>(vocab)));
  }
  size_t count = gather_ids(ws, floor);
  if (use_p && count > kHistogramAbove) {
    // A flat distribution leaves many: narrow them to the histogram bins holding the nucleus.
    count = filter_ids(ws, count, std::max(floor, nucleus_weight_floor(ws, count, target)));
  }
  materialize(ws, ws.ids.data(), count, c);
  if (!use_p) return false;  // min-p alone: the gathered set is the kept set
  // The nucleus is found on a copy (the selection reorders it); its last-ranked member then
  // filters the id-ordered set, which spares a sort of what may be thousands of tokens.
  ws.scratch.assign(c.begin(), c.end());
  const size_t kept = nucleus_prefix(ws.scratch, target * (1.0 - kTopPRelativeSlack));
  const Candidate last =
      *std::max_element(ws.scratch.begin(), ws.scratch.begin() + static_cast<ptrdiff_t>(kept), ranks_before);
  std::erase_if(c, [&](const Candidate& x) { return ranks_before(last, x); });
  return false;
}

// Step 7 over every token: finds the block holding u * mass from the block sums, then the token.
int32_t draw_from_all(const Workspace& ws, const Processed& processed, double u) {
  const double target = u * processed.mass;
  const size_t vocab = ws.t.size();
  double cumulative = 0.0;
  for (size_t b = 0; b < ws.block_mass.size(); ++b) {
    if (cumulative + ws.block_mass[b] > target) {
      const size_t end = std::min(vocab, (b + 1) * kBlock);
      for (size_t i = b * kBlock; i < end; ++i) {
        cumulative += ws.w[i];
        if (cumulative > target && ws.w[i] > 0.0f) return static_cast<int32_t>(i);
      }
      break;  // only by rounding: the block sum and the running sum differ in the last bits
    }
    cumulative += ws.block_mass[b];
  }
  return processed.argmax;
}

// Step 7 over the kept tokens, already in increasing id order.
int32_t draw_from_kept(const std::vector<Candidate>& kept, const Processed& processed, double u) {
  double mass = 0.0;
  for (const Candidate& x : kept) mass += x.w;
  const double target = u * mass;
  double cumulative = 0.0;
  for (const Candidate& x : kept) {
    cumulative += x.w;
    if (cumulative > target && x.w > 0.0f) return x.id;
  }
  return processed.argmax;  // only by rounding
}

}  // namespace

Sampler::Sampler(SamplingParams params)
    : params_(std::move(params)),
      // logit_bias ids are checked against the real vocabulary in every sample().
      params_status_(params_.validate(std::numeric_limits<int>::max())),
      seed_(params_.seed ? *params_.seed : random_seed()),
      rng_(seed_) {}

Result<Sampler> Sampler::create(SamplingParams params, int vocab_size) {
  TACHYON_RETURN_IF_ERROR(params.validate(vocab_size));
  return Sampler(std::move(params));
}

Result<SampleResult> Sampler::sample(const float* logits, int vocab_size, const TokenCounts& history) {
  TACHYON_RETURN_IF_ERROR(params_status_);
  Workspace& ws = thread_workspace();
  TACHYON_ASSIGN_OR_RETURN(const Processed processed, process(params_, logits, vocab_size, history, ws));

  SampleResult result;
  if (params_.greedy()) {
    result.token = processed.argmax;
  } else {
    const bool all_kept = select_kept(params_, processed, ws);
    const double u = rng_.next_double();
    result.token = all_kept ? draw_from_all(ws, processed, u) : draw_from_kept(ws.candidates, processed, u);
  }
  result.logprob = static_cast<float>(ws.t[result.token] - processed.log_mass);

  if (params_.logprobs > 0) {
    std::vector<Candidate>& top = ws.candidates;  // the kept set is no longer needed
    select_top(ws, static_cast<size_t>(params_.logprobs), top);
    std::sort(top.begin(), top.end(), ranks_before);
    result.top_logprobs.reserve(top.size());
    for (const Candidate& x : top) {
      result.top_logprobs.emplace_back(x.id, static_cast<float>(x.t - processed.log_mass));
    }
  }
  return result;
}

Status Sampler::probabilities(const float* logits, int vocab_size, const TokenCounts& history,
                              std::vector<float>& probs) const {
  TACHYON_RETURN_IF_ERROR(params_status_);
  Workspace& ws = thread_workspace();
  TACHYON_ASSIGN_OR_RETURN(const Processed processed, process(params_, logits, vocab_size, history, ws));
  probs.assign(static_cast<size_t>(vocab_size), 0.0f);
  if (params_.greedy()) {
    probs[static_cast<size_t>(processed.argmax)] = 1.0f;
    return Status::Ok();
  }
  if (select_kept(params_, processed, ws)) {
    for (size_t i = 0; i < probs.size(); ++i) probs[i] = static_cast<float>(ws.w[i] / processed.mass);
    return Status::Ok();
  }
  double mass = 0.0;
  for (const Candidate& x : ws.candidates) mass += x.w;
  for (const Candidate& x : ws.candidates) probs[static_cast<size_t>(x.id)] = static_cast<float>(x.w / mass);
  return Status::Ok();
}

}  // namespace tachyon
