// The serving engine: requests in, tokens and text out, many requests per forward.
//
//   add_request() → a Sequence waits in the Scheduler
//   step()        → schedule (decodes first, prompt chunks, admissions, preemption) → copy-on-write
//                   copies → one forward over the flattened batch → sample the rows that end a
//                   sequence's known tokens → detokenize, check stop conditions → outputs;
//                   finished requests' blocks go back to the pool. With speculative decoding,
//                   decoding sequences get drafts before scheduling and their K + 1 rows are
//                   verified after the forward (speculative/spec_decoder.h)
//                   Requests asking for prompt logprobs have their prompt chunks' every position's
//                   logits kept and read on the host (engine/prompt_logprobs.h), and skip the
//                   prefix cache until they have them; min_tokens masks EOS and stop ids on the
//                   host and holds back drafts until that many tokens are out. A request with a
//                   grammar (structured output) keeps a GrammarMatcher that every emitted token
//                   advances; the batch sampler masks its rows, and its drafts are trimmed to it
//   abort()       → at any time; the request's blocks are freed at once
//
// Disaggregation (disagg/kv_export.h moves the bytes, through engine/kv_hook.h): a prefill engine
// runs requests with GenerationParams::prefill_only, which finish with kTransfer after their first
// token, their blocks held; release_transfer() shows such a request's tokens and blocks to the
// caller, which copies its K/V out, and frees them. A decode engine's adopt_sequence() gives the
// caller blocks of its own to write them into and the request decodes on from there, as if its
// prompt had run here: the prompt is never recomputed.
//
// One Engine is driven by one thread (the server runs it on its own loop thread). It borrows the
// model and tokenizer, which must outlive it, and owns the paged KV cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/timer.h"
#include "engine/kv_hook.h"
#include "engine/request.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/llama_model.h"
#include "sampling/batch_sampler.h"
#include "sampling/token_trie.h"
#include "sched/scheduler.h"
#include "speculative/spec_decoder.h"
#include "tokenizer/tokenizer.h"

