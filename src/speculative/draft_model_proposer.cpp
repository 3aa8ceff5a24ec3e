#include "speculative/draft_model_proposer.h"

#include <algorithm>
#include <cmath>

#include "core/device_memory.h"
#include "model/forward_batch.h"
#include "ops/ops.h"
#include "sampling/sample_params.h"

namespace tachyon {
namespace {

// The draws of sampled drafts come from a stream of their own, derived from the request's seed,
// so that a seeded request replays exactly and the target's stream is the verifier's alone.
constexpr uint64_t kDraftSeedSalt = 0x9e3779b97f4a7c15ull;

// Inverse CDF over q in id order (q sums to 1 up to rounding; at least one entry positive).
int32_t draw(const std::vector<float>& q, double u) {
  double total = 0.0;
  for (float x : q) total += x;
  const double target = u * total;
  double acc = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] <= 0.0f) continue;
    acc += q[i];
    last = static_cast<int32_t>(i);
    if (target < acc) return last;
  }
  return last;
}

// The `count` tokens of largest weight other than `exclude` and of positive weight, largest first.
void top_tokens(const std::vector<float>& w, int count, int32_t exclude, std::vector<int32_t>& out) {
  out.clear();
  for (size_t t = 0; t < w.size(); ++t) {
    if (w[t] > 0.0f && static_cast<int32_t>(t) != exclude) out.push_back(static_cast<int32_t>(t));
  }
  const auto better = [&](int32_t a, int32_t b) {
    return w[static_cast<size_t>(a)] != w[static_cast<size_t>(b)] ? w[static_cast<size_t>(a)] > w[static_cast<size_t>(b)]
                                                                   : a < b;
  };
  const size_t n = std::min(out.size(), static_cast<size_t>(std::max(count, 0)));
  std::partial_sort(out.begin(), out.begin() + static_cast<ptrdiff_t>(n), out.end(), better);
  out.resize(n);
}

// Without penalties or logit bias the draft's choice depends on its logits alone: greedy drafts
// take the argmax, sampled ones a draw under temperature, top-k, top-p and min-p (ops::sample, which
// also gives the q the verifier needs), trees (greedy or sampled) rank their side branches by the
// softmax at temperature 1. Those run as one chain on the device; penalties need the sampler on
// the host at every depth (they see the drafts so far).
bool chooses_from_logits(const DraftRequest& r) {
  const SamplingParams& sp = r.sampler->params();
  return sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f &&
         sp.logit_bias.empty();
}

// A sampled chain's q of every level comes back from the device: [K, n, vocab] f32, bounded.
constexpr int64_t kMaxChainProbBytes = int64_t{1} << 30;

}  // namespace

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::create(const LlamaModel& draft,
                                                                        const DraftModelOptions& options) {
  const ModelConfig& c = draft.config();
  if (options.num_kv_blocks < 1 || options.block_size < 1) {
    return make_error(ErrorCode::kInvalidArgument, "draft kv cache: {} blocks of {} tokens", options.num_kv_blocks,
                      options.block_size);
  }
  if (options.target_vocab != 0 && options.target_vocab < c.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument, "draft model: its vocabulary of {} tokens exceeds the target's {}",
                      c.vocab_size, options.target_vocab);
  }
  if (options.max_model_len < 1 || options.max_model_len > c.max_position_embeddings) {
    return make_error(ErrorCode::kInvalidArgument, "draft model: max_model_len {} must be in [1, {}] (its context)",
                      options.max_model_len, c.max_position_embeddings);
  }
  KvCacheConfig kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = options.block_size;
  kv.num_blocks = options.num_kv_blocks;
  kv.dtype = options.kv_dtype;
  kv.device = draft.device();
  kv.tiers = options.tiers;
  kv.num_history_blocks = options.tiers.history_bits() != 0 ? std::max(1, options.num_history_blocks) : 0;
  TACHYON_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(kv));
  return std::unique_ptr<DraftModelProposer>(new DraftModelProposer(draft, options, std::move(cache)));
}

DraftModelProposer::DraftModelProposer(const LlamaModel& draft, const DraftModelOptions& options, KvCache cache)
    : model_(draft),
      options_(options),
      cache_(std::move(cache)),
      // Prefix caching, as the target's: requests that share a prompt share its draft K/V too.
      // Any token the draft ran is a valid cache entry (K/V depend on the tokens before them
      // only), so drafts the target rejects may stay registered until their blocks are rewritten.
      blocks_(BlockManagerOptions{options.num_kv_blocks, options.block_size, true, cache_.config().tiers,
                                  cache_.config().num_history_blocks}) {}

