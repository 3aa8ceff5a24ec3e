#include "speculative/head_proposer.h"

#include <algorithm>

#include "core/device_memory.h"
#include "ops/errors.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

Weight constant_weight(const Tensor& t) {
  Weight w;
  w.dense = t;
  w.constant = true;
  return w;
}

}  // namespace

HeadProposer::HeadProposer(const LlamaModel& target, std::shared_ptr<const SpecHeads> heads)
    : target_(target), heads_(std::move(heads)) {
  for (const SpecHead& h : heads_->heads) {
    x_proj_.push_back(constant_weight(h.x_proj));
    e_proj_.push_back(constant_weight(h.e_proj));
    down_proj_.push_back(constant_weight(h.down_proj));
  }
}

void HeadProposer::observe_features(uint64_t id, std::span<const float> hidden) {
  if (hidden.size() != static_cast<size_t>(heads_->hidden_size)) return;
  features_[id].assign(hidden.begin(), hidden.end());
}

Status HeadProposer::check_no_leaks() const {
  if (!features_.empty()) {
    return make_error(ErrorCode::kInternal, "head proposer: {} sequences' features kept after release",
                      features_.size());
  }
  return Status::Ok();
}

Status HeadProposer::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft{});
  const int64_t d = heads_->hidden_size, m = heads_->ffn_size;
  const int num_heads = static_cast<int>(heads_->heads.size());
  // The sequences with a feature row, the most positions any of them drafts, and the runners-up
  // a tree may take per level (its budget beside the chain).
  std::vector<size_t> active;
  int depth = 0, top = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    if (r.k < 1 || !features_.count(r.id) || r.tokens.empty()) continue;
    active.push_back(i);
    const int k = std::min(r.k, num_heads);
    depth = std::max(depth, k);
    if (r.max_nodes > k) top = std::max(top, static_cast<int>(std::min<int64_t>(r.max_nodes - k + 1, ops::kMaxTopTokens)));
  }
  if (active.empty()) return Status::Ok();
  const int64_t b = static_cast<int64_t>(active.size());
  Tensor x_host = Tensor::empty({b, d}, DType::kF32);
  Tensor t0_host = Tensor::empty({b}, DType::kI32);
  for (int64_t j = 0; j < b; ++j) {
    const DraftRequest& r = requests[active[static_cast<size_t>(j)]];
    const std::vector<float>& f = features_.at(r.id);
    std::copy(f.begin(), f.end(), x_host.data<float>() + j * d);
    t0_host.data<int32_t>()[j] = r.tokens.back();
  }
  const Device dev = target_.device();
  const int64_t vocab = target_.config().vocab_size;
  TACHYON_ASSIGN_OR_RETURN(Tensor x, copy_to(x_host, dev, "head features"));
  TACHYON_ASSIGN_OR_RETURN(Tensor t0, copy_to(t0_host, dev, "head tokens"));
  TACHYON_ASSIGN_OR_RETURN(Tensor ids, empty_on({depth, b}, DType::kI32, dev, "head drafts"));
  TACHYON_ASSIGN_OR_RETURN(Tensor normed, empty_on({b, d}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor emb, empty_on({b, d}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor gu, empty_on({b, 2 * m}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor gu_e, empty_on({b, 2 * m}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor act, empty_on({b, m}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor delta, empty_on({b, d}, DType::kF32, dev, "head scratch"));
  TACHYON_ASSIGN_OR_RETURN(Tensor logits, empty_on({b, vocab}, DType::kF32, dev, "head logits"));
  Tensor top_ids, top_probs;  // [depth, b, top]: each level's likeliest tokens under the head's softmax
  if (top > 0) {
    TACHYON_ASSIGN_OR_RETURN(top_ids, empty_on({depth, b, top}, DType::kI32, dev, "head runners-up"));
    TACHYON_ASSIGN_OR_RETURN(top_probs, empty_on({depth, b, top}, DType::kF32, dev, "head runners-up"));
  }
  const ModelWeights& tw = target_.weights();
  const float eps = heads_->rms_norm_eps;
  for (int i = 0; i < depth; ++i) {
    const SpecHead& h = heads_->heads[static_cast<size_t>(i)];
    const Tensor prev = i == 0 ? t0 : ids.select(0, i - 1);
    ops::rms_norm(x, h.in_norm, eps, normed);
    ops::embedding(tw.embed_tokens, prev, emb);
    ops::linear(normed, x_proj_[static_cast<size_t>(i)], nullptr, gu);
    ops::linear(emb, e_proj_[static_cast<size_t>(i)], nullptr, gu_e);
    ops::add(gu, gu_e);
    ops::silu_mul(gu.slice(1, 0, m), gu.slice(1, m, 2 * m), act);
    ops::linear(act, down_proj_[static_cast<size_t>(i)], nullptr, delta);
    ops::add(x, delta);
    ops::rms_norm(x, h.out_norm, eps, normed);
    ops::linear(normed, tw.lm_head, nullptr, logits);
    Tensor next = ids.select(0, i);
    ops::argmax(logits, next);
    if (top > 0) {
      Tensor level_ids = top_ids.select(0, i), level_probs = top_probs.select(0, i);
      ops::top_tokens(logits, level_ids, level_probs);
    }
  }
  TACHYON_RETURN_IF_ERROR(ops::take_error(dev));
  TACHYON_ASSIGN_OR_RETURN(Tensor host_ids, copy_to(ids, Device::cpu(), "head drafts"));
  Tensor host_top_ids, host_top_probs;
  if (top > 0) {
    TACHYON_ASSIGN_OR_RETURN(host_top_ids, copy_to(top_ids, Device::cpu(), "head runners-up"));
    TACHYON_ASSIGN_OR_RETURN(host_top_probs, copy_to(top_probs, Device::cpu(), "head runners-up"));
  }
  TACHYON_RETURN_IF_ERROR(ops::synchronize(dev));
  std::vector<SideBranch> alternatives;
  for (int64_t j = 0; j < b; ++j) {
    const DraftRequest& r = requests[active[static_cast<size_t>(j)]];
    Draft& draft = drafts[active[static_cast<size_t>(j)]];
    const int k = std::min(r.k, num_heads);
    for (int i = 0; i < k; ++i) draft.tokens.push_back(host_ids.data<int32_t>()[i * b + j]);
    if (r.max_nodes <= k || top == 0) continue;
    // A tree: the chain of each head's likeliest token, then the levels' runners-up as side
    // branches (children of the chain's node one level up), likeliest path first, as many as the
    // budget leaves room for. Each head ranks its level given the chain before it.
    alternatives.clear();
    double path = 1.0;
    for (int i = 0; i < k; ++i) {
      const int64_t at = (static_cast<int64_t>(i) * b + j) * top;
      const int32_t* t = host_top_ids.data<int32_t>() + at;
      const float* w = host_top_probs.data<float>() + at;
      for (int c = 1; c < top && c <= r.max_nodes - k; ++c) {
        if (t[c] >= 0 && w[c] > 0.0f) alternatives.push_back({path * w[c], i, t[c]});
      }
      path *= w[0];
    }
    add_side_branches(draft, alternatives, static_cast<size_t>(r.max_nodes - k));
  }
  return Status::Ok();
}

}  // namespace tachyon
