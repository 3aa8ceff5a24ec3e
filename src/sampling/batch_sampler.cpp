#include "sampling/batch_sampler.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <unordered_map>

#include "core/device_memory.h"
#include "core/timer.h"
#include "ops/errors.h"
#include "ops/ops.h"
#include "sampling/sample_params.h"

namespace tachyon {
namespace {

// Greedy with nothing that edits the logits before the argmax.
bool plain_greedy(const SamplingParams& p) {
  return p.greedy() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.logit_bias.empty();
}

int64_t count_rows(std::span<const SampleRow> rows) {
  int64_t n = 0;
  for (const SampleRow& r : rows) n += r.num_rows();
  return n;
}

// The grammar masks of one entry's sampled rows (1 + num_draft, the first logits row `first_row`)
// into `out` ([1 + num_draft, columns] in ops::mask_logits' layout). The matcher ends where it
// started. A row the verifier never reads (after a draft token the grammar refuses) allows every
// token; so do all rows when the first has no token at all, whose error is returned.
Status fill_row_masks(const SampleRow& row, int64_t first_row, int32_t* out, int64_t columns) {
  GrammarMatcher& g = *row.grammar;
  const auto mask_of = [&](int i) {
    int32_t* p = out + static_cast<int64_t>(i) * columns;
    p[0] = static_cast<int32_t>(first_row + i);
    return std::span<uint32_t>(reinterpret_cast<uint32_t*>(p + 1), static_cast<size_t>(columns - 1));
  };
  const auto allow_all = [&](int i) {
    const std::span<uint32_t> m = mask_of(i);
    std::fill(m.begin(), m.end(), ~0u);
  };
  if (Status first = g.fill_mask(mask_of(0)); !first.ok()) {
    for (int i = 0; i <= row.num_draft; ++i) allow_all(i);
    return first;
  }
  if (row.num_draft == 0) return Status::Ok();
  if (row.draft_parents.empty()) {  // a chain: row i after the first i tokens
    int accepted = 0;
    bool alive = true;
    for (int i = 1; i <= row.num_draft; ++i) {
      alive = alive && g.accept(row.draft[static_cast<size_t>(i - 1)]).ok();
      if (alive) ++accepted;
      if (!(alive && g.fill_mask(mask_of(i)).ok())) {
        alive = false;
        allow_all(i);
      }
    }
    return g.rollback(accepted);
  }
  // A tree: node i's row (1 + i) after the tokens of its path from the root.
  std::vector<int32_t> path;
  for (int i = 0; i < row.num_draft; ++i) {
    path.clear();
    for (int32_t n = i; n >= 0; n = row.draft_parents[static_cast<size_t>(n)]) {
      path.push_back(row.draft[static_cast<size_t>(n)]);
    }
    int accepted = 0;
    for (auto t = path.rbegin(); t != path.rend() && g.accept(*t).ok(); ++t) ++accepted;
    if (accepted != static_cast<int>(path.size()) || !g.fill_mask(mask_of(1 + i)).ok()) allow_all(1 + i);
    TACHYON_RETURN_IF_ERROR(g.rollback(accepted));
  }
  return Status::Ok();
}

}  // namespace

BatchSampler::Place BatchSampler::place_for(std::span<const SampleRow> rows) const {
  if (device_.is_cpu() || rows.empty()) return Place::kHost;
  // Logit edits carry token ids as f32: exact below 2^24.
  if (vocab_size_ >= (1 << 24)) return Place::kHost;
  bool all_greedy = true;
  for (const SampleRow& r : rows) {
    const SamplingParams& p = r.sampler->params();
    if (p.logprobs > 0 || r.num_read_only > 0 || !r.sample || !r.banned.empty()) return Place::kHost;
    const bool greedy = plain_greedy(p);
    if (r.num_draft > 0 && !greedy) return Place::kHost;
    all_greedy = all_greedy && greedy;
  }
  return all_greedy ? Place::kDeviceGreedy : Place::kDeviceSample;
}

Result<BatchSampler::Place> BatchSampler::begin(std::span<const SampleRow> rows) {
  place_ = place_for(rows);
  num_rows_ = count_rows(rows);
  host_samples_.clear();
  host_edits_.clear();
  row_status_.assign(rows.size(), Status::Ok());
  if (place_ == Place::kHost) return place_;
  if (!device_ids_.defined() || device_ids_.size(0) != num_rows_) {
    TACHYON_ASSIGN_OR_RETURN(device_ids_, empty_on({num_rows_}, DType::kI32, device_, "sampled ids"));
    TACHYON_ASSIGN_OR_RETURN(device_logprobs_, empty_on({num_rows_}, DType::kF32, device_, "sampled logprobs"));
    TACHYON_ASSIGN_OR_RETURN(device_params_,
                             empty_on({num_rows_, ops::kSampleParams}, DType::kF32, device_, "sampling params"));
    host_ids_ = Tensor::empty({num_rows_}, DType::kI32);
    host_logprobs_ = Tensor::empty({num_rows_}, DType::kF32);
    host_params_ = Tensor::empty({num_rows_, ops::kSampleParams}, DType::kF32);
  }
  if (place_ == Place::kDeviceSample) TACHYON_RETURN_IF_ERROR(stage_device_sample(rows));
  return place_;
}

Status BatchSampler::stage_device_sample(std::span<const SampleRow> rows) {
  int r = 0;
  for (const SampleRow& row : rows) {
    if (row.num_draft > 0) {  // a plain greedy draft's rows: T = 0, nothing else
      for (int i = 0; i < row.num_rows(); ++i, ++r) fill_greedy_sample_params(host_params_.data<float>() + ops::kSampleParams * r);
      continue;
    }
    const SamplingParams& sp = row.sampler->params();
    const double u = sp.greedy() ? 0.0 : row.sampler->rng().next_double();
    fill_sample_params(host_params_.data<float>() + ops::kSampleParams * r, sp, u);
    add_logit_edits(*row.sampler, r);
    ++r;
  }
  TACHYON_RETURN_IF_ERROR(copy_into(device_params_, host_params_));
  const int64_t m = static_cast<int64_t>(host_edits_.size()) / ops::kLogitEditColumns;
  if (m == 0) return Status::Ok();
  if (!device_edits_.defined() || device_edits_.size(0) < m) {
    const int64_t capacity = std::max<int64_t>(1024, std::bit_ceil(static_cast<uint64_t>(m)));
    TACHYON_ASSIGN_OR_RETURN(device_edits_,
                             empty_on({capacity, ops::kLogitEditColumns}, DType::kF32, device_, "logit edits"));
  }
  Tensor staged = Tensor::empty({m, ops::kLogitEditColumns}, DType::kF32);
  std::copy(host_edits_.begin(), host_edits_.end(), staged.data<float>());
  Tensor dst = device_edits_.slice(0, 0, m);
  return copy_into(dst, staged);
}

void BatchSampler::add_logit_edits(const Sampler& sampler, int row) {
  const SamplingParams& sp = sampler.params();
  const bool repetition = sp.repetition_penalty != 1.0f;
  const bool additive = sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f;
  if (sp.logit_bias.empty() && !repetition && !additive) return;
  // One edit per token: the bias (summed over repeated entries), then the Sampler's penalties
  // (sampling/sampler.h, steps 1-2) with their neutral values where a token has none. The history
  // holds each token once; biased tokens are few, so only they go through a map.
  std::unordered_map<int32_t, float> bias;
  for (const auto& [token, b] : sp.logit_bias) bias[token] += b;
  const auto push = [&](int32_t token, float b, float rep, float sub) {
    host_edits_.insert(host_edits_.end(), {static_cast<float>(row), static_cast<float>(token), b, rep, sub});
  };
  if (repetition || additive) {
    for (const auto& [token, entry] : sampler.history().entries()) {
      float b = 0.0f;
      if (!bias.empty()) {
        if (auto it = bias.find(token); it != bias.end()) {
          b = it->second;
          bias.erase(it);
        }
      }
      const float rep = repetition && (entry.in_prompt || entry.output_count > 0) ? sp.repetition_penalty : 1.0f;
      const float sub = additive && entry.output_count > 0
                            ? sp.frequency_penalty * static_cast<float>(entry.output_count) + sp.presence_penalty
                            : 0.0f;
      push(token, b, rep, sub);
    }
  }
  for (const auto& [token, b] : bias) push(token, b, 1.0f, 0.0f);
}

int64_t BatchSampler::fill_masks(std::span<const SampleRow> rows) {
  struct Job {
    size_t entry;
    int64_t row;   // its first sampled logits row
    int64_t mask;  // its first mask
  };
  std::vector<Job> jobs;
  int64_t r = 0, m = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].grammar != nullptr && rows[i].sample) {
      jobs.push_back({i, r + rows[i].num_read_only, m});
      m += 1 + rows[i].num_draft;
    }
    r += rows[i].num_rows();
  }
  if (m == 0) return 0;
  Timer timer;
  const int64_t columns = ops::token_mask_columns(vocab_size_);
  if (!host_masks_.defined() || host_masks_.size(0) < m) {
    host_masks_ = Tensor::empty({static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(m))), columns}, DType::kI32);
  }
  int32_t* masks = host_masks_.data<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    row_status_[job.entry] = fill_row_masks(rows[job.entry], job.row, masks + job.mask * columns, columns);
  }
  mask_seconds_ += timer.seconds();
  ++mask_steps_;
  masked_rows_ += m;
  return m;
}

