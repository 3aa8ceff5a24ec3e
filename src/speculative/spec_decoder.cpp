#include "speculative/spec_decoder.h"

#include <algorithm>
#include <set>

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
  }
  if (method == SpecMethod::kDraftModel) {
    if (drafts.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "speculative decoding with a draft model: no draft model given");
    }
    std::set<std::string> names;
    for (const NamedDraft& d : drafts) {
      if (d.model == nullptr) {
        return make_error(ErrorCode::kInvalidArgument, "speculative decoding: draft '{}' has no model", d.name);
      }
      if (drafts.size() > 1 && d.name.empty()) {
        return make_error(ErrorCode::kInvalidArgument,
                          "speculative decoding with {} draft models: name each (--draft-model NAME=PATH)",
                          drafts.size());
      }
      if (!names.insert(d.name).second) {
        return make_error(ErrorCode::kInvalidArgument, "speculative decoding: two draft models are named '{}'",
                          d.name);
      }
      const ModelConfig& c = d.model->config();
      // A draft may lack the target's last rows (padding), never have more.
      if (c.vocab_size > target.vocab_size) {
        return make_error(ErrorCode::kInvalidArgument,
                          "the draft model{}'s vocabulary has {} tokens, the target's {}: a draft must share the "
                          "target's tokenizer",
                          d.name.empty() ? "" : " '" + d.name + "'", c.vocab_size, target.vocab_size);
      }
    }
  }
  if (classifier != nullptr && classifier->vocab_size() > target.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the domain classifier is for a vocabulary of {} tokens; the target has {}",
                      classifier->vocab_size(), target.vocab_size);
  }
  return Status::Ok();
}

std::string SpecDecodeOptions::draft_label(size_t i) const {
  return drafts.size() == 1 && drafts[0].name.empty() ? std::string("draft") : "draft:" + drafts[i].name;
}

Result<std::unique_ptr<SpecDecoder>> SpecDecoder::create(const SpecDecodeOptions& options,
                                                         const LlamaModel& target_model,
                                                         const SpecCacheGeometry& geometry) {
  const ModelConfig& target = target_model.config();
  TACHYON_RETURN_IF_ERROR(options.validate(target));
  std::vector<Slot> slots;
  switch (options.method) {
    case SpecMethod::kNone: return std::unique_ptr<SpecDecoder>();
    case SpecMethod::kNgram: slots.push_back({"ngram", "", std::make_unique<NgramLookupProposer>(options.ngram)}); break;
    case SpecMethod::kHeads:
      slots.push_back({"heads", "", std::make_unique<HeadProposer>(target_model, options.heads)});
      break;
    case SpecMethod::kDraftModel:
      for (size_t i = 0; i < options.drafts.size(); ++i) {
        const NamedDraft& d = options.drafts[i];
        DraftModelOptions o;
        o.num_kv_blocks = geometry.num_kv_blocks;
        o.block_size = geometry.block_size;
        o.kv_dtype = geometry.kv_dtype;
        o.max_model_len = std::min(geometry.max_model_len, d.model->config().max_position_embeddings);
        o.linear_mode = geometry.linear_mode;
        o.target_vocab = target.vocab_size;
        o.tiers = geometry.tiers;
        o.num_history_blocks = geometry.num_history_blocks;
        auto proposer = DraftModelProposer::create(*d.model, o);
        if (!proposer.ok()) {
          return d.name.empty() ? proposer.status() : proposer.status().with_context(fmt::format("draft '{}'", d.name));
        }
        slots.push_back({options.draft_label(i), d.name, std::move(proposer).value()});
      }
      break;
  }
  std::string labels;
  for (const Slot& s : slots) labels += (labels.empty() ? "" : ", ") + s.label;
  TACHYON_LOG_INFO("speculative decoding: {} proposer{}, K {}{}{}", labels, slots.size() > 1 ? "s" : "",
                   options.k > 0 ? fmt::format("fixed at {}", options.k) : fmt::format("dynamic, at most {}", options.k_max),
                   options.tree_nodes > 0 ? fmt::format(", trees of up to {} nodes", options.tree_nodes) : "",
                   options.classifier ? fmt::format(", prompt kinds from {}", options.classifier->path()) : "");
  return std::unique_ptr<SpecDecoder>(new SpecDecoder(options, std::move(slots)));
}