// Per active request: its state, its hypothetical history (penalties see the drafts so far) and
// the chunk it runs next.
struct DraftModelProposer::Active {
  size_t index;
  State* state;
  int k;
  TokenCounts history;
  std::vector<int32_t> run;  // tokens of the next forward
  int start;                 // position of run[0]
  // Trees (DraftRequest::max_nodes > k): the chain takes the draft's likeliest token at every
  // level, and the runners-up become side branches, ranked by the probability of their path.
  bool tree = false;
  double path_prob = 1.0;
  std::vector<SideBranch> alternatives{};
};

Status DraftModelProposer::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft{});
  const int vocab = model_.config().vocab_size;
  std::vector<Active> active;
  active.reserve(requests.size());
  std::vector<BlockCopy> copies;
  bool chain = options_.device_chain;
  int k_max = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    const int len = static_cast<int>(r.tokens.size());
    // The draft writes positions up to len + k - 2 (the last draft token is never run).
    const int k = std::min(r.k, options_.max_model_len - len + 1);
    if (k < 1 || len < 1 || r.sampler == nullptr) continue;
    State& st = states_.try_emplace(r.id, options_.block_size, r.sampler->seed() ^ kDraftSeedSalt).first->second;
    if (!st.table.empty()) {
      // The sequence left what the cache ran before the positions it still holds in full (a
      // window passed them): start over, from the prefix cache.
      const size_t limit = std::min(st.tokens.size(), static_cast<size_t>(len - 1));
      const auto agree = std::mismatch(st.tokens.begin(), st.tokens.begin() + static_cast<ptrdiff_t>(limit),
                                       r.tokens.begin()).first - st.tokens.begin();
      if (agree < st.table.first_resident_position()) {
        blocks_.free(st.table);
        st.tokens.clear();
      }
    }
    if (st.table.empty()) {  // first draft (or the cache was dropped): reuse cached prompt blocks
      const int hit = blocks_.match_prefix(st.table, r.tokens, len - 1);
      st.tokens.assign(r.tokens.begin(), r.tokens.begin() + hit);
    }
    // Keep the longest prefix the cache ran that agrees with the sequence; at least the last token runs.
    const size_t limit = std::min(st.tokens.size(), static_cast<size_t>(len - 1));
    const size_t keep = static_cast<size_t>(
        std::mismatch(st.tokens.begin(), st.tokens.begin() + static_cast<ptrdiff_t>(limit), r.tokens.begin()).first -
        st.tokens.begin());
    blocks_.truncate(st.table, static_cast<int>(keep));
    st.tokens.resize(keep);
    // A token past the draft's vocabulary (one of the target's padding rows) has no embedding here:
    // no draft for this sequence (the tokens before it stay cached).
    if (std::any_of(r.tokens.begin() + static_cast<ptrdiff_t>(keep), r.tokens.end(),
                    [vocab](int32_t t) { return t < 0 || t >= vocab; })) {
      continue;
    }
    if (!blocks_.grow_to(st.table, len + k - 1).ok()) {
      blocks_.truncate(st.table, static_cast<int>(keep));
      continue;  // the draft cache is full: no draft for this request this step
    }
    if (!blocks_.prepare_write(st.table, static_cast<int>(keep), len + k - 1, copies).ok()) {
      blocks_.truncate(st.table, static_cast<int>(keep));
      continue;  // no block for a copy-on-write: no draft this step
    }
    Active a{i, &st, k, r.sampler->history(), {}, static_cast<int>(keep)};
    a.run.assign(r.tokens.begin() + static_cast<ptrdiff_t>(keep), r.tokens.end());
    a.tree = r.max_nodes > k;
    chain = chain && chooses_from_logits(r);
    k_max = std::max(k_max, k);
    active.push_back(std::move(a));
  }
  // A chain runs every sequence K_max steps: the shorter drafts' tables must hold that too.
  const bool sampled = std::any_of(active.begin(), active.end(), [&](const Active& a) {
    return !a.tree && !requests[a.index].sampler->params().greedy();
  });
  chain = chain && (!sampled || static_cast<int64_t>(k_max) * static_cast<int64_t>(active.size()) * vocab *
                                        static_cast<int64_t>(sizeof(float)) <= kMaxChainProbBytes);
  for (size_t j = 0; chain && j < active.size(); ++j) {
    const Active& a = active[j];
    const int len = static_cast<int>(requests[a.index].tokens.size());
    chain = len + k_max - 1 <= options_.max_model_len && blocks_.grow_to(a.state->table, len + k_max - 1).ok() &&
            blocks_.prepare_write(a.state->table, len + a.k - 1, len + k_max - 1, copies).ok();
  }

  cache_.copy_blocks(copies);
  std::vector<Active> finished;  // trees whose chain is drafted
  if (chain && !active.empty()) {
    TACHYON_RETURN_IF_ERROR(propose_chain(requests, active, k_max, drafts, finished));
  } else {
    TACHYON_RETURN_IF_ERROR(propose_stepwise(requests, active, drafts, finished));
  }
  // Trees: the chain, then the best side branches the budget leaves room for, likeliest first.
  for (Active& a : finished) {
    const DraftRequest& r = requests[a.index];
    Draft& d = drafts[a.index];
    add_side_branches(d, a.alternatives, static_cast<size_t>(std::max(0, r.max_nodes - static_cast<int>(d.tokens.size()))));
  }
  // What the draft wrote beyond the last run token stays in the table; positions past the tokens
  // it ran are dropped now so that the table never claims positions it holds nothing for.
  // The window then passes what it passes, as in the target's cache (before anything writes the
  // draft cache again), counted from the sequence's own tokens: the drafted ones past them may be
  // rejected, and the next call's queries start no later than where the sequence ends now.
  for (const DraftRequest& r : requests) {
    auto it = states_.find(r.id);
    if (it == states_.end()) continue;
    const int ran = static_cast<int>(it->second.tokens.size());
    blocks_.truncate(it->second.table, ran);
    blocks_.retire(it->second.table, std::min(ran, static_cast<int>(r.tokens.size())));
  }
  cache_.compress_blocks(blocks_.take_compressions());
  return Status::Ok();
}

