// Speculative decoding as a layer over the engine step (DESIGN.md): before the scheduler plans a
// step, propose() gives every decoding sequence that speculates a draft of K tokens; the target
// runs the last token and the draft in one forward, and verify() turns that sequence's K + 1
// logits rows into the tokens to emit. The engine emits them in order through its usual stop
// checks, and the scheduler rolls the rejected positions back by block-table truncation.
//
// K per request and step comes from a DraftLengthController (moving average of the acceptance
// rate, the batch size, `--spec-k-max`), or is fixed by `--spec-k`; the controller turns
// speculation off for a request whose acceptance does not pay, and probes it again now and then.
// With the dynamic K, a SpeculationGate also holds whole steps plain at batch sizes where
// speculating steps are measured slower than plain ones (the engine reports each decode step).
// K never reaches past the request's max_tokens or the context.
//
// Per-request drafts: several named draft models may be loaded (`--draft-model NAME=PATH`,
// repeatable); a request names one (GenerationParams::draft), or, with a DomainClassifier, gets the
// draft named after its prompt's kind (the first draft when no draft has that name). Each draft
// is its own proposer with its own cache; a step proposes for each draft's requests together.
//
// Owns the proposers and each request's controller; holds no sequence. One engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "model/llama_model.h"
#include "sampling/sampler.h"
#include "sched/sequence.h"
#include "speculative/domain_classifier.h"
#include "speculative/draft_length.h"
#include "speculative/ngram_proposer.h"
#include "speculative/proposer.h"
#include "speculative/spec_heads.h"
#include "speculative/verifier.h"

namespace tachyon {

enum class SpecMethod : uint8_t {
  kNone,        // plain decoding
  kNgram,       // `--spec-ngram`: prompt lookup
  kDraftModel,  // `--draft-model [NAME=]PATH`, one or more
  kHeads,       // `--spec-heads PATH`: proposal heads over the target's features (head_proposer.h)
};
const char* spec_method_name(SpecMethod method);

struct NamedDraft {
  std::string name;                   // what requests name it by; may be empty when it is the only one
  const LlamaModel* model = nullptr;  // borrowed, must outlive the engine
};

struct SpecDecodeOptions {
  SpecMethod method = SpecMethod::kNone;
  std::vector<NamedDraft> drafts;           // kDraftModel: one or more, the first is the default
  // Optional: the kind of each prompt's text. A request that names no draft gets the draft named
  // after its kind, and the stats are also kept per kind.
  std::shared_ptr<const DomainClassifier> classifier;
  std::shared_ptr<const SpecHeads> heads;   // kHeads: on the target's device
  int k = 0;       // > 0: K fixed at this (`--spec-k`); 0: the controller picks K in [0, k_max]
  int k_max = 8;   // `--spec-k-max`
  // `--spec-tree N` > 0: proposers may return token trees of up to N nodes (K levels deep),
  // verified in one forward with tree attention; 0: chains of K tokens.
  int tree_nodes = 0;
  NgramProposerOptions ngram;
  // `--spec-prior on`: a new request's draft length starts from what the requests like it
  // measured (the same proposer, prompt kind and prompt-length class) instead of the controller's
  // fixed initial guess. Off by default: on the CPU it lengthened drafts and slowed batch-1
  // decoding (docs/perf.md); not yet measured on the GPU.
  bool population_prior = false;

