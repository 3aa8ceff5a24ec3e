#include "cli/spec_args.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "cli/common.h"

namespace tachyon::cli {

void add_spec_options(CLI::App& cmd, SpecArgs& a) {
  cmd.add_flag("--spec-ngram", a.ngram, "speculative decoding with n-gram (prompt lookup) proposals");
  cmd.add_option("--draft-model", a.draft_models,
                 "speculative decoding with this draft model (same tokenizer as -m; HF dir, GGUF, llama2.c); "
                 "repeat as NAME=PATH for several, which a request picks by name (\"draft\": NAME) or the engine "
                 "by the prompt's kind");
  cmd.add_option("--draft-classifier", a.classifier,
                 "token profiles that tell a prompt's kind (code, prose) to pick the draft named after it "
                 "(default: the target directory's domains.safetensors, if any; \"none\": off)");
  cmd.add_option("--spec-heads", a.heads,
                 "speculative decoding with proposal heads over the target's features (a heads file made for -m, "
                 "or a directory holding heads.safetensors)");
  cmd.add_option("--spec-k", a.k, "draft tokens per step, fixed (default: chosen per request, up to --spec-k-max)")
      ->check(positive_int());
  cmd.add_option("--spec-k-max", a.k_max, "most draft tokens per step for the dynamic choice (default 8)")
      ->check(positive_int());
  cmd.add_option("--draft", a.request_draft,
                 "every request drafts with this named draft model (--draft-model NAME=PATH), as a request body's "
                 "\"draft\" does (default: the draft named after the prompt's kind)");
  cmd.add_option("--spec-prior", a.prior,
                 "with the dynamic K, start a new request from the acceptance its population measured (same proposer, "
                 "prompt kind and prompt-length class): on, or off (default: a fixed initial guess)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_option("--spec-tree", a.tree,
                 "verify token trees of up to N nodes (K levels: the draft's runners-up, or several n-gram matches) "
                 "instead of single chains (default 0: chains)")
      ->check(non_negative_int());
}

namespace {

// "NAME=PATH" -> (NAME, PATH) when NAME is a plain name (letters, digits, '-', '_', '.'), else ("", arg).
std::pair<std::string, std::string> split_named(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) return {"", arg};
  const std::string name = arg.substr(0, eq);
  for (char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return {"", arg};
  }
  return {name, arg.substr(eq + 1)};
}

Status load_draft(const std::string& what, const std::string& path, const LoadedModel& target,
                  std::unique_ptr<LoadedModel>& draft) {
  LoadOptions lo;
  lo.path = path;
  lo.device = target.model->device();  // beside the target
  auto loaded = load_model(lo);
  if (!loaded.ok()) return loaded.status().with_context(what);
  draft = std::make_unique<LoadedModel>(std::move(loaded).value());
  const int tv = target.model->config().vocab_size, dv = draft->model->config().vocab_size;
  // A draft may lack the target's last rows when no token of the tokenizer is among them (the
  // matrices of one family are padded to different sizes: Qwen2.5-0.5B 151,936, 7B 152,064).
  const int real = target.tokenizer ? target.tokenizer->vocab_size() : tv;
  if (dv > tv || dv < std::min(tv, real)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: its vocabulary has {} tokens, the target's {}{}; a draft must share the target's tokenizer",
                      what, dv, tv, dv < tv ? fmt::format(" (of which its tokenizer uses {})", std::min(tv, real)) : "");
  }
  if (target.tokenizer && draft->tokenizer) {
    for (int32_t id = 0; id < std::min({tv, dv, draft->tokenizer->vocab_size(), real}); ++id) {
      if (target.tokenizer->token_to_piece(id) != draft->tokenizer->token_to_piece(id)) {
        return make_error(ErrorCode::kInvalidArgument,
                          "{}: token {} is '{}' for the draft, '{}' for the target; a draft must share the target's "
                          "tokenizer",
                          what, id, draft->tokenizer->token_to_piece(id), target.tokenizer->token_to_piece(id));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status apply_spec_options(const SpecArgs& a, const LoadedModel& target, SpecModels& drafts, EngineOptions& options) {
  const bool with_draft = !a.draft_models.empty();
  const bool with_heads = !a.heads.empty();
  if (static_cast<int>(a.ngram) + static_cast<int>(with_draft) + static_cast<int>(with_heads) > 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--spec-ngram, --draft-model and --spec-heads exclude each other: pick one");
  }
  if (!a.ngram && !with_draft && !with_heads) {
    if (a.k != -1) {
      return make_error(ErrorCode::kInvalidArgument, "--spec-k needs --spec-ngram, --draft-model or --spec-heads");
    }
    if (a.tree != 0) return make_error(ErrorCode::kInvalidArgument, "--spec-tree needs --spec-ngram, --draft-model or --spec-heads");
    if (!a.classifier.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "--draft-classifier needs --draft-model, --spec-ngram or --spec-heads");
    }
    if (!a.request_draft.empty()) return make_error(ErrorCode::kInvalidArgument, "--draft needs --draft-model NAME=PATH");
    return Status::Ok();
  }
  if (a.k != -1 && a.k < 1) return make_error(ErrorCode::kInvalidArgument, "--spec-k {} must be at least 1", a.k);
  SpecDecodeOptions& s = options.spec;
  s.method = a.ngram ? SpecMethod::kNgram : with_heads ? SpecMethod::kHeads : SpecMethod::kDraftModel;
  s.k = a.k == -1 ? 0 : a.k;
  s.k_max = a.k_max;
  s.tree_nodes = a.tree;
  s.population_prior = a.prior == "on";
  if (with_heads) {
    auto heads = load_spec_heads(a.heads, target.model->config(), target.model->device());
    if (!heads.ok()) return heads.status().with_context("--spec-heads");
    s.heads = std::make_shared<const SpecHeads>(std::move(heads).value());
  }
  for (const std::string& arg : a.draft_models) {
    auto [name, path] = split_named(arg);
    if (a.draft_models.size() > 1 && name.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--draft-model {}: with several draft models, name each: --draft-model NAME=PATH", arg);
    }
    drafts.emplace_back();
    TACHYON_RETURN_IF_ERROR(load_draft(fmt::format("--draft-model {}", arg), path, target, drafts.back()));
    s.drafts.push_back({name, drafts.back()->model.get()});
  }
  std::string classifier = a.classifier;
  if (classifier.empty()) {
    std::error_code ec;
    const std::filesystem::path own = std::filesystem::path(target.path) / "domains.safetensors";
    if (std::filesystem::is_directory(target.path, ec) && std::filesystem::is_regular_file(own, ec)) {
      classifier = own.string();
    }
  }
  if (!classifier.empty() && classifier != "none") {
    auto c = DomainClassifier::load(classifier, target.model->config().vocab_size);
    if (!c.ok()) return c.status().with_context("--draft-classifier");
    s.classifier = std::make_shared<const DomainClassifier>(std::move(c).value());
  }
  return Status::Ok();
}

std::string spec_summary(const EngineOptions& options, const SpecStats& st) {
  if (options.spec.method == SpecMethod::kNone) return {};
  std::string k = options.spec.k > 0 ? fmt::format("K {}", options.spec.k)
                                     : fmt::format("K dynamic <= {}", options.spec.k_max);
  if (options.spec.tree_nodes > 0) k += fmt::format(", trees <= {} nodes", options.spec.tree_nodes);
  std::string out = fmt::format("speculative ({}, {}): {} proposed, {} accepted ({:.1f}%), {:.2f} accepted per step, {} "
                                "verify steps, {:.2f} s proposing",
                                st.proposer, k, st.num_proposed, st.num_accepted, 100.0 * st.acceptance_rate(),
                                st.mean_accepted_length(), st.num_verify_steps, st.propose_seconds);
  const auto lines = [&out](const char* what, const std::map<std::string, SpecCounts>& by) {
    for (const auto& [label, c] : by) {
      out += fmt::format("\n  {} {}: {} proposed, {} accepted ({:.1f}%), {:.2f} accepted per step, {:.2f} tokens per "
                         "verify step, {} verify steps",
                         what, label, c.num_proposed, c.num_accepted, 100.0 * c.acceptance_rate(),
                         c.mean_accepted_length(), c.tokens_per_step(), c.num_verify_steps);
    }
  };
  if (st.by_proposer.size() > 1) lines("proposer", st.by_proposer);
  lines("prompt kind", st.by_kind);
  return out;
}

}  // namespace tachyon::cli