Status DraftModelProposer::propose_chain(std::span<const DraftRequest> requests, std::vector<Active>& active,
                                         int k_max, std::vector<Draft>& drafts, std::vector<Active>& finished) {
  const Device dev = model_.device();
  const auto n = static_cast<int64_t>(active.size());
  int top = 0;  // tokens of each level's ranking: the chain's, then the side branches'
  for (const Active& a : active) {
    if (a.tree) top = std::max(top, requests[a.index].max_nodes - a.k + 1);
  }
  top = std::min<int>(top, static_cast<int>(ops::kMaxTopTokens));
  const int vocab = model_.config().vocab_size;
  // Sampled chains (not trees: their tokens are the argmax) draw on the device, each level with a
  // uniform from the request's draft stream, in level order as the host would draw them.
  Tensor params;  // [K_max, n, kSampleParams] on the host, or undefined: every row takes the argmax
  for (int64_t j = 0; j < n; ++j) {
    const Active& a = active[static_cast<size_t>(j)];
    const SamplingParams& sp = requests[a.index].sampler->params();
    if (a.tree || sp.greedy()) continue;
    if (!params.defined()) {
      params = Tensor::empty({k_max, n, ops::kSampleParams}, DType::kF32);
      for (int64_t row = 0; row < k_max * n; ++row) {
        fill_greedy_sample_params(params.data<float>() + row * ops::kSampleParams);
      }
    }
    for (int level = 0; level < a.k; ++level) {
      fill_sample_params(params.data<float>() + (level * n + j) * ops::kSampleParams, sp,
                         a.state->rng.next_double());
    }
  }
  struct {
    Tensor ids, logprobs, top_ids, top_probs;  // [K_max, n] and [K_max, n, top] on the device
    Tensor params, probs;                      // sampled: [K_max, n, kSampleParams] and [K_max, n, vocab]
  } all;
  TACHYON_ASSIGN_OR_RETURN(all.ids, empty_on({k_max, n}, DType::kI32, dev, "draft ids"));
  TACHYON_ASSIGN_OR_RETURN(all.logprobs, empty_on({k_max, n}, DType::kF32, dev, "draft logprobs"));
  if (top > 0) {
    TACHYON_ASSIGN_OR_RETURN(all.top_ids, empty_on({k_max, n, top}, DType::kI32, dev, "draft top ids"));
    TACHYON_ASSIGN_OR_RETURN(all.top_probs, empty_on({k_max, n, top}, DType::kF32, dev, "draft top probs"));
  }
  if (params.defined()) {
    TACHYON_ASSIGN_OR_RETURN(all.params, copy_to(params, dev, "draft sampling params"));
    TACHYON_ASSIGN_OR_RETURN(all.probs, empty_on({k_max, n, vocab}, DType::kF32, dev, "draft probabilities"));
  }
  // Each level's choice: the argmax or a draw (and its q), its logprob (-inf: no finite logit),
  // and the ranking of a tree's level.
  const auto pick = [&](const Tensor& logits, int64_t level, Tensor& next) {
    Tensor logprobs = all.logprobs.select(0, level);
    if (all.params.defined()) {
      Tensor probs = all.probs.select(0, level);
      ops::sample(logits, all.params.select(0, level), next, logprobs, &probs);
    } else {
      ops::argmax(logits, next, &logprobs);
    }
    if (top > 0) {
      Tensor top_ids = all.top_ids.select(0, level), top_probs = all.top_probs.select(0, level);
      ops::top_tokens(logits, top_ids, top_probs);
    }
  };
  ForwardOptions fo;
  fo.linear_mode = options_.linear_mode;
  // Level 0: each sequence's tokens the cache has not run yet.
  std::vector<SequenceChunk> chunks;
  for (const Active& a : active) chunks.push_back({&a.state->table, a.start, a.run, LogitsWanted::kLast, {}});
  TACHYON_RETURN_IF_ERROR(model_.forward_on_device(build_forward_batch(chunks), cache_, logits_, fo));
  {
    Tensor first = all.ids.select(0, 0);
    pick(logits_, 0, first);
  }
  // Levels 1 .. K_max - 1: decode steps fed by the level before, on the device.
  if (k_max > 1) {
    static constexpr int32_t kPending = 0;  // the ids come from the level before
    chunks.clear();
    for (const Active& a : active) {
      chunks.push_back({&a.state->table, a.start + static_cast<int>(a.run.size()), std::span<const int32_t>(&kPending, 1),
                        LogitsWanted::kLast, {}});
    }
    Tensor rest = all.ids.slice(0, 1, k_max);
    TACHYON_RETURN_IF_ERROR(model_.decode_steps(build_forward_batch(chunks), all.ids.select(0, 0), cache_, rest,
                                                [&](const Tensor& logits, int64_t step, Tensor& next) {
                                                  pick(logits, step + 1, next);
                                                },
                                                fo));
  }
  const auto to_host = [](const Tensor& t) -> Result<Tensor> {
    if (!t.defined() || t.device().is_cpu()) return t;
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    TACHYON_RETURN_IF_ERROR(copy_into(h, t));  // waits for the device
    return h;
  };
  TACHYON_ASSIGN_OR_RETURN(const Tensor ids, to_host(all.ids));
  TACHYON_ASSIGN_OR_RETURN(const Tensor logprobs, to_host(all.logprobs));
  TACHYON_ASSIGN_OR_RETURN(const Tensor top_ids, to_host(all.top_ids));
  TACHYON_ASSIGN_OR_RETURN(const Tensor top_probs, to_host(all.top_probs));
  TACHYON_ASSIGN_OR_RETURN(const Tensor probs, to_host(all.probs));
  const int64_t q_width = std::max(options_.target_vocab, vocab);  // q has the target's columns
  for (int64_t j = 0; j < n; ++j) {
    Active& a = active[static_cast<size_t>(j)];
    const DraftRequest& r = requests[a.index];
    Draft& d = drafts[a.index];
    for (int level = 0; level < a.k; ++level) {
      const int64_t at = level * n + j;
      if (!std::isfinite(logprobs.data<float>()[at])) break;  // no finite logit: the draft ends here
      const int32_t token = ids.data<int32_t>()[at];
      if (a.tree) {
        const int32_t* t = top_ids.data<int32_t>() + at * top;
        const float* w = top_probs.data<float>() + at * top;
        // t[0] is the argmax; the runners-up follow, best first (unused places: id -1, weight 0).
        const int room = r.max_nodes - a.k;
        for (int i = 1; i <= room && i < top; ++i) {
          if (t[i] >= 0 && w[i] > 0.0f) a.alternatives.push_back({a.path_prob * w[i], level, t[i]});
        }
        a.path_prob *= w[0];
      } else if (!r.sampler->params().greedy()) {
        const float* q = probs.data<float>() + at * vocab;
        d.probs.insert(d.probs.end(), q, q + vocab);
        d.probs.resize(d.probs.size() + static_cast<size_t>(q_width - vocab), 0.0f);
      }
      d.tokens.push_back(token);
    }
    // The tokens the chain ran: those of the sequence not cached before, then the draft's but its last.
    a.state->tokens.insert(a.state->tokens.end(), a.run.begin(), a.run.end());
    const size_t ran = std::min(d.tokens.size(), static_cast<size_t>(a.k - 1));
    a.state->tokens.insert(a.state->tokens.end(), d.tokens.begin(), d.tokens.begin() + static_cast<ptrdiff_t>(ran));
    blocks_.commit(a.state->table, a.state->tokens, static_cast<int>(a.state->tokens.size()));
    if (a.tree) finished.push_back(std::move(a));
  }
  return Status::Ok();
}