  static constexpr int kLargestK = 32;
  // kInvalidArgument naming the bad value: k_max outside [1, kLargestK], k outside [0, k_max],
  // tree_nodes outside [0, kMaxTreeTokens - 1] or set for a sliding-window target, no draft model,
  // a draft with a larger vocabulary than the target's (a smaller one lacks padding rows: see
  // DraftModelOptions::target_vocab), several drafts not all named or named alike; heads missing
  // or made for another target; a classifier for a larger vocabulary than the target's.
  // The proposer label of draft i: "draft" for a lone unnamed draft, else "draft:NAME".
  std::string draft_label(size_t i) const;
  Status validate(const ModelConfig& target) const;
};

// Verification counts of one proposer or one kind of text.
struct SpecCounts {
  int64_t num_verify_steps = 0;
  int64_t num_proposed = 0;
  int64_t num_accepted = 0;
  int64_t num_emitted = 0;
  double propose_seconds = 0.0;  // per proposer only
  double acceptance_rate() const {
    return num_proposed > 0 ? static_cast<double>(num_accepted) / static_cast<double>(num_proposed) : 0.0;
  }
  double mean_accepted_length() const {
    return num_verify_steps > 0 ? static_cast<double>(num_accepted) / static_cast<double>(num_verify_steps) : 0.0;
  }
  // Tokens a verifying sequence-step emits (accepted + the target's own): what a step of that
  // sequence yields against plain decoding's one.
  double tokens_per_step() const {
    return num_verify_steps > 0 ? static_cast<double>(num_emitted) / static_cast<double>(num_verify_steps) : 0.0;
  }
};

// Cumulative over the engine's proposers (`proposer` names them), and broken down per proposer
// and per kind of text.
struct SpecStats {
  std::string proposer;           // "ngram", "draft", "heads", "draft:code,draft:prose"; empty when off
  int64_t num_verify_steps = 0;   // sequence-steps that verified a draft
  int64_t num_proposed = 0;       // draft tokens verified
  int64_t num_accepted = 0;       // of which accepted
  int64_t num_emitted = 0;        // tokens the verify steps produced (accepted + the target's own)
  int64_t num_tree_steps = 0;     // of the verify steps, those that verified a token tree
  int64_t num_off_first_branch = 0;  // tree steps whose accepted path left the first branch
  int64_t num_gated_steps = 0;    // steps held plain by the measured gate (speculation was slower there)
  double propose_seconds = 0.0;   // time in the proposer (draft model forwards, lookups)
  // Per draft position (a tree's: per level), index 0 first: verify steps whose draft reached it,
  // and those that accepted it.
  std::vector<int64_t> proposed_by_position;
  std::vector<int64_t> accepted_by_position;
  std::map<std::string, SpecCounts> by_proposer;  // by proposer label ("draft:code"); every proposer listed
  std::map<std::string, SpecCounts> by_kind;      // by the classifier's kind of the prompt; empty without one
  double acceptance_rate() const {
    return num_proposed > 0 ? static_cast<double>(num_accepted) / static_cast<double>(num_proposed) : 0.0;
  }
  // Accepted draft tokens per verify step (the target's own token not counted).
  double mean_accepted_length() const {
    return num_verify_steps > 0 ? static_cast<double>(num_accepted) / static_cast<double>(num_verify_steps) : 0.0;
  }
};

// A decoding sequence the engine offers for speculation this step.
struct SpecCandidate {
  Sequence* seq = nullptr;
  const Sampler* sampler = nullptr;  // the request's
  int max_draft = 0;                 // K at most: tokens left to max_tokens and to the context, less one
  std::string_view draft;            // the draft the request names (GenerationParams::draft); empty: any
  // Constrained decoding: the request's grammar state, which drafts are trimmed to (trim_to_grammar);
  // null: none.
  GrammarMatcher* grammar = nullptr;
};

// Where the draft model's cache comes from (kDraftModel): the engine's cache geometry.
struct SpecCacheGeometry {
  int num_kv_blocks = 0;
  int block_size = 0;     // the target cache's (KvCacheConfig::block_size)
  DType kv_dtype = DType::kF32;
  int max_model_len = 0;
  ops::LinearMode linear_mode = ops::LinearMode::kFastest;
  KvTierOptions tiers;         // the target cache's window and history: the draft's cache keeps the same
  int num_history_blocks = 0;  // and a history pool of as many blocks (int8 / int4 history)
};

class SpecDecoder {
 public:
  // Validates the options against the target (see SpecDecodeOptions::validate) and builds the
  // proposers; null when options.method is kNone.
  static Result<std::unique_ptr<SpecDecoder>> create(const SpecDecodeOptions& options, const LlamaModel& target,
                                                     const SpecCacheGeometry& geometry);