SpecDecoder::SpecDecoder(const SpecDecodeOptions& options, std::vector<Slot> proposers)
    : options_(options), proposers_(std::move(proposers)) {
  controller_options_.k_max = options.k_max;
  controller_options_.fixed_k = options.k;
  for (const Slot& s : proposers_) {
    stats_.proposer += (stats_.proposer.empty() ? "" : ",") + s.label;
    stats_.by_proposer[s.label];  // listed from the start
    wants_features_ = wants_features_ || s.proposer->wants_features();
  }
  draft_requests_.resize(proposers_.size());
  draft_seqs_.resize(proposers_.size());
  draft_grammars_.resize(proposers_.size());
}

bool SpecDecoder::has_draft(std::string_view draft) const {
  if (draft.empty()) return true;
  for (const Slot& s : proposers_) {
    if (!s.name.empty() && s.name == draft) return true;
  }
  return false;
}

std::string SpecDecoder::draft_names() const {
  std::string out;
  for (const Slot& s : proposers_) {
    if (!s.name.empty()) out += (out.empty() ? "" : ", ") + s.name;
  }
  return out;
}

uint32_t SpecDecoder::population_key(int proposer, int kind, int prompt_tokens) {
  int length_class = 0;
  for (int n = std::max(prompt_tokens, 1) / 16; n > 0 && length_class < 15; n /= 4) ++length_class;
  return (static_cast<uint32_t>(proposer) << 16) | (static_cast<uint32_t>(kind + 1) << 8) |
         static_cast<uint32_t>(length_class);
}

void SpecDecoder::assign(const SpecCandidate& c, RequestState& st) const {
  const std::span<const int32_t> prompt = c.seq->tokens().first(static_cast<size_t>(c.seq->num_prompt_tokens()));
  if (options_.classifier) st.kind = options_.classifier->classify(prompt);
  st.proposer = 0;
  std::string_view want = c.draft;
  if (want.empty() && st.kind >= 0) want = options_.classifier->kinds()[static_cast<size_t>(st.kind)];
  for (size_t i = 0; i < proposers_.size() && !want.empty(); ++i) {
    if (!proposers_[i].name.empty() && proposers_[i].name == want) {
      st.proposer = static_cast<int>(i);
      break;
    }
  }
}

void SpecDecoder::observe_features(uint64_t id, std::span<const float> hidden) {
  for (Slot& s : proposers_) {
    if (s.proposer->wants_features()) s.proposer->observe_features(id, hidden);
  }
}

Status SpecDecoder::check_no_leaks() const {
  for (const Slot& s : proposers_) TACHYON_RETURN_IF_ERROR(s.proposer->check_no_leaks());
  return Status::Ok();
}