Status DraftModelProposer::propose_stepwise(std::span<const DraftRequest> requests, std::vector<Active>& active,
                                            std::vector<Draft>& drafts, std::vector<Active>& finished) {
  const int vocab = model_.config().vocab_size;
  std::vector<float> q, rank;
  std::vector<int32_t> runners_up;
  std::vector<SequenceChunk> chunks;
  ForwardOptions fo;
  fo.linear_mode = options_.linear_mode;
  for (int depth = 0; !active.empty(); ++depth) {
    chunks.clear();
    for (const Active& a : active) {
      SequenceChunk c;
      c.block_table = &a.state->table;
      c.start_position = a.start;
      c.tokens = a.run;
      c.logits = LogitsWanted::kLast;
      chunks.push_back(c);
    }
    const ForwardBatch batch = build_forward_batch(chunks);
    TACHYON_RETURN_IF_ERROR(model_.forward(batch, cache_, host_logits_, fo));
    size_t kept = 0;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      a.state->tokens.insert(a.state->tokens.end(), a.run.begin(), a.run.end());
      blocks_.commit(a.state->table, a.state->tokens, static_cast<int>(a.state->tokens.size()));
      const DraftRequest& r = requests[a.index];
      Draft& d = drafts[a.index];
      const float* row = host_logits_.data<float>() + static_cast<int64_t>(j) * vocab;
      // Drops a (its draft ends here); a tree's side branches are assembled after the loop.
      const auto retire = [&] {
        if (a.tree) finished.push_back(std::move(a));
      };
      if (!r.sampler->probabilities(row, vocab, a.history, q).ok()) {  // no finite logit: stop here
        retire();
        continue;
      }
      int32_t token = 0;
      if (r.sampler->params().greedy() || a.tree) {
        token = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());  // one-hot
        if (a.tree) {
          // Greedy q is one-hot: the runners-up are ranked by the draft's softmax (penalties
          // applied, temperature 1) instead.
          const std::vector<float>* w = &q;
          if (r.sampler->params().greedy()) {
            SamplingParams sp = r.sampler->params();
            sp.temperature = 1.0f;
            sp.top_k = 0;
            sp.top_p = 1.0f;
            sp.min_p = 0.0f;
            sp.seed = 0;  // never drawn from
            if (!Sampler(sp).probabilities(row, vocab, a.history, rank).ok()) {
              retire();
              continue;
            }
            w = &rank;
          }
          const int level = static_cast<int>(d.tokens.size());
          top_tokens(*w, r.max_nodes - a.k, token, runners_up);
          for (int32_t t : runners_up) {
            a.alternatives.push_back({a.path_prob * (*w)[static_cast<size_t>(t)], level, t});
          }
          a.path_prob *= (*w)[static_cast<size_t>(token)];
        }
      } else {
        token = draw(q, a.state->rng.next_double());
        d.probs.insert(d.probs.end(), q.begin(), q.end());
        if (options_.target_vocab > vocab) d.probs.resize(d.probs.size() + (options_.target_vocab - vocab), 0.0f);
      }
      d.tokens.push_back(token);
      a.history.add_output(token);
      if (static_cast<int>(d.tokens.size()) < a.k) {
        a.start += static_cast<int>(a.run.size());
        a.run.assign(1, token);
        if (kept != j) active[kept] = std::move(a);
        ++kept;
      } else {
        retire();
      }
    }
    active.resize(kept);
  }
  return Status::Ok();
}

void DraftModelProposer::release(uint64_t id) {
  auto it = states_.find(id);
  if (it == states_.end()) return;
  blocks_.free(it->second.table);
  states_.erase(it);
}

Status DraftModelProposer::check_no_leaks() const {
  std::vector<const BlockTable*> tables;
  for (const auto& [id, st] : states_) tables.push_back(&st.table);
  TACHYON_RETURN_IF_ERROR(blocks_.check(tables));
  if (states_.empty() && blocks_.num_used() != 0) {
    return make_error(ErrorCode::kInternal, "draft kv cache: {} blocks still used with no request left",
                      blocks_.num_used());
  }
  if (states_.empty() && blocks_.num_history_used() != 0) {
    return make_error(ErrorCode::kInternal, "draft kv cache: {} history blocks still used with no request left",
                      blocks_.num_history_used());
  }
  return Status::Ok();
}

int DraftModelProposer::num_cached_tokens(uint64_t id) const {
  auto it = states_.find(id);
  return it == states_.end() ? -1 : static_cast<int>(it->second.tokens.size());
}

}  // namespace tachyon
