#include "spec/draft_model_proposer.h"

#include <algorithm>

#include "model/forward_batch.h"

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

// A tree's side branch: a token the draft ranked below its choice at one level.
struct Alternative {
  double score;   // the draft's probability of the path to it
  int level;      // its parent is the chain's node level - 1 (-1: the sequence's last token)
  int32_t token;
};

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
      blocks_(BlockManagerOptions{options.num_kv_blocks, options.block_size, true}) {}

Status DraftModelProposer::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft{});
  const int vocab = model_.config().vocab_size;

  // Per active request: its state, its hypothetical history (penalties see the drafts so far) and
  // the chunk it runs next.
  struct Active {
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
    std::vector<Alternative> alternatives{};
  };
  std::vector<Active> active;
  active.reserve(requests.size());
  std::vector<BlockCopy> copies;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    const int len = static_cast<int>(r.tokens.size());
    // The draft writes positions up to len + k - 2 (the last draft token is never run).
    const int k = std::min(r.k, options_.max_model_len - len + 1);
    if (k < 1 || len < 1 || r.sampler == nullptr) continue;
    State& st = states_.try_emplace(r.id, options_.block_size, r.sampler->seed() ^ kDraftSeedSalt).first->second;
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
    active.push_back(std::move(a));
  }

  cache_.copy_blocks(copies);
  std::vector<Active> finished;  // trees whose chain is drafted
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
    TACHYON_RETURN_IF_ERROR(model_.forward(batch, cache_, logits_, fo));
    size_t kept = 0;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      a.state->tokens.insert(a.state->tokens.end(), a.run.begin(), a.run.end());
      blocks_.commit(a.state->table, a.state->tokens, static_cast<int>(a.state->tokens.size()));
      const DraftRequest& r = requests[a.index];
      Draft& d = drafts[a.index];
      const float* row = logits_.data<float>() + static_cast<int64_t>(j) * vocab;
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
  // Trees: the chain, then the best side branches the budget leaves room for, likeliest first.
  for (Active& a : finished) {
    const DraftRequest& r = requests[a.index];
    Draft& d = drafts[a.index];
    const int chain = static_cast<int>(d.tokens.size());
    std::erase_if(a.alternatives, [&](const Alternative& alt) { return alt.level >= chain; });
    const size_t room = static_cast<size_t>(std::max(0, r.max_nodes - chain));
    if (chain == 0 || room == 0 || a.alternatives.empty()) continue;
    const size_t n = std::min(room, a.alternatives.size());
    std::partial_sort(a.alternatives.begin(), a.alternatives.begin() + static_cast<ptrdiff_t>(n), a.alternatives.end(),
                      [](const Alternative& x, const Alternative& y) {
                        return x.score != y.score ? x.score > y.score
                                                  : (x.level != y.level ? x.level < y.level : x.token < y.token);
                      });
    d.parents.resize(static_cast<size_t>(chain));
    for (int i = 0; i < chain; ++i) d.parents[static_cast<size_t>(i)] = i - 1;
    for (size_t i = 0; i < n; ++i) {
      d.tokens.push_back(a.alternatives[i].token);
      d.parents.push_back(a.alternatives[i].level - 1);
    }
  }
  // What the draft wrote beyond the last run token stays in the table; positions past the tokens
  // it ran are dropped now so that the table never claims positions it holds nothing for.
  for (const DraftRequest& r : requests) {
    auto it = states_.find(r.id);
    if (it != states_.end()) blocks_.truncate(it->second.table, static_cast<int>(it->second.tokens.size()));
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
  return Status::Ok();
}

int DraftModelProposer::num_cached_tokens(uint64_t id) const {
  auto it = states_.find(id);
  return it == states_.end() ? -1 : static_cast<int>(it->second.tokens.size());
}

}  // namespace tachyon