Status SpecDecoder::propose(std::span<const SpecCandidate> candidates, int num_running) {
  Timer timer;
  for (auto& r : draft_requests_) r.clear();
  for (auto& q : draft_seqs_) q.clear();
  for (auto& g : draft_grammars_) g.clear();
  const bool gated = options_.k == 0 && !candidates.empty() && !gate_.allow(num_running);
  if (gated) ++stats_.num_gated_steps;
  for (const SpecCandidate& c : candidates) {
    c.seq->set_draft({});
    if (c.max_draft < 1 || gated) continue;
    auto [it, fresh] = requests_.try_emplace(c.seq->id(), controller_options_);
    RequestState& st = it->second;
    if (fresh) {
      assign(c, st);
      st.population = population_key(st.proposer, st.kind, c.seq->num_prompt_tokens());
      if (options_.population_prior && options_.k == 0) {
        auto p = populations_.find(st.population);
        if (p != populations_.end() && p->second.updates() >= kMinPopulationUpdates) st.controller.seed(p->second);
      }
    }
    const int k = std::min(st.controller.next_k(num_running), c.max_draft);
    if (k < 1) continue;
    DraftRequest r;
    r.id = c.seq->id();
    r.tokens = c.seq->tokens();
    r.k = k;
    // A tree spends the node budget beside the K levels (the controller's K stays its depth).
    if (options_.tree_nodes > 0) r.max_nodes = std::max(k, std::min(options_.tree_nodes, c.max_draft));
    r.sampler = c.sampler;
    draft_requests_[static_cast<size_t>(st.proposer)].push_back(r);
    draft_seqs_[static_cast<size_t>(st.proposer)].push_back(c.seq);
    draft_grammars_[static_cast<size_t>(st.proposer)].push_back(c.grammar);
  }
  for (size_t p = 0; p < proposers_.size(); ++p) {
    if (draft_requests_[p].empty()) continue;
    Timer proposer_timer;
    Proposer& proposer = *proposers_[p].proposer;
    TACHYON_RETURN_IF_ERROR(proposer.propose(draft_requests_[p], drafts_));
    TACHYON_CHECK(drafts_.size() == draft_requests_[p].size(), "{} proposer: {} drafts for {} requests",
                  proposer.name(), drafts_.size(), draft_requests_[p].size());
    for (size_t i = 0; i < drafts_.size(); ++i) {
      Draft& d = drafts_[i];
      if (GrammarMatcher* grammar = draft_grammars_[p][i]; grammar != nullptr) trim_to_grammar(d, *grammar);
      if (d.tokens.empty()) continue;
      Sequence* seq = draft_seqs_[p][i];
      RequestState& st = requests_.at(seq->id());
      const DraftRequest& r = draft_requests_[p][i];
      if (!d.parents.empty()) {
        TACHYON_CHECK(r.max_nodes > 0 && d.parents.size() == d.tokens.size() &&
                          d.tokens.size() <= static_cast<size_t>(r.max_nodes) && d.probs.empty(),
                      "{} proposer: a tree of {} nodes ({} parents) for a budget of {}", proposer.name(),
                      d.tokens.size(), d.parents.size(), r.max_nodes);
        // Its depth is what the controller weighs.
        std::vector<int> depth(d.parents.size());
        st.depth = 0;
        for (size_t j = 0; j < d.parents.size(); ++j) {
          const int32_t parent = d.parents[j];
          TACHYON_CHECK(parent >= -1 && parent < static_cast<int32_t>(j), "{} proposer: node {} has parent {}",
                        proposer.name(), j, parent);
          depth[j] = parent < 0 ? 1 : depth[static_cast<size_t>(parent)] + 1;
          st.depth = std::max(st.depth, depth[j]);
        }
      } else {
        TACHYON_CHECK(d.tokens.size() <= static_cast<size_t>(r.k), "{} proposer: {} tokens for K {}", proposer.name(),
                      d.tokens.size(), r.k);
        st.depth = static_cast<int>(d.tokens.size());
      }
      st.draft_probs = std::move(d.probs);
      seq->set_draft(std::move(d.tokens), std::move(d.parents));
    }
    stats_.by_proposer[proposers_[p].label].propose_seconds += proposer_timer.seconds();
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
  if (options_.population_prior && options_.k == 0) {
    DraftLengthOptions population = controller_options_;
    population.ema_weight = 0.05;
    populations_.try_emplace(st.population, population).first->second.update(std::max(st.depth, 1), v.num_accepted);
  }
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
  // By position (a tree's: by level): positions up to the draft's depth were proposed, the first
  // num_accepted were accepted.
  const size_t depth = static_cast<size_t>(std::max(st.depth, 0));
  if (stats_.proposed_by_position.size() < depth) {
    stats_.proposed_by_position.resize(depth, 0);
    stats_.accepted_by_position.resize(depth, 0);
  }
  for (size_t d = 0; d < depth; ++d) {
    ++stats_.proposed_by_position[d];
    if (static_cast<int>(d) < v.num_accepted) ++stats_.accepted_by_position[d];
  }
  const auto count = [&](SpecCounts& c) {
    ++c.num_verify_steps;
    c.num_proposed += proposed;
    c.num_accepted += v.num_accepted;
    c.num_emitted += static_cast<int64_t>(v.tokens.size());
  };
  count(stats_.by_proposer[proposers_[static_cast<size_t>(st.proposer)].label]);
  if (st.kind >= 0) count(stats_.by_kind[options_.classifier->kinds()[static_cast<size_t>(st.kind)]]);
}

void SpecDecoder::record_step(int num_running, bool speculated, int64_t tokens, double seconds) {
  if (options_.k == 0) gate_.record(num_running, speculated, tokens, seconds);
}

void SpecDecoder::release(uint64_t id) {
  requests_.erase(id);
  for (Slot& s : proposers_) s.proposer->release(id);
}

}  // namespace tachyon