namespace tachyon {

// The engine's paged KV cache: its geometry and how much memory it takes. The block size lives
// here until the cache exists; from then on the cache's config is its one owner
// (Engine::kv_config()), which the scheduler, the block manager and the draft cache all read.
struct KvCacheOptions {
  int block_size = kDefaultBlockSize;  // tokens per KV block
  // The cache's size, the first that is set: num_blocks, bytes, else `fraction` of the memory
  // available now on the model's device (0: 0.25 of the host's, 0.9 of a GPU's free memory after
  // the weights), capped at what max_seqs sequences of max_model_len tokens need. The cache
  // lives where the model does.
  int num_blocks = 0;
  size_t bytes = 0;
  double fraction = 0.0;
  std::optional<DType> dtype;  // f32, f16, bf16, i8 or f8e4m3; default f32 on the CPU, bf16 on a GPU
  bool prefix_caching = true;
  // Long context: the window of recent positions kept as they are, and what becomes of older
  // ones (drop: a true sliding window, each sequence holding about `window` positions of blocks;
  // int8 / int4: re-quantized into a pool of history blocks). With int8 / int4 a memory budget is
  // split as sequences of max_model_len use it (a window of full-precision blocks each, the rest
  // in history blocks); with num_blocks given, num_history_blocks (0: as many as num_blocks).
  KvTierOptions tiers;
  int num_history_blocks = 0;
};

struct EngineOptions {
  KvCacheOptions kv;
  SchedulerOptions scheduler;       // tokens per step, sequences at once, chunked prefill
  int max_model_len = 0;            // 0: the model's context length
  bool batch_invariant = false;     // outputs bit-identical whatever else is in the batch (slower)
  bool cuda_graphs = true;          // on a GPU, replay decode steps as CUDA graphs (false: eager)
  SpecDecodeOptions spec;           // speculative decoding (off by default)
  // Block-sparse decode attention (needs int8 / int4 history): > 0 keeps key bounds with the
  // history blocks, and each request's decode query attends to the history blocks of about this
  // many tokens that bound its scores highest, the first sparse_sink_blocks history blocks and the
  // window (GenerationParams::sparse_budget overrides it per request). 0: dense attention.
  int sparse_budget = 0;
  int sparse_sink_blocks = 1;
  // Structured output: what each token id spells, for grammar masks; null: the tokenizer's (built at
  // the first request with a grammar). For models without a tokenizer (synthetic ones: the bench
  // gives them sampling/synthetic_vocabulary.h); its size must be the model's vocabulary size.
  std::shared_ptr<const TokenTrie> grammar_vocabulary;
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;       // includes preempted
  int num_transferring = 0;  // prefill-only requests done, their KV held until release_transfer()
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int kv_blocks_cached = 0;  // unreferenced, kept for prefix hits
  int kv_blocks_free = 0;
  int kv_blocks_used_peak = 0;
  int kv_history_blocks_total = 0;  // int8 / int4 history
  int kv_history_blocks_used = 0;
  size_t kv_cache_bytes = 0;
  PrefixCacheStats prefix;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill tokens run (recomputation after preemption included)
  int64_t generated_tokens = 0;
  int64_t requests_finished = 0;
  int64_t num_failed_steps = 0;       // steps whose forward or sampling failed (fail_step())
  int64_t num_failed_proposals = 0;   // speculative proposals that failed (the step ran without)
  // Cumulative seconds per phase of step().
  double schedule_seconds = 0.0;  // scheduling, copy-on-write, batch planning
  double forward_seconds = 0.0;
  double sample_seconds = 0.0;    // sampling, detokenizing, stop checks, outputs
  SpecStats spec;                 // speculative decoding (proposer empty when off)
  // Mixtures of experts, since load (every forward of the model counts, whichever engine ran it;
  // refreshed from the device at most once a second unless stats(true) asks): slots routed to
  // each expert summed over the sparse layers (empty for a dense model), the distinct experts a
  // layer's call chose summed over calls, the calls, and the mean over sparse layers of the
  // busiest expert's tokens over the mean expert's (1: perfectly even).
  std::vector<int64_t> expert_tokens;
  int64_t moe_distinct_experts = 0;
  int64_t moe_layer_calls = 0;
  double moe_load_imbalance = 0.0;
  // Structured output: seconds spent computing grammar token masks (on the host threads, beside
  // the device's forward when the model is on a GPU; included in forward_seconds).
  double grammar_mask_seconds = 0.0;
  int64_t grammar_mask_steps = 0;  // steps that masked any row
  int64_t grammar_masked_rows = 0;
};

// What each token id of the model spells, for grammar masks: the tokenizer's pieces, ids past it (a
// model's padding rows) spelling nothing, control and unknown tokens left out, `eos_ids` (those
// inside the vocabulary) ending the grammar.
Result<std::shared_ptr<const TokenTrie>> grammar_vocabulary(const Tokenizer& tokenizer, int vocab_size,
                                                            std::span<const int32_t> eos_ids);

class Engine {
 public:
  // `tokenizer` may be null (token ids in and out only). `eos_token_ids` stop every request
  // that does not ignore EOS.
  static Result<std::unique_ptr<Engine>> create(const LlamaModel& model, const Tokenizer* tokenizer,
                                                std::vector<int32_t> eos_token_ids, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The request keeps `params` as its own (pass an rvalue to hand them over without a copy).
  Result<RequestId> add_request(std::string_view prompt, GenerationParams params);
  // `arrival`: when the request reached the caller, on this engine's clock (now() less the time it
  // waited before this call), where it queued first (a server's hand-over to its engine loop);
  // unset: now. Its TTFT, queue time and end-to-end latency count from there.
  Result<RequestId> add_request(std::vector<int32_t> prompt_ids, GenerationParams params,
                                std::optional<double> arrival = std::nullopt);
  // Runs one step; returns the news of every request that got a token, finished or was aborted.
  Result<std::vector<RequestOutput>> step();
  // Ends a request now, freeing its blocks; the next step() reports it finished with kAbort.
  // A request held for transfer (kTransfer, not exported) only has its blocks freed: it already
  // reported its end. False if the id is unknown or already finished.
  bool abort(RequestId id);

  // Disaggregation (engine/kv_hook.h; disagg/kv_export.h does the copying).
  // A request that finished with kTransfer: `read` gets its tokens and sampling state and the
  // blocks of its computed positions [0, num_computed), then its blocks are freed, whatever `read`
  // returned (which this returns). kNotFound if the request is not held for transfer.
  Status release_transfer(RequestId id, const HeldSequenceRead& read);
  // Continues a sequence another engine ran: allocates blocks for its computed positions (the
  // prefix cache's where it holds them), has `fill` write the K/V of the positions the prefix cache
  // did not supply (its copies have finished when it returns) and runs the request as decoding
  // from its last token, with `params` (those of the original request, prefill_only off). Its
  // first output carries the next token; the imported tokens were reported by the other engine.
  // kInvalidArgument when the sizes or the sampling state disagree, or `params` do. kOutOfRange,
  // with nothing changed, when it does not fit: max_seqs sequences run or too few blocks are free
  // (worth retrying after a step, while anything runs), or the sequence is longer than the context
  // or the whole cache (never fits, as in add_request()). When `fill` fails, its blocks are freed
  // and its error returned.
  Result<RequestId> adopt_sequence(const TransferredSequence& seq, const GenerationParams& params,
                                   const SequenceBlocksCopy& fill);

  bool has_unfinished() const { return !requests_.empty() || !aborted_.empty(); }
  size_t num_unfinished() const { return requests_.size(); }  // held-for-transfer ones not included

  // fresh_experts: read the model's routing counters now, whatever their age.
  EngineStats stats(bool fresh_experts = false) const;
  const EngineOptions& options() const { return options_; }
  const KvCacheConfig& kv_config() const { return cache_.config(); }  // the block size's one owner
  int max_model_len() const { return max_model_len_; }
  const LlamaModel& model() const { return model_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  double now() const { return clock_.seconds(); }  // the engine's clock
  // Every block free or cached, every history block free, and the block manager's invariants
  // hold (no request running or held for transfer).
  Status check_no_leaks() const;
  // Tests and tools: a running request's sequence (null when unknown or finished), the KV storage.
  const Sequence* find_sequence(RequestId id) const;
  KvCache& kv_cache() { return cache_; }

 private:
  struct Request;
  Engine(const LlamaModel& model, const Tokenizer* tokenizer, std::vector<int32_t> eos, const EngineOptions& options,
         int max_model_len, KvCache cache);
  // Checks the request-level parameters (not the prompt) against the model and tokenizer.
  Status validate_params(const GenerationParams& params) const;
  Status validate_token_ids(std::span<const int32_t> ids, const char* what) const;
  // A new request with `prompt_ids` (checked by the caller) and `params` (checked here): its
  // sampler and detokenizer primed with the prompt. Not yet known to the scheduler.
  Result<std::unique_ptr<Request>> make_request(std::vector<int32_t> prompt_ids, GenerationParams params);
  // Post-processes one sequence's sample (drawn from its logits row by its Sampler on the host);
  // fills `out`; true if it finished.
  bool process_sample(Request& req, Result<SampleResult> sampled, RequestOutput& out);
  void finish(Request& req, FinishReason reason, RequestOutput& out);
  // A prefill-only request whose first token is out: ends with kTransfer, blocks held.
  void hold_for_transfer(Request& req, RequestOutput& out);
  // Appends one token to the request and applies every stop condition; true if it finished.
  bool emit_token(Request& req, SampleResult sampled, RequestOutput& out);
  // A step whose forward or sampling failed (ops/errors.h: a workspace that could not be
  // allocated, a launch that failed): every sequence it scheduled ends with kError and `error`,
  // its blocks freed; the others wait for the next step, which may succeed.
  void fail_step(const SchedulerStep& plan, const Status& error, std::vector<RequestOutput>& outputs);
  // Prompt logprobs: per chunk of the plan, how many of its logits rows are only read (every
  // position of a prompt chunk of a request that still needs them, but a sampled one); 0 for the
  // others, whose forward gives the last position's logits (or a draft's rows) only.
  std::vector<int> read_only_rows(const SchedulerStep& plan) const;
  // The forward batch of a step's chunks (a draft's chunk carries the draft's tokens after the last).
  ForwardBatch batch_of(const SchedulerStep& plan, std::span<const int> read_only);
  // The step's rows for the batch sampler, in logits order: one entry per chunk that samples or
  // has read-only rows.
  std::vector<SampleRow> sample_rows(const SchedulerStep& plan, std::span<const int> read_only);
  // Each chunk's read-only rows into its request's prompt logprobs, and each sampled chunk's
  // tokens (drawn where `place` says) through verification or emission, in plan order; finished
  // requests leave requests_ (to transfers_ when held for transfer). `features`: the step's final
  // hidden rows on the host, when the proposer reads them.
  void emit_outputs(const SchedulerStep& plan, std::span<const int> read_only, BatchSampler::Place place,
                    const Tensor* features, std::vector<RequestOutput>& outputs);
  // The prompt logprobs of chunk `c` of `req` from its first `n` logits rows (from host row `first`).
  void record_prompt_logprobs(Request& req, const ScheduledChunk& c, int first, int n);
  // Speculative decoding (speculative/spec_decoder.h does the work): drafts for the decoding
  // sequences before scheduling (a failed proposal leaves the step without drafts, counted in
  // EngineStats); the verification of one sequence's K + 1 logits rows, emitting its tokens in
  // order until one finishes the request.
  void propose_drafts();
  // The draft verified from its K + 1 logits rows on the host (any sampling), or from the rows'
  // argmax ids and logprobs taken on the device (plain greedy requests).
  bool verify_draft(Request& req, const float* logits, RequestOutput& out);
  bool verify_draft_ids(Request& req, std::span<const int32_t> ids, std::span<const float> logprobs,
                        RequestOutput& out);
  bool emit_verified(Request& req, Result<Verification> verified, RequestOutput& out);
  void fill_counts(const Request& req, RequestOutput& out) const;
  // Runs the block manager's queued history compressions (before anything writes the cache).
  void run_compressions();
  // The vocabulary as a byte trie for grammar masks (built at the first request with a grammar).
  Result<std::shared_ptr<const TokenTrie>> token_trie();

  const LlamaModel& model_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> eos_token_ids_;
  EngineOptions options_;
  int max_model_len_;
  KvCache cache_;
  BlockManager blocks_;
  Scheduler scheduler_;
  Timer clock_;
  RequestId next_id_ = 1;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::vector<RequestOutput> aborted_;  // reported by the next step()
  // Prefill-only requests that finished with kTransfer, their blocks held until release_transfer().
  std::unordered_map<RequestId, std::unique_ptr<Request>> transfers_;
  BatchSampler sampler_;  // the step's token choice, on the host or the device, and its buffers
  std::shared_ptr<const TokenTrie> token_trie_;  // see token_trie()
  EngineStats stats_;
  // The routing counters' last read (EngineStats' MoE fields) and when (the engine's clock).
  mutable EngineStats expert_snapshot_;
  mutable double expert_snapshot_at_ = -1.0;
  std::unique_ptr<SpecDecoder> spec_;   // null: no speculative decoding
  // The last step's final hidden rows, for a proposer that reads them (where the forward left
  // them; host_features_: their host copy when that was a device).
  Tensor features_;
  Tensor host_features_;
};

}  // namespace tachyon