  // Sets every candidate's draft (empty for those not speculating this step). `num_running` is
  // the batch size the controllers weigh K against.
  Status propose(std::span<const SpecCandidate> candidates, int num_running);
  // The target's rows for seq's draft: [K + 1, vocab]. Records acceptance for the request's
  // controller and the stats.
  // A tree draft (seq.draft_parents()) gives [nodes + 1, vocab] rows, in node order.
  Result<Verification> verify(const Sequence& seq, const float* logits, int vocab, Sampler& sampler);
  // The same for a plain greedy request from each row's argmax id and its logprob (taken on the
  // device): verify_greedy_rows.
  Result<Verification> verify_greedy(const Sequence& seq, std::span<const int32_t> ids, std::span<const float> logprobs);
  // The request finished or was aborted.
  void release(uint64_t id);
  // A decode-only step (no prompt tokens) ran `num_running` sequences, verified drafts or not,
  // and emitted `tokens` in `seconds`: the gate's measurement (dynamic K only).
  void record_step(int num_running, bool speculated, int64_t tokens, double seconds);

  const SpecStats& stats() const { return stats_; }
  // Whether a request may name `draft` (GenerationParams::draft): a named draft model.
  bool has_draft(std::string_view draft) const;
  // "code, prose": the names requests may use; empty when none.
  std::string draft_names() const;
  // The proposer reads the target's features: each step's forward returns its final hidden rows,
  // and each sequence's row that sampled its last token comes here.
  bool wants_features() const { return wants_features_; }
  void observe_features(uint64_t id, std::span<const float> hidden);
  Status check_no_leaks() const;

 private:
  struct RequestState {
    explicit RequestState(const DraftLengthOptions& o) : controller(o) {}
    DraftLengthController controller;
    std::vector<float> draft_probs;  // [K, vocab] q of the current draft, or empty: one-hot
    int depth = 0;                   // levels of the current draft (its length for a chain)
    int proposer = 0;                // index into proposers_
    int kind = -1;                   // the classifier's kind of the prompt, -1 without one
    uint32_t population = 0;         // key of its population (population_key)
  };
  // Requests alike for the draft length: the proposer, the prompt's kind and its length's class
  // (powers of 4: < 16, < 64, < 256, < 1,024, ... tokens).
  static uint32_t population_key(int proposer, int kind, int prompt_tokens);
  struct Slot {
    std::string label;  // stats key: "draft:code"
    std::string name;   // what requests name (drafts only)
    std::unique_ptr<Proposer> proposer;
  };
  SpecDecoder(const SpecDecodeOptions& options, std::vector<Slot> proposers);
  // The proposer and kind for a request seen for the first time.
  void assign(const SpecCandidate& c, RequestState& st) const;
  // The controller and the stats learn from one verification of seq's draft.
  void record(const Sequence& seq, RequestState& st, const Verification& v);

  SpecDecodeOptions options_;
  DraftLengthOptions controller_options_;
  std::vector<Slot> proposers_;
  bool wants_features_ = false;
  std::unordered_map<uint64_t, RequestState> requests_;
  // Per population: a controller fed every verification of its requests (a lighter weight per
  // step than a request's own), which new requests start from once it has kMinPopulationUpdates.
  std::unordered_map<uint32_t, DraftLengthController> populations_;
  static constexpr int64_t kMinPopulationUpdates = 16;
  SpecStats stats_;
  SpeculationGate gate_;
  // Reused each step: per proposer, its requests and their sequences.
  std::vector<std::vector<DraftRequest>> draft_requests_;
  std::vector<std::vector<Sequence*>> draft_seqs_;
  std::vector<std::vector<GrammarMatcher*>> draft_grammars_;
  std::vector<Draft> drafts_;
};

}  // namespace tachyon
