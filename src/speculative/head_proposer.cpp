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
  // The sequences with a feature row, and the most positions any of them drafts.
  std::vector<size_t> active;
  int depth = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].k < 1 || !features_.count(requests[i].id) || requests[i].tokens.empty()) continue;
    active.push_back(i);
    depth = std::max(depth, std::min(requests[i].k, num_heads));
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
  }
  TACHYON_RETURN_IF_ERROR(ops::take_error(dev));
  TACHYON_ASSIGN_OR_RETURN(Tensor host_ids, copy_to(ids, Device::cpu(), "head drafts"));
  TACHYON_RETURN_IF_ERROR(ops::synchronize(dev));
  for (int64_t j = 0; j < b; ++j) {
    const DraftRequest& r = requests[active[static_cast<size_t>(j)]];
    Draft& draft = drafts[active[static_cast<size_t>(j)]];
    const int k = std::min(r.k, num_heads);
    for (int i = 0; i < k; ++i) draft.tokens.push_back(host_ids.data<int32_t>()[i * b + j]);
  }
  return Status::Ok();
}

}  // namespace tachyon