Status BatchSampler::finish(std::span<const SampleRow> rows) {
  const Tensor& out = logits();
  if (out.size(0) != num_rows_) {
    return make_error(ErrorCode::kInternal, "batch sampler: {} logits rows for {} sampled rows", out.size(0), num_rows_);
  }
  // On the device this runs while the forward does.
  const int64_t num_masks = fill_masks(rows);
  if (place_ == Place::kHost) {
    if (num_masks > 0) ops::mask_logits(host_logits_, host_masks_.slice(0, 0, num_masks));
    host_samples_.assign(rows.size(), std::nullopt);
    std::vector<std::pair<size_t, int64_t>> jobs;  // (entry of rows, logits row)
    int64_t r = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].sample && rows[i].num_draft == 0 && row_status_[i].ok()) {
        jobs.emplace_back(i, r + rows[i].num_read_only);
      }
      r += rows[i].num_rows();
    }
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
    for (size_t j = 0; j < jobs.size(); ++j) {
      const auto [i, row] = jobs[j];
      float* logits = host_logits_.data<float>() + row * vocab_size_;
      for (const int32_t token : rows[i].banned) {
        if (token >= 0 && token < vocab_size_) logits[token] = -std::numeric_limits<float>::infinity();
      }
      Result<SampleResult> sampled = rows[i].sampler->sample(logits, vocab_size_);
      if (!sampled.ok() && rows[i].grammar != nullptr && !rows[i].banned.empty()) {
        sampled = make_error(ErrorCode::kInvalidArgument, "the grammar allows only the end of the output here, "
                             "which min_tokens forbids this early");
      }
      host_samples_[i] = std::move(sampled);
    }
    return Status::Ok();
  }
  if (num_masks > 0) {
    if (!device_masks_.defined() || device_masks_.size(0) < num_masks) {
      TACHYON_ASSIGN_OR_RETURN(device_masks_, empty_on({host_masks_.size(0), host_masks_.size(1)}, DType::kI32,
                                                       device_, "token masks"));
    }
    Tensor dst = device_masks_.slice(0, 0, num_masks);
    TACHYON_RETURN_IF_ERROR(copy_into(dst, host_masks_.slice(0, 0, num_masks)));
  }
  if (place_ == Place::kDeviceGreedy) {
    if (num_masks > 0) ops::mask_logits(device_logits_, device_masks_.slice(0, 0, num_masks));
    ops::argmax(device_logits_, device_ids_, &device_logprobs_);
  } else {
    if (!host_edits_.empty()) {
      const Tensor edits = device_edits_.slice(0, 0, static_cast<int64_t>(host_edits_.size()) / ops::kLogitEditColumns);
      ops::adjust_logits(device_logits_, edits);
    }
    if (num_masks > 0) ops::mask_logits(device_logits_, device_masks_.slice(0, 0, num_masks));
    ops::sample(device_logits_, device_params_, device_ids_, device_logprobs_);
  }
  TACHYON_RETURN_IF_ERROR(ops::take_error(device_));  // a workspace or a launch that failed
  TACHYON_RETURN_IF_ERROR(copy_into(host_ids_, device_ids_));  // waits for the step
  return copy_into(host_logprobs_, device_logprobs_);
}

std::span<const int32_t> BatchSampler::device_ids(int first, int n) const {
  return {host_ids_.data<int32_t>() + first, static_cast<size_t>(n)};
}

std::span<const float> BatchSampler::device_logprobs(int first, int n) const {
  return {host_logprobs_.data<float>() + first, static_cast<size_t>(n)};
}

Result<SampleResult> BatchSampler::host_sample(size_t index) {
  TACHYON_CHECK(index < host_samples_.size() && host_samples_[index].has_value(),
                "batch sampler: no host sample for entry {}", index);
  Result<SampleResult> r = std::move(*host_samples_[index]);
  host_samples_[index].reset();
  return r;
}

const float* BatchSampler::host_logits(int first) const {
  return host_logits_.data<float>() + static_cast<int64_t>(first) * vocab_size_;
}

}  // namespace tachyon
