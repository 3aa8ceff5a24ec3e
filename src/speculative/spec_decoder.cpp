#include "speculative/spec_decoder.h"

#include <algorithm>

#include "core/log.h"
#include "core/timer.h"
#include "speculative/draft_model_proposer.h"
#include "speculative/head_proposer.h"
#include "speculative/ngram_lookup_proposer.h"

namespace tachyon {

const char* spec_method_name(SpecMethod method) {
  switch (method) {
    case SpecMethod::kNone: return "none";
    case SpecMethod::kNgram: return "ngram";
    case SpecMethod::kDraftModel: return "draft";
    case SpecMethod::kHeads: return "heads";
  }
  return "?";
}

Status SpecDecodeOptions::validate(const ModelConfig& target) const {
  if (method == SpecMethod::kNone) return Status::Ok();
  if (k_max < 1 || k_max > kLargestK) {
    return make_error(ErrorCode::kInvalidArgument, "speculative decoding: --spec-k-max {} must be in [1, {}]", k_max,
                      kLargestK);
  }
  if (k < 0 || k > k_max) {
    return make_error(ErrorCode::kInvalidArgument,
                      "speculative decoding: --spec-k {} must be in [1, --spec-k-max = {}] (or unset: dynamic)", k,
                      k_max);
  }
  if (tree_nodes < 0 || tree_nodes >= kMaxTreeTokens) {
    return make_error(ErrorCode::kInvalidArgument, "speculative decoding: --spec-tree {} must be in [0, {}]",
                      tree_nodes, kMaxTreeTokens - 1);
  }
  if (tree_nodes > 0 && target.sliding_window > 0) {
    return make_error(ErrorCode::kUnsupported,
                      "speculative decoding: token trees (--spec-tree) need full attention; the model has a sliding "
                      "window of {}",
                      target.sliding_window);
  }
  if (method == SpecMethod::kHeads) {
    if (heads == nullptr || heads->heads.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "speculative decoding with heads: no heads given");
    }
    if (heads->hidden_size != target.hidden_size || heads->vocab_size != target.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the heads were made for a target of hidden size {} and {} tokens; this target has {} and {}",
                        heads->hidden_size, heads->vocab_size, target.hidden_size, target.vocab_size);
    }
    if (tree_nodes > 0) {
      return make_error(ErrorCode::kUnsupported, "speculative decoding with heads drafts chains; --spec-tree is not "
                                                 "supported with --spec-heads");
    }
  }
  if (method == SpecMethod::kDraftModel) {
    if (draft_model == nullptr) {
      return make_error(ErrorCode::kInvalidArgument, "speculative decoding with a draft model: no draft model given");
    }
    const ModelConfig& d = draft_model->config();
    // A draft may lack the target's last rows (padding), never have more.
    if (d.vocab_size > target.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the draft model's vocabulary has {} tokens, the target's {}: a draft must share the "
                        "target's tokenizer",
                        d.vocab_size, target.vocab_size);
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<SpecDecoder>> SpecDecoder::create(const SpecDecodeOptions& options,
                                                         const LlamaModel& target_model,
                                                         const SpecCacheGeometry& geometry) {
  const ModelConfig& target = target_model.config();
  TACHYON_RETURN_IF_ERROR(options.validate(target));
  std::unique_ptr<Proposer> proposer;
  switch (options.method) {
    case SpecMethod::kNone: return std::unique_ptr<SpecDecoder>();
    case SpecMethod::kNgram: proposer = std::make_unique<NgramLookupProposer>(options.ngram); break;
    case SpecMethod::kHeads: proposer = std::make_unique<HeadProposer>(target_model, options.heads); break;
    case SpecMethod::kDraftModel: {
      DraftModelOptions o;
      o.num_kv_blocks = geometry.num_kv_blocks;
      o.block_size = geometry.block_size;
      o.kv_dtype = geometry.kv_dtype;
      o.max_model_len = std::min(geometry.max_model_len, options.draft_model->config().max_position_embeddings);
      o.linear_mode = geometry.linear_mode;
      o.target_vocab = target.vocab_size;
      TACHYON_ASSIGN_OR_RETURN(proposer, DraftModelProposer::create(*options.draft_model, o));
      break;
    }
  }
  TACHYON_LOG_INFO("speculative decoding: {} proposer, K {}{}", proposer->name(),
                   options.k > 0 ? fmt::format("fixed at {}", options.k) : fmt::format("dynamic, at most {}", options.k_max),
                   options.tree_nodes > 0 ? fmt::format(", trees of up to {} nodes", options.tree_nodes) : "");
  return std::unique_ptr<SpecDecoder>(new SpecDecoder(options, std::move(proposer)));
}

SpecDecoder::SpecDecoder(const SpecDecodeOptions& options, std::unique_ptr<Proposer> proposer)
    : options_(options), proposer_(std::move(proposer)) {
  controller_options_.k_max = options.k_max;
  controller_options_.fixed_k = options.k;
  stats_.proposer = proposer_->name();
}

Status SpecDecoder::propose(std::span<const SpecCandidate> candidates, int num_running) {
  Timer timer;
  draft_requests_.clear();
  draft_seqs_.clear();
  const bool gated = options_.k == 0 && !candidates.empty() && !gate_.allow(num_running);
  if (gated) ++stats_.num_gated_steps;
  for (const SpecCandidate& c : candidates) {
    c.seq->set_draft({});
    if (c.max_draft < 1 || gated) continue;
    RequestState& st = requests_.try_emplace(c.seq->id(), controller_options_).first->second;
    const int k = std::min(st.controller.next_k(num_running), c.max_draft);
    if (k < 1) continue;
    DraftRequest r;
    r.id = c.seq->id();
    r.tokens = c.seq->tokens();
    r.k = k;
    // A tree spends the node budget beside the K levels (the controller's K stays its depth).
    if (options_.tree_nodes > 0) r.max_nodes = std::max(k, std::min(options_.tree_nodes, c.max_draft));
    r.sampler = c.sampler;
    draft_requests_.push_back(r);
    draft_seqs_.push_back(c.seq);
  }
  if (!draft_requests_.empty()) {
    TACHYON_RETURN_IF_ERROR(proposer_->propose(draft_requests_, drafts_));
    for (size_t i = 0; i < drafts_.size(); ++i) {
      Draft& d = drafts_[i];
      if (d.tokens.empty()) continue;
      RequestState& st = requests_.at(draft_seqs_[i]->id());
      const DraftRequest& r = draft_requests_[i];
      if (!d.parents.empty()) {
        TACHYON_CHECK(r.max_nodes > 0 && d.parents.size() == d.tokens.size() &&
                          d.tokens.size() <= static_cast<size_t>(r.max_nodes) && d.probs.empty(),
                      "{} proposer: a tree of {} nodes ({} parents) for a budget of {}", proposer_->name(),
                      d.tokens.size(), d.parents.size(), r.max_nodes);
        // Its depth is what the controller weighs.
        std::vector<int> depth(d.parents.size());
        st.depth = 0;
        for (size_t j = 0; j < d.parents.size(); ++j) {
          const int32_t parent = d.parents[j];
          TACHYON_CHECK(parent >= -1 && parent < static_cast<int32_t>(j), "{} proposer: node {} has parent {}",
                        proposer_->name(), j, parent);
          depth[j] = parent < 0 ? 1 : depth[static_cast<size_t>(parent)] + 1;
          st.depth = std::max(st.depth, depth[j]);
        }
      } else {
        TACHYON_CHECK(d.tokens.size() <= static_cast<size_t>(r.k), "{} proposer: {} tokens for K {}",
                      proposer_->name(), d.tokens.size(), r.k);
        st.depth = static_cast<int>(d.tokens.size());
      }
      st.draft_probs = std::move(d.probs);
      draft_seqs_[i]->set_draft(std::move(d.tokens), std::move(d.parents));
    }
  }
  stats_.propose_seconds += timer.seconds();
  return Status::Ok();
}

Result<Verification> SpecDecoder::verify(const Sequence& seq, const float* logits, int vocab, Sampler& sampler) {
  RequestState& st = requests_.at(seq.id());
  const std::span<const int32_t> draft = seq.draft();
  const bool with_q = !st.draft_probs.empty() && st.draft_probs.size() == draft.size() * static_cast<size_t>(vocab);
  Result<Verification> verified =
      seq.draft_parents().empty()
          ? verify_draft(draft, with_q ? st.draft_probs.data() : nullptr, logits, vocab, sampler)
          : verify_draft_tree(draft, seq.draft_parents(), logits, vocab, sampler);
  TACHYON_RETURN_IF_ERROR(verified.status());
  Verification v = std::move(verified).value();
  st.draft_probs.clear();
  record(seq, st, v);
  return v;
}

Result<Verification> SpecDecoder::verify_greedy(const Sequence& seq, std::span<const int32_t> ids,
                                                std::span<const float> logprobs) {
  RequestState& st = requests_.at(seq.id());
  TACHYON_ASSIGN_OR_RETURN(Verification v, verify_greedy_rows(seq.draft(), seq.draft_parents(), ids, logprobs));
  st.draft_probs.clear();
  record(seq, st, v);
  return v;
}

void SpecDecoder::record(const Sequence& seq, RequestState& st, const Verification& v) {
  const int proposed = static_cast<int>(seq.draft().size());
  // The controller sets K, the depth: it learns from how much of the depth was accepted.
  st.controller.update(std::max(st.depth, 1), v.num_accepted);
  ++stats_.num_verify_steps;
  if (!seq.draft_parents().empty()) {
    ++stats_.num_tree_steps;
    for (size_t d = 0; d < v.path.size(); ++d) {
      if (v.path[d] != static_cast<int32_t>(d)) {
        ++stats_.num_off_first_branch;
        break;
      }
    }
  }
  stats_.num_proposed += proposed;
  stats_.num_accepted += v.num_accepted;
  stats_.num_emitted += static_cast<int64_t>(v.tokens.size());
}

void SpecDecoder::record_step(int num_running, bool speculated, int64_t tokens, double seconds) {
  if (options_.k == 0) gate_.record(num_running, speculated, tokens, seconds);
}

void SpecDecoder::release(uint64_t id) {
  requests_.erase(id);
  proposer_->release(id);
}

}  // namespace tachyon
