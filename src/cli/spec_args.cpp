#include "cli/spec_args.h"

#include <algorithm>

#include <fmt/format.h>

#include "cli/common.h"

namespace tachyon::cli {

void add_spec_options(CLI::App& cmd, SpecArgs& a) {
  cmd.add_flag("--spec-ngram", a.ngram, "speculative decoding with n-gram (prompt lookup) proposals");
  cmd.add_option("--draft-model", a.draft_model,
                 "speculative decoding with this draft model (same tokenizer as -m; HF dir, GGUF, llama2.c)");
  cmd.add_option("--spec-heads", a.heads,
                 "speculative decoding with proposal heads over the target's features (a heads file made for -m, "
                 "or a directory holding heads.safetensors)");
  cmd.add_option("--spec-k", a.k, "draft tokens per step, fixed (default: chosen per request, up to --spec-k-max)")
      ->check(positive_int());
  cmd.add_option("--spec-k-max", a.k_max, "most draft tokens per step for the dynamic choice (default 8)")
      ->check(positive_int());
  cmd.add_option("--spec-tree", a.tree,
                 "verify token trees of up to N nodes (K levels: the draft's runners-up, or several n-gram matches) "
                 "instead of single chains (default 0: chains)")
      ->check(non_negative_int());
}

Status apply_spec_options(const SpecArgs& a, const LoadedModel& target, std::unique_ptr<LoadedModel>& draft,
                          EngineOptions& options) {
  const bool with_draft = !a.draft_model.empty();
  const bool with_heads = !a.heads.empty();
  if (static_cast<int>(a.ngram) + static_cast<int>(with_draft) + static_cast<int>(with_heads) > 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--spec-ngram, --draft-model and --spec-heads exclude each other: pick one");
  }
  if (!a.ngram && !with_draft && !with_heads) {
    if (a.k != -1) {
      return make_error(ErrorCode::kInvalidArgument, "--spec-k needs --spec-ngram, --draft-model or --spec-heads");
    }
    if (a.tree != 0) return make_error(ErrorCode::kInvalidArgument, "--spec-tree needs --spec-ngram or --draft-model");
    return Status::Ok();
  }
  if (a.k != -1 && a.k < 1) return make_error(ErrorCode::kInvalidArgument, "--spec-k {} must be at least 1", a.k);
  SpecDecodeOptions& s = options.spec;
  s.method = a.ngram ? SpecMethod::kNgram : with_heads ? SpecMethod::kHeads : SpecMethod::kDraftModel;
  s.k = a.k == -1 ? 0 : a.k;
  s.k_max = a.k_max;
  s.tree_nodes = a.tree;
  if (with_heads) {
    auto heads = load_spec_heads(a.heads, target.model->config(), target.model->device());
    if (!heads.ok()) return heads.status().with_context("--spec-heads");
    s.heads = std::make_shared<const SpecHeads>(std::move(heads).value());
  }
  if (with_draft) {
    LoadOptions lo;
    lo.path = a.draft_model;
    lo.device = target.model->device();  // beside the target
    auto loaded = load_model(lo);
    if (!loaded.ok()) return loaded.status().with_context("--draft-model");
    draft = std::make_unique<LoadedModel>(std::move(loaded).value());
    const int tv = target.model->config().vocab_size, dv = draft->model->config().vocab_size;
    // A draft may lack the target's last rows when no token of the tokenizer is among them (the
    // matrices of one family are padded to different sizes: Qwen2.5-0.5B 151,936, 7B 152,064).
    const int real = target.tokenizer ? target.tokenizer->vocab_size() : tv;
    if (dv > tv || dv < std::min(tv, real)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--draft-model {}: its vocabulary has {} tokens, the target's {}{}; a draft must share the "
                        "target's tokenizer",
                        a.draft_model, dv, tv,
                        dv < tv ? fmt::format(" (of which its tokenizer uses {})", std::min(tv, real)) : "");
    }
    if (target.tokenizer && draft->tokenizer) {
      for (int32_t id = 0; id < std::min({tv, dv, draft->tokenizer->vocab_size(), real}); ++id) {
        if (target.tokenizer->token_to_piece(id) != draft->tokenizer->token_to_piece(id)) {
          return make_error(ErrorCode::kInvalidArgument,
                            "--draft-model {}: token {} is '{}' for the draft, '{}' for the target; a draft must "
                            "share the target's tokenizer",
                            a.draft_model, id, draft->tokenizer->token_to_piece(id),
                            target.tokenizer->token_to_piece(id));
        }
      }
    }
    s.draft_model = draft->model.get();
  }
  return Status::Ok();
}

std::string spec_summary(const EngineOptions& options, const SpecStats& st) {
  if (options.spec.method == SpecMethod::kNone) return {};
  std::string k = options.spec.k > 0 ? fmt::format("K {}", options.spec.k)
                                     : fmt::format("K dynamic <= {}", options.spec.k_max);
  if (options.spec.tree_nodes > 0) k += fmt::format(", trees <= {} nodes", options.spec.tree_nodes);
  return fmt::format("speculative ({}, {}): {} proposed, {} accepted ({:.1f}%), {:.2f} accepted per step, {} verify "
                     "steps, {:.2f} s proposing",
                     st.proposer, k, st.num_proposed, st.num_accepted, 100.0 * st.acceptance_rate(),
                     st.mean_accepted_length(), st.num_verify_steps, st.propose_seconds);
}

}  // namespace tachyon::cli
